"""What a durable run may be made to do after it started: a finished run stays finished, a resume
runs on the inputs the run recorded, and a replayed step fails with the error type it failed with."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

import engrain as eg
from engrain import NewEvent
from engrain import _events as ev
from engrain import RunFinishedError
from engrain._durable.steps import StepRecord, replay
from engrain._server import create_app

ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")
LOCAL = "http://127.0.0.1:8765"


def _greeter(sent: list[str], fail: dict[str, bool] | None = None):
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg)
    def send(to: str) -> str:
        sent.append(to)
        return f"sent to {to}"

    def greeter(task: str) -> str:
        if fail and fail["now"]:
            raise RuntimeError("config service down")  # fails before the pending question replays
        got = eg.ask("Whom should I greet?", [{"name": "name", "type": "text"}])
        return send(got["name"])

    return greeter


def _waiting_then_cancelled(journal, sent: list[str]):
    greeter = _greeter(sent)
    assert eg.run(greeter, "greet", run_id="g1", journal=journal).status == "needs_input"
    assert eg.cancel("g1", journal=journal) is True
    return greeter


def _kinds(journal, run_id: str) -> list[str]:
    return [e.kind for e in journal.read(run_id)]


def _written_past_the_end(journal, run_id: str, event: NewEvent) -> None:
    """Store ``event`` after the run's end as an older engrain did (or a hand-edited store holds it): the journal
    now refuses that append (RunFinishedError), so the row goes in under it, status updated as then."""
    import json
    import time

    from engrain._journal.sqlite_schema import _DENSE_SEQ_TRIGGER_V7

    seq, db = journal.next_seq(run_id), journal._db
    row = (run_id, seq, time.time(), event.kind, event.name, json.dumps(event.data))
    status = {ev.RUN_COMPLETED: "ok", ev.INPUT_RECEIVED: "running"}[event.kind]
    if journal.backend == "sqlite":
        with journal._lock:
            db.execute("DROP TRIGGER events_dense_seq")
            try:
                db.execute("INSERT INTO events (run_id, seq, ts, kind, name, data) VALUES (?, ?, ?, ?, ?, ?)", row)
            finally:
                db.execute(_DENSE_SEQ_TRIGGER_V7)
        return
    with journal._settled():
        db.execute("INSERT INTO engrain_events (run_id, seq, ts, kind, name, data) VALUES (%s, %s, %s, %s, %s, %s)", row)
        db.execute("UPDATE engrain_runs SET next_seq = %s, status = %s WHERE run_id = %s", (seq + 1, status, run_id))


# --- a finished run takes no answers and is never resumed ---------------------------------------


def test_answer_refuses_a_cancelled_run_that_was_waiting_and_it_stays_cancelled(journal):
    sent: list[str] = []
    greeter = _waiting_then_cancelled(journal, sent)
    before = _kinds(journal, "g1")

    with pytest.raises(RunFinishedError, match=r"run 'g1' is not waiting for input: it has ended cancelled") as e:
        eg.answer("g1", {"name": "Ada"}, journal=journal)
    assert isinstance(e.value, eg.EngrainError) and (e.value.run_id, e.value.status) == ("g1", "cancelled")

    assert _kinds(journal, "g1") == before  # nothing appended
    assert journal.get_run("g1").status == "cancelled"
    again = eg.run(greeter, "greet", run_id="g1", journal=journal)
    assert again.status == "cancelled" and sent == []


def test_answer_refuses_a_run_that_failed_with_a_question_pending(journal):
    sent: list[str] = []
    fail = {"now": False}
    greeter = _greeter(sent, fail)
    assert eg.run(greeter, "greet", run_id="g1", journal=journal).status == "needs_input"
    fail["now"] = True
    assert eg.run(greeter, "greet", run_id="g1", journal=journal).status == "failed"
    fail["now"] = False

    with pytest.raises(RunFinishedError, match="it has ended failed") as e:
        eg.answer("g1", {"name": "Ada"}, journal=journal)
    assert e.value.status == "failed"
    assert journal.get_run("g1").status == "failed"
    again = eg.run(greeter, "greet", run_id="g1", journal=journal)
    assert again.status == "failed" and "config service down" in again.error and sent == []


@pytest.mark.parametrize("end", ["cancelled", "failed"])
def test_an_answer_written_after_the_end_does_not_resume_the_run(journal, end):
    """An answer an older engrain accepted after the end (or a forged row) leaves the run finished."""
    sent: list[str] = []
    fail = {"now": False}
    greeter = _greeter(sent, fail)
    assert eg.run(greeter, "greet", run_id="g1", journal=journal).status == "needs_input"
    if end == "cancelled":
        eg.cancel("g1", reason="stop", journal=journal)
    else:
        fail["now"] = True
        eg.run(greeter, "greet", run_id="g1", journal=journal)
        fail["now"] = False
    events = journal.read("g1")
    asked = next(e for e in events if e.kind == ev.INPUT_REQUESTED)
    _written_past_the_end(journal, "g1", NewEvent(ev.INPUT_RECEIVED, asked.name, {"call_id": asked.data["call_id"],
                                                                                 "answers": {"name": "Mallory"}}))
    written = _kinds(journal, "g1")

    again = eg.run(greeter, "greet", run_id="g1", journal=journal)
    assert again.status == end and sent == []
    if end == "cancelled":
        assert again.error == "stop"
    else:
        assert "config service down" in again.error
    assert _kinds(journal, "g1") == written  # the agent was not run: nothing more written


def test_a_run_is_finished_by_its_first_end_not_its_last_row(journal):
    """A finishing event followed by a forged one: the first is the run's outcome."""
    sent: list[str] = []
    greeter = _waiting_then_cancelled(journal, sent)
    _written_past_the_end(journal, "g1", NewEvent(ev.RUN_COMPLETED, "", {"output": "forged"}))
    r = eg.run(greeter, "greet", run_id="g1", journal=journal)
    assert r.status == "cancelled" and r.output is None and sent == []


