"""Operating runs: cancel, fork and gc, from Python, the CLI and the API, on both backends."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

import engrain as eg
from engrain import NewEvent

ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")


def cli(*args: str, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([ENGRAIN, *args, "--url", url], capture_output=True, text=True, timeout=60)


def test_cancel_stops_a_live_run_at_its_next_step(journal):
    reg = eg.ToolRegistry()
    done: list[int] = []
    gate, waiting = threading.Event(), threading.Event()

    @eg.tool(registry=reg)
    def work(n: int) -> int:
        done.append(n)
        if n == 1:
            waiting.set()
            gate.wait(10)  # the run is mid-step when the cancel lands
        return n

    def agent(task):
        return [work(n) for n in range(5)]

    out: list[eg.RunResult] = []
    t = threading.Thread(target=lambda: out.append(eg.run(agent, "t", run_id="c1", journal=journal)))
    t.start()
    assert waiting.wait(10)
    assert eg.cancel("c1", reason="operator", journal=journal) is True
    gate.set()
    t.join(10)
    res = out[0]
    assert res.status == "cancelled" and not res and done == [0, 1]  # step 2 never ran
    info = journal.get_run("c1")
    assert info.status == "cancelled" and info.lease_owner is None
    kinds = [e.kind for e in journal.read("c1")]
    assert kinds[-1] == "run.cancelled" and "run.completed" not in kinds
    # Never resumed: run() returns the cancellation without calling the agent, recovery skips it.
    again = eg.run(agent, "t", run_id="c1", journal=journal)
    assert again.status == "cancelled" and done == [0, 1]
    assert eg.recover(agent, journal=journal) == []
    assert eg.cancel("c1", journal=journal) is False  # already finished


def test_cancel_a_waiting_run_and_errors(journal):
    def agent(task):
        return eg.ask("approve?")

    assert eg.run(agent, "t", run_id="w1", journal=journal).status == "needs_input"
    assert eg.cancel("w1", journal=journal) is True
    assert journal.get_run("w1").status == "cancelled"
    assert eg.run(agent, "t", run_id="w1", journal=journal).status == "cancelled"
    with pytest.raises(eg.RunNotFoundError):
        eg.cancel("nope", journal=journal)
    assert eg.run(lambda t: 1, "t", run_id="f1", journal=journal)
    assert eg.cancel("f1", journal=journal) is False and journal.get_run("f1").status != "cancelled"


def test_fork_reuses_recorded_steps_and_executes_from_n(journal):
    reg = eg.ToolRegistry()
    calls: list[str] = []
    fixed = {"on": False}

    @eg.tool(registry=reg)
    def fetch(q: str) -> str:
        calls.append(f"fetch {q}")
        return f"page {q}"

    @eg.tool(registry=reg)
    def parse(page: str) -> str:
        calls.append("parse")
        if not fixed["on"]:
            raise ValueError("parser bug")
        return page.upper()

    def agent(task):
        return parse(fetch("a") + fetch("b"))

    bad = eg.run(agent, "t", run_id="src", journal=journal)
    assert bad.status == "failed" and calls == ["fetch a", "fetch b", "parse"]
    fixed["on"] = True
    calls.clear()
    new = eg.fork("src", at_step=2, journal=journal)
    forked = eg.run(agent, "t", run_id=new, journal=journal)
    assert forked and forked.output == "PAGE APAGE B"
    assert calls == ["parse"] and forked.replayed == 2 and forked.executed == 1
    assert journal.read(new)[0].data["forked_from"] == {"run_id": "src", "at_step": 2}
    assert journal.get_run("src").status == "failed"  # the source is untouched
    # At step 0 nothing is reused; a chosen id; bad step numbers are typed errors.
    calls.clear()
    assert eg.run(agent, "t", run_id=eg.fork("src", 0, run_id="again", journal=journal), journal=journal)
    assert calls == ["fetch a", "fetch b", "parse"]
    with pytest.raises(eg.EngrainError, match="has 3 steps"):
        eg.fork("src", 9, journal=journal)
    with pytest.raises(eg.EngrainError, match="already exists"):
        eg.fork("src", 1, run_id="again", journal=journal)
    with pytest.raises(eg.RunNotFoundError):
        eg.fork("nope", 0, journal=journal)


def _unfinished(journal, run_id):
    journal.append(run_id, [NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": []})], 0)


def test_gc_deletes_old_finished_runs_only(journal):
    eg.run(lambda t: 1, "t", run_id="old-ok", journal=journal)
    eg.run(lambda t: 1 / 0, "t", run_id="old-failed", journal=journal)
    _unfinished(journal, "running")
    assert eg.run(lambda t: eg.ask("?"), "t", run_id="waiting", journal=journal).status == "needs_input"
    time.sleep(0.3)
    eg.run(lambda t: 2, "t", run_id="new-ok", journal=journal)

    dry = eg.gc(older_than=0.2, dry_run=True, journal=journal)
    assert sorted(dry.runs) == ["old-failed", "old-ok"] and dry.dry_run
    assert journal.get_run("old-ok") is not None  # dry run deletes nothing
    only_failed = eg.gc(older_than="0.2s", status="failed", journal=journal)
    assert only_failed.runs == ["old-failed"] and journal.get_run("old-failed") is None
    assert journal.read("old-failed") == []
    rest = eg.gc(older_than=0.2, batch=1, journal=journal)
    assert rest.runs == ["old-ok"] and journal.get_run("old-ok") is None
    assert {r.run_id for r in journal.runs()} == {"running", "waiting", "new-ok"}
    assert eg.gc(older_than="30d", journal=journal).runs == []
    with pytest.raises(eg.EngrainError, match="finished runs only"):
        eg.gc(older_than=0, status="running", journal=journal)
    with pytest.raises(eg.EngrainError, match="older_than"):
        eg.gc(older_than="soon", journal=journal)


def test_cli_cancel_fork_gc(store_url):
    j = eg.open(store_url)
    try:
        assert eg.run(lambda t: eg.ask("?"), "t", run_id="w", journal=j).status == "needs_input"
        out = cli("cancel", "w", "--json", url=store_url)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == {"run_id": "w", "cancelled": True}
        assert j.get_run("w").status == "cancelled"
        out = cli("cancel", "nope", url=store_url)
        assert out.returncode == 2 and out.stderr.startswith("error:") and "Traceback" not in out.stderr

        reg = eg.ToolRegistry()
        add = eg.tool(lambda a: a + 1, name="add", registry=reg)
        assert eg.run(lambda t: add(add(1)), "t", run_id="s", journal=j).output == 3
        out = cli("fork", "s", "--at-step", "1", "--run-id", "s2", "--json", url=store_url)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == {"run_id": "s2", "source": "s", "at_step": 1}
        assert [e.kind for e in j.read("s2")] == ["run.started", "step.completed"]

        time.sleep(0.05)
        out = cli("gc", "--older-than", "0s", "--dry-run", "--json", url=store_url)
        assert out.returncode == 0, out.stderr
        assert sorted(json.loads(out.stdout)["run_ids"]) == ["s", "w"]
        out = cli("gc", "--older-than", "0s", "--status", "cancelled", url=store_url)
        assert out.returncode == 0 and "deleted 1 run" in out.stdout
        assert j.get_run("w") is None and j.get_run("s") is not None and j.get_run("s2") is not None
        out = cli("gc", "--older-than", "abc", url=store_url)
        assert out.returncode != 0 and "older_than" in out.stderr
    finally:
        j.close()


def test_api_cancel(store_url, tmp_path):
    from fastapi.testclient import TestClient

    from engrain._server.app import create_app

    j = eg.open(store_url)
    try:
        assert eg.run(lambda t: eg.ask("?"), "t", run_id="w", journal=j).status == "needs_input"
        with TestClient(create_app(store_url, routines_dir=tmp_path / "r"), base_url="http://127.0.0.1") as c:
            r = c.post("/api/runs/w/cancel", json={"reason": "no longer needed"})
            assert r.status_code == 200, r.text
            assert r.json() == {"run_id": "w", "cancelled": True, "status": "cancelled"}
            assert c.post("/api/runs/w/cancel").json()["cancelled"] is False
            assert c.post("/api/runs/nope/cancel").status_code == 404
            assert [x["run_id"] for x in c.get("/api/runs", params={"status": "cancelled"}).json()] == ["w"]
        assert j.read("w")[-1].data == {"reason": "no longer needed"}
    finally:
        j.close()
