"""The SQLite journal's schema and its forward migrations.

The store records its schema version in ``engrain_meta`` (key ``journal``).
Opening a store applies the missing migrations in order, in one write
transaction (``BEGIN IMMEDIATE``), so concurrent openers take turns and an
interrupted migration leaves the old version intact. A store whose version is
higher than :data:`VERSION` was written by a newer engrain and is refused.

To change the schema, append one function to :data:`MIGRATIONS` (it becomes
version ``len(MIGRATIONS)``). It receives the connection inside the
transaction and runs statements with ``db.execute`` (never ``executescript``,
which would commit half-way). Never edit a released migration: stores already
at that version would not see the change. The PostgreSQL list in
``postgres_schema.py`` keeps the same numbering, so add the matching function
there too (a no-op if the change does not apply to that backend).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

from .._errors import StoreVersionError

# The runs row follows the events: a run's status changes only on these kinds.
# The kind test is a chain of = rather than IN (...): this WHEN runs for every
# inserted event, and IN builds its list each time (~2 µs per row). A run's
# finish drops its lease in the same write (see Journal.append).
_STATUS_TRIGGER_V2 = """CREATE TRIGGER events_run_status AFTER INSERT ON events
WHEN NEW.seq > 0 AND (NEW.kind = 'run.completed' OR NEW.kind = 'run.failed' OR NEW.kind = 'input.requested'
    OR NEW.kind = 'input.received' OR NEW.kind = 'replay.started' OR NEW.kind = 'run.started')
BEGIN
    UPDATE runs SET
        updated = NEW.ts,
        status = CASE NEW.kind
            WHEN 'run.completed' THEN 'ok'
            WHEN 'run.failed' THEN 'failed'
            WHEN 'input.requested' THEN 'needs_input'
            ELSE 'running' END,
        task = CASE WHEN NEW.kind = 'run.started' THEN COALESCE(json_extract(NEW.data, '$.task'), '') ELSE task END,
        tags = CASE WHEN NEW.kind = 'run.started' THEN COALESCE(json_extract(NEW.data, '$.tags'), '[]') ELSE tags END,
        lease_owner = CASE WHEN NEW.kind = 'run.completed' OR NEW.kind = 'run.failed' THEN NULL ELSE lease_owner END,
        lease_until = CASE WHEN NEW.kind = 'run.completed' OR NEW.kind = 'run.failed' THEN NULL ELSE lease_until END
    WHERE run_id = NEW.run_id;
