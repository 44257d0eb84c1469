"""Runs journaled in one transaction at their end, for replay-heavy hot paths.

A durable run (:func:`engrain.run`) commits each step's completion as it
happens. The behavior cache can trade that for speed: with
``durability="run"`` the events of one engine call are kept
in memory and appended in a single transaction when the call ends, so a
crash loses the record of the call in flight (its steps may then run again),
never a finished one. ``durability="off"`` keeps no record at all.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from .. import _events as ev
from .._events import NewEvent
from .._journal import Journal
from .context import RunContext, RunResult, _current, _Pending, check_args
from .execution import _finish_error, _finish_ok
from .identity import fingerprint
from .outcome import agent_name
from .steps import ARGS_CHECKED, DEFAULT_POLICY, StepPolicy, mutable_args_digest


class BufferedContext(RunContext):
    """A run context whose events stay in memory until :meth:`flush` (or, with ``write=False``, are never built).

    A buffered run is always new (its events are not read back), so no step
    is ever answered from the journal: :meth:`_begin` skips that lookup and
    the per-step journal write of :class:`RunContext`, which are most of a
    cache hit's cost once the journal is out of the way.
    """

    direct = False  # append buffers

    def __init__(self, journal: Journal, run_id: str, write: bool = True):
        super().__init__(journal, run_id, 0, {})
        self.pending: list[NewEvent] = []
        self.write = write
        self.checked = True  # every buffered event's data was found strictly JSON by its writer

    def append(
        self, kind: str, name: str = "", data: dict[str, Any] | None = None, *, durable: bool = True,
        json_checked: bool = False, wait: bool = True,
    ) -> None:
        # list.append is atomic, so the run's threads need no lock here; the
        # buffer is written from 0 at flush, so ``seq`` is not kept.
        if self.write:
            self.pending.append(NewEvent(kind, name, data or {}))
            if not json_checked:
                self.checked = False

    def _begin(self, name: str, type_: str, args: dict[str, Any], policy: StepPolicy = DEFAULT_POLICY) -> _Pending:
        # Never a StepRecord: nothing is read back, so every step runs. No
        # step.started even for at-most-once tools: the whole call is one
        # transaction, so a crash leaves no step to ask about.
        with self._lock:
            call_id = self.cursor
            self.cursor += 1
            # From the same counter as the inherited _call_new's steps (a key from call_id could repeat one).
            key = self.keys.next(type_, name, args)
        check_args(type_, name, args)
        self.executed += 1
        p = _Pending(call_id, name, key, type_, args, 1, False, time.time())
        if self.write and type_ in ARGS_CHECKED:
            p.digest = mutable_args_digest(args)  # journaled as a durable run's step is
        return p

    def flush(self) -> None:
        """Append every buffered event in one transaction (a replay that ran to its end as one event: see ``_compact``)."""
        if self.pending:
            self.journal.append(self.run_id, _compact(self.pending), 0, json_checked=self.checked)
            self.pending = []


_PLAIN = frozenset({"call_id", "result", "type", "args", "started"})


def _compact(events: list[NewEvent]) -> list[NewEvent]:
    """A finished run whose middle is one ``replay.started`` and step completions in call order, as three events.

    That is a behavior-cache hit: its completions go into one ``replay.completed``
    (the replay's data, ``replayed_from``: how many completions came before the
    replay started, and ``completions``: ``[name, type, args, result, started]``
    per step, the step's call id being its index, plus a dict of the completion's
    other keys when it has any), so the hit is three rows in its one transaction,
    not one per step, and small enough to stay in its page. Anything else (a
    divergence, a failure) is kept as it is.
    """
    if len(events) < 3 or events[0].kind != ev.RUN_STARTED or events[-1].kind != ev.RUN_COMPLETED:
        return events
    steps, replay, before = [], None, 0
    for e in events[1:-1]:
        d = e.data
        if e.kind == ev.REPLAY_STARTED and replay is None:
            replay, before = e, len(steps)
        elif e.kind != ev.STEP_COMPLETED or d.get("call_id") != len(steps):
            return events
        else:
            item = [e.name, d.get("type", "tool"), d.get("args", {}), d.get("result"), d.get("started")]
            if not d.keys() <= _PLAIN:
                item.append({k: v for k, v in d.items() if k not in _PLAIN})
            steps.append(item)
    if replay is None:
        return events
    data = {**replay.data, "replayed_from": before, "completions": steps}
    return [events[0], NewEvent(ev.REPLAY_COMPLETED, replay.name, data), events[-1]]


def _open(journal: Journal, run_id: str, task: str, tags: list[str], write: bool, agent: Callable[..., Any],
          same: dict[str, Any] | None) -> BufferedContext:
    ctx = BufferedContext(journal, run_id, write)
    if write:  # the run's record is built only when it is kept
        data = {"task": task, "inputs": {}, "tags": tags, "agent": agent_name(agent)}
        code = fingerprint(agent)
        if code is not None:  # as a durable run records it
            data["agent_code"] = code
        if same:  # as a durable run records them (see execution._start): a call with its run id checks them
            data.update(same)
        ctx.append(ev.RUN_STARTED, "", data, json_checked=ev.is_json(data))
    return ctx


def _result(ctx: BufferedContext, ok: bool, value: Any) -> RunResult:
    if ok:
        return _finish_ok(ctx, value)
    if not isinstance(value, Exception):
        raise value  # KeyboardInterrupt, SystemExit: nothing is recorded for this call
    return _finish_error(ctx, value)


def run_batched(agent: Callable[[str], Any], task: str, *, run_id: str, tags: list[str], journal: Journal, write: bool = True,
                same: dict[str, Any] | None = None) -> RunResult:
    """Run ``agent(task)`` with its events appended in one transaction at the end (or not at all)."""
    ctx = _open(journal, run_id, task, tags, write, agent, same)
    token = _current.set(ctx)
    try:
        try:
            res = _result(ctx, True, agent(task))
        except BaseException as e:
            res = _result(ctx, False, e)
    finally:
        _current.reset(token)
    if write:
        ctx.flush()
    return res


async def arun_batched(agent: Callable[[str], Awaitable[Any]], task: str, *, run_id: str, tags: list[str], journal: Journal, write: bool = True,
                       same: dict[str, Any] | None = None) -> RunResult:
    """Async :func:`run_batched`."""
    ctx = _open(journal, run_id, task, tags, write, agent, same)
    token = _current.set(ctx)
    try:
        try:
            res = _result(ctx, True, await agent(task))
        except BaseException as e:
            res = _result(ctx, False, e)
    finally:
        _current.reset(token)
    if write:
        ctx.flush()
    return res
