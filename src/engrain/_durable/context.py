"""Durable runs: journal every step so a killed run resumes without redoing work.

Inside :func:`run`, the N-th journaled call (a tool, an LLM call, a UDF, a
human answer or a clock read) is step N. Before the call, ``step.started`` is
appended; after it, ``step.completed`` (or ``step.failed``). On a restart with
the same ``run_id`` the agent runs again from the top, and each step whose
completion is journaled returns the recorded result without being called. A
step started but never completed (the process died mid-call) is called again
with the same idempotency key (``run_id:N``) so external effects can dedupe.
"""

from __future__ import annotations

import builtins
import contextvars
import datetime as _dt
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .. import _events as ev
from .._errors import (
    ConflictError,
    EngrainError,
    LeaseHeldError,
    NondeterminismError,
    NotJSONError,
    RunFailedError,
    StepFailedError,
    StorageError,
)
from .._events import NewEvent, check_json, is_json
from .._journal import Journal, default_url, open_journal
from .lease import Lease
from .outcome import agent_name as _name_of
from .outcome import check_agent_name, failure, failure_report

_current: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar("engrain_run", default=None)
_step_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("engrain_step_key", default=None)

_default_journals: dict[str, Journal] = {}
_default_lock = threading.Lock()


def default_journal() -> Journal:
    """The process-wide journal at :func:`engrain.default_url`, opened on first use."""
    url = default_url()
    with _default_lock:
        j = _default_journals.get(url)
        if j is None:
            j = _default_journals[url] = open_journal(url)
        return j


def new_run_id() -> str:
    """A fresh run id that sorts by creation time."""
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(6).hex()}"


@dataclass(slots=True)
class StepRecord:
    """What the journal says about one step (one ``call_id``)."""

    call_id: int
    name: str
    type: str
    args: dict[str, Any]
    attempts: int = 1
    state: str = "started"  # started | completed | failed | waiting (input requested) | answered
    result: Any = None
    error_type: str = ""
    error_module: str = ""
    message: str = ""


def steps_of(events: list[ev.Event]) -> dict[int, StepRecord]:
    """Fold a run's events into one record per step."""
    steps: dict[int, StepRecord] = {}
    for e in events:
        d = e.data
        if e.kind == ev.STEP_STARTED:
            rec = steps.get(d["call_id"])
            if rec is None:
                steps[d["call_id"]] = StepRecord(d["call_id"], e.name, d.get("type", "tool"), d.get("args") or {})
            else:
                rec.attempts += 1
        elif e.kind == ev.STEP_COMPLETED:
            rec = steps[d["call_id"]]
            rec.state, rec.result = "completed", d.get("result")
        elif e.kind == ev.STEP_FAILED:
            rec = steps[d["call_id"]]
            rec.state, rec.error_type, rec.message = "failed", d.get("error_type", ""), d.get("message", "")
            rec.error_module = d.get("error_module", "")
        elif e.kind == ev.INPUT_REQUESTED:
            cid = d["call_id"]
            steps[cid] = StepRecord(cid, e.name or "engrain.ask", "input", {"prompt": d.get("prompt"), "fields": d.get("fields")}, state="waiting")
        elif e.kind == ev.INPUT_RECEIVED:
            rec = steps[d["call_id"]]
            rec.state, rec.result = "answered", d.get("answers")
    return steps


class _Suspend(BaseException):
    """Unwinds the agent when it waits for human input.

    A BaseException so an agent's ``except Exception`` cannot swallow it.
    """

    def __init__(self, prompt: dict[str, Any]):
        self.prompt = prompt


@dataclass(slots=True)
class RunResult:
    """The outcome of :func:`run`: truthy when the run completed.

    ``status`` is ``"ok"``, ``"failed"`` or ``"needs_input"``; ``replayed`` counts
    steps returned from the journal, ``executed`` steps actually called now. A
    failed run also says where and why, as em-core's failure report does:
    ``step_id`` (the routine step, when the failure is a step's), ``error_type``
    and ``message``; ``error`` keeps the whole ``"Type: message"`` string.
    """

    run_id: str
    status: str
    output: Any = None
    error: str | None = None
    prompt: dict[str, Any] | None = None
    replayed: int = 0
    executed: int = 0
    step_id: str | None = None
    error_type: str | None = None
    message: str | None = None

    def __bool__(self) -> bool:
        return self.status == "ok"

    def unwrap(self) -> Any:
        """The output, or :class:`~engrain.RunFailedError` if the run did not complete."""
        if self.status != "ok":
            raise RunFailedError(self.run_id, self.error or self.status)
        return self.output

    def to_dict(self) -> dict[str, Any]:
        """The result as a JSON-ready dict."""
        return {
            "run_id": self.run_id,
            "status": self.status,
            "output": self.output,
            "error": self.error,
            "prompt": self.prompt,
            "replayed": self.replayed,
            "executed": self.executed,
            "step_id": self.step_id,
            "error_type": self.error_type,
            "message": self.message,
        }


