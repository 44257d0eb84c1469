"""Entry logs: an append-only list of entries kept as one run of the journal.

Framework adapters keep their state here: a LangGraph thread's checkpoints and
pending writes, an OpenAI Agents SDK session's items. Keeping them in the
journal (not in tables of their own) is what makes them show up in
``engrain runs``, ``engrain show`` and the UI beside engrain's own runs, on
either backend, and what lets ``engrain gc`` treat them like any other run.

A log is a run whose first event is ``run.started`` (with the adapter's name as
the run's ``agent``, so recovery never hands it to an agent) followed by
``log.entry`` events. A run at the log's id that another writer started (an
HTTP API client may create a run of any id, tagged ``client``) is never read
as the log: :class:`~engrain.AgentMismatchError`, and nothing is written to it.
Entries are facts appended by independent writers, so an
append that loses a race (:class:`~engrain.ConflictError`) re-reads the log's
end and tries again: no entry is lost and none is written twice. Reads are
incremental: an :class:`EntryLog` remembers how far it has read and only
fetches newer events, so a long log costs one small query per read, and an
append by the log's only writer is one round trip.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import AgentMismatchError, ConflictError
from .._events import LOG_ENTRY, RUN_STARTED, Event, NewEvent
from .._journal import Journal
from .identity import CLIENT_RUN, is_client_run

#: Appends retried after a lost race before giving up (each retry re-reads the log's end).
MAX_RETRIES = 50


class EntryLog:
    """One log in ``journal``, stored as run ``run_id``.

    ``task``, ``tags`` and ``agent`` describe the run in listings; they are
    written once, by the first append. Thread-safe.
    """

    def __init__(self, journal: Journal, run_id: str, *, task: str, tags: Sequence[str], agent: str,
                 inputs: dict[str, Any] | None = None):
        self.journal = journal
        self.run_id = run_id
        self._start = {"task": task, "inputs": dict(inputs or {}), "tags": list(tags), "agent": agent}
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._created: float | None = None

    def append(self, entries: Sequence[tuple[str, dict[str, Any]]]) -> list[Event]:
        """Append ``(name, data)`` entries atomically, after whatever is there now."""
        fixed = list(entries)
        # Entries that do not depend on the log's state: append at the end as last seen (one round trip
        # for a lone writer) and re-read only after losing a race.
        return self._write(lambda _: fixed, optimistic=True)

    def update(self, decide: Callable[[list[Event]], Sequence[tuple[str, dict[str, Any]]]]) -> list[Event]:
        """Append the entries ``decide(current entries)`` returns, atomically against other writers.

        If another writer appends first, ``decide`` runs again on the longer log,
        so an entry that depends on what is there (a pop, a removal) is never
        decided on a stale view. Returns the appended ``log.entry`` events.
        """
        return self._write(decide, optimistic=False)

    def _write(self, decide: Callable[[list[Event]], Sequence[tuple[str, dict[str, Any]]]],
               optimistic: bool) -> list[Event]:
        with self._lock:
            for attempt in range(MAX_RETRIES):
                if attempt or not optimistic:
                    self._refresh()
                new = [NewEvent(LOG_ENTRY, name, data)
                       for name, data in decide([e for e in self._events if e.kind == LOG_ENTRY])]
                if not new:
                    return []
                seq = len(self._events)
                batch = new if seq else [NewEvent(RUN_STARTED, "", self._start), *new]
                try:
                    stored = self.journal.append(self.run_id, batch, seq)
                except ConflictError:
                    continue  # another writer appended first: read its entries and decide again
                if not seq:
                    self._created = None  # learn the new run's creation time on the next read
                self._events.extend(stored)
                return [e for e in stored if e.kind == LOG_ENTRY]
        raise ConflictError(self.run_id, len(self._events))  # MAX_RETRIES appends in a row lost a race

    def entries(self, where: Callable[[Event], bool] | None = None) -> list[Event]:
        """The log's ``log.entry`` events in order (only those ``where`` accepts)."""
        with self._lock:
            self._refresh()
            return [e for e in self._events if e.kind == LOG_ENTRY and (where is None or where(e))]

    def delete(self) -> None:
        """Remove the log and its run from the journal (a no-op when there is none)."""
        with self._lock:
            if self.journal.get_run(self.run_id) is not None:
                self.journal.delete_run(self.run_id)
            self._events, self._created = [], None

    def _refresh(self) -> None:
        info = self.journal.get_run(self.run_id)
        if info is None:
            self._events, self._created = [], None
            return
        if self._created is not None and info.created != self._created or info.next_seq < len(self._events):
            self._events = []  # deleted and written again since the last read: start over
        self._created = info.created
        if info.next_seq > len(self._events):
            fresh = not self._events
            events = self.journal.read(self.run_id, after=len(self._events) - 1)
            if fresh and events:
                self._check_owner(events[0])
            self._events.extend(events)

    def _check_owner(self, first: Event) -> None:
        # The id is predictable and a client may create a run of any id: its forged entries
        # (a thread's checkpoints, a session's history) must never become this log's.
        data = first.data if first.kind == RUN_STARTED else {}
        if is_client_run(data):
            raise AgentMismatchError(self.run_id, CLIENT_RUN)
        if data.get("agent") != self._start["agent"]:
            raise AgentMismatchError(self.run_id, f"is not a {self._start['agent']} log (its run was started by "
                                                  f"{data.get('agent')!r}): it is never read or written as one")
