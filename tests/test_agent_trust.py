"""What an ``eg.Agent`` run and chat session may be trusted with, across crashes, deletions and races.

- A run (or chat turn) is resumed only by an agent of the definition it was started with
  (model, instructions, tools): its recorded model replies were chosen under that one.
- An ``@eg.tool``'s ``at_most_once`` and ``retries`` hold when the agent calls it, as in a
  plain durable run.
- A session whose turn was deleted (``eg.gc``) keeps its later turns, in turn order, and
  numbers its next turn after the highest.
- Two messages sent to one session at once both land, one turn after the other, in one
  process or from two.

Every test runs on SQLite and on PostgreSQL, with in-process test models.
"""

from __future__ import annotations

import contextlib
import copy
import json
import subprocess
import sys
import threading
import time

import pytest

import engrain as eg
from engrain._agent import sessions
from engrain._agent.scripted import say, tool_call
from engrain.testing import FunctionModel


class Crash(BaseException):
    """Not an Exception: like a kill, it leaves the run unfinished."""


@pytest.fixture(autouse=True)
def _new_process():
    """Each test starts with no session read, as a new process does."""
    sessions._finished.clear()
    yield
    sessions._finished.clear()


def _payer(journal, crash: list[bool], effects: list[tuple], **changes):
    """A payer agent whose ``pay`` tool crashes (before paying) while ``crash[0]``; ``changes`` alter its definition."""

    def pay(bill: str, amount: float) -> str:
        """Pay a bill."""
        if crash[0]:
            raise Crash("killed before the payment")
        effects.append(("pay", bill, amount))
        return f"paid {bill}"

    def refuse(bill: str) -> str:
        """Refuse to pay a bill."""
        effects.append(("refuse", bill))
        return "refused"

    def lookup(bill: str) -> str:
        """Look a bill up."""
        return "due"

    def respond(msgs, info):
        if msgs[-1]["role"] == "tool":
            return say("done")
        return tool_call("pay", bill="B1", amount=10.0) if "pay" in msgs[-1]["content"] else say("hi")

    model = FunctionModel(respond)
    kw = {"model": model, "instructions": "Pay bills.", "tools": [pay, lookup]}
    kw.update(changes.get("f", lambda pay, refuse, lookup: {})(pay, refuse, lookup))
    return eg.Agent("payer", kw["model"], kw["instructions"], kw["tools"], journal=journal)


# -- 1. a resume by another definition of the agent is refused ------------------------------------


@pytest.mark.parametrize("change", [
    {"f": lambda pay, refuse, lookup: {"instructions": "NEVER pay anything; call refuse."}},
    {"f": lambda pay, refuse, lookup: {"model": FunctionModel([say("x")], model_name="other-model")}},
    {"f": lambda pay, refuse, lookup: {"tools": [pay, lookup, refuse]}},
], ids=["instructions", "model", "tools"])
def test_a_run_is_not_resumed_by_another_definition_of_the_agent(journal, change):
    crash, effects = [True], []
    with pytest.raises(Crash):
        _payer(journal, crash, effects).run("pay B1", run_id="r1")
    crash[0] = False
    before = [e.to_dict() for e in journal.read("r1")]
    with pytest.raises(eg.AgentMismatchError, match="another definition") as e:
        _payer(journal, crash, effects, **change).run("pay B1", run_id="r1")
    assert e.value.run_id == "r1"
    assert effects == [] and [e.to_dict() for e in journal.read("r1")] == before  # nothing ran, nothing written
    # The agent it was started with resumes it: the recorded reply is replayed and pays once.
    res = _payer(journal, crash, effects).run("pay B1", run_id="r1")
    assert res.status == "ok" and res.output == "done" and effects == [("pay", "B1", 10.0)]


def test_the_same_definition_resumes_whatever_order_its_tools_are_given_in(journal):
    crash, effects = [True], []
    first = _payer(journal, crash, effects)
    with pytest.raises(Crash):
        first.run("pay B1", run_id="r2")
    crash[0] = False
    again = _payer(journal, crash, effects, f=lambda pay, refuse, lookup: {"tools": [lookup, pay]})
    assert again.definition() == first.definition()
    res = again.run("pay B1", run_id="r2")
    assert res.status == "ok" and res.replayed >= 1 and effects == [("pay", "B1", 10.0)]
    assert journal.read("r2")[0].data["agent_def"] == first.definition()


