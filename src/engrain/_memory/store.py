"""Memory's tables, in the journal's database (SQLite or PostgreSQL).

Three tiers and two helper tables:

* ``engrain_mem_records``: raw deposits (content, skill, hint, metadata, TTL,
  embedding), unique per ``(skill, digest)`` so identical content is stored once.
* ``engrain_mem_buffer``: deposits and recall events awaiting consolidation,
  in ``seq`` order; a consolidation *claims* rows, and deletes them in the same
  transaction that writes its articles, so each row is processed exactly once.
* ``engrain_mem_articles``: synthesized knowledge with its source record ids.
* ``engrain_mem_state``: counters (the consolidation cursor, generations that
  tell an in-process vector index to reload after deletes or rewrites).
* full text: an FTS5 table on SQLite (rowid = record seq, or -article seq); on
  PostgreSQL the narrow table ``engrain_mem_text`` (same rowids, id, skill,
  expiry, ``tsvector``) with a GIN index, so ranking the matches reads rows of
  a hundred bytes, not the ~3 kB record rows that carry two vectors.

Vectors are float32 bytes (BLOB / BYTEA) searched in numpy by :mod:`.index`;
with the ``vector`` extension (pgvector) on the server, a ``vec`` column (filled
from the bytes for older rows) is searched in SQL instead, through an HNSW index
with the in-process graph's parameters (iterative scans keep filtered searches
full; a search they leave short ranks its filter's rows exactly, through the
skill btree or the GIN index on ``metadata::jsonb``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from .._journal import redact_url, refuse_newer_store
from .._journal.failures import RETRY_ADVICE
from .._journal.pglink import RevivingLock, connect, dropped, reconnect
from . import filters as _filters
from .buffer import ConsolidationTables
from .items import _ART_COLS, _REC_COLS, VECTORS_SQL, Article, Record, _article, _record, to_blob, vector_rows
from .pgvector import (  # noqa: F401  (constants and _vec_literal: re-exported)
    HNSW_EF, HNSW_EF_CONSTRUCTION, HNSW_M, PG_EXACT_ROWS, PgVectorSearch, _vec_literal)
from .schema import pg_tables, sqlite_tables
from .text import TextSearch, query_terms  # noqa: F401  (query_terms: re-exported)

def open_store(url: str) -> MemoryStore:
    """Memory's tables in the database of the journal URL ``url``."""
    from .._journal import parse_url

    backend, target, _ = parse_url(url)
    return MemoryStore("sqlite", path=target) if backend == "sqlite" else MemoryStore("postgres", url=target)


