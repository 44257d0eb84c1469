"""Learning routines from agent runs: what compiles, what a learned routine gets right, and LLM calls saved.

Six task families of ten tasks each, one intent per family with different
values, over tools written here with an in-memory world per task (banking:
pay a bill, transfer money; calendar: move a meeting; files: archive a file;
messaging: forward the latest message; shopping: order boxes, whose total the
model computes). Some tasks hold a world the learned runs never saw (a bill
already paid, a frozen account, a cancelled meeting, a locked file, a sender
with no messages): there the right outcome differs from the routine's.

The model is the scripted model server (``engrain._agent.scripted``) through
the ``openai`` SDK, playing the ground truth: a per-family policy that reads
the task and the tool results so far and makes the next call. When a learned
routine is offered whose task pattern matches the task, it calls the routine
with the values the pattern reads from the task; on a ``stopped`` result it
goes on by hand from the steps the routine did.

1. **Before learning**: every task done by hand by an ``eg.Agent(learn=True)``
   (the model ignores offered routines). That gives the ground truth (the tool
   calls and the final world of each task), the LLM calls per task, and what
   the agent learned from all its runs: the share of successful runs whose
   routine compiles fully (confirmed), stays a candidate (its shape was seen
   once) or is not compilable (and why).
2. **Learning**: a fresh store learns from each family's first two tasks only
   (``--learn-from N``: the first N).
3. **After learning**: each other task of the family (8 per family) runs on a
   copy of that store (so one task's run teaches nothing to the next) with the
   model calling the routine when it matches. Each is compared with the ground
   truth: **correct** (same tool calls, same world), **wrong** (the routine
   finished and the outcome differs: the target is 0), **stop** (the routine
   stopped at an assert or a failed step and the model finished by hand; the
   final outcome is compared too), or **by hand** (no routine offered/matched).

Usage: python bench/learn.py [--learn-from N]   (N tasks per family to learn from, default 2)
"""

from __future__ import annotations

import copy
import json
import random
import re
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import engrain as eg
from engrain._agent.scripted import Reply, ScriptedModel, say, tool_call
from engrain._journal import open_journal
from engrain._memory.learned import LearnedRoutines

BASE_TOOLS: set[str] = set()
LEARN = int(sys.argv[sys.argv.index("--learn-from") + 1]) if "--learn-from" in sys.argv else 2


# -- the worlds -----------------------------------------------------------------------------------


@dataclass
class World:
    """One task's in-memory world: its data, and every tool call made in it."""

    data: dict[str, Any]
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def log(self, tool: str, /, **args: Any) -> None:
        self.calls.append((tool, args))


def bank_tools(w: World) -> list[Callable[..., Any]]:
    def read_file(path: str) -> dict:
        """Read a bill file: amount, IBAN and payment status."""
        w.log("read_file", path=path)
        return {"path": path, **w.data["bills"][path]}

    def pay(iban: str, amount: float) -> str:
        """Pay an amount to an IBAN."""
        w.log("pay", iban=iban, amount=amount)
        w.data.setdefault("payments", []).append([iban, amount])
        return f"paid {amount} to {iban}"

    def lookup_contact(name: str) -> dict:
        """Find a contact's bank account."""
        w.log("lookup_contact", name=name)
        return {"name": name, **w.data["contacts"][name]}

    def transfer(iban: str, amount: int, currency: str) -> str:
        """Transfer money to an IBAN."""
        w.log("transfer", iban=iban, amount=amount, currency=currency)
        w.data.setdefault("transfers", []).append([iban, amount, currency])
        return "transfer booked"

    def notify(text: str) -> str:
        """Tell the user something."""
        w.log("notify", text=text)
        w.data.setdefault("notes", []).append(text)
        return "sent"

    return [read_file, pay, lookup_contact, transfer, notify]


