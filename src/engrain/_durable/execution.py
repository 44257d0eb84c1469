"""A run's life: start or resume it, hold its lease, execute the agent, journal how it ended.

:func:`run` and :func:`run_async` are the public entry points. A new run is
created by its ``run.started``; a resumed one is read, leased, read again (a
dead executor's last append may land after the first read), and continued
from its journal by a :class:`~.context.RunContext`. The run ends with
``run.completed``, ``run.failed`` (anything the agent raised, except errors
that say another executor has the run) or ``needs_input``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Literal

from .. import _events as ev
from .._errors import (
    AgentMismatchError,
    ConfigError,
    ConflictError,
    EngrainError,
    LeaseHeldError,
    NotJSONError,
    StorageError,
)
from .._events import check_json, is_json
from .._journal import Journal, check_run_id
from . import observe
from .context import (
    RunContext,
    RunResult,
    _Cancelled,
    _current,
    _Park,
    _Suspend,
    default_journal,
    new_run_id,
)
from .identity import fingerprint, refusal
from .lease import Lease
from .outcome import agent_name as _name_of
from .outcome import check_agent_name, failure, failure_report
from .steps import replayed_steps, same_json, steps_of_rows

_FINISHED_KINDS = frozenset({ev.RUN_COMPLETED, ev.RUN_FAILED, ev.RUN_CANCELLED})


def _start(
    journal: Journal,
    run_id: str,
    task: str,
    inputs: dict[str, Any] | None,
    tags: list[str],
    lease: Lease | None = None,
    agent: str | None = None,
    fresh: bool = False,
    code: str | None = None,
    upgrade: bool = False,
    same: Same | dict[str, Any] | None = None,
) -> tuple[list[ev.Row] | None, RunResult | None]:
    """Read the run's journal rows (creating the run if new, held by ``lease`` if given); a finished run's result short-circuits.

    The rows are None for a run this call created (its one event is ``run.started``).
    ``agent`` and ``code`` are the agent name and code fingerprint a new run records
    (see :mod:`.identity`), which an existing run must match (:class:`AgentMismatchError`
    otherwise; ``upgrade``: another version of the code may resume it).
    ``fresh``: ``run_id`` was just made by :func:`new_run_id`, so there is nothing to read
    (were it taken after all, creating the run raises :class:`ConflictError`).
    ``same``: more fields of ``run.started`` that, like the task, a resume must give again, with
    the same JSON kinds (the cache's params and tags: its journaled lookup is replayed, so a call
    with other params would otherwise get the entry chosen for the first ones; an agent's
    definition). A :class:`Same` also says what a differing run raises and whether a run recorded
    without a field resumes; a plain dict is ``Same(dict)``.
    ``inputs``: the same JSON values as recorded, kinds included, for an existing run
    (:class:`EngrainError` otherwise); ``None`` takes the recorded ones (see :func:`_recorded_inputs`).
    A run with a finishing event anywhere is finished: its first such event is its outcome.
    """
    same = Same(same) if isinstance(same, dict) else same
    rows = [] if fresh else journal.read_raw(run_id)
    if not rows:
        data: dict[str, Any] = {"task": task, "inputs": {} if inputs is None else inputs, "tags": tags}
        if agent is not None:
            data["agent"] = agent
        if code is not None:
            data["agent_code"] = code
        if same is not None:
            data.update(same.fields)
        if not is_json(data):  # check_json's own test first: its message is made only for a refusal
            for field in ("task", "inputs", "tags"):  # named by the argument that holds the value
                check_json(data[field], f"run {run_id!r}", field)
            check_json(data, f"run {run_id!r}", "run.started")
        held = None if lease is None else (lease.owner, lease.ttl)
        # Not flushed on its own: the run's first durable append (a step, a question, its end) flushes
        # it too, and until then nothing the run did needs it (a server crash before that loses a run
        # that had done nothing durable). Waited for, so a taken run id is refused before the agent runs.
        journal.append_one(run_id, ev.RUN_STARTED, "", data, 0, lease=held, durable=False,
                           json_checked=True)  # checked just above
        if lease is not None:
            lease.take()
        return None, None
    first = ev.loads_many([rows[0][4]])[0]
    first = first if isinstance(first, dict) else {}
    end = _end_of(rows)
    finished = end is not None
    why = refusal(first, agent, code, upgrade=upgrade, finished=finished)
    if why is not None:  # first: another program's run is not this one's, whatever its task
        raise AgentMismatchError(run_id, why)
    if same is not None:  # before the task too: same= may say whose run it is (an agent's definition)
        _check_same(run_id, first, same)
    recorded = first.get("task")
    if recorded != task:
        raise EngrainError(f"run {run_id!r} was started with task {recorded!r}, not {task!r}")
    # The agent replays its recorded steps (LLM calls, a human's approval) and executes the rest on
    # the inputs given: what was approved for the recorded ones would be done with others. Not for
    # engrain's own runners (no code fingerprint): their inputs hold what they check themselves (a
    # routine's files, which upgrade= may change).
    if inputs is not None and code is not None and not same_json(first.get("inputs", {}), inputs):
        raise EngrainError(f"run {run_id!r} was started with inputs {_shown(first.get('inputs', {}))},"
                           f" not {_shown(inputs)} (resume it with the recorded inputs, or without inputs=)")
    if not finished:
        return rows, None  # resumable: the common case, so nothing below is paid for it
    events = ev.events_of(run_id, rows[: end + 1])  # what follows the end is not the run's
    last = events[-1]
    ids = {e.data.get("call_id") for e in events if e.kind == ev.STEP_COMPLETED or e.kind == ev.STEP_FAILED}
    ids.update(cid for e in events if e.kind == ev.REPLAY_COMPLETED for cid, _ in replayed_steps(e.data))
    steps = len(ids)
    if last.kind == ev.RUN_COMPLETED:
        return rows, RunResult(run_id, "ok", last.data.get("output"), replayed=steps)
    if last.kind == ev.RUN_FAILED:
        f = last.data.get("failure") if isinstance(last.data.get("failure"), dict) else {}
        return rows, RunResult(
            run_id, "failed", error=last.data.get("error"), replayed=steps,
            step_id=f.get("step_id"), error_type=f.get("error_type"), message=f.get("message"),
        )
    # run.cancelled: never resumed
    return rows, RunResult(run_id, ev.CANCELLED, error=last.data.get("reason") or "cancelled", replayed=steps)


_kind_of = itemgetter(2)


def _end_of(rows: list[ev.Row]) -> int | None:
    """The index of the run's first finishing row, or None.

    Not just the last row: a row appended after the end (an answer an older engrain accepted
    after a cancel, a forged one) must not make a finished run resumable. Every resume pays
    the test, so it is one pass in C (``isdisjoint`` over ``map``); only a finished run's
    rows are walked in Python, to find where it ended.
    """
    if _FINISHED_KINDS.isdisjoint(map(_kind_of, rows)):
        return None
    return next(i for i, r in enumerate(rows) if r[2] in _FINISHED_KINDS)


def _recorded_inputs(run_id: str, rows: list[ev.Row]) -> dict[str, Any]:
    """The inputs ``run.started`` recorded, for a resume that gave none (as ``recover()`` and workers do)."""
    first = ev.loads_many([rows[0][4]])[0]
    inputs = first.get("inputs", {}) if isinstance(first, dict) else None
    if not isinstance(inputs, dict):
        raise EngrainError(f"run {run_id!r}: run.started records inputs {_shown(inputs)}, which are not an object")
    return inputs


def _check_call(run_id: str | None, inputs: Any, tags: Any) -> None:
    """Refuse, by field, what a run cannot be given: a ``dict()`` of a list fails untyped, and a string of tags
    would be taken as its characters. (A task may be any JSON value, as it always could: a dict task is kept.)"""
    where = f"run {run_id!r}" if run_id else "run"
    if inputs is not None and not isinstance(inputs, Mapping):
        raise ConfigError(f"{where}: inputs must be a dict of name -> JSON value, got {type(inputs).__name__}")
    if tags is not None and not isinstance(tags, (list, tuple)):
        raise ConfigError(f"{where}: tags must be a list of strings, got {type(tags).__name__}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 300 else text[:300] + "…"


def _differs(run_id: str, reason: str) -> EngrainError:
    return EngrainError(f"run {run_id!r} {reason}")


@dataclass(frozen=True)
class Same:
    """The ``same=`` of :func:`_start`: fields of ``run.started`` a resume must give again, and how it is refused.

    ``error(run_id, reason)`` is raised for a run recorded with another value (a plain
    :class:`EngrainError` by default; :class:`AgentMismatchError` takes the same arguments),
    ``reason`` says why in the caller's words (default: the field, what was recorded, what was
    given). ``unrecorded``: a run recorded without a field, by an engrain from before it was
    recorded, is refused (what it was is unknown) or resumed without that field's check.
    """

    fields: dict[str, Any]
    error: Callable[[str, str], EngrainError] = _differs
    reason: str | None = None
    unrecorded: Literal["refuse", "resume"] = "refuse"


def _check_same(run_id: str, first: dict[str, Any], same: Same) -> None:
    for k, v in same.fields.items():
        if k not in first:
            if same.unrecorded == "resume":
                continue
            raise same.error(run_id, f"was started without a recorded {k}, so it cannot be resumed with {k} {v!r}")
        if not same_json(first[k], v):
            raise same.error(run_id, same.reason or f"was started with {k} {first[k]!r}, not {v!r}")


def _finish_ok(ctx: RunContext, output: Any) -> RunResult:
    try:
        if not is_json(output):
            check_json(output, f"run {ctx.run_id!r}", "output")
    except NotJSONError as e:
        # Resuming cannot change the output (the steps replay), so this is final.
        return _finish_error(ctx, e)
    try:
        ctx.append(ev.RUN_COMPLETED, "", {"output": output}, json_checked=True)  # checked just above
    except NotJSONError as e:  # text no store can hold (a lone surrogate), found as the event was encoded
        return _finish_error(ctx, e)
    return RunResult(ctx.run_id, "ok", output, replayed=ctx.replayed, executed=ctx.executed)


#: Errors that say nothing about the run itself (another executor wrote to it or
#: holds it): they propagate and leave the run resumable. Everything else an
#: agent raises, NondeterminismError included, ends the run ``failed``; a run
#: left ``running`` would be claimed by every recover() and fail the same way forever.
_NOT_THE_RUNS_FAULT: tuple[type[BaseException], ...] = (ConflictError, LeaseHeldError, StorageError)


def _finish_error(ctx: RunContext, exc: BaseException) -> RunResult:
    if isinstance(exc, _Suspend):
        return RunResult(ctx.run_id, "needs_input", prompt=exc.prompt, replayed=ctx.replayed, executed=ctx.executed)
    if isinstance(exc, _NOT_THE_RUNS_FAULT):
        raise exc
    data = failure(exc)
    report = failure_report(exc)
    data["failure"] = report
    ctx.append(ev.RUN_FAILED, "", data)
    return RunResult(ctx.run_id, "failed", error=data["error"], replayed=ctx.replayed, executed=ctx.executed, **report)


class _Execution:
    """What :func:`run` and :func:`run_async` share: open the run, lease it, bind its context."""

    def __init__(
        self,
        task: str,
        run_id: str | None,
        inputs: dict[str, Any] | None,
        tags: list[str] | None,
        journal: Journal | None,
        agent: str,
        code: str | None,
        upgrade: bool,
        same: Same | dict[str, Any] | None = None,
    ):
        self.task = task
        if run_id:
            check_run_id(run_id)  # before any read: a bad id is refused by name, not by the store's driver
        _check_call(run_id, inputs, tags)
        self.journal = journal or default_journal()
        self.run_id = run_id or new_run_id()
        given = None if inputs is None else dict(inputs)
        self._lease = lease = Lease(self.journal, self.run_id)
        rows, self.done = _start(self.journal, self.run_id, task, given, list(tags or []), lease, agent,
                                 fresh=not run_id, code=code, upgrade=upgrade, same=same)
        if rows is not None and self.done is None and not lease.held:
            # Resuming: take the lease, then read again. A dead executor's last
            # append may have landed after the first read (PostgreSQL finishes
            # a killed client's statement); after the takeover its appends are
            # fenced off, so this read is the journal the run continues from.
            lease.acquire()
            more = self.journal.read_raw(self.run_id, after=len(rows) - 1)
            if more:
                rows, self.done = _start(self.journal, self.run_id, task, given, list(tags or []), lease, agent,
                                         code=code, upgrade=upgrade, same=same)
                if self.done is not None:
                    lease.__exit__(None, None, None)
        if given is None and rows is not None and self.done is None:
            given = _recorded_inputs(self.run_id, rows)
        self.inputs = {} if given is None else given
        if rows is None:
            self.ctx = RunContext(self.journal, self.run_id, 1, {})
        else:
            self.ctx = RunContext(self.journal, self.run_id, len(rows), steps_of_rows(self.run_id, rows))
        self.ctx.fence = lease.epoch

    def __enter__(self) -> _Execution:
        self._lease.__enter__()
        self._token = _current.set(self.ctx)
        self.result: RunResult | None = None
        if observe.observers:
            observe.notify("run_started", self.ctx, self.task)
        return self

    def __exit__(self, *exc: Any) -> None:
        _current.reset(self._token)
        self._lease.__exit__(*exc)
        if observe.observers:
            r = self.result
            status = r.status if r is not None else ("parked" if isinstance(exc[1], _Park) else "interrupted")
            observe.notify("run_ended", self.ctx, status, r.error if r is not None else None)

    # The event that finishes a run drops its lease in the journal (see
    # Journal.append), so renewal stops before it and no release follows it.

    def finished(self, output: Any) -> RunResult:
        """The result of an agent that returned ``output``, journaled."""
        if self.ctx.storage_error is not None:
            raise self.ctx.storage_error  # a step went unrecorded: the run stays resumable, not ok
        self._lease.stop()
        try:
            res = _finish_ok(self.ctx, output)
        except _Cancelled:
            res = self._cancelled()
        self._lease.dropped()
        self.result = res
        return res

    def _cancelled(self) -> RunResult:
        # run.cancelled dropped the lease in the journal.
        self._lease.stop()
        self._lease.dropped()
        c = self.ctx
        self.result = RunResult(c.run_id, ev.CANCELLED, error="cancelled", replayed=c.replayed, executed=c.executed)
        return self.result

    def failed(self, exc: BaseException) -> RunResult:
        """The result of an agent that raised ``exc``; KeyboardInterrupt and SystemExit propagate."""
        if isinstance(exc, _Cancelled):
            return self._cancelled()
        if not isinstance(exc, (Exception, _Suspend)):
            raise exc  # the process is going away: the run stays resumable
        if self.ctx.storage_error is not None:
            # The store failed, not the agent (even if the agent caught it and raised its own
            # error): record nothing more, so the run is resumed once the store works.
            if exc is self.ctx.storage_error:
                raise exc
            raise self.ctx.storage_error from exc
        self._lease.stop()
        try:
            res = _finish_error(self.ctx, exc)
        except _Cancelled:
            return self._cancelled()
        if res.status == "failed":
            self._lease.dropped()
        self.result = res
        return res


def run(
    agent: Callable[..., Any],
    task: str,
    *,
    run_id: str | None = None,
    inputs: dict[str, Any] | None = None,
    tags: list[str] | None = None,
    journal: Journal | None = None,
    agent_name: str | None = None,
    upgrade: bool = False,
) -> RunResult:
    """Run ``agent(task, **inputs)`` durably and return its :class:`RunResult`.

    Start again with the same ``run_id`` after a crash to resume: journaled
    steps return their recorded results. A resume gives the same ``task`` and
    either the same ``inputs`` (as JSON values: ``5.0`` is not ``5``) or none,
    which runs on the recorded ones; another task or other inputs raise
    :class:`~engrain.EngrainError` and write nothing. A finished run (ended ok,
    failed or cancelled) returns its recorded outcome without calling the
    agent, whatever was written after its end. While it executes, the run holds a
    lease (:class:`~engrain.LeaseHeldError` if another live process runs it).
    Async agents are run with :func:`asyncio.run`; inside an event loop use
    :func:`run_async`.

    A new run records who started it in ``run.started``: the agent's name
    (``agent_name`` if given, else ``module:qualname`` of ``agent``, a script
    named by its path) and a fingerprint of its code and tools (see
    :func:`~engrain.agent_name`). An existing ``run_id`` is resumed only by
    that agent: another name, or a run an HTTP API client created, raises
    :class:`~engrain.AgentMismatchError` and leaves the run untouched; so does
    another version of the agent's code, unless ``upgrade=True`` says this
    code replays it (a deploy, with changed steps behind
    :func:`~engrain.patched`). A replayed step called with other arguments
    than recorded ends the run with :class:`~engrain.NondeterminismError`.

    An exception from the agent ends the run ``failed`` with the error and its
    traceback journaled in ``run.failed``; so do a
    :class:`~engrain.NondeterminismError` and an output that is not JSON, which
    no resume could fix. Only :class:`~engrain.ConflictError` and
    :class:`~engrain.LeaseHeldError` (another executor has the run) propagate
    and leave the run resumable, as does :class:`~engrain.AgentMismatchError`,
    raised before anything is written.
    """
    import inspect  # lazily, like asyncio below: both weigh on every CLI start

    # An object whose __call__ is async too: called as a plain agent, its output would be an unawaited coroutine.
    if inspect.iscoroutinefunction(agent) or inspect.iscoroutinefunction(getattr(type(agent), "__call__", None)):
        import asyncio  # lazily: importing asyncio costs ~40 ms of start-up for every CLI command

        return asyncio.run(
            run_async(agent, task, run_id=run_id, inputs=inputs, tags=tags, journal=journal, agent_name=agent_name,
                      upgrade=upgrade)
        )
    name = _name_of(agent) if agent_name is None else check_agent_name(agent_name)
    return run_sync(agent, task, run_id, inputs, tags, journal, name, fingerprint(agent), upgrade)


def run_sync(
    agent: Callable[..., Any], task: str, run_id: str | None, inputs: dict[str, Any] | None, tags: list[str] | None,
    journal: Journal | None, name: str, code: str | None, upgrade: bool = False,
    same: Same | dict[str, Any] | None = None,
) -> RunResult:
    """:func:`run` of a plain (not async) ``agent`` that records the valid agent name ``name`` and code
    fingerprint ``code``: for engrain's own runners (a cache call), which know both without working them out.
    ``same``: see :func:`_start`."""
    ex = _Execution(task, run_id, inputs, tags, journal, name, code, upgrade, same)
    if ex.done is not None:
        return ex.done
    with ex:
        try:
            output = agent(task, **ex.inputs)
        except BaseException as e:
            return ex.failed(e)
        return ex.finished(output)


async def run_async(
    agent: Callable[..., Awaitable[Any]],
    task: str,
    *,
    run_id: str | None = None,
    inputs: dict[str, Any] | None = None,
    tags: list[str] | None = None,
    journal: Journal | None = None,
    agent_name: str | None = None,
    upgrade: bool = False,
) -> RunResult:
    """Async :func:`run` for coroutine agents."""
    name = _name_of(agent) if agent_name is None else check_agent_name(agent_name)
    return await run_async_as(agent, task, run_id, inputs, tags, journal, name, fingerprint(agent), upgrade)


async def run_async_as(
    agent: Callable[..., Awaitable[Any]], task: str, run_id: str | None, inputs: dict[str, Any] | None,
    tags: list[str] | None, journal: Journal | None, name: str, code: str | None, upgrade: bool = False,
    same: Same | dict[str, Any] | None = None,
) -> RunResult:
    """Async :func:`run_sync`."""
    ex = _Execution(task, run_id, inputs, tags, journal, name, code, upgrade, same)
    if ex.done is not None:
        return ex.done
    with ex:
        try:
            output = await agent(task, **ex.inputs)
        except BaseException as e:
            return ex.failed(e)
        return ex.finished(output)
