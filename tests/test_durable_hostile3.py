"""Durable runs and workers against a hostile tester: each test is a case an earlier pass missed.

A fork of a cache hit re-ran its steps; a tool raising a BaseException made a worker claim its run again
for ever; a storage error met while a retry waited let the agent finish the run; an error whose
``__str__`` raises, or whose constructor takes other arguments, changed what the agent caught; an async
callable object ran as a coroutine never awaited; bad arguments raised untyped errors. SQLite only: every
case is in engrain's code above the store.
"""

from __future__ import annotations

import threading
import time

import pytest

import engrain as eg
from engrain import _events as ev
from engrain._durable import waiting as waiting_mod
from engrain._durable.batched import run_batched
from engrain._durable.context import current
from engrain._errors import StorageError
from engrain._journal import open_journal
from engrain._workers.queues import store_of
from engrain._workers.worker import Worker


@pytest.fixture
def j(tmp_path):
    journal = open_journal(f"sqlite:///{tmp_path / 'h3.db'}")
    yield journal
    journal.close()


def test_a_fork_of_a_cache_hit_replays_the_steps_it_keeps(j):
    """A cache hit journals its steps in one ``replay.completed``: a fork at step 2 must replay steps 0 and 1."""
    reg = eg.ToolRegistry()
    calls: list[int] = []

    @eg.tool(registry=reg, name="double")
    def double(x: int) -> int:
        calls.append(x)
        return 2 * x

    def agent(task):
        current().append(ev.REPLAY_STARTED, "r", {"routine": "r"})  # what the cache journals before its steps
        return double(1) + double(2) + double(3)

    r = run_batched(agent, "t", run_id="hit", tags=[], journal=j)
    assert r.status == "ok" and [e.kind for e in j.read("hit")][1] == ev.REPLAY_COMPLETED
    new = eg.fork("hit", 2, journal=j)
    calls.clear()
    r2 = eg.run(agent, "t", run_id=new, journal=j, agent_name=j.read("hit")[0].data["agent"])
    assert (r2.status, r2.output, calls, r2.replayed) == ("ok", 12, [3], 2)


def test_a_worker_does_not_claim_again_and_again_a_run_a_tool_unwound_with_a_base_exception(j):
    """A tool's own BaseException leaves its step unjournaled: the worker must back off, not re-run it in a loop."""

    class Stop(BaseException):
        pass

    calls: list[float] = []
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg, name="charge")
    def charge() -> None:
        calls.append(time.time())
        raise Stop("stop")

    def payer(task):
        charge()
        return "done"

    rid = eg.enqueue("payer", "t", journal=j)
    w = Worker(j, {"payer": payer}, ["default"], poll=0.02, ttl=30)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    time.sleep(1.0)
    w.stop()
    t.join(10)
    assert not t.is_alive()
    assert len(calls) == 2, f"the step ran {len(calls)} times in a second"  # once, then once more after a release
    assert j.get_run(rid).status == ev.RUNNING  # still resumable
    assert w.stats.errors and "Stop: stop" in w.stats.errors[0]


def test_a_storage_error_met_while_a_retry_waits_leaves_the_run_resumable(j, monkeypatch):
    """The agent catches the StorageError a backoff's cancel check raised: the run must not end ok on its fallback."""
    monkeypatch.setattr(waiting_mod, "CANCEL_POLL", 0.02)
    n: list[int] = []
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg, name="flaky", retries=2, backoff=0.05, max_backoff=0.05)
    def flaky() -> str:
        n.append(1)
        if len(n) < 2:
            raise RuntimeError("transient")
        return "paid"

    real = j.get_run
    fail = {"once": True}

    def get_run(run_id, *a, **k):
        if fail["once"] and run_id == "r":
            fail["once"] = False
            raise StorageError(j.url, "disk I/O error")
        return real(run_id, *a, **k)

    monkeypatch.setattr(j, "get_run", get_run)

    def agent(task):
        try:
            return flaky()
        except Exception as e:  # an agent's own fallback: it must not finish a run the store failed
            return f"fallback after {type(e).__name__}"

    with pytest.raises(StorageError):
        eg.run(agent, "t", run_id="r", journal=j)
    assert j.get_run("r").status == ev.RUNNING
    r = eg.run(agent, "t", run_id="r", journal=j)
    assert (r.status, r.output, len(n)) == ("ok", "paid", 2)