def calendar_tools(w: World) -> list[Callable[..., Any]]:
    def find_event(person: str) -> dict:
        """Find the next meeting with a person."""
        w.log("find_event", person=person)
        return dict(w.data["events"][person])

    def update_event(event_id: str, day: str, time: str) -> str:
        """Move an event."""
        w.log("update_event", event_id=event_id, day=day, time=time)
        w.data["moved"] = [event_id, day, time]
        return "updated"

    def send_message(to: str, text: str) -> str:
        """Send a message."""
        w.log("send_message", to=to, text=text)
        w.data.setdefault("sent", []).append([to, text])
        return "sent"

    return [find_event, update_event, send_message]


def file_tools(w: World) -> list[Callable[..., Any]]:
    def stat_file(name: str) -> dict:
        """Where a file is and whether it is locked."""
        w.log("stat_file", name=name)
        return dict(w.data["files"][name])

    def copy_file(src: str, dst: str) -> str:
        """Copy a file."""
        w.log("copy_file", src=src, dst=dst)
        w.data.setdefault("copies", []).append([src, dst])
        return "copied"

    def delete_file(path: str) -> str:
        """Delete a file."""
        w.log("delete_file", path=path)
        w.data.setdefault("deleted", []).append(path)
        return "deleted"

    def notify(text: str) -> str:
        """Tell the user something."""
        w.log("notify", text=text)
        return "sent"

    return [stat_file, copy_file, delete_file, notify]


def message_tools(w: World) -> list[Callable[..., Any]]:
    def list_messages(sender: str) -> dict:
        """A sender's messages, newest first."""
        w.log("list_messages", sender=sender)
        return {"sender": sender, "messages": w.data["inbox"].get(sender, [])}

    def forward(message_id: str, to: str) -> str:
        """Forward a message."""
        w.log("forward", message_id=message_id, to=to)
        w.data.setdefault("forwarded", []).append([message_id, to])
        return "forwarded"

    return [list_messages, forward]


def shop_tools(w: World) -> list[Callable[..., Any]]:
    def get_price(item: str) -> dict:
        """The unit price of an item."""
        w.log("get_price", item=item)
        return {"item": item, "unit_price": w.data["prices"][item], "currency": "EUR"}

    def place_order(item: str, qty: int, total: float) -> str:
        """Order items."""
        w.log("place_order", item=item, qty=qty, total=total)
        w.data.setdefault("orders", []).append([item, qty, total])
        return "ordered"

    return [get_price, place_order]


# -- ground-truth policies: the next call from the task and the results so far ------------------------

Done = list[tuple[str, Any]]  # (tool, result) in order


def call(tool: str, /, **args: Any) -> tuple[str, str, dict[str, Any]]:
    return ("call", tool, args)


def answer(text: str) -> tuple[str, str, dict[str, Any]]:
    return ("say", text, {})


def pay_policy(s: dict, done: Done):
    if not done:
        return call("read_file", path=s["file"])
    bill = done[0][1]
    if len(done) == 1:
        if bill["status"] != "unpaid":
            return call("notify", text=f"{s['file']} is already paid")
        return call("pay", iban=bill["iban"], amount=bill["amount"])
    return answer("Done.")


def transfer_policy(s: dict, done: Done):
    if not done:
        return call("lookup_contact", name=s["name"])
    c = done[0][1]
    if len(done) == 1:
        if c["status"] != "active":
            return call("notify", text=f"{s['name']}'s account is {c['status']}")
        return call("transfer", iban=c["iban"], amount=s["amount"], currency="EUR")
    return answer("Done.")


def calendar_policy(s: dict, done: Done):
    if not done:
        return call("find_event", person=s["person"])
    ev = done[0][1]
    if ev["status"] != "confirmed":
        return answer(f"The meeting with {s['person']} was cancelled; nothing to move.")
    if len(done) == 1:
        return call("update_event", event_id=ev["id"], day=s["day"], time=s["time"])
    if len(done) == 2:
        return call("send_message", to=ev["email"], text=f"Hi {s['person']}, I moved our meeting to {s['day']} at {s['time']}.")
    return answer("Moved.")


