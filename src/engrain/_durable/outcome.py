"""What a run records about its agent: the agent's name at the start, its failure at the end.

The name in ``run.started`` (see :mod:`.identity`) is how :func:`~engrain.recover`
knows which agent may resume a run; the ``run.failed`` record keeps the error
and its traceback (bounded) for ``engrain show`` and the web UI.
"""

from __future__ import annotations

from typing import Any

from .._errors import ConfigError, StepFailedError
from .._events import storable_text
from .identity import AGENT_NAME_LIMIT, agent_name

#: Most characters of a traceback kept in ``run.failed`` (its end: the innermost frames).
TRACEBACK_LIMIT = 16_000

__all__ = ["AGENT_NAME_LIMIT", "agent_name", "check_agent_name", "failure", "failure_report", "traceback_text"]


def check_agent_name(name: Any) -> str:
    """``name`` if it is a valid explicit agent name, else :class:`~engrain.ConfigError` saying why."""
    if not isinstance(name, str) or not name.strip() or len(name) > AGENT_NAME_LIMIT:
        raise ConfigError(
            f"agent_name must be a non-blank string of at most {AGENT_NAME_LIMIT} characters, got {name!r:.80}"
        )
    return name


def traceback_text(exc: BaseException) -> str:
    """``exc``'s formatted traceback (with its causes), cut to its last :data:`TRACEBACK_LIMIT` characters."""
    import traceback  # lazily: only failed runs pay for it

    try:
        text = "".join(traceback.format_exception(exc))
    except Exception:  # noqa: BLE001 - a broken __str__ must not stop the failure from being journaled
        text = f"{type(exc).__qualname__} (its traceback could not be formatted)\n"
    if len(text) > TRACEBACK_LIMIT:
        cut = len(text) - TRACEBACK_LIMIT
        text = f"[... {cut} characters cut ...]\n" + text[cut:]
    return storable_text(text)


def failure(exc: BaseException) -> dict[str, Any]:
    """The data of the ``run.failed`` event for a run whose agent raised ``exc``."""
    t = type(exc)
    try:
        message = storable_text(str(exc))
    except Exception:  # noqa: BLE001 - same as above
        message = "(the error's message could not be formatted)"
    return {
        "error": f"{t.__name__}: {message}",
        "error_type": t.__name__,
        "error_module": t.__module__,
        "traceback": traceback_text(exc),
        # Every run.failed is final: neither recover() nor a resume runs the agent again.
        "terminal": True,
    }


def failure_report(exc: BaseException) -> dict[str, Any]:
    """em-core's failure report of ``exc``: ``{step_id, error_type, message}`` (see RunResult).

    A failed step (:class:`~engrain.StepFailedError`, e.g. a routine step) reports
    its own error type and message; any other exception its class name and text.
    """
    if isinstance(exc, StepFailedError):
        return {"step_id": getattr(exc, "step_id", None), "error_type": exc.error_type, "message": exc.message}
    try:
        message = storable_text(str(exc))
    except Exception:  # noqa: BLE001 - as in failure()
        message = "(the error's message could not be formatted)"
    return {"step_id": None, "error_type": type(exc).__name__, "message": message}
