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
from collections.abc import Sequence
from pathlib import Path

from .._errors import ConfigError, ConflictError, RunNotFoundError
from .._events import Event, NewEvent, RunInfo, loads, loads_many
from ._common import FINISH_KINDS, FINISHED, check_lease, prepare, prepare_one, run_filters
from .base import Journal

# Kept up to date in existing files by _MIGRATE, so a change here reaches them.
# The kind test is a chain of = rather than IN (...): this WHEN runs for every
# inserted event, and IN builds its list each time (~2 µs per row). A run's
# finish drops its lease in the same write (see Journal.append).
_STATUS_TRIGGER = """AFTER INSERT ON events
WHEN NEW.seq > 0 AND (NEW.kind = 'run.completed' OR NEW.kind = 'run.failed' OR NEW.kind = 'input.requested'
    OR NEW.kind = 'input.received' OR NEW.kind = 'replay.started' OR NEW.kind = 'run.started'
    OR NEW.kind = 'run.cancelled')
BEGIN
    UPDATE runs SET
        updated = NEW.ts,
        status = CASE NEW.kind
            WHEN 'run.completed' THEN 'completed'
            WHEN 'run.failed' THEN 'failed'
            WHEN 'run.cancelled' THEN 'cancelled'
            WHEN 'input.requested' THEN 'needs_input'
            ELSE 'running' END,
        task = CASE WHEN NEW.kind = 'run.started' THEN COALESCE(json_extract(NEW.data, '$.task'), '') ELSE task END,
        tags = CASE WHEN NEW.kind = 'run.started' THEN COALESCE(json_extract(NEW.data, '$.tags'), '[]') ELSE tags END,
        lease_owner = CASE WHEN NEW.kind = 'run.completed' OR NEW.kind = 'run.failed' OR NEW.kind = 'run.cancelled'
            THEN NULL ELSE lease_owner END,
        lease_until = CASE WHEN NEW.kind = 'run.completed' OR NEW.kind = 'run.failed' OR NEW.kind = 'run.cancelled'
            THEN NULL ELSE lease_until END
    WHERE run_id = NEW.run_id;
END"""
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    ts REAL NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    task TEXT NOT NULL DEFAULT '',
    tags TEXT NOT NULL DEFAULT '[]',
    created REAL NOT NULL,
    updated REAL NOT NULL,
    lease_owner TEXT,
    lease_until REAL
);
CREATE INDEX IF NOT EXISTS runs_updated ON runs (updated);
CREATE INDEX IF NOT EXISTS runs_status ON runs (status, lease_until);
-- Appending one event is one INSERT in autocommit (one commit, no round trips):
-- the dense-seq check reads the primary key, and the runs row is written only
-- when a run starts or changes status, because rewriting it (and its index) on
-- every step would triple the cost of a step.
CREATE TRIGGER IF NOT EXISTS events_dense_seq BEFORE INSERT ON events BEGIN
    SELECT RAISE(ABORT, 'engrain:conflict')
    WHERE NEW.seq != COALESCE((SELECT MAX(seq) + 1 FROM events WHERE run_id = NEW.run_id), 0);
END;
CREATE TRIGGER IF NOT EXISTS events_run_created AFTER INSERT ON events WHEN NEW.seq = 0 BEGIN
    INSERT INTO runs (run_id, status, task, tags, created, updated) VALUES (
        NEW.run_id, 'running',
        CASE WHEN NEW.kind = 'run.started' THEN COALESCE(json_extract(NEW.data, '$.task'), '') ELSE '' END,
        CASE WHEN NEW.kind = 'run.started' THEN COALESCE(json_extract(NEW.data, '$.tags'), '[]') ELSE '[]' END,
        NEW.ts, NEW.ts);
