"""How large a run API clients write may grow, and how many events one read returns.

A client writes its own runs through ``POST /api/runs/{id}/events`` (1000
events per request, 2 MB per body), as often as it likes; every full read of
such a run (``GET /api/runs/{id}``, a stream replaying it) then holds all of it
in memory. So a client run has a budget: at most ``max_events`` events and
``max_bytes`` of event data (names and JSON data, UTF-8), both set on
``engrain serve`` (``--max-run-events``, ``--max-run-bytes``). An append past
either is refused whole with 413 ``RunTooLargeError`` naming the run and the
limit; nothing of it is stored. Runs the runtime writes (agents, routines,
``engrain.run``) are not counted: their size is the code's, not a client's.

The event count needs no read: an append that succeeds starts at the run's
next seq, which the client states (``expected_seq``). The bytes a run holds are
remembered per run after each append this server made; only an append this
server did not see coming (after a restart, or another server's append) reads
them once from the journal, and only when ``expected_seq`` is the run's true
next seq (otherwise the append is a conflict anyway, and must not buy a read).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from .. import _events as ev
from .state import ApiError

#: Defaults of ``engrain serve``: a run a client writes holds at most this many events...
MAX_RUN_EVENTS = 100_000
#: ... and this many bytes of event names and data.
MAX_RUN_BYTES = 64 * 1024 * 1024
#: ``GET /api/runs/{id}/events``: events per page by default, and at most.
DEFAULT_PAGE = 1000
MAX_PAGE = 10_000
#: Runs whose size this server remembers (the most recently appended to).
_REMEMBERED = 4096


def _size(name: str, data_text: str) -> int:
    # The budget is checked before the journal validates the text: a lone surrogate must reach the
    # journal's typed refusal (422 NotJSONError), not fail the count here (it is one code point of 3 bytes).
    return len(name.encode("utf-8", "surrogatepass")) + len(data_text.encode("utf-8", "surrogatepass"))


class RunBudget:
    """The per-run limits of client runs, and the sizes this server last saw them at."""

    def __init__(self, max_events: int = MAX_RUN_EVENTS, max_bytes: int = MAX_RUN_BYTES):
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._sizes: OrderedDict[str, tuple[int, int]] = OrderedDict()  # run_id -> (next seq, bytes)
        self._lock = threading.Lock()

    def _refuse(self, run_id: str, what: str, limit: str) -> ApiError:
        return ApiError(413, "RunTooLargeError",
                        f"run {run_id!r}: {what}, past this server's limit of {limit} per client run "
                        "(engrain serve --max-run-events / --max-run-bytes); nothing of this append was stored")

    def check(self, journal: Any, run_id: str, expected_seq: int, events: list[ev.NewEvent]) -> int:
        """Raise 413 when appending ``events`` at ``expected_seq`` would take the run past a limit;
        else return the bytes the run will hold (pass it to :meth:`appended`)."""
        after = expected_seq + len(events)
        if after > self.max_events:
            raise self._refuse(run_id, f"{len(events)} events appended at seq {expected_seq} would make {after} events",
                               f"{self.max_events} events")
        new = sum(_size(e.name, ev.dumps(e.data)) for e in events)
        if new > self.max_bytes:
            raise self._refuse(run_id, f"this append alone holds {new} bytes", f"{self.max_bytes} bytes")
        held = self._held(journal, run_id, expected_seq)
        if held is not None and held + new > self.max_bytes:
            raise self._refuse(run_id, f"{held + new} bytes of events (it holds {held}, this append adds {new})",
                               f"{self.max_bytes} bytes")
        return (held or 0) + new

    def appended(self, run_id: str, next_seq: int, size: int) -> None:
        """Remember the run's size after an append this server made."""
        with self._lock:
            self._sizes[run_id] = (next_seq, size)
            self._sizes.move_to_end(run_id)
            while len(self._sizes) > _REMEMBERED:
                self._sizes.popitem(last=False)

    def _held(self, journal: Any, run_id: str, expected_seq: int) -> int | None:
        """Bytes the run holds now; None when ``expected_seq`` is not its next seq (the append will conflict)."""
        if expected_seq == 0:
            return 0
        with self._lock:
            known = self._sizes.get(run_id)
        if known is not None and known[0] == expected_seq:
            return known[1]
        info = journal.get_run(run_id)
        if info is None or info.next_seq != expected_seq:
            return None
        # Bounded by the limits a server had when the run was written (only client runs get here).
        return sum(_size(r[3], r[4]) for r in journal.read_raw(run_id))
