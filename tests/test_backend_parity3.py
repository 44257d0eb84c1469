"""The same journal calls give the same results and the same typed errors on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from engrain import RunNotFoundError
from engrain._events import NewEvent


def _start(journal, run_id: str = "r") -> None:
    journal.append(run_id, [NewEvent("run.started", "agent", {"task": "t"})], 0)


@pytest.mark.parametrize("name", ["a\x00b", "\ud800", 5, None])
def test_an_event_name_no_store_keeps_as_given_is_refused(journal, name):
    # PostgreSQL stored "a" for "a\x00b" (the driver cuts text at a NUL); SQLite kept it, and kept 5 as an int.
    _start(journal)
    with pytest.raises((ValueError, TypeError)):
        journal.append("r", [NewEvent("step.completed", name, {})], 1)
    with pytest.raises((ValueError, TypeError)):
        journal.append_one("r", "step.completed", name, {}, 1, json_checked=True)
    with pytest.raises((ValueError, TypeError)):
        journal.append("r", [NewEvent("step.completed", "ok", {}), NewEvent("step.completed", name, {})], 1)
    assert journal.next_seq("r") == 1


@pytest.mark.parametrize("data", [{"task": "t", "tags": ["x\x00"]}, {"task": "a\x00b", "tags": []}])
def test_a_run_started_with_a_nul_in_its_task_or_tags_is_refused(journal, data):
    # PostgreSQL's jsonb tags refused it with a raw driver error; SQLite stored it.
    with pytest.raises(ValueError, match="NUL"):
        journal.append("r", [NewEvent("run.started", "agent", data)], 0)
    with pytest.raises(ValueError, match="NUL"):
        journal.append_one("r", "run.started", "agent", data, 0)
    assert journal.get_run("r") is None


@pytest.mark.parametrize("seq", [2**31, 2**63])
def test_an_append_past_the_last_sequence_number_is_a_value_error(journal, seq):
    _start(journal)
    with pytest.raises(ValueError, match="expected_seq"):
        journal.append("r", [NewEvent("step.completed", "s", {})], seq)
    with pytest.raises(ValueError, match="expected_seq"):
        journal.append_one("r", "step.completed", "s", {}, seq)


def test_read_bounds_after_and_limit_to_the_runs_events(journal):
    _start(journal)
    journal.append("r", [NewEvent("step.completed", "s", {})], 1)
    assert [e.seq for e in journal.read("r", after=-(2**63) - 1)] == [0, 1]
    assert journal.read("r", after=2**63) == []
    assert [e.seq for e in journal.read("r", limit=2**63)] == [0, 1]
    assert [r[0] for r in journal.read_raw("r", after=0, limit=2**64)] == [1]


def test_runs_with_no_status_or_a_nul_filter_match_nothing(journal):
    _start(journal)
    assert journal.runs(status=[]) == []  # PostgreSQL: a syntax error ("IN ()")
    for kw in ({"task": "t\x00"}, {"tag": "x\x00"}, {"prefix": "r\x00"}):  # PostgreSQL: the driver's DataError
        assert journal.runs(**kw) == []
    assert [r.run_id for r in journal.runs(limit=2**63, offset=0)] == ["r"]


@pytest.mark.parametrize("kw", [{"limit": -1}, {"offset": -1}])
def test_runs_refuses_a_negative_limit_or_offset(journal, kw):
    # SQLite read limit=-1 as "no limit"; PostgreSQL raised its own error.
    _start(journal)
    with pytest.raises(ValueError, match="limit and offset"):
        journal.runs(**kw)


def test_lease_calls_on_a_run_id_with_a_nul_find_no_run(journal):
    # PostgreSQL raised the driver's DataError; SQLite found no run.
    with pytest.raises(RunNotFoundError):
        journal.take_lease("a\x00", "o", 10)
    assert journal.renew_lease("a\x00", "o", 10, 1) is False
    journal.release_lease("a\x00", "o")
    journal.delete_run("a\x00")


def test_a_lease_owner_with_a_nul_is_refused(journal):
    # PostgreSQL stored the owner cut at the NUL ("o"), SQLite as given.
    with pytest.raises(ValueError, match="owner"):
        journal.append("r", [NewEvent("run.started", "agent", {"task": "t"})], 0, lease=("o\x00x", 30))
    assert journal.get_run("r") is None