@dataclass(slots=True)
class _Pending:
    """A step that must be executed now (not replayed)."""

    call_id: int
    name: str
    key: str


def check_args(type_: str, name: str, args: dict[str, Any]) -> None:
    """Raise :class:`~engrain.NotJSONError` naming the step and argument when ``args`` is not JSON."""
    if not is_json(args):  # the slow walk only to name the culprit
        for k, v in args.items():
            check_json(v, f"{type_} {name!r}", f"argument {k!r}")
        check_json(args, f"{type_} {name!r}", "arguments")


class RunContext:
    """The journal cursor of one run while its agent executes.

    Internal API shared by the durable runner, the routine runner and the cache:
    :meth:`call` / :meth:`acall` journal one step around a thunk.
    """

    def __init__(self, journal: Journal, run_id: str, events: list[ev.Event]):
        self.journal = journal
        self.run_id = run_id
        self.seq = len(events)
        self.steps = steps_of(events)
        self.cursor = 0
        self.replayed = 0
        self.executed = 0
        self.udf_sources: set[str] = set()  # UDF sources already journaled by this process (see _durable.udf)
        self._lock = threading.Lock()
        #: The lease epoch appends are fenced with (None: unfenced), see ``Journal.append``.
        self.fence: int | None = None
        #: The first storage failure of this run: it is not the agent's, so the run must not be marked failed.
        self.storage_error: StorageError | None = None

    def append(self, kind: str, name: str = "", data: dict[str, Any] | None = None, *, durable: bool = True) -> None:
        """Append one event to this run (serialized across the run's threads)."""
        event = (NewEvent(kind, name, data or {}),)
        with self._lock:
            try:
                if self.fence is None:
                    self.journal.append(self.run_id, event, self.seq, durable=durable)
                else:
                    self.journal.append(self.run_id, event, self.seq, durable=durable, fence=self.fence)
            except StorageError as e:
                if self.storage_error is None:
                    self.storage_error = e
                raise
            self.seq += 1

    def _begin(self, name: str, type_: str, args: dict[str, Any]) -> StepRecord | _Pending:
        with self._lock:
            call_id = self.cursor
            self.cursor += 1
        rec = self.steps.get(call_id)
        if rec is not None:
            if rec.name != name:
                raise NondeterminismError(self.run_id, call_id, rec.name, name)
            if rec.state in ("completed", "failed"):
                self.replayed += 1
                return rec
            attempt = rec.attempts + 1
        else:
            check_args(type_, name, args)
            attempt = 1
        # Not flushed on its own: the completion's flush covers it (one fsync per step).
        self.append(
            ev.STEP_STARTED, name, {"call_id": call_id, "type": type_, "args": args, "attempt": attempt}, durable=False
        )
        self.executed += 1
        return _Pending(call_id, name, f"{self.run_id}:{call_id}")

    def _complete(self, p: _Pending, result: Any, meta: dict[str, Any] | None = None) -> Any:
        if not is_json(result):
            try:
                check_json(result, f"step {p.name!r}", "result")
            except NotJSONError as e:
                self._fail(p, e)
                raise
        data = {"call_id": p.call_id, "result": result}
        if meta:
            data.update(meta)
        self.append(ev.STEP_COMPLETED, p.name, data)
        return result

    def _fail(self, p: _Pending, exc: BaseException) -> None:
        t = type(exc)
        self.append(
            ev.STEP_FAILED,
            p.name,
            {"call_id": p.call_id, "error_type": t.__qualname__, "error_module": t.__module__, "message": str(exc)},
        )

    def call(
        self, name: str, type_: str, args: dict[str, Any], thunk: Callable[[], Any], meta: dict[str, Any] | None = None
    ) -> Any:
        """Journal one step: return its recorded result, or run ``thunk`` and record it.

        ``meta`` (JSON) is added to the ``step.completed`` data, e.g. a UDF's source.
        """
        step = self._begin(name, type_, args)
        if isinstance(step, StepRecord):
            return _replay(step)
        token = _step_key.set(step.key)
        try:
            result = thunk()
        except Exception as e:
            self._fail(step, e)
            raise
        finally:
            _step_key.reset(token)
        return self._complete(step, result, meta)

    async def acall(self, name: str, type_: str, args: dict[str, Any], thunk: Callable[[], Awaitable[Any]]) -> Any:
        """Async :meth:`call`."""
        step = self._begin(name, type_, args)
        if isinstance(step, StepRecord):
            return _replay(step)
        token = _step_key.set(step.key)
        try:
            result = await thunk()
        except Exception as e:
            self._fail(step, e)
            raise
        finally:
            _step_key.reset(token)
        return self._complete(step, result)

    def ask(self, prompt: str, fields: list[dict[str, Any]] | None, name: str = "engrain.ask") -> Any:
        """Return the recorded answers to this request, or journal the request and suspend."""
        with self._lock:
            call_id = self.cursor
            self.cursor += 1
        rec = self.steps.get(call_id)
        request = {"call_id": call_id, "prompt": prompt, "fields": fields or []}
        if rec is None:
            check_json(request, f"input request {name!r}", "prompt")
            self.append(ev.INPUT_REQUESTED, name, request)
            raise _Suspend(request)
        if rec.name != name:
            raise NondeterminismError(self.run_id, call_id, rec.name, name)
        if rec.state == "answered":
            self.replayed += 1
            return rec.result
        raise _Suspend(request)


