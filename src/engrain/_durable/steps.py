"""Steps: what the journal records about each call of a durable run, and the per-tool policy.

A step journals only its completion by default (``step.completed`` carries the
call's type, arguments and start time along with its result): one commit per
step. A step that was running at a crash left nothing, so it runs again with
the same idempotency key. A tool declared ``at_most_once`` journals a durable
``step.started`` before the call; a start with no completion then means "it may
have happened", and the run asks a human instead of calling it again.

A failed attempt that will be retried is a ``step.failed`` with ``retry_in``
(seconds until the next attempt): it is not the step's outcome, only the last
``step.failed`` without ``retry_in`` is.
"""

from __future__ import annotations

import builtins
import random
import sys
from dataclasses import dataclass
from typing import Any

import msgspec

from .. import _events as ev
from .._errors import EngrainError, RetriesExhaustedError, StepFailedError

# Which recorded step answers a call (re-exported: callers import these from here).
from .matching import (  # noqa: F401
    _SCALARS,
    ARGS_CHECKED,
    LOOSE_IN_ORDER,
    SCALARS,
    RecordedCalls,
    args_digest,
    call_digest,
    mutable_args_digest,
    same_args,
    same_call,
    same_json,
    same_kinds,
    steps_together,
)


#: The question an at-most-once step asks when its run resumes after a crash mid-call.
AT_MOST_ONCE_PROMPT = (
    "did this step happen? step {call_id} ({name}) was started and the process stopped before it finished;"
    " answer {{\"result\": <what it returned>}} if it happened, {{\"retry\": true}} to call it again,"
    " or {{\"error\": \"...\"}} to fail it"
)
#: The fields of that question, for forms (UI, CLI).
AT_MOST_ONCE_FIELDS = [
    {"name": "result", "type": "json", "description": "the step happened: its result"},
    {"name": "retry", "type": "boolean", "description": "it did not happen: call it again"},
    {"name": "error", "type": "string", "description": "fail the step with this message"},
]


@dataclass(frozen=True, slots=True)
class StepPolicy:
    """How a tool's calls are journaled and retried (see :func:`engrain.tool`)."""

    at_most_once: bool = False
    retries: int = 0
    backoff: float = 0.5
    max_backoff: float = 30.0
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if not isinstance(self.retries, int) or isinstance(self.retries, bool) or not 0 <= self.retries <= 1000:
            raise EngrainError(f"retries must be an integer from 0 to 1000, got {self.retries!r}")
        for field in ("backoff", "max_backoff"):
            v = getattr(self, field)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 86400:
                raise EngrainError(f"{field} must be a number of seconds from 0 to 86400, got {v!r}")
        if not self.retry_on or not all(isinstance(t, type) and issubclass(t, BaseException) for t in self.retry_on):
            raise EngrainError(f"retry_on must be a tuple of exception classes, got {self.retry_on!r}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based): exponential, capped, with full jitter."""
        cap = min(self.max_backoff, self.backoff * (2 ** min(attempt - 1, 60)))
        # Jitter in [cap/2, cap]: retries of many runs spread out, and never wait 0.
        return cap / 2 + random.random() * cap / 2


DEFAULT_POLICY = StepPolicy()


# A completion's data decodes straight into its record (see steps_of_rows): these keys name
# the record's other fields, so no key a completion carries (a caller's meta) can set them.
_NOT_IN_A_COMPLETION = ("name", "state", "error_type", "error_module", "message", "at_most_once", "retry_at", "errors")


# gc=False: a record holds JSON values only (never itself), so it can be in no reference cycle, and
# not tracking 10k of them saves a resume a third of its decoding (the collector's passes).
class StepRecord(msgspec.Struct, gc=False, rename={"attempts": "attempt", "digest": "ad", **{f: "~" + f for f in _NOT_IN_A_COMPLETION}}):
    """What the journal says about one step (one ``call_id``).

    ``state``: ``started`` (a durable start, no outcome), ``completed``, ``failed``,
    ``retrying`` (an attempt failed and another is due), ``waiting`` (input
    requested), ``answered``; for an at-most-once step asked "did this step
    happen?": ``retry`` (call it again) or ``resolved`` (the answer gives its
    outcome, journaled as the step's completion or failure when the run resumes).
    """

    call_id: int
    name: str = ""
    type: str = "tool"
    args: dict[str, Any] = msgspec.field(default_factory=dict)
    attempts: int = 1
    state: str = "started"
    result: Any = None
    error_type: str = ""
    error_module: str = ""
    message: str = ""
    at_most_once: bool = False
    retry_at: float = 0.0  # wall time of the next attempt while ``retrying``
    errors: list[str] | None = None  # "Type: message" of each failed attempt
    digest: str | None = None  # of the arguments as the call began (``ad``, see ``args_digest``)


_decode_completions = msgspec.json.Decoder(list[StepRecord]).decode
_FOLDED = frozenset({ev.STEP_STARTED, ev.STEP_FAILED, ev.INPUT_REQUESTED, ev.INPUT_RECEIVED, ev.REPLAY_COMPLETED})


def _record(steps: dict[int, StepRecord], e: ev.Event) -> StepRecord:
    """The record of ``e``'s step, created from the event when it is the first one (completion-only steps)."""
    d = e.data
    cid = d["call_id"]
    rec = steps.get(cid)
    if rec is None:
        rec = steps[cid] = StepRecord(cid, e.name, d.get("type", "tool"), d.get("args") or {}, attempts=0,
                                      digest=d.get("ad"))
    return rec


def _completed(steps: dict[int, StepRecord], cid: int, attempt: int, result: Any) -> StepRecord | None:
    """Mark a step that already has a record completed; None when it has none (the caller makes it)."""
    rec = steps.get(cid)
    if rec is not None:
        rec.state, rec.result = "completed", result
        rec.attempts = max(rec.attempts, attempt)
    return rec


#: What folding an event whose data lacks a field or has one of the wrong type raises.
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError)


