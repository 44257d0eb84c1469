"""Durable runs: journal every step so a killed run resumes without redoing work.

Inside :func:`run`, the N-th journaled call (a tool, an LLM call, a UDF, a
human answer or a clock read) is step N. After the call, ``step.completed`` (or
``step.failed``) is appended: one commit per step. On a restart with the same
``run_id`` the agent runs again from the top, and each step whose completion is
journaled returns the recorded result without being called. A step running at
a crash left nothing, so it is called again with the same idempotency key
(``run_id:N``) and external effects can dedupe. An ``at_most_once`` tool also
journals a durable ``step.started`` before the call; such a step started but
not finished is never called again blindly: the run asks a human (see
:mod:`.steps`).
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .. import _events as ev
from .._errors import (
    ConflictError,
    NotJSONError,
    StorageError,
)
from .._events import check_json, is_json
from .._journal import Journal
from . import observe
from .attempts import StepWriter, _Pending, _question
from .branches import StepKeys
from .journals import check_args, default_journal, new_run_id  # noqa: F401  (re-exported: callers import them here)
from .mismatch import Mismatches
from .result import RunResult
from .unwind import _Cancelled, _Park, _Suspend  # noqa: F401  (re-exported: execution and sleep import them here)
from .waiting import CANCEL_POLL, Waiting  # noqa: F401  (CANCEL_POLL re-exported: sleep imports it here)
from .steps import (
    ARGS_CHECKED,
    DEFAULT_POLICY,
    LOOSE_IN_ORDER,
    SCALARS,
    RecordedCalls,
    StepPolicy,
    StepRecord,
    call_digest,
    replay,
    same_call,
    same_json,
    same_kinds,
    steps_of,
    steps_together,
)

# StepRecord, steps_of and _Pending are re-exported: callers import them from here.
__all__ = ["RunContext", "RunResult", "StepPolicy", "StepRecord", "_Pending", "steps_of"]

_current: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar("engrain_run", default=None)
_step_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("engrain_step_key", default=None)
# Set by a worker around engrain.run: sleeps longer than this park the run (see sleep.py).
_park_after: contextvars.ContextVar[float | None] = contextvars.ContextVar("engrain_park_after", default=None)
# Set by a worker with ``_park_after``: ``park(run_id, until, lease_epoch) -> parked``, called by a sleep that parks
# the run while its executor still holds the lease (see ``RunContext.park``).
_parker: contextvars.ContextVar[Callable[[str, float, int | None], bool] | None] = contextvars.ContextVar(
    "engrain_parker", default=None)

#: JSON scalars whose every value is strictly JSON (a float may not be finite), checked by type alone.
_PLAIN = frozenset({str, int, bool, type(None)})
#: The keyword arguments of a thunk (shared, never mutated).
_NO_KW: dict[str, Any] = {}


class RunContext(Waiting, StepWriter, Mismatches):
    """The journal cursor of one run while its agent executes.

    Internal API shared by the durable runner, the routine runner and the cache:
    :meth:`call` / :meth:`acall` journal one step around a thunk.
    """

    #: Whether :meth:`append` writes straight to the journal (so a hot path may inline it): a
    #: subclass that keeps events elsewhere sets it False.
    direct = True

    def __init__(self, journal: Journal, run_id: str, seq: int, steps: dict[int, StepRecord]):
        """``seq``: how many events the run has; ``steps``: their records (``steps_of``, ``steps_of_rows``)."""
        self.journal = journal
        self.run_id = run_id
        self.seq = seq
        self.steps = steps
        self.cursor = 0  # the lowest step number no call of this execution has taken
        # The highest recorded step number: a cursor past it meets only new steps (checked without the lock).
        self._last = max(steps) if steps else -1
        self._taken: set[int] = set()  # numbers above the cursor already taken (concurrent branches)
        self._recorded: RecordedCalls | None = None  # built on the first call the cursor's step is not
        self._together: set[int] | None = None  # steps recorded in flight together (see ``steps_together``)
        self.replayed = 0
        self.executed = 0
        self.unpatched: list[str] = []  # patches this run replays the old branch of (see patching.py)
        self.park_after: float | None = _park_after.get()  # sleeps longer than this park the run (workers)
        self._parker = _parker.get() if self.park_after is not None else None
        # An existing run executed again (after a crash, an answer, a park): the first event this
        # execution appends says when it resumed, so timelines can mark the boundary at no extra commit.
        self._resumed: float | None = time.time() if seq > 1 else None
        self.udf_sources: set[str] = set()  # UDF sources already journaled by this process (see _durable.udf)
        self._lock = threading.Lock()
        self.keys = StepKeys(run_id)  # never from call_id: see branches.py
        #: The lease epoch appends are fenced with (None: unfenced), see ``Journal.append``.
        self.fence: int | None = None
        #: The first storage failure of this run: it is not the agent's, so the run must not be marked failed.
        self.storage_error: StorageError | None = None

    def append(
        self, kind: str, name: str = "", data: dict[str, Any] | None = None, *, durable: bool = True,
        json_checked: bool = False, wait: bool = True,
    ) -> None:
        """Append one event to this run (serialized across the run's threads).

        ``json_checked``: every value in ``data`` was found strictly JSON (see ``Journal.append_one``).
        ``wait=False`` (with ``durable=False``) returns once the append is sent
        (``Journal.append``): its failure is raised by this run's next append.
        """
        if self._resumed is not None:
            data = {**(data or {}), "resumed": self._resumed}
            self._resumed = None
        with self._lock:
            try:
                self.journal.append_one(
                    self.run_id, kind, name, data or {}, self.seq, durable=durable, fence=self.fence,
                    json_checked=json_checked, wait=wait,
                )
            except (StorageError, ConflictError) as e:
                self._refused(e)
            self.seq += 1

    def _refused(self, e: StorageError | ConflictError) -> None:
        """Raise what an append the journal refused with ``e`` means for this run (the caller holds the lock)."""
        if isinstance(e, StorageError):
            if self.storage_error is None:
                self.storage_error = e
            raise e
        # The step boundary where a cancel (engrain.cancel) is noticed, at no cost per step.
        # (The append that conflicted may be an earlier one sent without waiting.)
        seen = min(self.seq, e.expected_seq) - 1
        if any(x.kind == ev.RUN_CANCELLED for x in self.journal.read(self.run_id, after=seen)):
            raise _Cancelled() from None
        raise e

    def replay_next(self, name: str, args: tuple[Any, ...] | dict[str, Any] | None = None,
                    type_: str = "tool") -> StepRecord | None:
        """The next step's record when the journal completed it as ``name``: a tool call's replay fast path.

        ``args``: the call's arguments, compared with the recorded ones: a dict
        by name, a tuple by their values in the recorded order (``None``: not
        compared, see ``ARGS_CHECKED``). Anything else (a new step, another name or other
        arguments, a failure, a step to retry or to ask about) returns ``None``
        without taking the step, and the caller goes through :meth:`call`,
        which handles every case (and names both calls when they differ).
        """
        if self.cursor not in self.steps:
            return None  # a new step: the executed path pays one dict lookup for this fast path, no lock
        with self._lock:
            rec = self.steps.get(self.cursor)
            if rec is None or rec.state != "completed" or rec.name != name or rec.type != type_:
                return None
            if args is not None:
                recorded = tuple(rec.args.values()) if type(args) is tuple else rec.args
                # ``==`` alone takes True for 1 and 1.0 for 1: the kinds are checked too. Any doubt
                # (another key order, another kind) goes the slow way, which names both calls.
                if recorded != args:
                    return None
                if type(args) is not tuple:
                    if not same_kinds(recorded.values(), args.values()):
                        return None
                elif len(args) == 1:  # the most common call, inline: a third of same_kinds' cost
                    t = type(recorded[0])
                    if t is not type(args[0]) or (t not in SCALARS and not same_json(recorded[0], args[0])):
                        return None
                elif not same_kinds(recorded, args):
                    return None
            self._advance()
            self.keys.next(type_, name, rec.args)
            self.replayed += 1
        if observe.observers:
            _observe_replay(self, rec)
        return rec

    def _advance(self) -> None:
        """Move the cursor past the step it names and past the numbers concurrent branches took (lock held)."""
        self.cursor += 1
        taken = self._taken
        while taken and self.cursor in taken:
            taken.discard(self.cursor)
            self.cursor += 1

    def _claim(self, type_: str, name: str, args: dict[str, Any]) -> tuple[int, StepRecord | None]:
        """This call's step number and the record answering it, checked and taken at once (lock held).

        A record goes only to the call it recorded (:func:`same_call`), wherever it is among the steps not
        taken yet, so concurrent branches replay in any interleaving (see ``LOOSE_IN_ORDER`` for the one
        allowance; an LLM step journaled before LLM arguments had a digest stays unchecked).
        """
        cid = self.cursor
        rec = self.steps.get(cid)
        if rec is not None and same_call(rec, type_, name, args):
            self._advance()
            return cid, rec
        if rec is None and cid > self._last:
            self._advance()
            return cid, None
        if self._together is None:  # read once, and only by a resume whose calls leave the recorded order
            self._together = steps_together(self.steps, self.journal.read(self.run_id))
        # Concurrent branches begin their calls in another order on every execution; in sequence, another
        # call where a step ran alone is a change.
        concurrent = rec is None or cid in self._together
        taken = self._taken
        if concurrent:
            if self._recorded is None:
                self._recorded = RecordedCalls(self.steps)
            own = self._recorded.find(self.steps, type_, name, args, lambda c: c > cid and c not in taken)
            if own is not None:
                taken.add(own.call_id)
                return own.call_id, own
            if rec is None:  # it runs again under its number
                self._advance()
                return cid, None
        if rec.name == name and rec.type == type_ and type_ in LOOSE_IN_ORDER and (
                not concurrent or (type_ == "llm" and rec.digest is None)):
            self._advance()
            return cid, rec
        if concurrent:
            # Another branch's step, still to come: this call is new, under a number no record or call holds.
            new = cid + 1
            while new in self.steps or new in taken:
                new += 1
            taken.add(new)
            return new, None
        self._advance()
        # Its recorded outcome is another call's: never hand it to this one.
        err = self._mismatch(cid, rec, name) if rec.name != name or rec.type != type_ else \
            self._args_mismatch(cid, rec, args)
        if self._together:
            err.args = (f"{err.args[0]} (or, as steps of this run ran concurrently, concurrent steps began in"
                        f" another order than recorded, after step {cid}, which ran alone)",)
        raise err

    def _begin(
        self, name: str, type_: str, args: dict[str, Any], policy: StepPolicy = DEFAULT_POLICY
    ) -> StepRecord | _Pending:
        with self._lock:
            call_id, rec = self._claim(type_, name, args)
            key = self.keys.next(type_, name, args)
        attempt = 1
        if rec is not None:
            state = rec.state
            if state == "completed" or state == "failed":
                self.replayed += 1
                return rec
            if state == "waiting":
                raise _Suspend(_question(rec))
            if state == "resolved":
                self._resolve(rec)
                self.replayed += 1
                return rec
            if state == "started" and rec.at_most_once:
                # It may have happened: never call it again blindly.
                request = _question(rec)
                self.append(ev.INPUT_REQUESTED, name, request)
                rec.state = "waiting"
                raise _Suspend(request)
            if state == "retrying":
                wait = rec.retry_at - time.time()
                if wait > 0:
                    self.wait(wait)  # what is left of the backoff: a cancel meanwhile stops the retry
            attempt = rec.attempts + 1
        elif not is_json(args):  # check_args' own first test, inline: every new step passes it
            check_args(type_, name, args)
        p = _Pending(call_id, name, key, type_, args, attempt)
        if type_ in ARGS_CHECKED:
            p.digest = call_digest(type_, args)  # now: the call may change what it was given
        if rec is not None and rec.errors:
            p.errors = list(rec.errors)
        if policy.at_most_once:
            self._log_start(p)
        else:
            p.started = time.time()
        self.executed += 1
        return p

    def call(
        self,
        name: str,
        type_: str,
        args: dict[str, Any],
        thunk: Callable[[], Any],
        policy: StepPolicy = DEFAULT_POLICY,
        meta: dict[str, Any] | None = None,
        durable: bool | Callable[[Any], bool] = True,
        wait: bool = True,
    ) -> Any:
        """Journal one step: return its recorded result, or run ``thunk`` (with ``policy``'s retries) and record it.

        ``meta`` (JSON) is added to the ``step.completed`` data, e.g. a UDF's source.
        ``durable`` (or ``durable(result)``) ``False`` commits the completion without its own
        flush to disk (see ``Journal.append``): for a result nothing outside the run uses
        before the run's next durable append. ``wait=False`` (only with ``durable=False``) returns
        once the completion is sent: see :meth:`append`.
        """
        if policy is DEFAULT_POLICY and meta is None and durable is True and self.cursor > self._last:
            return self._call_new(name, type_, args, thunk, (), _NO_KW)
        step = self._begin(name, type_, args, policy)
        if isinstance(step, StepRecord):
            if observe.observers:
                _observe_replay(self, step)
            return replay(step)
        while True:
            token = _step_key.set(step.key)
            try:
                result = thunk()
            except Exception as e:
                delay = self._failed(step, e, policy)
                if delay is None:
                    raise
                err = e
            else:
                if durable is True and meta is None:  # a step's usual completion: fewest arguments passed
                    return self._complete(step, result)
                flush = durable if isinstance(durable, bool) else durable(result)
                return self._complete(step, result, meta, durable=flush, wait=wait or flush)
            finally:
                _step_key.reset(token)
            self.wait(delay)  # the backoff: a cancel meanwhile raises before the next attempt
            self._next_attempt(step, policy, err)

    def _call_new(self, name: str, type_: str, args: dict[str, Any], fn: Callable[..., Any], pos: tuple[Any, ...],
                  kw: dict[str, Any], known: int = 0) -> Any:
        """:meth:`call` of the step ``fn(*pos, **kw)`` when the journal has no record of it, with the default
        policy: run it and journal its outcome. Every executed step of a run comes here (a tool's wrapper
        calls it directly), so it takes the fewest layers: no record lookup, no retry loop, no thunk, and a
        pending step object only when the step fails or is observed.

        ``known``: 0, ``args`` are checked here; 1, they are known to be JSON; 2, known to be JSON scalars
        (see :meth:`call_tool`).
        """
        with self._lock:
            call_id = self.cursor
            fresh = call_id > self._last
            if fresh:
                if self._taken:
                    self._advance()
                else:
                    self.cursor = call_id + 1  # every step of a first execution: no call
                key = self.keys.next(type_, name, args)
        if not fresh:  # the journal may answer it (a resumed run's thread got here first): with the lock released
            return self.call(name, type_, args, lambda: fn(*pos, **kw))
        digest = None
        if known == 0:
            for k, v in args.items():
                # Every key a str and every value a str, int, bool or None (the usual call) is strictly JSON
                # and nothing the call could change: no walk, no digest. Anything else: the full check.
                if type(k) is not str or type(v) not in _PLAIN:
                    if not is_json(args):
                        check_args(type_, name, args)
                    digest = call_digest(type_, args)
                    break
            else:
                if type_ == "llm":
                    digest = call_digest(type_, args)
        elif known == 1:
            digest = call_digest(type_, args)
        started = time.time()
        self.executed += 1
        token = _step_key.set(key)
        try:
            try:
                result = fn(*pos, **kw)
            except Exception as e:
                self._failed(self._pending(call_id, key, name, type_, args, started, digest), e, DEFAULT_POLICY)
                raise  # no retries: the failure is journaled
            if observe.observers or (type(result) not in _PLAIN and not is_json(result)):  # observed, or not JSON
                return self._complete(self._pending(call_id, key, name, type_, args, started, digest), result)
            # The usual completion (first attempt, no durable start): keys in _outcome's order.
            data = {"call_id": call_id, "result": result, "type": type_, "args": args, "started": started}
            if digest is not None:
                data["ad"] = digest
            try:
                if self._resumed is None and self.direct:  # :meth:`append`'s usual case, inline
                    with self._lock:
                        try:
                            self.journal.append_one(self.run_id, ev.STEP_COMPLETED, name, data, self.seq,
                                                    fence=self.fence, json_checked=True)
                        except (StorageError, ConflictError) as e:
                            self._refused(e)
                        self.seq += 1
                else:
                    self.append(ev.STEP_COMPLETED, name, data, json_checked=True)
            except NotJSONError as e:  # text no store can hold (a lone surrogate), found as the event was encoded
                self._fail(self._pending(call_id, key, name, type_, args, started, digest), e)
                raise
            return result
        finally:
            _step_key.reset(token)

    def call_tool(self, name: str, args: dict[str, Any], fn: Callable[..., Any], pos: tuple[Any, ...],
                  kw: dict[str, Any], scalars: bool = False) -> Any:
        """:meth:`call` of the tool step ``fn(*pos, **kw)`` whose ``args`` are known to be JSON (a cache hit
        replays arguments read back from its store, which holds only JSON, or rendered from checked params).

        A new step takes :meth:`_call_new`'s path without the walk over ``args`` and without a thunk;
        anything else (a step the journal answers, a concurrent taker) goes through :meth:`call`.
        ``scalars``: every value in ``args`` is a JSON scalar, so the call cannot change them (no digest).
        """
        if self.cursor <= self._last:
            return self.call(name, "tool", args, lambda: fn(*pos, **kw))
        return self._call_new(name, "tool", args, fn, pos, kw, 2 if scalars else 1)

    def _pending(self, call_id: int, key: str, name: str, type_: str, args: dict[str, Any], started: float,
                 digest: str | None) -> _Pending:
        """The pending step :meth:`_call_new` ran, for the writers that take one (a failure, an observed step)."""
        return _Pending(call_id, name, key, type_, args, 1, False, started, None, digest)

    async def acall(
        self,
        name: str,
        type_: str,
        args: dict[str, Any],
        thunk: Callable[[], Awaitable[Any]],
        policy: StepPolicy = DEFAULT_POLICY,
    ) -> Any:
        """Async :meth:`call`."""
        step = self._begin(name, type_, args, policy)
        if isinstance(step, StepRecord):
            if observe.observers:
                _observe_replay(self, step)
            return replay(step)
        while True:
            token = _step_key.set(step.key)
            try:
                result = await thunk()
            except Exception as e:
                delay = self._failed(step, e, policy)
                if delay is None:
                    raise
                err = e
            else:
                return self._complete(step, result)
            finally:
                _step_key.reset(token)
            await self.await_wait(delay)  # the backoff: a cancel meanwhile raises before the next attempt
            self._next_attempt(step, policy, err)

    def ask(self, prompt: str, fields: list[dict[str, Any]] | None, name: str = "engrain.ask") -> Any:
        """Return the recorded answers to this request, or journal the request and suspend."""
        with self._lock:
            call_id, rec = self._claim("input", name, {"prompt": prompt, "fields": fields or []})
            self.keys.next("input", name, None)
        request = {"call_id": call_id, "prompt": prompt, "fields": fields or []}
        if rec is None:
            check_json(request, f"input request {name!r}", "prompt")
            self.append(ev.INPUT_REQUESTED, name, request)
            raise _Suspend(request)
        if rec.state == "answered":
            self.replayed += 1
            return rec.result
        raise _Suspend(request)


def _observe_replay(ctx: RunContext, rec: StepRecord) -> None:
    t = time.time()
    view = observe.StepView(rec.call_id, rec.name, rec.type, rec.args, t, t, f"{ctx.run_id}:{rec.call_id}",
                            rec.attempts, replayed=True, result=rec.result)
    if rec.state == "failed":
        view.error_type, view.message = rec.error_type, rec.message
    observe.notify("step_ended", ctx, view)


def current() -> RunContext | None:
    """The run the calling code executes in, or ``None`` outside :func:`run`."""
    return _current.get()


def idempotency_key() -> str | None:
    """``"run_id:N"`` while a journaled step executes (stable across retries), else ``None``."""
    return _step_key.get()
