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

The owner id is the process's, so the store cannot tell two executors of one
process apart: a process-wide registry of the runs being executed refuses a
second executor of a run (two threads resuming it at once) before it executes
anything. A renewal extends only the lease taken at the executor's epoch: once
the lease was released or changed hands, the executor has lost it for good,
even if the lease is free again.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
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


def _store_key(journal: Journal) -> object:
    """What names ``journal``'s store, so two journal objects on one store count as one."""
    key = getattr(journal, "_engrain_store_key", None)
    if key is not None:
        return key
    path = getattr(journal, "path", None)
    url = getattr(journal, "url", None)
    if path is not None and str(path) != ":memory:":
        key = ("path", os.path.realpath(path))
    elif isinstance(url, str) and not url.startswith("sqlite:"):
        key = ("url", url)
    else:
        key = ("journal", id(journal))
    try:
        journal._engrain_store_key = key  # type: ignore[attr-defined]  # realpath's syscalls once, not per run
    except AttributeError:
        pass
    return key


# (store, run id) -> the executor's lease. Weak: an executor abandoned without
# reaching __exit__ (its setup raised) must not keep the run blocked in this process.
_executing: dict[tuple[object, str], weakref.ref[Lease]] = {}
_executing_lock = threading.Lock()


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
        #: A renewal found the lease released or taken at another epoch: never renewed again.
        self.lost = False
        self._registered = False
        self._key = (_store_key(journal), run_id)
        self._claimed = False

    def _claim(self) -> None:
        """Become the process's one executor of the run, or raise :class:`LeaseHeldError`."""
        if self._claimed:
            return
        with _executing_lock:
            ref = _executing.get(self._key)
            other = ref() if ref is not None else None
            # One whose renewal found the lease lost is fenced off, as if another process had taken
            # the run over: it must not keep the run from its next executor.
            if other is not None and other is not self and not other.lost:
                raise LeaseHeldError(self.run_id, self.owner)
            _executing[self._key] = weakref.ref(self)
            self._claimed = True

    def _unclaim(self) -> None:
        if self._claimed:
            self._claimed = False
            with _executing_lock:
                ref = _executing.get(self._key)
                if ref is not None and ref() in (self, None):
                    del _executing[self._key]

    def take(self, epoch: int = 1) -> None:
        """Record that the lease is held: taken by the append that created the run with ``lease=(owner, ttl)``.

        Raises :class:`LeaseHeldError` when another executor of this process got the run first (it
        resumed the run between its creation and this call): that one executes it, this one must not.
        """
        self._claim()
        self.held = True
        self.lost = False
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
        # Claimed before the store is asked: the store would let this process's owner id take its own
        # lease again, epoch unchanged, so two executors of one process would both run the agent.
        self._claim()
        try:
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
        except BaseException:
            self._unclaim()
            raise
        self.take(epoch)

    def renew(self) -> None:
        """Extend the lease by ``ttl`` from now (called by the renewal thread); mark it :attr:`lost` if it is gone."""
        self.due = time.monotonic() + self.ttl / 3
        if self.epoch is None:
            return
        try:
            kept = self.journal.renew_lease(self.run_id, self.owner, self.ttl, self.epoch)
        except Exception:  # noqa: BLE001 - a failed renewal must not kill the run; the next try may succeed
            return
        if not kept:
            # Taking the lease again would hand a fenced-off executor (its appends are refused) a
            # lease the run's next executor then waits on for as long as this one's step lasts.
            self.lost = True
            self.held = False

    def stop(self) -> None:
        """Stop renewing (waiting out a renewal in flight); the lease stays held until it expires or is released."""
        if self._registered:
            self._registered = False
            _renewer.remove(self)

    def dropped(self) -> None:
        """The journal dropped the lease (the run's finishing event was appended): nothing to release."""
        self.held = False

    def __exit__(self, *exc: Any) -> None:
        try:
            self.stop()
            if self.held:
                self.held = False
                try:
                    # At its epoch: a lease this process's owner id took since (a worker's claim) is not this one's.
                    self.journal.release_lease(self.run_id, self.owner, self.epoch)
                except Exception:  # noqa: BLE001 - the lease expires by itself; never mask the run's own outcome
                    pass
        finally:
            self._unclaim()


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
                        if lease.lost:
                            self._leases.pop(id(lease), None)
                    cond.notify_all()


_renewer = _Renewer()


def _after_fork() -> None:
    # The child has no renewal thread, and the parent's leases (and executions) are not its own.
    global _renewer, _executing_lock
    _renewer = _Renewer()
    _executing.clear()
    _executing_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)
