"""SQLite journal: the embedded default (``./.engrain/engrain.db``).

WAL mode, one connection per journal guarded by a lock. ``durability="normal"``
survives a process crash (SIGKILL) at any point; ``"full"`` fsyncs every commit
and survives power loss too. Several processes may open the same file: writers
serialize on SQLite's write lock, and ``expected_seq`` catches a second writer
of the same run.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from typing import NoReturn
from pathlib import Path

from .._errors import (
    ConfigError,
    ConflictError,
    LeaseLostError,
    RunFinishedError,
    RunNotFoundError,
    StorageError,
    StoreCorruptError,
    StoreNotFoundError,
)
from .._events import Event, NewEvent, Row, RunInfo, events_of, loads
from ._common import (
    ENDED_BY,
    FINISH_KINDS,
    FINISHED,
    Agents,
    agents_filter,
    check_lease,
    check_lookup_id,
    glob_prefix,
    page,
    prepare,
    prepare_row,
    run_filters,
    trust_sql,
    window,
)
from .base import Journal
from .failures import sqlite_failure, sqlite_rollback
from .sqlite_checkpoint import BACKSTOP_PAGES, Checkpointer, no_commit_count
from .sqlite_schema import migrate, to_wal
from .sqlite_sql import (
    CHUNK,
    DELETE_RUN,
    FENCE_DROP,
    FENCE_SET,
    FENCE_TABLE,
    FENCE_TRIGGER,
    INSERT,
    INSERTS,
    LAST_KIND,
    LEASE_NEW,
    MAX_FENCES,
    QUEUE_ADD,
    QUEUE_DROP,
    QUEUED,
    RUN_COLS,
)


def _run_info(row: tuple) -> RunInfo:
    return RunInfo(row[0], row[1], row[2], loads(row[3]), row[4], row[5], row[6], row[7], row[8], row[9], row[10])


class SQLiteJournal(Journal):
    """Journal in one SQLite file."""

    backend = "sqlite"

    def __init__(
        self, path: str | os.PathLike[str], durability: str = "normal", timeout: float = 30.0, *, create: bool = True
    ):
        if durability not in ("normal", "full"):
            raise ConfigError(f"durability must be 'normal' or 'full', got {durability!r}")
        self.path = Path(path)
        self.durability = durability
        self.url = f"sqlite:///{self.path}"
        memory = str(path) == ":memory:"
        if not memory and not create and not self.path.is_file():
            raise StoreNotFoundError(str(self.path))
        try:
            if not memory:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we issue BEGIN/COMMIT ourselves so one append is one transaction.
            self._db = sqlite3.connect(str(path), timeout=timeout, isolation_level=None, check_same_thread=False)
        except OSError as e:
            raise StorageError(str(self.path), e) from e
        except sqlite3.Error as e:
            raise self._translate(e) from e
        self._lock = threading.RLock()
        try:
            to_wal(self._db, timeout)
            self._db.execute(f"PRAGMA synchronous={'FULL' if durability == 'full' else 'NORMAL'}")
            self._db.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
            with self._lock:
                migrate(self._db, str(self.path))
        except sqlite3.Error as e:
            self._db.close()
            raise self._translate(e) from e
        except BaseException:
            self._db.close()
            raise
        # A batch goes in multi-row INSERTs (faster than executemany) of at most
        # CHUNK rows, which also bounds the distinct statements to prepare.
        self._chunk = max(1, min(CHUNK, self._db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // 6))
        # The per-step path, bound once: a kept cursor saves creating one per
        # INSERT, and the synchronous toggles of durable=False are cached statements.
        self._full = durability == "full"
        self._cursor = self._db.cursor()
        self._insert = self._cursor.execute
        self._sync = self._db.cursor().execute
        try:
            self._db.execute(FENCE_TABLE)
            self._db.execute(FENCE_TRIGGER)
        except sqlite3.Error as e:
            self._db.close()
            raise self._translate(e) from e
        self._fences: dict[str, int] = {}  # what engrain_fence holds, so a step writes it only when it changes
        # With "normal", checkpoints run on a thread of their own (see sqlite_checkpoint).
        # Not with "full": there every commit fsyncs the WAL, and a checkpoint's fsyncs on
        # another thread queue with them (measured: more than SQLite's own checkpoint costs
        # inside one commit in a thousand). An in-memory store has no WAL to checkpoint.
        self._checkpointer: Checkpointer | None = None
        self._committed = no_commit_count
        if not memory and durability == "normal":
            try:
                self._db.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
            except sqlite3.Error as e:
                self._db.close()
                raise self._translate(e) from e
            self._checkpointer = Checkpointer(str(self.path), min(int(timeout * 1000), 1000))
            self._committed = self._checkpointer.committed

    def _translate(self, e: sqlite3.Error) -> Exception:
        """The typed error for a driver error: the store is corrupt, or failed (disk, I/O, lock), or neither."""
        return sqlite_failure(str(self.path), e)

    # -- writes ------------------------------------------------------------------

    def append(
        self,
        run_id: str,
        events: Sequence[NewEvent],
        expected_seq: int,
        *,
        durable: bool = True,
        lease: tuple[str, float] | None = None,
        fence: int | None = None,
        wait: bool = True,
        json_checked: bool = False,
    ) -> list[Event]:
        # wait=False changes nothing here: a commit in this process costs less than a send would.
        if not wait and durable:
            raise ValueError("append(wait=False) needs durable=False: a flush is confirmed only by waiting for it")
        ts = self._now()
        lease = check_lease(lease, expected_seq)
        # One event (every step of a durable run) skips building a Batch: the
        # triggers keep the runs row, so the status it computes is not needed here.
        one = len(events) == 1
        if one:
            e = events[0]
            rows = [prepare_row(run_id, e.kind, e.name, e.data, expected_seq, ts, json_checked)]
            finishes = rows[0][3] in FINISH_KINDS
        else:
            batch = prepare(run_id, events, expected_seq, ts, json_checked)
            rows, finishes = batch.rows, batch.status in FINISHED
        if finishes:
            lease = None  # the run is finished by this append: nothing to lease
        self._commit(rows, run_id, expected_seq, one, durable, lease, fence)
        if one:
            r = rows[0]
            return [Event(run_id, expected_seq, r[2], r[3], r[4], events[0].data)]
        return [Event(r[0], r[1], r[2], r[3], r[4], ev.data) for r, ev in zip(rows, events)]

    def append_one(
        self, run_id: str, kind: str, name: str, data: dict, expected_seq: int, *, durable: bool = True,
        fence: int | None = None, json_checked: bool = False, wait: bool = True, lease: tuple[str, float] | None = None,
    ) -> None:
        # Every step of a durable run comes here (and its start): no NewEvent in, no Event out.
        if not wait and durable:
            raise ValueError("append(wait=False) needs durable=False: a flush is confirmed only by waiting for it")
        row = prepare_row(run_id, kind, name, data, expected_seq, time.time(), json_checked)
        if lease is not None:
            lease = check_lease(lease, expected_seq)
            if kind not in FINISH_KINDS:  # else, as in append: the run is finished by this append, nothing to lease
                self._commit((row,), run_id, expected_seq, True, durable, lease, fence)
                return
        if not durable and self._full:
            self._commit((row,), run_id, expected_seq, True, durable, None, fence)
            return
        # The step's own path, _commit's first case without its branches: one autocommit INSERT.
        with self._lock:
            try:
                if self._fences.get(run_id) != fence:
                    self._set_fence(run_id, fence)
                self._insert(INSERT, row)
                if self._checkpointer is not None:  # "normal": count the commit; "full" and in memory: nothing to call
                    self._committed()
            except sqlite3.Error as e:
                self._refused(e, run_id, expected_seq, fence, kind)

    def _commit(
        self, rows: Sequence[tuple], run_id: str, expected_seq: int, one: bool, durable: bool,
        lease: tuple[str, float] | None, fence: int | None,
    ) -> None:
        """Write validated ``rows`` in one transaction, translating the driver's errors."""
        with self._lock:
            fsync_skipped = not durable and self._full
            try:
                if fsync_skipped:
                    # WAL frames written now survive a process crash; the next fsync'd
                    # commit makes them durable against power loss as well.
                    self._sync("PRAGMA synchronous=NORMAL")
                if self._fences.get(run_id) != fence:
                    self._set_fence(run_id, fence)
                n = len(rows)
                if lease is None and n <= self._chunk:
                    # autocommit: one statement, one commit (the TEMP trigger checks a fence)
                    self._insert(INSERT if one else INSERTS[n], rows[0] if one else [v for r in rows for v in r])
                else:
                    self._write(rows, run_id, lease, rows[0][2])  # rows[0][2]: the append's timestamp
                self._committed()
            except sqlite3.Error as e:
                self._refused(e, run_id, expected_seq, fence, rows[0][3])  # a finished run refuses the first row
            finally:
                if fsync_skipped:
                    try:
                        self._sync("PRAGMA synchronous=FULL")
                    except sqlite3.Error:  # the write's own error (if any) is the one to report
                        pass

    def _refused(self, e: sqlite3.Error, run_id: str, expected_seq: int, fence: int | None, kind: str) -> NoReturn:
        """Raise the typed error for an append the store refused: fenced off, a conflict, after the run's end
        (``kind``: the refused event's), or the store's failure."""
        if isinstance(e, sqlite3.IntegrityError):
            if "engrain:fenced" in str(e):
                raise self._lost(run_id, fence) from None
            if "engrain:conflict" in str(e) or "UNIQUE" in str(e):
                raise self._conflict(run_id, expected_seq) from None
            if "engrain:finished" in str(e):  # the trigger found the run's last event finishing it
                (last,) = self._db.execute(LAST_KIND, (run_id,)).fetchone()
                raise RunFinishedError(run_id, ENDED_BY[last], kind) from None
            raise e
        raise self._translate(e) from e

    def _set_fence(self, run_id: str, fence: int | None) -> None:
        """Make this connection's inserts for ``run_id`` require lease epoch ``fence`` (None: no fence)."""
        if fence is None:
            self._sync(FENCE_DROP, (run_id,))
            self._fences.pop(run_id, None)
            return
        if len(self._fences) >= MAX_FENCES:
            self._sync("DELETE FROM temp.engrain_fence")
            self._fences.clear()
        self._sync(FENCE_SET, (run_id, fence))
        self._fences[run_id] = fence

    def append_queued(self, run_id: str, events: Sequence[NewEvent], queue: str, agent: str, priority: int) -> None:
        ts = self._now()
        batch = prepare(run_id, events, 0, ts)
        if batch.status in FINISHED:
            raise ValueError(f"run {run_id!r}: a queued run's events must leave it to execute, not finish it")
        with self._lock:
            try:
                if run_id in self._fences:
                    self._set_fence(run_id, None)
                self._write(batch.rows, run_id, None, ts, (queue, agent, priority))
                self._committed()
            except sqlite3.Error as e:
                self._refused(e, run_id, 0, None, batch.rows[0][3])

    def _write(self, rows: Sequence[tuple], run_id: str, lease: tuple[str, float] | None, ts: float,
               queued: tuple[str, str, int] | None = None) -> None:
        """Insert ``rows`` (and lease the new run, or queue it: ``(queue, agent, priority)``) in one
        transaction; the caller holds the lock.

        A fence set for ``run_id`` (:meth:`_set_fence`) is checked by the TEMP trigger on every row.
        """
        db, chunk, execute = self._db, self._chunk, self._insert  # the kept cursor: no cursor made per statement
        execute("BEGIN IMMEDIATE")
        try:
            if len(rows) == 1:  # a leased run's start: its one row as it is
                execute(INSERT, rows[0])
            else:
                for k in range(0, len(rows), chunk):
                    part = rows[k : k + chunk]
                    execute(INSERTS[len(part)], [v for r in part for v in r])
            if queued is not None:
                execute(QUEUE_DROP, (run_id,))  # a row left by a deleted run of this id
                execute(QUEUE_ADD, (run_id, *queued, ts))
                execute(QUEUED, (run_id,))
            fenced = lease is not None and len(self._fences) < MAX_FENCES
            if lease is not None:
                execute(LEASE_NEW, (lease[0], ts + lease[1], run_id))
                if fenced:
                    # Its executor fences its appends with the epoch a new run's lease starts at (1): set in
                    # this transaction, the first of them needs no statement of its own (~1.5 µs less).
                    execute(FENCE_SET, (run_id, 1))
            execute("COMMIT")
            if fenced:
                self._fences[run_id] = 1  # only once committed: a rolled-back fence row is not there
        except BaseException:
            sqlite_rollback(db)
            raise

    def _lost(self, run_id: str, fence: int | None) -> LeaseLostError:
        row = self._db.execute("SELECT lease_owner FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return LeaseLostError(run_id, row[0] if row else None, fence)

    def _conflict(self, run_id: str, expected_seq: int) -> ConflictError:
        row = self._db.execute("SELECT COALESCE(MAX(seq) + 1, 0) FROM events WHERE run_id = ?", (run_id,)).fetchone()
        return ConflictError(run_id, expected_seq, row[0])

    def take_lease(self, run_id: str, owner: str, ttl: float) -> int | None:
        check_lookup_id(run_id)  # as PostgreSQL's: a typed error for no string, not a silent miss
        now = self._now()
        try:
            with self._lock:
                # SET expressions see the row before the update: the epoch moves
                # only when the lease changes hands, not on a renewal.
                row = self._db.execute(
                    "UPDATE runs SET lease_epoch = lease_epoch + (lease_owner IS NOT ?), lease_owner = ?, lease_until = ?"
                    " WHERE run_id = ? AND (lease_owner IS NULL OR lease_owner = ? OR lease_until < ?) RETURNING lease_epoch",
                    (owner, owner, now + ttl, run_id, owner, now),
                ).fetchone()
        except sqlite3.Error as e:
            raise self._translate(e) from e
        if row is not None:
            return row[0]
        if self.get_run(run_id) is None:
            raise RunNotFoundError(run_id)
        return None

    def renew_lease(self, run_id: str, owner: str, ttl: float, epoch: int) -> bool:
        check_lookup_id(run_id)
        try:
            with self._lock:
                row = self._db.execute(
                    "UPDATE runs SET lease_until = ? WHERE run_id = ? AND lease_owner = ? AND lease_epoch = ? RETURNING 1",
                    (self._now() + ttl, run_id, owner, epoch),
                ).fetchone()
        except sqlite3.Error as e:
            raise self._translate(e) from e
        return row is not None

    def release_lease(self, run_id: str, owner: str, epoch: int | None = None) -> None:
        at = "" if epoch is None else " AND lease_epoch = ?"
        check_lookup_id(run_id)
        try:
            with self._lock:
                self._db.execute(
                    f"UPDATE runs SET lease_owner = NULL, lease_until = NULL WHERE run_id = ? AND lease_owner = ?{at}",
                    (run_id, owner) if epoch is None else (run_id, owner, epoch),
                )
        except sqlite3.Error as e:
            raise self._translate(e) from e

    def claim_runs(
        self, owner: str, ttl: float, limit: int = 10, *, agents: Agents | None = None
    ) -> list[RunInfo]:
        now = self._now()
        db = self._db
        code, not_client = trust_sql(False, "runs")
        which, names = (not_client, []) if agents is None else agents_filter(agents, "agent", "?", code)
        if agents is not None:
            which = f"{which} AND {not_client}"
        with self._lock:
            try:
                # BEGIN IMMEDIATE takes the database write lock, so two processes claiming at once are
                # serialized and never get the same run (one held past the timeout: a StorageError).
                db.execute("BEGIN IMMEDIATE")
                ids = [
                    r[0]
                    for r in db.execute(
                        "SELECT run_id FROM runs WHERE status = 'running'"
                        f" AND (lease_until IS NULL OR lease_until < ?) AND {which}"
                        # a queued run is left to the workers, which apply its queue's limits
                        " AND NOT EXISTS (SELECT 1 FROM engrain_queue q WHERE q.run_id = runs.run_id)"
                        " ORDER BY updated LIMIT ?",
                        (now, *names, limit),
                    )
                ]
                db.executemany(
                    "UPDATE runs SET lease_epoch = lease_epoch + (lease_owner IS NOT ?), lease_owner = ?, lease_until = ?"
                    " WHERE run_id = ?",
                    [(owner, owner, now + ttl, i) for i in ids],
                )
                db.execute("COMMIT")
            except BaseException as e:
                sqlite_rollback(db)
                if isinstance(e, sqlite3.Error):
                    raise self._translate(e) from e
                raise
        return [info for i in ids if (info := self.get_run(i)) is not None]

    def delete_run(self, run_id: str) -> None:
        check_lookup_id(run_id)
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                for sql in DELETE_RUN:
                    self._db.execute(sql, (run_id,))
                self._db.execute("COMMIT")
            except BaseException as e:
                sqlite_rollback(self._db)  # left open, it would take in this connection's later appends, uncommitted
                if isinstance(e, sqlite3.Error):
                    raise self._translate(e) from e
                raise

    # -- reads -------------------------------------------------------------------

    def read(self, run_id: str, after: int = -1, limit: int | None = None) -> list[Event]:
        # Before the try: a bad id's encoding error is a ValueError too, and is no damaged page.
        check_lookup_id(run_id)
        try:
            return events_of(run_id, self.read_raw(run_id, after, limit))
        except ValueError as e:  # text the journal wrote as JSON no longer is: damaged pages
            raise StoreCorruptError(str(self.path), f"an event of run {run_id!r} is not JSON ({e})") from None

    def read_raw(self, run_id: str, after: int = -1, limit: int | None = None) -> list[Row]:
        after, limit = window(run_id, after, limit)  # a lone surrogate: the caller's bad input, not the driver's error
        try:
            with self._lock:
                # run_id is the caller's: not selecting it saves a string object per event.
                if limit is None:
                    return self._db.execute(
                        "SELECT seq, ts, kind, name, data FROM events WHERE run_id = ? AND seq > ? ORDER BY seq",
                        (run_id, after),
                    ).fetchall()
                return self._db.execute(
                    "SELECT seq, ts, kind, name, data FROM events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                    (run_id, after, max(0, limit)),
                ).fetchall()
        except sqlite3.Error as e:
            raise self._translate(e) from e

    def get_run(self, run_id: str) -> RunInfo | None:
        check_lookup_id(run_id)
        try:
            with self._lock:
                row = self._db.execute(f"SELECT {RUN_COLS} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        except sqlite3.Error as e:
            raise self._translate(e) from e
        return None if row is None else _run_info(row)

    def get_runs(self, run_ids: Sequence[str]) -> dict[str, RunInfo]:
        out: dict[str, RunInfo] = {}
        ids = list(dict.fromkeys(run_ids))
        for i in ids:
            check_lookup_id(i)
        try:
            with self._lock:
                for i in range(0, len(ids), 500):  # under SQLite's bound-parameter limit
                    chunk = ids[i:i + 500]
                    sql = f"SELECT {RUN_COLS} FROM runs WHERE run_id IN ({','.join('?' * len(chunk))})"
                    out.update((info.run_id, info) for info in map(_run_info, self._db.execute(sql, chunk)))
        except sqlite3.Error as e:
            raise self._translate(e) from e
        return out

    def runs(
        self,
        *,
        status: str | Sequence[str] | None = None,
        task: str | None = None,
        tag: str | None = None,
        since: float | None = None,
        limit: int = 100,
        offset: int = 0,
        prefix: str | None = None,
    ) -> list[RunInfo]:
        where, args = run_filters(
            status, task, tag, since, placeholder="?", tag_clause="EXISTS (SELECT 1 FROM json_each(runs.tags) WHERE value = ?)",
            prefix=prefix and glob_prefix(prefix), prefix_clause="run_id GLOB ?",
        )
        sql = f"SELECT {RUN_COLS} FROM runs{where} ORDER BY updated DESC, run_id LIMIT ? OFFSET ?"
        try:
            with self._lock:
                rows = self._db.execute(sql, (*args, *page(limit, offset))).fetchall()
        except sqlite3.Error as e:
            raise self._translate(e) from e
        return [_run_info(r) for r in rows]

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
        with self._lock:
            self._db.close()