def file_policy(s: dict, done: Done):
    if not done:
        return call("stat_file", name=s["name"])
    f = done[0][1]
    if f["locked"]:
        if len(done) == 1:
            return call("notify", text=f"{s['name']} is locked")
        return answer("It is locked.")
    if len(done) == 1:
        return call("copy_file", src=f"{f['folder']}/{s['name']}", dst=f"archive/{s['name']}")
    if len(done) == 2:
        return call("delete_file", path=f"{f['folder']}/{s['name']}")
    return answer("Archived.")


def message_policy(s: dict, done: Done):
    if not done:
        return call("list_messages", sender=s["sender"])
    msgs = done[0][1]["messages"]
    if not msgs:
        return answer(f"No messages from {s['sender']}.")
    if len(done) == 1:
        return call("forward", message_id=msgs[0]["id"], to=s["to"])
    return answer("Forwarded.")


def shop_policy(s: dict, done: Done):
    if not done:
        return call("get_price", item=s["item"])
    if len(done) == 1:
        unit = done[0][1]["unit_price"]
        return call("place_order", item=s["item"], qty=s["n"], total=round(unit * s["n"], 2))
    return answer("Ordered.")


# -- the families ---------------------------------------------------------------------------------------


@dataclass
class Family:
    name: str
    tools: Callable[[World], list[Callable[..., Any]]]
    policy: Callable[[dict, Done], Any]
    tasks: list[tuple[str, dict, dict]]  # (task text, spec, world data)


def families(seed: int = 7) -> list[Family]:
    rnd = random.Random(seed)
    months = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct"]
    banks = ["N26", "Sparkasse", "ING"]
    out: list[Family] = []

    tasks = []
    for i, m in enumerate(months):
        path = f"bills/{m}-2026.txt"
        bills = {path: {"amount": round(rnd.uniform(20, 400), 2), "iban": f"DE{rnd.randrange(10**9, 10**10)}",
                        "status": "paid" if i in (4, 8) else "unpaid", "bank": rnd.choice(banks)}}
        tasks.append((f"Pay the bill in {path}", {"file": path}, {"bills": bills}))
    out.append(Family("banking: pay a bill", bank_tools, pay_policy, tasks))

    tasks = []
    names = ["Alice", "Bruno", "Chiara", "Dmitri", "Emeka", "Fatima", "Goran", "Hiroshi", "Ingrid", "Jamal"]
    for i, n in enumerate(names):
        amount = rnd.randrange(20, 900)
        contacts = {n: {"iban": f"DE{rnd.randrange(10**9, 10**10)}", "status": "frozen" if i == 6 else "active",
                        "bank": rnd.choice(banks)}}
        tasks.append((f"Transfer {amount} EUR to {n}", {"name": n, "amount": amount}, {"contacts": contacts}))
    out.append(Family("banking: transfer money", bank_tools, transfer_policy, tasks))

    tasks = []
    days = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
    for i, n in enumerate(names):
        day, tm = rnd.choice(days), f"{rnd.randrange(8, 18)}:{rnd.choice(['00', '30'])}"
        events = {n: {"id": f"ev-{rnd.randrange(1000, 9999)}", "email": f"{n.lower()}@example.org",
                      "status": "cancelled" if i == 5 else "confirmed", "room": rnd.choice(["Blue", "Red"])}}
        tasks.append((f"Move my meeting with {n} to {day} at {tm}", {"person": n, "day": day, "time": tm},
                      {"events": events}))
    out.append(Family("calendar: move a meeting", calendar_tools, calendar_policy, tasks))

    tasks = []
    stems = ["report", "budget", "minutes", "roadmap", "invoice", "contract", "slides", "notes", "draft", "summary"]
    for i, st in enumerate(stems):
        name = f"{st}-{rnd.randrange(10, 99)}.pdf"
        files = {name: {"folder": rnd.choice(["documents", "projects", "shared"]), "size": rnd.randrange(10, 9000),
                        "locked": i == 7}}
        tasks.append((f"Archive the file {name}", {"name": name}, {"files": files}))
    out.append(Family("files: archive a file", file_tools, file_policy, tasks))

    tasks = []
    for i, n in enumerate(names):
        to = f"{rnd.choice(names).lower()}@team.example"
        k = 0 if i == 3 else rnd.randrange(1, 5)
        inbox = {n: [{"id": f"m{rnd.randrange(10**5, 10**6)}", "subject": rnd.choice(["Q3", "lunch", "deploy"])}
                     for _ in range(k)]}
        tasks.append((f"Forward the latest message from {n} to {to}", {"sender": n, "to": to}, {"inbox": inbox}))
    out.append(Family("messaging: forward the latest", message_tools, message_policy, tasks))

    tasks = []
    items = ["paper", "toner", "staples", "folders", "pens", "markers", "tape", "labels", "clips", "envelopes"]
    for it in items:
        n = rnd.randrange(2, 12)
        tasks.append((f"Order {n} boxes of {it}", {"item": it, "n": n}, {"prices": {it: round(rnd.uniform(1, 30), 2)}}))
    out.append(Family("shopping: order boxes (total computed)", shop_tools, shop_policy, tasks))
    return out


