"""Issue 16 bullets through their other surfaces, on SQLite and PostgreSQL: the at-most-once
"did this step happen?" question answered from the CLI and the API, a worker process parking a
sleeping run (holding no thread while it sleeps), and gc beside queued, parked and leased runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import engrain as eg
from engrain import NewEvent

HERE = Path(__file__).parent
ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")


def cli(*args: str, url: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([ENGRAIN, *args, "--url", url], capture_output=True, text=True, timeout=timeout, env=env)


def one_line_error(r: subprocess.CompletedProcess, needle: str) -> None:
    err = r.stderr.strip()
    assert r.returncode != 0 and r.stdout == "" and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert needle in err, err


def _payment_agent(calls: list[str]):
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg, at_most_once=True)
    def charge(amount: int) -> str:
        calls.append(eg.idempotency_key())
        return f"charged {amount}"

    return lambda task: charge(5)


def _crashed_payment(journal, run_id: str) -> None:
    """A run whose process died inside an at-most-once step: its durable start, no outcome."""
    journal.append(run_id, [
        NewEvent("run.started", "", {"task": "pay", "inputs": {}, "tags": []}),
        NewEvent("step.started", "charge", {"call_id": 0, "type": "tool", "args": {"amount": 5}, "attempt": 1,
                                            "at_most_once": True}),
    ], 0)


def test_cli_answers_did_this_step_happen(store_url):
    j = eg.open(store_url)
    calls: list[str] = []
    agent = _payment_agent(calls)
    try:
        for rid in ("paid", "retried"):
            _crashed_payment(j, rid)
            assert eg.run(agent, "pay", run_id=rid, journal=j).status == "needs_input" and calls == []
        one_line_error(cli("answer", "paid", "{nope", url=store_url), "not valid JSON")
        one_line_error(cli("answer", "paid", '{"happened": "maybe"}', url=store_url), "exactly one of")
        one_line_error(cli("answer", "nope", '{"retry": true}', url=store_url), "nope")
        out = cli("answer", "paid", '{"result": "ch_123"}', "--json", url=store_url)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == {"run_id": "paid", "answered": True, "status": "running"}
        one_line_error(cli("answer", "paid", '{"retry": true}', url=store_url), "not waiting for input")
        assert cli("answer", "retried", '{"retry": true}', url=store_url).returncode == 0
        paid = eg.run(agent, "pay", run_id="paid", journal=j)
        assert paid and paid.output == "ch_123" and calls == []  # it happened: never called again
        retried = eg.run(agent, "pay", run_id="retried", journal=j)
        assert retried and retried.output == "charged 5" and calls == ["retried:0"]  # same idempotency key
    finally:
        j.close()


def test_api_answers_did_this_step_happen(store_url, tmp_path):
    from engrain._server.app import create_app

    j = eg.open(store_url)
    calls: list[str] = []
    agent = _payment_agent(calls)
    try:
        _crashed_payment(j, "p")
        paused = eg.run(agent, "pay", run_id="p", journal=j)
        assert "did this step happen?" in paused.prompt["prompt"]
        with TestClient(create_app(store_url, routines_dir=tmp_path / "r"), base_url="http://127.0.0.1") as c:
            shown = c.get("/api/runs/p").json()
            assert shown["run"]["status"] == "needs_input" and shown["prompt"]["at_most_once"] is True
            bad = c.post("/api/runs/p/answers", json={"answers": {"result": 1, "retry": True}})
            assert bad.status_code == 400 and "exactly one of" in bad.json()["detail"]
            ok = c.post("/api/runs/p/answers", json={"answers": {"error": "declined by the provider"}})
            assert ok.status_code == 200 and ok.json()["status"] == "running"
            again = c.post("/api/runs/p/answers", json={"answers": {"retry": True}})
            assert again.status_code == 409 and again.json()["error"] == "NotWaitingForInput"
        done = eg.run(agent, "pay", run_id="p", journal=j)
        assert done.status == "failed" and "declined by the provider" in done.error and calls == []
    finally:
        j.close()


def test_worker_process_parks_a_sleeping_run(store_url, tmp_path):
    """With one thread, a quick run executes while the napping run is parked: queued, no lease, nothing held."""
    env = {**os.environ, "ENGRAIN_TEST_EFFECTS": str(tmp_path / "effects.log"),
           "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    j = eg.open(store_url)
    try:
        # 4 s against --park-after 0.5: parked even if journaling the sleep stalls for seconds on a loaded machine.
        napper = eg.enqueue("nap", "t", queue="naps", inputs={"seconds": 4.0}, priority=5, journal=j)
        quick = eg.enqueue("steps", "t", queue="naps", inputs={"steps": 1}, journal=j)
        p = subprocess.Popen([ENGRAIN, "worker", "--agents", "worker_agents:AGENTS", "--queue", "naps", "--concurrency", "1",
                              "--park-after", "0.5", "--until-idle", "--url", store_url],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen_parked = False
        deadline = time.time() + 30
        while p.poll() is None and time.time() < deadline:
            info = j.get_run(napper)
            if info.status == "queued" and any(e.name == "engrain.sleep" for e in j.read(napper)):
                assert info.lease_owner is None  # parked: no process holds it
                seen_parked = True
            time.sleep(0.02)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        stats = json.loads(out)
        assert stats["parked"] == 1 and stats["finished"] == {"ok": 2} and seen_parked, (stats, seen_parked, err)
        assert j.get_run(quick).updated < j.get_run(napper).updated  # the quick run went while the napper slept
        sleep = next(e for e in j.read(napper) if e.name == "engrain.sleep")
        assert j.get_run(napper).updated >= sleep.data["result"]["until"]  # woke no earlier than its journaled time
    finally:
        j.close()


def test_gc_never_touches_queued_parked_or_leased_runs(store_url):
    j = eg.open(store_url)
    try:
        eg.run(lambda t: 1, "t", run_id="done", journal=j)
        eg.enqueue("agent", "t", queue="q", run_id="queued", journal=j)
        eg.enqueue("agent", "t", queue="q", run_id="parked", journal=j)
        from engrain._workers.queues import store_of

        qs = store_of(j)
        (claimed,) = qs.claim("q", "host:1:w", ttl=3600, limit=1)
        assert claimed.run_id == "queued"
        # The second is claimed, then parked until an hour from now (a long durable sleep).
        (c2,) = qs.claim("q", "host:1:w", ttl=3600, limit=1)
        qs.park(c2.run_id, time.time() + 3600, "host:1:w")
        j.append("leased", [NewEvent("run.started", "", {"task": "t"})], 0, lease=("host:2:x", 3600.0))
        time.sleep(0.05)
        before = {r.run_id: r.status for r in j.runs()}
        assert before == {"done": "ok", "queued": "running", "parked": "queued", "leased": "running"}
        dry = cli("gc", "--older-than", "0s", "--dry-run", "--json", url=store_url)
        assert dry.returncode == 0 and json.loads(dry.stdout) == {"deleted": 1, "run_ids": ["done"], "dry_run": True}
        assert j.get_run("done") is not None
        out = cli("gc", "--older-than", "0s", "--json", url=store_url)
        assert out.returncode == 0 and json.loads(out.stdout)["run_ids"] == ["done"]
        assert {r.run_id: r.status for r in j.runs()} == {k: v for k, v in before.items() if k != "done"}
        assert j.read("done") == [] and len(j.read("parked")) == 1
        # A deleted id may be used again, on a queue too.
        assert eg.enqueue("agent", "t", queue="q", run_id="done", journal=j) == "done"
        assert {q.name: q.queued for q in eg.queues(journal=j)} == {"q": 2}
    finally:
        j.close()


def test_queue_limits_hold_across_workers_on_separate_connections(store_url):
    """Two workers, each on its own connection to the store: the queue's concurrency and rate are shared."""
    import threading

    from engrain._workers.worker import Worker

    state = {"now": 0, "max": 0}  # runs of queue "shared" executing at once
    lock = threading.Lock()
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg)
    def step(n: int, gauge: bool) -> int:
        if gauge:
            with lock:
                state["now"] += 1
                state["max"] = max(state["max"], state["now"])
        time.sleep(0.03)
        if gauge:
            with lock:
                state["now"] -= 1
        return n

    def agent(task, k):
        return step(k, task == "shared") + step(k, task == "shared")

    setup = eg.open(store_url)
    eg.queue("shared", concurrency=2, journal=setup)
    eg.queue("paced", rate=(3, 1.0), journal=setup)
    ids = [eg.enqueue(agent, "shared", queue="shared", inputs={"k": k}, journal=setup) for k in range(10)]
    paced = [eg.enqueue(agent, "paced", queue="paced", inputs={"k": k}, journal=setup) for k in range(6)]
    journals = [eg.open(store_url), eg.open(store_url)]
    workers = [Worker(j, {"agent": agent}, ["shared", "paced"], concurrency=3, poll=0.02) for j in journals]
    stats: list = [None, None]

    def go(i: int) -> None:
        stats[i] = workers[i].run(until_idle=True)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert all(s is not None and not s.errors for s in stats), stats
        assert sum(s.finished.get("ok", 0) for s in stats) == 16  # every run once
        assert state["max"] == 2  # the shared limit, not 2 workers x 3 threads
        for k, rid in enumerate(ids + paced):
            kinds = [e.kind for e in setup.read(rid)]
            assert kinds.count("run.completed") == 1 and setup.read(rid)[-1].data["output"] == 2 * (k % 10 if k < 10 else k - 10)
        from engrain._workers.queues import store_of

        qs = store_of(setup)
        with qs._lock:
            starts = sorted(r[0] for r in qs._db.execute("SELECT first_claimed FROM engrain_queue WHERE queue = 'paced'").fetchall())
        assert all(starts[i + 3] - starts[i] >= 0.99 for i in range(3))  # 3 per second across both workers
    finally:
        for j in journals:
            j.close()
        setup.close()


