"""CLI messages name the real problem in one line (issue 12 #16)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys

import pytest

import engrain as eg

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENGRAIN = str(pathlib.Path(sys.executable).with_name("engrain")) if pathlib.Path(sys.executable).with_name("engrain").exists() \
    else shutil.which("engrain") or "engrain"


def cli(*args: str, cwd: pathlib.Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([ENGRAIN, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def one_line(r: subprocess.CompletedProcess) -> str:
    err = r.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_serve_on_a_busy_port_says_so_and_exits_1(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        r = cli("serve", "--port", str(port), "--url", f"sqlite:///{tmp_path / 's.db'}", timeout=30)
    finally:
        busy.close()
    assert r.returncode == 1
    err = one_line(r)
    assert f"cannot serve on 127.0.0.1:{port}" in err and "in use" in err and "serving on" not in r.stderr + r.stdout


def test_serve_announces_only_once_listening(tmp_path):
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    proc = subprocess.Popen([ENGRAIN, "serve", "--port", str(port), "--url", f"sqlite:///{tmp_path / 's.db'}"],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert f"serving on http://127.0.0.1:{port}" in line
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # accepting connections by the time it said so
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_run_of_a_missing_routine_blames_the_folder(tmp_path):
    r = cli("run", "nosuch_routine", cwd=tmp_path)
    assert r.returncode == 2
    err = one_line(r)
    assert err == "error: nosuch_routine: no such routine folder" and "input.json" not in err
    (tmp_path / "empty").mkdir()
    r = cli("run", "empty", cwd=tmp_path)
    assert r.returncode == 2 and "no routine.yaml" in one_line(r)


def test_validate_of_a_missing_folder_names_it_once(tmp_path):
    r = cli("validate", "nosuch", cwd=tmp_path)
    assert r.returncode == 2
    err = one_line(r)
    assert err.count("nosuch") == 1 and "no such routine folder" in err


def test_tools_with_a_missing_attribute_names_the_file_not_a_private_module(tmp_path):
    agent = ROOT / "examples" / "csv_report" / "agent.py"
    r = cli("validate", str(ROOT / "tests" / "fixtures" / "csv_report" / "routine"), "--tools", f"{agent}:toolz")
    assert r.returncode == 2
    err = one_line(r)
    assert f"{agent} has no attribute 'toolz'" in err and "engrain_tools_" not in err


def test_show_keeps_one_line_per_event_and_full_error_text(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    j = eg.open(url)
    reg = eg.ToolRegistry()
    long_error = "the upstream said no; " * 12 + "END"

    @eg.tool(registry=reg)
    def fetch(x: int) -> str:
        return "line one\nline two\n\tindented"

    @eg.tool(registry=reg)
    def post(x: int) -> str:
        raise ValueError(long_error + "\nsecond line")

    def agent(task):
        fetch(1)
        post(2)

    res = eg.run(agent, "multi\nline task", journal=j)
    assert res.status == "failed"
    r = cli("show", res.run_id, "--url", url)
    assert r.returncode == 0, r.stderr
    # A failed run's traceback is printed indented under its "run FAILED" line (issue 12 item 5).
    traceback = [ln for ln in r.stdout.splitlines() if ln.startswith(" " * 14)]
    assert traceback and traceback[0].strip() == "Traceback (most recent call last):"
    lines = [ln for ln in r.stdout.splitlines() if not ln.startswith(" " * 14)]
    shown = [e for e in j.read(res.run_id) if e.kind != "step.started"]  # a step shows on its end
    assert len(lines) == 1 + len(shown)  # the header, then one line per event
    assert "line one\\nline two\\n\\tindented" in r.stdout
    failed = [ln for ln in lines if "FAILED ValueError" in ln]
    assert failed and failed[0].endswith("END\\nsecond line")
    assert any(ln.endswith("END\\nsecond line") for ln in lines if "run FAILED" in ln)


@pytest.mark.parametrize("command", ["run", "resume", "serve", "export", "show"])
def test_help_has_no_docstring_markup(command):
    r = cli(command, "--help")
    assert r.returncode == 0
    assert "``" not in r.stdout and ":class:" not in r.stdout


def test_resume_help_reads_plainly():
    r = cli("resume", "--help")
    assert "'run'" in r.stdout  # was ``run``
