"""Workers and queues: enqueue, limits, parking sleeps, graceful stop, and a 4-process fleet on PostgreSQL."""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import engrain as eg
from engrain._workers.worker import Worker

HERE = Path(__file__).parent
ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")


def _gauge():
    """A tool body measuring how many runs execute at once, in-process."""
    state = {"now": 0, "max": 0}
    lock = threading.Lock()

    def enter():
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])

    def leave():
        with lock:
            state["now"] -= 1

    return state, enter, leave


def test_enqueue_returns_at_once_and_shows_queued(journal, tmp_path):
    rid = eg.enqueue("steps", "job", queue="emails", inputs={"steps": 2}, priority=3, journal=journal)
    info = journal.get_run(rid)
    assert info.status == "queued" and info.lease_owner is None and info.task == "job"
    assert [r.run_id for r in journal.runs(status="queued")] == [rid]
    assert eg.recover(lambda t: None, journal=journal) == []  # queued is not orphaned
    q = {x.name: x for x in eg.queues(journal=journal)}
    assert q["emails"].queued == 1 and q["emails"].running == 0
    with pytest.raises(eg.EngrainError, match="queue name"):
        eg.enqueue("steps", "job", queue="no spaces", journal=journal)
    with pytest.raises(eg.EngrainError, match="concurrency"):
        eg.queue("emails", concurrency=0, journal=journal)
    with pytest.raises(eg.EngrainError, match="rate"):
        eg.queue("emails", rate=(10,), journal=journal)


def test_deleting_a_queued_run_removes_its_queue_row(journal):
    """gc and delete_run leave no queue row behind: the queue tables are part of the store's schema."""
    from engrain._workers.queues import store_of

    rid = eg.enqueue("steps", "job", queue="gone", journal=journal)
    keep = eg.enqueue("steps", "job", queue="gone", journal=journal)
    journal.delete_run(rid)
    store = store_of(journal)
    with store._lock:
        rows = [r[0] for r in store._db.execute("SELECT run_id FROM engrain_queue WHERE queue = 'gone'").fetchall()]
    assert rows == [keep] and store.queue_of(rid) is None


def test_an_error_outside_the_run_is_retried_once_per_lease_not_in_a_loop(journal, monkeypatch):
    """An exception the worker itself meets (not the agent's: that fails the run) frees the run once;
    when it recurs, the run keeps its lease until expiry, and until_idle still ends."""
    import engrain._workers.worker as worker_mod

    attempts = collections.Counter()
    real = worker_mod._run_parked

    def flaky(park_after, j, agent, task, run_id, inputs, *rest):
        attempts[run_id] += 1
        if task == "broken":
            raise RuntimeError("store hiccup")
        return real(park_after, j, agent, task, run_id, inputs, *rest)

    monkeypatch.setattr(worker_mod, "_run_parked", flaky)

    def agent(task):
        return task

    bad = eg.enqueue(agent, "broken", queue="e", journal=journal)
    good = eg.enqueue(agent, "fine", queue="e", journal=journal)
    t0 = time.monotonic()
    stats = Worker(journal, {"agent": agent}, ["e"], ttl=30, poll=0.02).run(until_idle=True)
    assert time.monotonic() - t0 < 20
    assert stats.finished == {"ok": 1} and journal.get_run(good).status == "ok"
    assert attempts[bad] == 2 and len(stats.errors) == 2 and "store hiccup" in stats.errors[0]
    assert journal.get_run(bad).lease_owner is not None  # kept until it expires: the next try waits for it


def test_worker_runs_queued_runs_within_the_concurrency_limit(journal):
    state, enter, leave = _gauge()
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg)
    def step(n: int) -> int:
        enter()
        time.sleep(0.02)
        leave()
        return n

    def agent(task, k):
        return sum(step(i) for i in range(3)) + k

    eg.queue("q", concurrency=2, journal=journal)
    ids = [eg.enqueue(agent, "t", queue="q", inputs={"k": k}, journal=journal) for k in range(8)]
    low = eg.enqueue(agent, "t", queue="q", inputs={"k": 100}, priority=-5, journal=journal)
    stats = Worker(journal, {"agent": agent}, ["q"], concurrency=4, poll=0.02).run(until_idle=True)
    assert stats.finished == {"ok": 9} and not stats.errors
    assert state["max"] == 2  # the queue's limit, not the worker's 4
    for k, rid in enumerate(ids):
        r = eg.run(agent, "t", run_id=rid, journal=journal, agent_name="agent")  # the name it was queued under
        assert r and r.output == 3 + k and r.executed == 0
    # The low-priority run was claimed last.
    ordered = sorted(ids + [low], key=lambda r: journal.get_run(r).updated)
    assert ordered[-1] == low


def test_rate_limit_spreads_starts(journal):
    def agent(task):
        return 1

    eg.queue("r", rate=(3, 1.0), journal=journal)
    for _ in range(6):
        eg.enqueue(agent, "t", queue="r", journal=journal)
    t0 = time.monotonic()
    stats = Worker(journal, {"agent": agent}, ["r"], concurrency=8, poll=0.05).run(until_idle=True)
    assert stats.finished == {"ok": 6}
    assert time.monotonic() - t0 >= 0.9  # the second three waited for the period
    from engrain._workers.queues import store_of

    store = store_of(journal)
    with store._lock:
        starts = sorted(r[0] for r in store._db.execute("SELECT first_claimed FROM engrain_queue WHERE queue = 'r'").fetchall())
    assert all(starts[i + 3] - starts[i] >= 0.99 for i in range(3))