def test_lease_ttl_defaults_to_10_seconds_and_a_claim_uses_it(journal, tmp_path):
    code = "from engrain._durable.lease import DEFAULT_TTL; print(DEFAULT_TTL)"
    env = {k: v for k, v in os.environ.items() if k != "ENGRAIN_LEASE_TTL"}
    got = [subprocess.run([sys.executable, "-c", code], env={**env, **extra}, capture_output=True, text=True).stdout.strip()
           for extra in ({}, {"ENGRAIN_LEASE_TTL": "2.5"}, {"ENGRAIN_LEASE_TTL": "soon"}, {"ENGRAIN_LEASE_TTL": "0"})]
    assert got == ["10.0", "2.5", "10.0", "10.0"]
    from engrain._durable.lease import DEFAULT_TTL
    from engrain._workers.queues import store_of

    rid = eg.enqueue("agent", "t", queue="ttl", journal=journal)
    (c,) = store_of(journal).claim("ttl", "host:1:w", DEFAULT_TTL, 1)
    info = journal.get_run(rid)
    assert c.run_id == rid and info.lease_owner == "host:1:w"
    assert abs(info.lease_until - (time.time() + DEFAULT_TTL)) < 2.0


def test_cli_shows_retries_sleeps_patches_and_the_patch_a_run_cannot_replay(store_url):
    import datetime as dt

    reg = eg.ToolRegistry()
    tries = {"n": 0}

    @eg.tool(registry=reg, retries=2, backoff=0.01, retry_on=(IOError,))
    def flaky(x: int) -> int:
        tries["n"] += 1
        if tries["n"] == 1:
            raise IOError("timeout")
        return x

    def v1(task):
        return flaky(1)

    def v2(task):
        if eg.patched("use-flaky-2"):
            a = flaky(2)
        else:
            a = flaky(1)
        eg.sleep(0.05)
        eg.sleep_until(dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=0.05))
        return a

    @eg.tool(registry=reg)
    def fresh(x: int) -> int:
        return x

    def v3(task):  # the old branch (flaky) removed while old runs are in flight
        if eg.patched("use-fresh"):
            return fresh(2)
        return fresh(2)

    j = eg.open(store_url)
    try:
        assert eg.run(v2, "t", run_id="new", journal=j).output == 2
        j.append("old", [NewEvent("run.started", "", {"task": "t"}),
                         NewEvent("step.completed", "flaky", {"call_id": 0, "type": "tool", "args": {"x": 1}, "result": 1})], 0)
        assert eg.run(v3, "t", run_id="old", journal=j).status == "failed"
    finally:
        j.close()
    shown = cli("show", "new", url=store_url)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert 'engrain.patched({"name": "use-flaky-2"}) -> true' in text
    assert "flaky attempt 1 failed OSError: timeout; retry in" in text
    assert text.count("engrain.sleep(") == 2 and '"until"' in text
    old = cli("show", "old", url=store_url)
    assert old.returncode == 0 and "NondeterminismError" in old.stdout and "use-fresh" in old.stdout, old.stdout


