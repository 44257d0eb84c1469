"""Lease epochs fence stale executors (issue 12 item 3), on SQLite and PostgreSQL.

A new executor that takes over a dead process's run must never see
``ConflictError`` from eg.run: the dead process's in-flight append either lands
before the takeover (and the new executor reads it) or is refused by the epoch
check in the same transaction as the append.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

import engrain as eg
from engrain._durable.lease import _HOST
from engrain._events import NewEvent


def _started() -> NewEvent:
    return NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": []})


def _step(n: int, name: str = "work") -> NewEvent:
    return NewEvent("step.started", name, {"call_id": n, "type": "tool", "args": {}, "attempt": 1})


def _dead_owner() -> str:
    """The lease owner id of a process of this host that has exited."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return f"{_HOST}:{p.pid}:gone"


def test_epoch_moves_only_when_the_lease_changes_hands(journal):
    journal.append("r", [_started()], 0, lease=("w1", 30))
    assert journal.get_run("r").lease_epoch == 1
    assert journal.take_lease("r", "w1", 30) == 1  # renewal keeps it
    assert journal.take_lease("r", "w2", 30) is None and journal.get_run("r").lease_epoch == 1
    journal.release_lease("r", "w1")
    assert journal.take_lease("r", "w2", 0.05) == 2
    import time

    time.sleep(0.1)
    assert journal.take_lease("r", "w3", 30) == 3  # an expired lease taken over
    journal.release_lease("r", "w3")
    (claimed,) = journal.claim_runs("w4", 30)
    assert claimed.run_id == "r" and claimed.lease_epoch == 4 == journal.get_run("r").lease_epoch
    with pytest.raises(eg.RunNotFoundError):
        journal.take_lease("nope", "w1", 30)


def test_append_one_creates_a_leased_run_as_append_does(journal):
    """``append_one(lease=...)`` (a durable run's start): the run is created held at epoch 1, its
    fenced steps land, and a lease with a seq other than 0 is refused before anything is written."""
    data = {"task": "t", "inputs": {}, "tags": []}
    journal.append_one("r", "run.started", "", data, 0, lease=("w1", 30), durable=False, json_checked=True)
    info = journal.get_run("r")
    assert (info.lease_owner, info.lease_epoch, info.status) == ("w1", 1, "running")
    assert journal.take_lease("r", "w2", 30) is None  # held
    journal.append_one("r", "step.completed", "work", {"call_id": 0, "result": 1}, 1, fence=1, json_checked=True)
    with pytest.raises(ValueError, match="expected_seq=0"):
        journal.append_one("r", "step.completed", "work", {"call_id": 1, "result": 1}, 2, lease=("w1", 30))
    journal.append_one("r", "run.completed", "", {"output": 1}, 2, fence=1)
    info = journal.get_run("r")
    assert (info.lease_owner, info.status, info.next_seq) == (None, "ok", 3)


def test_a_stale_holders_append_is_refused_and_writes_nothing(journal):
    journal.append("r", [_started()], 0, lease=("w1", 0.05))
    journal.append("r", [_step(0)], 1, fence=1)
    import time

    time.sleep(0.1)
    assert journal.take_lease("r", "w2", 30) == 2
    with pytest.raises(eg.LeaseLostError, match="epoch 1") as err:
        journal.append("r", [NewEvent("step.completed", "work", {"call_id": 0, "result": 1})], 2, fence=1)
    assert isinstance(err.value, eg.LeaseHeldError) and err.value.owner == "w2"
    with pytest.raises(eg.LeaseLostError):  # a batch too, and one that would finish the run
        journal.append("r", [_step(1), NewEvent("run.completed", "", {"output": 1})], 2, fence=1)
    assert journal.get_run("r").next_seq == 2 and journal.get_run("r").status == "running"
    journal.append("r", [NewEvent("step.completed", "work", {"call_id": 0, "result": 2})], 2, fence=2)
    journal.append("r", [_step(1), _step(2)], 3, fence=2)
    assert [e.seq for e in journal.read("r")] == [0, 1, 2, 3, 4]
    # A wrong seq under the right epoch is still a plain conflict.
    with pytest.raises(eg.ConflictError):
        journal.append("r", [_step(3)], 3, fence=2)
    # Unfenced appends (answers from the API, batched runs) are not affected.
    journal.append("r", [_step(3)], 5)


def test_sqlite_fence_refuses_a_run_with_no_row_and_passes_the_holders_steps(journal):
    # SQLite's fence trigger: a run with no runs row has no epoch, which is not the fence's, so
    # the append is refused (PostgreSQL creates that run: not asserted here).
    if journal.backend != "sqlite":
        pytest.skip("the fence trigger is SQLite's")
    with pytest.raises(eg.LeaseLostError):
        journal.append("ghost", [_started()], 0, fence=1)
    assert journal.get_run("ghost") is None
    journal.append("held", [_started()], 0, lease=("w1", 30))
    for seq in range(1, 4):  # the holder's fenced appends land, one by one
        journal.append_one("held", "step.started", "work", {"call_id": seq - 1, "type": "tool", "args": {}}, seq, fence=1)
    assert journal.get_run("held").next_seq == 4


