"""``engrain.enqueue`` and ``engrain.queue``: put runs on queues that workers execute."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from .._durable.context import default_journal, new_run_id
from .._errors import ConfigError
from .._journal import Journal
from .._journal._common import check_run_id
from .store import QueueInfo, QueueStore

_AGENT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,99}$")
_stores: dict[int, tuple[Journal, QueueStore]] = {}
_lock = threading.Lock()


def store_of(journal: Journal) -> QueueStore:
    """The queue tables of ``journal`` (created on first use, once per journal object)."""
    with _lock:
        hit = _stores.get(id(journal))
        if hit is None or hit[0] is not journal:
            hit = _stores[id(journal)] = (journal, QueueStore(journal))
        return hit[1]


def _agent_name(agent: str | Callable[..., Any]) -> str:
    name = agent if isinstance(agent, str) else getattr(agent, "__name__", None)
    if not isinstance(name, str) or not _AGENT_NAME.match(name):
        raise ConfigError(f"agent must be a name (letters, digits, '_', '.', '-') or a named function, got {agent!r}")
    return name


def enqueue(
    agent: str | Callable[..., Any],
    task: str,
    *,
    queue: str = "default",
    inputs: dict[str, Any] | None = None,
    run_id: str | None = None,
    priority: int = 0,
    tags: list[str] | None = None,
    journal: Journal | None = None,
) -> str:
    """Queue a run of ``agent(task, **inputs)`` and return its run id at once.

    ``agent`` is the name a worker knows it by (the key in ``engrain worker
    --agents``' dict, or a function's ``__name__``). The run shows ``queued``
    until a worker serving ``queue`` claims it; higher ``priority`` first.
    Bad arguments raise :class:`~engrain.ConfigError`; a ``run_id`` that already
    exists, ``RunExistsError`` (a :class:`~engrain.ConflictError` and a ``ConfigError``).
    """
    j = journal or default_journal()
    if not isinstance(task, str) or len(task) > 100_000:
        raise ConfigError("task must be a string of at most 100000 characters")
    if inputs is not None and not isinstance(inputs, dict):
        raise ConfigError(f"inputs must be a dict, got {type(inputs).__name__}")
    if tags is not None and not isinstance(tags, (list, tuple)):  # list() of a string would take its characters
        raise ConfigError(f"tags must be a list of strings, got {type(tags).__name__}")
    if run_id is not None:
        check_run_id(run_id)  # "" is a bad id, not a request for a fresh one (as fork)
    rid = new_run_id() if run_id is None else run_id
    store_of(j).enqueue(rid, _agent_name(agent), task, queue, dict(inputs or {}), priority, list(tags or []))
    return rid


def queue(
    name: str, *, concurrency: int | None = None, rate: tuple[int, float] | None = None, journal: Journal | None = None
) -> QueueInfo:
    """Declare queue ``name``'s limits, shared by every worker on the store.

    ``concurrency``: at most this many of its runs execute at once;
    ``rate=(n, seconds)``: at most ``n`` runs start per ``seconds``.
    """
    return store_of(journal or default_journal()).declare(name, concurrency, rate)


def queues(*, journal: Journal | None = None) -> list[QueueInfo]:
    """Every queue with its limits and its queued and running counts."""
    return store_of(journal or default_journal()).queues()