class MemoryStore(TextSearch, PgVectorSearch, ConsolidationTables):
    """Memory's tables on one database; ``url`` is a journal URL, ``path`` the SQLite file."""

    def __init__(self, backend: str, *, path: str | Path | None = None, url: str | None = None):
        self.backend = backend
        self.path = Path(path) if path is not None else None
        self.url = url
        self.pgvector = False
        self._vtype, self._vdist = "vector", "<=>"  # pgvector's type and operator (schema-qualified once found)
        self._ns = "public"
        self._pg_stats: tuple[float, dict[str, tuple[dict[str, float], float, float]]] | None = None
        self._lex: dict[str, str] = {}
        self._last_literal: tuple[np.ndarray, Any] | None = None
        self._vector_oid: int | None = None  # pgvector's type on the server, once found
        self._lock: Any = threading.RLock()
        self._events = 0  # rows this connection wrote as recall events (see version())
        self._txs = self._seq_tx = 0  # PostgreSQL write transactions begun; the one holding the insert lock
        if backend == "sqlite":
            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db: Any = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None,
                                            check_same_thread=False)
            refuse_newer_store(self._db, "sqlite", str(self.path))
            sqlite_tables(self._db)
        else:
            assert url is not None
            self._db = connect(url)
            refuse_newer_store(self._db, "postgres", redact_url(url))
            with self._db.transaction():
                pg_tables(self._db)
                self.pgvector = self._setup_pgvector()
            self._lock = RevivingLock()
            self._lock.revive = self._revive

    # -- plumbing -------------------------------------------------------------

    def _sql(self, sql: str) -> str:
        return sql if self.backend == "sqlite" else sql.replace("?", "%s")

    def _x(self, sql: str, params: Sequence[Any] = (), binary: bool = False) -> Any:
        if binary and self.backend != "sqlite":
            # Rows in PostgreSQL's binary format: a vector's bytea comes as its bytes, not as hex twice its size
            # to decode (recall reads ~180 of them: 2.3 -> 1.6 ms at 10k); every value equals the text format's.
            return self._db.execute(self._sql(sql), params, binary=True)
        return self._db.execute(self._sql(sql), params)

    @contextmanager
    def tx(self) -> Iterator[None]:
        """One write transaction (``BEGIN IMMEDIATE`` on SQLite so writers queue instead of failing)."""
        with self._lock:
            if self.backend == "sqlite":
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield
                except BaseException:
                    self._db.execute("ROLLBACK")
                    self._fts_writes += 1  # full-text rows it wrote are gone again: cached word counts are stale
                    raise
                self._db.execute("COMMIT")
            else:
                self._txs += 1
                with self._db.transaction():
                    yield

    def _seqs_in_order(self) -> None:
        """PostgreSQL, before a record or article takes its seq (inside :meth:`tx`): hold the store's insert lock
        until the transaction ends, so rows commit in the order of their seqs. A mirror catches up with the rows
        past the highest seq it holds; one committed after a higher seq would never be seen (two writers: A takes
        n+1, B takes n+2 and commits, a recall reads up to n+2, A commits). Taken once per transaction."""
        if self.backend != "sqlite" and self._seq_tx != self._txs:
            self._x("SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.engrain_mem_seq'))")
            self._seq_tx = self._txs

    def close(self) -> None:
        """Close the connection."""
        if isinstance(self._lock, RevivingLock):
            self._lock.revive = None  # closing a dropped connection needs no new one
        with self._lock:
            self._db.close()
            if isinstance(self._lock, RevivingLock):
                self._lock.closed(f"memory on {redact_url(self.url or '')}")

    def _revive(self) -> None:
        """PostgreSQL: replace a connection the server dropped, on the lock's outermost entry (:mod:`.pglink`)."""
        if dropped(self._db):
            assert self.url is not None
            self._db = reconnect(self.url, self._db, self._pg_session, RETRY_ADVICE)

    def _bump(self, name: str, by: int = 1) -> None:
        self._x("INSERT INTO engrain_mem_state (name, value) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET value = engrain_mem_state.value + excluded.value", (name, by))

    def bind_embedder(self, name: str, dim: int) -> None:
        """Record which embedder filled this store; refuse a different one (its vectors would not compare)."""
        from .._errors import ConfigError

        with self.tx():
            if self.backend != "sqlite":  # two first opens at once would both find no embedder and insert one
                self._x("SELECT pg_advisory_xact_lock(hashtext('engrain_mem_state'))")
            names = [n for (n,) in self._x("SELECT name FROM engrain_mem_state WHERE name LIKE ?",
                                                    ("embedder:%",)).fetchall()]
            if not self._x("SELECT 1 FROM engrain_mem_state WHERE name LIKE ?", ("store:%",)).fetchone():
                self._x("INSERT INTO engrain_mem_state (name, value) VALUES (?, 0)", ("store:" + os.urandom(8).hex(),))
            if not names:
                self._x("INSERT INTO engrain_mem_state (name, value) VALUES (?, ?)", (f"embedder:{name}", dim))
            elif names != [f"embedder:{name}"]:
                raise ConfigError(f"this memory store was embedded with {names[0][9:]!r}; the embedder {name!r} "
                                  "cannot search it (open it with no embedder to use its own, or move it to this one "
                                  "with Memory.reembed or `engrain memory reembed <model string>`)")
            if self.pgvector:
                self._pg_vector_index(dim)

    def bound_embedder(self) -> str | None:
        """The name of the embedder that filled this store (None for a new store)."""
        with self._lock:
            row = self._x("SELECT name FROM engrain_mem_state WHERE name LIKE ? ORDER BY name LIMIT 1",
                          ("embedder:%",)).fetchone()
        return row[0][9:] if row else None

    def identity(self) -> str:
        """A random name this store got when it was created (tells a cached file from another store's)."""
        with self._lock:
            row = self._x("SELECT name FROM engrain_mem_state WHERE name LIKE ?", ("store:%",)).fetchone()
        return row[0][6:] if row else ""

    def version(self) -> tuple[int, int] | None:
        """A value that changes whenever the store may have changed (None: cannot tell, on PostgreSQL).

        On SQLite: ``PRAGMA data_version`` (moves when another connection commits)
        and this connection's own row changes (``total_changes``) less its recall
        events, which touch only the buffer. While it stays the same, a recall
        skips the counters and the vector mirrors' catch-up (three statements).
        """
        if self.backend != "sqlite":
            return None
        with self._lock:
            return int(self._db.execute("PRAGMA data_version").fetchone()[0]), self._db.total_changes - self._events

    def state(self) -> dict[str, int]:
        """All counters of ``engrain_mem_state``."""
        with self._lock:
            return {n: int(v) for n, v in self._x("SELECT name, value FROM engrain_mem_state").fetchall()}

    def _fts_put(self, rowid: int, text: str, skill: str, id: str = "", expires: float | None = None) -> None:
        self._fts_writes += 1
        if self.backend == "sqlite":
            self._db.execute("INSERT OR REPLACE INTO engrain_mem_fts (rowid, text, skill) VALUES (?, ?, ?)",
                             (rowid, text, skill))
        else:
            self._db.execute(
                "INSERT INTO engrain_mem_text (rowid, id, skill, expires, tsv) VALUES (%s, %s, %s, %s, "
                "to_tsvector('english', %s)) ON CONFLICT (rowid) DO UPDATE SET id = excluded.id, skill = excluded.skill,"
                " expires = excluded.expires, tsv = excluded.tsv", (rowid, id, skill, expires, text))

    def _fts_del(self, rowids: Sequence[int]) -> None:
        self._fts_writes += 1
        if rowids:
            table = "engrain_mem_fts" if self.backend == "sqlite" else "engrain_mem_text"
            with self._db.cursor() if self.backend != "sqlite" else contextlib.nullcontext(self._db) as cur:
                cur.executemany(self._sql(f"DELETE FROM {table} WHERE rowid = ?"), [(r,) for r in rowids])

    def _vec_insert(self, vec: np.ndarray) -> tuple[str, str, list[str]]:
        """The extra INSERT column, placeholder and value for the pgvector column (none without it)."""
        if not self.pgvector:
            return "", "", []
        return ", vec", f", ?::{self._vtype}", [_vec_literal(vec)]

    # -- records and deposits -------------------------------------------------

    def add_records(self, rows: Sequence[dict[str, Any]], now: float, embedder: str | None = None
                    ) -> list[tuple[str, bool]]:
        """Insert records and their buffer deposits in one transaction.

        Each row has ``id, skill, content, hint, metadata, digest, expires, embedding``.
        Returns ``(id, inserted)`` per row; a row whose ``(skill, digest)`` exists
        returns the stored id with ``inserted=False`` (and extends its TTL when the
        new one lasts longer). ``embedder`` (the vectors' embedder) must still be
        the store's: a store moved to another since this process opened it refuses them.
        """
        out: list[tuple[str, bool]] = []
        with self.tx():
            if embedder is not None and not self._x("SELECT 1 FROM engrain_mem_state WHERE name = ?",
                                                    (f"embedder:{embedder}",)).fetchone():
                from .._errors import ConfigError

                raise ConfigError(f"this memory store was moved to the embedder {self.bound_embedder()!r} since it "
                                  f"was opened with {embedder!r}; open it again")
            for r in rows:
                got = self._x("SELECT id, expires FROM engrain_mem_records WHERE skill = ? AND digest = ?",
                              (r["skill"], r["digest"])).fetchone()
                if got is not None and got[1] is not None and got[1] <= now:
                    # Expired, not yet purged: this is a new record of the same text, so it takes this call's
                    # label, metadata, importance and time, not the dead one's (its owner's metadata revived).
                    self._x("UPDATE engrain_mem_records SET hint = ?, metadata = ?, importance = ?, created = ?, "
                            "expires = ? WHERE id = ?", (r["hint"], json.dumps(r["metadata"]), r.get("importance"),
                                                         now, r["expires"], got[0]))
                    seq = self._x("SELECT seq FROM engrain_mem_records WHERE id = ?", (got[0],)).fetchone()[0]
                    self._fts_put(int(seq), f"{r['hint']} {r['content']}", r["skill"], got[0], r["expires"])
                    self._bump("records_del")
                    out.append((got[0], False))
                    continue
                if got is not None:
                    if got[1] is not None and (r["expires"] is None or r["expires"] > got[1]):
                        self._x("UPDATE engrain_mem_records SET expires = ? WHERE id = ?", (r["expires"], got[0]))
                        # Mirrors hold each row's expiry: the deletions counter makes them read the live ones again.
                        self._bump("records_del")
                        if self.backend != "sqlite":
                            self._x("UPDATE engrain_mem_text SET expires = ? WHERE id = ? AND rowid > 0",
                                    (r["expires"], got[0]))
                    out.append((got[0], False))
                    continue
                self.insert_record(r, now)
                out.append((r["id"], True))
        return out

    def insert_record(self, r: dict[str, Any], now: float) -> int:
        """Insert one record row (inside :meth:`tx`); a deposit too unless ``r["article_id"]`` is set. Returns its seq."""
        self._seqs_in_order()
        vcol, vmark, vval = self._vec_insert(r["embedding"])
        seq = int(self._x(
            "INSERT INTO engrain_mem_records (id, skill, content, hint, metadata, digest, created, expires,"
            f" embedding, importance, article_id{vcol}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?{vmark}) RETURNING seq",
            (r["id"], r["skill"], r["content"], r["hint"], json.dumps(r["metadata"]), r["digest"],
             r.get("created", now), r["expires"], to_blob(r["embedding"]), r.get("importance"), r.get("article_id"),
             *vval)).fetchone()[0])
        self._fts_put(seq, f"{r['hint']} {r['content']}", r["skill"], r["id"], r["expires"])
        if not r.get("article_id"):  # an imported record is already consolidated: nothing to process
            self._x("INSERT INTO engrain_mem_buffer (kind, skill, ref, data, created) VALUES ('deposit', ?, ?, '{}', ?)",
                    (r["skill"], r["id"], now))
        return seq

    def put_article(self, a: Article) -> None:
        """Insert or replace one article (inside :meth:`tx`); a rewrite gets a new seq so index refreshes see it."""
        self.delete_article(a.id)
        self._seqs_in_order()
        vcol, vmark, vval = self._vec_insert(a.embedding)
        a.seq = int(self._x(
            "INSERT INTO engrain_mem_articles (id, skill, title, content, sources, metadata, created, updated,"
            f" version, synthesizer, embedding, importance{vcol}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?{vmark})"
            " RETURNING seq",
            (a.id, a.skill, a.title, a.content, json.dumps(a.sources), json.dumps(a.metadata), a.created,
             a.updated, a.version, a.synthesizer, to_blob(a.embedding), a.importance, *vval)).fetchone()[0])
        self._fts_put(-a.seq, f"{a.title} {a.content}", a.skill, a.id)

    def delete_article(self, aid: str) -> bool:
        """Delete one article and its full-text row (inside :meth:`tx`); False when there was none."""
        old = self._x("SELECT seq FROM engrain_mem_articles WHERE id = ?", (aid,)).fetchone()
        if old is None:
            return False
        self._x("DELETE FROM engrain_mem_articles WHERE id = ?", (aid,))
        self._fts_del([-old[0]])
        return True

    def add_recall_event(self, skill: str | None, data: dict[str, Any], now: float) -> None:
        """Leave a recall event (query and hits) in the buffer."""
        if self.backend == "sqlite":
            with self._lock:  # one statement: its own transaction (autocommit), no BEGIN/COMMIT round trips
                before = self._db.total_changes
                self._x("INSERT INTO engrain_mem_buffer (kind, skill, ref, data, created) VALUES ('recall', ?, NULL, ?, ?)",
                        (skill, json.dumps(data), now))
                self._events += self._db.total_changes - before  # a buffer row: no vector mirror changes
            return
        # A recall event is a hint for the next consolidation: losing the last few to a crash costs nothing,
        # waiting for the WAL flush on every search costs milliseconds. One statement, its own transaction
        # (autocommit), with synchronous_commit off for that transaction only: one round trip, not four.
        with self._lock:
            self._x("WITH s AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true)) "
                    "INSERT INTO engrain_mem_buffer (kind, skill, ref, data, created) SELECT 'recall', ?, NULL, ?, ? FROM s",
                    (skill, json.dumps(data), now))

    def records(self, ids: Sequence[str], vectors: bool = True, folded_of: Sequence[str] = ()) -> dict[str, Record]:
        """The records with these ids (missing ones are absent); ``vectors=False`` leaves ``embedding`` empty
        (a recall that has every cosine already reads 40 fewer kB). ``folded_of`` (PostgreSQL): also those of
        these ids folded into an article, in the same statement (:meth:`folded_records` and a read in one)."""
        out: dict[str, Record] = {}
        ids = list(ids)
        cols = _REC_COLS if vectors else _REC_COLS.replace("embedding", "x''" if self.backend == "sqlite" else "''::bytea")
        if folded_of:
            assert self.backend != "sqlite"
            with self._lock:
                for row in self._x(f"SELECT {cols} FROM engrain_mem_records WHERE id = ANY(?) OR (id = ANY(?) AND "
                                   "article_id IS NOT NULL)", (ids, list(folded_of)), binary=True):
                    out[row[1]] = _record(row)
            return out
        with self._lock:
            for chunk, cond in self._id_chunks(ids):
                for row in self._x(f"SELECT {cols} FROM engrain_mem_records WHERE {cond}", chunk, binary=True):
                    out[row[1]] = _record(row)
        return out

    def heads(self, chars: int, seqs: Sequence[int] = (), skill: str | None = None, newest: int = 0) -> list[str]:
        """The first ``chars`` characters of the records at ``seqs``, or of the ``newest`` records of ``skill``
        (of all skills for None; that form is for PostgreSQL, whose index on (skill, seq) serves it)."""
        if not newest:
            sql = "SELECT substr(content, 1, ?) FROM engrain_mem_records WHERE seq IN (SELECT value FROM json_each(?))"
            params: tuple[Any, ...] = (chars, json.dumps(list(seqs)))
        else:
            cond = "WHERE skill = ? " if skill is not None else ""
            sql = f"SELECT substr(content, 1, ?) FROM engrain_mem_records {cond}ORDER BY seq DESC LIMIT ?"
            params = (chars, *([skill] if skill is not None else []), newest)
        with self._lock:
            return [h for (h,) in self._x(sql, params).fetchall()]

    def _id_chunks(self, ids: Sequence[Any], column: str = "id") -> Any:
        """``(params, condition)`` pairs that select rows by ``column`` (``id``, or ``seq``): one array on
        PostgreSQL, whose statement text then never changes (psycopg prepares it after a few calls: no parse or
        plan per recall), and lists of at most 500 on SQLite (its limit on a statement's parameters)."""
        ids = list(ids)
        if self.backend != "sqlite":
            if ids:
                yield (ids,), f"{column} = ANY(?)"
            return
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            yield chunk, f"{column} IN ({','.join('?' * len(chunk))})"

    def folded_records(self, ids: Sequence[str]) -> set[str]:
        """Those of ``ids`` folded into an article (one narrow read: no content, no vectors)."""
        ids, out = list(ids), set()
        with self._lock:
            for chunk, cond in self._id_chunks(ids):
                out.update(r[0] for r in self._x(
                    f"SELECT id FROM engrain_mem_records WHERE article_id IS NOT NULL AND {cond}", chunk))
        return out

    def expired(self, now: float) -> list[tuple[int, str, str | None]]:
        """``(seq, id, article_id)`` of records whose TTL has passed (deleted by :meth:`commit`)."""
        with self._lock:
            return [(int(r[0]), r[1], r[2]) for r in self._x(
                "SELECT seq, id, article_id FROM engrain_mem_records WHERE expires IS NOT NULL AND expires <= ?",
                (now,)).fetchall()]

    # -- articles -------------------------------------------------------------

    def articles(self, skill: str | None = None, ids: Sequence[str] | None = None) -> list[Article]:
        """Articles, optionally of one skill or with these ids, oldest first."""
        sql, params = f"SELECT {_ART_COLS} FROM engrain_mem_articles WHERE 1 = 1", []
        if skill is not None:
            sql += " AND skill = ?"
            params.append(skill)
        if ids is not None:
            if not ids:
                return []
            sql += f" AND id IN ({','.join('?' * len(ids))})"
            params.extend(ids)
        with self._lock:
            return [_article(r) for r in self._x(sql + " ORDER BY seq", params).fetchall()]

    # -- vectors and full text -------------------------------------------------

    def vectors(self, tier: str, after_seq: int = 0) -> tuple[np.ndarray, list[str], list[str], np.ndarray, np.ndarray]:
        """``(seqs, ids, skills, expires, matrix)`` of a tier's next rows with ``seq > after_seq``, at most
        :data:`~.items.VECTOR_CHUNK` of them (fewer: there are no more). ``expires`` is ``inf`` without a TTL.
        """
        with self._lock:  # (PostgreSQL's binary format: a vector's bytes, not hex twice their size)
            return vector_rows(self._x(VECTORS_SQL[tier], (after_seq,), binary=True).fetchall())

    def filtered_ids(self, where: dict[str, Any], skill: str | None, now: float) -> set[str]:
        """Ids of live records matching the metadata filter ``where`` (of ``skill`` if given)."""
        cond, params = _filters.sql(self.backend, where)
        sql = f"SELECT id FROM engrain_mem_records WHERE (expires IS NULL OR expires > ?){cond}"
        if skill is not None:
            sql += " AND skill = ?"
            params.append(skill)
        with self._lock:
            return {r[0] for r in self._x(sql, (now, *params))}

    def previous_record(self, skill: str, seq: int) -> Record | None:
        """The record of ``skill`` stored just before ``seq``, if any."""
        with self._lock:
            row = self._x(f"SELECT {_REC_COLS} FROM engrain_mem_records WHERE skill = ? AND seq < ? "
                          "ORDER BY seq DESC LIMIT 1", (skill, seq)).fetchone()
        return _record(row) if row else None

    def adjacent_records(self, hits: Sequence[Record], now: float, window: int = 1000) -> dict[str, list[Record]]:
        """For each record in ``hits``: the live records of its skill stored just before and just after it.

        Looks at most ``window`` rows either way (a range on the primary key),
        so a skill whose records are far apart costs a bounded scan, not one
        over the whole table.
        """
        out: dict[str, list[Record]] = {}
        # SQLite would otherwise pick the (skill, digest) index and sort every record of the skill.
        table = "engrain_mem_records NOT INDEXED" if self.backend == "sqlite" else "engrain_mem_records"
        sql = (f"SELECT {_REC_COLS} FROM {table} WHERE skill = ? AND seq BETWEEN ? AND ? "
               "AND (expires IS NULL OR expires > ?) ORDER BY seq {} LIMIT 1")
        with self._lock:
            for r in hits:
                rows = [self._x(sql.format("DESC"), (r.skill, r.seq - window, r.seq - 1, now)).fetchone(),
                        self._x(sql.format("ASC"), (r.skill, r.seq + 1, r.seq + window, now)).fetchone()]
                out[r.id] = [_record(row) for row in rows if row]
        return out

    def counts(self, now: float) -> dict[str, int]:
        """Rows per tier (live records only)."""
        with self._lock:
            rec = self._x("SELECT COUNT(*) FROM engrain_mem_records WHERE expires IS NULL OR expires > ?", (now,)).fetchone()[0]
            art = self._x("SELECT COUNT(*) FROM engrain_mem_articles").fetchone()[0]
            buf = self._x("SELECT COUNT(*) FROM engrain_mem_buffer").fetchone()[0]
        return {"records": int(rec), "buffer": int(buf), "articles": int(art)}
