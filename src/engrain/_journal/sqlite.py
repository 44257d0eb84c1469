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
from ._common import prepare, prepare_one, run_filters
from .base import Journal

_SCHEMA = """
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
CREATE TRIGGER IF NOT EXISTS events_run_status AFTER INSERT ON events
WHEN NEW.seq > 0 AND NEW.kind IN
    ('run.started', 'run.completed', 'run.failed', 'input.requested', 'input.received', 'replay.started')
BEGIN
    UPDATE runs SET
        updated = NEW.ts,
        status = CASE NEW.kind
            WHEN 'run.completed' THEN 'completed'
            WHEN 'run.failed' THEN 'failed'
            WHEN 'input.requested' THEN 'needs_input'
            ELSE 'running' END,
        task = CASE WHEN NEW.kind = 'run.started' THEN COALESCE(json_extract(NEW.data, '$.task'), '') ELSE task END,
        tags = CASE WHEN NEW.kind = 'run.started' THEN COALESCE(json_extract(NEW.data, '$.tags'), '[]') ELSE tags END
    WHERE run_id = NEW.run_id;
END;
"""
_INSERT = "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)"

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
        # The per-step path, bound once: a kept cursor saves creating one per
        # INSERT, and the synchronous toggles of durable=False are cached statements.
        self._full = durability == "full"
        self._insert = self._db.cursor().execute
        self._sync = self._db.cursor().execute

    # -- writes ------------------------------------------------------------------

    def append(
        self, run_id: str, events: Sequence[NewEvent], expected_seq: int, *, durable: bool = True
    ) -> list[Event]:
        # One event (every step of a durable run) skips building a Batch: the
        # triggers keep the runs row, so the status it computes is not needed here.
        one = len(events) == 1
        if one:
            rows = [prepare_one(run_id, events[0], expected_seq, self._now())]
        else:
            rows = prepare(run_id, events, expected_seq, self._now()).rows
        with self._lock:
            fsync_skipped = not durable and self._full
            try:
                if fsync_skipped:
                    # WAL frames written now survive a process crash; the next fsync'd
                    # commit makes them durable against power loss as well.
                    self._sync("PRAGMA synchronous=NORMAL")
                if one:
                    self._insert(_INSERT, rows[0])  # autocommit: one statement, one commit
                else:
                    db = self._db
                    db.execute("BEGIN IMMEDIATE")
                    try:
                        db.executemany(_INSERT, rows)
                        db.execute("COMMIT")
                    except BaseException:
                        db.execute("ROLLBACK")
                        raise
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
