"""The worker loop: claim runs of some queues within their limits, execute them, park long sleeps.

One :class:`Worker` per process (``engrain worker``). Each pass claims, per
queue, as many runs as it has free threads (:meth:`QueueStore.claim` applies
the queue's shared concurrency and rate limits), then runs never queued whose
executor died and whose agent (name and code) it has, as ``engrain.recover``
would, and executes each with
:func:`engrain.run` in a thread; the run's lease is renewed by the durable
runner's renewal thread. A run that sleeps longer than ``park_after`` seconds
is parked: back in its queue until its wake-up time, holding no thread.
``stop()`` (SIGTERM) stops claiming and lets runs in flight finish for
``grace`` seconds. Runs still executing then are listed in
``WorkerStats.unfinished``; ``engrain worker`` releases their leases and exits
at once, so another worker resumes them right away instead of after the lease
expires (their completed steps are not run again). Orphaned runs of its
agents' names that another version of their code started are not claimed
(unless ``upgrade``) and are listed in ``WorkerStats.unmatched``; a run an API
client created is never claimed.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from queue import SimpleQueue
from typing import Any

from .._durable import context as _ctx
from .._durable import execution as _execution
from .._durable.identity import fingerprint
from .._durable.lease import DEFAULT_TTL, owner_id
from .._durable.recovery import unmatched
from .._errors import ConfigError, EngrainError
from .._journal import Journal
from .._journal.failures import is_outage
from .queues import store_of
from .store import Claimed, check_queue_name


_log = logging.getLogger("engrain.worker")
#: Longest wait (seconds) between claim passes while the store is unavailable; the waits double up to it.
OUTAGE_WAIT = 30.0
#: Failed passes in a row after which ``run(until_idle=True)`` raises the store's error instead (~1.5 min at poll 0.2).
IDLE_OUTAGE_TRIES = 8


@dataclass(slots=True)
class WorkerStats:
    """What a worker did: runs finished by outcome, parked, failed to start."""

    finished: dict[str, int] = field(default_factory=dict)
    parked: int = 0
    errors: list[str] = field(default_factory=list)
    #: Runs still executing when the grace period ended (their leases are still this process's).
    unfinished: list[str] = field(default_factory=list)
    #: ``"run_id: reason"`` of orphaned runs of its agents' names it may not resume (another version's), at stop.
    unmatched: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (what ``engrain worker`` prints when it stops)."""
        return {"finished": dict(self.finished), "parked": self.parked, "errors": list(self.errors),
                "released": list(self.unfinished), "unmatched": list(self.unmatched)}


