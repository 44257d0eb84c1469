"""A learned routine a human took back, deleted or edited is not offered, nor run by an offer made before.

Through the public flow: ``eg.Agent(learn=True)`` driven by the scripted model
server (official ``openai`` SDK), review through the CLI, the HTTP API and
``eg.LearnedRoutines``, on SQLite and PostgreSQL where the test takes
``journal``. Taking a routine back (``promote --undo``, ``{"trusted": false}``,
``promote(trusted=False)``) withholds it, even one confirmed by runs and never
promoted, until a human promotes it again.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from test_learn import LOCAL, Bank, _agent, _cli, _pay_run, _tool_names

import engrain as eg
from engrain._agent.scripted import ScriptedModel, say, tool_call


def _confirmed(journal, bank: Bank) -> str:
    _pay_run(journal, bank, "bills/may.txt")
    a = _pay_run(journal, bank, "bills/jun.txt")
    assert a.last_learned.status == "confirmed"
    return a.last_learned.routine_id


def _offered(journal, bank: Bank) -> list[str]:
    """The tools a new run of the routine's family offers its model."""
    with ScriptedModel([say("Nothing to do.")]) as m:
        assert _agent(m, journal, bank).run("Pay the bill in bills/jul.txt")
        return _tool_names(m.requests[0][1])


