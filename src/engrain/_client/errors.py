"""The typed errors of :class:`~engrain.Client`: each server refusal with a local counterpart is also that error.

So one ``except RunFinishedError`` (or ``ConflictError``, ``RunNotFoundError``,
``NotWaitingForInputError``) serves a local journal and a remote server alike.
"""

from __future__ import annotations

import re

from .._errors import (
    ConflictError,
    NotWaitingForInputError,
    RemoteError,
    RunFinishedError,
    RunNotFoundError,
)
from .._events import STATUS_ALIASES


class RemoteRunNotFoundError(RemoteError, RunNotFoundError):
    """The server has no such run."""

    def __init__(self, status: int, error: str, detail: object, run_id: str):
        RemoteError.__init__(self, status, error, detail)
        self.run_id = run_id

    __str__ = RemoteError.__str__


class RemoteConflictError(RemoteError, ConflictError):
    """The server refused an append or answer because another writer got there first."""

    def __init__(self, status: int, error: str, detail: object, run_id: str):
        RemoteError.__init__(self, status, error, detail)
        self.run_id, self.expected_seq, self.actual_seq = run_id, -1, None

    __str__ = RemoteError.__str__


class RemoteRunFinishedError(RemoteError, RunFinishedError):
    """The server refused answers because the run has ended (``ok``, ``failed`` or ``cancelled``).

    What :func:`engrain.answer` raises locally, so one ``except RunFinishedError``
    serves both. ``status`` stays the HTTP status, as on every :class:`RemoteError`
    (code comparing it with numbers keeps working); ``run_status`` says how the run ended.
    """

    def __init__(self, status: int, error: str, detail: object, run_id: str, run_status: str):
        RemoteError.__init__(self, status, error, detail)
        self.run_id, self.run_status = run_id, run_status

    __str__ = RemoteError.__str__


#: Only for servers older than the ``RunFinishedError`` body (which names the run and its ``run_status``):
#: they answered a finished run with 409 ``NotWaitingForInput``, as for a run merely not waiting, and only
#: the local error's wording in ``detail`` told the two apart. Never read when the body says it.
_ENDED = re.compile(r"is not waiting for input: it has ended (\w+),")


def _run_finished(error: str, detail: object, body: object) -> str | None:
    """How the run ended, if this error body refuses answers to a run that has ended (else None)."""
    if error == "RunFinishedError" and isinstance(body, dict) and isinstance(body.get("run_status"), str):
        return body["run_status"]
    if error not in ("NotWaitingForInput", "RunFinishedError") or not isinstance(detail, str):
        return None
    older = _ENDED.search(detail)  # an older server, which said it only in words
    return None if older is None else older.group(1)


class RemoteNotWaitingForInputError(RemoteError, NotWaitingForInputError):
    """The server refused answers because the run, still going, asks for nothing (409 ``NotWaitingForInput``)."""

    def __init__(self, status: int, error: str, detail: object, run_id: str):
        RemoteError.__init__(self, status, error, detail)
        self.run_id = run_id

    __str__ = RemoteError.__str__


def remote_error(status: int, error: str, detail: object, body: object, run_id: str | None) -> RemoteError:
    """The error to raise for a server's error answer about ``run_id`` (None: a request about no one run)."""
    # The local counterpart is chosen by the server's error name, never by the status alone: many
    # 409s (a lease held, a run busy or finished) are no lost append race, and code that retries
    # on ConflictError would retry them forever.
    if run_id is not None:
        if status == 404 and error == "RunNotFoundError":
            return RemoteRunNotFoundError(status, error, detail, run_id)
        # A run busy in another executor is a conflict too: once it ends, the same call is answered.
        if status == 409 and error in ("ConflictError", "RunBusyError"):
            return RemoteConflictError(status, error, detail, run_id)
        run_status = _run_finished(error, detail, body)
        if run_status is not None:
            return RemoteRunFinishedError(status, error, detail, run_id, STATUS_ALIASES.get(run_status, run_status))
        if status == 409 and error == "NotWaitingForInput":
            return RemoteNotWaitingForInputError(status, error, detail, run_id)
    return RemoteError(status, error, detail)