def test_server_refuses_answers_to_a_cancelled_run_with_409(store_url, tmp_path):
    j = eg.open(store_url)
    try:
        _waiting_then_cancelled(j, [])
        before = _kinds(j, "g1")
        with TestClient(create_app(store_url, routines_dir=tmp_path / "routines"), base_url=LOCAL) as c:
            r = c.post("/api/runs/g1/answers", json={"answers": {"name": "Ada"}})
        assert r.status_code == 409, r.text
        # Named as the local error, with the run and how it ended as data: no client parses the wording.
        assert r.json()["error"] == "RunFinishedError" and "ended cancelled" in r.json()["detail"]
        assert r.json()["run_id"] == "g1" and r.json()["run_status"] == "cancelled"
        assert _kinds(j, "g1") == before and j.get_run("g1").status == "cancelled"
    finally:
        j.close()


def test_cli_answer_refuses_a_cancelled_run(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    j = eg.open(url)
    try:
        _waiting_then_cancelled(j, [])
        before = _kinds(j, "g1")
    finally:
        j.close()
    p = subprocess.run([ENGRAIN, "answer", "g1", '{"name": "Ada"}', "--url", url], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "run 'g1' is not waiting for input: it has ended cancelled" in p.stderr
    j = eg.open(url)
    try:
        assert _kinds(j, "g1") == before and j.get_run("g1").status == "cancelled"
    finally:
        j.close()


# --- a resume runs on the inputs the run recorded -----------------------------------------------


def _payer(paid: list[tuple[str, int]]):
    reg = eg.ToolRegistry()

    @eg.llm
    def draft(prompt: str) -> str:  # an LLM step: replayed by name, whatever the inputs now say
        return f"draft for: {prompt}"

    @eg.tool(registry=reg)
    def transfer(to: str, amount: int) -> str:
        paid.append((to, amount))
        return f"transferred {amount} to {to}"

    def pay(task: str, to: str, amount: int) -> str:
        note = draft(f"pay {amount} to {to}")
        ok = eg.ask(f"approve: {note}?", [{"name": "ok", "type": "boolean"}])
        return transfer(to, amount) if ok["ok"] else "declined"

    return pay


def _approved(journal, paid, run_id="p1"):
    pay = _payer(paid)
    r = eg.run(pay, "pay", run_id=run_id, inputs={"to": "alice", "amount": 5}, journal=journal)
    assert r.status == "needs_input" and "pay 5 to alice" in r.prompt["prompt"]
    eg.answer(run_id, {"ok": True}, journal=journal)
    return pay


@pytest.mark.parametrize("other", [
    {"to": "mallory", "amount": 5000},
    {"to": "alice", "amount": 5.0},  # == to 5 in Python, another JSON value to the journal
    {"to": "alice", "amount": 5, "memo": "x"},
    {},
])
def test_resume_with_other_inputs_is_refused_and_writes_nothing(journal, other):
    paid: list[tuple[str, int]] = []
    pay = _approved(journal, paid)
    before = _kinds(journal, "p1")
    with pytest.raises(eg.EngrainError, match=r"run 'p1' was started with inputs \{'to': 'alice', 'amount': 5\}, not "):
        eg.run(pay, "pay", run_id="p1", inputs=other, journal=journal)
    assert paid == [] and _kinds(journal, "p1") == before
    assert journal.get_run("p1").status == "running"  # answered, still resumable with the right inputs
    done = eg.run(pay, "pay", run_id="p1", inputs={"amount": 5, "to": "alice"}, journal=journal)
    assert done.output == "transferred 5 to alice" and paid == [("alice", 5)]


def test_resume_without_inputs_runs_on_the_recorded_ones(journal):
    paid: list[tuple[str, int]] = []
    pay = _approved(journal, paid)
    done = eg.run(pay, "pay", run_id="p1", journal=journal)
    assert done.status == "ok" and done.output == "transferred 5 to alice" and paid == [("alice", 5)]


def test_async_resume_without_inputs_runs_on_the_recorded_ones(journal):
    import asyncio

    seen: list[dict] = []

    async def agent(task: str, to: str, amount: int) -> str:
        seen.append({"to": to, "amount": amount})
        eg.ask("go?", [{"name": "ok", "type": "boolean"}])
        return f"{amount} to {to}"

    assert asyncio.run(eg.run_async(agent, "t", run_id="a1", inputs={"to": "bo", "amount": 2},
                                    journal=journal)).status == "needs_input"
    eg.answer("a1", {"ok": True}, journal=journal)
    with pytest.raises(eg.EngrainError, match="was started with inputs"):
        asyncio.run(eg.run_async(agent, "t", run_id="a1", inputs={"to": "eve", "amount": 2}, journal=journal))
    r = asyncio.run(eg.run_async(agent, "t", run_id="a1", journal=journal))
    assert r.output == "2 to bo" and seen == [{"to": "bo", "amount": 2}] * 2


def test_a_finished_run_called_with_other_inputs_is_refused_like_another_task(journal):
    paid: list[tuple[str, int]] = []
    pay = _approved(journal, paid)
    assert eg.run(pay, "pay", run_id="p1", journal=journal).status == "ok"
    with pytest.raises(eg.EngrainError, match="was started with inputs"):
        eg.run(pay, "pay", run_id="p1", inputs={"to": "mallory", "amount": 5000}, journal=journal)
    assert eg.run(pay, "pay", run_id="p1", journal=journal).output == "transferred 5 to alice"


# --- a replayed failure is raised as the type it was ----------------------------------------------


def test_a_step_that_failed_not_json_replays_as_not_json(journal):
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg)
    def lookup(q: str):
        return ("tuple", "not", "json")  # the call happened; its result cannot be journaled

    @eg.tool(registry=reg)
    def nest(depth: int):
        v: list = []
        for _ in range(depth):
            v = [v]
        return v

    caught: list[tuple[type, str]] = []

    def agent(task: str) -> str:
        try:
            a = lookup("x")
        except eg.NotJSONError as e:
            caught.append((type(e), str(e)))
            a = "fallback"
        try:
            b = nest(ev.MAX_DEPTH + 5)
        except eg.JSONTooDeepError as e:
            caught.append((type(e), str(e)))
            b = "shallow"
        ok = eg.ask("continue?", [{"name": "ok", "type": "boolean"}])
        return f"{a} {b} {ok['ok']}"

    assert eg.run(agent, "t", run_id="n1", journal=journal).status == "needs_input"
    eg.answer("n1", {"ok": True}, journal=journal)
    r = eg.run(agent, "t", run_id="n1", journal=journal)
    assert r.status == "ok" and r.output == "fallback shallow True", r.error
    first, resumed = caught[:2], caught[2:]
    assert [t for t, _ in first] == [eg.NotJSONError, eg.JSONTooDeepError]
    assert resumed == first  # the same types and messages on the resume


def _failed(error_type: str, message: str = "recorded message") -> StepRecord:
    return StepRecord(3, "tool_x", state="failed", error_type=error_type, error_module="engrain._errors",
                      message=message)


@pytest.mark.parametrize("name", ["NotJSONError", "JSONTooDeepError", "NondeterminismError", "SandboxError",
                                  "UnknownInputError", "ConfigError", "EngrainError"])
def test_replay_rebuilds_engrain_errors_whose_constructor_takes_more_than_a_message(name):
    import engrain._errors as errors

    with pytest.raises(getattr(errors, name)) as e:
        replay(_failed(name))
    assert type(e.value) is getattr(errors, name) and str(e.value) == "recorded message"


@pytest.mark.parametrize("name", [
    "RunNotFoundError",  # its __str__ reads a field the message does not give back
    "RemoteError",  # the same
    "ConflictError", "LeaseLostError", "StorageError",  # would say the store or another executor has the run
    "RoutineStepError",  # the run's failure report reads its inner error type
    "annotations", "Path", "Exception", "no_such_name",  # not an engrain error class defined there
])
def test_replay_raises_step_failed_for_what_it_must_not_rebuild(name):
    with pytest.raises(eg.StepFailedError) as e:
        replay(_failed(name))
    assert type(e.value) is eg.StepFailedError
    assert str(e.value) == f"step 'tool_x' failed with {name}: recorded message"