def test_a_run_recorded_without_a_definition_is_resumed(journal, monkeypatch):
    """A run an engrain from before definitions were recorded left unfinished: nothing to compare, so it resumes."""
    crash, effects = [True], []
    with monkeypatch.context() as m:
        m.setattr(eg.Agent, "_opening", lambda self, j, run_id, task=None: None)
        with pytest.raises(Crash):
            _payer(journal, crash, effects).run("pay B1", run_id="r3")
    assert "agent_def" not in journal.read("r3")[0].data
    crash[0] = False
    res = _payer(journal, crash, effects).run("pay B1", run_id="r3")
    assert res.status == "ok" and effects == [("pay", "B1", 10.0)]


def test_an_unfinished_chat_turn_is_not_finished_by_another_definition(journal):
    crash, effects = [True], []
    events = list(_payer(journal, crash, effects).chat("pay B1", session="s"))
    assert events[-1]["status"] == "running"  # the turn never finished
    crash[0] = False
    other = _payer(journal, crash, effects, f=lambda pay, refuse, lookup: {"instructions": "NEVER pay anything."})
    events = list(other.chat("hello", session="s"))
    assert events[-1]["status"] == "failed"
    assert any(x["type"] == "error" and "AgentMismatchError" in x["error"] for x in events), events
    assert effects == [] and journal.get_run(sessions.turn_id("payer", "s", 1)) is None
    # Cancelled, the turn is left behind: the session goes on under the new definition.
    assert eg.cancel(sessions.turn_id("payer", "s", 0), journal=journal)
    events = list(other.chat("hello", session="s"))
    assert events[-1]["status"] == "ok" and events[-1]["turn"] == 1 and effects == []


# -- 2. an @eg.tool's step policy holds under the agent -------------------------------------------


def test_an_at_most_once_tool_is_not_called_again_after_a_crash(journal):
    reg = eg.ToolRegistry()
    wires, crash = [], [True]

    @eg.tool(at_most_once=True, registry=reg)
    def wire_money(to: str, amount: int) -> str:
        """Send a wire transfer (not idempotent)."""
        wires.append((to, amount))  # the effect happens...
        if crash[0]:
            raise Crash("killed before the result was journaled")
        return "sent"

    model = FunctionModel(lambda msgs, info: say(f"result: {msgs[-1]['content']}") if msgs[-1]["role"] == "tool"
                          else tool_call("wire_money", to="bob", amount=100))
    agent = eg.Agent("banker", model, "Wire money.", [wire_money], journal=journal)
    with pytest.raises(Crash):
        agent.run("wire 100 to bob", run_id="w1")
    crash[0] = False
    res = agent.run("wire 100 to bob", run_id="w1")
    assert res.status == "needs_input" and res.prompt["at_most_once"] and res.prompt["step"] == "wire_money"
    assert wires == [("bob", 100)]  # asked, never called blind
    eg.answer("w1", {"result": "sent (confirmed by the bank)"}, journal=journal)
    res = agent.run("wire 100 to bob", run_id="w1")
    assert res.status == "ok" and res.output == "result: sent (confirmed by the bank)"
    assert wires == [("bob", 100)]


def test_a_chat_turn_asking_about_an_at_most_once_call_holds_the_session_until_answered(journal):
    reg = eg.ToolRegistry()
    wires, crash = [], [True]

    @eg.tool(at_most_once=True, registry=reg)
    def wire_money(to: str, amount: int) -> str:
        """Send a wire transfer (not idempotent)."""
        wires.append((to, amount))
        if crash[0]:
            raise Crash("killed before the result was journaled")
        return "sent"

    def respond(msgs, info):
        if msgs[-1]["role"] == "tool":
            return say(f"result: {msgs[-1]['content']}")
        return tool_call("wire_money", to="bob", amount=100) if "wire" in msgs[-1]["content"] else say("hi")

    agent = eg.Agent("banker", FunctionModel(respond), "Wire money.", [wire_money], journal=journal)
    assert list(agent.chat("wire 100 to bob", session="s"))[-1]["status"] == "running"
    crash[0] = False
    events = list(agent.chat("hello", session="s"))
    assert events[-1]["status"] == "failed" and any("waits for an answer" in x.get("error", "") for x in events)
    assert wires == [("bob", 100)] and journal.get_run(sessions.turn_id("banker", "s", 1)) is None
    eg.answer(sessions.turn_id("banker", "s", 0), {"result": "sent"}, journal=journal)
    done = list(agent.chat("hello", session="s"))[-1]
    assert done["status"] == "ok" and done["turn"] == 1 and wires == [("bob", 100)]
    assert [m["content"] for m in agent.history("s") if m["role"] == "assistant"][-2:] == ["result: sent", "hi"]


