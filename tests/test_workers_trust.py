"""Workers and durable runs that must not run a step twice, after a cancel, or beyond a queue's limits.

Each race is injected at the point it happens (a monkeypatched store call, a clock whose sleep is
where the cancel arrives), not waited for with sleeps.
"""

from __future__ import annotations

import time
import types

import pytest

import engrain as eg
from engrain._durable import waiting as waiting_mod
from engrain._durable import sleep as sleep_mod
from engrain._durable.lease import owner_id
from engrain._workers import store as store_mod
from engrain._workers.queues import store_of
from engrain._workers.worker import Worker


def _counter():
    """A tool registry with ``work(n)`` counting its executions per step key."""
    reg = eg.ToolRegistry()
    calls: list[str | None] = []

    @eg.tool(registry=reg, name="work")
    def work(n: int) -> int:
        calls.append(eg.idempotency_key())
        return n + 1

    return work, calls


# -- 1. parking is fenced on the lease -------------------------------------------------------------------------


def test_park_is_fenced_on_the_lease_owner_and_epoch(journal):
    """A park by an executor that lost the lease (dropped, then taken by another worker) changes nothing."""
    store = store_of(journal)
    rid = eg.enqueue("napper", "t", queue="fence", journal=journal)
    [a] = store.claim("fence", "A", 30.0, 1)
    epoch_a = journal.get_run(rid).lease_epoch
    journal.release_lease(rid, "A")  # A's execution ended (its lease dropped) ...
    [b] = store.claim("fence", "B", 30.0, 1)  # ... and B took the run over as an orphan
    assert a.run_id == b.run_id == rid
    assert store.park(rid, time.time() + 60, "A", epoch_a) is False  # A's late park: refused
    info = journal.get_run(rid)
    assert (info.status, info.lease_owner) == ("running", "B")  # still B's, executing
    assert store.park(rid, time.time() + 60, "B", epoch_a) is False  # the right owner at a stale epoch: refused
    assert store.park(rid, time.time() + 60, "B", info.lease_epoch) is True
    info = journal.get_run(rid)
    assert (info.status, info.lease_owner) == ("queued", None)


def test_a_parked_run_is_parked_before_its_lease_is_dropped(journal, monkeypatch):
    """Another worker claiming at the moment of the park finds the run still leased: the step after the sleep
    executes once (before the fix the lease was dropped first, the claimer took the run as an orphan, and
    the park then put it back in the queue under that claimer: both executed the step)."""
    work, calls = _counter()

    def napper(task):
        eg.sleep(1.2)
        return work(0)

    store = store_of(journal)
    rid = eg.enqueue("napper", "t", queue="park", journal=journal)
    park = store_mod.QueueStore.park
    seen: dict[str, object] = {}

    def park_with_a_claimer_first(self, run_id, until, *args):
        # Injected interleaving: worker B claims in the queue just before the park runs.
        seen["holder"] = journal.get_run(run_id).lease_owner
        seen["b_got"] = [c.run_id for c in self.claim("park", "B", 30.0, 4)]
        return park(self, run_id, until, *args)

    monkeypatch.setattr(store_mod.QueueStore, "park", park_with_a_claimer_first)
    w = Worker(journal, {"napper": napper}, ["park"], park_after=0.3, poll=0.05)
    stats = w.run(until_idle=True)
    assert seen["holder"] == owner_id() and seen["b_got"] == []
    assert stats.parked == 1 and stats.finished == {"ok": 1}
    assert calls == [f"{rid}:1"]
    assert journal.get_run(rid).status == "ok"


# -- 2. no step begins after a cancel -----------------------------------------------------------------------------


class _CancellingClock(sleep_mod.Clock):
    """A clock whose sleep is where ``engrain.cancel`` arrives (then the time passes)."""

    def __init__(self, journal, run_id):
        self.journal, self.run_id, self.t = journal, run_id, 1_800_000_000.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        assert eg.cancel(self.run_id, reason="stop", journal=self.journal) is True
        self.t += seconds


def test_a_run_cancelled_during_a_durable_sleep_starts_no_step(journal, monkeypatch):
    work, calls = _counter()

    def agent(task):
        eg.sleep(30)
        return work(0)

    monkeypatch.setattr(sleep_mod, "clock", _CancellingClock(journal, "s1"))
    res = eg.run(agent, "t", run_id="s1", journal=journal)
    assert res.status == "cancelled" and calls == []
    assert [e.kind for e in journal.read("s1")][-1] == "run.cancelled"


def test_a_long_sleep_notices_a_cancel_before_it_ends(tmp_path):
    """The real clock waits in stretches, so a cancelled run stops long before its wake-up time."""
    import threading

    journal = eg.open(f"sqlite:///{tmp_path}/s.db")
    work, calls = _counter()
    started = threading.Event()

    def agent(task):
        started.set()
        eg.sleep(20)
        return work(0)

    out: list = []
    t = threading.Thread(target=lambda: out.append(eg.run(agent, "t", run_id="s2", journal=journal)))
    t0 = time.monotonic()
    t.start()
    assert started.wait(10)
    assert eg.cancel("s2", journal=journal) is True
    t.join(10)
    assert not t.is_alive() and time.monotonic() - t0 < 10
    assert out[0].status == "cancelled" and calls == []


