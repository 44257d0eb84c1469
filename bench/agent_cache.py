"""The agent's behavior cache on tools whose results change between runs (engrain's own task set).

A small office world (mail, files, calendar, invoices, payments, tickets, bank
accounts, stock quotes, card charges) whose write tools return what real
services do: a freshly minted id (``msg_…``, a UUID, ``pay_…``) and the time of
the call. Eight task families, each a policy the scripted model (a local stub
server speaking the OpenAI wire format, not an LLM) plays from what it sees:
the task and the tool results so far. So when a meaningful field changes (an
invoice's amount or status, a contact's address, a ticket's priority, a
balance), the right next step changes too. Two families are traps for the
default comparison: a quote whose ``as_of`` (shaped like a stamp) the model
judges fresh or stale, and a charge whose id carries its outcome
(``ch_approved_…``/``ch_declined_…``, shaped like a generated id).

Part 1, repeated tasks: every task is run once (filling the cache), then again
in a fresh world (the same facts, new ids and times), then in a world where a
third of the tasks' facts changed. Each run's effects (the write calls, ids
normalized) and answer are compared with a run of the same task without the
cache in an identical world: any difference is a wrong replay. Side by side:
the default comparison (generated ids and write stamps the model never used
again are ignored) and exact comparison (``volatile=()`` on every tool, the
behavior before), and the floor (a run without the cache).

Part 2, reworded tasks: >= 100 pairs of a cached task and either a paraphrase
(same intent and entities, reworded) or a near miss (one entity, date or amount
changed). With the packaged embedder, the nearest cached tasks (up to three) are
proposed to the model as plans (also while the cache fills, so the counts of
accepted and rejected plans include those runs). The scripted model accepts a plan whose calls are the ones it
would make for the task (an oracle: it knows the task's ground truth) and
rejects the others; a second pass edits near misses instead (the changed value
put in place of the old one in the plan's arguments), which exercises the rule
that calls whose recorded arguments came from an earlier result are not run
once that result differs. Reports calls per task against the no-cache floor
and wrong replays (target 0).

    python bench/agent_cache.py [--quick]
"""

from __future__ import annotations

import argparse
import calendar
import itertools
import json
import re
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import engrain as eg
from engrain._agent.scripted import Reply, ScriptedModel, say, tool_calls

