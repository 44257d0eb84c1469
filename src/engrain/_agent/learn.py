"""An agent that learns routines from its own runs, and offers them back to its model as tools.

**Learn.** After a run of ``eg.Agent(..., learn=True)`` (or ``learn="skill"``)
ends ``ok``, :func:`learn_from_run` reads its tool calls from the journal
(:func:`engrain._routines.induce.agent_trace`), files the run under its shape
in the skill's learned routines (:mod:`engrain._memory.learned`) and induces the
routine again from every run of that shape it holds
(:func:`engrain._routines.induce.induce`): a candidate after one run, confirmed
after two with different tasks, not compilable when an argument has no
explanation. A run in which a learned routine finished teaches nothing new and
is skipped; in a run where one stopped, its child run's tool calls stand in for
it, so a stop the model finished by hand the same way is one more run of the
routine's shape (an assert the runs did not need then drops out). A routine a
human edited, promoted or took back is not re-induced (its runs are still
recorded), so trust never carries over to a version nobody reviewed, and a
routine taken back stays withheld.

**Offer.** At the start of a run, :func:`offer` recalls the skill's confirmed
(or promoted) routines whose source tasks read like the task, as a journaled
step (a resumed run is offered the very same routines; a store that cannot be
read offers none, and the step records why), and makes each an
:class:`~.toolspec.AgentTool` named after the routine, with its input schema
and description. Calling it runs the routine as a durable child run
(``<run_id>:<step>:routine``, tagged ``learned``), through the agent's own
tools, with its ``assert`` steps and no UDF outside the sandbox. A failed step
or assert returns ``status: "stopped"`` with the steps done, their results and
the reason, and the model goes on by hand. An offer holds the routine as it was
offered: when the model calls it, the store is read again (:func:`withdrawn`)
and a routine deleted, taken back, no longer confirmed or edited since does not
run; the model is told why and goes on by hand.
"""

from __future__ import annotations

import hashlib
import pathlib
import re
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._durable.context import RunContext, idempotency_key
from .._journal import Journal
from .._memory.learned import LearnedRoutines as _Store
from .toolspec import AgentTool

#: Name of the journaled step that records which routines a run was offered.
OFFER_STEP = "agent.routines.offer"
MAX_OFFERED = 3

_stores: dict[str, Any] = {}
_lock = threading.Lock()
_tmp_root: list[pathlib.Path] = []


@dataclass(slots=True)
class LearnReport:
    """What learning from one run did: ``action`` is ``created``, ``updated``, ``recorded`` or ``skipped``."""

    run_id: str
    action: str
    reason: str = ""
    routine: str | None = None
    routine_id: str | None = None
    status: str | None = None
    runs: int = 0
    problems: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "action": self.action, "reason": self.reason, "routine": self.routine,
                "routine_id": self.routine_id, "status": self.status, "runs": self.runs, "problems": self.problems}


def store_for(agent: Any, journal: Journal) -> Any:
    """The learned routines on the agent's memory store (one per store URL and process)."""
    mem = agent._memory_for(journal)
    with _lock:
        s = _stores.get(id(mem))
        if s is None or s.memory is not mem:
            s = _stores[id(mem)] = LearnedRoutines(mem)
        return s


def learn_from_run(agent: Any, journal: Journal, run_id: str) -> LearnReport:
    """Learn from the finished run ``run_id`` of ``agent`` (see the module docstring).

    Another process learning from a run of the same shape at the same time makes
    the save fail; it is redone from what that process saved (up to 5 times).
    """
    from .._memory.learned import LearnedRoutineChangedError

    for attempt in range(5):
        try:
            return _learn_once(agent, journal, run_id)
        except LearnedRoutineChangedError:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