def steps_of(events: list[ev.Event]) -> dict[int, StepRecord]:
    """Fold a run's events into one record per step.

    Raises :class:`~engrain.EngrainError` naming the first event that does not
    fold: a run written over the HTTP API holds whatever its client sent, and an
    answer or a fork of it must be refused, not fail with a ``KeyError``.
    """
    try:
        return _steps_of(events)
    except _MALFORMED:
        raise _unreadable(events) from None


def _unreadable(events: list[ev.Event]) -> EngrainError:
    """The error naming the first event of ``events`` that does not fold.

    The fold is sequential, so once a prefix fails every longer one does: a
    binary search finds the event in O(log n) folds.
    """
    lo, hi = 0, len(events)  # events[:lo] folds, events[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            _steps_of(events[:mid])
            lo = mid
        except _MALFORMED:
            hi = mid
    bad = events[hi - 1]
    return EngrainError(
        f"run {bad.run_id!r}: event {bad.seq} ({bad.kind}) is not a step event engrain can read (it needs an"
        " integer call_id and fields of the types engrain writes)"
    )


def _steps_of(events: list[ev.Event]) -> dict[int, StepRecord]:
    steps: dict[int, StepRecord] = {}
    for e in events:
        d = e.data
        if e.kind == ev.STEP_COMPLETED:
            cid = d["call_id"]
            if _completed(steps, cid, d.get("attempt", 1), d.get("result")) is None:
                steps[cid] = StepRecord(cid, e.name, d.get("type", "tool"), d.get("args") or {},
                                        d.get("attempt", 1), "completed", d.get("result"),
                                        digest=d.get("ad"))
        elif e.kind in _FOLDED:
            _fold(steps, e)
    return steps