ID = re.compile(r"msg_[0-9a-f]{12}|ord_[0-9a-f]{12}|(?<=ch_approved_)[0-9a-f]{10}|(?<=ch_declined_)[0-9a-f]{10}|pay_[0-9a-f]{10}|c_[0-9a-f]{10}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


# -- the world -------------------------------------------------------------------------------


NAMES = ["Ann", "Bob", "Carol", "Dan", "Eve", "Finn", "Gus", "Hana", "Ivo", "Jo"]
OTHER_NAMES = ["Kim", "Lee", "Max", "Noor", "Omar", "Pia", "Quinn", "Rosa", "Sam", "Tess"]
CUSTOMERS = ["Acme", "Globex", "Initech", "Umbrella", "Hooli", "Stark", "Wayne", "Tyrell", "Cyberdyne"]
OTHER_CUSTOMERS = ["Soylent", "Vandelay", "Oceanic", "Gringotts", "Monarch", "Dunder", "Pied Piper", "Wonka", "Nakatomi"]
ACCOUNTS = ["savings", "checking", "travel", "payroll", "taxes"]
OTHER_ACCOUNTS = ["reserve", "marketing", "rent", "pension", "bonus"]
SYMBOLS = ["ACME", "GLBX", "INIT", "UMBR", "HOOL", "STRK"]
OTHER_SYMBOLS = ["SOYL", "VAND", "OCEA", "GRIN", "MONA", "DUND"]
ORDERS = [f"O-{500 + i}" for i in range(6)]


def base_facts() -> dict[str, Any]:
    return {
        "contacts": {n: f"{n.lower()}@example.com" for n in NAMES + OTHER_NAMES},
        "invoices": {c: {"invoice": f"INV-{1000 + i}", "amount": 100.0 + 17 * i, "status": "open" if i % 3 else "paid"}
                     for i, c in enumerate(CUSTOMERS + OTHER_CUSTOMERS)},
        "balances": {a: round(250.0 + 91.5 * i, 2) for i, a in enumerate(ACCOUNTS + OTHER_ACCOUNTS)},
        # a quote's as_of lags its call by "lag" seconds: a field shaped like a stamp that the model judges
        "quotes": {s: {"price": 40.0 + 3 * i, "lag": 0} for i, s in enumerate(SYMBOLS + OTHER_SYMBOLS)},
        # a charge id carries its outcome ("ch_approved_…"): shaped like a generated id, but meaningful
        "charges": {o: "approved" for o in ORDERS} | {f"O-{600 + i}": "approved" for i in range(6)},
        "tickets": {f"T-{100 + i}": {"status": "open", "priority": "low" if i % 2 else "high"} for i in range(10)}
        | {f"T-{200 + i}": {"status": "open", "priority": "low" if i % 3 else "high"} for i in range(10)},
    }


class World:
    """One environment: the facts, plus every write's effect; ids and times are fresh on each call."""

    def __init__(self, facts: dict[str, Any], t0: float):
        self.facts = json.loads(json.dumps(facts))
        self.clock = itertools.count()
        self.t0 = t0
        self.files: dict[str, dict[str, Any]] = {}
        self.sent: set[str] = set()
        self.effects: list[tuple[str, str]] = []

    def now(self) -> str:
        t = self.t0 + next(self.clock) * 1.25
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"

    def effect(self, tool: str, **args: Any) -> None:
        self.effects.append((tool, ID.sub("<id>", json.dumps(args, sort_keys=True))))

    def tools(self) -> list:
        w = self

        def search_contacts(name: str) -> dict:
            """Find a contact's email address."""
            if name not in w.facts["contacts"]:
                return {"error": f"no contact {name}"}
            return {"name": name, "email": w.facts["contacts"][name]}

        def send_email(to: str, subject: str) -> dict:
            """Send an email."""
            w.effect("send_email", to=to, subject=subject)
            mid = f"msg_{uuid.uuid4().hex[:12]}"
            w.sent.add(mid)
            return {"id": mid, "to": to, "subject": subject, "status": "sent", "sent_at": w.now()}

        def create_file(name: str) -> dict:
            """Create an empty file."""
            fid = str(uuid.uuid4())
            w.files[fid] = {"name": name, "text": ""}
            w.effect("create_file", name=name)
            return {"file_id": fid, "name": name, "size": 0, "created_at": w.now()}

        def append_to_file(file_id: str, text: str) -> dict:
            """Append a line to a file."""
            f = w.files.get(file_id)
            w.effect("append_to_file", file_id=file_id, text=text, known=f is not None)
            if f is None:
                return {"error": f"no file {file_id}"}
            f["text"] += text + "\n"
            return {"file_id": file_id, "size": len(f["text"]), "modified_at": w.now()}

        def get_invoice(customer: str) -> dict:
            """A customer's latest invoice."""
            inv = w.facts["invoices"].get(customer)
            return {"customer": customer, **inv, "fetched_at": w.now()} if inv else {"error": f"no customer {customer}"}

        def pay(invoice: str, amount: float) -> dict:
            """Pay an invoice."""
            w.effect("pay", invoice=invoice, amount=amount)
            return {"payment_id": f"pay_{uuid.uuid4().hex[:10]}", "invoice": invoice, "amount": amount,
                    "status": "completed", "created": time.time()}

        def get_balance(account: str) -> dict:
            """An account's balance."""
            bal = w.facts["balances"].get(account)
            return {"account": account, "balance": bal, "currency": "EUR", "as_of": w.now()}

        def create_event(title: str, date: str) -> dict:
            """Put an event in the calendar."""
            w.effect("create_event", title=title, date=date)
            return {"event_id": str(uuid.uuid4()), "title": title, "date": date, "created_at": w.now()}

        def get_ticket(ticket: str) -> dict:
            """A support ticket."""
            return {"ticket": ticket, **w.facts["tickets"].get(ticket, {"status": "unknown", "priority": "none"})}

        def comment_ticket(ticket: str, text: str) -> dict:
            """Comment on a ticket."""
            w.effect("comment_ticket", ticket=ticket, text=text)
            return {"comment_id": f"c_{uuid.uuid4().hex[:10]}", "ticket": ticket, "created_at": w.now()}

        def close_ticket(ticket: str) -> dict:
            """Close a ticket."""
            w.effect("close_ticket", ticket=ticket)
            return {"ticket": ticket, "status": "closed", "updated_at": w.now()}

        def get_quote(symbol: str) -> dict:
            """The latest quote of a stock."""
            q = w.facts["quotes"].get(symbol)
            if q is None:
                return {"error": f"no symbol {symbol}"}
            t = time.time() - q["lag"]
            return {"symbol": symbol, "price": q["price"], "currency": "EUR",
                    "as_of": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))}

        def buy(symbol: str, price: float) -> dict:
            """Buy one share at a limit price."""
            w.effect("buy", symbol=symbol, price=price)
            return {"order_id": f"ord_{uuid.uuid4().hex[:12]}", "symbol": symbol, "status": "filled",
                    "created_at": w.now()}

        def charge_order(order: str) -> dict:
            """Charge the card on file for an order."""
            w.effect("charge_order", order=order)
            outcome = w.facts["charges"].get(order, "declined")
            return {"charge": f"ch_{outcome}_{uuid.uuid4().hex[:10]}", "order": order, "created_at": w.now()}

        return [get_quote, buy, charge_order,
                search_contacts, send_email, create_file, append_to_file, get_invoice, pay, get_balance,
                create_event, get_ticket, comment_ticket, close_ticket]