def _learn_once(agent: Any, journal: Journal, run_id: str) -> LearnReport:
    from .._memory.learned import MAX_EVIDENCE, LearnedRoutine
    from .._routines.agent_trace import AgentTrace, TraceTooLarge, agent_trace, shape_of
    from .._routines.induce import induce

    events = journal.read(run_id)
    if not events or events[-1].kind != "run.completed":
        return LearnReport(run_id, "skipped", "the run did not end ok")
    offered = {o["tool"] for e in events if e.name == OFFER_STEP and e.kind == "step.completed"
               for o in ((e.data.get("result") or {}).get("routines") or [])}
    try:
        trace = agent_trace(run_id, events, offered, journal.read)
    except TraceTooLarge as e:
        return LearnReport(run_id, "skipped", str(e))
    if trace.used:
        return LearnReport(run_id, "skipped", f"the run called learned routine {trace.used}, which finished")
    if not trace.calls:
        return LearnReport(run_id, "skipped", "the run called no tool")
    store = store_for(agent, journal)
    skill = agent.learn
    shape = shape_of(trace)
    have = store.by_shape(skill, shape)
    if have is not None and run_id in have.runs:
        return LearnReport(run_id, "recorded", "this run was learned before", have.name, have.id, have.status,
                           len(have.runs), have.problems)
    evidence = [*(AgentTrace.from_dict(d) for d in (have.evidence if have else [])), trace]
    if have is not None and (have.edited or have.trusted or have.demoted):  # what a human wrote or judged stands
        have.runs = [*have.runs, run_id][-MAX_EVIDENCE:]
        have.tasks = list(dict.fromkeys([*have.tasks, trace.task]))[-MAX_EVIDENCE:]
        have.evidence = [t.to_dict() for t in evidence]
        store.save(have)
        why = "edited" if have.edited else "promoted" if have.trusted else "taken back"
        return LearnReport(run_id, "recorded", f"the routine was {why} by a human: it is not re-induced",
                           have.name, have.id, have.status, len(have.runs))
    kept = evidence[-MAX_EVIDENCE:]
    if have is None:
        done = induce(kept, taken=store.names(skill) | set(agent.tools))
        r = LearnedRoutine(store.new_id(), skill, done.name, shape, done.status, done.routine)
    else:
        done = induce(kept, name=have.name)
        r = have
        r.status, r.routine = done.status, {**done.routine, "trusted": have.trusted}
    r.tasks = list(dict.fromkeys(t.task for t in kept))
    r.runs = [*r.runs, run_id][-len(kept):] if have is not None else [run_id]
    r.evidence = [t.to_dict() for t in kept]
    r.problems = [p.to_dict() for p in [*done.problems, *done.doubts]]  # a doubt keeps it a candidate
    r.explained, r.pattern = done.explained, done.pattern
    store.save(r)
    return LearnReport(run_id, "created" if have is None else "updated", "", r.name, r.id, r.status, len(kept),
                       r.problems)


# -- offering routines to the model -----------------------------------------------------------


def offer(agent: Any, ctx: RunContext, task: str) -> dict[str, AgentTool]:
    """The learned routines offered for ``task``, as agent tools (a journaled step: replays offer the same)."""
    journal = ctx.journal

    def recall() -> dict[str, Any]:
        out: list[dict[str, Any]] = []
        taken = set(agent.tools)
        try:
            found = store_for(agent, journal).match(agent.learn, task, top_k=4 * MAX_OFFERED)
        except Exception as e:  # noqa: BLE001 - no routine offered beats a failed run: the model works by hand
            return {"routines": [], "error": f"{type(e).__name__}: {e}"}
        for score, r in found:
            if not set(r.routine.get("tools") or {}) <= set(agent.tools):
                continue  # learned by an agent with other tools: this one could not run it
            if len(out) == MAX_OFFERED:
                break
            name = r.name if r.name not in taken else f"routine_{r.name}"
            taken.add(name)
            out.append({"tool": name, "id": r.id, "name": r.name, "score": round(score, 4), "routine": r.routine})
        return {"routines": out, "error": None}

    # Not flushed on its own: only the model call uses it, and that step's flush carries it to disk.
    offered = ctx.call(OFFER_STEP, "tool", {"skill": agent.learn}, recall, durable=False)
    return {o["tool"]: _as_tool(agent, journal, o) for o in offered["routines"]}