def test_a_tool_error_whose_str_raises_reaches_the_agent_as_itself(j):
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no text")

    reg = eg.ToolRegistry()

    @eg.tool(registry=reg, name="odd")
    def odd() -> None:
        raise Unprintable()

    @eg.tool(registry=reg, name="odd_retried", retries=1, backoff=0.001, max_backoff=0.001)
    def odd_retried() -> None:
        raise Unprintable()

    def agent(task):
        out = []
        try:
            odd()
        except Unprintable:
            out.append("caught")
        try:
            odd_retried()
        except eg.RetriesExhaustedError as e:
            out.append(e.__class__.__name__)
        return out

    r = eg.run(agent, "t", run_id="u", journal=j)
    assert (r.status, r.output) == ("ok", ["caught", "RetriesExhaustedError"])
    assert eg.run(agent, "t", run_id="u", journal=j).output == ["caught", "RetriesExhaustedError"]


class Declined(Exception):
    def __init__(self, code: int, reason: str):
        super().__init__(f"{code}: {reason}")


def test_a_replayed_error_whose_constructor_takes_other_arguments_keeps_its_type(j):
    """Killed after a step that raised ``Declined(code, reason)``, the resumed agent must catch ``Declined`` again."""
    reg = eg.ToolRegistry()
    sent: list[str] = []

    @eg.tool(registry=reg, name="charge")
    def charge() -> None:
        raise Declined(402, "card declined")

    @eg.tool(registry=reg, name="notify")
    def notify(msg: str) -> bool:
        sent.append(msg)
        return True

    def agent(task):
        try:
            charge()
            out = "paid"
        except Declined as e:
            out = f"declined ({e})"
        notify(out)
        return out

    assert eg.run(agent, "t", run_id="d", journal=j).output == "declined (402: card declined)"
    resumed = eg.fork("d", 1, journal=j)  # the journal a kill after step 0 leaves
    r = eg.run(agent, "t", run_id=resumed, journal=j)
    assert (r.status, r.output, r.replayed) == ("ok", "declined (402: card declined)", 1)


def test_an_object_with_an_async_call_runs_as_an_async_agent(j):
    class Agent:
        async def __call__(self, task):
            return task.upper()

    r = eg.run(Agent(), "hi", run_id="a", journal=j, agent_name="obj")
    assert (r.status, r.output) == ("ok", "HI")


def test_a_claimed_run_deleted_before_it_executes_is_not_started_anew(j):
    """Claimed, then cancelled and deleted by gc before its thread reads it: the worker must not create it again."""
    calls: list[str] = []

    def agent(task):
        calls.append(task)
        return "done"

    rid = eg.enqueue("agent", "t", journal=j)
    w = Worker(j, {"agent": agent}, ["default"], poll=0.02)
    (claimed,) = store_of(j).claim("default", "someone", 30.0, 1)
    eg.cancel(rid, journal=j)
    assert eg.gc(0, journal=j).runs == [rid]
    w._execute(claimed)
    assert calls == [] and j.read(rid) == []


@pytest.mark.parametrize("call, field", [
    (lambda j: eg.tool(type="bogus")(lambda: 1), "type"),
    (lambda j: eg.tool(retries=1, retry_on=5)(lambda: 1), "retry_on"),
    (lambda j: eg.run(lambda task: 1, "t", inputs=[1], journal=j), "inputs"),
    (lambda j: eg.run(lambda task: 1, "t", tags="abc", journal=j), "tags"),
    (lambda j: eg.run(lambda task: 1, object(), journal=j), "task"),  # any JSON task is kept (a dict, 5)
    (lambda j: eg.enqueue("agent", "t", tags="abc", journal=j), "tags"),
    (lambda j: eg.queue("q", rate=(10**30, 1), journal=j), "rate"),
    (lambda j: eg.gc("1d", status=5, journal=j), "status"),
])
def test_bad_arguments_are_typed_errors_naming_the_field(j, call, field):
    with pytest.raises(eg.EngrainError, match=field):
        call(j)
    assert j.runs() == []  # nothing was created