END"""


def _v1_tables(db: sqlite3.Connection) -> None:
    """The tables as they were before versioning (IF NOT EXISTS: unversioned stores already have them)."""
    for stmt in (
        """CREATE TABLE IF NOT EXISTS events (
            run_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            ts REAL NOT NULL,
            kind TEXT NOT NULL,
            name TEXT NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (run_id, seq)
        ) WITHOUT ROWID""",
        """CREATE TABLE IF NOT EXISTS runs (
            run_id TEXT PRIMARY KEY,
            status TEXT NOT NULL,
            task TEXT NOT NULL DEFAULT '',
            tags TEXT NOT NULL DEFAULT '[]',
            created REAL NOT NULL,
            updated REAL NOT NULL,
            lease_owner TEXT,
            lease_until REAL
        )""",
        "CREATE INDEX IF NOT EXISTS runs_updated ON runs (updated)",
        "CREATE INDEX IF NOT EXISTS runs_status ON runs (status, lease_until)",
        # Appending one event is one INSERT in autocommit (one commit, no round
        # trips): the dense-seq check reads the primary key, and the runs row is
        # written only when a run starts or changes status, because rewriting it
        # (and its index) on every step would triple the cost of a step.
        """CREATE TRIGGER IF NOT EXISTS events_dense_seq BEFORE INSERT ON events BEGIN
            SELECT RAISE(ABORT, 'engrain:conflict')
            WHERE NEW.seq != COALESCE((SELECT MAX(seq) + 1 FROM events WHERE run_id = NEW.run_id), 0);
        END""",
        """CREATE TRIGGER IF NOT EXISTS events_run_created AFTER INSERT ON events WHEN NEW.seq = 0 BEGIN
            INSERT INTO runs (run_id, status, task, tags, created, updated) VALUES (
                NEW.run_id, 'running',
                CASE WHEN NEW.kind = 'run.started' THEN COALESCE(json_extract(NEW.data, '$.task'), '') ELSE '' END,
                CASE WHEN NEW.kind = 'run.started' THEN COALESCE(json_extract(NEW.data, '$.tags'), '[]') ELSE '[]' END,
                NEW.ts, NEW.ts);
        END""",
    ):
        db.execute(stmt)


def _v2_status_ok(db: sqlite3.Connection) -> None:
    """One status vocabulary: a finished run is ``ok``, no longer ``completed``."""
    db.execute("DROP TRIGGER IF EXISTS events_run_status")
    db.execute(_STATUS_TRIGGER_V2)
    db.execute("UPDATE runs SET status = 'ok' WHERE status = 'completed'")


def _v3_lease_epoch(db: sqlite3.Connection) -> None:
    """Fencing: every change of a lease's holder increments ``lease_epoch``; appends may require theirs."""
    cols = {r[1] for r in db.execute("PRAGMA table_info(runs)")}
    if "lease_epoch" not in cols:
        db.execute("ALTER TABLE runs ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0")


def _v4_agent(db: sqlite3.Connection) -> None:
    """Runs record their agent (from ``run.started``), so recovery hands a run only to its own agent.

    The agent is fixed when the run is created: a later ``run.started`` cannot
    hand the run to another agent's ``recover()``. Older runs keep ``agent`` NULL.
    """
    cols = {r[1] for r in db.execute("PRAGMA table_info(runs)")}
    if "agent" not in cols:
        db.execute("ALTER TABLE runs ADD COLUMN agent TEXT")
    db.execute("DROP TRIGGER IF EXISTS events_run_created")
    db.execute(
        """CREATE TRIGGER events_run_created AFTER INSERT ON events WHEN NEW.seq = 0 BEGIN
            INSERT INTO runs (run_id, status, task, tags, created, updated, agent) VALUES (
                NEW.run_id, 'running',
                CASE WHEN NEW.kind = 'run.started' THEN COALESCE(json_extract(NEW.data, '$.task'), '') ELSE '' END,
                CASE WHEN NEW.kind = 'run.started' THEN COALESCE(json_extract(NEW.data, '$.tags'), '[]') ELSE '[]' END,
                NEW.ts, NEW.ts,
                CASE WHEN NEW.kind = 'run.started' AND json_type(NEW.data, '$.agent') = 'text'
                    THEN NULLIF(json_extract(NEW.data, '$.agent'), '') END);
        END"""
    )


