"""An agent run as induction reads it: the task, and each tool call that succeeded with its model turn.

:func:`agent_trace` folds a finished agent run's journal events into an
:class:`AgentTrace`; :func:`shape_of` says which runs are induced together
(:mod:`.induce`). The agent's own steps (``agent.*``, ``engrain.*``) and failed
tool calls are left out; a learned routine that stopped is replaced by the
tool calls of its child run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Step names of the agent's own machinery: never part of what a routine does.
INTERNAL_PREFIXES = ("agent.", "engrain.")
MAX_TRACE_CHARS = 256 * 1024  # a run whose calls and results are bigger is not learned


class TraceTooLarge(ValueError):
    """A run whose tool calls and results are too big to keep as evidence."""


@dataclass(slots=True)
class ToolCall:
    """One successful tool call of an agent run: ``turn`` is the model reply (0-based) that asked for it."""

    name: str
    args: dict[str, Any]
    result: Any
    turn: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "args": self.args, "result": self.result, "turn": self.turn}


@dataclass(slots=True)
class AgentTrace:
    """What induction needs of one finished agent run."""

    run_id: str
    task: str
    calls: list[ToolCall]
    dropped: int = 0  # failed tool calls left out (the model retried or gave up on them)
    used: str | None = None  # a learned routine the run called and that finished

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "task": self.task, "calls": [c.to_dict() for c in self.calls],
                "dropped": self.dropped}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AgentTrace:
        return cls(str(d["run_id"]), str(d["task"]), [ToolCall(c["name"], c["args"], c["result"], int(c["turn"]))
                                                      for c in d["calls"]], int(d.get("dropped", 0)))


def agent_trace(run_id: str, events: list[Any], routines: set[str] | frozenset[str] = frozenset(),
                read: Callable[[str], list[Any]] | None = None) -> AgentTrace:
    """The :class:`AgentTrace` of a finished agent run's journal events (``_events.Event`` objects).

    ``routines`` are the learned routines the run was offered. A call of one
    that finished leaves ``used`` set (such a run teaches nothing new). A call
    that stopped is replaced by the tool calls its child run made (``read``
    gives a run's events), one turn each, as the model would have made them by
    hand; the calls the model made after it follow, so a stop followed by the
    same steps by hand is one more run of the routine's shape.
    """
    task, turn, shift, calls, dropped, used = "", -1, 0, [], 0, None
    for e in events:
        d = e.data if isinstance(e.data, dict) else {}
        if e.kind == "run.started":
            task = str(d.get("task", ""))
        elif e.kind in ("step.completed", "step.failed") and "args" in d:
            if d.get("type") == "llm":
                turn += 1
            elif d.get("type") == "tool" and not e.name.startswith(INTERNAL_PREFIXES):
                if e.kind == "step.failed":
                    dropped += 1
                elif e.name in routines:
                    out = d.get("result") if isinstance(d.get("result"), dict) else {}
                    if out.get("status") != "stopped" or read is None:
                        used = e.name
                        continue
                    child = [ToolCall(c.name, c.data.get("args") or {}, c.data.get("result"), max(turn, 0) + shift + i)
                             for i, c in enumerate(x for x in read(str(out.get("run_id"))) if x.kind == "step.completed"
                                                   and (x.data or {}).get("type") == "tool")]
                    calls += child
                    shift += max(len(child) - 1, 0)
                else:
                    calls.append(ToolCall(e.name, d.get("args") or {}, d.get("result"), max(turn, 0) + shift))
    trace = AgentTrace(run_id, task, calls, dropped, used)
    if len(json.dumps(trace.to_dict(), default=str)) > MAX_TRACE_CHARS:
        raise TraceTooLarge(f"run {run_id}: its tool calls and results exceed {MAX_TRACE_CHARS} characters")
    return trace


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """The scalar leaves of an argument value (an empty list or dict is a leaf), in order."""
    if isinstance(value, dict) and value:
        return [x for k, v in value.items() for x in _leaves(v, (*path, k))]
    if isinstance(value, list) and value:
        return [x for i, v in enumerate(value) for x in _leaves(v, (*path, i))]
    return [(path, value)]


def shape_of(trace: AgentTrace) -> str:
    """Runs with the same shape are induced together: the same tools, turns and argument structure."""
    parts = [(c.turn, c.name, [list(p) for p, _ in _leaves(c.args)]) for c in trace.calls]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]