def test_sleeping_run_is_parked_and_claimed_again_when_due(journal):
    order: list[str] = []

    def sleeper(task):
        order.append("sleeper starts")
        eg.sleep(0.6)
        order.append("sleeper wakes")
        return "rested"

    def quick(task):
        order.append("quick")
        return "done"

    a = eg.enqueue(sleeper, "t", queue="p", journal=journal)
    b = eg.enqueue(quick, "t", queue="p", priority=-1, journal=journal)
    # One thread: the quick run can only execute while the sleeper is parked.
    w = Worker(journal, {"sleeper": sleeper, "quick": quick}, ["p"], concurrency=1, poll=0.02, park_after=0.2)
    stats = w.run(until_idle=True)
    assert stats.parked == 1 and stats.finished == {"ok": 2}
    assert order == ["sleeper starts", "quick", "sleeper starts", "sleeper wakes"]
    assert eg.run(sleeper, "t", run_id=a, journal=journal, agent_name="sleeper").output == "rested"
    assert journal.get_run(b).status != "queued"


def test_cancelled_queued_run_never_executes(journal):
    ran = []

    def agent(task):
        ran.append(task)

    rid = eg.enqueue(agent, "t", queue="c", journal=journal)
    assert eg.cancel(rid, journal=journal)
    Worker(journal, {"agent": agent}, ["c"], poll=0.02).run(until_idle=True)
    assert ran == [] and journal.get_run(rid).status == "cancelled"


def _worker_proc(url: str, effects: Path, log: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "ENGRAIN_TEST_EFFECTS": str(effects), "ENGRAIN_LEASE_TTL": "2",
           "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(
        [ENGRAIN, "worker", "--agents", "worker_agents:AGENTS", "--url", url, *extra],
        env=env, stdout=subprocess.PIPE, stderr=open(log, "ab"), text=True,  # noqa: SIM115
    )


def test_sigterm_finishes_the_run_in_flight(store_url, tmp_path):
    effects = tmp_path / "effects.log"
    j = eg.open(store_url)
    try:
        rid = eg.enqueue("slow", "t", queue="default", inputs={"seconds": 1.5}, journal=j)
        p = _worker_proc(store_url, effects, tmp_path / "w.log")
        deadline = time.time() + 30
        while j.get_run(rid).status != "running" and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=30)
        assert p.returncode == 0, (tmp_path / "w.log").read_text()
        assert json.loads(out)["finished"] == {"ok": 1}
        info = j.get_run(rid)
        assert info.status in ("ok", "completed") and info.lease_owner is None
    finally:
        j.close()


@pytest.mark.slow
def test_four_worker_processes_200_runs_one_killed(tmp_path):
    """On PostgreSQL: every run completes once, the queue's limit holds (measured), no completed step runs again."""
    from conftest import drop_pg_schema, pg_schema_url

    schema = "w_" + os.urandom(6).hex()
    url = pg_schema_url(schema)
    effects = tmp_path / "effects.log"
    j = eg.open(url)
    procs: list[subprocess.Popen] = []
    limit, runs, steps = 6, 200, 4
    try:
        eg.queue("load", concurrency=limit, journal=j)
        ids = [eg.enqueue("steps", "job", queue="load", inputs={"steps": steps, "pause": 0.01}, journal=j)
               for _ in range(runs)]
        for i in range(4):
            procs.append(_worker_proc(url, effects, tmp_path / f"w{i}.log", "--queue", "load",
                                      "--concurrency", "3", "--until-idle"))
        victim = procs[0]
        # Kill one worker mid-way through the queue, at a moment it holds runs.
        def held() -> set[str]:
            return {r.run_id for r in j.runs(status="running", limit=1000)
                    if r.lease_owner and f":{victim.pid}:" in r.lease_owner}

        deadline = time.time() + 120
        while time.time() < deadline:
            text = effects.read_text() if effects.exists() else ""
            if len(text.splitlines()) >= runs * steps // 4 and held():
                break
            time.sleep(0.005)
        victim.kill()
        killed_at = time.time()
        victim.wait()
        orphaned = held()
        for p in procs[1:]:
            p.communicate(timeout=300)
            assert p.returncode == 0
        victim.wait()

        lines = [line.split() for line in effects.read_text().splitlines()]
        by_key: dict[str, list[tuple[int, float, float]]] = collections.defaultdict(list)
        for key, pid, t0, t1 in lines:
            by_key[key].append((int(pid), float(t0), float(t1)))
        victim_runs = {k.rsplit(":", 1)[0] for k, v in by_key.items() if any(p == victim.pid for p, _, _ in v)}
        victim_runs |= orphaned
        # Runs the killed worker held were taken over once its lease expired, and finished (checked below).
        assert orphaned, "the killed worker held no run"
        taken_over = orphaned
        repeated = 0
        for rid in ids:
            events = j.read(rid)
            kinds = [e.kind for e in events]
            assert kinds.count("run.completed") == 1 and kinds[-1] == "run.completed", (rid, kinds)
            assert events[-1].data["output"] == sum(n + 1 for n in range(steps))
            done = {e.data["call_id"]: e for e in events if e.kind == "step.completed"}
            assert sorted(done) == list(range(steps))
            for n in range(steps):
                runs_of = by_key[f"{rid}:{n}"]
                assert runs_of, f"{rid} step {n} has no effect"
                # A completed step never runs again.
                assert max(t0 for _, t0, _ in runs_of) <= done[n].ts, f"{rid} step {n} ran after completing"
                if len(runs_of) > 1:
                    assert rid in victim_runs, f"{rid} step {n} ran twice without a crash"
                    repeated += 1
        # The limit, measured: runs executing at once (first start to last end of each run per process).
        spans = collections.defaultdict(lambda: [float("inf"), 0.0])
        for key, v in by_key.items():
            rid = key.rsplit(":", 1)[0]
            for pid, t0, t1 in v:
                s = spans[(rid, pid)]
                s[0], s[1] = min(s[0], t0), max(s[1], t1 if pid != victim.pid else min(t1, killed_at))
        points = sorted([(s[0], 1) for s in spans.values()] + [(s[1], -1) for s in spans.values()], key=lambda x: (x[0], x[1]))
        now = peak = 0
        for _, d in points:
            now += d
            peak = max(peak, now)
        print(f"\nfleet: {runs} runs x {steps} steps, 4 workers (one killed), queue limit {limit}: "
              f"peak measured concurrency {peak}, runs taken over from the killed worker {len(taken_over)},"
              f" steps repeated after the kill {repeated}")
        assert 1 < peak <= limit
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        j.close()
        drop_pg_schema(schema)


