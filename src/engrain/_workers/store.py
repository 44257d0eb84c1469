"""Queue tables next to the journal, and the claims workers make on them.

A queued run is a journal run (``run.started`` records its task, inputs and
``queue``) whose summary row says ``queued``, plus a row in ``engrain_queue``
(queue, agent name, priority, when it is available, when it was first
claimed). Queue limits live in ``engrain_queues``. A claim, in one
transaction serialized per store (SQLite's write lock) or per queue
(a PostgreSQL advisory lock, with ``FOR UPDATE SKIP LOCKED`` on the rows),
counts the queue's executing runs and its recent starts, then moves up to the
free number of available runs to ``running`` under the worker's lease, so the
limits hold across any number of workers. A run whose executor died
(``running``, lease expired) or that was answered (``running``, no lease) is
claimed again without counting as a new start, but within the concurrency
limit. A run sleeping past the worker's threshold is parked, by its executor
while it still holds the lease: ``queued`` again with ``available`` set to its
wake-up time.

The tables are part of the store's schema: journal migration 6
(``_journal/sqlite_schema.py`` and ``postgres_schema.py``) creates them, so
opening any store brings them, and older stores gain them on upgrade.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from .. import _events as ev
from .._errors import ConfigError, ConflictError
from .._events import NewEvent, check_json
from .._journal import Journal
from .._journal._common import Agents, agents_filter, trust_sql
from .._journal.failures import sqlite_rollback, storage_errors

_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A queue's limits and current counts."""

    name: str
    concurrency: int | None
    rate: tuple[int, float] | None
    queued: int = 0
    running: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"name": self.name, "concurrency": self.concurrency, "rate": list(self.rate) if self.rate else None,
                "queued": self.queued, "running": self.running}


@dataclass(frozen=True, slots=True)
class Claimed:
    """A run a worker claimed: what it needs to execute it (``queue`` is ``""`` for a run never queued)."""

    run_id: str
    agent: str
    queue: str


class RunExistsError(ConflictError, ConfigError):
    """:meth:`QueueStore.enqueue` was given the id of a run that already exists.

    A :class:`ConflictError`, as the refused append it comes from was before it had a name
    of its own, and a :class:`ConfigError` (the caller chose the id: bad input, CLI exit 2).
    """

    def __init__(self, run_id: str, actual_seq: int | None = None):
        super().__init__(run_id, 0, actual_seq)
        self.args = (f"run id {run_id!r} already exists; choose another id (or omit it for a fresh one)",)


def check_queue_name(name: str) -> str:
    """``name`` if it is a valid queue name, else :class:`ConfigError`."""
    if not isinstance(name, str) or not _QUEUE_NAME.match(name):
        raise ConfigError(f"queue name must be 1-100 letters, digits, '_', '.' or '-', got {name!r}")
    return name