_STATUS_TRIGGER_V5 = """CREATE TRIGGER events_run_status AFTER INSERT ON events
WHEN NEW.seq > 0 AND (NEW.kind = 'run.completed' OR NEW.kind = 'run.failed' OR NEW.kind = 'input.requested'
    OR NEW.kind = 'input.received' OR NEW.kind = 'replay.started' OR NEW.kind = 'run.started'
    OR NEW.kind = 'run.cancelled')
BEGIN
    UPDATE runs SET
        updated = NEW.ts,
        status = CASE NEW.kind
            WHEN 'run.completed' THEN 'ok'
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


def _v5_cancelled(db: sqlite3.Connection) -> None:
    """``run.cancelled`` finishes a run: status ``cancelled``, lease dropped, never resumed."""
    db.execute("DROP TRIGGER IF EXISTS events_run_status")
    db.execute(_STATUS_TRIGGER_V5)


def _v6_queues(db: sqlite3.Connection) -> None:
    """The toolkit's queue tables: a queued run's queue, agent, priority and due time; each queue's limits.

    IF NOT EXISTS: stores used by workers before this version already have them
    (the queue store created them itself then).
    """
    for stmt in (
        """CREATE TABLE IF NOT EXISTS engrain_queue (
            run_id TEXT PRIMARY KEY,
            queue TEXT NOT NULL,
            agent TEXT NOT NULL,
            priority INTEGER NOT NULL DEFAULT 0,
            available REAL NOT NULL,
            first_claimed REAL
        )""",
        "CREATE INDEX IF NOT EXISTS engrain_queue_pick ON engrain_queue (queue, priority DESC, available)",
        """CREATE TABLE IF NOT EXISTS engrain_queues (
            name TEXT PRIMARY KEY,
            concurrency INTEGER,
            rate_limit INTEGER,
            rate_period REAL
        )""",
    ):
        db.execute(stmt)


# The dense-seq check and the finished check read one row: the run's last event, whose seq the
# check had to find anyway (MAX(seq) seeks the primary key's end; a bare column of a MAX query is
# read from that same row), so refusing an append after the end costs no lookup of its own.
# The conflict is tested first: a stale writer (a live executor that a cancel overtook) must keep
# getting ConflictError, which is how it learns of the cancel.
_DENSE_SEQ_TRIGGER_V7 = """CREATE TRIGGER events_dense_seq BEFORE INSERT ON events BEGIN
    SELECT CASE (SELECT CASE WHEN COALESCE(MAX(seq) + 1, 0) != NEW.seq THEN 1
            WHEN kind = 'run.completed' OR kind = 'run.failed' OR kind = 'run.cancelled' THEN 2 END
        FROM events WHERE run_id = NEW.run_id)
    WHEN 1 THEN RAISE(ABORT, 'engrain:conflict')
    WHEN 2 THEN RAISE(ABORT, 'engrain:finished') END;
END"""


def _v7_finished(db: sqlite3.Connection) -> None:
    """A finished run stays finished: no event is appended after its finishing event (see ``_common``)."""
    db.execute("DROP TRIGGER IF EXISTS events_dense_seq")
    db.execute(_DENSE_SEQ_TRIGGER_V7)


#: Migration ``i`` (0-based) brings a store from version ``i`` to ``i + 1``. Append only.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _v1_tables, _v2_status_ok, _v3_lease_epoch, _v4_agent, _v5_cancelled,
    _v6_queues, _v7_finished,
]
VERSION = len(MIGRATIONS)


def _version(db: sqlite3.Connection) -> int:
    try:
        row = db.execute("SELECT value FROM engrain_meta WHERE key = 'journal'").fetchone()
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return 0
        raise
    return 0 if row is None else int(row[0])


def migrate(db: sqlite3.Connection, store: str) -> int:
    """Bring the store to :data:`VERSION`; return the version it had. The connection must be in autocommit."""
    found = _version(db)
    if found > VERSION:
        raise StoreVersionError(store, found, VERSION)
    if found == VERSION:
        return found
    db.execute("BEGIN IMMEDIATE")
    try:
        found = _version(db)  # again, under the write lock: another opener may have migrated meanwhile
        if found > VERSION:
            raise StoreVersionError(store, found, VERSION)
        db.execute("CREATE TABLE IF NOT EXISTS engrain_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        for step in MIGRATIONS[found:]:
            step(db)
        db.execute("INSERT OR REPLACE INTO engrain_meta (key, value) VALUES ('journal', ?)", (str(VERSION),))
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return found


def to_wal(db: sqlite3.Connection, timeout: float) -> None:
    """Put the file in WAL mode, waiting up to ``timeout`` seconds for other openers.

    Leaving a rollback journal needs the file to itself, and SQLite answers "database is
    locked" at once, without its busy handler, when openers of a new or older store race
    for that; so the switch is retried here like any other busy write.
    """
    deadline = time.monotonic() + timeout
    pause = 0.002
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)
