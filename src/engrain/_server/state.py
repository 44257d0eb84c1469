"""What the app and its route modules share: the per-app state, ``state_of`` and ``ApiError``.

Route modules import this, never :mod:`.app`, so the app can import them.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from fastapi import Request
from pydantic import BaseModel, Field, model_validator

from .._errors import JSONTooDeepError, RunFinishedError
from .._events import MAX_DEPTH, check_depth
from .._journal import Journal, open_journal
from . import contract  # noqa: F401  registers the {id:segment} convertor every templated route reads ids with


class FieldError(BaseModel):
    """One invalid field of a request: its location and what is wrong."""

    field: str
    message: str


class ErrorBody(BaseModel):
    """Every error response: ``error`` is the error's type name, ``detail`` says what was wrong."""

    error: str
    detail: str
    fields: list[FieldError] | None = None
    run_id: str | None = Field(default=None, description="RunFinishedError: the run the answers were for.")
    run_status: str | None = Field(default=None, description="RunFinishedError: how that run ended (ok, failed, cancelled).")


_ERRORS = {
    400: "Bad input (a malformed id or value the schema cannot express)",
    401: "Missing or wrong bearer token (only when the server has a token)",
    403: "Refused: a cross-site Origin or a client off this machine on a loopback server without a token,"
         " a write only the runtime may make, or a fork not allowed",
    404: "No such run, routine, agent or path",
    409: "Conflict: another writer appended first, the run is busy, it is not waiting for input, or it has ended"
         " (RunFinishedError, with run_id and run_status)",
    413: "Request body larger than the server's limit, or a client run past its event budget (RunTooLargeError)",
    421: "Host header is not this machine (DNS-rebinding guard of a loopback server)",
    422: "The request does not match the schema, or the data is invalid (fields names each problem)",
    500: "The store is corrupt (StoreCorruptError), or the server failed (InternalError)",
    501: "A feature (the routine engine) is not installed in this engrain",
    503: "The store could not be read or written (StorageError: a lost database, a full disk); retry later",
}
#: The error responses every operation may answer, all with :class:`ErrorBody` (OpenAPI ``responses``).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text} for code, text in _ERRORS.items()
}


class Body(BaseModel):
    """Base of every request body: JSON nested deeper than ``MAX_DEPTH`` is refused (422) naming its path.

    Checked before the fields are parsed, so a deep value never reaches a
    recursive reader (pydantic, the journal, the encoder of a later response).
    """

    @model_validator(mode="before")
    @classmethod
    def _not_too_deep(cls, data: Any) -> Any:
        try:
            check_depth(data, "request body", "body", MAX_DEPTH)
        except JSONTooDeepError as e:
            raise ValueError(str(e)) from None
        return data


class ApiError(Exception):
    """An error with an HTTP status, raised by route code for bad input.

    ``extra``: more members of the error body (each declared on :class:`ErrorBody`), for what a
    client must read as data rather than parse out of ``detail``.
    """

    def __init__(self, status: int, error: str, detail: str, headers: dict[str, str] | None = None,
                 extra: dict[str, Any] | None = None):
        self.status = status
        self.error = error
        self.detail = detail
        self.headers = headers or {}
        self.extra = extra or {}
        super().__init__(detail)


def run_finished(e: RunFinishedError) -> ApiError:
    """The 409 for answers to a run that has ended: the local error's name, the run and how it ended as fields.

    Not ``NotWaitingForInput`` (a run still going that asks nothing): a client tells the two
    apart by the name and reads ``run_status``, never the wording of ``detail``.
    """
    return ApiError(409, "RunFinishedError", str(e), extra={"run_id": e.run_id, "run_status": e.status})


class ServerState:
    """What the routes share: the journal, and lazily the cache store and memory."""

    def __init__(self, journal: Journal, token: str | None, routines_dir: Path, tools: Any = None):
        self.journal = journal
        self.token = token
        self.routines_dir = routines_dir
        #: The tool registry routine runs call (``None``: ``engrain.tools``).
        self.tools = tools
        #: The registered agents and the threads that run them (an ``AgentRunner``, set by ``create_app``).
        self.agents: Any = None
        #: LLM agents created over the API (an ``LLMAgents``, set by ``create_app``).
        self.llm_agents: Any = None
        #: ``POST /api/runs/{id}/fork`` may fork runs the runtime executes (``--allow-fork``); see ``operate.py``.
        self.allow_fork = False
        #: The size limits of runs API clients write (a ``RunBudget``, see ``run_limits.py``; set by ``create_app``).
        self.run_budget: Any = None
        self.closed = False
        #: SSE stream slots and the journal poller that feeds run streams (set by ``create_app``).
        self.slots: Any = None
        self.hub: Any = None
        self._lock = threading.Lock()
        self._cache: Any = None
        self._memory: Any = None
        #: Memory's embedder (a model string; None: the store's, or the default).
        self.embedder: str | None = None
        #: Where memory searches vectors (Memory's ``vector_search``).
        self.vector_search: str = "auto"
        #: Memory is not documented as thread-safe; requests use it one at a time.
        self.memory_lock = threading.Lock()

    @property
    def streams(self) -> int:
        """Open SSE streams (reported by /api/health; they end when their client disconnects)."""
        return self.slots.open if self.slots is not None else 0

    def cache_store(self) -> Any:
        """The behavior cache's store on the journal's database (opened on first use)."""
        with self._lock:
            if self._cache is None:
                from .._cache.store import CacheStore

                self._cache = CacheStore(self.journal)
            return self._cache

    def memory(self) -> Any:
        """Skill memory on the journal's database (opened on first use)."""
        with self._lock:
            if self._memory is None:
                from .._memory import Memory

                self._memory = Memory(self.journal.url, embedder=self.embedder, vector_search=self.vector_search)
            return self._memory

    def reopen(self) -> None:
        """Open the journal again after :meth:`close` (an app may be started more than once)."""
        if self.closed:
            self.journal = open_journal(self.journal.url)
            self.closed = False

    def close(self) -> None:
        """Flush the cache counters and close every connection."""
        with self._lock:
            objs, self._cache, self._memory = (self._cache, self._memory, self.journal), None, None
        for obj in objs:
            if obj is not None:
                try:
                    obj.close()
                except Exception:  # noqa: BLE001 - closing is best effort at shutdown
                    pass
        self.closed = True


def state_of(request: Request) -> ServerState:
    """The :class:`ServerState` of the app serving ``request``."""
    return request.app.state.engrain
