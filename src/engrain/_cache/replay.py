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
from dataclasses import dataclass, field
from typing import Any

from .. import _events as ev
from .._durable.context import RunContext
from .._durable.steps import SCALARS, same_json
from .._routines.template import render
from .binding import entry_key, shape_key
from .checks import compare_copy
from .plan import _CONTAINERS, _UNSET, Engine, PlannedStep, ToolSpec, _expected, _seen_key, fits, plan
from .store import Entry, canonical_task, task_key
from .values import feeds_hold


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


class Diverged(Exception):
    """A check failed during replay at step ``at`` (``phase``: ``pre``, ``post``, or ``feed``: a result
    later steps used came back different)."""

    def __init__(self, at: int, reason: str, phase: str = "pre"):
        super().__init__(reason)
        self.at, self.reason, self.phase = at, reason, phase


_NO_ARGS: tuple[Any, ...] = ()
_LOOKUP = "engrain.cache.lookup"
_FILTER_CAPTURE, _FILTER_COMPARE = ("filter", "capture"), ("filter", "compare")
_PRE_CAPTURE, _PRE_COMPARE = ("runtime", "precheck", "capture"), ("runtime", "precheck", "compare")
_POST_CAPTURE, _POST_COMPARE = ("runtime", "postcheck", "capture"), ("runtime", "postcheck", "compare")


