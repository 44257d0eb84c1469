"""Learned routines must never act differently from the model: the cases that could make them.

Each test learns through the public flow (an ``eg.Agent(learn=True)`` driven
by the scripted model server through the official ``openai`` SDK, a real
SQLite store with MiniLM embeddings) from two runs of a model *policy* that
reads the task and the results, then runs a new task where the learned runs
were right by coincidence. The model calls an offered routine whenever its
task pattern reads the task (as a model trusting the description would);
the outcome must be what the policy does by hand, or a stop it finishes by hand.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

import engrain as eg
from engrain._agent.scripted import Reply, ScriptedModel, say, tool_call
from engrain._journal import open_journal
from engrain._memory.learned import LearnedRoutines

Done = list[tuple[str, Any]]


class World:
    """Invoices, an account balance, and every tool call made."""

    def __init__(self, invoices: dict[str, list[dict]] | None = None, balance: float = 1000.0,
                 currency: str = "EUR") -> None:
        self.invoices = invoices or {}
        self.balance = balance
        self.currency = currency
        self.calls: list[tuple[str, dict]] = []

    def tools(self) -> list[Callable[..., Any]]:
        def list_invoices(vendor: str) -> dict:
            """A vendor's open invoices."""
            self.calls.append(("list_invoices", {"vendor": vendor}))
            return {"vendor": vendor, "invoices": self.invoices.get(vendor, [])}

        def pay_invoice(invoice_id: str, amount: float) -> str:
            """Pay an invoice."""
            self.calls.append(("pay_invoice", {"invoice_id": invoice_id, "amount": amount}))
            return f"paid {invoice_id}"

        def get_balance() -> dict:
            """The account's balance."""
            self.calls.append(("get_balance", {}))
            return {"balance": self.balance, "currency": self.currency}

        def transfer(to: str, amount: int) -> str:
            """Transfer money to a person."""
            self.calls.append(("transfer", {"to": to, "amount": amount}))
            return "booked"

        def notify(text: str) -> str:
            """Tell the user something."""
            self.calls.append(("notify", {"text": text}))
            return "sent"

        return [list_invoices, pay_invoice, get_balance, transfer, notify]


BASE = {"list_invoices", "pay_invoice", "get_balance", "transfer", "notify", "read_bill", "pay", "find_invoice", "get_price", "place_order"}


def _routine_call(body: dict, task: str) -> Reply | None:
    """A call of an offered routine whose task pattern reads ``task`` (its slots filled from the task)."""
    for t in body.get("tools", []):
        f = t["function"]
        m = re.search(r"Task pattern: (.*?)\. Calls ", f["description"])
        if f["name"] in BASE or m is None:
            continue
        names = re.findall(r"\{(\w+)\}", m.group(1))
        rx = "".join(f"(?P<{p}>.+?)" if i % 2 else re.escape(p) for i, p in enumerate(re.split(r"\{(\w+)\}", m.group(1))))
        hit = re.fullmatch(rx, task)
        if hit is None:
            continue
        props = f["parameters"]["properties"]
        args = {n: int(hit[n]) if props[n].get("type") == "integer" else hit[n] for n in names}
        args.update({n: p["const"] for n, p in props.items() if "const" in p})
        return tool_call(f["name"], **args)
    return None


def _model(policy: Callable[[str, Done], Reply], use_routines: bool = True) -> Callable[[str, dict], Reply]:
    """respond(): an offered routine when it matches, else the policy over the results so far."""

    def respond(api: str, body: dict) -> Reply:
        msgs = body["messages"]
        task = re.sub(r"^\[[^\]]*\] ", "", next(m["content"] for m in msgs if m["role"] == "user"))  # the date stamp
        names = {c["id"]: c["function"]["name"] for m in msgs if m["role"] == "assistant"
                 for c in m.get("tool_calls") or []}
        done: Done = []
        used = False
        for m in msgs:
            if m["role"] != "tool":
                continue
            value = json.loads(m["content"]) if m["content"][:1] in "{[" else m["content"]
            if names[m["tool_call_id"]] in BASE:
                done.append((names[m["tool_call_id"]], value))
            else:
                used = True
                steps = value.get("results") if value.get("status") == "ok" else value.get("done")
                done += [(s["tool"], s["result"]) for s in steps or []]
        if use_routines and not used and not done:
            call = _routine_call(body, task)
            if call is not None:
                return call
        return policy(task, done)

    return respond


