"""`engrain runs`, `engrain show`, `engrain export` against a real store, through the installed console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import engrain as eg

ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")


def cli(*args: str, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([ENGRAIN, *args, "--url", url], capture_output=True, text=True, timeout=60)


@pytest.fixture
def recorded(store_url):
    j = eg.open(store_url)
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg)
    def lookup(city: str) -> dict:
        return {"city": city, "temp": 21}

    @eg.tool(registry=reg)
    def fail_once(x: int) -> int:
        raise ConnectionError("upstream down")

    def agent(task, city):
        report = lookup(city)
        try:
            fail_once(1)
        except ConnectionError:
            pass
        return f"{report['city']}: {report['temp']}C"

    eg.run(agent, "weather report", run_id="run-ok", inputs={"city": "Oslo"}, tags=["weather"], journal=j)
    eg.run(lambda task: 1 / 0, "divide", run_id="run-bad", journal=j)
    yield store_url
    j.close()


def test_runs_lists_and_filters(recorded):
    out = cli("runs", url=recorded)
    assert out.returncode == 0, out.stderr
    assert any(l.split()[:2] == ["run-ok", "ok"] for l in out.stdout.splitlines()) and "weather report" in out.stdout
    assert "run-bad" in out.stdout and "failed" in out.stdout
    rows = json.loads(cli("runs", "--json", "--status", "failed", url=recorded).stdout)
    assert [r["run_id"] for r in rows] == ["run-bad"]
    rows = json.loads(cli("runs", "--json", "--tag", "weather", url=recorded).stdout)
    assert [(r["run_id"], r["events"], r["tags"]) for r in rows] == [("run-ok", 4, ["weather"])]


def test_show_is_a_readable_timeline(recorded):
    out = cli("show", "run-ok", url=recorded)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "status=ok" in lines[0]
    assert any("lookup" in l and '"temp": 21' in l for l in lines)
    assert any("fail_once FAILED ConnectionError: upstream down" in l for l in lines)
    assert any("run completed -> Oslo: 21C" in l for l in lines)
    data = json.loads(cli("show", "run-ok", "--json", url=recorded).stdout)
    assert data["run"]["status"] == "ok" and len(data["events"]) == 4


def test_export_is_the_full_trace(recorded):
    out = cli("export", "run-ok", url=recorded)
    trace = json.loads(out.stdout)
    assert trace["format"] == "engrain.trace/1"
    assert trace["run"]["inputs"] == {"city": "Oslo"} and trace["run"]["task"] == "weather report"
    assert [e["seq"] for e in trace["events"]] == list(range(4))
    assert trace["events"][1]["data"]["args"] == {"city": "Oslo"}


def test_unknown_run_and_bad_url_are_one_line_errors(recorded, tmp_path):
    out = cli("show", "nope", url=recorded)
    assert out.returncode == 2 and out.stderr.strip() == "error: no run with id 'nope' in the journal"
    out = cli("runs", url="mysql://x")
    assert out.returncode != 0 and "unknown scheme 'mysql'" in out.stderr
    assert "Traceback" not in out.stderr