def _as_tool(agent: Any, journal: Journal, offered: dict[str, Any]) -> AgentTool:
    routine = offered["routine"]
    schema = routine.get("inputs") or {"type": "object", "properties": {}}

    def call(**inputs: Any) -> dict[str, Any]:
        return run_offered(agent, journal, offered, inputs)

    return AgentTool(offered["tool"], call, str(routine.get("description", ""))[:1024], schema)


def _package(routine: dict[str, Any]) -> pathlib.Path:
    """The routine written as a package folder named by its content (written once, read by the runner)."""
    import yaml

    from .._disk_cache import cache_dir

    text = yaml.safe_dump(routine, sort_keys=False, allow_unicode=True, width=100)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]
    root = cache_dir("learned")
    if root is None:  # no private cache directory here: one of our own for this process
        with _lock:
            if not _tmp_root:
                _tmp_root.append(pathlib.Path(tempfile.mkdtemp(prefix="engrain-learned-")))
        root = _tmp_root[0]
    # the name may come back from the journal (a resumed offer): it names the folder, never a path
    stem = re.sub(r"[^A-Za-z0-9_]", "_", str(routine.get("name") or "routine"))[:48]
    folder = root / f"{stem}-{digest}"
    target = folder / "routine.yaml"
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".routine.yaml.{threading.get_ident()}"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(target)  # atomic: a concurrent reader sees the whole file or none
    return folder


def withdrawn(agent: Any, journal: Journal, offered: dict[str, Any]) -> str | None:
    """Why the routine offered as ``offered`` may no longer run, or None when it still may.

    Read at call time: a human may have deleted, taken back or edited it since the offer was
    made (earlier in the run, or before a crash the run resumed from). A store that cannot
    be read withholds it too: running a routine nobody can vouch for is what this prevents.
    """
    from .._memory.learned import LearnedRoutineNotFoundError

    try:
        now = store_for(agent, journal).get(str(offered.get("id") or ""))
    except LearnedRoutineNotFoundError:
        return "it was deleted"
    except Exception as e:  # noqa: BLE001 - the reason goes to the model, which works by hand
        return f"its review state could not be read ({type(e).__name__}: {e})"
    if now.skill != agent.learn:
        return f"it belongs to skill {now.skill!r}, not {agent.learn!r}"
    if now.demoted:
        return "a human took it back"
    if not now.offerable():
        return f"it is no longer confirmed (status {now.status})"
    then = {k: v for k, v in offered["routine"].items() if k != "trusted"}
    if {k: v for k, v in now.routine.items() if k != "trusted"} != then:
        return "it was changed (edited or learned again); the next task is offered the new version"
    return None