END;
CREATE TRIGGER IF NOT EXISTS events_run_status {_STATUS_TRIGGER};
"""
# What sqlite_master holds for the current trigger (it drops IF NOT EXISTS).
_STATUS_TRIGGER_SQL = f"CREATE TRIGGER events_run_status {_STATUS_TRIGGER}"
# Replaces an older events_run_status in one write transaction, so no insert
# by another connection (this version or an older one) runs between the DROP
# and the CREATE, and concurrent openers migrating at once take turns.
_MIGRATE = f"""
BEGIN IMMEDIATE;
DROP TRIGGER IF EXISTS events_run_status;
{_STATUS_TRIGGER_SQL};
COMMIT;
"""
_INSERT = "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)"
_CHUNK = 64
_INSERTS = {n: "INSERT INTO events VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?)"] * n) for n in range(1, _CHUNK + 1)}
_LEASE_NEW = "UPDATE runs SET lease_owner = ?, lease_until = ? WHERE run_id = ?"

_RUN_COLS = (
    "run_id, status, task, tags, created, updated,"
    " (SELECT COALESCE(MAX(seq) + 1, 0) FROM events WHERE events.run_id = runs.run_id), lease_owner, lease_until"
)


def _run_info(row: tuple) -> RunInfo:
    return RunInfo(row[0], row[1], row[2], loads(row[3]), row[4], row[5], row[6], row[7], row[8])


class SQLiteJournal(Journal):
    """Journal in one SQLite file."""

    backend = "sqlite"

    def __init__(self, path: str | os.PathLike[str], durability: str = "normal", timeout: float = 30.0):
        if durability not in ("normal", "full"):
            raise ConfigError(f"durability must be 'normal' or 'full', got {durability!r}")
        self.path = Path(path)
        self.durability = durability
        self.url = f"sqlite:///{self.path}"
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves so one append is one transaction.
        self._db = sqlite3.connect(str(path), timeout=timeout, isolation_level=None, check_same_thread=False)
        self._lock = threading.RLock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if durability == 'full' else 'NORMAL'}")
        self._db.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
        with self._lock:
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = 'events_run_status'").fetchone()
            if row is None or row[0] != _STATUS_TRIGGER_SQL:
                self._db.executescript(_MIGRATE)
        # A batch goes in multi-row INSERTs (faster than executemany) of at most
        # _CHUNK rows, which also bounds the distinct statements to prepare.
        self._chunk = max(1, min(_CHUNK, self._db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // 6))
        # The per-step path, bound once: a kept cursor saves creating one per
        # INSERT, and the synchronous toggles of durable=False are cached statements.
        self._full = durability == "full"
        self._insert = self._db.cursor().execute
        self._sync = self._db.cursor().execute

    # -- writes ------------------------------------------------------------------

    def append(
        self,
        run_id: str,
        events: Sequence[NewEvent],
        expected_seq: int,
        *,
        durable: bool = True,
        lease: tuple[str, float] | None = None,
    ) -> list[Event]:
        ts = self._now()
        lease = check_lease(lease, expected_seq)
        # One event (every step of a durable run) skips building a Batch: the
        # triggers keep the runs row, so the status it computes is not needed here.
        one = len(events) == 1
        if one:
            rows = [prepare_one(run_id, events[0], expected_seq, ts)]
            finishes = rows[0][3] in FINISH_KINDS
        else:
            batch = prepare(run_id, events, expected_seq, ts)
            rows, finishes = batch.rows, batch.status in FINISHED
        if finishes:
            lease = None  # the run is finished by this append: nothing to lease
        with self._lock:
            fsync_skipped = not durable and self._full
            try:
                if fsync_skipped:
                    # WAL frames written now survive a process crash; the next fsync'd
                    # commit makes them durable against power loss as well.
                    self._sync("PRAGMA synchronous=NORMAL")
                n = len(rows)
                if lease is None and n <= self._chunk:
                    # autocommit: one statement, one commit
                    self._insert(_INSERT if one else _INSERTS[n], rows[0] if one else [v for r in rows for v in r])
                else:
                    self._write(rows, run_id, lease, ts)
            except sqlite3.IntegrityError as e:
                if "engrain:conflict" in str(e) or "UNIQUE" in str(e):
                    raise self._conflict(run_id, expected_seq) from None
                raise
            finally:
                if fsync_skipped:
                    self._sync("PRAGMA synchronous=FULL")
        if one:
            r = rows[0]
            return [Event(run_id, expected_seq, r[2], r[3], r[4], events[0].data)]
        return [Event(r[0], r[1], r[2], r[3], r[4], ev.data) for r, ev in zip(rows, events)]

    def _write(self, rows: list[tuple], run_id: str, lease: tuple[str, float] | None, ts: float) -> None:
        """Insert ``rows`` (and lease the new run) in one transaction; the caller holds the lock."""
        db, chunk = self._db, self._chunk
        db.execute("BEGIN IMMEDIATE")
        try:
            for k in range(0, len(rows), chunk):
                part = rows[k : k + chunk]
                db.execute(_INSERTS[len(part)], [v for r in part for v in r])
            if lease is not None:
                db.execute(_LEASE_NEW, (lease[0], ts + lease[1], run_id))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _conflict(self, run_id: str, expected_seq: int) -> ConflictError:
        row = self._db.execute("SELECT COALESCE(MAX(seq) + 1, 0) FROM events WHERE run_id = ?", (run_id,)).fetchone()
        return ConflictError(run_id, expected_seq, row[0])

    def acquire_lease(self, run_id: str, owner: str, ttl: float) -> bool:
        now = self._now()
        with self._lock:
            cur = self._db.execute(
                "UPDATE runs SET lease_owner = ?, lease_until = ? WHERE run_id = ?"
                " AND (lease_owner IS NULL OR lease_owner = ? OR lease_until < ?)",
                (owner, now + ttl, run_id, owner, now),
            )
            if cur.rowcount == 1:
                return True
            if self.get_run(run_id) is None:
                raise RunNotFoundError(run_id)
            return False

    def release_lease(self, run_id: str, owner: str) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE runs SET lease_owner = NULL, lease_until = NULL WHERE run_id = ? AND lease_owner = ?",
                (run_id, owner),
            )

    def claim_runs(self, owner: str, ttl: float, limit: int = 10) -> list[RunInfo]:
        now = self._now()
        db = self._db
        with self._lock:
            # BEGIN IMMEDIATE takes the database write lock, so two processes
            # claiming at once are serialized and never get the same run.
            db.execute("BEGIN IMMEDIATE")
            try:
                ids = [
                    r[0]
                    for r in db.execute(
                        "SELECT run_id FROM runs WHERE status = 'running'"
                        " AND (lease_until IS NULL OR lease_until < ?) ORDER BY updated LIMIT ?",
                        (now, limit),
                    )
                ]
                db.executemany(
                    "UPDATE runs SET lease_owner = ?, lease_until = ? WHERE run_id = ?",
                    [(owner, now + ttl, i) for i in ids],
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return [info for i in ids if (info := self.get_run(i)) is not None]

    def delete_run(self, run_id: str) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM events WHERE run_id = ?", (run_id,))
            self._db.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
            self._db.execute("COMMIT")

    # -- reads -------------------------------------------------------------------

    def read(self, run_id: str, after: int = -1) -> list[Event]:
        with self._lock:
            rows = self._db.execute(
                "SELECT run_id, seq, ts, kind, name, data FROM events WHERE run_id = ? AND seq > ? ORDER BY seq",
                (run_id, after),
            ).fetchall()
        datas = loads_many([r[5] for r in rows])
        return [Event(r[0], r[1], r[2], r[3], r[4], d) for r, d in zip(rows, datas)]

    def get_run(self, run_id: str) -> RunInfo | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_RUN_COLS} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else _run_info(row)

    def runs(
        self,
        *,
        status: str | Sequence[str] | None = None,
        task: str | None = None,
        tag: str | None = None,
        since: float | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[RunInfo]:
        where, args = run_filters(
            status, task, tag, since, placeholder="?", tag_clause="EXISTS (SELECT 1 FROM json_each(runs.tags) WHERE value = ?)"
        )
        sql = f"SELECT {_RUN_COLS} FROM runs{where} ORDER BY updated DESC, run_id LIMIT ? OFFSET ?"
        with self._lock:
            rows = self._db.execute(sql, (*args, int(limit), int(offset))).fetchall()
        return [_run_info(r) for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
