"""Where the behavior cache keeps its entries: tables next to the journal's.

One entry is one recorded trajectory (the tool calls of a successful run,
their check snapshots and the output), filed under the key of its canonical
task and tags. Lookup is an indexed query on that key, so its cost does not
grow with the number of entries. SQLite and PostgreSQL share the SQL; only
placeholders, upserts and connection handling differ.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import sqlite3
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from .._errors import StorageError
from .._journal import Journal, redact_url, refuse_newer_store
from .._journal.failures import RETRY_ADVICE, storage_errors
from .._journal.pglink import RevivingLock, connect, dropped, reconnect
from .binding import canonical_task, key, task_key

__all__ = ["SAVINGS", "STAT_NAMES", "CacheStore", "Entry", "canonical_task", "key", "task_key"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS engrain_cache_entries (
    id TEXT PRIMARY KEY,
    task_key TEXT NOT NULL,
    tags_key TEXT NOT NULL,
    task TEXT NOT NULL,
    tags TEXT NOT NULL,
    steps TEXT NOT NULL,
    output TEXT NOT NULL,
    run_id TEXT NOT NULL,
    successes INTEGER NOT NULL DEFAULT 1,
    divergences INTEGER NOT NULL DEFAULT 0,
    created DOUBLE PRECISION NOT NULL,
    last_used DOUBLE PRECISION NOT NULL,
    embedding TEXT
);
CREATE INDEX IF NOT EXISTS engrain_cache_by_task ON engrain_cache_entries (task_key, successes DESC, last_used DESC);
CREATE INDEX IF NOT EXISTS engrain_cache_by_tags ON engrain_cache_entries (tags_key);
CREATE TABLE IF NOT EXISTS engrain_cache_shapes (
    shape_key TEXT NOT NULL,
    pinned TEXT NOT NULL,
    PRIMARY KEY (shape_key, pinned)
);
CREATE TABLE IF NOT EXISTS engrain_cache_stats (
    name TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS engrain_cache_savings (
    run_id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    ts DOUBLE PRECISION NOT NULL,
    calls_made INTEGER NOT NULL,
    cache_calls INTEGER NOT NULL,
    resumed_calls INTEGER NOT NULL,
    input_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    model_seconds DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS engrain_cache_savings_by_ts ON engrain_cache_savings (ts);
"""

_COLUMNS = "id, task_key, tags_key, task, tags, steps, output, run_id, successes, divergences, created, last_used, embedding"

#: Columns of ``engrain_cache_savings``: one row per agent run (see :meth:`CacheStore.record_savings`).
SAVINGS = ("calls_made", "cache_calls", "resumed_calls", "input_tokens", "output_tokens", "model_seconds")

#: Counters kept in ``engrain_cache_stats``.
STAT_NAMES = ("lookups", "hits", "misses", "diverged", "switched", "suggested", "agent_calls", "evicted", "stored")