def test_a_run_cancelled_during_a_retry_backoff_makes_no_further_attempt(journal, monkeypatch):
    reg = eg.ToolRegistry()
    attempts: list[str | None] = []

    @eg.tool(registry=reg, name="flaky", retries=3, backoff=0.01, max_backoff=0.01)
    def flaky() -> str:
        attempts.append(eg.idempotency_key())
        raise ConnectionError("down")

    def agent(task):
        return flaky()

    def sleep_then_cancelled(seconds: float) -> None:  # the backoff is where the cancel arrives
        assert eg.cancel("r1", journal=journal) is True

    fake_time = types.SimpleNamespace(time=time.time, monotonic=time.monotonic, sleep=sleep_then_cancelled)
    monkeypatch.setattr(waiting_mod, "time", fake_time)
    res = eg.run(agent, "t", run_id="r1", journal=journal)
    assert res.status == "cancelled" and attempts == ["r1:0"]


# -- 3. queue concurrency holds on every path --------------------------------------------------------------------


def test_an_answered_run_waits_for_a_free_slot_of_its_queue(journal):
    """An answered run is ``running`` with no lease: claimed as an orphan, it still counts against the limit."""
    work, calls = _counter()

    def asker(task):
        eg.ask("go?", [{"name": "go", "type": "text"}])
        return work(1)

    def other(task):
        return work(2)

    store = store_of(journal)
    eg.queue("one", concurrency=1, journal=journal)
    a = eg.enqueue("asker", "a", queue="one", journal=journal)
    Worker(journal, {"asker": asker}, ["one"], poll=0.05).run(until_idle=True)
    assert journal.get_run(a).status == "needs_input"
    b = eg.enqueue("other", "b", queue="one", journal=journal)
    assert [c.run_id for c in store.claim("one", "W1", 30.0, 4)] == [b]  # b executes: the one slot
    eg.answer(a, {"go": "yes"}, journal=journal)
    assert journal.get_run(a).status == "running" and journal.get_run(a).lease_owner is None
    assert store.claim("one", "W2", 30.0, 4) == []  # before the fix: [a], two executing at once
    journal.release_lease(b, "W1")  # b's worker died: its slot is free, and two orphans want it
    assert len(store.claim("one", "W2", 30.0, 4)) == 1
    # Nor does recovery (engrain.recover, Journal.claim_runs) take it past its queue: queued runs are the workers'.
    assert journal.claim_runs("R", 30.0) == []


def test_a_fork_of_a_queued_run_is_queued_on_its_queue(journal):
    store = store_of(journal)
    eg.queue("one", concurrency=1, journal=journal)
    src = eg.enqueue("steps", "a", queue="one", priority=5, journal=journal)
    fork = eg.fork(src, 0, run_id="fq", journal=journal)
    info = journal.get_run(fork)
    assert info.status == "queued" and info.lease_owner is None
    assert store.queue_of(fork) == "one"
    assert store.claim_orphans("W", 30.0, 4, {"steps": None}) == []  # not a run outside any queue
    got = store.claim("one", "W", 30.0, 4)
    assert len(got) == 1  # concurrency 1: the source or the fork, never both
    assert store.claim("one", "W2", 30.0, 4) == []
    # A fork of a run never queued is not put on a queue.
    eg.run(lambda task: "done", "t", run_id="plain", journal=journal, agent_name="plain")
    assert store.queue_of(eg.fork("plain", 0, run_id="pf", journal=journal)) is None


# -- 7. the queues view lists live workers only ---------------------------------------------------------------------


def test_queues_view_lists_no_dead_worker(journal, store_url, tmp_path):
    from fastapi.testclient import TestClient

    from engrain._events import NewEvent
    from engrain._server.app import create_app

    for rid, owner, ttl in (("dead-run", "h:1:dead", 0.01), ("live-run", "h:2:live", 60.0)):
        journal.append(rid, [NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": []})], 0)
        assert journal.take_lease(rid, owner, ttl) is not None
    time.sleep(0.1)  # the dead worker's lease (10 ms) expires
    with TestClient(create_app(store_url, routines_dir=str(tmp_path)), base_url="http://127.0.0.1") as c:
        view = c.get("/api/queues").json()
    assert view["workers"] == [{"owner": "h:2:live", "runs": ["live-run"]}]


# -- 9. bad input is a ConfigError (CLI exit 2) ------------------------------------------------------------------


def test_bad_queue_and_worker_options_are_config_errors(journal):
    from engrain._cli.routine_run import exit_code

    bad = [
        lambda: eg.queue("q", concurrency=0, journal=journal),
        lambda: eg.queue("q", rate=(0, 1), journal=journal),
        lambda: eg.enqueue("steps", "t", priority=99_999_999, journal=journal),
        lambda: eg.enqueue("steps", "t", queue="a b", journal=journal),
        lambda: eg.enqueue("no spaces", "t", journal=journal),
        lambda: Worker(journal, {"a": lambda t: t}, ["q"], concurrency=0),
        lambda: Worker(journal, {"a": lambda t: t}, ["q"], park_after=-1),
        lambda: Worker(journal, {"a": lambda t: t}, ["bad name"]),
    ]
    for call in bad:
        with pytest.raises(eg.ConfigError) as e:
            call()
        assert exit_code(e.value) == 2, e.value


def test_enqueueing_an_existing_run_id_says_so(journal):
    from engrain._cli.routine_run import exit_code

    eg.enqueue("steps", "t", run_id="dup", journal=journal)
    with pytest.raises(eg.ConflictError, match="run id 'dup' already exists") as e:  # catchable as before
        eg.enqueue("steps", "t", run_id="dup", journal=journal)
    assert isinstance(e.value, eg.ConfigError) and exit_code(e.value) == 2
    assert "another writer" not in str(e.value)
    assert journal.get_run("dup").status == "queued"  # the first one untouched