def _run(url: str, world: World, policy: Callable[[str, Done], Reply], task: str, use_routines: bool = True) -> dict:
    with ScriptedModel(_model(policy, use_routines)) as m:
        agent = eg.Agent("clerk", "openai:scripted", "Do the task.", world.tools(), base_url=m.openai_url,
                         journal=open_journal(url), learn=True)
        res = agent.run(task)
        assert res, res
        routine = [json.loads(x["content"]) for _, b in m.requests for x in b["messages"]
                   if x["role"] == "tool" and x["content"].startswith('{"status"')]
    return {"learned": agent.last_learned, "routine": routine[0] if routine else None}


def _learning_run(url: str, tools: list[Callable[..., Any]], policy: Callable[[str, Done], Reply], task: str) -> Any:
    """Run ``task`` with an agent that learns, the model playing ``policy``; what the run taught."""
    with ScriptedModel(_model(policy)) as m:
        agent = eg.Agent("clerk", "openai:scripted", "Do the task.", tools, base_url=m.openai_url,
                         journal=open_journal(url), learn=True)
        assert agent.run(task)
    return agent.last_learned


# -- a list element chosen on meaning ---------------------------------------------------------


def latest_policy(task: str, done: Done) -> Reply:
    vendor = task.rsplit(" ", 1)[-1]
    if not done:
        return tool_call("list_invoices", vendor=vendor)
    if len(done) == 1:
        inv = max(done[0][1]["invoices"], key=lambda i: i["date"])
        return tool_call("pay_invoice", invoice_id=inv["id"], amount=inv["amount"])
    return say("Paid.")


