"""An agent that learns routines from its runs: learn, confirm by two runs, offer as a tool, stop and hand back.

The model is the scripted model server (``engrain._agent.scripted``), reached
through the official ``openai`` SDK; the store is a real SQLite file (and a
real PostgreSQL schema where the test takes ``journal``); the learned routines
live in the memory's tables with real MiniLM embeddings.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sqlite3
import subprocess
import sys
import threading

import pytest
from fastapi.testclient import TestClient

import engrain as eg
from engrain._agent.scripted import ScriptedModel, say, tool_call
from engrain._journal import open_journal
from engrain._memory.learned import LearnedRoutines
from engrain._routines.agent_trace import AgentTrace, ToolCall
from engrain._routines.induce import induce
from engrain._routines.learned_check import check_learned

CHILD_LEARN = pathlib.Path(__file__).with_name("learn_child.py")
ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")
LOCAL = "http://127.0.0.1:8765"


class Bank:
    """An in-memory world: bill files and the payments made."""

    def __init__(self) -> None:
        self.files = {
            "bills/may.txt": {"amount": 120.5, "iban": "DE001", "status": "unpaid"},
            "bills/jun.txt": {"amount": 99.0, "iban": "DE002", "status": "unpaid"},
            "bills/jul.txt": {"amount": 75.25, "iban": "DE003", "status": "unpaid"},
            "bills/aug.txt": {"amount": 60.0, "iban": "DE004", "status": "paid"},
        }
        self.paid: list[tuple[str, float, str]] = []
        self.calls: list[tuple[str, dict]] = []

    def tools(self):
        def read_file(path: str) -> dict:
            """Read a bill file."""
            self.calls.append(("read_file", {"path": path}))
            return {"path": path, **self.files[path]}

        def pay(iban: str, amount: float, memo: str = "") -> str:
            """Pay an amount to an IBAN."""
            self.calls.append(("pay", {"iban": iban, "amount": amount, "memo": memo}))
            self.paid.append((iban, amount, memo))
            return f"paid {amount} to {iban}"

        def notify(text: str) -> str:
            """Tell the user something."""
            self.calls.append(("notify", {"text": text}))
            return "sent"

        return [read_file, pay, notify]


def _agent(model: ScriptedModel, journal, bank: Bank, learn=True, provider: str = "openai") -> eg.Agent:
    url = model.openai_url if provider == "openai" else model.url
    return eg.Agent("biller", f"{provider}:scripted", "Pay bills.", bank.tools(), base_url=url,
                    journal=journal, learn=learn)


def _pay_run(journal, bank: Bank, f: str, memo: str = "", provider: str = "openai") -> eg.Agent:
    d = bank.files[f]
    args = {"iban": d["iban"], "amount": d["amount"], **({"memo": memo} if memo else {})}
    with ScriptedModel([tool_call("read_file", path=f), tool_call("pay", **args), say("Paid.")]) as m:
        a = _agent(m, journal, bank, provider=provider)
        assert a.run(f"Pay the bill in {f}")
    return a


def _tool_names(body: dict) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools", [])]


def _bill_model(files: dict[str, tuple[str, float]], routine_answer: str):
    """A scripted model's respond(): pay the task's bill by hand, or with pay_bill once it is offered."""

    def respond(api: str, body: dict):
        msgs = body["messages"]
        task = next(m["content"] for m in msgs if m["role"] == "user").split()[-1]
        done = sum(m["role"] == "tool" for m in msgs)
        if "pay_bill" in _tool_names(body):
            return tool_call("pay_bill", path=task) if done == 0 else say(routine_answer)
        if done == 0:
            return tool_call("read_file", path=task)
        return tool_call("pay", iban=files[task][0], amount=files[task][1]) if done == 1 else say("Paid.")

    return respond


def test_two_runs_confirm_a_routine_that_is_offered_and_run_as_a_child(journal):
    bank = Bank()
    a = _pay_run(journal, bank, "bills/may.txt")
    assert a.last_learned.action == "created" and a.last_learned.status == "candidate"
    store = LearnedRoutines(journal.url)
    (r,) = store.list("biller")
    assert r.status == "candidate" and r.trusted is False and r.routine["trusted"] is False

    # A candidate seen once is never offered.
    with ScriptedModel([say("Nothing to do.")]) as m:
        assert _agent(m, journal, bank).run("Pay the bill in bills/jun.txt")
        assert _tool_names(m.requests[0][1]) == ["read_file", "pay", "notify"]

    a = _pay_run(journal, bank, "bills/jun.txt")
    assert a.last_learned.action == "updated" and a.last_learned.status == "confirmed"
    r = store.get("pay_bill", "biller")
    assert r.tasks == ["Pay the bill in bills/may.txt", "Pay the bill in bills/jun.txt"]
    assert r.inputs["properties"] == {"path": {"type": "string", "description": "a value from the task text"}}
    assert r.pattern == "Pay the bill in {path}"
    steps = {s["id"]: s for s in r.routine["steps"]}
    assert steps["step1"]["args"] == {"path": "{{ inputs.path }}"}
    assert steps["step2"]["args"] == {"iban": "{{ step1.iban }}", "amount": "{{ step1.amount }}"}
    assert steps["check1_1"] == {"id": "check1_1", "type": "assert", "expr": 'step1.status == "unpaid"',
                                 "message": 'step1.status is no longer "unpaid"'}

    seen: list[dict] = []

    def respond(api: str, body: dict):
        seen.append(body)
        if body["messages"][-1]["role"] == "tool":
            return say("Paid the July bill.")
        return tool_call("pay_bill", path="bills/jul.txt")

    bank.calls.clear()
    with ScriptedModel(respond) as m:
        a = _agent(m, journal, bank)
        res = a.run("Pay the bill in bills/jul.txt")
        assert res and m.calls == 2  # one call to pick the routine, one to answer: no call per tool
    offered = next(t["function"] for t in seen[0]["tools"] if t["function"]["name"] == "pay_bill")
    assert offered["parameters"]["properties"]["path"]["type"] == "string"
    assert "Task pattern: Pay the bill in {path}" in offered["description"]
    out = json.loads(seen[1]["messages"][-1]["content"])
    assert out["status"] == "ok" and out["results"][1] == {"tool": "pay", "result": "paid 75.25 to DE003"}
    assert bank.calls == [("read_file", {"path": "bills/jul.txt"}), ("pay", {"iban": "DE003", "amount": 75.25, "memo": ""})]
    child = journal.read(out["run_id"])
    assert child[0].data["tags"] == ["routine"] and child[-1].kind == "run.completed"
    assert [e.name for e in child if e.kind == "step.completed"] == ["read_file", "pay"]
    assert a.last_learned.action == "skipped" and "pay_bill" in a.last_learned.reason
    assert store.get("pay_bill").uses == 1


def test_an_assert_stops_the_routine_and_the_model_goes_on_by_hand(tmp_path):
    journal = open_journal(f"sqlite:///{tmp_path / 'e.db'}")
    bank = Bank()
    _pay_run(journal, bank, "bills/may.txt")
    _pay_run(journal, bank, "bills/jun.txt")
    handed: list[dict] = []

    def respond(api: str, body: dict):
        last = body["messages"][-1]
        if last["role"] == "user":
            return tool_call("pay_bill", path="bills/aug.txt")
        if last.get("name") == "pay_bill" or "stopped" in last["content"]:
            handed.append(json.loads(last["content"]))
            return tool_call("notify", text="The August bill is already paid.")
        return say("The August bill was already paid; nothing to pay.")

    bank.calls.clear()
    with ScriptedModel(respond) as m:
        res = _agent(m, journal, bank).run("Pay the bill in bills/aug.txt")
    assert res and res.output == "The August bill was already paid; nothing to pay."
    (stop,) = handed
    assert stop["status"] == "stopped" and stop["stopped_at"] == "check1_1"
    assert stop["reason"] == 'AssertionFailed: step1.status is no longer "unpaid"'
    assert stop["done"] == [{"tool": "read_file", "args": {"path": "bills/aug.txt"},
                             "result": {"path": "bills/aug.txt", "amount": 60.0, "iban": "DE004", "status": "paid"}}]
    # Nothing was paid: the routine stopped before acting on a world that differed.
    assert [c[0] for c in bank.calls] == ["read_file", "notify"]
    child = journal.read(stop["run_id"])
    assert child[-1].kind == "run.failed"
    r = LearnedRoutines(journal.url).get("pay_bill")
    assert (r.uses, r.stops) == (1, 1)


def test_same_task_twice_stays_a_candidate(tmp_path):
    journal = open_journal(f"sqlite:///{tmp_path / 'e.db'}")
    bank = Bank()
    _pay_run(journal, bank, "bills/may.txt")
    a = _pay_run(journal, bank, "bills/may.txt")
    assert a.last_learned.status == "candidate" and a.last_learned.runs == 2


def test_composed_values_make_a_step_not_compilable_and_say_why(tmp_path):
    journal = open_journal(f"sqlite:///{tmp_path / 'e.db'}")
    bank = Bank()
    _pay_run(journal, bank, "bills/may.txt", memo="May rent, checked twice")
    a = _pay_run(journal, bank, "bills/jun.txt", memo="June rent")
    rep = a.last_learned
    assert rep.status == "not_compilable"
    assert rep.problems == [{
        "step": "step2", "tool": "pay", "arg": "memo",
        "reason": 'the value differs between runs ("May rent, checked twice", "June rent") and is neither in the '
                  "task text nor in an earlier result: the model composed or computed it after seeing results"}]
    # Never offered; the CLI lists it with the reason.
    with ScriptedModel([say("ok")]) as m:
        _agent(m, journal, bank).run("Pay the bill in bills/jul.txt")
        assert "pay_bill" not in _tool_names(m.requests[0][1])
    r = _cli("routines", "--url", journal.url)
    assert r.returncode == 0, r.stderr
    assert "not_compilable" in r.stdout and "step2 (pay) argument memo: the value differs" in r.stdout
    # Not promotable until a human edits it.
    res = _cli("routines", "promote", "pay_bill", "--url", journal.url)
    assert res.returncode == 2 and "not compilable (step2): edit it before promoting it" in res.stderr


def test_first_turn_composition_is_a_caller_input():
    def trace(i: int, who: str, text: str) -> AgentTrace:
        return AgentTrace(f"r{i}", f"Tell {who} the meeting moved", [
            ToolCall("lookup", {"name": who}, {"email": f"{who.lower()}@x.org", "active": True}, 0),
            ToolCall("send", {"to": f"{who.lower()}@x.org", "text": text}, "ok", 1),
        ])

    # the text depends on nothing the model saw after turn 0, but send runs in turn 1: not compilable
    done = induce([trace(1, "Ann", "Hi Ann, moved to 3pm"), trace(2, "Bob", "Bob: new time 4pm")])
    assert done.status == "not_compilable" and done.problems[0].arg == "text"

    def trace0(i: int, who: str, text: str) -> AgentTrace:
        return AgentTrace(f"r{i}", f"Tell {who} the meeting moved", [
            ToolCall("post", {"channel": who, "text": text}, "ok", 0)])

    done = induce([trace0(1, "Ann", "Hi Ann, moved to 3pm"), trace0(2, "Bob", "Bob: new time 4pm")])
    assert done.status == "confirmed"
    assert done.routine["inputs"]["properties"]["text"]["description"] == "what you would pass as post's 'text' for this task"
    assert done.routine["steps"][0]["args"] == {"channel": "{{ inputs.channel }}", "text": "{{ inputs.text }}"}


def test_values_the_runs_never_varied_are_pinned_and_guarded():
    def trace(i: int, f: str, rows: list) -> AgentTrace:
        return AgentTrace(f"r{i}", f"Send {f} to Acme", [
            ToolCall("list", {"folder": "inbox"}, {"rows": rows, "owner": "Acme"}, 0),
            ToolCall("send", {"file": f, "to": "Acme", "first": rows[0]["id"]}, "ok", 1)])

    done = induce([trace(1, "a.pdf", [{"id": "X-100", "state": "new"}, {"id": "X-2"}]),
                   trace(2, "b.pdf", [{"id": "X-200", "state": "new"}, {"id": "X-3"}])])
    # rows[0] of two rows: the runs cannot tell why the model took it, so only a human confirms it
    assert done.status == "candidate" and [(d.step, d.arg) for d in done.doubts] == [("step2", "first")]
    props = done.routine["inputs"]["properties"]
    assert props["to"]["const"] == "Acme"  # in the task both times, never varied: only Acme is known to work
    assert "const" not in props["file"]
    exprs = [s["expr"] for s in done.routine["steps"] if s["type"] == "assert"]
    assert "step1.owner == inputs.to" in exprs  # the runs also found it in the result
    assert "len(step1.rows) == 2" in exprs and 'step1.rows[0].state == "new"' in exprs
    assert done.routine["steps"][-2]["args"] == {"file": "{{ inputs.file }}", "to": "{{ inputs.to }}",
                                                 "first": "{{ step1.rows[0].id }}"}
    assert done.pattern == "Send {file} to Acme"


def test_text_around_earlier_values_is_a_template():
    def trace(i: int, n: str, amount: float) -> AgentTrace:
        return AgentTrace(f"r{i}", f"Close invoice {n}", [
            ToolCall("get", {"id": n}, {"customer": f"Customer {n}", "amount": amount}, 0),
            ToolCall("mail", {"subject": f"Invoice {n} for Customer {n} closed", "amount": amount}, "ok", 1)])

    done = induce([trace(1, "INV-77", 10.5), trace(2, "INV-78", 12.0)])
    assert done.status == "confirmed"
    assert done.routine["steps"][-2]["args"] == {
        "subject": "Invoice {{ inputs.id }} for {{ step1.customer }} closed", "amount": "{{ step1.amount }}"}


def test_review_edit_promote_delete_through_the_api_and_the_cli(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    journal = open_journal(url)
    bank = Bank()
    _pay_run(journal, bank, "bills/may.txt")
    _pay_run(journal, bank, "bills/jun.txt")
    from engrain._server import create_app

    with TestClient(create_app(url, routines_dir=tmp_path / "routines"), base_url=LOCAL) as c:
        (item,) = c.get("/api/learned").json()
        assert item["name"] == "pay_bill" and item["status"] == "confirmed" and item["trusted"] is False
        full = c.get(f"/api/learned/{item['id']}").json()
        assert full["routine"]["steps"][0]["tool"] == "read_file" and len(full["evidence"]) == 2
        assert c.get("/api/learned/nope").status_code == 404

        bad = {**full["routine"], "steps": [{"id": "s", "type": "udf.call", "function": "f"}, *full["routine"]["steps"]]}
        r = c.put(f"/api/learned/{item['id']}", json={"routine": bad})
        assert r.status_code == 422 and "a learned routine holds only tool.call, assert, return" in r.json()["detail"]

        edited = {**full["routine"], "description": "Pay a bill file (reviewed)."}
        r = c.put(f"/api/learned/{item['id']}", json={"routine": edited})
        assert r.status_code == 200 and r.json()["edited"] is True and r.json()["description"] == "Pay a bill file (reviewed)."
        r = c.post(f"/api/learned/{item['id']}/promote", json={"trusted": True})
        assert r.json()["trusted"] is True

    show = _cli("routines", "show", "pay_bill", "--url", url, "--json")
    assert show.returncode == 0, show.stderr
    data = json.loads(show.stdout)
    assert data["trusted"] is True and data["routine"]["trusted"] is True and data["edited"] is True

    # An edited routine is not re-induced by the next run of its shape; the run is recorded.
    a = _pay_run(journal, bank, "bills/jul.txt")
    assert a.last_learned.action == "recorded" and "edited by a human" in a.last_learned.reason
    assert LearnedRoutines(url).get("pay_bill").description == "Pay a bill file (reviewed)."

    pub = eg.LearnedRoutines(url)
    with pytest.raises(eg.MemoryInputError, match="not allowed|starts with '_'"):
        pub.edit("pay_bill", "name: x\ninputs: {type: object}\nsteps:\n- {id: a, type: assert, expr: \"__import__('os')\"}\n")
    with pytest.raises(eg.MemoryInputError, match="invalid YAML"):
        pub.edit("pay_bill", "steps: [")
    r = _cli("routines", "promote", "pay_bill", "--undo", "--url", url, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["trusted"] is False
    r = _cli("routines", "delete", "pay_bill", "--url", url)
    assert r.returncode == 0 and "deleted pay_bill" in r.stdout
    r = _cli("routines", "show", "pay_bill", "--url", url)
    assert r.returncode == 2 and "no learned routine 'pay_bill'" in r.stderr
    assert _cli("routines", "--url", url, "--json").stdout.strip() == "[]"


def test_an_edit_cannot_add_code_or_break_the_package():
    base = induce([AgentTrace("r1", "Pay the bill in a.txt", [ToolCall("read_file", {"path": "a.txt"}, {"x": 1}, 0)]),
                   AgentTrace("r2", "Pay the bill in b.txt", [ToolCall("read_file", {"path": "b.txt"}, {"x": 1}, 0)])])
    assert check_learned(base.routine) == []
    prompt = {**base.routine, "steps": [{"id": "p", "type": "prompt.user", "prompt": "?", "fields": []},
                                        *base.routine["steps"]]}
    assert any("prompt.user" in p for p in check_learned(prompt))
    broken = {**base.routine, "steps": [{"id": "a", "type": "assert", "expr": "__import__('os')"}, *base.routine["steps"]]}
    assert any("not allowed" in p or "'_'" in p for p in check_learned(broken))


def test_a_failed_tool_call_is_dropped_and_internal_steps_are_ignored(tmp_path):
    journal = open_journal(f"sqlite:///{tmp_path / 'e.db'}")
    bank = Bank()
    d = bank.files["bills/may.txt"]
    with ScriptedModel([tool_call("read_file", path="bills/nope.txt"), tool_call("read_file", path="bills/may.txt"),
                        tool_call("pay", iban=d["iban"], amount=d["amount"]), say("Paid.")]) as m:
        a = eg.Agent("biller", "openai:scripted", "Pay bills.", bank.tools(), base_url=m.openai_url,
                     journal=journal, learn="bills", memory="bills")
        assert a.run("Pay the bill in bills/may.txt")
    r = LearnedRoutines(journal.url).get("pay_bill", "bills")
    assert [c["name"] for c in r.evidence[0]["calls"]] == ["read_file", "pay"]
    assert r.evidence[0]["dropped"] == 1 and r.skill == "bills"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([ENGRAIN, *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("bad", [0, "", 3.5])
def test_learn_must_be_a_flag_or_a_skill(bad):
    with pytest.raises(eg.ConfigError):
        eg.Agent("x", "openai:m", learn=bad)


def test_a_result_value_the_runs_never_varied_is_pinned_inside_text_and_asserted():
    # Two bills that were both "paid": the note must not read the status from a third bill.
    def trace(i: int, f: str) -> AgentTrace:
        return AgentTrace(f"r{i}", f"Pay the bill in {f}", [
            ToolCall("read_file", {"path": f}, {"path": f, "status": "paid"}, 0),
            ToolCall("notify", {"text": f"{f} is already paid"}, "sent", 1)])

    done = induce([trace(1, "bills/a.txt"), trace(2, "bills/b.txt")])
    assert done.status == "confirmed"
    assert done.routine["steps"][-2]["args"] == {"text": "{{ inputs.path }} is already paid"}
    assert [s["expr"] for s in done.routine["steps"] if s["type"] == "assert"] == ['step1.status == "paid"']
    assert 'Expects step1.status == "paid"' in done.routine["description"]


def test_flags_the_model_saw_are_asserted_even_when_no_argument_reads_them():
    def trace(i: int, name: str) -> AgentTrace:
        return AgentTrace(f"r{i}", f"Archive {name}", [
            ToolCall("stat_file", {"name": name}, {"folder": "projects", "locked": False, "size": 10 * i}, 0),
            ToolCall("copy_file", {"src": f"projects/{name}", "dst": f"archive/{name}"}, "copied", 1)])

    done = induce([trace(1, "a.pdf"), trace(2, "b.pdf")])
    exprs = [s["expr"] for s in done.routine["steps"] if s["type"] == "assert"]
    assert "step1.locked == False" in exprs and 'step1.folder == "projects"' in exprs
    assert done.routine["steps"][-2]["args"] == {"src": "projects/{{ inputs.name }}", "dst": "archive/{{ inputs.name }}"}


def test_a_stop_finished_by_hand_the_same_way_teaches_the_routine(tmp_path):
    journal = open_journal(f"sqlite:///{tmp_path / 'e.db'}")
    bank = Bank()
    for f in ("bills/may.txt", "bills/jun.txt"):
        bank.files[f]["bank"] = "Sparkasse"  # the same in both learned runs: asserted
    bank.files["bills/jul.txt"]["bank"] = "ING"
    _pay_run(journal, bank, "bills/may.txt")
    _pay_run(journal, bank, "bills/jun.txt")
    assert 'step1.bank == "Sparkasse"' in [s.get("expr") for s in LearnedRoutines(journal.url).get("pay_bill").routine["steps"]]
    d = bank.files["bills/jul.txt"]

    def respond(api: str, body: dict):
        last = body["messages"][-1]
        if last["role"] == "user":
            return tool_call("pay_bill", path="bills/jul.txt")
        if '"stopped"' in last["content"]:
            return tool_call("pay", iban=d["iban"], amount=d["amount"])
        return say("Paid.")

    with ScriptedModel(respond) as m:
        a = _agent(m, journal, bank)
        assert a.run("Pay the bill in bills/jul.txt")
    assert a.last_learned.action == "updated" and a.last_learned.runs == 3
    r = LearnedRoutines(journal.url).get("pay_bill")
    exprs = [s.get("expr") for s in r.routine["steps"] if s["type"] == "assert"]
    assert exprs == ['step1.status == "unpaid"']  # the bank assert was not needed: it dropped out
    assert r.evidence[-1]["calls"][0]["turn"] == 0 and r.evidence[-1]["calls"][1]["turn"] == 1


def test_a_routine_cut_by_a_crash_resumes_as_a_durable_child_run(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    effects = tmp_path / "effects.log"
    effects.touch()
    files = {"bills/may.txt": ("DE001", 120.5), "bills/jun.txt": ("DE002", 99.0)}
    respond = _bill_model(files, "Paid.")

    def child(task: str, run_id: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(CHILD_LEARN), url, model.openai_url, str(effects), task, run_id],
                              capture_output=True, text=True, timeout=120, check=False)

    with ScriptedModel(respond) as model:
        for f in files:
            r = child(f"Pay the bill in {f}", f"learn-{f[6:9]}")
            assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["learned"]["status"] == "confirmed"
        (tmp_path / "effects.log.crash").touch()
        effects.write_text("")
        r = child("Pay the bill in bills/jul.txt", "r-crash")
        assert r.returncode == -9  # SIGKILLed inside the routine's pay step
        assert effects.read_text().split() == ["read_file", "bills/jul.txt", "r-crash:3:routine:0"]
        calls = model.calls
        (tmp_path / "effects.log.crash").unlink()
        r = child("Pay the bill in bills/jul.txt", "r-crash")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["status"] == "ok" and out["output"] == "Paid."
        assert model.calls == calls + 1  # the model's choice of the routine was replayed; only the answer is new
    # read_file ran once (replayed from the child run's journal on resume); pay ran once, with a stable key
    assert effects.read_text().split() == ["read_file", "bills/jul.txt", "r-crash:3:routine:0",
                                           "pay", "DE003", "r-crash:3:routine:1"]
    j = open_journal(url)
    child_events = j.read("r-crash:3:routine")
    assert child_events[0].data["tags"] == ["routine"] and child_events[-1].kind == "run.completed"
    assert [e.name for e in child_events if e.kind == "step.completed"] == ["read_file", "pay"]


def test_the_routine_is_offered_through_anthropic_messages_too(tmp_path):
    journal = open_journal(f"sqlite:///{tmp_path / 'e.db'}")
    bank = Bank()
    _pay_run(journal, bank, "bills/may.txt", provider="anthropic")
    _pay_run(journal, bank, "bills/jun.txt", provider="anthropic")
    seen: list[dict] = []

    def respond(api: str, body: dict):
        assert api == "messages"
        seen.append(body)
        last = body["messages"][-1]["content"]
        if isinstance(last, list) and last and last[0].get("type") == "tool_result":
            return say("Paid.")
        return tool_call("pay_bill", path="bills/jul.txt")

    with ScriptedModel(respond) as m:
        assert _agent(m, journal, bank, provider="anthropic").run("Pay the bill in bills/jul.txt")
    tool = next(t for t in seen[0]["tools"] if t["name"] == "pay_bill")
    assert tool["input_schema"]["required"] == ["path"]
    result = json.loads(seen[1]["messages"][-1]["content"][0]["content"])
    assert result["status"] == "ok" and bank.paid[-1] == ("DE003", 75.25, "")


def test_two_processes_learning_the_same_shape_at_once_lose_no_run(journal):
    bank = Bank()
    runs = []
    for f in ("bills/may.txt", "bills/jun.txt"):
        d = bank.files[f]
        with ScriptedModel([tool_call("read_file", path=f), tool_call("pay", iban=d["iban"], amount=d["amount"]),
                            say("Paid.")]) as m:
            runs.append(_agent(m, journal, bank, learn=False).run(f"Pay the bill in {f}").run_id)
    barrier = threading.Barrier(2, timeout=30)
    reports: list = []

    def learn(run_id: str) -> None:
        # an agent (and store connection) of its own, as another process would have
        a = eg.Agent("biller", "openai:scripted", "Pay bills.", bank.tools(), journal=journal, learn=True,
                     memory_store=eg.Memory(journal.url))
        barrier.wait()
        reports.append(a.learn_from(run_id))

    threads = [threading.Thread(target=learn, args=(r,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(r.action for r in reports) == ["created", "updated"]
    (r,) = LearnedRoutines(journal.url).list("biller")
    assert sorted(r.runs) == sorted(runs) and r.status == "confirmed"
    # a save from a stale read is refused, so a concurrent learner redoes its change on the newer routine
    store = LearnedRoutines(journal.url)
    a, b = store.get(r.id), store.get(r.id)
    store.save(a)
    from engrain._memory.learned import LearnedRoutineChangedError

    with pytest.raises(LearnedRoutineChangedError, match="changed since it was read"):
        store.save(b)
    store.note_use(r.id, stopped=True)
    assert (store.get(r.id).uses, store.get(r.id).stops) == (1, 1)


def test_an_agent_created_over_http_learns_and_the_client_reviews(tmp_path, monkeypatch):
    from tests.servers import serve

    url = f"sqlite:///{tmp_path / 'e.db'}"
    tools_file = tmp_path / "bill_tools.py"
    tools_file.write_text(
        "import engrain as eg\n"
        "tools = eg.ToolRegistry()\n"
        "FILES = {'bills/may.txt': ('DE001', 120.5), 'bills/jun.txt': ('DE002', 99.0), 'bills/jul.txt': ('DE003', 75.25)}\n"
        "@eg.tool(registry=tools)\n"
        "def read_file(path: str) -> dict:\n"
        "    '''Read a bill file.'''\n"
        "    return {'path': path, 'iban': FILES[path][0], 'amount': FILES[path][1], 'status': 'unpaid'}\n"
        "@eg.tool(registry=tools)\n"
        "def pay(iban: str, amount: float) -> str:\n"
        "    '''Pay an amount to an IBAN.'''\n"
        "    return f'paid {amount} to {iban}'\n")
    respond = _bill_model({"bills/may.txt": ("DE001", 120.5), "bills/jun.txt": ("DE002", 99.0)},
                          "Paid with the routine.")

    with ScriptedModel(respond) as model:
        monkeypatch.setenv("OPENAI_BASE_URL", model.openai_url)
        monkeypatch.setenv("OPENAI_API_KEY", "scripted")
        with serve(url, tmp_path, token="t", tools=f"{tools_file}:tools") as base, eg.Client(base, token="t") as c:
            made = c.create_agent("biller", "openai:scripted", "Pay bills.", ["read_file", "pay"], learn="bills")
            assert made["learn"] == "bills"
            for f in ("bills/may.txt", "bills/jun.txt"):
                assert c.run_agent("biller", f"Pay the bill in {f}", wait=30)
            (item,) = c.learned(skill="bills")
            assert item["status"] == "confirmed" and item["inputs"]["required"] == ["path"]
            res = c.run_agent("biller", "Pay the bill in bills/jul.txt", wait=30)
            assert res and res.output == "Paid with the routine."
            assert c.learned_routine("pay_bill")["uses"] == 1
            assert c.promote_learned("pay_bill")["trusted"] is True
            with pytest.raises(eg.RemoteError) as e:
                c.edit_learned("pay_bill", "steps: [")
            assert e.value.status == 422
            assert c.delete_learned("pay_bill")["name"] == "pay_bill" and c.learned() == []


def test_a_leaf_that_changes_type_between_runs_is_not_taken_for_a_constant():
    def trace(i: int, tags: object) -> AgentTrace:
        return AgentTrace(f"r{i}", f"File note {i}0", [ToolCall("file", {"tags": tags}, "ok", 1)])

    done = induce([trace(1, []), trace(2, "urgent")])
    assert done.status == "not_compilable" and done.problems[0].arg == "tags"
    step = done.routine["steps"][0]
    assert step["args"] == {"tags": []} and step["description"].startswith("NOT COMPILABLE: tags")
    assert check_learned(done.routine) == []  # valid YAML for a human to edit


def test_a_learned_store_that_cannot_be_read_offers_nothing_and_the_run_goes_on(tmp_path, monkeypatch):
    journal = open_journal(f"sqlite:///{tmp_path / 'e.db'}")
    bank = Bank()
    _pay_run(journal, bank, "bills/may.txt")
    _pay_run(journal, bank, "bills/jun.txt")

    def broken(*a, **kw):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(LearnedRoutines, "match", broken)
    with ScriptedModel([say("I will do it by hand later.")]) as m:
        res = _agent(m, journal, bank).run("Pay the bill in bills/jul.txt")
        assert res and "pay_bill" not in _tool_names(m.requests[0][1])
    offer = next(e for e in journal.read(res.run_id) if e.name == "agent.routines.offer")
    assert offer.data["result"] == {"routines": [], "error": "OperationalError: disk I/O error"}


def test_pattern_matching_is_bounded():
    from engrain._memory.learned import _pattern_matches

    assert _pattern_matches("Pay the bill in {path}", "Pay the bill in bills/x.txt")
    assert not _pattern_matches("Pay {a} {b} {c}", "Pay " + "x " * 5000)  # too long: never matched, never slow