def test_taking_a_routine_back_stops_the_offer_until_it_is_promoted_again(journal):
    bank = Bank()
    rid = _confirmed(journal, bank)
    assert "pay_bill" in _offered(journal, bank)  # confirmed by two runs: offered without a review
    store = eg.LearnedRoutines(journal.url)
    assert store.promote(rid).trusted is True and "pay_bill" in _offered(journal, bank)

    r = _cli("routines", "promote", "pay_bill", "--undo", "--url", journal.url, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["trusted"] is False and got["demoted"] is True and got["status"] == "confirmed"
    assert _offered(journal, bank) == ["read_file", "pay", "notify"]
    listing = _cli("routines", "--url", journal.url)
    assert "withheld" in listing.stdout, listing.stdout

    # Runs of its shape no longer re-induce it behind the reviewer's back.
    a = _pay_run(journal, bank, "bills/jul.txt")
    assert a.last_learned.action == "recorded" and "taken back" in a.last_learned.reason
    assert store.get(rid).demoted is True and _offered(journal, bank) == ["read_file", "pay", "notify"]

    again = store.promote(rid)
    assert again.trusted is True and again.demoted is False and "pay_bill" in _offered(journal, bank)


def test_a_routine_confirmed_by_runs_can_be_withheld_over_http(tmp_path):
    from engrain._server import create_app

    url = f"sqlite:///{tmp_path / 'e.db'}"
    journal = eg.open(url)
    bank = Bank()
    rid = _confirmed(journal, bank)
    with TestClient(create_app(url, routines_dir=tmp_path / "routines"), base_url=LOCAL) as c:
        r = c.post(f"/api/learned/{rid}/promote", json={"trusted": False})
        assert r.status_code == 200 and r.json()["demoted"] is True and r.json()["trusted"] is False
        assert c.get("/api/learned").json()[0]["demoted"] is True
    assert "pay_bill" not in _offered(journal, bank)


def _withdraw_by(how: str, url: str, rid: str) -> Callable[[], None]:
    store = eg.LearnedRoutines(url)

    def undo() -> None:
        r = _cli("routines", "promote", rid, "--undo", "--url", url, "--json")
        assert r.returncode == 0, r.stderr

    def delete() -> None:
        r = _cli("routines", "delete", rid, "--url", url)
        assert r.returncode == 0, r.stderr

    def edit() -> None:
        routine = store.get(rid).routine
        store.edit(rid, {**routine, "description": "Pay a bill file (reviewed)."})

    def unconfirm() -> None:  # the store says candidate again (as a re-induction with a doubt would)
        r = store.get(rid)
        r.status = "candidate"
        store.save(r)

    return {"undo": undo, "delete": delete, "edit": edit, "unconfirm": unconfirm}[how]


@pytest.mark.parametrize(("how", "why"), [("undo", "a human took it back"), ("delete", "it was deleted"),
                                          ("edit", "it was changed"), ("unconfirm", "it is no longer confirmed")])
def test_an_offer_made_before_the_routine_was_withdrawn_does_not_run_it(journal, how, why):
    bank = Bank()
    rid = _confirmed(journal, bank)
    withdraw = _withdraw_by(how, journal.url, rid)
    handed: list[dict] = []

    def respond(api: str, body: dict):
        last = body["messages"][-1]
        if last["role"] == "user":
            assert "pay_bill" in _tool_names(body)
            withdraw()  # between the offer and the model's call to it
            return tool_call("pay_bill", path="bills/jul.txt")
        if last["role"] == "tool" and not handed:
            handed.append(json.loads(last["content"]))
            return tool_call("read_file", path="bills/jul.txt")
        if sum(m["role"] == "tool" for m in body["messages"]) == 2:
            return tool_call("pay", iban="DE003", amount=75.25)
        return say("Paid by hand.")

    bank.calls.clear()
    with ScriptedModel(respond) as m:
        res = _agent(m, journal, bank).run("Pay the bill in bills/jul.txt")
    assert res and res.output == "Paid by hand."
    (out,) = handed
    assert out["status"] == "stopped" and out["run_id"] is None and out["done"] == []
    assert out["reason"].startswith("the routine was withdrawn since it was offered: " + why), out
    # Only the model's own calls ran: the routine's steps never did.
    assert bank.calls == [("read_file", {"path": "bills/jul.txt"}), ("pay", {"iban": "DE003", "amount": 75.25, "memo": ""})]
    assert journal.runs(tag="routine") == []  # no child run was started
    if how == "edit":  # the next task is offered the new version, and it runs
        seen: list[dict] = []

        def use(api: str, body: dict):
            seen.append(body)
            return say("Done.") if body["messages"][-1]["role"] == "tool" else tool_call("pay_bill", path="bills/may.txt")

        with ScriptedModel(use) as m:
            assert _agent(m, journal, bank).run("Pay the bill in bills/may.txt")
        offered = next(t["function"] for t in seen[0]["tools"] if t["function"]["name"] == "pay_bill")
        assert "Pay a bill file (reviewed)." in offered["description"]
        assert json.loads(seen[1]["messages"][-1]["content"])["status"] == "ok"


def test_a_run_resumed_after_a_crash_inside_the_routine_does_not_finish_a_routine_taken_back(tmp_path):
    """The offer and the model's call to it are journaled: the resumed call still reads the store first."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    journal = eg.open(url)
    bank = Bank()
    _confirmed(journal, bank)
    tools = bank.tools()
    crash = {"on": True}

    def pay(iban: str, amount: float, memo: str = "") -> str:
        """Pay an amount to an IBAN."""
        if crash["on"]:
            raise KeyboardInterrupt  # the process dies inside the routine's pay step
        return tools[1](iban, amount, memo)

    def agent(m: ScriptedModel) -> eg.Agent:
        return eg.Agent("biller", "openai:scripted", "Pay bills.", [tools[0], pay, tools[2]], base_url=m.openai_url,
                        journal=journal, learn=True)

    handed: list[dict] = []

    def respond(api: str, body: dict):
        msgs = body["messages"]
        if msgs[-1]["role"] == "user":
            return tool_call("pay_bill", path="bills/jul.txt")
        if not handed:
            handed.append(json.loads(msgs[-1]["content"]))
            return tool_call("pay", iban="DE003", amount=75.25, memo="by hand")
        return say("Paid by hand.")

    bank.calls.clear()
    with ScriptedModel(respond) as m, pytest.raises(KeyboardInterrupt):
        agent(m).run("Pay the bill in bills/jul.txt", run_id="crashed")
    assert bank.calls == [("read_file", {"path": "bills/jul.txt"})]
    r = _cli("routines", "promote", "pay_bill", "--undo", "--url", url, "--json")
    assert r.returncode == 0, r.stderr
    crash["on"] = False
    with ScriptedModel(respond) as m:
        res = agent(m).run("Pay the bill in bills/jul.txt", run_id="crashed")
    assert res and res.output == "Paid by hand."
    (out,) = handed
    assert out["status"] == "stopped" and "a human took it back" in out["reason"]
    # What the routine did before the crash is the model's to know; its pay never ran.
    assert out["done"] == [{"tool": "read_file", "args": {"path": "bills/jul.txt"},
                            "result": {"path": "bills/jul.txt", **bank.files["bills/jul.txt"]}}]
    assert bank.calls == [("read_file", {"path": "bills/jul.txt"}),
                          ("pay", {"iban": "DE003", "amount": 75.25, "memo": "by hand"})]
