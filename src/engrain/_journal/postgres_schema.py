"""The PostgreSQL journal's schema and its forward migrations.

Same rules and numbering as ``sqlite_schema.py``: ``engrain_meta`` (key
``journal``) holds the version; opening applies the missing migrations in
order, in one transaction under an advisory lock, so workers opening at once
take turns; a store with a higher version is refused. To change the schema,
append one function to :data:`MIGRATIONS` here and its counterpart to the
SQLite list (a no-op where a change does not apply).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._errors import StoreVersionError

#: Advisory lock key serializing schema creation and migration across workers.
_LOCK = 727401


def _v1_tables(db: Any) -> None:
    """The tables as they were before versioning (IF NOT EXISTS: unversioned stores already have them)."""
    for stmt in (
        """CREATE TABLE IF NOT EXISTS engrain_events (
            run_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            ts DOUBLE PRECISION NOT NULL,
            kind TEXT NOT NULL,
            name TEXT NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (run_id, seq)
        )""",
        """CREATE TABLE IF NOT EXISTS engrain_runs (
            run_id TEXT PRIMARY KEY,
            status TEXT NOT NULL,
            task TEXT NOT NULL DEFAULT '',
            tags JSONB NOT NULL DEFAULT '[]',
            created DOUBLE PRECISION NOT NULL,
            updated DOUBLE PRECISION NOT NULL,
            next_seq INTEGER NOT NULL,
            lease_owner TEXT,
            lease_until DOUBLE PRECISION
        )""",
        "CREATE INDEX IF NOT EXISTS engrain_runs_updated ON engrain_runs (updated)",
        "CREATE INDEX IF NOT EXISTS engrain_runs_status ON engrain_runs (status, lease_until)",
    ):
        db.execute(stmt)


def _v2_status_ok(db: Any) -> None:
    """One status vocabulary: a finished run is ``ok``, no longer ``completed``."""
    db.execute("UPDATE engrain_runs SET status = 'ok' WHERE status = 'completed'")


def _v3_lease_epoch(db: Any) -> None:
    """Fencing: every change of a lease's holder increments ``lease_epoch``; appends may require theirs."""
    db.execute("ALTER TABLE engrain_runs ADD COLUMN IF NOT EXISTS lease_epoch BIGINT NOT NULL DEFAULT 0")


def _v4_agent(db: Any) -> None:
    """Runs record their agent (set by the append that creates the run), so recovery hands a run only to its agent."""
    db.execute("ALTER TABLE engrain_runs ADD COLUMN IF NOT EXISTS agent TEXT")


def _v5_cancelled(db: Any) -> None:
    """``run.cancelled`` finishes a run. The append derives statuses in code (``status_after``): nothing to change."""


def _v6_queues(db: Any) -> None:
    """The toolkit's queue tables (IF NOT EXISTS: stores used by workers before this version have them)."""
    for stmt in (
        """CREATE TABLE IF NOT EXISTS engrain_queue (
            run_id TEXT PRIMARY KEY,
            queue TEXT NOT NULL,
            agent TEXT NOT NULL,
            priority INTEGER NOT NULL DEFAULT 0,
            available DOUBLE PRECISION NOT NULL,
            first_claimed DOUBLE PRECISION
        )""",
        "CREATE INDEX IF NOT EXISTS engrain_queue_pick ON engrain_queue (queue, priority DESC, available)",
        """CREATE TABLE IF NOT EXISTS engrain_queues (
            name TEXT PRIMARY KEY,
            concurrency INTEGER,
            rate_limit INTEGER,
            rate_period DOUBLE PRECISION
        )""",
    ):
        db.execute(stmt)


def _v7_finished(db: Any) -> None:
    """A finished run stays finished. The append statements check the runs row's status: nothing to change."""


#: Migration ``i`` (0-based) brings a store from version ``i`` to ``i + 1``. Append only.
MIGRATIONS: list[Callable[[Any], None]] = [
    _v1_tables, _v2_status_ok, _v3_lease_epoch, _v4_agent, _v5_cancelled,
    _v6_queues, _v7_finished,
]
VERSION = len(MIGRATIONS)


def migrate(db: Any, store: str) -> int:
    """Bring the store to :data:`VERSION` (``db`` in autocommit); return the version it had.

    A store already at :data:`VERSION` costs one query (every open of a PostgreSQL
    journal pays it): the version row is written last, in the migrating transaction,
    so seeing it current means nothing is left to do.
    """
    import psycopg

    try:
        row = db.execute("SELECT value FROM engrain_meta WHERE key = 'journal'").fetchone()
    except psycopg.errors.UndefinedTable:
        row = None  # a new store: created below, under the lock
    if row is not None and int(row[0]) == VERSION:
        return VERSION
    with db.transaction():
        db.execute(f"SELECT pg_advisory_xact_lock({_LOCK})")
        db.execute("CREATE TABLE IF NOT EXISTS engrain_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        row = db.execute("SELECT value FROM engrain_meta WHERE key = 'journal'").fetchone()
        found = 0 if row is None else int(row[0])
        if found > VERSION:
            raise StoreVersionError(store, found, VERSION)
        if found < VERSION:
            for step in MIGRATIONS[found:]:
                step(db)
            db.execute(
                "INSERT INTO engrain_meta (key, value) VALUES ('journal', %s)"
                " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                (str(VERSION),),
            )
    return found
