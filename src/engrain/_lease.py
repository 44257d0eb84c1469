"""Run leases: one live executor per run, and recovery of runs whose process died.

A durable run holds a lease on its run id while it executes and renews it from
a background thread, so a recovery worker (:func:`recover`) never resumes a run
that is still alive elsewhere. Owners are ``host:pid:token``: a lease left by a
dead process on this host is taken over at once, so restarting a crashed agent
right away works without waiting for the lease to expire.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._errors import LeaseHeldError
from ._journal import Journal

if TYPE_CHECKING:
    from ._durable import RunResult

#: How long a lease lives without renewal (seconds). Renewed every third of it.
DEFAULT_TTL = 30.0

_HOST = os.uname().nodename  # what socket.gethostname() returns, without importing socket
_OWNER: str | None = None
_OWNER_PID = -1


def owner_id() -> str:
    """This process's lease owner id (``host:pid:token``), new after a fork."""
    global _OWNER, _OWNER_PID
    if _OWNER is None or _OWNER_PID != os.getpid():
        _OWNER_PID = os.getpid()
        _OWNER = f"{_HOST}:{_OWNER_PID}:{os.urandom(4).hex()}"
    return _OWNER


def _dead_local_owner(owner: str | None) -> bool:
    """True when ``owner`` is a process on this host that no longer exists."""
    if not owner:
        return False
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != _HOST or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return owner != owner_id()  # our pid reused by a new process image (exec after fork)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


class Lease:
    """Holds the lease of one run while it executes (a context manager)."""

    def __init__(self, journal: Journal, run_id: str, ttl: float = DEFAULT_TTL):
        self.journal = journal
        self.run_id = run_id
        self.ttl = ttl
        self.owner = owner_id()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Lease:
        if not self.journal.acquire_lease(self.run_id, self.owner, self.ttl):
            info = self.journal.get_run(self.run_id)
            holder = info.lease_owner if info else None
            if not _dead_local_owner(holder):
                raise LeaseHeldError(self.run_id, holder)
            self.journal.release_lease(self.run_id, holder)  # type: ignore[arg-type]
            if not self.journal.acquire_lease(self.run_id, self.owner, self.ttl):
                info = self.journal.get_run(self.run_id)
                raise LeaseHeldError(self.run_id, info.lease_owner if info else None)
        self._thread = threading.Thread(target=self._renew, name=f"engrain-lease-{self.run_id}", daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.journal.acquire_lease(self.run_id, self.owner, self.ttl)
            except Exception:  # noqa: BLE001 - a failed renewal must not kill the run; the next try may succeed
                pass

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.journal.release_lease(self.run_id, self.owner)
        except Exception:  # noqa: BLE001 - the lease expires by itself; never mask the run's own outcome
            pass


def recover(
    agent: Callable[..., Any],
    *,
    journal: Journal | None = None,
    limit: int = 10,
    ttl: float = DEFAULT_TTL,
) -> list[RunResult]:
    """Claim up to ``limit`` unfinished runs whose executor died and resume each with ``agent``.

    Safe to call from many workers at once: each run is claimed by one of them.
    Returns the results of the resumed runs.
    """
    from ._durable import default_journal, run

    j = journal or default_journal()
    results = []
    for info in j.claim_runs(owner_id(), ttl, limit):
        started = j.read(info.run_id, after=-1)[:1]
        inputs = started[0].data.get("inputs", {}) if started else {}
        results.append(run(agent, info.task, run_id=info.run_id, inputs=inputs, journal=j))
    return results