@dataclass(slots=True)
class Entry:
    """One cached trajectory.

    ``steps`` is a list of ``{"name", "args", "pre", "post", "templated"}``
    (``args`` may hold ``{{ params.x }}`` placeholders when ``templated``);
    ``output`` is ``{"step": i}`` (the result of step ``i``), ``{"value": v}``
    or ``{"template": t}``.
    """

    id: str
    task_key: str
    tags_key: str
    task: str
    tags: list[str]
    steps: list[dict[str, Any]]
    output: dict[str, Any]
    run_id: str
    successes: int = 1
    divergences: int = 0
    created: float = 0.0
    last_used: float = 0.0
    embedding: list[float] | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view (without the embedding)."""
        return {
            "id": self.id, "task": self.task, "tags": self.tags, "steps": self.steps, "output": self.output,
            "run_id": self.run_id, "successes": self.successes, "divergences": self.divergences,
            "created": self.created, "last_used": self.last_used,
        }


def _entry(row: tuple) -> Entry:
    return Entry(
        row[0], row[1], row[2], row[3], json.loads(row[4]), json.loads(row[5]), json.loads(row[6]), row[7],
        int(row[8]), int(row[9]), float(row[10]), float(row[11]), json.loads(row[12]) if row[12] else None,
    )


def _flush_at_exit(ref: weakref.ref) -> None:
    store = ref()
    if store is None or store._closed:
        return
    try:
        store.flush()
    except Exception:  # counters are advisory; the database may already be gone at exit
        pass


class CacheStore:
    """Cache entries and counters in the journal's database (SQLite or PostgreSQL)."""

    def __init__(self, journal: Journal, *, lookup_on_journal: bool = False):
        """``lookup_on_journal``: on SQLite, :meth:`candidates` reads on ``journal``'s connection (for an
        owner that closes this store before the journal, as an :class:`Engine` does)."""
        self.backend = journal.backend
        self.url = journal.url
        self._lock: Any = threading.Lock()
        # Parsed entries by id: a hit then costs one indexed query returning ids and counters.
        self._parsed: dict[str, Entry] = {}
        self._pinsets: dict[str, list[list[str]]] = {}
        # Counters and hit bookkeeping are advisory: they are batched, not written per call.
        self._counts: dict[str, int] = {}
        self._hits: dict[str, tuple[int, float]] = {}
        self._savings: dict[str, tuple] = {}
        self._pending = 0
        self._flushed_at = time.monotonic()
        self._closed = False
        atexit.register(_flush_at_exit, weakref.ref(self))
        if self.backend == "sqlite":
            self._db: Any = sqlite3.connect(str(journal.path), isolation_level=None, check_same_thread=False, timeout=30)
            refuse_newer_store(self._db, "sqlite", str(journal.path))
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            self._p = "?"
        else:
            self._db = connect(journal.url)
            refuse_newer_store(self._db, "postgres", redact_url(journal.url))
            with self._db.transaction():
                # Serialize first-time creation across processes starting together.
                self._db.execute("SELECT pg_advisory_xact_lock(7201004)")
                for stmt in filter(str.strip, _SCHEMA.split(";")):
                    self._db.execute(stmt)
            self._p = "%s"
            self._lock = RevivingLock()
            self._lock.revive = self._revive
        self._candidates_sql = self._sql(
            "SELECT id, successes, divergences, last_used FROM engrain_cache_entries WHERE task_key = ? "
            "ORDER BY successes DESC, last_used DESC LIMIT ?"
        )
        if self.backend == "sqlite" and lookup_on_journal:
            # The lookup reads on the journal's connection, under its lock (as the workers' store does):
            # that connection's page cache survives the commits it made itself, while this store's is
            # dropped after every commit of another connection, so each hit would reread its pages
            # (~4 µs a step-mode hit, measured).
            self._lookup = journal._db.cursor().execute  # type: ignore[attr-defined]
            self._lookup_lock = journal._lock  # type: ignore[attr-defined]
        else:
            self._lookup = self._db.cursor().execute if self.backend == "sqlite" else self._db.execute
            self._lookup_lock = self._lock

    def _revive(self) -> None:
        """PostgreSQL: replace a connection the server dropped, on the lock's outermost entry (:mod:`.pglink`)."""
        if dropped(self._db):
            self._db = reconnect(self.url, self._db, None, RETRY_ADVICE)
            self._lookup = self._db.execute

    def _sql(self, sql: str) -> str:
        return sql if self._p == "?" else sql.replace("?", "%s")

    @storage_errors
    def _exec(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock:
            cur = self._db.execute(self._sql(sql), params)
            return cur.fetchall() if cur.description else []

    @storage_errors
    def candidates(self, task_key: str, limit: int = 10) -> list[Entry]:
        """Entries for ``task_key``, best first (most successes, then most recently used)."""
        with self._lookup_lock:  # every call's lookup: a kept cursor (SQLite) and the statement in the backend's spelling
            rows = self._lookup(self._candidates_sql, (task_key, limit)).fetchall()
        out = []
        for id_, successes, divergences, last_used in rows:
            e = self._parsed.get(id_)
            if e is None:
                e = self.get(id_)
                if e is None:
                    continue
            e.successes, e.divergences, e.last_used = int(successes), int(divergences), float(last_used)
            pending = self._hits.get(id_)
            if pending is not None:  # hits not yet written still count for the ranking
                e.successes, e.divergences, e.last_used = e.successes + pending[0], 0, max(e.last_used, pending[1])
            out.append(e)
        if self._hits and len(out) > 1:
            out.sort(key=lambda e: (-e.successes, -e.last_used))
        return out

    def with_embeddings(self, tags_key: str) -> list[Entry]:
        """Entries under ``tags_key`` that have a task embedding (for semantic lookup)."""
        rows = self._exec(
            f"SELECT {_COLUMNS} FROM engrain_cache_entries WHERE tags_key = ? AND embedding IS NOT NULL", (tags_key,)
        )
        return [_entry(r) for r in rows]

    def cached(self, entry_id: str) -> Entry | None:
        """The entry ``entry_id`` as parsed earlier in this process (entries never change), else :meth:`get`."""
        e = self._parsed.get(entry_id)
        return e if e is not None else self.get(entry_id)

    def get(self, entry_id: str) -> Entry | None:
        """The entry ``entry_id``, or ``None``."""
        rows = self._exec(f"SELECT {_COLUMNS} FROM engrain_cache_entries WHERE id = ?", (entry_id,))
        if not rows:
            self._parsed.pop(entry_id, None)
            return None
        e = _entry(rows[0])
        self._parsed[entry_id] = e
        return e

    def pinsets(self, shape_key: str, fresh: bool = False) -> list[list[str]]:
        """The sets of pinned param names that entries of this call shape were stored with (see :mod:`.binding`).

        Read once per shape and kept (rows are never removed); ``fresh`` reads
        again, for sets another process may have added since.
        """
        sets = None if fresh else self._pinsets.get(shape_key)
        if sets is None:
            rows = self._exec("SELECT pinned FROM engrain_cache_shapes WHERE shape_key = ?", (shape_key,))
            if len(self._pinsets) >= 4096:
                self._pinsets.clear()
            sets = self._pinsets[shape_key] = [json.loads(r[0]) for r in rows]
        return sets

    def put(self, e: Entry, shape_key: str | None = None, pinned: list[str] | None = None) -> None:
        """Store a new entry (``shape_key``/``pinned``: the call shape it was filed under, for calls with params)."""
        if shape_key is not None:
            self._exec(
                "INSERT INTO engrain_cache_shapes (shape_key, pinned) VALUES (?, ?) ON CONFLICT DO NOTHING",
                (shape_key, json.dumps(sorted(pinned or []))),
            )
            self._pinsets.pop(shape_key, None)
        self._exec(
            f"INSERT INTO engrain_cache_entries ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                e.id, e.task_key, e.tags_key, e.task, json.dumps(e.tags), json.dumps(e.steps), json.dumps(e.output),
                e.run_id, e.successes, e.divergences, e.created, e.last_used,
                json.dumps(e.embedding) if e.embedding is not None else None,
            ),
        )
        self.bump("stored")

    def refresh(self, entry_id: str, steps: list[dict[str, Any]]) -> None:
        """Replace an entry's steps (the same calls with fresh snapshots, after a hit)."""
        self._exec("UPDATE engrain_cache_entries SET steps = ? WHERE id = ?", (json.dumps(steps), entry_id))
        e = self._parsed.get(entry_id)
        if e is not None:
            self._parsed[entry_id] = dataclasses.replace(e, steps=steps)

    def record_hit(self, entry_id: str) -> None:
        """A full replay: one more success, used now, divergence streak reset; counts a hit (written in batches)."""
        with self._lock:
            n, _ = self._hits.get(entry_id, (0, 0.0))
            self._hits[entry_id] = (n + 1, time.time())
            self._counts["hits"] = self._counts.get("hits", 0) + 1
        self._tick()

    def record_divergence(self, entry_id: str, evict_after: int) -> bool:
        """Count a divergence; evict the entry at ``evict_after`` in a row. Returns whether it was evicted."""
        rows = self._exec(
            "UPDATE engrain_cache_entries SET divergences = divergences + 1 WHERE id = ? RETURNING divergences",
            (entry_id,),
        )
        if rows and int(rows[0][0]) >= evict_after:
            self.evict(entry_id)
            return True
        return False

    def evict(self, entry_id: str) -> bool:
        """Delete an entry; returns whether it existed."""
        rows = self._exec("DELETE FROM engrain_cache_entries WHERE id = ? RETURNING id", (entry_id,))
        self._parsed.pop(entry_id, None)
        if rows:
            self.bump("evicted")
        return bool(rows)

    def entries(self, limit: int = 100, offset: int = 0, task: str | None = None) -> list[Entry]:
        """Entries, most recently used first (optionally those whose task contains ``task``)."""
        self.flush()
        where, params = ("WHERE task LIKE ?", (f"%{task}%",)) if task else ("", ())
        rows = self._exec(
            f"SELECT {_COLUMNS} FROM engrain_cache_entries {where} ORDER BY last_used DESC LIMIT ? OFFSET ?",
            (*params, limit, offset),
        )
        return [_entry(r) for r in rows]

    def count(self) -> int:
        """Number of stored entries."""
        return int(self._exec("SELECT COUNT(*) FROM engrain_cache_entries")[0][0])

    def record_savings(self, run_id: str, agent: str, row: dict[str, Any]) -> None:
        """What one agent run paid and avoided: LLM calls made, calls replayed from the cache and from
        the journal on a resume, and the input/output tokens and model seconds of the avoided calls
        (their recorded usage). Written in batches; a run recorded again replaces its row."""
        with self._lock:
            self._savings[run_id] = (run_id, agent, time.time(), *(row.get(k, 0) or 0 for k in SAVINGS))
        self._tick()

    def savings(self, limit: int = 100, run_id: str | None = None, since: float | None = None) -> list[dict[str, Any]]:
        """Per-run savings rows, newest first (one run's with ``run_id``; from ``since`` on)."""
        self.flush()
        where, params = [], []
        if run_id is not None:
            where.append("run_id = ?")
            params.append(run_id)
        if since is not None:
            where.append("ts >= ?")
            params.append(since)
        cond = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._exec(f"SELECT run_id, agent, ts, {', '.join(SAVINGS)} FROM engrain_cache_savings {cond} "
                          "ORDER BY ts DESC LIMIT ?", (*params, limit))
        return [{"run_id": r[0], "agent": r[1], "ts": float(r[2]),
                 **{k: (float(v) if k == "model_seconds" else int(v)) for k, v in zip(SAVINGS, r[3:])}} for r in rows]

    def savings_series(self, buckets: int = 24, since: float | None = None) -> dict[str, Any]:
        """LLM calls made and avoided (cache + resumed) per time bucket, from ``since`` (default: the
        first recorded run) to now: ``{"start", "bucket_seconds", "points": [{"t", "made", "avoided"}]}``."""
        self.flush()
        now = time.time()
        if since is None:
            first = self._exec("SELECT MIN(ts) FROM engrain_cache_savings")[0][0]
            since = float(first) if first is not None else now - 3600
        width = max((now - since) / buckets, 1.0)
        points = [{"t": since + i * width, "made": 0, "avoided": 0} for i in range(buckets)]
        rows = self._exec("SELECT ts, calls_made, cache_calls + resumed_calls FROM engrain_cache_savings "
                          "WHERE ts >= ? ORDER BY ts LIMIT 1000000", (since,))
        for ts, made, avoided in rows:
            p = points[min(int((float(ts) - since) / width), buckets - 1)]
            p["made"] += int(made)
            p["avoided"] += int(avoided)
        return {"start": since, "bucket_seconds": width, "points": points}

    def savings_total(self) -> dict[str, Any]:
        """The savings columns summed over every run, and ``runs``."""
        self.flush()
        row = self._exec(f"SELECT COUNT(*), {', '.join(f'COALESCE(SUM({k}), 0)' for k in SAVINGS)} "
                         "FROM engrain_cache_savings")[0]
        out: dict[str, Any] = {"runs": int(row[0])}
        out.update({k: (round(float(v), 3) if k == "model_seconds" else int(v)) for k, v in zip(SAVINGS, row[1:])})
        return out

    def bump(self, name: str, by: int = 1) -> None:
        """Add ``by`` to the counter ``name`` (written in batches)."""
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + by
        self._tick()

    def _tick(self) -> None:
        self._pending += 1
        if self._pending >= 256 or time.monotonic() - self._flushed_at > 1.0:
            self.flush()

    @storage_errors
    def flush(self) -> None:
        """Write batched counters and hit bookkeeping in one transaction."""
        with self._lock:
            counts, hits, saved = self._counts, self._hits, list(self._savings.values())
            self._counts, self._hits, self._savings, self._pending = {}, {}, {}, 0
            self._flushed_at = time.monotonic()
            if not counts and not hits and not saved:
                return
            up_saved = self._sql(
                f"INSERT INTO engrain_cache_savings (run_id, agent, ts, {', '.join(SAVINGS)}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO UPDATE SET "
                + ", ".join(f"{k} = excluded.{k}" for k in ("ts", *SAVINGS))
            )
            up_stat = self._sql(
                "INSERT INTO engrain_cache_stats (name, value) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET value = engrain_cache_stats.value + excluded.value"
            )
            up_hit = self._sql(
                "UPDATE engrain_cache_entries SET successes = successes + ?, divergences = 0, "
                "last_used = CASE WHEN last_used > ? THEN last_used ELSE ? END WHERE id = ?"
            )
            stat_rows = list(counts.items())
            hit_rows = [(n, t, t, id_) for id_, (n, t) in hits.items()]
            if self.backend == "sqlite":
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._db.executemany(up_stat, stat_rows)
                    self._db.executemany(up_hit, hit_rows)
                    self._db.executemany(up_saved, saved)
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
            else:
                with self._db.transaction(), self._db.cursor() as cur:
                    cur.executemany(up_stat, stat_rows)
                    cur.executemany(up_hit, hit_rows)
                    cur.executemany(up_saved, saved)

    def stats(self) -> dict[str, int]:
        """Counters (lookups, hits, misses, diverged, agent_calls, evicted, stored) and ``entries``."""
        self.flush()
        out = dict.fromkeys(STAT_NAMES, 0)
        out.update({name: int(v) for name, v in self._exec("SELECT name, value FROM engrain_cache_stats")})
        out["entries"] = self.count()
        return out

    def close(self) -> None:
        """Write what is batched and close the connection."""
        if isinstance(self._lock, RevivingLock):
            self._lock.revive = None  # closing a dropped connection needs no new one
        try:
            self.flush()
        except StorageError:
            pass  # the counters are advisory: lost with a store that is gone, the store still closes
        finally:
            with self._lock:
                self._closed = True
                self._db.close()
                if isinstance(self._lock, RevivingLock):
                    self._lock.closed(f"the cache store on {redact_url(self.url)}")