class Worker:
    """Executes queued and orphaned runs of ``queues`` with ``agents`` (name -> callable)."""

    def __init__(
        self,
        journal: Journal,
        agents: dict[str, Callable[..., Any]],
        queues: list[str],
        *,
        concurrency: int = 4,
        poll: float = 0.2,
        ttl: float = DEFAULT_TTL,
        park_after: float = 5.0,
        grace: float = 30.0,
        upgrade: bool = False,
    ):
        if not agents:
            raise ConfigError("a worker needs at least one agent (--agents module:attr)")
        if not queues:
            raise ConfigError("a worker needs at least one queue (--queue NAME)")
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or not 1 <= concurrency <= 1000:
            raise ConfigError(f"worker concurrency must be from 1 to 1000, got {concurrency!r}")
        for q in queues:
            check_queue_name(q)
        for name, value, top in (("poll", poll, 60.0), ("ttl", ttl, 3600.0), ("park_after", park_after, 86400.0)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= top:
                raise ConfigError(f"worker {name} must be a number of seconds above 0 and at most {top:g}, got {value!r}")
        self.grace = _check_grace(grace)
        self.journal = journal
        self.store = store_of(journal)
        self.agents = agents
        self.upgrade = bool(upgrade)
        #: Agent name -> the code fingerprint its runs must record (None with ``upgrade``: any version).
        self.codes: dict[str | None, str | None] = {n: None if upgrade else fingerprint(fn) for n, fn in agents.items()}
        self.queues = queues
        self.concurrency = concurrency
        self.poll = poll
        self.ttl = ttl
        self.park_after = park_after
        self.stats = WorkerStats()
        self._stop = threading.Event()
        self._active: dict[str, Future[Any]] = {}
        self._failed: dict[str, int] = {}  # run id -> errors this worker met executing it
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="engrain-worker")

    def stop(self) -> None:
        """Stop claiming; :meth:`run` returns once runs in flight finish (or the grace period ends)."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the worker gracefully (main thread only).

        The handler only hands the signal to a thread of its own, which calls
        :meth:`stop`. A handler runs in the main thread between two bytecodes,
        possibly while that thread holds the stop event's lock (inside its
        ``wait``): setting the event there would wait for that lock forever, and
        the worker would never stop. ``SimpleQueue.put`` is safe to call there.
        """
        signals: SimpleQueue[int] = SimpleQueue()

        def relay() -> None:
            signals.get()
            self.stop()

        threading.Thread(target=relay, name="engrain-worker-signals", daemon=True).start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: signals.put(signum))

    def release_unfinished(self) -> list[str]:
        """Drop this process's leases on the runs still executing, so another worker claims them now.

        Call it only when the process exits right after (``engrain worker`` does): a
        thread still executing one of them would otherwise race its next owner (its
        appends are fenced off once that owner claims the run).
        """
        owner = owner_id()
        for rid in self.stats.unfinished:
            try:
                self.journal.release_lease(rid, owner)
            except Exception:  # noqa: BLE001 - the lease expires by itself
                pass
        return list(self.stats.unfinished)

    def run(self, *, until_idle: bool = False, grace: float | None = None) -> WorkerStats:
        """Claim and execute until :meth:`stop` (or, with ``until_idle``, until nothing is left to claim).

        On stop, runs in flight get ``grace`` seconds (default: the worker's) to
        finish; those still executing are listed in ``stats.unfinished`` (see
        :meth:`release_unfinished`).
        """
        grace = self.grace if grace is None else _check_grace(grace)
        owner = owner_id()
        outages = 0  # passes in a row the store failed
        try:
            while not self._stop.is_set():
                try:
                    claimed = self._claim_pass(owner)
                    idle = until_idle and not claimed and not self._busy() and not self._waiting()
                except Exception as e:
                    # A worker run until idle (a batch job, a test) gives up: someone waits for it to end.
                    if not is_outage(e) or (until_idle and outages >= IDLE_OUTAGE_TRIES):
                        raise
                    # The database went away (a restart, a failover): wait, and try again on a new connection.
                    outages += 1
                    if outages == 1:
                        _log.warning("engrain worker: the store is unavailable, retrying: %s", e)
                        self._error(f"store unavailable: {type(e).__name__}: {e}")
                    self._stop.wait(min(OUTAGE_WAIT, self.poll * 2 ** min(outages, 12)))
                    continue
                if outages:
                    _log.warning("engrain worker: the store is back after %d failed passes", outages)
                    outages = 0
                if idle:
                    break
                self._stop.wait(self.poll if not claimed else 0.01)
        finally:
            self._drain(grace)
            try:
                self.stats.unmatched = [f"{u.run_id}: {u.error}" for u in unmatched(self.journal, self.codes, 100,
                                                                                    named_only=True)]
            except Exception as e:  # noqa: BLE001 - a listing must not hide how the worker stopped
                self.stats.errors.append(f"listing unmatched runs: {type(e).__name__}: {e}")
        return self.stats

    def _claim_pass(self, owner: str) -> int:
        """Claim what each queue allows now, then orphaned runs of our agents; the number claimed."""
        claimed = 0
        for queue in self.queues:
            free = self.concurrency - self._busy()
            if free <= 0:
                break
            for c in self.store.claim(queue, owner, self.ttl, free, agents=self.codes):
                self._start(c)
                claimed += 1
        # Runs started with engrain.run (not queued) whose process died, if we have their agent.
        for c in self.store.claim_orphans(owner, self.ttl, self.concurrency - self._busy(), self.codes):
            self._start(c)
            claimed += 1
        return claimed

    def _error(self, text: str) -> None:
        if len(self.stats.errors) < 1000:  # a long-lived worker keeps the first ones, not an unbounded list
            self.stats.errors.append(text)

    def _waiting(self) -> bool:
        """Runs of our queues and agents still queued, parked or executing elsewhere (for ``until_idle``)."""
        n = self.store.pending(self.queues, sorted(self.agents))
        # A run that failed here twice keeps its lease until it expires and counts as pending;
        # until_idle does not wait on it forever (its errors are in stats.errors).
        return n > sum(1 for k in self._failed.values() if k >= 2)

    def _busy(self) -> int:
        with self._lock:
            return len(self._active)

    def _start(self, c: Claimed) -> None:
        with self._lock:
            self._active[c.run_id] = self._pool.submit(self._execute, c)

    def _execute(self, c: Claimed) -> None:
        try:
            agent = self.agents.get(c.agent)
            if agent is None:
                raise EngrainError(f"run {c.run_id!r} needs agent {c.agent!r}, not given to this worker")
            events = self.journal.read(c.run_id, after=-1)[:1]
            if not events:
                return  # deleted since the claim (cancelled, then gc): engrain.run would start it anew, with no task
            data = events[0].data
            # A run never queued has no queue row to wait in, so its sleeps run in this thread.
            park_after = self.park_after if c.queue else None
            result = _run_parked(park_after, self.journal, agent, data.get("task", ""), c.run_id, data.get("inputs") or {},
                                 c.agent, self.upgrade, self._park)
            if result is not None:
                with self._lock:
                    self.stats.finished[result.status] = self.stats.finished.get(result.status, 0) + 1
                    self._failed.pop(c.run_id, None)  # executed after all: no longer a run until_idle may skip
        except _ctx._Park as park:
            # The run parked itself while it still held its lease (RunContext.park, through _run_parked's
            # parker); parking it here, after the lease was dropped, could take it from another worker.
            if getattr(park, "parked", None):
                with self._lock:
                    self.stats.parked += 1
        except BaseException as e:  # noqa: BLE001 - one bad run must not stop the worker; the run stays resumable
            # A BaseException too (SystemExit, a tool's own): in a worker thread it ends nothing but the run, which
            # it leaves resumable, and let through here it would skip the count below, so the run was claimed
            # again at once, for ever, re-running its unjournaled step each time.
            with self._lock:
                self._error(f"{c.run_id}: {type(e).__name__}: {e}")
                again = self._failed.get(c.run_id, 0)
                if len(self._failed) < 10000:
                    self._failed[c.run_id] = again + 1
            if not again:
                # The first error frees the run at once; a run that fails again keeps the lease until it
                # expires, so an error that recurs is retried once per lease period instead of in a tight loop.
                try:
                    self.journal.release_lease(c.run_id, owner_id())
                except Exception:  # noqa: BLE001 - the lease expires by itself
                    pass
            else:
                # Held again: a run that unwound through its executor let its lease go, and would be claimed at once.
                try:
                    self.journal.take_lease(c.run_id, owner_id(), self.ttl)
                except Exception:  # noqa: BLE001 - then it is retried sooner, as a free run is
                    pass
        finally:
            with self._lock:
                self._active.pop(c.run_id, None)

    def _park(self, run_id: str, until: float, epoch: int | None) -> bool:
        """Put run ``run_id`` back in its queue until ``until``, fenced on this process's lease at ``epoch``."""
        return self.store.park(run_id, until, owner_id(), epoch)

    def _drain(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        while self._busy() and time.monotonic() < deadline:
            time.sleep(0.05)
        with self._lock:
            self.stats.unfinished = sorted(self._active)
        # Threads still running hold leases that expire (or that release_unfinished drops);
        # another worker takes their runs over.
        self._pool.shutdown(wait=False, cancel_futures=True)


def _check_grace(grace: float) -> float:
    if not isinstance(grace, (int, float)) or isinstance(grace, bool) or not 0 <= grace <= 86400:
        raise ConfigError(f"worker grace must be from 0 to 86400 seconds, got {grace!r}")
    return float(grace)


def _run_parked(
    park_after: float | None, journal: Journal, agent: Callable[..., Any], task: str, run_id: str,
    inputs: dict[str, Any], name: str, upgrade: bool, park: Callable[[str, float, int | None], bool] | None = None,
) -> Any:
    """``engrain.run`` (as agent ``name``) with sleeps longer than ``park_after`` parking the run with ``park``
    (``RunContext.park_after`` and ``RunContext.park``)."""
    token = _park_after.set(park_after)
    parker = _parker.set(park)
    try:
        return _execution.run(agent, task, run_id=run_id, inputs=inputs, journal=journal, agent_name=name,
                              upgrade=upgrade)
    finally:
        _parker.reset(parker)
        _park_after.reset(token)


_park_after = _ctx._park_after
_parker = _ctx._parker