def test_api_fork_cancel_queued_and_queues_view(store_url, tmp_path):
    from engrain._server.app import create_app

    reg = eg.ToolRegistry()
    calls: list[int] = []

    @eg.tool(registry=reg)
    def add(a: int) -> int:
        calls.append(a)
        return a + 1

    def agent(task):
        return add(add(1))

    j = eg.open(store_url)
    try:
        assert eg.run(agent, "t", run_id="src", journal=j).output == 3
        eg.queue("mail", concurrency=3, rate=(10, 60), journal=j)
        queued = eg.enqueue("agent", "t", queue="mail", journal=j)
        j.append("held", [NewEvent("run.started", "", {"task": "t"})], 0, lease=("host-a:77:ab", 3600.0))
        app = create_app(store_url, routines_dir=tmp_path / "r", allow_fork=True)
        with TestClient(app, base_url="http://127.0.0.1") as c:
            r = c.post("/api/runs/src/fork", json={"at_step": 1, "run_id": "forked"})
            assert r.status_code == 200 and r.json() == {"run_id": "forked", "source": "src", "at_step": 1}
            view = c.get("/api/queues").json()
            assert view["queues"] == [{"name": "mail", "concurrency": 3, "rate": [10, 60.0], "queued": 1, "running": 0}]
            assert {"owner": "host-a:77:ab", "runs": ["held"]} in view["workers"]
            r = c.post(f"/api/runs/{queued}/cancel", json={"reason": "not needed"})
            assert r.status_code == 200 and r.json() == {"run_id": queued, "cancelled": True, "status": "cancelled"}
            assert c.get("/api/queues").json()["queues"][0]["queued"] == 0
        calls.clear()
        resumed = eg.run(agent, "t", run_id="forked", journal=j)
        assert resumed.output == 3 and resumed.replayed == 1 and calls == [2]  # step 0 reused, step 1 executed
    finally:
        j.close()