def steps_of_rows(run_id: str, rows: list[ev.Row]) -> dict[int, StepRecord]:
    """:func:`steps_of` for raw journal rows (``Journal.read_raw``), without an event or a dict per completion.

    Resuming a 10k-step run folds 10k completions: their data texts are decoded
    in one call straight into records. Rows of kinds the fold ignores are not
    decoded at all. Data the typed decoder refuses (a ``null`` where a record
    holds a string, NaN, ...) takes the plain path over events.
    """
    try:
        records = iter(_decode_completions("[" + ",".join([r[4] for r in rows if r[2] == ev.STEP_COMPLETED]) + "]"))
    except (msgspec.MsgspecError, TypeError):
        return steps_of(ev.events_of(run_id, rows))
    try:
        return _fold_rows(run_id, rows, records)
    except _MALFORMED:
        return steps_of(ev.events_of(run_id, rows))  # names the event that does not fold


def _fold_rows(run_id: str, rows: list[ev.Row], records: Any) -> dict[int, StepRecord]:
    others = [r for r in rows if r[2] in _FOLDED]
    folded = iter(ev.events_of(run_id, others))
    steps: dict[int, StepRecord] = {}
    get = steps.get
    for r in rows:
        kind = r[2]
        if kind == ev.STEP_COMPLETED:
            rec = next(records)
            if get(rec.call_id) is None:  # the common case: a completion-only step
                rec.name, rec.state = r[3], "completed"
                steps[rec.call_id] = rec
            else:
                _completed(steps, rec.call_id, rec.attempts, rec.result)
        elif kind in _FOLDED:
            _fold(steps, next(folded))
    return steps


def _fold(steps: dict[int, StepRecord], e: ev.Event) -> None:
    """Fold one event other than a completion into its step's record."""
    d = e.data
    kind = e.kind
    if kind == ev.STEP_STARTED:
        rec = steps.get(d["call_id"])
        if rec is None:
            steps[d["call_id"]] = StepRecord(
                d["call_id"], e.name, d.get("type", "tool"), d.get("args") or {},
                attempts=d.get("attempt", 1), at_most_once=bool(d.get("at_most_once")), digest=d.get("ad"),
            )
        else:
            rec.attempts = max(rec.attempts + 1, d.get("attempt", 1))
            rec.state = "started"
            rec.at_most_once = rec.at_most_once or bool(d.get("at_most_once"))
    elif kind == ev.STEP_FAILED:
        rec = _record(steps, e)
        rec.attempts = max(rec.attempts, d.get("attempt", 1))
        rec.error_type, rec.message = d.get("error_type", ""), d.get("message", "")
        rec.error_module = d.get("error_module", "")
        if rec.errors is None:
            rec.errors = []
        rec.errors.append(f"{rec.error_type}: {rec.message}")
        if "retry_in" in d:
            rec.state, rec.retry_at = "retrying", e.ts + float(d["retry_in"])
        else:
            rec.state = "failed"
            if isinstance(d.get("attempt_errors"), list):
                rec.errors = [str(x) for x in d["attempt_errors"]]
    elif kind == ev.INPUT_REQUESTED:
        cid = d["call_id"]
        rec = steps.get(cid)
        if rec is not None and rec.at_most_once:
            rec.state = "waiting"  # the "did this step happen?" question
        else:
            steps[cid] = StepRecord(cid, e.name or "engrain.ask", "input", {"prompt": d.get("prompt"), "fields": d.get("fields")}, state="waiting")
    elif kind == ev.REPLAY_COMPLETED:
        for cid, (name, type_, args, result, _started) in replayed_steps(d):
            steps[cid] = StepRecord(cid, name, type_, args, 1, "completed", result)
    elif kind == ev.INPUT_RECEIVED:
        rec = steps[d["call_id"]]
        answers = d.get("answers")
        if rec.type != "input" and rec.at_most_once and isinstance(answers, dict):
            _answered_at_most_once(rec, answers)
        else:
            rec.state, rec.result = "answered", answers


def replayed_steps(data: dict[str, Any]) -> list[tuple[int, tuple[str, str, dict[str, Any], Any, Any]]]:
    """``(call_id, (name, type, args, result, started))`` of each step a ``replay.completed`` carries.

    An item's sixth element (the completion's other keys) is not part of a step's record; malformed items are skipped.
    """
    items = data.get("completions")
    out = []
    for cid, item in enumerate(items if isinstance(items, list) else []):
        if isinstance(item, list) and len(item) in (5, 6) and isinstance(item[0], str) and isinstance(item[1], str) \
                and isinstance(item[2], dict):
            out.append((cid, (item[0], item[1], item[2], item[3], item[4])))
    return out


