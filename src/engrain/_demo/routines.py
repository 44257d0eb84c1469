"""``engrain demo``, part 3: compile a finished run into a routine and run it without the agent.

``ScriptedExpenseAgent`` is a *scripted demo agent*: its two "LLM" calls are
scripted stand-ins that sleep like a real model and are counted. It fetches a
team's expenses through a tool (the data is inline, so the tour runs from an
installed package), has the "LLM" categorize them, totals them with a UDF,
asks a human to approve, has the "LLM" write a memo and files the report
through a second tool. Its finished run is exported as a trace, compiled into
a routine package under the demo folder, validated, and run again with no
agent at all: the compiled UDFs replay what the LLM and the UDFs answered, the
tools run for real, and a ``prompt.user`` step pauses the run until answered.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import time
from collections.abc import Callable
from typing import Any

import engrain as eg

from .._durable.context import steps_of
from .._journal import Journal

#: Seconds a scripted "LLM" call takes.
LLM_LATENCY = 0.2
TASK = "expense report"
INPUTS = {"team": "platform", "month": "2025-03"}
#: The recorded human answer, and the one given when the routine's run is resumed.
RECORDED_ANSWER = {"approved": True, "approver": "Ada Lovelace"}
RESUME_ANSWER = {"approved": True, "approver": "Grace Hopper"}

_EXPENSES = {
    ("platform", "2025-03"): [
        {"id": "E-101", "what": "GPU hours for the nightly evals", "amount": 412},
        {"id": "E-102", "what": "Conference ticket, PyCon", "amount": 650},
        {"id": "E-103", "what": "Team lunch after the launch", "amount": 96},
        {"id": "E-104", "what": "Object storage for backups", "amount": 58},
    ],
}
_CATEGORIES = {"GPU": "compute", "storage": "compute", "Conference": "travel", "lunch": "food"}


class _Office:
    """What the tools touch: the filed reports and the count of LLM calls."""

    def __init__(self) -> None:
        self.filed: list[dict[str, Any]] = []
        self.llm_calls = 0
        self.tool_calls = 0


def build(office: _Office) -> tuple[eg.ToolRegistry, Callable[..., dict[str, Any]]]:
    """The tool registry the routine calls, and the scripted agent that recorded the trace."""
    tools = eg.ToolRegistry()

    @eg.tool(registry=tools)
    def fetch_expenses(team: str, month: str) -> list[dict[str, Any]]:
        """The team's expenses of the month (inline demo data)."""
        office.tool_calls += 1
        return [dict(e) for e in _EXPENSES.get((team, month), [])]

    @eg.llm(registry=tools)
    def categorize(expenses: list[dict[str, Any]]) -> dict[str, str]:
        """Scripted stand-in for an LLM: a category per expense id."""
        office.llm_calls += 1
        time.sleep(LLM_LATENCY)
        return {e["id"]: next((c for k, c in _CATEGORIES.items() if k in e["what"]), "other") for e in expenses}

    @eg.tool(type="udf", registry=tools)
    def totals(expenses: list[dict[str, Any]], categories: dict[str, str]) -> dict[str, Any]:
        """The total and the amount per category."""
        by: dict[str, int] = {}
        for e in expenses:
            by[categories[e["id"]]] = by.get(categories[e["id"]], 0) + e["amount"]
        return {"total": sum(by.values()), "by_category": dict(sorted(by.items()))}

    @eg.llm(registry=tools)
    def write_memo(team: str, month: str, summary: dict[str, Any]) -> str:
        """Scripted stand-in for an LLM: a one-line memo."""
        office.llm_calls += 1
        time.sleep(LLM_LATENCY)
        parts = ", ".join(f"{k} {v}" for k, v in summary["by_category"].items())
        return f"Team {team} spent {summary['total']} EUR in {month} ({parts})."

    @eg.tool(registry=tools)
    def file_report(team: str, memo: str, approver: str) -> str:
        """File the report: a side effect, so the routine must really run it."""
        office.tool_calls += 1
        office.filed.append({"team": team, "memo": memo, "approver": approver})
        return f"RPT-{team}-{len(office.filed)}"

    def ScriptedExpenseAgent(task: str, team: str, month: str) -> dict[str, Any]:
        expenses = fetch_expenses(team, month)
        summary = totals(expenses, categorize(expenses))
        answer = eg.ask(
            f"{len(expenses)} expenses of team {team} in {month}, {summary['total']} EUR. File the report?",
            [{"name": "approved", "type": "boolean"}, {"name": "approver", "type": "text"}],
        )
        if not answer.get("approved"):
            raise RuntimeError("the report was not approved")
        report = file_report(team, write_memo(team, month, summary), answer["approver"])
        return {"report": report, "total": summary["total"], "filed_by": answer["approver"]}

    return tools, ScriptedExpenseAgent


def _kinds(journal: Journal, run_id: str) -> dict[str, int]:
    """Journaled steps of a run by type (tool, udf, llm, input)."""
    out: dict[str, int] = {}
    for s in steps_of(journal.read(run_id)).values():
        out[s.type] = out.get(s.type, 0) + 1
    return out