def test_forking_a_client_run_whose_step_events_do_not_fold_is_a_409_naming_the_event(store_url, tmp_path):
    """A client writes any data into its run's events; a fork of it is refused naming the event, never a 500."""
    from engrain._server.app import create_app

    app = create_app(store_url, routines_dir=tmp_path / "r")
    with TestClient(app, base_url="http://127.0.0.1") as c:
        events = [{"kind": "run.started", "data": {"task": "t"}},
                  {"kind": "step.completed", "name": "a", "data": {"call_id": 0, "result": 1}},
                  {"kind": "step.failed", "data": {"": None}}]
        r = c.post("/api/runs/c1/events", json={"events": events, "expected_seq": 0})
        assert r.status_code == 200, r.text
        r = c.post("/api/runs/c1/fork", json={"at_step": 0, "run_id": "c1-fork"})
        assert r.status_code == 409, r.text
        body = r.json()
        assert body["error"] == "ForkConflictError" and "event 2 (step.failed)" in body["detail"]
        assert c.get("/api/runs/c1-fork").status_code == 404  # nothing written
        r = c.post("/api/runs/c1/events", json={"events": [{"kind": "step.started", "data": {"call_id": "x"}}],
                                                "expected_seq": 3})
        assert r.status_code == 200, r.text
        assert "event 2 (step.failed)" in c.post("/api/runs/c1/fork", json={"at_step": 0}).json()["detail"]


def test_answering_a_client_run_whose_step_events_do_not_fold_is_a_4xx_naming_the_event(store_url, tmp_path):
    """The same for an answer: the fold names the event, the server answers 400, nothing is appended."""
    from engrain._server.app import create_app

    app = create_app(store_url, routines_dir=tmp_path / "r")
    with TestClient(app, base_url="http://127.0.0.1") as c:
        events = [{"kind": "run.started", "data": {"task": "t"}}, {"kind": "input.requested", "data": {}}]
        assert c.post("/api/runs/c2/events", json={"events": events, "expected_seq": 0}).status_code == 200
        r = c.post("/api/runs/c2/answers", json={"answers": {}})
        assert r.status_code == 400, r.text
        assert "event 1 (input.requested)" in r.json()["detail"]
        assert len(c.get("/api/runs/c2/events").json()) == 2


