"""The clock and people in a run: ``engrain.now()``, ``engrain.ask()`` and ``engrain.answer()``.

Both are steps of the run: ``now`` journals the time it read, so a replay sees
the recorded time; ``ask`` journals an input request and pauses the run
(``needs_input``) until :func:`answer` records the answers and the run is
started again.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from .. import _events as ev
from .._errors import EngrainError, NotWaitingForInputError, RunFinishedError
from .._events import Event, NewEvent, check_json
from .._journal import Journal
from .context import _current, default_journal
from .steps import check_at_most_once_answer, steps_of


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


#: The status each event that finishes a run gives it.
_ENDED = {ev.RUN_COMPLETED: ev.OK, ev.RUN_FAILED: ev.FAILED, ev.RUN_CANCELLED: ev.CANCELLED}


def ended(events: list[Event]) -> str | None:
    """The status the first finishing event of ``events`` gave the run, or None while it has none.

    The first one, not the last: anything after it (an answer an older engrain accepted, a
    forged row) is not part of the run.
    """
    return next((_ENDED[e.kind] for e in events if e.kind in _ENDED), None)


def answer(run_id: str, answers: dict[str, Any], *, journal: Journal | None = None) -> None:
    """Record ``answers`` for the input a ``needs_input`` run waits for.

    An at-most-once step found started but unfinished asks "did this step
    happen?": answer ``{"result": value}`` (it happened and returned ``value``),
    ``{"retry": True}`` (call it again) or ``{"error": "message"}`` (fail it).
    A run that has ended (completed, failed or cancelled, even with a question
    left pending) raises :class:`RunFinishedError` and is left as it is.
    """
    from .._errors import RunNotFoundError

    j = journal or default_journal()
    events = j.read(run_id)
    if not events:
        raise RunNotFoundError(run_id)
    status = ended(events)
    if status is not None:
        raise RunFinishedError(run_id, status)
    waiting = [s for s in steps_of(events).values() if s.state == "waiting"]
    if not waiting:
        raise NotWaitingForInputError(run_id)
    check_json(answers, f"answers to run {run_id!r}", "answers")
    if waiting[-1].at_most_once:
        check_at_most_once_answer(waiting[-1].name, answers)
    # At the seq read above: an end appended since makes this a ConflictError, not an answer to a finished run.
    j.append(run_id, [NewEvent(ev.INPUT_RECEIVED, waiting[-1].name, {"call_id": waiting[-1].call_id, "answers": answers})], len(events))
