"""Semantic matching never replays blind: near-miss and paraphrase task pairs with the real MiniLM embedder.

Every pair is two realistic tasks: a *near miss* differs in one entity, date
or amount (the other task's trajectory would be a wrong replay), a
*paraphrase* says the same task in other words. The first task is recorded,
then the second is run. The cache may replay only an exact match (the same
parameterized template with values re-bound from ``params``); a semantic
match hands the agent the similar trajectory as a suggested plan
(``Continuation.plan``) which the scripted agent checks call by call.

Figures (printed with ``-s``): true hits, wrong replays (must be 0), plans
suggested, and how many suggested plans the agent could confirm as they were.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from engrain import Continuation, Engine

# Each domain: two phrasings (a paraphrase pair), the tool and how its arguments come from the slots.
DOMAINS = {
    "lunch": (
        ["Book lunch with {who} on {date} at {time}", "Schedule a lunch meeting with {who} for {date} at {time}"],
        "create_event", lambda v: {"title": "Lunch", "attendee": v["who"], "date": v["date"], "time": v["time"]},
    ),
    "pay": (
        ["Send ${amount} to {who} for {reason}", "Transfer {amount} dollars to {who} to cover {reason}"],
        "transfer", lambda v: {"to": v["who"], "amount": v["amount"], "memo": v["reason"]},
    ),
    "flight": (
        ["Book a flight from {origin} to {dest} on {date}", "Find and book me a plane ticket {origin} to {dest} departing {date}"],
        "book_flight", lambda v: {"origin": v["origin"], "dest": v["dest"], "date": v["date"]},
    ),
    "email": (
        ["Email {who} the {doc} report", "Send the {doc} report to {who} by email"],
        "send_email", lambda v: {"to": v["who"], "subject": f"{v['doc']} report"},
    ),
    "order": (
        ["Order {qty} boxes of {item}", "Place an order for {qty} boxes of {item}"],
        "place_order", lambda v: {"item": v["item"], "qty": v["qty"]},
    ),
    "remind": (
        ["Remind me to call {who} on {date}", "Set a reminder on {date} to phone {who}"],
        "create_reminder", lambda v: {"text": f"Call {v['who']}", "date": v["date"]},
    ),
    "table": (
        ["Reserve a table for {size} at {place} on {date}", "Get us a table for {size} people at {place} on {date}"],
        "reserve", lambda v: {"restaurant": v["place"], "party": v["size"], "date": v["date"]},
    ),
    "invoice": (
        ["Create an invoice for {company} for ${amount}", "Bill {company} ${amount} with a new invoice"],
        "create_invoice", lambda v: {"customer": v["company"], "amount": v["amount"]},
    ),
}

# Base values, and near-miss alternatives for one slot (look-alike names, adjacent dates, close amounts).
BASE = {
    "lunch": {"who": "Sarah Baker", "date": "2026-03-04", "time": "12:30"},
    "pay": {"who": "John Smith", "amount": 120, "reason": "the concert tickets"},
    "flight": {"origin": "Boston", "dest": "Denver", "date": "2026-05-12"},
    "email": {"who": "Maria Garcia", "doc": "quarterly sales"},
    "order": {"qty": 12, "item": "printer paper"},
    "remind": {"who": "Dr. Patel", "date": "2026-06-01"},
    "table": {"size": 4, "place": "Luigi's Trattoria", "date": "2026-07-19"},
    "invoice": {"company": "Acme Corp", "amount": 4500},
}
NEAR = {
    "who": ["Sarah Becker", "Sara Baker", "John Smyth", "Jon Smith", "Mario Garcia", "Maria Gracia", "Dr. Patil", "Dr. Pate"],
    "date": ["2026-03-05", "2026-04-04", "2026-05-13", "2026-05-21", "2026-06-02", "2026-07-18", "2027-03-04"],
    "time": ["12:00", "13:30", "11:30"],
    "amount": [125, 1200, 12, 4600, 450, 4500.5],
    "reason": ["the theater tickets", "the concert parking"],
    "origin": ["Austin", "Bostonia"],
    "dest": ["Dallas", "Denver West"],
    "doc": ["quarterly marketing", "annual sales"],
    "qty": [2, 120, 13],
    "item": ["printer toner", "copy paper"],
    "size": [5, 14, 2],
    "place": ["Luigi's Pizzeria", "Mario's Trattoria"],
    "company": ["Acme Corporation", "Apex Corp", "Acme Co"],
}


@dataclass
class Pair:
    domain: str
    kind: str  # "near" or "paraphrase"
    first: tuple[str, dict]
    second: tuple[str, dict]
    slot: str | None = None


def pairs() -> list[Pair]:
    out = []
    for domain, (phrasings, _, _) in DOMAINS.items():
        base = BASE[domain]
        for slot in base:
            alts = [a for a in NEAR.get(slot, []) if type(a) in (type(base[slot]), float if isinstance(base[slot], int) else str)]
            for alt in alts:
                if alt == base[slot]:
                    continue
                other = {**base, slot: alt}
                for phrasing in phrasings:
                    out.append(Pair(domain, "near", (phrasing, base), (phrasing, other), slot))
        out.append(Pair(domain, "paraphrase", (phrasings[0], base), (phrasings[1], base)))
        out.append(Pair(domain, "paraphrase", (phrasings[1], base), (phrasings[0], base)))
    return out


def _text(phrasing: str, values: dict) -> str:
    return phrasing.format(**values)


@dataclass
class Tally:
    pairs: int = 0
    true_hits: int = 0
    wrong_replays: int = 0
    suggested: int = 0
    plan_confirmed: int = 0
    plan_edited: int = 0
    effects: list = field(default_factory=list)
    missed: list = field(default_factory=list)


def build(embedder, url: str, tally: Tally, threshold: float = 0.9) -> tuple[Engine, dict]:
    engine = Engine(url=url, embedder=embedder, durability="off", semantic_threshold=threshold)
    truth: dict = {}

    def make(tool_name: str):
        def tool(data: dict):
            tally.effects.append((tool_name, data))
            return "ok"

        tool.__name__ = tool_name
        return engine.function(name=tool_name)(tool)

    tools = {name: make(name) for _, name, _ in DOMAINS.values()}

    def agent(task: str, continuation: Continuation | None = None) -> str:
        """A scripted agent that always knows the right call for a task; it checks a suggested plan against it."""
        name, args = truth[task]
        if continuation is not None and continuation.plan:
            tally.suggested += 1
            step = continuation.plan[0]
            if (step.name, step.args) == (name, {"data": args}):
                tally.plan_confirmed += 1
            else:
                tally.plan_edited += 1
        tools[name](args)
        return "done"

    engine.set_agent(agent).finalize()
    return engine, truth


@pytest.mark.parametrize("with_params", [False, True], ids=["text-only", "params"])
def test_near_misses_and_paraphrases_never_replay_a_wrong_call(embedder, tmp_path, with_params):
    all_pairs = pairs()
    near = [p for p in all_pairs if p.kind == "near"]
    assert len(near) >= 100 and len(all_pairs) - len(near) >= 16
    tally = Tally()
    engine, truth = build(embedder, f"sqlite:///{tmp_path / 'sem.db'}", tally)
    n = itertools.count()
    for p in all_pairs:
        tags = [f"pair-{next(n)}"]
        calls = []
        for phrasing, values in (p.first, p.second):
            domain = DOMAINS[p.domain]
            task = _text(phrasing, values)
            truth[task] = (domain[1], domain[2](values))
            calls.append((task, values))
        (t1, v1), (t2, v2) = calls
        params1 = dict(v1) if with_params else None
        params2 = dict(v2) if with_params else None
        first = engine(t1, tags=tags, params=params1)
        assert not first and first.stored
        tally.effects.clear()
        second = engine(t2, tags=tags, params=params2)
        tally.pairs += 1
        expected = [truth[t2]]
        if second.hit:
            tally.true_hits += tally.effects == expected
        elif p.kind == "near":
            tally.missed.append((t1, t2, second.reason))
        wrong = tally.effects != expected
        tally.wrong_replays += wrong
        assert not wrong, f"{p.kind} pair {t1!r} -> {t2!r} ran {tally.effects}, expected {expected}"
    print(
        f"\n[{'params' if with_params else 'text-only'}] pairs={tally.pairs} near-miss={len(near)} "
        f"true hits={tally.true_hits} wrong replays={tally.wrong_replays} plans suggested={tally.suggested} "
        f"(confirmed as is {tally.plan_confirmed}, edited {tally.plan_edited})"
    )
    assert tally.wrong_replays == 0
    if with_params:
        # Same template, values re-bound from the new task: every near miss of one slot is a correct hit,
        # except where the value changes type (4500 -> 4500.5 formats differently): those miss.
        retyped = [p for p in near if type(p.second[1][p.slot]) is not type(p.first[1][p.slot])]
        assert tally.true_hits == len(near) - len(retyped) and len(tally.missed) == len(retyped), tally.missed
        assert tally.plan_edited == 0  # a suggested paraphrase plan, re-bound from params, is the right call
    else:
        assert tally.true_hits == 0  # nothing replays without an exact match
        assert tally.suggested > 0 and tally.plan_edited > 0  # similar tasks were offered, and their plans corrected


def test_a_semantic_match_suggests_a_plan_and_runs_nothing(embedder, tmp_path):
    tally = Tally()
    engine, truth = build(embedder, f"sqlite:///{tmp_path / 'one.db'}", tally, threshold=0.5)
    a = "Book lunch with Sarah Baker on 2026-03-04 at 12:30"
    b = "Book lunch with Sarah Becker on 2026-03-04 at 12:30"
    for t, who in ((a, "Sarah Baker"), (b, "Sarah Becker")):
        truth[t] = ("create_event", {"title": "Lunch", "attendee": who, "date": "2026-03-04", "time": "12:30"})
    assert not engine(a)
    tally.effects.clear()
    out = engine(b)
    assert not out and out.agent_called and "similar task is suggested" in out.reason
    assert tally.suggested == 1 and tally.plan_edited == 1
    assert tally.effects == [("create_event", {"title": "Lunch", "attendee": "Sarah Becker", "date": "2026-03-04", "time": "12:30"})]
    assert engine.stats()["suggested"] == 1