# -- the tasks: policies the scripted model plays --------------------------------------------

Done = list[tuple[str, dict[str, Any], Any]]


def email_report(p: dict[str, Any], done: Done) -> Any:
    if not done:
        return [("search_contacts", {"name": p["name"]})]
    if len(done) == 1:
        return [("send_email", {"to": done[0][2]["email"], "subject": f"{p['report']} report"})]
    return f"Sent the {p['report']} report to {done[1][2]['to']}."


def pay_invoice(p: dict[str, Any], done: Done) -> Any:
    if not done:
        return [("get_invoice", {"customer": p["customer"]})]
    inv = done[0][2]
    if len(done) == 1 and inv["status"] == "open":
        return [("pay", {"invoice": inv["invoice"], "amount": inv["amount"]})]
    if len(done) == 1:
        return f"{inv['invoice']} of {p['customer']} is already {inv['status']}."
    return f"Paid {done[1][2]['amount']} EUR for {inv['invoice']}."


def notes(p: dict[str, Any], done: Done) -> Any:
    if not done:
        return [("create_file", {"name": p["file"]})]
    if len(done) == 1:
        return [("append_to_file", {"file_id": done[0][2]["file_id"], "text": p["line"]})]
    return f"Wrote {p['file']} ({done[1][2].get('size', 'no')} bytes)."


def balance(p: dict[str, Any], done: Done) -> Any:
    if not done:
        return [("get_balance", {"account": p["account"]})]
    return f"The {p['account']} account holds {done[0][2]['balance']} EUR."


def meeting(p: dict[str, Any], done: Done) -> Any:
    if not done:
        return [("create_event", {"title": p["title"], "date": p["date"]}), ("search_contacts", {"name": p["name"]})]
    if len(done) == 2:
        return [("send_email", {"to": done[1][2]["email"], "subject": f"Invite: {p['title']} on {p['date']}"})]
    return f"Scheduled {p['title']} on {p['date']} and invited {p['name']}."


