"""One ``engine(task)`` call: look up cached trajectories, replay one, switch or hand off.

:class:`Session` holds what a call has done so far. The lookup (a journaled
step, so a resumed call makes the same choice) keeps the candidates whose
first pre-check passes now. Replay runs each step through the durable run,
checking its pre- and post-check. When a pre-check fails at step ``i``, the
replay switches to another candidate that did the same first ``i`` steps and
whose step ``i`` fits the environment; when none does, the call diverges: the
agent gets a :class:`Continuation`, and its calls that repeat done steps are
answered from them instead of running again.
"""

from __future__ import annotations

import contextvars
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import _events as ev
from ._cache_store import Entry, canonical_task, key
from ._checks import Check, decode_snapshot
from ._durable import RunContext

if TYPE_CHECKING:
    from ._cache import Engine


@dataclass(frozen=True, slots=True)
class StepDone:
    """A tool call that already ran in this engine call."""

    name: str
    args: dict[str, Any]
    result: Any


@dataclass(slots=True)
class Continuation:
    """What a diverged replay hands the agent: the steps already done, and why replay stopped."""

    task: str
    diverged_at: int
    reason: str
    steps: list[StepDone]
    entry_id: str


@dataclass(slots=True)
class ToolSpec:
    """An engine tool: the undecorated function and its checks."""

    name: str
    fn: Callable[..., Any]
    is_method: bool
    pre: Check | None
    post: Check | None
    is_async: bool
    bind: Callable[[tuple, dict], dict[str, Any]]


class Diverged(Exception):
    """A check failed during replay at step ``at``."""

    def __init__(self, at: int, reason: str, phase: str = "pre"):
        super().__init__(reason)
        self.at, self.reason, self.phase = at, reason, phase


_PARAM_RE = re.compile(r"\{\{ params\.(\w+) \}\}")
_param_names: dict[str, frozenset[str]] = {}


def param_names(e: Entry) -> frozenset[str]:
    """The ``params`` an entry's templates need (cached: entries never change)."""
    names = _param_names.get(e.id)
    if names is None:
        text = json.dumps([s["args"] for s in e.steps if s.get("templated")] + [e.output])
        names = _param_names[e.id] = frozenset(_PARAM_RE.findall(text))
    return names


