"""Whether a run takes answers: the question it waits on, and the refusals the HTTP API and MCP share."""

from __future__ import annotations

from typing import Any

from .. import _events as ev
from .._durable.human import ended
from .._errors import RunFinishedError
from .._events import Event
from .state import ApiError, run_finished


def pending_prompt(events: list[Event]) -> dict[str, Any] | None:
    """The ``input.requested`` data a run waits on, or None."""
    # In order: an at-most-once step may ask again after an earlier answer (a second crash).
    # Keyed by call_id as written: a question without a step number still reads as pending, so that
    # answering it fails naming the event (400); only an object or a list (a client's, unhashable) is skipped.
    waiting: dict[Any, dict[str, Any]] = {}
    for e in events:
        cid = e.data.get("call_id")
        if isinstance(cid, (dict, list)):
            continue
        if e.kind == ev.INPUT_REQUESTED:
            waiting[cid] = dict(e.data)
        elif e.kind == ev.INPUT_RECEIVED:
            waiting.pop(cid, None)
    return next(reversed(waiting.values()), None)


def check_answerable(run_id: str, events: list[Event]) -> None:
    """Refuse answers to a run that has ended (409 ``RunFinishedError``) or asks nothing (409 ``NotWaitingForInput``)."""
    status = ended(events)
    if status is not None:  # a question it left pending still looks open to pending_prompt
        raise run_finished(RunFinishedError(run_id, status))
    if pending_prompt(events) is None:
        raise ApiError(409, "NotWaitingForInput", f"run {run_id!r} is not waiting for input")