def ticket(p: dict[str, Any], done: Done) -> Any:
    if not done:
        return [("get_ticket", {"ticket": p["ticket"]})]
    t = done[0][2]
    if len(done) == 1 and t["priority"] == "low" and t["status"] == "open":
        return [("comment_ticket", {"ticket": p["ticket"], "text": "Closing: low priority."})]
    if len(done) == 2:
        return [("close_ticket", {"ticket": p["ticket"]})]
    if len(done) == 1:
        return f"{p['ticket']} stays open: priority {t['priority']}."
    return f"Closed {p['ticket']}."


def trade(p: dict[str, Any], done: Done) -> Any:
    if not done:
        return [("get_quote", {"symbol": p["symbol"]})]
    q = done[0][2]
    age = time.time() - calendar.timegm(time.strptime(q["as_of"], "%Y-%m-%dT%H:%M:%SZ"))
    if len(done) == 1 and age < 900:
        return [("buy", {"symbol": p["symbol"], "price": q["price"]})]
    if len(done) == 1:
        return f"No trade: the {p['symbol']} quote is stale."
    return f"Bought {p['symbol']} at {q['price']}."


def charge(p: dict[str, Any], done: Done) -> Any:
    if not done:
        return [("charge_order", {"order": p["order"]})]
    if "_approved_" in done[0][2]["charge"]:
        return f"Charged order {p['order']}."
    return f"The card for order {p['order']} was declined."


FAMILIES = {
    "email_report": (email_report, ["Email {name} the {report} report", "Send the {report} report to {name} by email",
                                    "Could you mail {name} our {report} report?", "{name} needs the {report} report: email it"]),
    "pay_invoice": (pay_invoice, ["Pay the open invoice of {customer}", "Settle {customer}'s outstanding invoice",
                                  "Please pay {customer}'s latest invoice if it is open", "Clear the invoice {customer} sent us"]),
    "notes": (notes, ["Create the file {file} and write '{line}' in it", "Make a new file {file} containing '{line}'",
                      "Start a file called {file} with the line '{line}'", "Write '{line}' into a new file named {file}"]),
    "balance": (balance, ["What is the balance of the {account} account?", "How much money is in the {account} account?",
                          "Tell me the {account} account balance", "Check the {account} account's balance"]),
    "meeting": (meeting, ["Schedule {title} on {date} and invite {name}", "Set up {title} for {date} and email {name} an invite",
                          "Put {title} in the calendar on {date}, then invite {name}", "Book {title} on {date} and let {name} know"]),
    "trade": (trade, ["Buy one {symbol} share if its quote is fresh", "If the {symbol} quote is current, buy a share",
                      "Get a {symbol} share, but only on a fresh quote", "Check {symbol}'s quote and buy one share if it is fresh"]),
    "charge": (charge, ["Charge the card for order {order}", "Bill order {order} to the card on file",
                        "Take payment for order {order}", "Run the card charge for {order}"]),
    "ticket": (ticket, ["Close ticket {ticket} if it is low priority", "If {ticket} is low priority, close it",
                        "Check ticket {ticket} and close it when its priority is low", "Close {ticket} unless it is high priority"]),
}


def instances() -> list[tuple[str, dict[str, Any]]]:
    """(family, params) of every task."""
    out: list[tuple[str, dict[str, Any]]] = []
    for i, n in enumerate(NAMES):
        out.append(("email_report", {"name": n, "report": ["quarterly", "sales", "audit"][i % 3]}))
    for c in CUSTOMERS:
        out.append(("pay_invoice", {"customer": c}))
    for i in range(9):
        out.append(("notes", {"file": f"notes-{i}.txt", "line": ["buy milk", "call the bank", "renew passport"][i % 3]}))
    for a in ACCOUNTS:
        out.append(("balance", {"account": a}))
    for i in range(9):
        out.append(("meeting", {"title": ["Design review", "Budget sync", "Retro"][i % 3], "date": f"2026-12-{3 + i:02d}",
                                "name": NAMES[(i + 3) % 10]}))
    for i in range(9):
        out.append(("ticket", {"ticket": f"T-{100 + i}"}))
    out += [("trade", {"symbol": sym}) for sym in SYMBOLS] + [("charge", {"order": o}) for o in ORDERS]
    return out


