"""Leases against executors the store cannot tell apart or that came back too late.

One process's executors share an owner id, so the store alone would let two threads (or two
coroutines) of one process execute the same run; and an executor that was stopped past its
lease must not take the lease back once its successor released it. On both backends.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import engrain as eg
import engrain._durable.lease as lease_mod
from engrain._durable.lease import Lease
from engrain._events import NewEvent


def _started(journal, run_id: str) -> None:
    journal.append(run_id, [NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": []})], 0)


def _paused_payment(journal, charges: list, gate: threading.Event):
    """A run paused at a question, answered, whose resume blocks in its first ``charge`` until ``gate``."""

    @eg.tool(registry=eg.ToolRegistry())
    def charge(amount: int) -> str:
        charges.append(eg.idempotency_key())
        if len(charges) == 1:
            gate.wait(10)
        return f"charged {amount}"

    def agent(task: str, amount: int) -> str:
        eg.ask("charge?", [{"name": "ok", "type": "boolean"}])
        return charge(amount)

    assert eg.run(agent, "pay", run_id="pay-1", inputs={"amount": 10}, journal=journal).status == "needs_input"
    eg.answer("pay-1", {"ok": True}, journal=journal)
    return agent


def _resume_in_thread(agent, journal, charges: list) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def resume() -> None:
        try:
            out["result"] = eg.run(agent, "pay", run_id="pay-1", inputs={"amount": 10}, journal=journal)
        except Exception as e:  # noqa: BLE001 - reported to the test
            out["error"] = e

    t = threading.Thread(target=resume)
    t.start()
    deadline = time.monotonic() + 10
    while not charges and time.monotonic() < deadline:
        time.sleep(0.005)
    assert charges, "the first executor never reached its step"
    return t, out


def test_a_second_thread_resuming_a_run_in_execution_is_refused_before_executing(journal):
    charges: list = []
    gate = threading.Event()
    agent = _paused_payment(journal, charges, gate)
    first, out = _resume_in_thread(agent, journal, charges)
    try:
        with pytest.raises(eg.LeaseHeldError):
            eg.run(agent, "pay", run_id="pay-1", inputs={"amount": 10}, journal=journal)
    finally:
        gate.set()
        first.join(10)
    assert charges == ["pay-1:1"]  # the tool ran once, not once per executor
    assert "error" not in out and out["result"].status == "ok" and out["result"].output == "charged 10"
    kinds = [e.kind for e in journal.read("pay-1")]
    assert kinds.count("step.completed") == 1 and kinds[-1] == "run.completed"
    assert journal.get_run("pay-1").lease_owner is None


def test_a_second_journal_on_the_same_store_is_refused_too(journal, store_url):
    charges: list = []
    gate = threading.Event()
    agent = _paused_payment(journal, charges, gate)
    first, out = _resume_in_thread(agent, journal, charges)
    other = eg.open(store_url)
    try:
        with pytest.raises(eg.LeaseHeldError):
            eg.run(agent, "pay", run_id="pay-1", inputs={"amount": 10}, journal=other)
    finally:
        gate.set()
        first.join(10)
        other.close()
    assert charges == ["pay-1:1"] and out["result"].status == "ok"


def test_two_coroutines_of_one_loop_do_not_both_execute_a_run(journal):
    charges: list = []
    release = asyncio.Event

    async def main() -> list:
        gate = release()

        @eg.tool(registry=eg.ToolRegistry())
        async def charge(amount: int) -> str:
            charges.append(eg.idempotency_key())
            await gate.wait()
            return "charged"

        async def agent(task: str) -> str:
            return await charge(1)

        _started(journal, "co")
        first = asyncio.ensure_future(eg.run_async(agent, "t", run_id="co", journal=journal))
        while not charges:
            await asyncio.sleep(0.005)
        second = asyncio.ensure_future(eg.run_async(agent, "t", run_id="co", journal=journal))
        await asyncio.sleep(0.05)
        gate.set()
        return await asyncio.gather(first, second, return_exceptions=True)

    a, b = asyncio.run(main())
    assert a.status == "ok" and isinstance(b, eg.LeaseHeldError)
    assert charges == ["co:0"]


def test_the_run_is_free_again_once_its_executor_ends_even_by_an_exception(journal):
    class Crash(BaseException):  # not an Exception, so the run is left resumable rather than failed
        pass

    def crashing(task):
        raise Crash()

    _started(journal, "c")
    with pytest.raises(Crash):
        eg.run(crashing, "t", run_id="c", journal=journal)
    assert eg.run(lambda task: "again", "t", run_id="c", journal=journal).output == "again"


def test_a_refused_take_leaves_no_claim_behind(journal):
    _started(journal, "h")
    assert journal.acquire_lease("h", "otherhost:1:x", ttl=60)
    with pytest.raises(eg.LeaseHeldError, match="otherhost"):
        eg.run(lambda task: 1, "t", run_id="h", journal=journal)
    journal.release_lease("h", "otherhost:1:x")
    assert eg.run(lambda task: 2, "t", run_id="h", journal=journal).output == 2


def test_runs_of_the_same_id_in_other_stores_are_not_refused(journal, tmp_path):
    other = eg.open(f"sqlite:///{tmp_path / 'other.db'}")
    inner = []

    def outer(task):
        inner.append(eg.run(lambda task: "inner", "t", run_id="same", journal=other).output)
        return "outer"

    try:
        assert eg.run(outer, "t", run_id="same", journal=journal).output == "outer"
    finally:
        other.close()
    assert inner == ["inner"]


def _stop_renewing(lease: Lease) -> None:
    lease_mod._renewer.remove(lease)  # as if its process were stopped (SIGSTOP)


def _take_over_and_pause(journal, run_id: str, ttl: float) -> int:
    """What another process's executor does once the stopped one's lease lapsed: take it, then release it
    (the run paused at a question)."""
    deadline = time.monotonic() + 10
    while (epoch := journal.take_lease(run_id, "otherhost:2:b", 30)) is None:
        assert time.monotonic() < deadline
        time.sleep(ttl / 4)
    journal.release_lease(run_id, "otherhost:2:b")
    return epoch


def test_a_stopped_executor_does_not_take_back_a_lease_its_successor_released(journal):
    _started(journal, "z")
    with Lease(journal, "z", ttl=0.3) as stale:
        assert stale.epoch == 1
        _stop_renewing(stale)
        assert _take_over_and_pause(journal, "z", 0.3) == 2
        lease_mod._renewer.add(stale)  # continued: its renewal is due at once
        time.sleep(0.3)
        info = journal.get_run("z")
        assert info.lease_owner is None and info.lease_epoch == 2  # not taken back by the stale executor
        assert stale.lost and not stale.held
        assert journal.take_lease("z", "otherhost:3:c", 30) == 3  # the next executor is not kept waiting
        journal.release_lease("z", "otherhost:3:c")
        # Its stale append is refused, and the error names no holder it does not have (itself).
        with pytest.raises(eg.LeaseLostError, match="released") as err:
            journal.append("z", [NewEvent("step.completed", "", {"call_id": "0", "result": 1})],
                           journal.next_seq("z"), fence=stale.epoch)
        assert stale.owner not in str(err.value) and err.value.owner is None
    assert journal.get_run("z").lease_owner is None


def test_a_stopped_executor_does_not_keep_its_run_from_this_process(journal):
    # The same process's next executor of the run is not refused once the stale one is known fenced off.
    _started(journal, "y")
    with Lease(journal, "y", ttl=0.3) as stale:
        _stop_renewing(stale)
        _take_over_and_pause(journal, "y", 0.3)
        lease_mod._renewer.add(stale)
        time.sleep(0.3)  # its renewal found the lease lost
        assert eg.run(lambda task: "resumed", "t", run_id="y", journal=journal).output == "resumed"
    info = journal.get_run("y")
    assert info.status == "ok" and info.lease_owner is None


def test_a_lapsed_lease_nobody_took_is_renewed(journal):
    _started(journal, "l")
    with Lease(journal, "l", ttl=0.3) as lease:
        _stop_renewing(lease)
        time.sleep(0.4)  # lapsed, but no one took it: its appends are still valid
        lease_mod._renewer.add(lease)
        time.sleep(0.15)
        assert lease.held
        assert not journal.acquire_lease("l", "otherhost:1:x", ttl=30)
        assert journal.get_run("l").lease_epoch == 1
    assert journal.get_run("l").lease_owner is None


def test_an_executor_ending_does_not_release_a_lease_taken_again_by_its_process(journal):
    # A worker of this process claimed the run again (a new epoch, the same owner id) before the old
    # executor ended: the old one's release is of its own epoch only.
    _started(journal, "w")
    with Lease(journal, "w", ttl=30) as old:
        journal.release_lease("w", old.owner)
        (claimed,) = journal.claim_runs(old.owner, 30)
        assert claimed.run_id == "w" and claimed.lease_epoch == 2
    info = journal.get_run("w")
    assert info.lease_owner == old.owner and info.lease_epoch == 2
