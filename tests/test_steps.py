"""Step journaling per tool: completion-only by default, at-most-once with a durable start, retries."""

from __future__ import annotations

import time

import pytest

import engrain as eg
from engrain import NewEvent
from engrain._durable.steps import steps_of, steps_of_rows


def _started(journal, run_id, call_id, name, args, attempt=1):
    data = {"call_id": call_id, "type": "tool", "args": args, "attempt": attempt, "at_most_once": True}
    return NewEvent("step.started", name, data)


def test_default_step_journals_only_its_completion(journal):
    reg = eg.ToolRegistry()
    keys = []

    @eg.tool(registry=reg)
    def send(to: str) -> str:
        keys.append(eg.idempotency_key())
        return f"sent {to}"

    r = eg.run(lambda task: send("ada"), "mail", run_id="c1", journal=journal)
    assert r and r.output == "sent ada" and keys == ["c1:0"]
    events = journal.read("c1")
    assert [e.kind for e in events] == ["run.started", "step.completed", "run.completed"]
    d = events[1].data
    assert d["args"] == {"to": "ada"} and d["type"] == "tool" and d["result"] == "sent ada" and "attempt" not in d


def test_at_most_once_step_journals_a_durable_start(journal):
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg, at_most_once=True)
    def charge(amount: int) -> str:
        return f"charged {amount}"

    r = eg.run(lambda task: charge(5), "pay", run_id="p1", journal=journal)
    assert r.output == "charged 5"
    events = journal.read("p1")
    assert [e.kind for e in events] == ["run.started", "step.started", "step.completed", "run.completed"]
    assert events[1].data["at_most_once"] is True and events[1].data["args"] == {"amount": 5}
    assert "args" not in events[2].data  # the start already carries them


def _crashed_payment(journal, run_id):
    """A run whose process died inside an at-most-once step: a start and no outcome."""
    journal.append(
        run_id,
        [
            NewEvent("run.started", "", {"task": "pay", "inputs": {}, "tags": []}),
            _started(journal, run_id, 0, "charge", {"amount": 5}),
        ],
        0,
    )


@pytest.mark.parametrize("answer", ["result", "retry", "error"])
def test_started_at_most_once_step_asks_whether_it_happened(journal, answer):
    reg = eg.ToolRegistry()
    calls = []

    @eg.tool(registry=reg, at_most_once=True)
    def charge(amount: int) -> str:
        calls.append(eg.idempotency_key())
        return f"charged {amount}"

    def agent(task):
        return charge(5)

    _crashed_payment(journal, "p2")
    paused = eg.run(agent, "pay", run_id="p2", journal=journal)
    assert paused.status == "needs_input" and calls == []  # never run again blindly
    assert "did this step happen?" in paused.prompt["prompt"] and paused.prompt["step"] == "charge"
    assert journal.get_run("p2").status == "needs_input"
    # Asked again on a second resume without an answer: still not run, no second question.
    again = eg.run(agent, "pay", run_id="p2", journal=journal)
    assert again.status == "needs_input" and calls == []
    assert [e.kind for e in journal.read("p2")].count("input.requested") == 1

    with pytest.raises(eg.EngrainError, match="exactly one of"):
        eg.answer("p2", {"happened": "maybe"}, journal=journal)
    answers = {"result": {"result": "charged 5 (provider)"}, "retry": {"retry": True}, "error": {"error": "declined"}}
    eg.answer("p2", answers[answer], journal=journal)
    done = eg.run(agent, "pay", run_id="p2", journal=journal)
    kinds = [e.kind for e in journal.read("p2")]
    if answer == "result":
        assert done and done.output == "charged 5 (provider)" and calls == []
        assert kinds[-2:] == ["step.completed", "run.completed"]
        outcome = dict(journal.read("p2")[-2].data)
        assert isinstance(outcome.pop("resumed"), float)  # the first event of the resumed execution says so
        assert outcome == {"call_id": 0, "result": "charged 5 (provider)", "answered": True}
    elif answer == "retry":
        assert done and done.output == "charged 5" and calls == ["p2:0"]  # same idempotency key
        started = [e for e in journal.read("p2") if e.kind == "step.started"]
        assert [e.data["attempt"] for e in started] == [1, 2]
    else:
        assert done.status == "failed" and "declined" in done.error and calls == []
        assert "step.failed" in kinds
    # Finished: the recorded outcome comes back, nothing runs.
    assert eg.run(agent, "pay", run_id="p2", journal=journal).status == done.status and len(calls) <= 1


