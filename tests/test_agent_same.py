"""An agent's definition is checked by the durable run's own ``same=``, which says how to refuse.

* ``same=`` takes a :class:`Same`: the fields a resume must give again, the error a run recorded
  with other values raises (``AgentMismatchError`` for an agent), in the caller's words, and
  whether a run recorded without a field resumes. A plain dict keeps the old refusals.
* So a resumed ``eg.Agent`` run reads its ``run.started`` once, in the run's start, instead of
  once more in a check of its own before it.

Every test runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import pytest

import engrain as eg
from engrain import _events as ev
from engrain._durable.execution import Same, run_sync
from engrain._agent.scripted import say, tool_call
from engrain.testing import FunctionModel


class Crash(BaseException):
    """Not an Exception: like a kill, it leaves the run unfinished."""


def _echo(task: str) -> str:
    return task


def _run(journal, run_id: str, same, task: str = "t"):
    return run_sync(_echo, task, run_id, None, [], journal, "echo", None, same=same)


def _started_without(journal, run_id: str) -> None:
    """A run an engrain from before a field was recorded left unfinished."""
    journal.append(run_id, [eg.NewEvent(ev.RUN_STARTED, "", {"task": "t", "inputs": {}, "tags": [], "agent": "echo"})], 0)


# -- the mechanism ------------------------------------------------------------------------------


def test_same_raises_the_error_it_names_in_the_callers_words(journal):
    assert _run(journal, "s1", Same({"def": "a"})).status == "ok"
    with pytest.raises(eg.AgentMismatchError) as e:
        _run(journal, "s1", Same({"def": "b"}, eg.AgentMismatchError, reason="was started by another definition"))
    assert e.value.run_id == "s1" and str(e.value) == "run 's1' was started by another definition"
    with pytest.raises(eg.AgentMismatchError, match=r"run 's1' was started with def 'a', not 'b'"):
        _run(journal, "s1", Same({"def": "b"}, eg.AgentMismatchError))  # no reason given: the default wording
    assert _run(journal, "s1", Same({"def": "a"})).output == "t"


def test_a_plain_dict_refuses_as_before(journal):
    _started_without(journal, "s2")
    with pytest.raises(eg.EngrainError, match="run 's2' was started without a recorded def, so it cannot be resumed") as e:
        _run(journal, "s2", {"def": "a"})
    assert type(e.value) is eg.EngrainError
    assert _run(journal, "s3", {"def": "a"}).status == "ok"
    with pytest.raises(eg.EngrainError, match=r"run 's3' was started with def 'a', not 'b'") as e:
        _run(journal, "s3", {"def": "b"})
    assert type(e.value) is eg.EngrainError


def test_a_run_recorded_without_the_field_resumes_when_the_spec_allows_it(journal):
    _started_without(journal, "s4")
    with pytest.raises(eg.AgentMismatchError, match="without a recorded def"):
        _run(journal, "s4", Same({"def": "a"}, eg.AgentMismatchError))  # refused unless allowed
    res = _run(journal, "s4", Same({"def": "a"}, eg.AgentMismatchError, unrecorded="resume"))
    assert res.status == "ok" and res.output == "t"
    assert "def" not in journal.read("s4")[0].data  # nothing rewritten: the run stays as it was recorded


def test_whose_run_it_is_is_said_before_its_task(journal):
    assert _run(journal, "s5", Same({"def": "a"})).status == "ok"
    with pytest.raises(eg.AgentMismatchError):
        _run(journal, "s5", Same({"def": "b"}, eg.AgentMismatchError), task="another task")


# -- the agent ----------------------------------------------------------------------------------


def _payer(journal, crash: list[bool], instructions: str = "Pay bills.") -> eg.Agent:
    def pay(bill: str) -> str:
        """Pay a bill."""
        if crash[0]:
            raise Crash("killed before the payment")
        return f"paid {bill}"

    def respond(msgs, info):
        return say("done") if msgs[-1]["role"] == "tool" else tool_call("pay", bill="B1")

    return eg.Agent("payer", FunctionModel(respond), instructions, [pay], journal=journal)


def _counting_reads_from_the_start(journal, monkeypatch, run_id: str) -> list[str]:
    """Each read of ``run_id`` that includes its first event (``run.started``)."""
    seen: list[str] = []
    for name in ("read", "read_raw"):
        inner = getattr(journal, name)

        def spy(rid, after=-1, limit=None, _inner=inner, _name=name):
            if rid == run_id and after < 0:
                seen.append(_name)
            return _inner(rid, after, limit)

        monkeypatch.setattr(journal, name, spy)
    return seen


def test_a_resumed_agent_run_reads_its_run_started_once(journal, monkeypatch):
    crash = [True]
    with pytest.raises(Crash):
        _payer(journal, crash).run("pay B1", run_id="a1")
    crash[0] = False
    seen = _counting_reads_from_the_start(journal, monkeypatch, "a1")
    res = _payer(journal, crash).run("pay B1", run_id="a1")
    assert res.status == "ok" and res.output == "done"
    assert len(seen) == 1, seen


def test_a_resume_by_another_definition_reads_once_and_writes_nothing(journal, monkeypatch):
    crash = [True]
    with pytest.raises(Crash):
        _payer(journal, crash).run("pay B1", run_id="a2")
    before = [e.to_dict() for e in journal.read("a2")]
    seen = _counting_reads_from_the_start(journal, monkeypatch, "a2")
    with pytest.raises(eg.AgentMismatchError, match="was started by the agent 'payer' with another definition"):
        _payer(journal, [False], instructions="NEVER pay.").run("pay B1", run_id="a2")
    assert len(seen) == 1, seen
    monkeypatch.undo()
    assert [e.to_dict() for e in journal.read("a2")] == before
