"""Writing a step's outcome: its completion or failure, the durable start of an
at-most-once step, and the failed attempts of a tool with retries.

:class:`StepWriter` is the half of :class:`~engrain._durable.context.RunContext`
that appends a step's events once the step runs (the other half decides
whether it runs or replays). It needs only ``append`` from the context.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .. import _events as ev
from .._errors import NotJSONError, RetriesExhaustedError
from .._events import check_json, is_json, storable_text
from . import observe
from .steps import AT_MOST_ONCE_FIELDS, AT_MOST_ONCE_PROMPT, StepPolicy, StepRecord


@dataclass(slots=True)
class _Pending:
    """A step that must be executed now (not replayed).

    ``logged``: a durable ``step.started`` carries its type and arguments, so
    its completion need not repeat them.
    """

    call_id: int
    name: str
    key: str
    type: str = "tool"
    args: dict[str, Any] | None = None
    attempt: int = 1
    logged: bool = False
    started: float = 0.0
    errors: list[str] | None = None  # "Type: message" of the failed attempts so far (None: none yet)
    digest: str | None = None  # of the arguments before the call (see ``steps.args_digest``), where checked


def _message(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when the error's ``__str__`` itself raises: journaling the step's failure must
    not replace the tool's error with that one (the agent catches the tool's, and would fail on the other)."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - any broken __str__
        return "(the error's message could not be formatted)"


def _question(rec: StepRecord) -> dict[str, Any]:
    """The input request of an at-most-once step found started but unfinished."""
    prompt = AT_MOST_ONCE_PROMPT.format(call_id=rec.call_id, name=rec.name)
    return {"call_id": rec.call_id, "prompt": prompt, "fields": AT_MOST_ONCE_FIELDS, "step": rec.name, "at_most_once": True}


class StepWriter:
    """Appends a step's events; mixed into the run context, which provides ``append``."""

    def append(
        self, kind: str, name: str = "", data: dict[str, Any] | None = None, *, durable: bool = True,
        json_checked: bool = False, wait: bool = True,
    ) -> None:
        raise NotImplementedError

    def _resolve(self, rec: StepRecord) -> None:
        """Journal an operator's answer to "did this step happen?" as the step's outcome."""
        if rec.error_type:
            data = {"call_id": rec.call_id, "error_type": rec.error_type, "error_module": rec.error_module,
                    "message": rec.message, "answered": True}
            self.append(ev.STEP_FAILED, rec.name, data)
            rec.state = "failed"
        else:
            self.append(ev.STEP_COMPLETED, rec.name, {"call_id": rec.call_id, "result": rec.result, "answered": True})
            rec.state = "completed"

    def _log_start(self, p: _Pending) -> None:
        """Journal a durable ``step.started``: on resume, a start without an outcome asks a human."""
        data = {"call_id": p.call_id, "type": p.type, "args": p.args, "attempt": p.attempt, "at_most_once": True}
        if p.digest is not None:
            data["ad"] = p.digest
        self.append(ev.STEP_STARTED, p.name, data)
        p.started = time.time()
        p.logged = True

    def _outcome(self, p: _Pending, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` plus what a completion-only step's event must carry (type, arguments, start time)."""
        if not p.logged:
            data["type"], data["args"], data["started"] = p.type, p.args, p.started
            if p.digest is not None:
                data["ad"] = p.digest
        if p.attempt > 1:
            data["attempt"] = p.attempt
        return data

    def _complete(self, p: _Pending, result: Any, meta: dict[str, Any] | None = None, *, durable: bool = True,
                  wait: bool = True) -> Any:
        """Journal the step's result (``durable=False``: see ``Journal.append``; the caller
        guarantees a durable append follows before anything depends on it staying recorded;
        ``wait=False`` too, and that the run's next append comes before any effect that must
        not happen once this append failed)."""
        if not is_json(result):
            try:
                check_json(result, f"step {p.name!r}", "result")
            except NotJSONError as e:
                self._fail(p, e)
                raise
        if not meta and not p.logged and p.attempt == 1:
            # The usual step (completion only, first attempt): its data built at once, keys in _outcome's order.
            data = {"call_id": p.call_id, "result": result, "type": p.type, "args": p.args, "started": p.started}
            if p.digest is not None:
                data["ad"] = p.digest
        else:
            data = {"call_id": p.call_id, "result": result}
            if meta:
                data.update(meta)  # e.g. a UDF's source, journaled with its first completion
            data = self._outcome(p, data)
        # The result was checked above and the arguments when the step began: a meta's are the caller's.
        try:
            self.append(ev.STEP_COMPLETED, p.name, data, durable=durable, json_checked=not meta, wait=wait)
        except NotJSONError as e:  # text no store can hold (a lone surrogate), found as the event was encoded
            self._fail(p, e)
            raise

        if observe.observers:
            self._observe(p, result, None)
        return result

    def _observe(self, p: _Pending, result: Any, exc: BaseException | None) -> None:
        view = observe.StepView(p.call_id, p.name, p.type, p.args or {}, p.started, time.time(), p.key, p.attempt,
                                result=result)
        if exc is not None:
            view.error_type, view.message = type(exc).__name__, _message(exc)
        observe.notify("step_ended", self, view)

    def _fail(self, p: _Pending, exc: BaseException, **extra: Any) -> None:
        t = type(exc)
        data = {"call_id": p.call_id, "error_type": t.__qualname__, "error_module": t.__module__,
                "message": storable_text(_message(exc))}
        self.append(ev.STEP_FAILED, p.name, self._outcome(p, {**data, **extra}))

    def _failed(self, p: _Pending, exc: Exception, policy: StepPolicy) -> float | None:
        """Journal a failed attempt; the delay before the next one, or ``None`` when the step has failed.

        ``None`` means the caller re-raises ``exc``. After the last of a tool's
        retries this raises :class:`RetriesExhaustedError` itself, naming every
        attempt's error.
        """
        if not policy.retries or not isinstance(exc, policy.retry_on) or isinstance(exc, NotJSONError):
            self._fail(p, exc)
            if observe.observers:
                self._observe(p, None, exc)
            return None
        if p.attempt <= policy.retries:
            delay = policy.delay(p.attempt)
            self._fail(p, exc, retry_in=round(delay, 6))
            return delay
        errors = [*(p.errors or ()), f"{type(exc).__name__}: {_message(exc)}"]
        final = RetriesExhaustedError(p.name, errors)
        # The last attempt's failure is the step's outcome and names every attempt.
        self.append(
            ev.STEP_FAILED,
            p.name,
            self._outcome(p, {
                "call_id": p.call_id, "error_type": "RetriesExhaustedError", "error_module": "engrain._errors",
                "message": final.message, "attempt_errors": errors,
            }),
        )
        if observe.observers:
            self._observe(p, None, final)
        raise final from exc

    def _next_attempt(self, p: _Pending, policy: StepPolicy, exc: Exception) -> None:
        p.errors = [*(p.errors or ()), f"{type(exc).__name__}: {_message(exc)}"]
        p.attempt += 1
        if policy.at_most_once:
            self._log_start(p)
        else:
            p.started = time.time()
