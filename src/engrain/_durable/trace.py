"""Traces: a finished run's events as one portable JSON document.

Our own format (``engrain export``) is ``{"format": "engrain.trace/1", "run":
{run summary}, "events": [event, ...]}``; the events are the journal's, so a
trace re-imports losslessly.
"""

from __future__ import annotations

from typing import Any

from .._errors import RunNotFoundError
from .._journal import Journal

TRACE_FORMAT = "engrain.trace/1"


def export_run(journal: Journal, run_id: str) -> dict[str, Any]:
    """The trace of ``run_id``: its summary and every event, JSON-ready."""
    info = journal.get_run(run_id)
    if info is None:
        raise RunNotFoundError(run_id)
    events = journal.read(run_id)
    started = events[0].data if events else {}
    return {
        "format": TRACE_FORMAT,
        "run": {**info.to_dict(), "inputs": started.get("inputs", {})},
        "events": [e.to_dict() for e in events],
    }
