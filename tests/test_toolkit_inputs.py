"""Hostile input at the durable toolkit's boundaries (issue 16), on SQLite and PostgreSQL.

Queue names, priorities, queue limits, gc ages, fork steps, cancel targets and
worker settings: from Python a typed ``EngrainError``, from the CLI one line on
stderr and a non-zero exit, from the API a 4xx with a JSON error; never a
traceback or a 500. Also the CLI's queue commands and a worker's SIGTERM
release of runs it cannot finish in its grace period.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import engrain as eg
from engrain._workers.worker import Worker

HERE = Path(__file__).parent
ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")
BAD_QUEUES = ["", "no spaces", "x" * 101, "semi;colon", "tab\tname", "ünïcode", "../up"]


def cli(*args: str, url: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([ENGRAIN, *args, "--url", url], capture_output=True, text=True, timeout=timeout, env=env)


def refused(r: subprocess.CompletedProcess, *needles: str) -> str:
    """The one-line error of a refused CLI call (asserting exit != 0, one line, no traceback, nothing on stdout)."""
    err = r.stderr.strip()
    assert r.returncode != 0, (r.stdout, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith("error:"), err
    assert r.stdout == "", r.stdout
    for n in needles:
        assert n in err, (n, err)
    return err


def _finished_run(j, run_id: str = "s") -> None:
    reg = eg.ToolRegistry()
    add = eg.tool(lambda a: a + 1, name="add", registry=reg)
    assert eg.run(lambda t: add(add(1)), "t", run_id=run_id, journal=j).output == 3


# -- Python -------------------------------------------------------------------------------


def test_python_refuses_bad_queue_input_with_typed_errors(journal):
    for name in BAD_QUEUES + [None, 3]:
        with pytest.raises(eg.EngrainError, match="queue name"):
            eg.enqueue("agent", "t", queue=name, journal=journal)  # type: ignore[arg-type]
        with pytest.raises(eg.EngrainError, match="queue name"):
            eg.queue(name, journal=journal)  # type: ignore[arg-type]
    for p in (10**7, -(10**7), 10**30, 1.5, True, "1", None):
        with pytest.raises(eg.EngrainError, match="priority"):
            eg.enqueue("agent", "t", priority=p, journal=journal)  # type: ignore[arg-type]
    for c in (0, -1, 100_001, 10**30, 2.5, True, "5"):
        with pytest.raises(eg.EngrainError, match="concurrency"):
            eg.queue("q", concurrency=c, journal=journal)  # type: ignore[arg-type]
    for r in ((0, 60), (-1, 60), (10, 0), (10, -5), (10, 1e12), (10,), (1.5, 60), ("10", 60), 10, (10, float("nan"))):
        with pytest.raises(eg.EngrainError, match="rate"):
            eg.queue("q", rate=r, journal=journal)  # type: ignore[arg-type]
    for agent in ("", "has space", "x" * 200, 3, lambda t: t):
        with pytest.raises(eg.EngrainError, match="agent"):
            eg.enqueue(agent, "t", journal=journal)  # type: ignore[arg-type]
    with pytest.raises(eg.EngrainError, match="inputs"):
        eg.enqueue("agent", "t", inputs=[1, 2], journal=journal)  # type: ignore[arg-type]
    # The extremes of the allowed ranges are accepted, and nothing refused left a run behind.
    assert eg.queue("q", concurrency=100_000, rate=(1, 86400 * 366), journal=journal).concurrency == 100_000
    low = eg.enqueue("agent", "t", priority=-1_000_000, queue="q", journal=journal)
    high = eg.enqueue("agent", "t", priority=1_000_000, queue="q", journal=journal)
    assert {r.run_id for r in journal.runs(limit=100)} == {low, high}
    rid = eg.enqueue("agent", "t", queue="q", journal=journal)
    with pytest.raises(eg.EngrainError):
        eg.enqueue("agent", "t", queue="q", run_id=rid, journal=journal)  # the id is taken
    assert journal.get_run(rid).status == "queued"


def test_python_refuses_bad_operations_with_typed_errors(journal):
    _finished_run(journal)
    for age in ("abc", "-1d", "30x", "1e999d", "", "d", "1 d 2", None, True, float("nan"), float("inf"), -5, [30]):
        with pytest.raises(eg.EngrainError, match="older_than"):
            eg.gc(older_than=age, journal=journal)  # type: ignore[arg-type]
    for status in ("running", "queued", "needs_input", "bogus", ["ok", "running"]):
        with pytest.raises(eg.EngrainError, match="finished runs only"):
            eg.gc(older_than="1d", status=status, journal=journal)
    for step in (-1, 3, 10**12, 1.0, True, "1", None):
        with pytest.raises(eg.EngrainError, match="at_step|steps"):
            eg.fork("s", at_step=step, journal=journal)  # type: ignore[arg-type]
    with pytest.raises(eg.RunNotFoundError):
        eg.fork("nope", at_step=0, journal=journal)
    with pytest.raises(eg.EngrainError, match="already exists"):
        eg.fork("s", at_step=1, run_id="s", journal=journal)
    with pytest.raises(eg.RunNotFoundError):
        eg.cancel("nope", journal=journal)
    assert eg.cancel("s", journal=journal) is False and journal.get_run("s").status == "ok"
    with pytest.raises(eg.EngrainError, match="reason"):
        eg.cancel("s", reason="x" * 3000, journal=journal)
    for kw in ({"concurrency": 0}, {"concurrency": 10**6}, {"poll": 0}, {"poll": -1}, {"ttl": float("nan")},
               {"park_after": -1}, {"park_after": float("inf")}):
        with pytest.raises(eg.EngrainError):
            Worker(journal, {"a": lambda t: t}, ["q"], **kw)
    with pytest.raises(eg.EngrainError, match="queue name"):
        Worker(journal, {"a": lambda t: t}, ["bad name"])
    with pytest.raises(eg.EngrainError, match="grace"):
        Worker(journal, {"a": lambda t: t}, ["q"], grace=-1)
    assert [r.run_id for r in journal.runs()] == ["s"]  # nothing refused wrote anything


# -- CLI ----------------------------------------------------------------------------------------


def test_cli_enqueue_and_queues(store_url):
    out = cli("queues", "emails", "--concurrency", "5", "--rate", "100/1m", "--json", url=store_url)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [{"name": "emails", "concurrency": 5, "rate": [100, 60.0], "queued": 0, "running": 0}]
    out = cli("enqueue", "steps", "a job", "--queue", "emails", "--inputs", '{"steps": 2}', "--priority", "-3",
              "--run-id", "job-1", "--json", url=store_url)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"run_id": "job-1", "queue": "emails", "status": "queued"}
    plain = cli("enqueue", "steps", "another", url=store_url)
    assert plain.returncode == 0 and len(plain.stdout.split()) == 1
    out = cli("queues", url=store_url)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    assert rows[0][0] == "QUEUE" and ["default", "-", "-", "1", "0"] in rows and ["emails", "5", "100/60s", "1", "0"] in rows
    j = eg.open(store_url)
    try:
        first = j.read("job-1")[0].data
        assert first["inputs"] == {"steps": 2} and first["queue"] == "emails" and j.get_run("job-1").status == "queued"
    finally:
        j.close()


def test_cli_refuses_hostile_queue_input_in_one_line(store_url):
    for name in ("no spaces", "x" * 101, "semi;colon", ""):
        refused(cli("enqueue", "steps", "t", "--queue", name, url=store_url), "queue name")
        refused(cli("queues", name, "--concurrency", "2", url=store_url), "queue name")
    for p in ("10000001", "-10000001", "1" + "0" * 30):
        refused(cli("enqueue", "steps", "t", "--priority", p, url=store_url), "priority")
    refused(cli("enqueue", "steps", "t", "--priority", "high", url=store_url), "--priority")
    refused(cli("enqueue", "steps", "t", "--inputs", "{not json", url=store_url), "--inputs", "not valid JSON")
    refused(cli("enqueue", "steps", "t", "--inputs", "[1, 2]", url=store_url), "--inputs", "JSON object")
    refused(cli("enqueue", "steps", "t", "--inputs", "[" * 5000 + "]" * 5000, url=store_url), "--inputs")
    refused(cli("enqueue", "bad agent", "t", url=store_url), "agent")
    for c in ("0", "-4", "100001", "9" * 40):
        refused(cli("queues", "q", "--concurrency", c, url=store_url), "concurrency")
    refused(cli("queues", "q", "--concurrency", "many", url=store_url), "--concurrency")
    for r in ("100", "0/60", "-1/60", "10/0", "10/-5", "10/abc", "abc/60", "10/1e999", "1" * 12 + "/60", "/"):
        refused(cli("queues", "q", "--rate", r, url=store_url), "rate")
    refused(cli("queues", "--concurrency", "3", url=store_url), "need a queue NAME")
    out = cli("runs", "--json", url=store_url)
    assert out.returncode == 0 and json.loads(out.stdout) == []  # no refused call wrote a run
    assert json.loads(cli("queues", "--json", url=store_url).stdout) == []


def test_cli_refuses_hostile_operations_in_one_line(store_url):
    j = eg.open(store_url)
    try:
        _finished_run(j)
    finally:
        j.close()
    for age in ("abc", "-1d", "30x", "1e999d", "", "30 days", "1d2h"):
        refused(cli("gc", "--older-than", age, url=store_url), "older_than")
    refused(cli("gc", url=store_url), "--older-than")
    for status in ("running", "queued", "bogus"):
        refused(cli("gc", "--older-than", "1d", "--status", status, url=store_url), "finished runs only")
    for step in ("-1", "3", "99999999999999999999"):
        refused(cli("fork", "s", "--at-step", step, url=store_url), "step")
    refused(cli("fork", "s", "--at-step", "one", url=store_url), "--at-step")
    refused(cli("fork", "s", url=store_url), "--at-step")
    refused(cli("fork", "nope", "--at-step", "0", url=store_url), "nope")
    refused(cli("fork", "s", "--at-step", "1", "--run-id", "s", url=store_url), "already exists")
    refused(cli("cancel", "nope", url=store_url), "nope")
    refused(cli("cancel", "s", "--reason", "x" * 3000, url=store_url), "reason")
    done = cli("cancel", "s", "--json", url=store_url)  # a finished run: nothing to cancel, said plainly
    assert done.returncode == 0 and json.loads(done.stdout) == {"run_id": "s", "cancelled": False}
    refused(cli("worker", "--agents", "worker_agents:AGENTS", "--queue", "bad name", url=store_url), "queue name")
    refused(cli("worker", "--agents", "worker_agents:AGENTS", "--concurrency", "0", url=store_url), "concurrency")
    refused(cli("worker", "--agents", "worker_agents:AGENTS", "--grace", "-1", url=store_url), "grace")
    j = eg.open(store_url)
    try:
        assert [r.run_id for r in j.runs()] == ["s"] and j.get_run("s").status == "ok"
    finally:
        j.close()


# -- API ----------------------------------------------------------------------------------------


def test_api_refuses_hostile_operations_with_json_4xx(store_url, tmp_path):
    from engrain._server.app import create_app

    j = eg.open(store_url)
    try:
        _finished_run(j)
        app = create_app(store_url, routines_dir=tmp_path / "r", allow_fork=True)
        with TestClient(app, base_url="http://127.0.0.1") as c:
            cases = [
                ("/api/runs/s/fork", {"at_step": 3}, 400, "step"),
                ("/api/runs/s/fork", {"at_step": -1}, 422, "at_step"),
                ("/api/runs/s/fork", {"at_step": 10**30}, 422, "at_step"),
                ("/api/runs/s/fork", {"at_step": "one"}, 422, "at_step"),
                ("/api/runs/s/fork", {}, 422, "at_step"),
                ("/api/runs/s/fork", {"at_step": 1, "run_id": "s"}, 400, "already exists"),
                ("/api/runs/s/fork", {"at_step": 1, "run_id": ""}, 422, "run_id"),
                ("/api/runs/nope/fork", {"at_step": 0}, 404, "nope"),
                ("/api/runs/nope/cancel", {}, 404, "nope"),
                ("/api/runs/s/cancel", {"reason": "x" * 3000}, 422, "reason"),
                ("/api/runs/s/cancel", {"reason": 5}, 422, "reason"),
            ]
            for path, body, status, needle in cases:
                r = c.post(path, json=body)
                assert r.status_code == status, (path, body, r.status_code, r.text)
                err = r.json()
                assert isinstance(err.get("error"), str) and needle in json.dumps(err), (path, body, err)
            r = c.post("/api/runs/s/cancel", content=b"{not json", headers={"content-type": "application/json"})
            assert r.status_code == 422 and r.json()["error"] == "ValidationError"
            ok = c.post("/api/runs/s/cancel", json={})
            assert ok.status_code == 200 and ok.json() == {"run_id": "s", "cancelled": False, "status": "ok"}
            q = c.get("/api/queues")
            assert q.status_code == 200 and q.json() == {"queues": [], "workers": []}
        assert [r.run_id for r in j.runs()] == ["s"] and j.get_run("s").status == "ok"
    finally:
        j.close()


# -- a worker's graceful stop -----------------------------------------------------------------


def test_sigterm_releases_what_the_worker_cannot_finish_in_its_grace(store_url, tmp_path):
    """Past --grace, the worker hands its runs back at once (not after its 30 s lease) and exits 0."""
    effects = tmp_path / "effects.log"
    env = {**os.environ, "ENGRAIN_TEST_EFFECTS": str(effects), "ENGRAIN_LEASE_TTL": "30",
           "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    j = eg.open(store_url)
    try:
        rid = eg.enqueue("steps", "t", inputs={"steps": 2, "pause": 1.5}, journal=j)
        log = open(tmp_path / "w1.log", "wb")  # noqa: SIM115
        p = subprocess.Popen([ENGRAIN, "worker", "--agents", "worker_agents:AGENTS", "--grace", "0.3", "--url", store_url],
                             env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        deadline = time.time() + 30
        while j.get_run(rid).status != "running" and time.time() < deadline:
            time.sleep(0.05)
        held = j.get_run(rid).lease_owner
        assert held and f":{p.pid}:" in held
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=20)
        assert p.returncode == 0, (tmp_path / "w1.log").read_text()
        assert json.loads(out) == {"finished": {}, "parked": 0, "errors": [], "released": [rid],
                                   "unmatched": []}
        info = j.get_run(rid)
        assert info.status == "running" and info.lease_owner is None  # released, not left to expire
        # Another worker takes it over at once and finishes it.
        t0 = time.time()
        done = subprocess.run([ENGRAIN, "worker", "--agents", "worker_agents:AGENTS", "--until-idle", "--url", store_url],
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["finished"] == {"ok": 1} and time.time() - t0 < 25
        assert j.get_run(rid).status == "ok" and eg.run(lambda t: None, "t", run_id=rid, journal=j,
                                                                 agent_name="steps").output == 3
    finally:
        j.close()