def near_miss(family: str, p: dict[str, Any], k: int) -> dict[str, Any]:
    """``p`` with one entity, date or amount-bearing entity changed."""
    q = dict(p)
    if family == "email_report" or (family == "meeting" and k % 2):
        q["name"] = OTHER_NAMES[k % len(OTHER_NAMES)]
    elif family == "meeting":
        q["date"] = f"2026-12-{int(p['date'][-2:]) + 9:02d}"
    elif family == "pay_invoice":
        q["customer"] = OTHER_CUSTOMERS[CUSTOMERS.index(p["customer"])]
    elif family == "notes":
        q["file"] = p["file"].replace("notes", "todo")
    elif family == "balance":
        q["account"] = OTHER_ACCOUNTS[ACCOUNTS.index(p["account"])]
    elif family == "trade":
        q["symbol"] = OTHER_SYMBOLS[SYMBOLS.index(p["symbol"])]
    elif family == "charge":
        q["order"] = p["order"].replace("O-5", "O-6")
    else:
        q["ticket"] = p["ticket"].replace("T-1", "T-2")
    return q


# -- the scripted model ----------------------------------------------------------------------


@dataclass
class Oracle:
    """Maps a task text to its policy; plays it from the conversation; judges proposed plans."""

    tasks: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    world: World | None = None
    edit: bool = False
    stats: dict[str, int] = field(default_factory=lambda: {"accepted": 0, "rejected": 0, "edited": 0})

    def text(self, family: str, p: dict[str, Any], phrasing: int = 0) -> str:
        t = FAMILIES[family][1][phrasing].format(**p)
        self.tasks[t] = (family, p)
        return t

    def __call__(self, api: str, body: dict[str, Any]) -> Reply:
        msgs = body["messages"]
        user = [m for m in msgs if m["role"] == "user"][-1]["content"]
        task = re.sub(r"^\[[^\]]*\] ", "", user)
        family, p = self.tasks[task]
        policy = FAMILIES[family][0]
        done: Done = []
        calls: dict[str, tuple[str, dict[str, Any]]] = {}
        for m in msgs:
            for c in m.get("tool_calls") or []:
                calls[c["id"]] = (c["function"]["name"], json.loads(c["function"]["arguments"]))
            if m["role"] == "tool":
                name, args = calls[m["tool_call_id"]]
                if m["content"].startswith("error: not run"):
                    continue  # a plan call engrain did not run: the policy asks for it again
                try:
                    done.append((name, args, json.loads(m["content"])))
                except ValueError:
                    raise AssertionError(f"{name}: {m['content']}") from None
        system = msgs[0]["content"]
        if not done and "<plan>" in system:
            plans = [json.loads(x.split("</plan>", 1)[0]) for x in system.split("<plan>")[1:]]
            truth = self.truth(family, p)
            for plan in plans:
                flat = [(c["name"], c["arguments"]) for g in plan for c in g]
                if _norm(flat) == _norm(truth):
                    self.stats["accepted"] += 1
                    return tool_calls(*flat)
            for plan in plans:  # edit the nearest plan that has the task's calls, if asked to
                flat = [(c["name"], c["arguments"]) for g in plan for c in g]
                old = self._planned_params(plan, family)
                if self.edit and old is not None and [n for n, _ in flat] == [n for n, _ in truth]:
                    self.stats["edited"] += 1
                    return tool_calls(*[(n, json.loads(_swap(json.dumps(a), old, p))) for n, a in flat])
            self.stats["rejected"] += 1
        nxt = policy(p, done)
        if isinstance(nxt, str):
            return say(nxt)
        return tool_calls(*nxt)

    def truth(self, family: str, p: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The calls the policy makes for ``p`` in a copy of the current world (ids normalized)."""
        assert self.world is not None
        w = World(self.world.facts, self.world.t0)
        tools = {f.__name__: f for f in w.tools()}
        done: Done = []
        out = []
        policy = FAMILIES[family][0]
        while not isinstance(nxt := policy(p, done), str):
            for name, args in nxt:
                out.append((name, args))
                done.append((name, args, tools[name](**args)))
        return out

    def _planned_params(self, plan: list, family: str) -> dict[str, Any] | None:
        for fam, q in self.tasks.values():
            if fam == family and _norm([(c["name"], c["arguments"]) for g in plan for c in g]) == _norm(
                    self.truth(fam, q)):
                return q
        return None


def _norm(calls: list) -> str:
    return ID.sub("<id>", json.dumps([[n, a] for n, a in calls], sort_keys=True))


def _swap(text: str, old: dict[str, Any], new: dict[str, Any]) -> str:
    for k, v in old.items():
        if new.get(k) != v:
            text = text.replace(str(v), str(new[k]))
    return text


# -- runs --------------------------------------------------------------------------------------


def make_agent(model: ScriptedModel, journal: Any, world: World, exact: bool, embedder: Any = None,
               name: str = "office") -> eg.Agent:
    tools = world.tools()
    kw: dict[str, Any] = {"volatile": {t.__name__: [] for t in tools}} if exact else {}
    return eg.Agent(name, "openai:scripted", "You run an office.", tools, base_url=model.openai_url,
                    journal=journal, cache=True, max_turns=8, embedder=embedder, **kw)


def reference(oracle: Oracle, facts: dict[str, Any], task: str, model: ScriptedModel) -> tuple[list, str]:
    """Effects and answer of ``task`` without the cache, in a world with ``facts``."""
    w = World(facts, time.time())
    oracle.world = w
    j = eg.open(f"sqlite:///{tempfile.mkdtemp(prefix='engrain-ref-')}/r.db")
    a = eg.Agent("ref", "openai:scripted", "You run an office.", w.tools(), base_url=model.openai_url, journal=j,
                 max_turns=8)
    res = a.run(task)
    j.close()
    return w.effects, ID.sub("<id>", str(res.output))


def run_in(oracle: Oracle, model: ScriptedModel, agent_of, facts: dict[str, Any], task: str) -> tuple[list, str, int, dict]:
    w = World(facts, time.time())
    oracle.world = w
    before = model.calls
    events: list[dict] = []
    res = agent_of(w).run(task, on_event=events.append)
    assert res, res.error
    return w.effects, ID.sub("<id>", str(res.output)), model.calls - before, events


def part1(quick: bool) -> None:
    tasks = instances()[: 20 if quick else None]
    print(f"1. repeated tasks on tools with volatile results ({len(tasks)} tasks; the scripted model plays each "
          "task's policy)")
    for exact in (False, True):
        oracle = Oracle()
        texts = [oracle.text(f, p) for f, p in tasks]
        facts = base_facts()
        changed = json.loads(json.dumps(facts))
        for i, (c, inv) in enumerate(changed["invoices"].items()):
            if i % 3 == 0:
                inv["amount"] += 5
            elif i % 3 == 1:
                inv["status"] = "paid"
        for i, n in enumerate(changed["contacts"]):
            if i % 3 == 0:
                changed["contacts"][n] = f"{n.lower()}@newmail.org"
        for i, a in enumerate(changed["balances"]):
            if i % 2 == 0:
                changed["balances"][a] += 10
        for i, t in enumerate(changed["tickets"].values()):
            if i % 3 == 0:
                t["priority"] = "high" if t["priority"] == "low" else "low"
        for i, q in enumerate(changed["quotes"].values()):
            if i % 2 == 0:
                q["lag"] = 7200  # the feed stalled: the same price with an old as_of
        for i, o in enumerate(changed["charges"]):
            if i % 2 == 0:
                changed["charges"][o] = "declined"
        with ScriptedModel(oracle) as model:
            j = eg.open(f"sqlite:///{tempfile.mkdtemp(prefix='engrain-bench-ac-')}/c.db")
            ref_calls = {}
            figures = []
            for label, world_facts in (("first run (fills the cache)", facts), ("again, fresh world", facts),
                                       ("again, facts changed", changed)):
                calls = wrong = hits = 0
                for t in texts:
                    eff, out, n, events = run_in(oracle, model, lambda w: make_agent(model, j, w, exact), world_facts, t)
                    before = model.calls
                    r_eff, r_out = reference(oracle, world_facts, t, model)
                    ref_calls[t] = model.calls - before
                    model.requests[before:] = []
                    calls += n
                    hits += n == 0
                    wrong += (eff, out) != (r_eff, r_out)
                floor = sum(ref_calls.values())
                figures.append((label, calls, floor, hits, wrong))
            j.close()
        mode = "exact comparison (volatile=(), as before)" if exact else "default comparison"
        print(f"   {mode}:")
        for label, calls, floor, hits, wrong in figures:
            print(f"     {label:<30} LLM calls {calls:4d} vs {floor:4d} without the cache "
                  f"({100 * (1 - calls / floor):5.1f}% saved); full hits {hits:3d}/{len(texts)}; wrong replays {wrong}")


def part2(quick: bool) -> None:
    from engrain._memory.embed import default_embedder

    embedder = default_embedder()
    tasks = instances()[: 16 if quick else None]
    print(f"2. reworded tasks: {len(tasks) * 2} pairs (a paraphrase and a near miss of each of {len(tasks)} cached tasks), "
          "packaged embedder (MiniLM), similar_threshold 0.75, up to 3 plans proposed")
    for edit in (False, True):
        oracle = Oracle(edit=edit)
        facts = base_facts()
        with ScriptedModel(oracle) as model:
            j = eg.open(f"sqlite:///{tempfile.mkdtemp(prefix='engrain-bench-ac2-')}/c.db")
            agent_of = lambda w: make_agent(model, j, w, False, embedder)  # noqa: E731
            for f, p in tasks:  # the cached tasks
                run_in(oracle, model, agent_of, facts, oracle.text(f, p, 0))
            rows: dict[str, list[int]] = {"paraphrase": [0] * 6, "near miss": [0] * 6}
            for k, (f, p) in enumerate(tasks):
                for kind, q, phrasing in (("paraphrase", p, 1 + k % 3), ("near miss", near_miss(f, p, k), 0)):
                    t = oracle.text(f, q, phrasing)
                    eff, out, n, events = run_in(oracle, model, agent_of, facts, t)
                    before = model.calls
                    r_eff, r_out = reference(oracle, facts, t, model)
                    floor = model.calls - before
                    model.requests[before:] = []
                    row = rows[kind]
                    row[0] += 1
                    row[1] += n
                    row[2] += floor
                    row[3] += (eff, out) != (r_eff, r_out)
                    row[4] += any(e.get("similar") for e in events if e["type"] == "cache" and "hit" in e)
                    row[5] += any(e.get("plan") == "followed" for e in events if e["type"] == "cache")
            j.close()
        how = "edits near misses" if edit else "rejects wrong plans"
        print(f"   scripted model accepts correct plans and {how} (accepted {oracle.stats['accepted']}, "
              f"rejected {oracle.stats['rejected']}, edited {oracle.stats['edited']}):")
        for kind, (n, calls, floor, wrong, proposed, followed) in rows.items():
            print(f"     {kind:<11} {n:3d} tasks, plans proposed for {proposed:3d}, followed in {followed:3d}: "
                  f"LLM calls per task {calls / n:4.2f} vs {floor / n:4.2f} without the cache; wrong replays {wrong}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", type=int, choices=(1, 2))
    args = ap.parse_args()
    if args.part in (None, 1):
        part1(args.quick)
    if args.part in (None, 2):
        part2(args.quick)


if __name__ == "__main__":
    sys.exit(main())