def run_offered(agent: Any, journal: Journal, offered: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    """Run an offered routine as a durable child run; a stop returns what was done and why."""
    from .._routines.runner import run_routine

    from .._routines.learned_check import LEARNED_STEP_TYPES

    from .._durable.context import new_run_id

    key = idempotency_key()  # the tool step's run_id:N: a resumed parent resumes the same child
    child = f"{key}:routine" if key else new_run_id()
    odd = [s.get("id") for s in offered["routine"].get("steps") or [] if s.get("type") not in LEARNED_STEP_TYPES]
    if odd:  # a learned routine is tool calls, asserts and a return; the journal cannot make it more
        return {"status": "stopped", "routine": offered["name"], "run_id": None, "stopped_at": odd[0],
                "reason": f"step type not allowed in a learned routine: {odd[0]}", "done": [],
                "next": "The routine did not run. Do the task by hand."}
    why = withdrawn(agent, journal, offered)
    if why is not None:
        # A resumed run may have started the child before the crash: what it did is the model's to know.
        done = _done_steps(journal, child) if key else []
        return {"status": "stopped", "routine": offered["name"], "run_id": child if done else None, "stopped_at": None,
                "reason": f"the routine was withdrawn since it was offered: {why}", "done": done,
                "next": ("The routine stopped before finishing; the steps in 'done' happened. Continue the task by hand."
                         if done else "The routine did not run. Do the task by hand.")}
    # the agent's tools the routine declares, no others: what an offer was checked against is all it can call
    declared = offered["routine"].get("tools")
    registry = {name: _routine_tool(name, t) for name, t in agent.tools.items()
                if isinstance(declared, dict) and name in declared}
    # No UDF of a learned routine runs outside the sandbox, whatever the routine says.
    res = run_routine(_package(offered["routine"]), inputs, tools=registry, run_id=child, journal=journal,
                      sandbox=True)
    stopped = res.status != "ok"
    try:
        store_for(agent, journal).note_use(offered["id"], stopped)
    except Exception:  # noqa: BLE001 - a counter must not turn a done routine into a failed call
        pass
    if not stopped:
        return {"status": "ok", "routine": offered["name"], "run_id": child, "results": res.output}
    return {
        "status": "stopped",
        "routine": offered["name"],
        "run_id": child,
        "stopped_at": res.step_id,
        "reason": f"{res.error_type}: {res.message}" if res.error_type else (res.error or res.status),
        "done": _done_steps(journal, child),
        "next": "The routine stopped before finishing; the steps in 'done' happened. Continue the task by hand.",
    }


def _routine_tool(name: str, tool: Any) -> Callable[..., Any]:
    """The agent's tool as a learned routine calls it, keeping its step policy (at_most_once, retries)."""

    def call(**kw: Any) -> Any:
        return tool.invoke(kw)

    # The routine runner reads a tool's policy from here, as it does for an @engrain.tool.
    call.__engrain_step__ = {"name": name, "type": "tool", "policy": tool.policy}  # type: ignore[attr-defined]
    return call


def _done_steps(journal: Journal, run_id: str) -> list[dict[str, Any]]:
    from .._durable.steps import steps_of

    return [{"tool": s.name, "args": s.args, "result": s.result}
            for s in steps_of(journal.read(run_id)).values() if s.state == "completed" and s.type == "tool"]


# -- human review (the CLI and the HTTP API share these) ---------------------------------------


class LearnedRoutines(_Store):
    """The routines agents learned, for review: ``list``, ``get``, ``edit``, ``promote``, ``delete``.

    ``engrain.LearnedRoutines()`` opens the default store (or a URL, or an
    :class:`engrain.Memory`). ``edit`` takes ``routine.yaml`` text or data and
    refuses (:class:`~engrain.MemoryInputError`, every problem listed) a
    routine that is not a valid package or holds anything but tool calls,
    asserts and its return; ``promote`` sets ``trusted: true`` (``trusted=False``
    takes it back).
    """

    def edit(self, ref: str, routine: dict[str, Any] | str, skill: str | None = None) -> Any:
        """Replace learned routine ``ref`` with a human's version, checked first; it is then never re-induced."""
        from .._errors import MemoryInputError
        from .._routines.learned_check import check_learned, parse_edit

        try:
            data = parse_edit(routine) if isinstance(routine, str) else routine
        except ValueError as e:
            raise MemoryInputError(str(e)) from None
        r = self.get(ref, skill)
        # steps may call only the tools the routine declares: the offer checks those against the agent's
        declared = set(data.get("tools") or {}) if isinstance(data, dict) and isinstance(data.get("tools"), dict) else set()
        problems = check_learned({**data, "name": r.name} if isinstance(data, dict) else data, declared)
        if problems:
            raise MemoryInputError(f"learned routine {r.name!r}: the edit is refused: " + "; ".join(problems))
        return self.replace(r.id, data)