def _answered_at_most_once(rec: StepRecord, answers: dict[str, Any]) -> None:
    if answers.get("retry"):
        rec.state = "retry"
    elif "error" in answers:
        rec.state, rec.error_type, rec.message = "resolved", "StepFailedError", str(answers["error"])
        rec.error_module = "engrain._errors"
    else:
        rec.state, rec.result, rec.error_type = "resolved", answers.get("result"), ""


def check_at_most_once_answer(name: str, answers: Any) -> None:
    """Raise :class:`EngrainError` unless ``answers`` is one valid answer to the at-most-once question."""
    keys = set(answers) if isinstance(answers, dict) else set()
    if len(keys) != 1 or not keys <= {"result", "retry", "error"} or ("retry" in keys and answers["retry"] is not True):
        raise EngrainError(
            f"step {name!r} asks whether it happened: answer with exactly one of"
            f" {{'result': ...}}, {{'retry': True}} or {{'error': 'message'}}, got {answers!r}"
        )


def replay(rec: StepRecord) -> Any:
    """The recorded outcome of a finished step: its result, or its error raised again."""
    if rec.state == "completed":
        return rec.result
    if rec.error_module == "engrain._errors":
        if rec.error_type == "RetriesExhaustedError":
            raise RetriesExhaustedError(rec.name, rec.errors or [])
        if rec.error_type == "StepFailedError":  # an operator's answer to the at-most-once question
            raise StepFailedError(rec.name, "error", rec.message)
        # Never the generic path below: these constructors take other arguments than a message.
        raise _own_error(rec.error_type, rec.message) or StepFailedError(rec.name, rec.error_type, rec.message)
    # Re-raise the original type only when it is already loaded: importing a
    # module named by journal data would run code chosen by whoever wrote it.
    mod = sys.modules.get(rec.error_module) if rec.error_module else None
    cls = getattr(mod, rec.error_type, None) if mod else getattr(builtins, rec.error_type, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            exc = cls(rec.message)
        except Exception:
            # A constructor taking other arguments (``Declined(code, reason)``): the type the first execution
            # raised all the same, else a resume would fail where the agent caught it (see _without_init).
            exc = _without_init(cls, rec.message)
        if exc is not None:
            raise exc
    raise StepFailedError(rec.name, rec.error_type, rec.message)


def _without_init(cls: type[BaseException], message: str) -> BaseException | None:
    """An instance of ``cls`` holding ``message``, made without its ``__init__``; None when its text would differ."""
    try:
        exc = cls.__new__(cls)
        Exception.__init__(exc, message)
        if str(exc) != message:  # a class whose __str__ reads fields __init__ would have set
            return None
    except Exception:
        return None
    return exc


def _own_error(name: str, message: str) -> EngrainError | None:
    """Engrain's error class ``name`` holding ``message``, or None when it cannot be rebuilt faithfully.

    An agent that caught, say, ``NotJSONError`` on its first execution must catch the same
    type on a resume, but most of these classes build their message from arguments the
    journal does not keep, so the message is set without calling their ``__init__``. Only
    classes defined in ``engrain._errors`` qualify: the name comes from journal data, and
    that module holds no class whose creation has an effect.
    """
    from .. import _errors

    cls = getattr(_errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, EngrainError) and cls.__module__ == _errors.__name__):
        return None
    # A StepFailedError's fields (the inner error type) are read by the run's failure report and
    # are not in the message; the others say the store or another executor has the run, which a
    # replayed step must not claim (they leave a run resumable, and every resume would replay them).
    if issubclass(cls, (_errors.StepFailedError, _errors.ConflictError, _errors.LeaseHeldError, _errors.StorageError)):
        return None
    return _without_init(cls, message)  # type: ignore[return-value]