@dataclass(slots=True)
class Session:
    """The state of one ``engine(task)`` call while its run executes.

    ``done`` holds ``(name, args, result)`` of the steps replayed so far (made
    :class:`StepDone` only for the agent's :class:`Continuation`); ``used``, the
    indexes of those that the agent's calls were answered from.
    """

    engine: Engine
    task: str
    params: dict[str, Any]
    tags: list[str]
    ctx: RunContext | None = None
    # The tool calls as :meth:`recorded` gives them; a replayed step without a post-check is kept as
    # ``(planned step, pre-check snapshot or _UNSET, result)`` until then (a hit rarely needs its dict).
    trajectory: list[Any] = field(default_factory=list)
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
    first_pre: Any = None  # the chosen entry's first pre-check snapshot taken at lookup, as checks.keep kept it
    suggest: str | None = None  # a semantically similar entry whose plan the agent is offered
    shape: str = ""  # the shape key of a call with params (see binding.shape_key)
    json_task: bool = False  # the task was a JSON value, keyed apart from a string of the same text (binding.task_key)
    # Whether this process ran the lookup, and so checked step 0 just before replay starts (a resumed
    # run's lookup comes from the journal, taken before the crash: step 0 is checked again).
    looked_up: bool = False
    untracked: bool = False  # a tool of the engine ran outside this call's context meanwhile (never stored)

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
        args = st.render(self.params) if st.templated else st.args
        m = self.engine.metrics
        capture = pre.capture if not m.enabled else functools.partial(m.timed, _FILTER_CAPTURE, pre.capture)
        kept = None
        if seen is None:
            if st.plain:  # recorded keyword arguments, no self
                snap = capture(**args)
            else:
                pos, kw = spec.arguments(args)
                snap = capture(*self.call_args(spec), *pos, **kw)
            current = snap
            if first:  # before compare, which may change it (see checks.keep)
                kept = st.kept_pre(snap)
        else:
            k = st.seen_key or _seen_key(st.name, args)
            if k in seen:
                snap = seen[k]
            else:
                pos, kw = spec.arguments(args)
                snap = seen[k] = capture(*self.call_args(spec), *pos, **kw)
            current = compare_copy(snap)  # one capture, several compares: the shared one stays as captured
        expected = _expected(st.pre, st.pre_value, snap)
        ok = pre.passes(current, expected) if not m.enabled else m.timed(_FILTER_COMPARE, pre.passes, current, expected)
        if ok and first:
            self.first_pre = kept if kept is not None else st.kept_pre(snap)
        return ok

    def lookup(self) -> dict[str, Any]:
        """Choose an entry: the best candidate whose first pre-check passes now."""
        eng, store = self.engine, self.engine.store
        self.looked_up = True
        store.bump("lookups")
        canon = self.canon or canonical_task(self.task, self.params)
        cands = self._candidates(canon) if not eng.metrics.enabled else eng.metrics.timed(("query",), self._candidates, canon)
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
        foreign = 0
        for n, e in enumerate(fit):
            steps = plan(eng, e)
            if any(st.spec is None for st in steps):
                # A step this engine cannot call as recorded: starting the entry would run the steps
                # before it for a trajectory that cannot finish here.
                foreign += 1
                continue
            if not steps or self._pre_passes(steps[0], seen, first=True):
                return {
                    "entry": e.id, "alternatives": [a.id for a in fit[n + 1 :]],
                    "reason": f"hit ({how} match, {e.successes} successes)",
                }
        if foreign:
            return {"entry": None, "alternatives": [], "reason": f"miss: {foreign} of {len(cands)} cached trajectories call a tool "
                    "this engine has no tool for or whose parameters changed; pre-checks failed for the others"}
        return {"entry": None, "alternatives": [], "reason": f"miss: pre-checks failed for all {len(cands)} cached trajectories"}

    def _candidates(self, canon: str) -> list[Entry]:
        """Entries filed under this call's key (for a call with params: under each pinned-name set of its shape)."""
        eng, store = self.engine, self.engine.store
        if self.params:
            shape = self.shape or shape_key(self.task, self.tags, self.params, self.json_task)[1]
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
        return store.candidates(task_key(canon, self.tags, self.json_task), eng.max_candidates)

    def begin(self) -> Entry | None:
        """Run the journaled lookup; the entry to replay, or ``None`` on a miss."""
        ctx = self.ctx
        assert ctx is not None
        if self.params:
            self.canon, self.shape = shape_key(self.task, self.tags, self.params, self.json_task)
        else:
            self.canon = canonical_task(self.task, self.params)
        args = {"task": self.canon, "tags": self.tags, "params": self.params}
        rec = ctx.steps.get(ctx.cursor) if ctx.steps else None
        if rec is not None and rec.name == _LOOKUP and not same_json(rec.args, args):
            # A "cache" step's arguments are not checked by the run (ARGS_CHECKED): its recorded choice
            # was made for another lookup (params, tags, namespace, match mode) and must not be replayed.
            raise ctx._args_mismatch(ctx.cursor, rec, args)
        choice = ctx.call(_LOOKUP, "cache", args, self.lookup)
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
        ctx.append(ev.REPLAY_STARTED, entry.id, {"entry": entry.id, "task": entry.task, "steps": len(entry.steps)}, durable=False,
                   json_checked=isinstance(entry.task, str))
        return entry

    # -- replay -----------------------------------------------------------------

    def prepare(self, st: PlannedStep) -> tuple[ToolSpec, tuple[Any, ...], dict[str, Any], dict[str, Any], Any]:
        """Check step ``st`` before it runs (not step 0 when this process's lookup checked it); ``(spec, *args, **kwargs, record, pre)``."""
        spec = st.spec
        if spec is None:
            why = "whose parameters changed since it was recorded" if st.name in self.engine._specs else \
                "which this engine has no tool for"
            raise Diverged(st.i, f"step {st.i} calls {st.name!r}, {why}")
        args = st.render(self.params) if st.templated else st.args
        # The tool gets a copy: a call that changes a list it was given must not change the entry.
        kw = args if st.scalars else ev.json_copy(args)
        call = self.call_args(spec) if spec.is_method else _NO_ARGS
        if spec.split is not None:
            pos, kw = spec.split(kw)
            call = (*call, *pos)
        pre: Any = st.pre
        if st.check_pre and (st.i > 0 or not self.looked_up):
            ctx = self.ctx
            if ctx is None or ctx.steps.get(ctx.cursor) is None:  # a step the journal answers is not checked again
                check = spec.pre
                assert check is not None
                m = self.engine.metrics
                if not m.enabled:  # the hot path of a hit: no timing wrapper, a str or number kept as is
                    snap = check.capture(*call, **kw)
                    pre = (snap, spec.pre_where) if type(snap) in SCALARS else st.kept_pre(snap)  # before compare
                    expected = st.pre_value
                    if expected is _UNSET or type(expected) in _CONTAINERS:
                        expected = _expected(st.pre, expected, snap)
                    ok = check.passes(snap, expected)
                else:
                    snap = m.timed(_PRE_CAPTURE, check.capture, *call, **kw)
                    pre = st.kept_pre(snap)
                    ok = m.timed(_PRE_COMPARE, check.passes, snap, _expected(st.pre, st.pre_value, snap))
                if not ok:
                    raise Diverged(st.i, f"pre-check of step {st.i} ({spec.name}) failed")
        return spec, call, kw, args, pre

    def finish(self, st: PlannedStep, spec: ToolSpec, call: tuple[Any, ...], kw: dict[str, Any], args: dict[str, Any], pre: Any, result: Any) -> None:
        """Record step ``st`` as done and run its post-check."""
        self.done.append((spec.name, args, result))
        self.steps.append({"name": spec.name, "args": st.shown(args), "result": result, "source": "replayed"})
        post: Any = st.post
        ok = True
        if st.check_post:
            check = spec.post
            assert check is not None
            m = self.engine.metrics
            if not m.enabled:
                snap = check.capture(*call, **kw)
                post = st.kept_post(snap)  # before compare, which may change it
                ok = check.passes(snap, _expected(st.post, st.post_value, snap))
            else:
                snap = m.timed(_POST_CAPTURE, check.capture, *call, **kw)
                post = st.kept_post(snap)
                ok = m.timed(_POST_COMPARE, check.passes, snap, _expected(st.post, st.post_value, snap))
        self.trajectory.append({"name": spec.name, "args": args, "result": result, "pre": pre, "post": post})
        if not ok:
            raise Diverged(st.i + 1, f"post-check of step {st.i} ({spec.name}) failed", "post")
        if st.feeds and not feeds_hold(st.feeds, result):
            # A later step's recorded argument (or the recorded output) came from this result, which differs now.
            raise Diverged(st.i + 1, f"step {st.i} ({spec.name}) returned another result than the one later steps used", "feed")

    def recorded(self) -> list[dict[str, Any]]:
        """This call's tool calls (``name``, ``args``, ``result``, ``pre``, ``post``), for storing or refreshing an entry."""
        t = self.trajectory
        for i, x in enumerate(t):
            if type(x) is tuple:  # a replayed step
                st, kept, result = x
                t[i] = {"name": st.name, "args": st.args, "result": result, "pre": st.held(kept), "post": st.post}
        return t

    def switch(self, entry: Entry, d: Diverged) -> Entry | None:
        """Another candidate that did the steps done so far, used their results as they came, and whose next step fits now."""
        if d.phase == "post":
            return None
        seen: dict[str, Any] = {}
        store = self.engine.store
        done = self.done
        for alt_id in self.alternatives:
            alt = store.cached(alt_id)
            # After a changed result ("feed"), a candidate may end where the replay stopped (its output from the results).
            if alt is None or len(alt.steps) < d.at or len(alt.steps) == d.at and d.phase == "pre":
                continue
            steps = plan(self.engine, alt)
            if any(st.spec is None for st in steps):
                continue  # see lookup
            same = all(
                steps[j].name == done[j][0] and same_json(steps[j].render(self.params), done[j][1])
                and (not steps[j].feeds or feeds_hold(steps[j].feeds, done[j][2])) for j in range(d.at)
            )
            if same and (d.at == len(steps) or self._pre_passes(steps[d.at], seen)):
                self.alternatives.remove(alt_id)
                store.bump("switched")
                store.record_divergence(entry.id, self.engine.evict_after)
                if self.ctx is not None:
                    call_id, phase = (self.ctx.cursor, "pre") if d.phase == "pre" else (self.ctx.cursor - 1, "post")
                    self.ctx.append(
                        ev.CHECK_FAILED, entry.id, {"call_id": call_id, "phase": phase, "detail": d.reason}, durable=False
                    )
                self.entry_id = alt.id
                self.reason = f"hit after switching from {entry.id} to {alt.id} at step {d.at} ({d.reason})"
                return alt
        return None

    def diverge(self, entry: Entry, d: Diverged) -> Continuation:
        """Journal the divergence, count it, and build the agent's continuation."""
        self.reason = f"diverged: {d.reason}"
        if self.ctx is not None:
            call_id = self.ctx.cursor - (d.phase != "pre")
            phase = "pre" if d.phase == "pre" else "post"  # a changed result ("feed") is a check after the call
            self.ctx.append(ev.CHECK_FAILED, entry.id, {"call_id": call_id, "phase": phase, "detail": d.reason}, durable=False)
            self.ctx.append(ev.REPLAY_DIVERGED, entry.id, {"at": d.at, "reason": d.reason, "entry": entry.id})
        store = self.engine.store
        store.bump("diverged")
        store.record_divergence(entry.id, self.engine.evict_after)
        # Copies: the agent may change what it gets, and a done step's args are the entry's (and answer its repeats).
        return Continuation(self.task, d.at, d.reason, [StepDone(n, ev.json_copy(a), r) for n, a, r in self.done], entry.id)

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
            calls.append(SuggestedStep(st.name, ev.json_copy(args)))  # a copy: st.args are the entry's
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
        return ev.json_copy(spec.get("value"))  # a copy: a caller that changes its output must not change the entry's

    def replay(self, entry: Entry) -> tuple[bool, Any]:
        """Replay ``entry`` (switching candidates if needed): ``(True, output)``, or ``(False, continuation)``."""
        start = 0
        ctx = self.ctx
        assert ctx is not None
        call_tool, finish = ctx.call_tool, self.finish
        done, steps, trajectory = self.done, self.steps, self.trajectory
        # A new run with no timing: a plain function step with recorded arguments is checked inline
        # (prepare's common case without its call); any other step goes through prepare.
        fast = not ctx.steps and self.looked_up and not self.engine.metrics.enabled
        while True:
            try:
                for st in plan(self.engine, entry)[start:]:
                    spec = st.spec
                    if fast and st.plain:
                        args = st.args
                        kept: Any = _UNSET  # the pre-check's snapshot as PlannedStep.held reads it
                        if st.check_pre and st.i > 0:
                            check = spec.pre
                            snap = check.capture(**args)
                            kept = snap if type(snap) in SCALARS else st.kept_pre(snap)  # before compare
                            expected = st.pre_value
                            if expected is _UNSET or type(expected) in _CONTAINERS:
                                expected = _expected(st.pre, expected, snap)
                            r = check.compare(snap, expected)
                            if r is not True and (r is False or not check.verdict(r)):  # passes(), inline
                                raise Diverged(st.i, f"pre-check of step {st.i} ({spec.name}) failed")
                        kw = args if st.scalars else ev.json_copy(args)  # see prepare
                        result = call_tool(st.name, args, spec.fn, _NO_ARGS, kw, st.scalars)
                        if st.check_post:
                            finish(st, spec, _NO_ARGS, kw, args, st.held(kept), result)
                        else:  # finish without a post-check, inline (its trajectory entry built by recorded())
                            done.append((st.name, args, result))
                            shown = dict(args) if st.scalars else ev.json_copy(args)  # PlannedStep.shown, inline
                            steps.append({"name": st.name, "args": shown, "result": result, "source": "replayed"})
                            trajectory.append((st, kept, result))
                            if st.feeds and not feeds_hold(st.feeds, result):  # as finish() checks it
                                raise Diverged(st.i + 1, f"step {st.i} ({spec.name}) returned another result than the "
                                               "one later steps used", "feed")
                        continue
                    spec, call, kw, args, pre = self.prepare(st)
                    finish(st, spec, call, kw, args, pre, call_tool(st.name, args, spec.fn, call, kw))
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
        """After a divergence: the done step this agent call repeats, if any (answered, not run again).

        Before the agent is called (a replay, where a tool may call another), no done step is offered.
        """
        if not self.agent_called:
            return None
        for i, (name, args, result) in enumerate(self.done):
            # Type-exact: set_flag(True) is not the replayed set_flag(1), though Python's == says so.
            if i not in self.used and name == spec.name and same_json(args, args_d):
                self.used.add(i)
                self.steps.append({"name": name, "args": ev.json_copy(args), "result": result, "source": "continued"})
                return StepDone(name, args, result)
        return None


current_session: contextvars.ContextVar[Session | None] = contextvars.ContextVar("engrain_cache_session", default=None)
