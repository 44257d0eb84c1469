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
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .. import _events as ev
from .._durable.context import RunContext
from .._routines.template import render
from .checks import Check, decode_snapshot
from .metrics import Metrics
from .binding import json_type, text_of
from .binding import entry_key, shape_key
from .store import CacheStore, Entry, canonical_task, task_key


@dataclass(frozen=True, slots=True)
class StepDone:
    """A tool call that already ran in this engine call."""

    name: str
    args: dict[str, Any]
    result: Any


@dataclass(frozen=True, slots=True)
class SuggestedStep:
    """A tool call of a similar task's trajectory, offered to the agent and never run by the cache."""

    name: str
    args: dict[str, Any]


@dataclass(slots=True)
class Continuation:
    """What the agent gets when the cache cannot finish a task alone.

    After a diverged replay: the steps already done (``steps``), where and why
    replay stopped. After a semantic match (a similar task, not this one):
    nothing done (``diverged_at == 0``) and ``plan``, the similar task's tool
    calls as a suggestion for the agent to confirm or edit call by call; the
    cache never runs them itself, since a similar text may differ in the one
    entity, date or amount that matters.
    """

    task: str
    diverged_at: int
    reason: str
    steps: list[StepDone]
    entry_id: str
    plan: list[SuggestedStep] = field(default_factory=list)
    similar_task: str | None = None


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
    pre_where: str = ""
    post_where: str = ""
    split: Callable[[dict[str, Any]], tuple[tuple[Any, ...], dict[str, Any]]] | None = None

    def __post_init__(self) -> None:
        # Where a snapshot that is not JSON is reported (built once, not per step).
        self.pre_where = f"tool {self.name!r} pre_check"
        self.post_where = f"tool {self.name!r} post_check"
        self.split = _splitter(self.fn)

    def arguments(self, args: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The recorded ``{name: value}`` arguments as a call's ``(*args, **kwargs)``."""
        return ((), args) if self.split is None else self.split(args)


def _splitter(fn: Callable[..., Any]) -> Callable[[dict[str, Any]], tuple[tuple[Any, ...], dict[str, Any]]] | None:
    """``None`` for a plain signature (record == keywords); else how to rebuild ``*args``/``**kwargs``/positional-only."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params):
        return None
    if params and params[0].name in ("self", "cls"):
        params = params[1:]

    def split(args: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        pos: list[Any] = []
        kw: dict[str, Any] = {}
        for p in params:
            if p.name not in args:
                continue
            v = args[p.name]
            if p.kind is p.VAR_POSITIONAL:
                pos.extend(v)
            elif p.kind is p.VAR_KEYWORD:
                kw.update(v)
            elif p.kind is p.POSITIONAL_ONLY or (p.kind is p.POSITIONAL_OR_KEYWORD and any(q.kind is q.VAR_POSITIONAL for q in params)):
                pos.append(v)
            else:
                kw[p.name] = v
        return tuple(pos), kw

    return split


class Diverged(Exception):
    """A check failed during replay at step ``at``."""

    def __init__(self, at: int, reason: str, phase: str = "pre"):
        super().__init__(reason)
        self.at, self.reason, self.phase = at, reason, phase


_PARAM_RE = re.compile(r"\{\{ params\.(\w+) \}\}")
_WHOLE_RE = re.compile(r"\{\{ params\.\w+ \}\}")
_param_names: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
_UNSET: Any = object()


def _strings(x: Any) -> list[str]:
    if isinstance(x, str):
        return [x]
    if isinstance(x, dict):
        return [s for v in x.values() for s in _strings(v)]
    if isinstance(x, list):
        return [s for v in x for s in _strings(v)]
    return []


def param_names(e: Entry) -> tuple[frozenset[str], frozenset[str]]:
    """The ``params`` an entry's templates need, and those of them it puts inside text (cached: entries never change)."""
    names = _param_names.get(e.id)
    if names is None:
        if len(_param_names) >= 65536:  # evicted entries leave ids behind: keep the memo bounded
            _param_names.clear()
        texts = _strings([s["args"] for s in e.steps if s.get("templated")] + [e.output.get("template")])
        inline = {n for t in texts if not _WHOLE_RE.fullmatch(t) for n in _PARAM_RE.findall(t)}
        names = _param_names[e.id] = (frozenset(n for t in texts for n in _PARAM_RE.findall(t)), frozenset(inline))
    return names


def fits(e: Entry, params: dict[str, Any]) -> bool:
    """Whether ``params`` can fill ``e``'s templates: every name given, and text-bound ones as the same text Python's str() gives."""
    names, inline = param_names(e)
    if not names <= params.keys() or not all(text_of(params[n]) is not None for n in inline):
        return False
    types = e.output.get("param_types")
    return types is None or all(json_type(params[n]) == types.get(n) for n in names)


def _decoded(stored: dict[str, Any] | None) -> Any:
    # A plain JSON snapshot decodes to the same value whatever the fresh one is,
    # so it is decoded once; a dataclass or model one needs the fresh type each time.
    if stored is None or "dataclass" in stored or "model" in stored or stored.get("tagged"):
        return _UNSET
    return stored.get("value")


def _expected(stored: dict[str, Any] | None, decoded: Any, snap: Any) -> Any:
    """The recorded snapshot to compare the fresh ``snap`` with: decoded once when it can be (see :func:`_decoded`)."""
    return decode_snapshot(stored, snap) if decoded is _UNSET else decoded  # type: ignore[arg-type]


def _seen_key(name: str, args: Any) -> str:
    return json.dumps([name, args], sort_keys=True, default=str)


@dataclass(frozen=True, slots=True)
class PlannedStep:
    """Step ``i`` of an entry resolved against the engine's tools (once per entry: entries never change).

    ``pre``/``post`` are the stored snapshots; ``check_pre``/``check_post``
    say whether this engine's tool has the check to run against them.
    """

    i: int
    name: str
    spec: ToolSpec | None
    args: dict[str, Any]
    templated: bool
    pre: dict[str, Any] | None
    post: dict[str, Any] | None
    check_pre: bool
    check_post: bool
    pre_value: Any
    post_value: Any
    seen_key: str | None  # the capture-sharing key of untemplated arguments

    @staticmethod
    def of(i: int, step: dict[str, Any], spec: ToolSpec | None) -> PlannedStep:
        templated = bool(step.get("templated"))
        pre, post = step.get("pre"), step.get("post")
        return PlannedStep(
            i, step["name"], spec, step["args"], templated, pre, post,
            spec is not None and spec.pre is not None and pre is not None,
            spec is not None and spec.post is not None and post is not None,
            _decoded(pre), _decoded(post), None if templated else _seen_key(step["name"], step["args"]),
        )

    def render(self, params: dict[str, Any]) -> dict[str, Any]:
        """The arguments for this call (placeholders filled from ``params``)."""
        if not self.templated:
            return self.args
        return render(self.args, {"params": params})


class Engine(Protocol):
    """What a replay uses of its :class:`~engrain._cache.engine.Engine`.

    Declared here, not imported, so the engine module (which starts sessions)
    and this one (which runs them) do not import each other.
    """

    store: CacheStore
    evict_after: int
    metrics: Metrics
    _plans: dict[str, tuple[PlannedStep, ...]]
    _specs: dict[str, ToolSpec]
    _context: Any

    def set_context(self, obj: Any) -> Any: ...


def plan(engine: Engine, e: Entry) -> tuple[PlannedStep, ...]:
    """The planned steps of ``e`` for ``engine`` (memoized per engine; cleared when a tool is added)."""
    plans = engine._plans
    p = plans.get(e.id)
    if p is None:
        if len(plans) >= 4096:  # evicted entries leave plans behind: keep the memo bounded
            plans.clear()
        specs = engine._specs
        p = plans[e.id] = tuple(PlannedStep.of(i, s, specs.get(s["name"])) for i, s in enumerate(e.steps))
    return p


_NO_ARGS: tuple[Any, ...] = ()
_FILTER_CAPTURE, _FILTER_COMPARE = ("filter", "capture"), ("filter", "compare")
_PRE_CAPTURE, _PRE_COMPARE = ("runtime", "precheck", "capture"), ("runtime", "precheck", "compare")
_POST_CAPTURE, _POST_COMPARE = ("runtime", "postcheck", "capture"), ("runtime", "postcheck", "compare")


@dataclass(slots=True)
class Session:
    """The state of one ``engine(task)`` call while its run executes.

    ``done`` holds ``(name, args, result)`` of the steps replayed so far (made
    :class:`StepDone` only for the agent's :class:`Continuation`).
    """

    engine: Engine
    task: str
    params: dict[str, Any]
    tags: list[str]
    ctx: RunContext | None = None
    trajectory: list[dict[str, Any]] = field(default_factory=list)
    done: list[tuple[str, dict[str, Any], Any]] = field(default_factory=list)
    used: set[int] = field(default_factory=set)
    steps: list[dict[str, Any]] = field(default_factory=list)
    alternatives: list[str] = field(default_factory=list)
    hit: bool = False
    agent_called: bool = False
    reason: str = ""
    entry_id: str | None = None
    stored: str | None = None
    canon: str = ""
    agent_args: tuple[Any, ...] = ()
    agent_kwargs: dict[str, Any] = field(default_factory=dict)
    first_pre: Any = None  # (snapshot, where) of the chosen entry's first pre-check, taken at lookup
    suggest: str | None = None  # a semantically similar entry whose plan the agent is offered
    shape: str = ""  # the shape key of a call with params (see binding.shape_key)

    # -- lookup -----------------------------------------------------------------

    def call_args(self, spec: ToolSpec) -> tuple[Any, ...]:
        """``(self,)`` for a method tool (the engine's context object), else nothing."""
        if spec.is_method:
            from .._errors import CacheError

            if self.engine._context is None:
                raise CacheError(f"replaying the method tool {spec.name!r} needs engine.set_context(obj)")
            return (self.engine._context,)
        return _NO_ARGS

    def _pre_passes(self, st: PlannedStep, seen: dict[str, Any] | None, first: bool = False) -> bool:
        """Whether ``st`` passes its pre-check now (captures shared within one lookup through ``seen``)."""
        spec = st.spec
        if spec is None:
            return False
        if not st.check_pre:
            return True
        pre = spec.pre
        assert pre is not None
        args = st.render(self.params)
        m = self.engine.metrics
        capture = pre.capture if not m.enabled else functools.partial(m.timed, _FILTER_CAPTURE, pre.capture)
        if seen is None:
            pos, kw = spec.arguments(args)
            snap = capture(*self.call_args(spec), *pos, **kw)
        else:
            k = st.seen_key or _seen_key(st.name, args)
            if k in seen:
                snap = seen[k]
            else:
                pos, kw = spec.arguments(args)
                snap = seen[k] = capture(*self.call_args(spec), *pos, **kw)
        expected = _expected(st.pre, st.pre_value, snap)
        ok = pre.passes(snap, expected) if not m.enabled else m.timed(_FILTER_COMPARE, pre.passes, snap, expected)
        if ok and first:
            self.first_pre = (snap, spec.pre_where)
        return ok

    def lookup(self) -> dict[str, Any]:
        """Choose an entry: the best candidate whose first pre-check passes now."""
        eng, store = self.engine, self.engine.store
        store.bump("lookups")
        canon = self.canon or canonical_task(self.task, self.params)
        cands = eng.metrics.timed(("query",), self._candidates, canon)
        how = "exact"
        if not cands and eng.embedder is not None:
            similar = eng._semantic(canon, self.tags)
            if similar:
                # Never replayed: a similar text is not the same task (see Continuation.plan).
                return {
                    "entry": None, "alternatives": [], "suggest": similar[0].id,
                    "reason": f"miss: no exact match; the trajectory of a similar task is suggested to the agent ({similar[0].task!r})",
                }
        if not cands:
            return {"entry": None, "alternatives": [], "reason": "miss: no cached trajectory for this task and tags"}
        fit = [e for e in cands if fits(e, self.params)]
        if not fit:
            return {"entry": None, "alternatives": [], "reason": "miss: the cached trajectories need params of other names or types"}
        # Captures are shared only when several candidates may ask for the same one.
        seen: dict[str, Any] | None = {} if len(fit) > 1 else None
        for n, e in enumerate(fit):
            steps = plan(eng, e)
            if not steps or self._pre_passes(steps[0], seen, first=True):
                return {
                    "entry": e.id, "alternatives": [a.id for a in fit[n + 1 :]],
                    "reason": f"hit ({how} match, {e.successes} successes)",
                }
        return {"entry": None, "alternatives": [], "reason": f"miss: pre-checks failed for all {len(cands)} cached trajectories"}

    def _candidates(self, canon: str) -> list[Entry]:
        """Entries filed under this call's key (for a call with params: under each pinned-name set of its shape)."""
        eng, store = self.engine, self.engine.store
        if self.params:
            shape = self.shape or shape_key(self.task, self.tags, self.params)[1]
            cands = []
            for fresh in (False, True):
                for pinned in store.pinsets(shape, fresh=fresh):
                    if set(pinned) <= self.params.keys():
                        cands += store.candidates(entry_key(shape, self.params, pinned), eng.max_candidates)
                if cands:
                    break  # else another process may have filed this shape under new pinned names: read them again
            cands.sort(key=lambda e: (-e.successes, -e.last_used))
            del cands[eng.max_candidates :]
            return cands
        return store.candidates(task_key(canon, self.tags), eng.max_candidates)

    def begin(self) -> Entry | None:
        """Run the journaled lookup; the entry to replay, or ``None`` on a miss."""
        ctx = self.ctx
        assert ctx is not None
        if self.params:
            self.canon, self.shape = shape_key(self.task, self.tags, self.params)
        else:
            self.canon = canonical_task(self.task, self.params)
        choice = ctx.call("engrain.cache.lookup", "cache", {"task": self.canon, "tags": self.tags}, self.lookup)
        self.reason = choice["reason"]
        self.alternatives = list(choice.get("alternatives", []))
        self.suggest = choice.get("suggest")
        store = self.engine.store
        entry = store.cached(choice["entry"]) if choice["entry"] else None
        if choice["entry"] and entry is None:
            self.reason = "miss: the chosen entry was evicted"
        if entry is None:
            store.bump("misses")
            return None
        self.entry_id = entry.id
        # Not fsynced on its own (a journal with durability="full"): the next durable append covers it.
        ctx.append(ev.REPLAY_STARTED, entry.id, {"entry": entry.id, "task": entry.task, "steps": len(entry.steps)}, durable=False)
        return entry

    # -- replay -----------------------------------------------------------------

    def prepare(self, st: PlannedStep) -> tuple[ToolSpec, tuple[Any, ...], dict[str, Any], dict[str, Any], Any]:
        """Check step ``st`` before it runs (not step 0, which the lookup checked); ``(spec, *args, **kwargs, record, pre)``."""
        spec = st.spec
        if spec is None:
            raise Diverged(st.i, f"step {st.i} calls {st.name!r}, which this engine has no tool for")
        args = st.render(self.params)
        call = self.call_args(spec) if spec.is_method else _NO_ARGS
        kw = args
        if spec.split is not None:
            pos, kw = spec.split(args)
            call = (*call, *pos)
        pre: Any = st.pre
        if st.check_pre and st.i > 0:
            ctx = self.ctx
            if ctx is None or ctx.steps.get(ctx.cursor) is None:  # a step the journal answers is not checked again
                check = spec.pre
                assert check is not None
                m = self.engine.metrics
                if not m.enabled:  # the hot path of a hit: no timing wrapper
                    snap = check.capture(*call, **kw)
                    ok = check.passes(snap, _expected(st.pre, st.pre_value, snap))
                else:
                    snap = m.timed(_PRE_CAPTURE, check.capture, *call, **kw)
                    ok = m.timed(_PRE_COMPARE, check.passes, snap, _expected(st.pre, st.pre_value, snap))
                if not ok:
                    raise Diverged(st.i, f"pre-check of step {st.i} ({spec.name}) failed")
                pre = (snap, spec.pre_where)  # encoded only if this trajectory gets stored
        return spec, call, kw, args, pre

    def finish(self, st: PlannedStep, spec: ToolSpec, call: tuple[Any, ...], kw: dict[str, Any], args: dict[str, Any], pre: Any, result: Any) -> None:
        """Record step ``st`` as done and run its post-check."""
        done = self.done
        self.used.add(len(done))
        done.append((spec.name, args, result))
        self.steps.append({"name": spec.name, "args": args, "result": result, "source": "replayed"})
        post: Any = st.post
        ok = True
        if st.check_post:
            check = spec.post
            assert check is not None
            m = self.engine.metrics
            if not m.enabled:
                snap = check.capture(*call, **kw)
                ok = check.passes(snap, _expected(st.post, st.post_value, snap))
            else:
                snap = m.timed(_POST_CAPTURE, check.capture, *call, **kw)
                ok = m.timed(_POST_COMPARE, check.passes, snap, _expected(st.post, st.post_value, snap))
            post = (snap, spec.post_where)
        self.trajectory.append({"name": spec.name, "args": args, "result": result, "pre": pre, "post": post})
        if not ok:
            raise Diverged(st.i + 1, f"post-check of step {st.i} ({spec.name}) failed", "post")

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
            steps = plan(self.engine, alt)
            same = all(
                steps[j].name == self.done[j][0] and steps[j].render(self.params) == self.done[j][1] for j in range(d.at)
            )
            if same and self._pre_passes(steps[d.at], seen):
                self.alternatives.remove(alt_id)
                store.bump("switched")
                store.record_divergence(entry.id, self.engine.evict_after)
                if self.ctx is not None:
                    self.ctx.append(
                        ev.CHECK_FAILED, entry.id, {"call_id": self.ctx.cursor, "phase": "pre", "detail": d.reason}, durable=False
                    )
                self.entry_id = alt.id
                self.reason = f"hit after switching from {entry.id} to {alt.id} at step {d.at} ({d.reason})"
                return alt
        return None

    def diverge(self, entry: Entry, d: Diverged) -> Continuation:
        """Journal the divergence, count it, and build the agent's continuation."""
        self.reason = f"diverged: {d.reason}"
        if self.ctx is not None:
            call_id = self.ctx.cursor - (d.phase == "post")
            self.ctx.append(ev.CHECK_FAILED, entry.id, {"call_id": call_id, "phase": d.phase, "detail": d.reason}, durable=False)
            self.ctx.append(ev.REPLAY_DIVERGED, entry.id, {"at": d.at, "reason": d.reason, "entry": entry.id})
        store = self.engine.store
        store.bump("diverged")
        store.record_divergence(entry.id, self.engine.evict_after)
        self.used.clear()  # the agent may now repeat done steps: they are answered, not run again
        return Continuation(self.task, d.at, d.reason, [StepDone(*t) for t in self.done], entry.id)

    def suggestion(self) -> Continuation | None:
        """The agent's continuation after a semantic match: the similar entry's calls as a plan, nothing run."""
        entry = self.engine.store.cached(self.suggest) if self.suggest else None
        if entry is None:
            return None
        self.engine.store.bump("suggested")
        calls = []
        for st in plan(self.engine, entry):
            try:
                args = st.render(self.params) if fits(entry, self.params) else st.args
            except Exception:  # a template these params cannot fill: show it as recorded
                args = st.args
            calls.append(SuggestedStep(st.name, args))
        return Continuation(self.task, 0, self.reason, [], entry.id, calls, entry.task)

    def output(self, entry: Entry) -> Any:
        """The replayed call's output: a step's result, a template over params, or the recorded value."""
        self.hit = True
        self.engine.store.record_hit(entry.id)
        spec = entry.output
        if "step" in spec:
            return self.done[spec["step"]][2]
        if "template" in spec:
            return render(spec["template"], {"params": self.params})
        return spec.get("value")

    def replay(self, entry: Entry) -> tuple[bool, Any]:
        """Replay ``entry`` (switching candidates if needed): ``(True, output)``, or ``(False, continuation)``."""
        start = 0
        ctx = self.ctx
        assert ctx is not None
        while True:
            try:
                for st in plan(self.engine, entry)[start:]:
                    spec, call, kw, args, pre = self.prepare(st)
                    fn = spec.fn
                    result = ctx.call(st.name, "tool", args, lambda: fn(*call, **kw))  # noqa: B023 - called at once
                    self.finish(st, spec, call, kw, args, pre, result)
                return True, self.output(entry)
            except Diverged as d:
                alt = self.switch(entry, d)
                if alt is None:
                    return False, self.diverge(entry, d)
                entry, start = alt, d.at

    async def areplay(self, entry: Entry) -> tuple[bool, Any]:
        """Async :meth:`replay` (async tools are awaited)."""
        start = 0
        ctx = self.ctx
        assert ctx is not None
        while True:
            try:
                for st in plan(self.engine, entry)[start:]:
                    spec, call, kw, args, pre = self.prepare(st)
                    fn = spec.fn
                    thunk = lambda: fn(*call, **kw)  # noqa: B023 - called at once
                    if spec.is_async:
                        result = await ctx.acall(st.name, "tool", args, thunk)
                    else:
                        result = ctx.call(st.name, "tool", args, thunk)
                    self.finish(st, spec, call, kw, args, pre, result)
                return True, self.output(entry)
            except Diverged as d:
                alt = self.switch(entry, d)
                if alt is None:
                    return False, self.diverge(entry, d)
                entry, start = alt, d.at

    # -- the agent's side ---------------------------------------------------------

    def reuse(self, spec: ToolSpec, args_d: dict[str, Any]) -> StepDone | None:
        """After a divergence: the done step this agent call repeats, if any (answered, not run again)."""
        for i, (name, args, result) in enumerate(self.done):
            if i not in self.used and name == spec.name and args == args_d:
                self.used.add(i)
                self.steps.append({"name": name, "args": args, "result": result, "source": "continued"})
                return StepDone(name, args, result)
        return None


current_session: contextvars.ContextVar[Session | None] = contextvars.ContextVar("engrain_cache_session", default=None)