def test_no_run_endpoint_fails_on_a_client_run_whose_events_are_malformed(store_url, tmp_path):
    """Every kind the fold reads, with data missing or mistyped: each run endpoint answers, none with a 5xx."""
    import itertools

    from engrain._server.app import create_app

    kinds = ["step.started", "step.completed", "step.failed", "input.requested", "input.received",
             "replay.completed", "run.completed", "run.cancelled"]
    datas = [{}, {"call_id": "x"}, {"call_id": None}, {"call_id": 0, "attempt": "z"},
             {"call_id": 0, "retry_in": "soon"}, {"call_id": 0, "args": 5}, {"call_id": 0, "answers": 3},
             {"completions": [[1, 2, 3, 4, 5]]}, {"completions": "x"}, {"call_id": True},
             {"call_id": 0, "at_most_once": True}]
    app = create_app(store_url, routines_dir=tmp_path / "r")
    failures = []
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as c:
        for n, (kind, data) in enumerate(itertools.product(kinds, datas)):
            rid = f"m{n}"
            events = [{"kind": "run.started", "data": {"task": "t"}},
                      {"kind": "step.started", "data": {"call_id": 0, "args": {}}}, {"kind": kind, "data": data}]
            r = c.post(f"/api/runs/{rid}/events", json={"events": events, "expected_seq": 0})
            assert r.status_code == 200, r.text
            for method, path, body in [("get", f"/api/runs/{rid}", None), ("get", f"/api/runs/{rid}/events", None),
                                       ("post", f"/api/runs/{rid}/answers", {"answers": {"result": 1}}),
                                       ("post", f"/api/runs/{rid}/fork", {"at_step": 1}),
                                       ("post", f"/api/runs/{rid}/cancel", {"reason": "x"})]:
                r = getattr(c, method)(path, **({} if body is None else {"json": body}))
                if r.status_code >= 500:
                    failures.append((method, path, kind, data, r.text[:200]))
        assert c.get("/api/runs").status_code == 200
    assert failures == []


def test_a_worker_leaves_runs_of_agents_it_does_not_have(journal):
    """A run for an agent this worker lacks stays queued for one that has it (no claim/release loop)."""
    import threading

    from engrain._workers.worker import Worker

    mine = eg.enqueue("mine", "t", queue="mix", journal=journal)
    theirs = eg.enqueue("theirs", "t", queue="mix", priority=9, journal=journal)
    w = Worker(journal, {"mine": lambda task: "mine done"}, ["mix"], poll=0.02)
    out: list = []
    t = threading.Thread(target=lambda: out.append(w.run(until_idle=True)))
    t.start()
    t.join(20)
    if t.is_alive():
        w.stop()
        t.join(20)
        pytest.fail("the worker kept going: it is waiting on (or looping over) a run it cannot execute")
    assert out[0].finished == {"ok": 1} and out[0].errors == []
    info = journal.get_run(theirs)
    assert info.status == "queued" and info.lease_owner is None and journal.get_run(mine).status == "ok"
    other = Worker(journal, {"theirs": lambda task: "theirs done"}, ["mix"], poll=0.02).run(until_idle=True)
    assert other.finished == {"ok": 1} and journal.get_run(theirs).status == "ok"


def test_a_worker_resumes_orphaned_runs_never_queued(journal):
    """A run started with engrain.run whose process died is resumed by a worker that has its agent."""
    from engrain._workers.worker import Worker

    reg = eg.ToolRegistry()
    calls: list[int] = []
    crash = {"on": True}

    @eg.tool(registry=reg)
    def step(n: int) -> int:
        if n == 1 and crash["on"]:
            raise KeyboardInterrupt  # the process dies here
        calls.append(n)
        return n

    def pay(task):
        return step(0) + step(1) + 10

    with pytest.raises(KeyboardInterrupt):
        eg.run(pay, "t", run_id="orphan", agent_name="pay", journal=journal)
    with pytest.raises(KeyboardInterrupt):
        eg.run(pay, "t", run_id="not-mine", agent_name="other", journal=journal)
    for rid in ("orphan", "not-mine"):  # their process died: the leases ran out
        info = journal.get_run(rid)
        journal.release_lease(rid, info.lease_owner)
    crash["on"] = False
    calls.clear()
    stats = Worker(journal, {"pay": pay}, ["default"], poll=0.02).run(until_idle=True)
    assert stats.finished == {"ok": 1} and not stats.errors
    assert journal.get_run("orphan").status == "ok" and calls == [1]  # step 0 came from the journal
    assert journal.read("orphan")[-1].data["output"] == 11
    assert journal.get_run("not-mine").status == "running"  # no agent "other" here: left for recover()
