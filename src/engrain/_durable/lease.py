"""Run leases: one live executor per run.

A durable run holds a lease on its run id while it executes, so a recovery
worker (:func:`~engrain._durable.recovery.recover`) never resumes a run that is still alive elsewhere.
Owners are ``host:pid:token``: a lease left by a dead process on this host is
taken over at once, so restarting a crashed agent right away works without
waiting for the lease to expire.

A new run is created already leased and a finished one drops its lease with
its last event (``Journal.append``), so a short run writes nothing for its
lease. One daemon thread per process renews the leases of runs that have
lived past a third of their ttl; a run only registers with it, so it pays no
thread start or join.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any

from .._errors import LeaseHeldError
from .._journal import Journal

def _ttl_from_env() -> float:
    try:
        ttl = float(os.environ.get("ENGRAIN_LEASE_TTL", "10"))
    except ValueError:
        return 10.0
    return ttl if 0.5 <= ttl <= 3600 else 10.0


#: How long a lease lives without renewal (seconds; ``$ENGRAIN_LEASE_TTL``, default 10). Renewed after a third of it.
DEFAULT_TTL = _ttl_from_env()

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
    """The lease of one run while it executes (a context manager).

    :meth:`take` records a lease already taken by the append that created the
    run; :meth:`__enter__` acquires it otherwise. :meth:`stop` must come before
    the append that finishes the run (so no renewal can bring the dropped
    lease back), :meth:`dropped` after it succeeded; :meth:`__exit__` releases
    a lease still held.
    """

    def __init__(self, journal: Journal, run_id: str, ttl: float = DEFAULT_TTL):
        self.journal = journal
        self.run_id = run_id
        self.ttl = ttl
        self.owner = owner_id()
        self.held = False
        #: The lease epoch this executor holds (``Journal.take_lease``): its appends are fenced with it.
        self.epoch: int | None = None
        self.due = 0.0  # monotonic time of the next renewal
        self.renewing = False  # a renewal is in flight (guarded by the renewer's lock)
        self._registered = False

    def take(self, epoch: int = 1) -> None:
        """Record that the lease is held: taken by the append that created the run with ``lease=(owner, ttl)``."""
        self.held = True
        self.epoch = epoch
        self.due = time.monotonic() + self.ttl / 3

    def __enter__(self) -> Lease:
        if not self.held:
            self.acquire()
        _renewer.add(self)
        self._registered = True
        return self

    def acquire(self) -> None:
        """Take the lease of an existing run (a dead local holder's at once), or raise :class:`LeaseHeldError`."""
        j = self.journal
        epoch = j.take_lease(self.run_id, self.owner, self.ttl)
        if epoch is None:
            info = j.get_run(self.run_id)
            holder = info.lease_owner if info else None
            if not _dead_local_owner(holder):
                raise LeaseHeldError(self.run_id, holder)
            j.release_lease(self.run_id, holder)  # type: ignore[arg-type]
            epoch = j.take_lease(self.run_id, self.owner, self.ttl)
            if epoch is None:
                info = j.get_run(self.run_id)
                raise LeaseHeldError(self.run_id, info.lease_owner if info else None)
        self.take(epoch)

    def renew(self) -> None:
        """Extend the lease by ``ttl`` from now (called by the renewal thread)."""
        self.due = time.monotonic() + self.ttl / 3
        try:
            self.journal.acquire_lease(self.run_id, self.owner, self.ttl)
        except Exception:  # noqa: BLE001 - a failed renewal must not kill the run; the next try may succeed
            pass

    def stop(self) -> None:
        """Stop renewing (waiting out a renewal in flight); the lease stays held until it expires or is released."""
        if self._registered:
            self._registered = False
            _renewer.remove(self)

    def dropped(self) -> None:
        """The journal dropped the lease (the run's finishing event was appended): nothing to release."""
        self.held = False

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        if self.held:
            self.held = False
            try:
                self.journal.release_lease(self.run_id, self.owner)
            except Exception:  # noqa: BLE001 - the lease expires by itself; never mask the run's own outcome
                pass


#: How long the renewal thread sleeps with no lease to renew (see ``_Renewer._loop``).
_IDLE_WAKE = DEFAULT_TTL / 3


class _Renewer:
    """The process's lease renewal thread and the leases it keeps alive.

    Started on first use. It sleeps until the earliest lease is due (a third of
    its ttl after its last renewal) and renews the due ones; a lease added or
    removed costs a dict operation under a lock, and wakes the thread only if
    the new lease is due before the thread's planned wake-up.
    """

    def __init__(self) -> None:
        # add/remove take the condition's lock itself (what ``with cond`` does, without its Python-level wrappers).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._leases: dict[int, Lease] = {}
        self._wake = math.inf  # when the sleeping thread wakes; -inf while it renews
        self._thread: threading.Thread | None = None

    def add(self, lease: Lease) -> None:
        with self._lock:
            self._leases[id(lease)] = lease
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="engrain-lease-renewer", daemon=True)
                self._thread.start()
            if lease.due < self._wake:
                self._wake = lease.due
                self._cond.notify_all()

    def remove(self, lease: Lease) -> None:
        with self._lock:
            self._leases.pop(id(lease), None)
            while lease.renewing:  # its renewal's write must land before the caller releases or finishes
                self._cond.wait()

    def _loop(self) -> None:
        cond = self._cond
        with cond:
            while True:
                now = time.monotonic()
                due = [lease for lease in self._leases.values() if lease.due <= now]
                if not due:
                    # With no lease, wake anyway a default lease's first renewal interval from now: a
                    # default lease added later is due no sooner, so adding it wakes nothing. (Sleeping
                    # until notified made every short run wake the thread, which then found the run
                    # gone and slept until the next one woke it: a thread switch per run.)
                    self._wake = min((lease.due for lease in self._leases.values()), default=now + _IDLE_WAKE)
                    cond.wait(self._wake - now)
                    continue
                self._wake = -math.inf
                for lease in due:
                    lease.renewing = True
                cond.release()
                try:
                    for lease in due:
                        lease.renew()
                finally:
                    cond.acquire()
                    for lease in due:
                        lease.renewing = False
                    cond.notify_all()


_renewer = _Renewer()


def _after_fork() -> None:
    # The child has no renewal thread, and the parent's leases are not its own.
    global _renewer
    _renewer = _Renewer()


os.register_at_fork(after_in_child=_after_fork)
