"""What the app and its route modules share: the per-app state, ``state_of`` and ``ApiError``.

Route modules import this, never :mod:`.app`, so the app can import them.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from fastapi import Request

from .._journal import Journal, open_journal


class ApiError(Exception):
    """An error with an HTTP status, raised by route code for bad input."""

    def __init__(self, status: int, error: str, detail: str):
        self.status = status
        self.error = error
        self.detail = detail
        super().__init__(detail)


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
        self.closed = False
        #: Open SSE streams (reported by /api/health; they end when their client disconnects).
        self.streams = 0
        self._lock = threading.Lock()
        self._cache: Any = None
        self._memory: Any = None
        #: Memory is not documented as thread-safe; requests use it one at a time.
        self.memory_lock = threading.Lock()

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

                self._memory = Memory(self.journal.url)
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