# -- the scripted model: plays the policy, calls a matching routine -------------------------------------


def _pattern_inputs(pattern: str, task: str, schema: dict[str, Any]) -> dict[str, Any] | None:
    names = re.findall(r"\{([A-Za-z_]\w*)\}", pattern)
    parts = re.split(r"\{[A-Za-z_]\w*\}", pattern)
    rx = "".join(re.escape(p) + (f"(?P<{n}>.+?)" if i < len(names) else "") for i, (p, n) in
                 enumerate(zip(parts, [*names, ""])))
    m = re.fullmatch(rx, task)
    if m is None:
        return None
    out: dict[str, Any] = {}
    for n in names:
        t = (schema.get("properties") or {}).get(n, {}).get("type")
        v = m.group(n)
        out[n] = int(v) if t == "integer" else float(v) if t == "number" else v
    return out


class Model:
    """The respond() of the scripted model: one policy per task text."""

    def __init__(self) -> None:
        self.by_task: dict[str, tuple[Family, dict]] = {}
        self.use_routines = False

    def __call__(self, api: str, body: dict) -> Reply:
        msgs = body["messages"]
        task = re.sub(r"^\[[^\]]*\] ", "", next(m["content"] for m in msgs if m["role"] == "user"))
        fam, spec = self.by_task[task]
        names: dict[str, str] = {}
        done: Done = []
        used_routine = False
        for m in msgs:
            if m["role"] == "assistant":
                for c in m.get("tool_calls") or []:
                    names[c["id"]] = c["function"]["name"]
            elif m["role"] == "tool":
                name = names[m["tool_call_id"]]
                try:
                    value = json.loads(m["content"])
                except ValueError:
                    value = m["content"]
                if name in BASE_TOOLS:
                    done.append((name, value))
                    continue
                used_routine = True
                if not isinstance(value, dict):
                    continue  # the call was refused (bad inputs): go on by hand
                if value.get("status") == "ok":
                    done += [(r["tool"], r["result"]) for r in value["results"]]
                else:
                    done += [(r["tool"], r["result"]) for r in value.get("done", [])]
        if self.use_routines and not done and not used_routine:
            for t in body.get("tools", []):
                f = t["function"]
                if f["name"] in BASE_TOOLS:
                    continue
                pm = re.search(r"Task pattern: (.*?)\. Calls ", f["description"])
                if pm is None:
                    continue
                inputs = _pattern_inputs(pm.group(1), task, f["parameters"])
                if inputs is None:
                    continue
                first = fam.policy(spec, [])  # a caller input: what the model would write in its first call
                props = f["parameters"].get("properties", {})
                for n in f["parameters"].get("required", []):
                    if n not in inputs and "const" in props.get(n, {}):
                        inputs[n] = props[n]["const"]  # the only value the routine was learned with
                    elif n not in inputs and first[0] == "call" and n in first[2]:
                        inputs[n] = first[2][n]
                return tool_call(f["name"], **inputs)
        kind, what, args = fam.policy(spec, done)
        return tool_call(what, **args) if kind == "call" else say(what)


