"""``engrain demo`` part 1: durable runs.

The agent here is a *scripted demo agent* (``ScriptedTripAgent``): its "LLM"
is a fixed plan, so the tour runs offline and the same way every time. Its
tools sleep briefly, like real I/O, and append one line per execution to an
effects file, so the tour can count what actually ran.

Part 1, durable runs: the agent runs in a child process, which is killed
with SIGKILL partway through; the run is started again with the same run id
and the tour prints, step by step, what was replayed from the journal and
what was executed (again).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import engrain as eg

from .._durable.context import steps_of
from .._journal import Journal, open_journal

#: Seconds each demo tool "works"; long enough for the kill to land mid-run.
TOOL_LATENCY = 0.15
#: The child is killed once this many tool executions are on record.
KILL_AFTER = 3

_effects_path: pathlib.Path | None = None
_phase = "first process"


def _effect(name: str, detail: str) -> None:
    """Record one real execution (what a duplicate charge or e-mail would look like)."""
    if _effects_path is None:
        return
    line = json.dumps({"tool": name, "key": eg.idempotency_key(), "phase": _phase, "detail": detail})
    with open(_effects_path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


demo_tools = eg.ToolRegistry()


@eg.llm(registry=demo_tools)
def plan_trip(task: str) -> dict[str, Any]:
    """Scripted stand-in for an LLM planner: a fixed plan derived from the task."""
    time.sleep(TOOL_LATENCY)
    city = task.rsplit(" to ", 1)[-1].strip(" .") or "Lisbon"
    _effect("plan_trip", city)
    return {"city": city, "nights": 3, "budget": 900}


@eg.tool(registry=demo_tools)
def search_flights(city: str) -> list[dict[str, Any]]:
    """Flights to ``city`` (scripted)."""
    time.sleep(TOOL_LATENCY)
    _effect("search_flights", city)
    return [{"id": f"TP-{len(city) * 101}", "price": 240}, {"id": f"FR-{len(city) * 37}", "price": 310}]


@eg.tool(registry=demo_tools)
def book_flight(flight_id: str) -> str:
    """Book a flight: a side effect that must never happen twice."""
    time.sleep(TOOL_LATENCY)
    _effect("book_flight", flight_id)
    return f"PNR-{flight_id}"


@eg.tool(registry=demo_tools)
def search_hotels(city: str, nights: int) -> list[dict[str, Any]]:
    """Hotels in ``city`` (scripted)."""
    time.sleep(TOOL_LATENCY)
    _effect("search_hotels", city)
    return [{"id": f"H-{city[:3].upper()}-7", "per_night": 95}]


@eg.tool(registry=demo_tools)
def book_hotel(hotel_id: str, nights: int) -> str:
    """Book a hotel: a side effect."""
    time.sleep(TOOL_LATENCY)
    _effect("book_hotel", hotel_id)
    return f"HB-{hotel_id}-{nights}"


@eg.tool(registry=demo_tools)
def charge_card(amount: int) -> str:
    """Charge the card: the side effect nobody wants twice."""
    time.sleep(TOOL_LATENCY)
    _effect("charge_card", str(amount))
    return f"CH-{amount}"


@eg.tool(registry=demo_tools)
def send_email(to: str, body: str) -> bool:
    """Send the confirmation e-mail."""
    time.sleep(TOOL_LATENCY)
    _effect("send_email", to)
    return True


def ScriptedTripAgent(task: str, traveller: str = "ada@example.com") -> dict[str, Any]:
    """The scripted demo agent: plans with the scripted LLM, then calls its tools in order."""
    plan = plan_trip(task)
    booked_at = eg.now().isoformat(timespec="seconds")  # journaled: a resumed run sees the same time
    flight = min(search_flights(plan["city"]), key=lambda f: f["price"])
    pnr = book_flight(flight["id"])
    hotel = search_hotels(plan["city"], plan["nights"])[0]
    booking = book_hotel(hotel["id"], plan["nights"])
    total = flight["price"] + hotel["per_night"] * plan["nights"]
    receipt = charge_card(total)
    send_email(traveller, f"{pnr} {booking} {receipt} at {booked_at}")
    return {"flight": pnr, "hotel": booking, "charge": receipt, "total": total, "booked_at": booked_at}


TASK = "Book a 3-night trip to Lisbon"


def _child(url: str, run_id: str, effects: str) -> int:
    """Entry point of the child process that gets killed."""
    global _effects_path
    _effects_path = pathlib.Path(effects)
    eg.run(ScriptedTripAgent, TASK, run_id=run_id, journal=open_journal(url))
    return 0


def _read_effects(path: pathlib.Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # the kill can cut the last line short
            pass
    return out


def durable_section(journal: Journal, workdir: pathlib.Path, out: Callable[[str], None]) -> bool:
    """Part 1: kill a durable run mid-way, resume it, show what re-executed."""
    global _effects_path, _phase
    run_id = eg.new_run_id()
    effects = workdir / f"effects-{run_id}.jsonl"
    out("1. Durable runs: kill -9 mid-run, then resume")
    out(f"   run {run_id}: {TASK!r} by ScriptedTripAgent (scripted demo agent, 8 steps)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(pathlib.Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen(
        [sys.executable, "-m", "engrain._demo.durable", "--child", journal.url, run_id, str(effects)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
    )
    deadline = time.monotonic() + 60
    try:
        while len(_read_effects(effects)) < KILL_AFTER:
            if child.poll() is not None:
                err = child.stderr.read().decode(errors="replace") if child.stderr else ""
                out(f"   the child process ended before the kill (exit {child.returncode}): {err.strip()[-400:]}")
                return False
            if time.monotonic() > deadline:
                out("   the child process made no progress in 60 s")
                return False
            time.sleep(0.01)
        time.sleep(TOOL_LATENCY / 2)  # land inside the next tool call
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
        if child.stderr:
            child.stderr.close()
    before = steps_of(journal.read(run_id))
    out(f"   killed the child (pid {child.pid}) with SIGKILL after {len(_read_effects(effects))} tool executions")

    _effects_path, _phase = effects, "resume"
    t0 = time.perf_counter()
    try:
        result = eg.run(ScriptedTripAgent, TASK, run_id=run_id, journal=journal)
    finally:
        _effects_path, _phase = None, "first process"
    took = time.perf_counter() - t0

    ran: dict[str, list[str]] = {}
    for e in _read_effects(effects):
        ran.setdefault(e["key"], []).append(e["phase"])
    out("")
    out(f"   {'step':<5}{'name':<16}{'before the kill':<26}after resume")
    for n, rec in sorted(steps_of(journal.read(run_id)).items()):
        old = before.get(n)
        phases = ran.get(f"{run_id}:{n}", [])
        if old is None:
            first = "-"
        elif old.state == "completed":
            first = "executed, journaled"
        else:
            first = "started, cut by the kill"
        if "resume" in phases:
            then = "retried (same idempotency key)" if old is not None else "executed"
        elif rec.name == "engrain.now":
            then = "recorded time replayed" if old is not None else "clock read"
        else:
            then = "replayed from journal"
        out(f"   {n:<5}{rec.name:<16}{first:<26}{then}")
    dup = [k for k, phases in ran.items() if phases.count("first process") and "resume" in phases
           and before.get(int(k.rsplit(':', 1)[1])) is not None and before[int(k.rsplit(':', 1)[1])].state == "completed"]
    out("")
    out(f"   resumed to status {result.status!r} in {took:.2f} s: {result.replayed} steps replayed, "
        f"{result.executed} executed; completed steps executed twice: {len(dup)}")
    out(f"   output: {json.dumps(result.output)}")
    return bool(result) and not dup


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        sys.exit(_child(sys.argv[2], sys.argv[3], sys.argv[4]))