def test_a_tools_retries_apply_to_the_agents_calls(journal):
    reg = eg.ToolRegistry()
    calls: list[str] = []

    @eg.tool(retries=2, backoff=0, registry=reg)
    def flaky(q: str) -> str:
        """Answers on the third try."""
        calls.append(q)
        if len(calls) < 3:
            raise ConnectionError(f"try {len(calls)} failed")
        return "answer"

    @eg.tool(retries=1, backoff=0, registry=reg)
    def broken(q: str) -> str:
        """Never answers."""
        raise ConnectionError("down")

    seen: list[str] = []

    def respond(msgs, info):
        if msgs[-1]["role"] != "tool":
            return tool_call("flaky", q="x") if msgs[-1]["content"] == "flaky" else tool_call("broken", q="x")
        seen.append(msgs[-1]["content"])
        return say("ok")

    agent = eg.Agent("retrier", FunctionModel(respond), "", [flaky, broken], journal=journal)
    assert agent.run("flaky", run_id="f1").status == "ok"
    assert calls == ["x", "x", "x"] and seen == ["answer"]
    failed = [e for e in journal.read("f1") if e.kind == "step.failed"]
    assert [e.data.get("retry_in") is not None for e in failed] == [True, True]  # two failed attempts, then ok
    assert agent.run("broken", run_id="f2").status == "ok"
    assert seen[1].startswith("error: RetriesExhaustedError: failed after 2 attempts") and "down" in seen[1]
    # replayed as journaled: the same result for the model, no call
    res = agent.run("flaky", run_id="f1")
    assert res.status == "ok" and calls == ["x", "x", "x"]


# -- 7. a session with a deleted turn keeps its later turns -----------------------------------------


def _chatter(journal, seen: list | None = None) -> eg.Agent:
    def respond(msgs, info):
        last = msgs[-1]["content"]
        if seen is not None:
            seen.append([m["content"] for m in msgs if m["role"] == "user"])
        if "boom" in last:
            raise RuntimeError("model down")
        return say(f"answer to {last}")

    return eg.Agent("bot", FunctionModel(respond), "Chat.", [], journal=journal)


def _users(agent: eg.Agent, session: str) -> list[str]:
    return [m["content"] for m in agent.history(session) if m["role"] == "user"]


def test_a_deleted_turn_keeps_the_later_turns_in_number_order(journal):
    a = _chatter(journal)
    texts = ["m0", "boom", *[f"m{i}" for i in range(2, 12)]]  # 12 turns: "10" and "11" sort before "2" as text
    for i, text in enumerate(texts):
        done = list(a.chat(text, session="s1"))[-1]
        assert done["turn"] == i and done["status"] == ("failed" if text == "boom" else "ok")
    assert eg.gc(0, status="failed", journal=journal).runs == [sessions.turn_id("bot", "s1", 1)]
    sessions._finished.clear()  # a new process
    want = [t for t in texts if t != "boom"]
    assert _users(a, "s1") == want
    seen: list = []
    done = list(_chatter(journal, seen).chat("what do you know?", session="s1"))[-1]
    assert done["status"] == "ok" and done["turn"] == 12
    assert seen[-1] == [*want, "what do you know?"]  # the model saw every earlier turn
    sessions._finished.clear()
    assert _users(a, "s1") == [*want, "what do you know?"]


def test_a_session_whose_first_turns_were_deleted_goes_on_after_the_rest(journal):
    a = _chatter(journal)
    for text in ["m0", "m1", "m2", "m3"]:
        list(a.chat(text, session="s2"))
    for n in (0, 1):  # as engrain gc --older-than deletes a session's old turns
        journal.delete_run(sessions.turn_id("bot", "s2", n))
    sessions._finished.clear()
    assert _users(a, "s2") == ["m2", "m3"]
    assert list(a.chat("m4", session="s2"))[-1]["turn"] == 4


def test_a_gap_left_by_another_process_is_found_by_one_that_read_the_session_before(journal):
    a = _chatter(journal)
    list(a.chat("m0", session="s3"))
    assert _users(a, "s3") == ["m0"]
    known = copy.deepcopy(sessions._finished)  # what this process read: turn 0
    list(a.chat("boom", session="s3"))  # "another process": turns 1 (failed) and 2
    list(a.chat("m2", session="s3"))
    eg.gc(0, status="failed", journal=journal)
    sessions._finished.clear()
    sessions._finished.update(known)
    assert _users(a, "s3") == ["m0", "m2"]
    assert list(a.chat("m3", session="s3"))[-1]["turn"] == 3


# -- 8. two messages sent to one session at once both land ----------------------------------------