# -- the measurement ------------------------------------------------------------------------------------


def run_task(model: Model, server: ScriptedModel, url: str, fam: Family, i: int) -> dict[str, Any]:
    text, spec, data = fam.tasks[i]
    world = World(copy.deepcopy(data))
    model.by_task[text] = (fam, spec)
    tools = fam.tools(world)
    BASE_TOOLS.update(t.__name__ for t in tools)
    skill = re.sub(r"\W+", "_", fam.name.split(":")[1].strip())[:40]
    agent = eg.Agent("bench", "openai:scripted", "Do the user's task with the tools.", tools, base_url=server.openai_url,
                     journal=open_journal(url), learn=skill)
    before = server.calls
    res = agent.run(text)
    tool_msgs = []
    for _, body in server.requests[before:]:
        tool_msgs = [m for m in body["messages"] if m["role"] == "tool"]
    routine = [json.loads(m["content"]) for m in tool_msgs if m["content"].startswith('{"status"')]
    return {"ok": bool(res), "llm": server.calls - before, "calls": world.calls, "world": world.data,
            "learned": agent.last_learned, "routine": routine[0] if routine else None}


def copy_store(src: Path, dst: Path) -> None:
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)


def main() -> None:
    fams = families()
    tmp = Path(tempfile.mkdtemp(prefix="engrain-bench-learn-"))
    model = Model()
    t0 = time.time()
    with ScriptedModel(model) as server:
        # 1. every task by hand: ground truth, LLM calls before, and what all those runs teach
        truth: dict[tuple[int, int], dict[str, Any]] = {}
        url1 = f"sqlite:///{tmp / 'all.db'}"
        for fi, fam in enumerate(fams):
            for i in range(len(fam.tasks)):
                truth[fi, i] = run_task(model, server, url1, fam, i)
        store1 = LearnedRoutines(url1)
        runs_ok = sum(r["ok"] for r in truth.values())
        final = {r.id: r for r in store1.list()}
        compiled = Counter(final[t["learned"].routine_id].status for t in truth.values() if t["learned"].routine_id)
        reasons = [f"{r.status.replace('_', ' ')}: {r.skill}: {p['step']} {p['tool']}.{p['arg']}: {p['reason']}"
                   for r in final.values() for p in r.problems]

        # 2. learn from the first LEARN tasks of each family
        url2 = tmp / "learned.db"
        for fi, fam in enumerate(fams):
            for i in range(LEARN):
                run_task(model, server, f"sqlite:///{url2}", fam, i)
        store2 = LearnedRoutines(f"sqlite:///{url2}")
        learned = {r.skill: r for r in store2.list()}

        # 3. the other tasks, each on a copy of the learned store, the model calling a matching routine;
        # 4. the same tasks in order on one store, learning on (a stop the model finishes by hand teaches)
        model.use_routines = True
        rows, seq_rows = [], []
        stops: Counter = Counter()
        for sequential in (False, True):
            seq_db = tmp / "sequential.db"
            copy_store(url2, seq_db)
            for fi, fam in enumerate(fams):
                c: Counter = Counter()
                llm_before = llm_after = 0
                for i in range(LEARN, len(fam.tasks)):
                    db = seq_db if sequential else tmp / f"use-{fi}-{i}.db"
                    if not sequential:
                        copy_store(url2, db)
                    got = run_task(model, server, f"sqlite:///{db}", fam, i)
                    want = truth[fi, i]
                    same = got["ok"] and got["calls"] == want["calls"] and got["world"] == want["world"]
                    llm_before += want["llm"]
                    llm_after += got["llm"]
                    if got["routine"] is None:
                        c["by hand"] += 1
                        c["by hand, WRONG"] += 0 if same else 1
                    elif got["routine"]["status"] == "ok":
                        c["correct" if same else "WRONG"] += 1
                    else:
                        c["stop"] += 1
                        c["stop, then correct by hand" if same else "stop, then WRONG"] += 1
                        if not sequential:
                            stops[f"{fam.name}: {got['routine']['reason']}"] += 1
                skill = re.sub(r"\W+", "_", fam.name.split(":")[1].strip())[:40]
                (seq_rows if sequential else rows).append((fam.name, learned.get(skill), c, llm_before, llm_after,
                                                           len(fam.tasks) - LEARN))
    took = time.time() - t0

    print(f"bench/learn.py: {len(fams)} families x {len(fams[0].tasks)} tasks, scripted model via the openai SDK, "
          f"SQLite, {took:.0f} s")
    print()
    full = compiled["confirmed"] + compiled["candidate"]
    print(f"1. successful runs by hand: {runs_ok}/{len(truth)}; compile fully: {full}/{runs_ok} ({full / max(1, runs_ok):.0%}). "
          "The routine each run's shape induces (all runs of each family):")
    for status in ("confirmed", "candidate", "not_compilable"):
        print(f"   {status:<15} {compiled[status]:>3} runs ({compiled[status] / max(1, runs_ok):.0%})")
    for why in reasons:  # why a routine is not compilable, or stays a candidate (a choice the runs cannot explain)
        print(f"   {why}")
    print()
    bad = 0
    rest = len(fams[0].tasks) - LEARN
    for title, table in ((f"3. learned from the first {LEARN} tasks of each family, each other task ({rest} per family) "
                          "on a copy of that store:", rows),
                         (f"4. the same {rest} tasks in order on one store, learning on:", seq_rows)):
        print(title)
        print(f"   {'family':<40} {'routine':<30} {'status':<15} {'correct':>7} {'WRONG':>5} {'stop':>4} {'hand':>4}"
              f"  LLM calls/task before -> after")
        tot: Counter = Counter()
        for name, r, c, b, a, n in table:
            rname = f"{r.name}({', '.join(r.inputs.get('properties', {}))})" if r else "-"
            print(f"   {name:<40} {rname[:30]:<30} {(r.status if r else '-'):<15} {c['correct']:>7} {c['WRONG']:>5} "
                  f"{c['stop']:>4} {c['by hand']:>4}  {b / n:>6.2f} -> {a / n:.2f}")
            tot.update(c)
            tot["before"] += b
            tot["after"] += a
            tot["n"] += n
        print(f"   {'all':<40} {'':<30} {'':<15} {tot['correct']:>7} {tot['WRONG']:>5} {tot['stop']:>4} "
              f"{tot['by hand']:>4}  {tot['before'] / tot['n']:>6.2f} -> {tot['after'] / tot['n']:.2f}")
        print(f"   after a stop the model finished by hand: {tot['stop, then correct by hand']} correct, "
              f"{tot['stop, then WRONG']} wrong; runs by hand that differed from the ground truth: {tot['by hand, WRONG']}")
        bad += tot["WRONG"] + tot["stop, then WRONG"] + tot["by hand, WRONG"]
        if table is rows:
            for why, k in sorted(stops.items()):
                print(f"   stop x{k}: {why}")
        print()
    print("floor: 2 LLM calls per task with a routine (call it, then answer); peer: none of the agent frameworks "
          "compared in bench/ learns routines from its runs")
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