def _replay(rec: StepRecord) -> Any:
    """The recorded outcome of a finished step: its result, or its error raised again."""
    if rec.state == "completed":
        return rec.result
    # Re-raise the original type only when it is already loaded: importing a
    # module named by journal data would run code chosen by whoever wrote it.
    mod = sys.modules.get(rec.error_module) if rec.error_module else None
    cls = getattr(mod, rec.error_type, None) if mod else getattr(builtins, rec.error_type, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            exc = cls(rec.message)
        except Exception:
            exc = None
        if exc is not None:
            raise exc
    raise StepFailedError(rec.name, rec.error_type, rec.message)


def current() -> RunContext | None:
    """The run the calling code executes in, or ``None`` outside :func:`run`."""
    return _current.get()


def idempotency_key() -> str | None:
    """``"run_id:N"`` while a journaled step executes (stable across retries), else ``None``."""
    return _step_key.get()


def now() -> _dt.datetime:
    """The current UTC time; inside a run, journaled, so a replay sees the recorded time."""
    ctx = _current.get()
    if ctx is None:
        return _dt.datetime.now(_dt.timezone.utc)
    iso = ctx.call("engrain.now", "clock", {}, lambda: _dt.datetime.now(_dt.timezone.utc).isoformat())
    return _dt.datetime.fromisoformat(iso)


def ask(prompt: str, fields: list[dict[str, Any]] | None = None) -> Any:
    """Ask a human; inside a run, the run pauses with status ``needs_input``.

    After :func:`answer` the run is started again with the same ``run_id``, and
    this call returns the recorded answers.
    """
    ctx = _current.get()
    if ctx is None:
        raise EngrainError("engrain.ask() needs a durable run: call it inside engrain.run()")
    return ctx.ask(prompt, fields)


def answer(run_id: str, answers: dict[str, Any], *, journal: Journal | None = None) -> None:
    """Record ``answers`` for the input a ``needs_input`` run waits for."""
    from .._errors import RunNotFoundError

    j = journal or default_journal()
    events = j.read(run_id)
    if not events:
        raise RunNotFoundError(run_id)
    waiting = [s for s in steps_of(events).values() if s.state == "waiting"]
    if not waiting:
        raise EngrainError(f"run {run_id!r} is not waiting for input")
    check_json(answers, f"answers to run {run_id!r}", "answers")
    j.append(run_id, [NewEvent(ev.INPUT_RECEIVED, waiting[-1].name, {"call_id": waiting[-1].call_id, "answers": answers})], len(events))


def _start(
    journal: Journal,
    run_id: str,
    task: str,
    inputs: dict[str, Any],
    tags: list[str],
    lease: Lease | None = None,
    agent: str | None = None,
) -> tuple[list[ev.Event], RunResult | None]:
    """Read the run's events (creating the run if new, held by ``lease`` if given); a finished run's result short-circuits.

    ``agent`` is the agent name a new run records, which :func:`~engrain.recover` matches.
    """
    events = journal.read(run_id)
    if not events:
        data: dict[str, Any] = {"task": task, "inputs": inputs, "tags": tags}
        if agent is not None:
            data["agent"] = agent
        check_json(data, f"run {run_id!r}", "inputs")
        held = None if lease is None else (lease.owner, lease.ttl)
        events = journal.append(run_id, [NewEvent(ev.RUN_STARTED, "", data)], 0, lease=held)
        if lease is not None:
            lease.take()
        return events, None
    recorded = events[0].data.get("task")
    if recorded != task:
        raise EngrainError(f"run {run_id!r} was started with task {recorded!r}, not {task!r}")
    last = events[-1]
    steps = sum(1 for e in events if e.kind == ev.STEP_STARTED and e.data.get("attempt", 1) == 1)
    if last.kind == ev.RUN_COMPLETED:
        return events, RunResult(run_id, "ok", last.data.get("output"), replayed=steps)
    if last.kind == ev.RUN_FAILED:
        f = last.data.get("failure") if isinstance(last.data.get("failure"), dict) else {}
        return events, RunResult(
            run_id, "failed", error=last.data.get("error"), replayed=steps,
            step_id=f.get("step_id"), error_type=f.get("error_type"), message=f.get("message"),
        )
    return events, None


def _finish_ok(ctx: RunContext, output: Any) -> RunResult:
    try:
        check_json(output, f"run {ctx.run_id!r}", "output")
    except NotJSONError as e:
        # Resuming cannot change the output (the steps replay), so this is final.
        return _finish_error(ctx, e)
    ctx.append(ev.RUN_COMPLETED, "", {"output": output})
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
    ):
        self.journal = journal or default_journal()
        self.run_id = run_id or new_run_id()
        self.inputs = dict(inputs or {})
        self._lease = lease = Lease(self.journal, self.run_id)
        events, self.done = _start(self.journal, self.run_id, task, self.inputs, list(tags or []), lease, agent)
        if self.done is None and not lease.held:
            # Resuming: take the lease, then read again. A dead executor's last
            # append may have landed after the first read (PostgreSQL finishes
            # a killed client's statement); after the takeover its appends are
            # fenced off, so this read is the journal the run continues from.
            lease.acquire()
            if len(self.journal.read(self.run_id, after=len(events) - 1)):
                events, self.done = _start(self.journal, self.run_id, task, self.inputs, list(tags or []), lease,
                                           agent)
                if self.done is not None:
                    lease.__exit__(None, None, None)
        self.ctx = RunContext(self.journal, self.run_id, events)
        self.ctx.fence = lease.epoch

    def __enter__(self) -> _Execution:
        self._lease.__enter__()
        self._token = _current.set(self.ctx)
        return self

    def __exit__(self, *exc: Any) -> None:
        _current.reset(self._token)
        self._lease.__exit__(*exc)

    # The event that finishes a run drops its lease in the journal (see
    # Journal.append), so renewal stops before it and no release follows it.

    def finished(self, output: Any) -> RunResult:
        """The result of an agent that returned ``output``, journaled."""
        if self.ctx.storage_error is not None:
            raise self.ctx.storage_error  # a step went unrecorded: the run stays resumable, not ok
        self._lease.stop()
        res = _finish_ok(self.ctx, output)
        self._lease.dropped()
        return res

    def failed(self, exc: BaseException) -> RunResult:
        """The result of an agent that raised ``exc``; KeyboardInterrupt and SystemExit propagate."""
        if not isinstance(exc, (Exception, _Suspend)):
            raise exc  # the process is going away: the run stays resumable
        if self.ctx.storage_error is not None:
            # The store failed, not the agent (even if the agent caught it and raised its own
            # error): record nothing more, so the run is resumed once the store works.
            if exc is self.ctx.storage_error:
                raise exc
            raise self.ctx.storage_error from exc
        self._lease.stop()
        res = _finish_error(self.ctx, exc)
        if res.status == "failed":
            self._lease.dropped()
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
) -> RunResult:
    """Run ``agent(task, **inputs)`` durably and return its :class:`RunResult`.

    Start again with the same ``run_id`` after a crash to resume: journaled
    steps return their recorded results. A finished run returns its recorded
    outcome without calling the agent. While it executes, the run holds a
    lease (:class:`~engrain.LeaseHeldError` if another live process runs it).
    Async agents are run with :func:`asyncio.run`; inside an event loop use
    :func:`run_async`.

    A new run records the agent's name in ``run.started``: ``agent_name`` if
    given, else ``module:qualname`` of ``agent``. :func:`~engrain.recover`
    resumes a run only with an agent of that name.

    An exception from the agent ends the run ``failed`` with the error and its
    traceback journaled in ``run.failed``; so do a
    :class:`~engrain.NondeterminismError` and an output that is not JSON, which
    no resume could fix. Only :class:`~engrain.ConflictError` and
    :class:`~engrain.LeaseHeldError` (another executor has the run) propagate
    and leave the run resumable.
    """
    import inspect  # lazily, like asyncio below: both weigh on every CLI start

    if inspect.iscoroutinefunction(agent):
        import asyncio  # lazily: importing asyncio costs ~40 ms of start-up for every CLI command

        return asyncio.run(
            run_async(agent, task, run_id=run_id, inputs=inputs, tags=tags, journal=journal, agent_name=agent_name)
        )
    name = _name_of(agent) if agent_name is None else check_agent_name(agent_name)
    ex = _Execution(task, run_id, inputs, tags, journal, name)
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
) -> RunResult:
    """Async :func:`run` for coroutine agents."""
    name = _name_of(agent) if agent_name is None else check_agent_name(agent_name)
    ex = _Execution(task, run_id, inputs, tags, journal, name)
    if ex.done is not None:
        return ex.done
    with ex:
        try:
            output = await agent(task, **ex.inputs)
        except BaseException as e:
            return ex.failed(e)
        return ex.finished(output)