def test_started_default_step_runs_again_with_the_same_key(journal):
    """A journal written by the earlier design (a start before every step) still resumes: the step runs again."""
    reg = eg.ToolRegistry()
    keys = []

    @eg.tool(registry=reg)
    def send(to: str) -> str:
        keys.append(eg.idempotency_key())
        return "ok"

    journal.append(
        "c2",
        [
            NewEvent("run.started", "", {"task": "mail", "inputs": {}, "tags": []}),
            NewEvent("step.started", "send", {"call_id": 0, "type": "tool", "args": {"to": "x"}, "attempt": 1}),
        ],
        0,
    )
    assert eg.run(lambda task: send("x"), "mail", run_id="c2", journal=journal)
    assert keys == ["c2:0"]


def test_retries_with_backoff_journal_each_attempt(journal):
    reg = eg.ToolRegistry()
    seen = []

    @eg.tool(registry=reg, retries=3, backoff=0.02, max_backoff=0.05, retry_on=(IOError,))
    def fetch(url: str) -> str:
        seen.append((eg.idempotency_key(), time.monotonic()))
        if len(seen) < 3:
            raise IOError(f"timeout {len(seen)}")
        return "page"

    r = eg.run(lambda task: fetch("u"), "get", run_id="r1", journal=journal)
    assert r and r.output == "page" and [k for k, _ in seen] == ["r1:0"] * 3
    gaps = [b - a for (_, a), (_, b) in zip(seen, seen[1:])]
    assert gaps[0] >= 0.01 and gaps[1] >= 0.02  # exponential: backoff*2**k, jitter in [half, full]
    assert all(g < 1.0 for g in gaps)
    events = [e for e in journal.read("r1") if e.kind.startswith("step.")]
    assert [(e.kind, e.data.get("attempt", 1)) for e in events] == [
        ("step.failed", 1), ("step.failed", 2), ("step.completed", 3)
    ]
    assert [e.data["message"] for e in events[:2]] == ["timeout 1", "timeout 2"]
    assert all(0.01 <= e.data["retry_in"] <= 0.05 for e in events[:2])
    # Replayed: recorded result, no call.
    assert eg.run(lambda task: fetch("u"), "get", run_id="r1", journal=journal).output == "page" and len(seen) == 3


def test_retries_exhausted_name_every_attempt(journal):
    reg = eg.ToolRegistry()
    n = []

    @eg.tool(registry=reg, retries=2, backoff=0.001, retry_on=IOError)
    def fetch() -> str:
        n.append(1)
        raise IOError(f"down {len(n)}")

    def agent(task):
        try:
            return fetch()
        except eg.RetriesExhaustedError as e:
            return e.attempts

    first = r = eg.run(agent, "get", run_id="r2", journal=journal)
    assert r.output == ["OSError: down 1", "OSError: down 2", "OSError: down 3"] and len(n) == 3
    last = journal.read("r2")[-2]
    assert last.kind == "step.failed" and last.data["error_type"] == "RetriesExhaustedError"
    assert "failed after 3 attempts" in last.data["message"] and "attempt 3: OSError: down 3" in last.data["message"]
    # Unhandled, it fails the run with the same message; a replay raises it again without calling.
    r = eg.run(lambda task: fetch(), "get", run_id="r3", journal=journal)
    assert r.status == "failed" and "failed after 3 attempts" in r.error
    # The same step replayed in an unfinished run: the error comes back with its attempts, no call.
    n.clear()
    recorded = [NewEvent(e.kind, e.name, e.data) for e in journal.read("r2")[:-1]]
    journal.append("r4", recorded, 0)
    replay = eg.run(agent, "get", run_id="r4", journal=journal)
    assert replay.output == first.output and n == [] and replay.replayed == 1


def test_error_outside_retry_on_fails_at_once(journal):
    reg = eg.ToolRegistry()
    n = []

    @eg.tool(registry=reg, retries=5, backoff=0.001, retry_on=(IOError,))
    def parse() -> str:
        n.append(1)
        raise ValueError("bad input")

    r = eg.run(lambda task: parse(), "p", run_id="r5", journal=journal)
    assert r.status == "failed" and "ValueError: bad input" in r.error and len(n) == 1