def test_an_element_the_model_chose_from_a_longer_list_is_not_generalized(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    # In both learned runs the latest invoice happened to come first.
    invoices = {
        "Acme": [{"id": "A-17", "date": "2026-05-01", "amount": 10.5}, {"id": "A-12", "date": "2026-03-01", "amount": 20.0}],
        "Globex": [{"id": "G-9", "date": "2026-06-01", "amount": 99.0}, {"id": "G-3", "date": "2026-01-01", "amount": 5.0}],
        "Initech": [{"id": "I-1", "date": "2026-01-15", "amount": 7.0}, {"id": "I-8", "date": "2026-07-15", "amount": 70.0}],
    }
    for v in ("Acme", "Globex"):
        got = _run(url, World(invoices), latest_policy, f"Pay the latest invoice from {v}")
    rep = got["learned"]
    assert rep.status == "candidate", rep  # never offered on its own: the order was a coincidence
    assert rep.problems == [{"step": "step2", "tool": "pay_invoice", "arg": "invoice_id",
                             "reason": "read from step1.invoices[0], one of 2 items: the runs cannot tell why the model "
                                       "chose that one (a human may promote it if the order is by contract)"},
                            {"step": "step2", "tool": "pay_invoice", "arg": "amount",
                             "reason": "read from step1.invoices[0], one of 2 items: the runs cannot tell why the model "
                                       "chose that one (a human may promote it if the order is by contract)"}]
    w = World(invoices)
    got = _run(url, w, latest_policy, "Pay the latest invoice from Initech")
    assert got["routine"] is None
    assert w.calls[-1] == ("pay_invoice", {"invoice_id": "I-8", "amount": 70.0})  # the latest, as by hand


def test_a_one_item_list_is_no_choice_and_a_human_can_vouch_for_an_order(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    invoices = {"Acme": [{"id": "A-17", "date": "2026-05-01", "amount": 10.5}],
                "Globex": [{"id": "G-9", "date": "2026-06-01", "amount": 99.0}],
                "Initech": [{"id": "I-8", "date": "2026-07-15", "amount": 70.0}]}
    for v in ("Acme", "Globex"):
        got = _run(url, World(invoices), latest_policy, f"Pay the latest invoice from {v}")
    assert got["learned"].status == "confirmed" and got["learned"].problems == []
    w = World(invoices)
    got = _run(url, w, latest_policy, "Pay the latest invoice from Initech")
    assert got["routine"]["status"] == "ok" and w.calls[-1] == ("pay_invoice", {"invoice_id": "I-8", "amount": 70.0})
    # two invoices now: the routine learned on one-item lists stops instead of picking one
    invoices["Initech"].insert(0, {"id": "I-1", "date": "2026-01-15", "amount": 7.0})
    w = World(invoices)
    got = _run(url, w, latest_policy, "Pay the latest invoice from Initech")
    assert got["routine"]["status"] == "stopped" and "no longer has 1 items" in got["routine"]["reason"]
    assert [c for c in w.calls if c[0] == "pay_invoice"] == [("pay_invoice", {"invoice_id": "I-8", "amount": 70.0})]


# -- a number the model compared before acting ------------------------------------------------


def balance_policy(task: str, done: Done) -> Reply:
    amount, to = re.fullmatch(r"Transfer (\d+) EUR to (\w+)", task).groups()
    if not done:
        return tool_call("get_balance")
    if len(done) == 1:
        if done[0][1]["balance"] < int(amount):
            return tool_call("notify", text=f"Not enough money to send {amount} EUR to {to}")
        return tool_call("transfer", to=to, amount=int(amount))
    return say("Done.")


def test_a_number_the_model_compared_with_its_argument_is_asserted(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    _run(url, World(balance=500.0), balance_policy, "Transfer 100 EUR to Ann")
    got = _run(url, World(balance=900.0), balance_policy, "Transfer 250 EUR to Bob")
    assert got["learned"].status == "confirmed"
    steps = LearnedRoutines(url).get(got["learned"].routine_id).routine["steps"]
    assert "step1.balance > inputs.amount" in [s.get("expr") for s in steps]
    w = World(balance=80.0)
    got = _run(url, w, balance_policy, "Transfer 300 EUR to Cem")
    assert got["routine"]["status"] == "stopped" and got["routine"]["stopped_at"] == "check1_2"
    assert [c[0] for c in w.calls] == ["get_balance", "notify"]  # no transfer: the model would not have made one
    w = World(balance=700.0)
    got = _run(url, w, balance_policy, "Transfer 300 EUR to Cem")
    assert got["routine"]["status"] == "ok" and w.calls[-1] == ("transfer", {"to": "Cem", "amount": 300})


def test_a_promoted_routine_is_not_re_induced_behind_the_reviewer(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    _run(url, World(balance=500.0), balance_policy, "Transfer 100 EUR to Ann")
    got = _run(url, World(balance=900.0), balance_policy, "Transfer 250 EUR to Bob")
    store = eg.LearnedRoutines(url)
    reviewed = store.promote(got["learned"].routine_id).routine
    assert 'step1.currency == "EUR"' in [s.get("expr") for s in reviewed["steps"]]
    # A run by hand in a world the reviewer never saw (the balance in another currency) would drop that assert.
    got = _run(url, World(balance=700.0, currency="GBP"), balance_policy, "Transfer 40 EUR to Cem", use_routines=False)
    assert got["learned"].action == "recorded" and "promoted" in got["learned"].reason
    r = store.get(got["learned"].routine_id)
    assert r.trusted is True and r.routine == reviewed and len(r.runs) == 3


def test_a_journaled_routine_name_cannot_put_its_package_outside_the_cache(tmp_path, monkeypatch):
    from engrain._agent import learn

    monkeypatch.setattr(learn, "_tmp_root", [tmp_path / "root"])
    monkeypatch.setattr("engrain._disk_cache.cache_dir", lambda name: None)
    (tmp_path / "root").mkdir()
    # the offer step's result is read back from the journal on a resume: its name is data, not a path
    folder = learn._package({"name": "../../outside", "steps": [{"id": "result", "type": "return", "value": 1}]})
    assert folder.parent == tmp_path / "root" and (folder / "routine.yaml").is_file()
    assert not (tmp_path / "outside").exists() and not any(tmp_path.parent.glob("outside-*"))


# -- two places of the task that held the same value ------------------------------------------


class Calendar:
    def __init__(self) -> None:
        self.events = {"Monday": "ev-1", "Tuesday": "ev-2", "Friday": "ev-5"}
        self.calls: list[tuple[str, dict]] = []

    def tools(self) -> list[Callable[..., Any]]:
        def find_event(day: str) -> dict:
            """The meeting on a day."""
            self.calls.append(("find_event", {"day": day}))
            return {"id": self.events[day], "status": "confirmed"}

        def update_event(event_id: str, day: str, time: str) -> str:
            """Move a meeting."""
            self.calls.append(("update_event", {"event_id": event_id, "day": day, "time": time}))
            return "moved"

        return [find_event, update_event]


def _move(url: str, task: str) -> list[tuple[str, dict]]:
    old, new, tm = re.fullmatch(r"Move my (\w+) meeting to (\w+) at (\S+)", task).groups()

    def respond(api: str, body: dict) -> Reply:
        msgs = body["messages"]
        results = [json.loads(m["content"]) if m["content"].startswith("{") else m["content"]
                   for m in msgs if m["role"] == "tool"]
        routine = next((t["function"] for t in body["tools"] if t["function"]["name"] not in ("find_event", "update_event")), None)
        if routine is not None:
            # a model trusting the description: the inputs a "move my meeting" routine asks for
            return say("Moved.") if results else tool_call(
                routine["name"], **{n: {"day": new, "time": tm}.get(n, old) for n in routine["parameters"]["required"]})
        if not results:
            return tool_call("find_event", day=old)
        if len(results) == 1:
            return tool_call("update_event", event_id=results[0]["id"], day=new, time=tm)
        return say("Moved.")

    cal = Calendar()
    with ScriptedModel(respond) as m:
        agent = eg.Agent("planner", "openai:scripted", "Plan.", cal.tools(), base_url=m.openai_url,
                         journal=open_journal(url), learn=True)
        res = agent.run(task)
        assert res, res
    return cal.calls


def test_an_argument_equal_to_another_only_where_the_task_held_the_value_twice_stays_a_candidate(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    _move(url, "Move my Monday meeting to Monday at 15:00")  # both runs moved a meeting within its day
    _move(url, "Move my Friday meeting to Friday at 10:00")
    (r,) = LearnedRoutines(url).list("planner")
    assert r.status == "candidate" and [(p["step"], p["arg"]) for p in r.problems] == [("step2", "day")]
    assert "the task held that value in 2 places" in r.problems[0]["reason"]
    # never offered, so the next task is done by hand: the Monday meeting moves to Tuesday
    assert _move(url, "Move my Monday meeting to Tuesday at 9:00") == [
        ("find_event", {"day": "Monday"}), ("update_event", {"event_id": "ev-1", "day": "Tuesday", "time": "9:00"})]


# -- a flag the model saw in a record no argument reads -------------------------------------


def test_a_flag_in_a_record_beside_the_one_read_is_asserted(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    bills = {f: {"customer": {"name": "Ada", "blocked": False}, "bill": {"iban": f"DE{i}", "amount": 10.0 * i}}
             for i, f in enumerate(["a.txt", "b.txt", "c.txt"], 1)}
    calls: list[tuple[str, dict]] = []

    def read_bill(path: str) -> dict:
        """A bill and the customer it is for."""
        return bills[path]

    def pay(iban: str, amount: float) -> str:
        """Pay an amount to an IBAN."""
        calls.append(("pay", {"iban": iban, "amount": amount}))
        return "paid"

    def policy(task: str, done: Done) -> Reply:
        if not done:
            return tool_call("read_bill", path=task.rsplit(" ", 1)[-1])
        if len(done) == 1 and not done[0][1]["customer"]["blocked"]:
            return tool_call("pay", **done[0][1]["bill"])
        return say("Not paid: the customer is blocked." if len(done) == 1 else "Paid.")

    def run(task: str) -> Any:
        return _learning_run(url, [read_bill, pay], policy, task)

    run("Pay the bill in a.txt")
    assert run("Pay the bill in b.txt").status == "confirmed"
    bills["c.txt"]["customer"]["blocked"] = True
    calls.clear()
    run("Pay the bill in c.txt")
    assert calls == []  # the routine stopped at step1.customer.blocked == False; the model paid nothing


# -- a value in the task and in a result: the task wins, the result must still agree ------------


def test_a_task_value_a_later_argument_reuses_is_checked_against_the_result_that_held_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    invoices = {"Ann": {"id": "I-1", "payee": "Ann", "amount": 5.0}, "Bob": {"id": "I-2", "payee": "Bob", "amount": 9.0},
                "Cy": {"id": "I-3", "payee": "Cyrus", "amount": 7.0}}  # the lookup found Cyrus's invoice for "Cy"
    calls: list[tuple[str, dict]] = []

    def find_invoice(customer: str) -> dict:
        """A customer's open invoice (the closest name)."""
        return invoices[customer]

    def pay(payee: str, invoice_id: str, amount: float) -> str:
        """Pay an invoice to its payee."""
        calls.append(("pay", {"payee": payee, "invoice_id": invoice_id, "amount": amount}))
        return "paid"

    def notify(text: str) -> str:
        """Tell the user something."""
        calls.append(("notify", {"text": text}))
        return "sent"

    def policy(task: str, done: Done) -> Reply:
        who = task.rsplit(" ", 1)[-1]
        if not done:
            return tool_call("find_invoice", customer=who)
        inv = done[0][1]
        if len(done) == 1:  # the model pays the payee the invoice names, and only the customer's own invoice
            if inv["payee"] != who:
                return tool_call("notify", text=f"No open invoice of {who}")
            return tool_call("pay", payee=inv["payee"], invoice_id=inv["id"], amount=inv["amount"])
        return say("Done.")

    def run(task: str) -> Any:
        return _learning_run(url, [find_invoice, pay, notify], policy, task)

    run("Pay the open invoice of Ann")
    rep = run("Pay the open invoice of Bob")
    assert rep.status == "confirmed"
    steps = LearnedRoutines(url).get(rep.routine_id).routine["steps"]
    assert "step1.payee == inputs.customer" in [s.get("expr") for s in steps]
    calls.clear()
    run("Pay the open invoice of Cy")
    assert calls == [("notify", {"text": "No open invoice of Cy"})]  # Cyrus's invoice is not paid to "Cy"


# -- what an edit (or a stored routine) may call -------------------------------------------------


def test_a_learned_routine_calls_only_the_tools_it_declares(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    _run(url, World(balance=500.0), balance_policy, "Transfer 100 EUR to Ann")
    rep = _run(url, World(balance=900.0), balance_policy, "Transfer 250 EUR to Bob")["learned"]
    pub = eg.LearnedRoutines(url)
    routine = pub.get(rep.routine_id).routine
    sneaky = {**routine, "steps": [{"id": "s0", "type": "tool.call", "tool": "notify", "args": {"text": "hi"}},
                                   *routine["steps"]]}
    with pytest.raises(eg.MemoryInputError, match="tool 'notify' is not one of the routine's tools"):
        pub.edit(rep.routine_id, sneaky)
    # stored without the check (the storage API, or a journaled offer read back): it stops instead of calling it
    LearnedRoutines(url).replace(rep.routine_id, sneaky)
    w = World(balance=900.0)
    got = _run(url, w, balance_policy, "Transfer 30 EUR to Cem")
    assert got["routine"]["status"] == "stopped" and got["routine"]["stopped_at"] == "s0"
    assert "ToolNotFound" in got["routine"]["reason"] and ("notify", {"text": "hi"}) not in w.calls


# -- a result value the runs never varied, written inside text ------------------------------------


def test_numbers_of_a_result_written_into_text_are_asserted_when_the_runs_never_varied_them(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    bills = {"a.txt": {"iban": "DE111", "amount": 60.0, "due": 3}, "b.txt": {"iban": "DE222", "amount": 60.0, "due": 3},
             "c.txt": {"iban": "DE333", "amount": 75.0, "due": 10}}
    sent: list[str] = []

    def read_bill(path: str) -> dict:
        """A bill: IBAN, amount and days until it is due."""
        return bills[path]

    def notify(text: str) -> str:
        """Tell the user something."""
        sent.append(text)
        return "sent"

    def policy(task: str, done: Done) -> Reply:
        if not done:
            return tool_call("read_bill", path=task.rsplit(" ", 1)[-1])
        b = done[0][1]
        return say("Done.") if len(done) > 1 else tool_call(
            "notify", text=f"Your {b['amount']} EUR bill to {b['iban']} is due in {b['due']} days")

    def run(task: str) -> Any:
        return _learning_run(url, [read_bill, notify], policy, task)

    run("Remind me of the bill in a.txt")
    assert run("Remind me of the bill in b.txt").status == "confirmed"  # both bills: 60.0 EUR, due in 3 days
    sent.clear()
    run("Remind me of the bill in c.txt")
    assert sent == ["Your 75.0 EUR bill to DE333 is due in 10 days"]  # never "60.0 ... 3 days"


# -- a number the model computed, the same in every run ----------------------------------------


def test_a_constant_number_written_after_results_pins_the_numbers_it_may_come_from(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    prices = {"paper": 30.0, "toner": 30.0, "staples": 12.0}
    orders: list[tuple] = []

    def get_price(item: str) -> dict:
        """The unit price of an item."""
        return {"item": item, "unit_price": prices[item]}

    def place_order(item: str, qty: int, total: float) -> str:
        """Order items."""
        orders.append((item, qty, total))
        return "ordered"

    def policy(task: str, done: Done) -> Reply:
        n, item = re.fullmatch(r"Order (\d+) boxes of (\w+)", task).groups()
        if not done:
            return tool_call("get_price", item=item)
        if len(done) == 1:  # the model computes the total
            return tool_call("place_order", item=item, qty=int(n), total=done[0][1]["unit_price"] * int(n))
        return say("Ordered.")

    def run(task: str) -> Any:
        return _learning_run(url, [get_price, place_order], policy, task)

    run("Order 2 boxes of paper")
    assert run("Order 2 boxes of toner").status == "confirmed"  # the same total (60.0) both times
    orders.clear()
    run("Order 2 boxes of staples")
    assert orders == [("staples", 2, 24.0)]  # never the learned runs' 60.0