class QueueStore:
    """The queue tables of one journal (SQLite file or PostgreSQL database)."""

    def __init__(self, journal: Journal):
        self.journal = journal
        self.pg = journal.backend == "postgres"
        self._lock = journal._lock  # type: ignore[attr-defined]  # same connection: same file/database, same lock
        self.url = journal.url  # names the store in a StorageError
        self.ph = "%s" if self.pg else "?"
        self.runs = "engrain_runs" if self.pg else "runs"

    @property
    def _db(self) -> Any:
        # Read under the lock, each time: a PostgreSQL journal replaces a connection the server dropped.
        return self.journal._db  # type: ignore[attr-defined]

    # -- transactions --------------------------------------------------------------

    def _held(self) -> Any:
        """The journal's lock, held; on PostgreSQL also with the journal's append sent without waiting read first:
        a statement sent while its result is unread is refused ("another command is already in progress")."""
        settled = getattr(self.journal, "_settled", None)
        return settled() if settled is not None else self._lock

    @storage_errors
    def _tx(self, fn: Any, queue_lock: str | None = None) -> Any:
        with self._held():
            db = self._db
            if self.pg:
                with db.transaction():
                    if queue_lock is not None:
                        db.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", ("engrain-queue:" + queue_lock,))
                    return fn(lambda sql, args=(): db.execute(sql, args))
            db.execute("BEGIN IMMEDIATE")
            try:
                out = fn(lambda sql, args=(): db.execute(sql, args))
                db.execute("COMMIT")
                return out
            except BaseException:
                sqlite_rollback(db)  # not ROLLBACK: a failed COMMIT may have rolled back, and its error is the one
                raise

    def _now(self, q: Any) -> float:
        if self.pg:
            return float(q("SELECT extract(epoch from clock_timestamp())").fetchone()[0])
        return time.time()

    # -- queues ------------------------------------------------------------------------

    def declare(self, name: str, concurrency: int | None = None, rate: tuple[int, float] | None = None) -> QueueInfo:
        """Create or change queue ``name``'s limits (shared by every worker on the store)."""
        check_queue_name(name)
        if concurrency is not None and (not isinstance(concurrency, int) or isinstance(concurrency, bool)
                                        or not 1 <= concurrency <= 100_000):
            raise ConfigError(f"queue {name!r}: concurrency must be an integer from 1 to 100000, got {concurrency!r}")
        if rate is not None:
            ok = (isinstance(rate, (tuple, list)) and len(rate) == 2 and isinstance(rate[0], int)
                  and not isinstance(rate[0], bool) and isinstance(rate[1], (int, float)) and 1 <= rate[0] <= 10**9
                  and 0 < rate[1] <= 86400 * 366)
            if not ok:
                raise ConfigError(f"queue {name!r}: rate must be (runs, seconds), e.g. (100, 60), got {rate!r}")
            rate = (int(rate[0]), float(rate[1]))
        p = self.ph
        n, per = rate if rate else (None, None)

        def write(q: Any) -> None:
            q(f"DELETE FROM engrain_queues WHERE name = {p}", (name,))
            q(f"INSERT INTO engrain_queues VALUES ({p}, {p}, {p}, {p})", (name, concurrency, n, per))

        self._tx(write)
        return QueueInfo(name, concurrency, rate)

    @storage_errors
    def queues(self) -> list[QueueInfo]:
        """Every declared or used queue with its limits and counts."""
        r = self.runs
        with self._held():
            limits = {row[0]: row[1:] for row in self._db.execute("SELECT name, concurrency, rate_limit, rate_period FROM engrain_queues").fetchall()}
            counts = self._db.execute(
                f"SELECT q.queue, SUM(CASE WHEN r.status = 'queued' THEN 1 ELSE 0 END),"
                f" SUM(CASE WHEN r.status = 'running' THEN 1 ELSE 0 END)"
                f" FROM engrain_queue q JOIN {r} r ON r.run_id = q.run_id GROUP BY q.queue"
            ).fetchall()
        by = {c[0]: (int(c[1] or 0), int(c[2] or 0)) for c in counts}
        out = []
        for name in sorted(set(limits) | set(by)):
            lim = limits.get(name, (None, None, None))
            rate = (int(lim[1]), float(lim[2])) if lim[1] is not None else None
            queued, running = by.get(name, (0, 0))
            out.append(QueueInfo(name, lim[0], rate, queued, running))
        return out

    # -- enqueue -----------------------------------------------------------------------------

    def enqueue(self, run_id: str, agent: str, task: str, queue: str, inputs: dict[str, Any], priority: int,
                tags: list[str]) -> None:
        """Create run ``run_id`` as ``queued`` in ``queue``, to be executed by agent ``agent``."""
        check_queue_name(queue)
        if not isinstance(priority, int) or isinstance(priority, bool) or not -1_000_000 <= priority <= 1_000_000:
            raise ConfigError(f"priority must be an integer from -1000000 to 1000000, got {priority!r}")
        data = {"task": task, "inputs": inputs, "tags": tags, "queue": queue, "agent": agent}
        check_json(data, f"run {run_id!r}", "inputs")
        try:
            # The run and its queue row in one transaction: a crash between two would leave a run
            # outside its queue, which recovery executes without the queue's limits.
            self.journal.append_queued(run_id, [NewEvent(ev.RUN_STARTED, "", data)], queue, agent, priority)
        except ConflictError as e:
            # Only an existing run refuses an append at seq 0: say so, not "another writer appended".
            raise RunExistsError(run_id, e.actual_seq) from None

    # -- claims --------------------------------------------------------------------------------

    def claim(self, queue: str, owner: str, ttl: float, limit: int, agents: Agents | None = None) -> list[Claimed]:
        """Lease up to ``limit`` runs of ``queue``: orphans first, then available queued runs, within its limits.

        With ``agents``, only runs of those agents (by name: a queued run's ``run.started``
        is written by :meth:`enqueue`, which names the agent and records no code): a worker
        never takes a run it cannot execute (it would hand it back and take it again,
        forever). A client's run is never queued (only :meth:`enqueue` creates queue rows).
        """
        p, r = self.ph, self.runs
        skip = " FOR UPDATE OF r SKIP LOCKED" if self.pg else ""
        if agents is not None and not agents:
            return []
        cond, args = ("", []) if agents is None else agents_filter(list(agents), "q.agent", p)
        which, names = (f" AND {cond}" if cond else ""), tuple(args)

        def pick(q: Any) -> list[Claimed]:
            now = self._now(q)
            lim = q(f"SELECT concurrency, rate_limit, rate_period FROM engrain_queues WHERE name = {p}", (queue,)).fetchone()
            conc, rate_n, rate_per = lim if lim else (None, None, None)
            got: list[Claimed] = []
            take = limit
            if conc is not None:
                # Orphans (``running``, no live lease: a dead worker's run, or an answered run) count against
                # the limit too: taken only into slots no live executor holds. An answered run is ``running``
                # with no lease, so taking it whatever the count would run it beside the runs filling the queue.
                live = q(
                    f"SELECT COUNT(*) FROM engrain_queue q JOIN {r} r ON r.run_id = q.run_id"
                    f" WHERE q.queue = {p} AND r.status = 'running' AND r.lease_until >= {p}", (queue, now)
                ).fetchone()[0]
                take = min(take, conc - live)
            orphans = q(
                f"SELECT q.run_id, q.agent FROM engrain_queue q JOIN {r} r ON r.run_id = q.run_id"
                f" WHERE q.queue = {p} AND r.status = 'running' AND (r.lease_until IS NULL OR r.lease_until < {p}){which}"
                f" ORDER BY q.priority DESC, q.available LIMIT {p}{skip}",
                (queue, now, *names, take),
            ).fetchall() if take > 0 else []
            for rid, agent in orphans:
                # A takeover moves the lease epoch, as Journal.claim_runs does: the dead holder's late
                # appends are fenced off (they carry the old epoch).
                q(f"UPDATE {r} SET lease_owner = {p}, lease_until = {p}, lease_epoch = lease_epoch + 1 WHERE run_id = {p}",
                  (owner, now + ttl, rid))
                got.append(Claimed(rid, agent, queue))
            free = limit - len(got)
            if conc is not None:
                # Every ``running`` run, orphans left for another worker's agents included: each takes a slot.
                running = q(
                    f"SELECT COUNT(*) FROM engrain_queue q JOIN {r} r ON r.run_id = q.run_id"
                    f" WHERE q.queue = {p} AND r.status = 'running'", (queue,)
                ).fetchone()[0]
                free = min(free, conc - running)
            if rate_n is not None:
                started = q(
                    f"SELECT COUNT(*) FROM engrain_queue WHERE queue = {p} AND first_claimed >= {p}",
                    (queue, now - rate_per),
                ).fetchone()[0]
                free = min(free, rate_n - started)
            if free <= 0:
                return got
            rows = q(
                f"SELECT q.run_id, q.agent, q.first_claimed FROM engrain_queue q JOIN {r} r ON r.run_id = q.run_id"
                f" WHERE q.queue = {p} AND r.status = 'queued' AND q.available <= {p}{which}"
                f" ORDER BY q.priority DESC, q.available LIMIT {p}{skip}",
                (queue, now, *names, free),
            ).fetchall()
            for rid, agent, first in rows:
                q(f"UPDATE {r} SET status = 'running', lease_owner = {p}, lease_until = {p}, updated = {p},"
                  f" lease_epoch = lease_epoch + 1 WHERE run_id = {p}", (owner, now + ttl, now, rid))
                if first is None:
                    q(f"UPDATE engrain_queue SET first_claimed = {p} WHERE run_id = {p}", (now, rid))
                got.append(Claimed(rid, agent, queue))
            return got

        return self._tx(pick, queue_lock=queue)

    def claim_orphans(self, owner: str, ttl: float, limit: int, agents: Agents) -> list[Claimed]:
        """Lease up to ``limit`` runs of ``agents`` that were never queued and whose executor died.

        What ``engrain.recover`` does, for a worker: a run started with ``engrain.run``
        (its agent name recorded) whose lease expired is resumed by a worker that has
        its agent, and (``agents`` a mapping of name to code fingerprint) its code.
        Queued runs are left to :meth:`claim`, which applies their queue's limits.
        """
        if limit <= 0 or not agents:
            return []
        p, r = self.ph, self.runs
        skip = " FOR UPDATE OF r SKIP LOCKED" if self.pg else ""
        code, not_client = trust_sql(self.pg, "r")
        cond, args = agents_filter(agents, "r.agent", p, code)
        which, names = f" AND {cond} AND {not_client}", tuple(args)

        def pick(q: Any) -> list[Claimed]:
            now = self._now(q)
            rows = q(
                f"SELECT r.run_id, r.agent FROM {r} r WHERE r.status = 'running'"
                f" AND (r.lease_until IS NULL OR r.lease_until < {p}){which}"
                f" AND NOT EXISTS (SELECT 1 FROM engrain_queue q WHERE q.run_id = r.run_id)"
                f" ORDER BY r.updated LIMIT {p}{skip}",
                (now, *names, limit),
            ).fetchall()
            for rid, _ in rows:
                q(f"UPDATE {r} SET lease_owner = {p}, lease_until = {p}, lease_epoch = lease_epoch + 1 WHERE run_id = {p}",
                  (owner, now + ttl, rid))
            return [Claimed(rid, agent, "") for rid, agent in rows]

        return self._tx(pick)

    def park(self, run_id: str, until: float, owner: str, epoch: int | None = None) -> bool:
        """Put an executing run back in its queue until ``until`` (a durable sleep), dropping ``owner``'s lease.

        Called by the executor while it still holds the lease (``RunContext.park``), and fenced on it:
        the run is parked only if ``owner`` holds its lease at ``epoch`` (``None``: any epoch). A
        run whose lease was dropped and taken by another worker meanwhile is that worker's: parking it
        would hand it to a third executor while the second still runs its steps. Returns whether it
        was parked (``False``: the lease was lost, or the run was cancelled).
        """
        p, r = self.ph, self.runs
        at, args = ("", (run_id, owner)) if epoch is None else (f" AND lease_epoch = {p}", (run_id, owner, epoch))

        def write(q: Any) -> bool:
            cur = q(f"UPDATE {r} SET status = 'queued', lease_owner = NULL, lease_until = NULL"
                    f" WHERE run_id = {p} AND status = 'running' AND lease_owner = {p}{at}", args)
            if cur.rowcount != 1:
                return False
            q(f"UPDATE engrain_queue SET available = {p} WHERE run_id = {p}", (until, run_id))
            return True

        return bool(self._tx(write))

    @storage_errors
    def pending(self, queues: list[str], agents: list[str]) -> int:
        """Runs of ``agents`` on ``queues`` still queued (or parked) or executing."""
        if not queues or not agents:
            return 0
        p, r = self.ph, self.runs
        with self._held():
            row = self._db.execute(
                f"SELECT COUNT(*) FROM engrain_queue q JOIN {r} r ON r.run_id = q.run_id"
                f" WHERE q.queue IN ({', '.join([p] * len(queues))}) AND q.agent IN ({', '.join([p] * len(agents))})"
                f" AND r.status IN ('queued', 'running')",
                (*queues, *agents),
            ).fetchone()
        return int(row[0])

    @storage_errors
    def queue_of(self, run_id: str) -> str | None:
        """The queue ``run_id`` was enqueued on, or ``None``."""
        with self._held():
            row = self._db.execute(f"SELECT queue FROM engrain_queue WHERE run_id = {self.ph}", (run_id,)).fetchone()
        return row[0] if row else None