def test_resumed_retrying_step_continues_its_attempts(journal):
    """A run killed between two attempts resumes at the next attempt, after the journaled wait."""
    reg = eg.ToolRegistry()
    n = []

    @eg.tool(registry=reg, retries=2, backoff=0.001, retry_on=(IOError,))
    def fetch() -> str:
        n.append(1)
        raise IOError("still down")

    journal.append(
        "r6",
        [
            NewEvent("run.started", "", {"task": "get", "inputs": {}, "tags": []}),
            NewEvent("step.failed", "fetch", {"call_id": 0, "type": "tool", "args": {}, "error_type": "OSError",
                                              "error_module": "builtins", "message": "first", "retry_in": 0.05}),
        ],
        0,
    )
    t0 = time.time()
    r = eg.run(lambda task: fetch(), "get", run_id="r6", journal=journal)
    assert r.status == "failed" and len(n) == 2  # attempts 2 and 3 only
    assert "attempt 1: OSError: first" in r.error and "attempt 3: OSError: still down" in r.error
    assert time.time() - t0 < 5


def test_bad_retry_settings_are_typed_errors():
    with pytest.raises(eg.EngrainError, match="retries"):
        eg.tool(retries=-1)
    with pytest.raises(eg.EngrainError, match="backoff"):
        eg.tool(backoff="soon")
    with pytest.raises(eg.EngrainError, match="retry_on"):
        eg.tool(retry_on=("IOError",))


def test_raw_rows_fold_into_the_same_records_as_events(journal):
    """Resuming folds the journal's raw rows (completions decoded straight into records): the
    records equal those folded from events, whatever the mix, and a completion's other keys (a
    caller's meta named like a record field) set nothing."""
    t = {"type": "tool"}
    events = [
        NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": []}),
        NewEvent("step.completed", "a", {"call_id": 0, "result": [1, {"x": None}], **t, "args": {"n": 1}, "started": 1.0}),
        _started(journal, "r", 1, "pay", {"amount": 3}),
        NewEvent("step.completed", "pay", {"call_id": 1, "result": "ok", "attempt": 1}),
        NewEvent("step.failed", "b", {"call_id": 2, **t, "args": {}, "error_type": "E", "error_module": "m",
                                      "message": "no", "retry_in": 2.5}),
        NewEvent("step.completed", "b", {"call_id": 2, "result": 7, **t, "args": {}, "attempt": 2}),
        NewEvent("step.completed", "c", {"call_id": 3, "result": None, **t, "args": {}, "name": "evil", "state": "failed",
                                         "message": "m", "errors": ["x"], "at_most_once": True, "udf": {"source": "s"}}),
        NewEvent("log.entry", "", {"text": "ignored by the fold"}),
        NewEvent("input.requested", "engrain.ask", {"call_id": 4, "prompt": "why?", "fields": []}),
        NewEvent("input.received", "", {"call_id": 4, "answers": {"why": "because"}}),
        NewEvent("step.failed", "d", {"call_id": 5, **t, "args": {}, "error_type": "ValueError",
                                      "error_module": "builtins", "message": "bad"}),
    ]
    journal.append("r", events, 0)
    folded = steps_of_rows("r", journal.read_raw("r"))
    assert folded == steps_of(journal.read("r"))
    assert [(s.name, s.state, s.attempts) for s in folded.values()] == [
        ("a", "completed", 1), ("pay", "completed", 1), ("b", "completed", 2), ("c", "completed", 1),
        ("engrain.ask", "answered", 1), ("d", "failed", 1)]
    assert (folded[3].message, folded[3].errors, folded[3].at_most_once) == ("", None, False)
    assert folded[0].result == [1, {"x": None}] and folded[0].args == {"n": 1}


def test_a_completion_the_typed_decoder_refuses_folds_through_events(journal):
    """A huge integer, or args that are not an object, read exactly as the events read them."""
    journal.append("r", [
        NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": []}),
        NewEvent("step.completed", "a", {"call_id": 0, "result": 2**70, "type": "tool", "args": None}),
        NewEvent("step.completed", "b", {"call_id": 1, "result": 1, "type": "tool", "args": {}}),
    ], 0)
    folded = steps_of_rows("r", journal.read_raw("r"))
    assert folded == steps_of(journal.read("r"))
    assert folded[0].result == 2**70 and folded[0].args == {} and folded[1].name == "b"