def _slow_echo(journal, pause: float = 0.3) -> eg.Agent:
    def echo(msgs, info):
        time.sleep(pause)
        return say("seen: " + " | ".join(m["content"] for m in msgs if m["role"] == "user"))

    return eg.Agent("chatty", FunctionModel(echo), "Chat.", [], journal=journal)


def _send_together(agent: eg.Agent, session: str, messages: list[str], stagger: float = 0.0) -> dict[str, list]:
    out: dict[str, list] = {}

    def talk(msg: str) -> None:
        out[msg] = list(agent.chat(msg, session=session))

    threads = []
    for msg in messages:
        threads.append(threading.Thread(target=talk, args=(msg,)))
        threads[-1].start()
        time.sleep(stagger)
    for t in threads:
        t.join(30)
    return out


def _check_both_landed(agent: eg.Agent, session: str, out: dict[str, list]) -> None:
    done = {msg: evs[-1] for msg, evs in out.items()}
    assert all(d["type"] == "done" and d["status"] == "ok" for d in done.values()), out
    assert sorted(d["turn"] for d in done.values()) == [0, 1]
    first, second = sorted(done, key=lambda m: done[m]["turn"])
    assert done[second]["text"] == f"seen: {first} | {second}"  # the later turn's history holds the earlier
    sessions._finished.clear()
    assert [m["content"] for m in agent.history(session)] == [
        first, f"seen: {first}", second, f"seen: {first} | {second}"]


@pytest.mark.parametrize("stagger", [0.0, 0.1], ids=["at-once", "while-the-first-runs"])
def test_two_messages_to_one_session_both_land(journal, stagger):
    a = _slow_echo(journal)
    _check_both_landed(a, "s", _send_together(a, "s", ["first", "second"], stagger))


def test_two_writers_that_do_not_share_a_lock_both_land(journal, monkeypatch):
    """As two processes: nothing holds the session for either, the turn each opens settles it."""
    monkeypatch.setattr(sessions, "serial", lambda *a, **k: contextlib.nullcontext(), raising=False)
    a = _slow_echo(journal)
    _check_both_landed(a, "s", _send_together(a, "s", ["first", "second"], 0.05))


CHILD = """
import json, sys, time
import engrain as eg
from engrain._agent.scripted import say
from engrain.testing import FunctionModel

def echo(msgs, info):
    time.sleep(0.5)
    return say("seen: " + " | ".join(m["content"] for m in msgs if m["role"] == "user"))

j = eg.open(sys.argv[1])
a = eg.Agent("chatty", FunctionModel(echo), "Chat.", [], journal=j)
print(json.dumps(list(a.chat(sys.argv[2], session="s"))[-1]), flush=True)
"""


def test_two_processes_sending_to_one_session_both_land(store_url, journal):
    children = [subprocess.Popen([sys.executable, "-c", CHILD, store_url, msg], stdout=subprocess.PIPE, text=True)
                for msg in ("first", "second")]
    out = {}
    for msg, child in zip(("first", "second"), children):
        stdout, _ = child.communicate(timeout=120)
        assert child.returncode == 0
        out[msg] = [json.loads(stdout.strip().splitlines()[-1])]
    _check_both_landed(_slow_echo(journal), "s", out)


def test_a_learned_routine_calls_the_agents_tools_with_their_policy(tmp_path, journal):
    """A learned routine runs the agent's tools under their own ``at_most_once``, as the agent does."""
    from engrain._agent.learn import _routine_tool
    from engrain._agent.toolspec import from_function

    wires, crash = [], [True]

    @eg.tool(at_most_once=True, registry=eg.ToolRegistry())
    def wire_money(to: str, amount: int) -> str:
        """Send a wire transfer (not idempotent)."""
        wires.append((to, amount))
        if crash[0]:
            raise Crash("killed before the result was journaled")
        return "sent"

    pkg = tmp_path / "wire"
    pkg.mkdir()
    (pkg / "routine.yaml").write_text(
        "name: wire\ninputs: {type: object, properties: {to: {type: string}}, required: [to]}\n"
        "tools: {wire_money: {}}\nsteps:\n"
        "  - {id: w, type: tool.call, tool: wire_money, args: {to: '{{ inputs.to }}', amount: 100}}\n"
        "  - {id: result, type: return, value: '{{ w }}'}\n")
    registry = {"wire_money": _routine_tool("wire_money", from_function(wire_money))}
    with pytest.raises(Crash):
        eg.run_routine(pkg, {"to": "bob"}, tools=registry, run_id="lr1", journal=journal)
    crash[0] = False
    res = eg.run_routine(pkg, {"to": "bob"}, tools=registry, run_id="lr1", journal=journal)
    assert res.status == "needs_input" and wires == [("bob", 100)]  # asked, never called blind