def test_queued_runs_show_in_the_cli_and_the_api(store_url, tmp_path):
    from fastapi.testclient import TestClient

    from engrain._server.app import create_app

    j = eg.open(store_url)
    try:
        rid = eg.enqueue("steps", "queued job", queue="emails", journal=j)
        out = subprocess.run([ENGRAIN, "runs", "--status", "queued", "--json", "--url", store_url],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert [(r["run_id"], r["status"]) for r in json.loads(out.stdout)] == [(rid, "queued")]
        with TestClient(create_app(store_url, routines_dir=tmp_path / "r"), base_url="http://127.0.0.1") as c:
            rows = c.get("/api/runs", params={"status": "queued"}).json()
            assert [r["run_id"] for r in rows] == [rid]
    finally:
        j.close()


def test_worker_cli_errors_are_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    out = subprocess.run([ENGRAIN, "worker", "--agents", "no_such_module:AGENTS", "--url", url],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--agents 'no_such_module:AGENTS'" in out.stderr and "Traceback" not in out.stderr


def test_a_worker_takeover_fences_the_dead_holders_appends(journal):
    """Claiming an orphan moves the lease epoch, so the dead worker's late append is refused."""
    from engrain import LeaseLostError, NewEvent
    from engrain._workers.store import QueueStore

    qs = QueueStore(journal)
    qs.enqueue("orph", "agent", "t", "q", {}, 0, [])
    (first,) = qs.claim("q", "host:1:dead", ttl=0.05, limit=1)
    stale_epoch = journal.get_run("orph").lease_epoch
    time.sleep(0.1)  # the dead worker's lease expires
    (again,) = qs.claim("q", "host:2:alive", ttl=30, limit=1)
    assert first.run_id == again.run_id == "orph" and journal.get_run("orph").lease_owner == "host:2:alive"
    assert journal.get_run("orph").lease_epoch > stale_epoch
    with pytest.raises(LeaseLostError):
        journal.append("orph", [NewEvent("step.completed", "x", {"call_id": 0, "result": 1})],
                       journal.get_run("orph").next_seq, fence=stale_epoch)


STOP_WHILE_LOCKED = r"""
import os, signal, sys
import engrain as eg
from engrain._workers.worker import Worker

journal = eg.open(sys.argv[1])
w = Worker(journal, {"agent": lambda task: task}, ["q"])
w.install_signal_handlers()
with w._stop._cond:  # the lock the main thread holds inside the stop event's wait()
    os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, in this thread, under that lock
    for _ in range(1000):
        pass  # bytecodes for the handler to run between
stopped = w._stop.wait(10)
journal.close()
print("stopped" if stopped else "not stopped")
"""


def test_a_signal_arriving_while_the_stop_event_is_locked_still_stops_the_worker(tmp_path):
    """SIGTERM handled while the main thread holds the stop event's lock (it does inside every poll's wait): the
    handler must not set the event itself, or it waits for that lock forever and the worker never stops (a CI
    run of test_sigterm_finishes_the_run_in_flight hung 30 s so)."""
    out = subprocess.run([sys.executable, "-c", STOP_WHILE_LOCKED, f"sqlite:///{tmp_path / 'j.db'}"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "stopped", out.stderr