def render_args(step: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """A recorded step's arguments for this call (placeholders filled from ``params``)."""
    if not step.get("templated"):
        return step["args"]
    from ._template import render

    return render(step["args"], {"params": params})


@dataclass
class Session:
    """The state of one ``engine(task)`` call while its run executes."""

    engine: Engine
    task: str
    params: dict[str, Any]
    tags: list[str]
    ctx: RunContext | None = None
    trajectory: list[dict[str, Any]] = field(default_factory=list)
    done: list[StepDone] = field(default_factory=list)
    used: set[int] = field(default_factory=set)
    steps: list[dict[str, Any]] = field(default_factory=list)
    alternatives: list[str] = field(default_factory=list)
    hit: bool = False
    agent_called: bool = False
    reason: str = ""
    entry_id: str | None = None
    stored: str | None = None

    # -- lookup -----------------------------------------------------------------

    def call_args(self, spec: ToolSpec) -> list[Any]:
        """``[self]`` for a method tool (the engine's context object), else nothing."""
        if spec.is_method:
            from ._errors import CacheError

            if self.engine._context is None:
                raise CacheError(f"replaying the method tool {spec.name!r} needs engine.set_context(obj)")
            return [self.engine._context]
        return []

    def _pre_passes(self, e: Entry, i: int, seen: dict[str, Any]) -> bool:
        """Whether step ``i`` of ``e`` passes its pre-check now (captures shared within one lookup)."""
        step = e.steps[i]
        spec = self.engine._specs.get(step["name"])
        if spec is None:
            return False
        if spec.pre is None or step.get("pre") is None:
            return True
        args = render_args(step, self.params)
        k = json.dumps([spec.name, args], sort_keys=True, default=str)
        if k not in seen:
            seen[k] = spec.pre.capture(*self.call_args(spec), **args)
        return spec.pre.passes(seen[k], decode_snapshot(step["pre"], seen[k]))

    def lookup(self) -> dict[str, Any]:
        """Choose an entry: the best candidate whose first pre-check passes now."""
        eng, store = self.engine, self.engine.store
        store.bump("lookups")
        canon = canonical_task(self.task, self.params)
        cands = store.candidates(key(canon, self.tags), eng.max_candidates)
        how = "exact"
        if not cands and eng.embedder is not None:
            cands, how = eng._semantic(canon, self.tags), "semantic"
        if not cands:
            return {"entry": None, "alternatives": [], "reason": "miss: no cached trajectory for this task and tags"}
        seen: dict[str, Any] = {}
        fit = [e for e in cands if param_names(e) <= self.params.keys()]
        for n, e in enumerate(fit):
            if self._pre_passes(e, 0, seen):
                return {
                    "entry": e.id, "alternatives": [a.id for a in fit[n + 1 :]],
                    "reason": f"hit ({how} match, {e.successes} successes)",
                }
        return {"entry": None, "alternatives": [], "reason": f"miss: pre-checks failed for all {len(cands)} cached trajectories"}

    def begin(self) -> Entry | None:
        """Run the journaled lookup; the entry to replay, or ``None`` on a miss."""
        ctx = self.ctx
        assert ctx is not None
        choice = ctx.call("engrain.cache.lookup", "cache", {"task": canonical_task(self.task, self.params), "tags": self.tags},
                          self.lookup)
        self.reason = choice["reason"]
        self.alternatives = list(choice.get("alternatives", []))
        store = self.engine.store
        entry = store.cached(choice["entry"]) if choice["entry"] else None
        if choice["entry"] and entry is None:
            self.reason = "miss: the chosen entry was evicted"
        if entry is None:
            store.bump("misses")
            return None
        self.entry_id = entry.id
        ctx.append(ev.REPLAY_STARTED, entry.id, {"entry": entry.id, "task": entry.task, "steps": len(entry.steps)})
        return entry

    # -- replay -----------------------------------------------------------------

    def prepare(self, i: int, step: dict[str, Any]) -> tuple[ToolSpec, list[Any], dict[str, Any], Any]:
        """Check step ``i`` before it runs (not step 0, which the lookup checked); what to call."""
        spec = self.engine._specs.get(step["name"])
        if spec is None:
            raise Diverged(i, f"step {i} calls {step['name']!r}, which this engine has no tool for")
        args = render_args(step, self.params)
        call = self.call_args(spec)
        pre = step.get("pre")
        replaying = self.ctx is not None and self.ctx.steps.get(self.ctx.cursor) is not None
        if spec.pre is not None and pre is not None and i > 0 and not replaying:
            snap = spec.pre.capture(*call, **args)
            if not spec.pre.passes(snap, decode_snapshot(pre, snap)):
                raise Diverged(i, f"pre-check of step {i} ({spec.name}) failed")
            pre = (snap, f"tool {spec.name!r} pre_check")  # encoded only if this trajectory gets stored
        return spec, call, args, pre

    def finish(self, i: int, step: dict[str, Any], spec: ToolSpec, call: list[Any], args: dict[str, Any], pre: Any, result: Any) -> None:
        """Record step ``i`` as done and run its post-check."""
        self.done.append(StepDone(spec.name, args, result))
        self.used.add(len(self.done) - 1)
        self.steps.append({"name": spec.name, "args": args, "result": result, "source": "replayed"})
        post = step.get("post")
        ok = True
        if spec.post is not None and post is not None:
            snap = spec.post.capture(*call, **args)
            ok = spec.post.passes(snap, decode_snapshot(post, snap))
            post = (snap, f"tool {spec.name!r} post_check")
        self.trajectory.append({"name": spec.name, "args": args, "result": result, "pre": pre, "post": post})
        if not ok:
            raise Diverged(i + 1, f"post-check of step {i} ({spec.name}) failed", "post")

    def switch(self, entry: Entry, d: Diverged) -> Entry | None:
        """Another candidate that did the steps done so far and whose next step fits now, if any."""
        if d.phase != "pre":
            return None
        seen: dict[str, Any] = {}
        store = self.engine.store
        for alt_id in self.alternatives:
            alt = store.cached(alt_id)
            if alt is None or len(alt.steps) <= d.at:
                continue
            same = all(
                alt.steps[j]["name"] == self.done[j].name and render_args(alt.steps[j], self.params) == self.done[j].args
                for j in range(d.at)
            )
            if same and self._pre_passes(alt, d.at, seen):
                self.alternatives.remove(alt_id)
                store.bump("switched")
                store.record_divergence(entry.id, self.engine.evict_after)
                if self.ctx is not None:
                    self.ctx.append(ev.CHECK_FAILED, entry.id, {"call_id": self.ctx.cursor, "phase": "pre", "detail": d.reason})
                self.entry_id = alt.id
                self.reason = f"hit after switching from {entry.id} to {alt.id} at step {d.at} ({d.reason})"
                return alt
        return None

    def diverge(self, entry: Entry, d: Diverged) -> Continuation:
        """Journal the divergence, count it, and build the agent's continuation."""
        self.reason = f"diverged: {d.reason}"
        if self.ctx is not None:
            call_id = self.ctx.cursor - (d.phase == "post")
            self.ctx.append(ev.CHECK_FAILED, entry.id, {"call_id": call_id, "phase": d.phase, "detail": d.reason})
            self.ctx.append(ev.REPLAY_DIVERGED, entry.id, {"at": d.at, "reason": d.reason, "entry": entry.id})
        store = self.engine.store
        store.bump("diverged")
        store.record_divergence(entry.id, self.engine.evict_after)
        self.used.clear()  # the agent may now repeat done steps: they are answered, not run again
        return Continuation(self.task, d.at, d.reason, list(self.done), entry.id)

    def output(self, entry: Entry) -> Any:
        """The replayed call's output: a step's result, a template over params, or the recorded value."""
        self.hit = True
        store = self.engine.store
        store.record_hit(entry.id)
        store.bump("hits")
        spec = entry.output
        if "step" in spec:
            return self.done[spec["step"]].result
        if "template" in spec:
            from ._template import render

            return render(spec["template"], {"params": self.params})
        return spec.get("value")

    def replay(self, entry: Entry) -> tuple[bool, Any]:
        """Replay ``entry`` (switching candidates if needed): ``(True, output)``, or ``(False, continuation)``."""
        start = 0
        while True:
            try:
                for i in range(start, len(entry.steps)):
                    step = entry.steps[i]
                    spec, call, args, pre = self.prepare(i, step)
                    result = self.ctx.call(spec.name, "tool", args, lambda: spec.fn(*call, **args))  # type: ignore[union-attr]
                    self.finish(i, step, spec, call, args, pre, result)
                return True, self.output(entry)
            except Diverged as d:
                alt = self.switch(entry, d)
                if alt is None:
                    return False, self.diverge(entry, d)
                entry, start = alt, d.at

    async def areplay(self, entry: Entry) -> tuple[bool, Any]:
        """Async :meth:`replay` (async tools are awaited)."""
        start = 0
        while True:
            try:
                for i in range(start, len(entry.steps)):
                    step = entry.steps[i]
                    spec, call, args, pre = self.prepare(i, step)
                    thunk = lambda: spec.fn(*call, **args)  # noqa: E731
                    if spec.is_async:
                        result = await self.ctx.acall(spec.name, "tool", args, thunk)  # type: ignore[union-attr]
                    else:
                        result = self.ctx.call(spec.name, "tool", args, thunk)  # type: ignore[union-attr]
                    self.finish(i, step, spec, call, args, pre, result)
                return True, self.output(entry)
            except Diverged as d:
                alt = self.switch(entry, d)
                if alt is None:
                    return False, self.diverge(entry, d)
                entry, start = alt, d.at

    # -- the agent's side ---------------------------------------------------------

    def reuse(self, spec: ToolSpec, args_d: dict[str, Any]) -> StepDone | None:
        """After a divergence: the done step this agent call repeats, if any (answered, not run again)."""
        for i, d in enumerate(self.done):
            if i not in self.used and d.name == spec.name and d.args == args_d:
                self.used.add(i)
                self.steps.append({"name": d.name, "args": d.args, "result": d.result, "source": "continued"})
                return d
        return None


current_session: contextvars.ContextVar[Session | None] = contextvars.ContextVar("engrain_cache_session", default=None)
