"""A queued run is created with its queue row in one transaction (``Journal.append_queued``), on both backends.

``enqueue`` and the fork of a queued run used to create the run leased (one transaction) and then write its queue
row (a second). A crash or a storage error between the two left a run outside its queue: once the lease lapsed,
recovery executed it without the queue's concurrency and rate limits.
"""

from __future__ import annotations

import pytest

import engrain as eg
from engrain import ConflictError, EngrainError, NewEvent
from engrain._workers.store import QueueStore


def _started(queue: str = "q", agent: str = "agent") -> NewEvent:
    return NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": [], "queue": queue, "agent": agent})


def _queue_row(journal, run_id: str):
    qs = QueueStore(journal)
    return qs._tx(lambda q: q(f"SELECT queue, agent, priority FROM engrain_queue WHERE run_id = {qs.ph}",
                              (run_id,)).fetchone())


def _refuse_queue_rows(journal) -> None:
    """Make every insert into the queue table fail, as a full disk or a lost server would, at that statement."""
    db = journal._db
    if journal.backend == "sqlite":
        db.execute("CREATE TRIGGER test_refuse BEFORE INSERT ON engrain_queue BEGIN SELECT RAISE(ABORT, 'refused'); END")
        return
    db.execute("CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$")
    db.execute("CREATE TRIGGER test_refuse BEFORE INSERT ON engrain_queue FOR EACH ROW EXECUTE FUNCTION test_refuse()")


def test_append_queued_creates_a_queued_run_with_its_row(journal):
    journal.append_queued("a", [_started(), NewEvent("step.started", "tool", {"call_id": 0, "type": "tool"})],
                          "q", "agent", 5)
    info = journal.get_run("a")
    assert info.status == "queued" and info.lease_owner is None and info.next_seq == 2 and info.agent == "agent"
    assert tuple(_queue_row(journal, "a")) == ("q", "agent", 5)
    # Recovery leaves it to the workers; a worker of its queue takes it.
    assert journal.claim_runs("recoverer", 30.0, 10) == []
    (claimed,) = QueueStore(journal).claim("q", "worker", 30.0, 5)
    assert (claimed.run_id, claimed.agent) == ("a", "agent")


def test_append_queued_on_an_existing_run_writes_nothing(journal):
    journal.append_queued("a", [_started()], "q", "agent", 0)
    with pytest.raises(ConflictError):
        journal.append_queued("a", [_started("other", "intruder")], "other", "intruder", 9)
    assert tuple(_queue_row(journal, "a")) == ("q", "agent", 0)
    assert len(journal.read("a")) == 1 and journal.read("a")[0].data["agent"] == "agent"
    journal.append("plain", [NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": []})], 0)
    with pytest.raises(ConflictError):
        journal.append_queued("plain", [_started()], "q", "agent", 0)
    assert _queue_row(journal, "plain") is None


def test_append_queued_refuses_events_that_finish_the_run(journal):
    with pytest.raises(ValueError, match="finish"):
        journal.append_queued("f", [_started(), NewEvent("run.completed", "", {"output": 1})], "q", "agent", 0)
    assert journal.get_run("f") is None


def test_an_enqueue_whose_queue_row_fails_leaves_no_run(journal):
    _refuse_queue_rows(journal)
    with pytest.raises(Exception, match="refused"):
        eg.enqueue("agent", "t", queue="q", run_id="lost", journal=journal)
    # Before, the run stayed (running, leased for 60 s), then recovery executed it outside the queue.
    assert journal.get_run("lost") is None and journal.read("lost") == []


def test_a_queued_fork_whose_queue_row_fails_leaves_no_run(journal):
    src = eg.enqueue("agent", "t", queue="q", run_id="src", journal=journal)
    _refuse_queue_rows(journal)
    with pytest.raises(Exception, match="refused"):
        eg.fork(src, 0, run_id="forked", journal=journal)
    assert journal.get_run("forked") is None and journal.read("forked") == []


def test_a_queued_fork_is_queued_whole(journal):
    """Every copied event and the queue row land together, however many steps the source has."""
    src = eg.enqueue("agent", "t", queue="q", run_id="src", priority=3, journal=journal)
    n = 1500  # past the 1000 events a plain fork appends at a time
    events = []
    for i in range(n):
        events += [NewEvent("step.started", "tool", {"call_id": i, "type": "tool", "args": {}, "attempt": 1}),
                   NewEvent("step.completed", "tool", {"call_id": i, "result": i})]
    journal.append(src, events, 1)
    new = eg.fork(src, n, run_id="forked", journal=journal)
    info = journal.get_run(new)
    assert info.status == "queued" and info.next_seq == 1 + 2 * n
    assert tuple(_queue_row(journal, new)) == ("q", "agent", 3)


def test_fork_refuses_an_empty_run_id(journal):
    journal.append("src", [NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": []})], 0)
    with pytest.raises(EngrainError, match="run_id"):
        eg.fork("src", 0, run_id="", journal=journal)
    assert [r.run_id for r in journal.runs()] == ["src"]


def test_enqueue_refuses_an_empty_run_id(journal):
    with pytest.raises(EngrainError, match="run_id"):
        eg.enqueue("agent", "t", queue="q", run_id="", journal=journal)
    assert journal.runs() == []