def test_a_fence_is_per_run_and_forgotten_with_the_run(journal):
    """The fence a writer last used for a run never blocks another run, nor the same id made again."""
    import time

    journal.append("a", [_started()], 0, lease=("w1", 0.05))
    journal.append("b", [_started()], 0, lease=("w1", 30))
    journal.append("a", [_step(0)], 1, fence=1)
    journal.append("b", [_step(0)], 1)  # unfenced, while "a" is fenced on this same connection
    time.sleep(0.1)
    assert journal.take_lease("a", "w2", 30) == 2
    with pytest.raises(eg.LeaseLostError):
        journal.append("a", [_step(1)], 2, fence=1)
    with pytest.raises(eg.LeaseLostError):  # a batch past one multi-row INSERT: its own transaction
        journal.append("a", [_step(i) for i in range(1, 101)], 2, fence=1)
    assert journal.get_run("a").next_seq == 2
    journal.delete_run("a")
    journal.append("a", [_started()], 0, lease=("w3", 30))  # the id again: a new run with a new epoch
    journal.append("a", [_step(0)], 1, fence=journal.get_run("a").lease_epoch)
    journal.append("a", [_step(1)], 2)
    assert [e.seq for e in journal.read("a")] == [0, 1, 2]


def test_a_new_runs_first_fenced_step_is_refused_once_the_lease_moved(journal):
    """A run created leased is fenced at epoch 1 from its creating append on (SQLite sets the fence in that
    transaction), so the first step its stale executor appends is refused; an unfenced one still lands."""
    import time

    journal.append("r", [_started()], 0, lease=("w1", 0.05))
    time.sleep(0.1)
    assert journal.take_lease("r", "w2", 30) == 2
    with pytest.raises(eg.LeaseLostError):
        journal.append_one("r", "step.completed", "work", {"call_id": 0, "result": 1}, 1, fence=1, json_checked=True)
    assert journal.get_run("r").next_seq == 1
    journal.append_one("r", "step.completed", "work", {"call_id": 0, "result": 2}, 1, fence=2, json_checked=True)
    journal.append_one("r", "step.completed", "work", {"call_id": 1, "result": 3}, 2)  # unfenced
    assert [e.seq for e in journal.read("r")] == [0, 1, 2]


def test_resume_reads_a_dead_executors_late_append(journal):
    """The dead process's last insert commits after the new executor's first read (issue 12 item 3)."""
    dead = _dead_owner()
    journal.append("r", [_started()], 0, lease=(dead, 60))
    journal.append("r", [_step(0)], 1, fence=1, durable=False)
    late = NewEvent("step.completed", "work", {"call_id": 0, "result": 41})
    real_take, landed = journal.take_lease, []

    def take_after_late_commit(run_id: str, owner: str, ttl: float):
        if not landed:  # the killed client's statement finishes on the server just now
            landed.append(journal.append("r", [late], 2, fence=1))
        return real_take(run_id, owner, ttl)

    journal.take_lease = take_after_late_commit
    calls: list[int] = []

    @eg.tool(registry=eg.ToolRegistry())
    def work() -> int:
        calls.append(1)
        return 41

    res = eg.run(lambda task: work() + 1, "t", run_id="r", journal=journal)
    assert landed and res.status == "ok" and res.output == 42
    assert calls == []  # the late completion is replayed, not executed again
    kinds = [e.kind for e in journal.read("r")]
    assert kinds == ["run.started", "step.started", "step.completed", "run.completed"]


def test_a_dead_executors_append_after_the_takeover_is_fenced(journal):
    """The other order: the takeover commits first, then the stale statement runs and must write nothing."""
    dead = _dead_owner()
    journal.append("r", [_started()], 0, lease=(dead, 60))
    journal.append("r", [_step(0)], 1, fence=1)
    real_append, real_append_one, stale = journal.append, journal.append_one, []

    def append_racing_a_stale_writer(run_id, kind, name, data, expected_seq, **kw):
        # a run's steps are appended one event at a time (Journal.append_one)
        if not stale and expected_seq == 2:
            try:  # the dead process's statement reaches the server after the takeover
                real_append("r", [NewEvent("step.completed", "work", {"call_id": 0, "result": 0})], 2, fence=1)
            except eg.LeaseLostError as e:
                stale.append(e)
        return real_append_one(run_id, kind, name, data, expected_seq, **kw)

    journal.append_one = append_racing_a_stale_writer

    @eg.tool(registry=eg.ToolRegistry())
    def work() -> int:
        return 41

    res = eg.run(lambda task: work() + 1, "t", run_id="r", journal=journal)
    assert stale and res.status == "ok" and res.output == 42
    results = [e.data.get("result") for e in journal.read("r") if e.kind == "step.completed"]
    assert results == [41]


def test_concurrent_stale_append_and_takeover_stay_consistent(store_url):
    """Real concurrency: many stale appends race a takeover; each either lands before it or is refused."""
    j = eg.open(store_url)
    outcomes = {"landed": 0, "fenced": 0}
    for k in range(30):
        rid = f"race{k}"
        j.append(rid, [_started()], 0, lease=("old", 0.001))
        stale_j, new_j = eg.open(store_url), eg.open(store_url)
        go = threading.Barrier(2)
        result: list = []

        def stale() -> None:
            go.wait()
            try:
                stale_j.append(rid, [_step(0, "old")], 1, fence=1)
                result.append("landed")
            except eg.LeaseLostError:
                result.append("fenced")

        t = threading.Thread(target=stale)
        t.start()
        go.wait()
        epoch = None
        while epoch is None:
            epoch = new_j.take_lease(rid, "new", 30)
        t.join()
        seq = len(new_j.read(rid))  # read after the takeover: the new executor's view
        new_j.append(rid, [_step(seq - 1, "new")], seq, fence=epoch)  # never a conflict
        outcomes[result[0]] += 1
        assert (seq == 2) == (result[0] == "landed")
        stale_j.close()
        new_j.close()
    assert sum(outcomes.values()) == 30
    j.close()