def _what(step: Any, udf_kinds: dict[str, str]) -> str:
    spec = step.spec
    if step.type == "tool.call":
        return f"{spec['tool']:<20}calls the tool for real"
    if step.type == "udf.call":
        fn = spec["function"]
        return f"{fn:<20}replays the recorded {'LLM answer' if udf_kinds.get(fn) == 'llm' else 'result'}"
    if step.type == "prompt.user":
        names = ", ".join(f["name"] for f in spec["fields"])
        return f"{names:<20}asks a human (recorded answers are the defaults)"
    if step.type == "assert":
        return f"{spec['expr']:<20}stops the run unless approved"
    return f"{'':<20}the output, templated from the steps"


def routines_section(journal: Journal, workdir: pathlib.Path, out: Callable[[str], None]) -> bool:
    """Part 3: record a run, compile it, validate it, run it with no LLM, pause at a prompt and resume."""
    from .._durable.trace import export_run

    office = _Office()
    tools, agent = build(office)
    out("3. Routines: compile a finished run into a package, then run it with no agent and no LLM")

    t0 = time.perf_counter()
    first = eg.run(agent, TASK, inputs=INPUTS, journal=journal)
    if first.status != "needs_input":
        out(f"   the recorded run ended {first.status!r} instead of asking for approval: {first.error}")
        return False
    eg.answer(first.run_id, RECORDED_ANSWER, journal=journal)
    done = eg.run(agent, TASK, run_id=first.run_id, inputs=INPUTS, journal=journal)
    took = time.perf_counter() - t0
    if not done:
        out(f"   the recorded run ended {done.status!r}: {done.error}")
        return False
    out(f"   recorded run {done.run_id}: {TASK!r} by ScriptedExpenseAgent (scripted demo agent): "
        f"{office.llm_calls} LLM calls, paused once for approval, {took:.2f} s")
    recorded_llm = office.llm_calls

    trace = export_run(journal, done.run_id)
    target = workdir / "routines" / "expense-report"
    shutil.rmtree(target, ignore_errors=True)  # the package is the demo's own, rebuilt each time
    path = eg.compile_trace(trace, target)
    issues = eg.validate_routine(path, tools=tools)
    routine = eg.load_routine(path)
    files = ", ".join(sorted(p.name for p in path.iterdir() if p.is_file()))
    out(f"   compiled its trace to {path}/ ({files}); validated: {len(issues)} issues")
    udf_kinds = {s.name: s.type for s in steps_of(journal.read(done.run_id)).values()}
    for step in routine.steps:
        out(f"   {step.id:<7}{step.type:<13}{_what(step, udf_kinds)}")
    for issue in issues:
        out(f"   issue: {issue}")
    prompt_id = next(s.id for s in routine.steps if s.type == "prompt.user")

    out("")
    out(f"   {'routine run':<38}{'status':<13}{'steps':<7}{'LLM calls':<11}{'tools run':<11}time")
    ok = not issues

    def timed(label: str, call: Callable[[], eg.RunResult]) -> eg.RunResult:
        llm, tool, t = office.llm_calls, office.tool_calls, time.perf_counter()
        result = call()
        ms = (time.perf_counter() - t) * 1000
        steps = sum(_kinds(journal, result.run_id).values())
        out(f"   {label:<38}{result.status:<13}{steps:<7}{office.llm_calls - llm:<11}{office.tool_calls - tool:<11}{ms:.1f} ms")
        return result

    given = timed("answers given up front", lambda: eg.run_routine(
        path, INPUTS, tools=tools, journal=journal, answers={prompt_id: RECORDED_ANSWER}))
    ok = ok and bool(given) and (given.output or {}).get("total") == done.output["total"]
    paused = timed("no answers: pauses at the prompt", lambda: eg.run_routine(path, INPUTS, tools=tools, journal=journal))
    if paused.status != "needs_input":
        out(f"   expected the run to pause at {prompt_id}: {paused.error}")
        return False
    resumed = timed(f"resumed with {RESUME_ANSWER['approver']}'s answers",
                    lambda: eg.resume_routine(paused.run_id, RESUME_ANSWER, tools=tools, journal=journal))
    ok = ok and (paused.prompt or {}).get("step") == prompt_id and bool(resumed)
    ok = ok and (resumed.output or {}).get("filed_by") == RESUME_ANSWER["approver"] and office.llm_calls == recorded_llm

    out("   (steps: journaled steps of the run; the assert and the return are evaluated, not journaled)")
    out("")
    out(f"   prompt at {prompt_id}: {(paused.prompt or {}).get('prompt')!r}")
    out(f"   answers on resume: {json.dumps(RESUME_ANSWER)}; the resume replayed {resumed.replayed} steps "
        f"from the journal and executed {resumed.executed}")
    out(f"   output of the resumed run: {json.dumps(resumed.output)}")
    out(f"   reports filed: {len(office.filed)} (the agent's, then one per finished routine run); "
        f"LLM calls by the routine: {office.llm_calls - recorded_llm}")
    return ok
