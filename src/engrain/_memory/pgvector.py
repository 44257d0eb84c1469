"""pgvector search (mixed into :class:`~engrain._memory.store.MemoryStore`).

With the ``vector`` extension on the server, records and articles carry a
``vec`` column searched in SQL through an HNSW index with the in-process
graph's parameters. Filtered searches (skill, metadata) that keep few rows rank
those rows exactly; wider ones use pgvector's iterative index scans, so a filter
never starves the limit.
"""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._errors import ConfigError
from . import filters as _filters
from .fusion import CROWDING_SAMPLE, crowding
from .items import _ART_COLS, VECTORS_SQL, from_blob, vector_rows
from .pgrows import RowPool, rec_cols

#: HNSW parameters, shared by pgvector's index and the in-process usearch graph. ef 80: at 1M records
#: (bench/memory.py) recall@10 against exact search is 0.972 (96: 0.976, 64: 0.964), and each step
#: down from 96 saves ~1 ms of the graph walk. usearch walks with max(ef, neighbours asked), and
#: recall asks it for >= 160, so the in-process path keeps its recall.
HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF = 16, 100, 80
#: A filtered pgvector search expected to keep at most this many rows ranks them all exactly instead of
#: scanning the HNSW graph: a few milliseconds of distances, against an HNSW walk that grows as 1/selectivity
#: and (iterative scans) may stop short of the limit.
PG_EXACT_ROWS = 5000
#: Seconds a skill's crowding (:func:`.fusion.crowding`) is kept before it is read again: it moves slowly.
CROWDING_TTL = 60.0


#: Where :class:`~engrain._memory.api.Memory` may search vectors (its ``vector_search``).
VECTOR_SEARCH = ("auto", "pgvector", "local")


def check_vector_search(wanted: Any) -> str:
    """``wanted`` (None: ``$ENGRAIN_VECTOR_SEARCH``, else ``"auto"``), refused unless one of :data:`VECTOR_SEARCH`
    (before any store is opened)."""
    import os

    source = "vector_search"
    if wanted is None:
        wanted, source = os.environ.get("ENGRAIN_VECTOR_SEARCH") or "auto", "$ENGRAIN_VECTOR_SEARCH"
    if wanted not in VECTOR_SEARCH:
        raise ConfigError(f"{source} must be one of {', '.join(map(repr, VECTOR_SEARCH))}, not {wanted!r}")
    return wanted


def vector_search_of(store: Any, wanted: str) -> str:
    """``"pgvector"`` or ``"local"``: where a memory asking ``wanted`` searches this store's vectors."""
    if wanted == "pgvector" and not store.pgvector:
        raise ConfigError("vector_search='pgvector' needs a PostgreSQL server with the vector extension (pgvector);"
                          f" this {store.backend} store has none: use vector_search='auto' or 'local'")
    return "pgvector" if store.pgvector and wanted != "local" else "local"


def _vec_literal(vec: np.ndarray) -> str:
    """pgvector's text form of a vector (9 significant digits round-trip float32)."""
    return "[" + ",".join(f"{x:.9g}" for x in np.asarray(vec, dtype=np.float32).tolist()) + "]"


class PgVector(bytes):
    """A vector in pgvector's binary form (int16 dimension, int16 zero, big-endian float32s), sent as a ``vector``
    parameter in PostgreSQL's binary format: the same float32s as the text form, none formatted or parsed
    (0.08 ms of Python and the server's 384 strtof a recall, for the shipped embedder)."""

    @classmethod
    def of(cls, vec: np.ndarray) -> PgVector:
        v = np.asarray(vec, dtype=np.float32).reshape(-1)
        return cls(struct.pack(">hh", v.shape[0], 0) + v.astype(">f4").tobytes())


def register_vector_dumper(db: Any, oid: int) -> None:
    """Send :class:`PgVector` values on ``db`` as the ``vector`` type of OID ``oid`` (binary format)."""
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    class _VectorDumper(Dumper):
        format = Format.BINARY

        def dump(self, obj: bytes) -> bytes:
            return bytes(obj)

    _VectorDumper.oid = oid
    db.adapters.register_dumper(PgVector, _VectorDumper)


def _windows(cols: str, radius: int) -> str:
    """The passage windows' statement (``cols`` of each row ``r``, after its anchor's seq; parameters: the time
    twice, then the ids): for each record asked, the live records of its skill within ``radius`` before it
    and after it. The radius is written in (a ``LIMIT $n`` would make PostgreSQL plan it anew every time,
    as :meth:`PgVectorSearch._pg_plan` says)."""
    side = (f"(SELECT {cols} FROM engrain_mem_records r WHERE r.skill = c.skill AND r.seq {{}} c.seq "
            "AND (r.expires IS NULL OR r.expires > %s) ORDER BY r.seq {} LIMIT {})")
    return (f"SELECT c.seq, n.* FROM engrain_mem_records c CROSS JOIN LATERAL ("
            f"{side.format('<', 'DESC', int(radius))} UNION ALL {side.format('>=', 'ASC', int(radius) + 1)}) n "
            "WHERE c.id = ANY(%s)")


class PgVectorSearch:
    """pgvector methods of the store; needs its ``backend``, ``_db``, ``_lock``, ``_x`` and ``_last_literal``."""

    backend: str
    _db: Any
    _lock: Any
    _vector_oid: int | None
    _vtype: str
    _vdist: str
    _ns: str
    _last_literal: tuple[np.ndarray, PgVector] | None

    def _x(self, sql: str, params: Sequence[Any] = (), binary: bool = False) -> Any:  # pragma: no cover - the store's
        raise NotImplementedError

    def _sql(self, sql: str) -> str:  # pragma: no cover - provided by the store
        raise NotImplementedError

    def _setup_pgvector(self) -> bool:
        find = "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE extname = 'vector'"
        have = self._db.execute(find).fetchone()
        if not have:
            avail = self._db.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone()
            if not avail:
                return False
            self._db.execute("CREATE EXTENSION IF NOT EXISTS vector")
            have = self._db.execute(find).fetchone()
        # The extension lives in one schema per database, often not the one on our
        # search_path (a store per schema): name its type and operator explicitly.
        ns = '"' + have[0].replace('"', '""') + '"'
        self._vtype, self._vdist = f"{ns}.vector", f"OPERATOR({ns}.<=>)"
        self._vector_oid = self._db.execute(f"SELECT '{ns}.vector'::regtype::oid").fetchone()[0]
        for table in ("engrain_mem_records", "engrain_mem_articles"):
            if not self._db.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()"
                                    " AND table_name = %s AND column_name = 'vec'", (table,)).fetchone():
                # Inline (pgvector's default moves it out of these >2 kB rows): 4x faster scans.
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN vec {self._vtype}, ALTER COLUMN vec SET STORAGE PLAIN")
                # Rows stored before the extension was there would be invisible to the search.
                with self._db.cursor() as cur:
                    cur.executemany(f"UPDATE {table} SET vec = %s::{self._vtype} WHERE seq = %s", [
                        (_vec_literal(from_blob(e)), q) for q, e in cur.execute(f"SELECT seq, embedding FROM {table}")])
        self._ns = ns
        self._pg_session(self._db)
        return True

    def _pg_vector_index(self, dim: int) -> None:
        """Give ``vec`` the embedder's dimension and an HNSW index (inside the bind transaction)."""
        for table in ("engrain_mem_records", "engrain_mem_articles"):
            typ = self._x("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = ?::regclass "
                          "AND attname = 'vec'", (table,)).fetchone()[0]
            if not typ.endswith(f"({dim})"):
                self._x(f"ALTER TABLE {table} ALTER COLUMN vec TYPE {self._vtype}({int(dim)})")
            # The graph the in-process index uses (same M and ef_construction), so both paths recall alike.
            self._x(f"CREATE INDEX IF NOT EXISTS {table}_vec ON {table} USING hnsw (vec {self._ns}.vector_cosine_ops)"
                    f" WITH (m = {HNSW_M}, ef_construction = {HNSW_EF_CONSTRUCTION})")

    def _pg_session(self, db: Any) -> None:
        """The settings of connection ``db`` (the first, or one replacing a dropped one) with pgvector: how
        :class:`PgVector` values travel, the in-process ef, and filtered scans that keep going."""
        import psycopg

        if self._vector_oid is None:
            return
        register_vector_dumper(db, self._vector_oid)
        db.execute(f"SET hnsw.ef_search = {HNSW_EF}")
        try:  # pgvector >= 0.8: a filter (skill, TTL, metadata) does not starve the LIMIT
            with db.transaction():
                db.execute("SET hnsw.iterative_scan = relaxed_order")
        except psycopg.Error:
            pass

    def pg_vector_search(self, tier: str, vec: np.ndarray, skill: str | None, now: float, limit: int,
                         where: dict[str, Any] | None = None) -> list[tuple[str, float]]:
        """pgvector search: up to ``limit`` ``(id, cosine)`` of live rows (of ``skill`` if given), nearest first.

        Unfiltered, the HNSW index serves it. A filter (``skill``, ``where``) that
        the planner expects to keep at most :data:`PG_EXACT_ROWS` rows is ranked
        exactly over those rows (found through the skill btree or the metadata
        GIN): an HNSW scan would walk ``limit / selectivity`` graph nodes to
        collect as many matches, more work than ranking the rows themselves, and
        an iterative scan stops after ``hnsw.max_scan_tuples`` with fewer than
        ``limit``. Wider filters use the HNSW iterative scan; if it still comes
        back short, the exact ranking runs instead.
        """
        with self._lock:
            plan = self._pg_plan(tier, vec, skill, now, limit, where)
            return self._pg_finish(plan, self._x(plan[0], plan[1]).fetchall())

    def pg_vector_search_both(self, vec: np.ndarray, skill: str | None, now: float, limit: int,
                              where: dict[str, Any] | None = None, own: Sequence[str] = ()
                              ) -> tuple[list[tuple[str, float]], list[tuple[str, float]], RowPool]:
        """:meth:`pg_vector_search` of records (with ``where``) and of articles, and the rows of records ``own``,
        all in one statement (three round trips a recall in one).

        Each tier's search is the one :meth:`pg_vector_search` would run first (HNSW
        or exact, as planned there), and a short one is ranked exactly after it the
        same way: the same hits in the same order. ``own`` (recall: the full-text
        hits, whose cosines it needs) come back in a :class:`~.pgrows.RowPool`: the
        rows of the live ones as :meth:`pg_around` reads them with radius 0, for it
        to take instead of reading them again, and in full, for scoring.
        """
        pool = RowPool(self, own)
        blank = ("NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::float8, "
                 "NULL::float8, NULL::text, NULL::bytea, NULL::float8")
        with self._lock:
            # The record hits' rows come with them (no vectors: the search gives their cosines).
            rp = self._pg_plan("record", vec, skill, now, limit, where, (rec_cols(vectors=False), blank))
            ap = self._pg_plan("article", vec, skill, now, limit)
            sql = f"SELECT 0, r.* FROM ({rp[0]}) r UNION ALL SELECT 1, a.id, a.d, {blank} FROM ({ap[0]}) a"
            params = [*rp[1], *ap[1]]
            if own:
                sql += (f" UNION ALL SELECT 2, id, NULL, {rec_cols()} FROM engrain_mem_records "
                        "WHERE id = ANY(%s) AND (expires IS NULL OR expires > %s)")
                params += [list(own), now]
            rows = self._db.execute(sql, params, binary=True).fetchall()
            full = [r[3:] for r in rows if r[0] == 2]
            pool.own_rows = [(r[0], r[1], r[2], r[0], r[9], r[5]) for r in full]
            pool.add_records(full)
            pool.add_records(r[3:] for r in rows if r[0] == 0 and r[3] is not None)  # (the exact ranking's: no row)
            return (self._pg_finish(rp, [r[1:3] for r in rows if r[0] == 0]),
                    self._pg_finish(ap, [r[1:3] for r in rows if r[0] == 1]), pool)

    def _pg_plan(self, tier: str, vec: np.ndarray, skill: str | None, now: float, limit: int,
                 where: dict[str, Any] | None = None, cols: tuple[str, str] = ("", "")
                 ) -> tuple[str, list[Any], str | None, list[Any], int]:
        """``(sql, params, exact_sql, exact_params, limit)``: a tier's first search, and the exact ranking to run
        instead when it comes back short (None: a short answer is the whole answer). Holds the lock.

        ``cols``: more columns of each hit after ``id, d`` (the HNSW scan reads each hit's row anyway), and
        what the exact ranking gives in their place (it ranks up to :data:`PG_EXACT_ROWS` rows, kept narrow).
        The limit is written into the statement, not a parameter: with ``LIMIT $n`` PostgreSQL prices a
        generic plan for an unknown limit, finds it dearer than each custom one and plans the search anew
        every time (0.25 ms of a recall's statement at 10k); with the number there, the prepared statement
        keeps one plan, the same HNSW scan."""
        table = "engrain_mem_records" if tier == "record" else "engrain_mem_articles"
        cond, params = "vec IS NOT NULL", []
        if tier == "record":
            cond += " AND (expires IS NULL OR expires > ?)"
            params.append(now)
            wcond, wp = _filters.sql(self.backend, where)
            cond += wcond
            params += wp
        else:
            where = None
        if skill is not None:
            cond += " AND skill = ?"
            params.append(skill)
        sql = f"SELECT id, vec {self._vdist} ?::{self._vtype} AS d{{}} FROM {table} WHERE {cond}"
        limit = int(limit)
        qparams = [self._literal(vec), *params]
        more, blank = (", " + cols[0], ", " + cols[1]) if cols[0] else ("", "")
        exact = self._sql(f"WITH f AS MATERIALIZED ({sql.format('')}) SELECT id, d{blank} FROM f ORDER BY d "
                          f"LIMIT {limit}")
        if (where or skill is not None) and self._pg_rows(f"SELECT 1 FROM {table} WHERE {cond}", params) \
                <= PG_EXACT_ROWS:
            return exact, qparams, None, [], limit
        # Ordered by distance alone, so the HNSW index serves it; relaxed order is re-sorted by _pg_finish.
        # Short: the scan gave up on a filter (records carry a TTL), or the table holds fewer rows.
        # Unfiltered articles can only be the latter (the iterative scan goes on to the limit, and
        # without one ef_search >= limit rows come back), so the exact ranking would return the same
        # rows: skip its round trip (most stores hold few articles).
        again = tier == "record" or skill is not None or limit > HNSW_EF
        return (self._sql(sql.format(more) + f" ORDER BY d LIMIT {limit}"), qparams, exact if again else None,
                qparams, limit)

    def _pg_finish(self, plan: tuple[str, list[Any], str | None, list[Any], int], rows: list[Any]
                   ) -> list[tuple[str, float]]:
        """A planned search's ``(id, cosine)``, nearest first, after the exact ranking if it came back short."""
        if plan[2] is not None and len(rows) < plan[4]:
            rows = self._db.execute(plan[2], plan[3]).fetchall()
        return sorted(((r[0], 1.0 - float(r[1])) for r in rows), key=lambda h: -h[1])

    def pg_crowding(self, skill: str | None, now: float) -> float:
        """:meth:`VectorIndex.crowding <engrain._memory.index.VectorIndex.crowding>` in SQL, kept ``CROWDING_TTL`` s.

        pgvector sums the sample's vectors (and their squared norms) on the
        server: one row comes back, not the vectors.
        """
        cache = self.__dict__.setdefault("_crowding", {})
        hit = cache.get(skill)
        if hit is not None and now - hit[0] < CROWDING_TTL:
            return hit[1]
        cond, params = ("WHERE skill = ? AND vec IS NOT NULL", [skill]) if skill is not None else ("WHERE vec IS NOT NULL", [])
        sql = (f"SELECT {self._ns}.sum(vec)::text, sum(-(vec OPERATOR({self._ns}.<#>) vec)), count(*) FROM (SELECT vec "
               f"FROM engrain_mem_records {cond} ORDER BY seq DESC LIMIT ?) s")
        with self._lock:
            total, squares, n = self._x(sql, (*params, CROWDING_SAMPLE)).fetchone()
        value = crowding(np.array(json.loads(total), dtype=np.float64), float(squares), int(n)) if n else 0.0
        if len(cache) > 1000:
            cache.clear()
        cache[skill] = (now, value)
        return value

    def pg_around(self, ids: list[str], radius: int, now: float, where: dict[str, Any] | None = None,
                  read: RowPool | None = None) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`VectorIndex.around <engrain._memory.index.VectorIndex.around>` in SQL (stores with no mirror).

        One round trip: for each record, the ``radius`` live records of its skill
        stored before it and after it (the ``(skill, seq)`` btree); with ``radius``
        0, the live records themselves, read by id (or taken from ``read``, what
        :meth:`pg_vector_search_both` read at ``now``, when it asked for them all).
        Ordinals come from those runs (:func:`.ranking.ordinals_from_runs`). With
        ``read``, the windows' rows are read in full and kept there, and the rows
        it still wants (``read.want``: the other candidates and the articles) come
        in the same round trip (:meth:`_pg_read_with`).
        """
        from .ranking import ordinals_from_runs

        if not ids:
            return [], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 0), np.float32)
        want = set(ids)
        if radius == 0 and read is not None and want <= read.own:
            rows = [r for r in read.own_rows if r[1] in want]
        elif radius == 0:  # the records' own rows (recall's cosines for full-text hits): no window to walk
            with self._lock:
                rows = self._x("SELECT seq, id, skill, seq, embedding, metadata FROM engrain_mem_records "
                               "WHERE id = ANY(?) AND (expires IS NULL OR expires > ?)", (list(ids), now),
                               binary=True).fetchall()
        else:
            params = (now, now, list(ids))
            if read is None:
                with self._lock:
                    rows = self._db.execute(_windows("r.id, r.skill, r.seq, r.embedding, r.metadata", radius),
                                            params, binary=True).fetchall()
            else:
                full = self._pg_read_with(read, _windows(rec_cols("r"), radius), params)
                rows = [(r[0], r[2], r[3], r[1], r[10], r[6]) for r in full]  # anchor, then the row's own columns
        runs: dict[int, list[tuple[str, int]]] = {}
        rec: dict[tuple[str, int], tuple[str, Any, str]] = {}
        for anchor, rid, skill, seq, emb, meta in rows:
            runs.setdefault(anchor, []).append((skill, seq))
            rec[(skill, seq)] = (rid, emb, meta)
        ords = ordinals_from_runs([sorted(r) for r in runs.values()], radius)
        keys = [k for k in sorted(rec) if not where or _filters.matches(json.loads(rec[k][2]), where)]
        codes: dict[str, int] = {}
        groups = np.array([codes.setdefault(k[0], len(codes)) for k in keys], dtype=np.int64)
        # One buffer for all the rows' float32 bytes (one array, not one per row: 0.3 -> 0.2 ms for 180 rows).
        vecs = (np.frombuffer(b"".join([rec[k][1] for k in keys]), dtype=np.float32).reshape(len(keys), -1)
                if keys else np.zeros((0, 0), np.float32))
        return [rec[k][0] for k in keys], groups, np.array([ords[k] for k in keys], dtype=np.int64), vecs

    def pg_state_and_vectors(self, after: dict[str, int]) -> tuple[dict[str, int], dict[str, tuple]]:
        """The store's :meth:`state` and each tier's :meth:`vectors` after ``after[tier]``, in one round trip (a
        pipeline): a mirror on PostgreSQL catches up before every recall, beside the query embedding."""
        with self._lock, self._db.pipeline():
            st = self._db.execute("SELECT name, value FROM engrain_mem_state")
            curs = {t: self._db.execute(self._sql(VECTORS_SQL[t]), (a,), binary=True) for t, a in after.items()}
            state = {n: int(v) for n, v in st.fetchall()}
            rows = {t: c.fetchall() for t, c in curs.items()}
        return state, {t: vector_rows(r) for t, r in rows.items()}

    def pg_candidate_rows(self, records: Sequence[str], articles: Sequence[str]) -> RowPool:
        """A recall's candidate rows in one round trip, for scoring (:meth:`RowPool.records`): the ``records``
        by id (content only when short, no vectors) and the ``articles`` with the homes of those records.

        For a PostgreSQL store searched in-process, whose mirror gave every cosine
        and window: reading them all at once costs one round trip, where reading
        the best first and then the few that may still beat them costs two."""
        pool = RowPool(self)
        pool.plan(records, articles, records)
        self._pg_read_with(pool, None, ())
        return pool

    def _pg_read_with(self, pool: RowPool, sql: str | None, params: Sequence[Any]) -> list[Any]:
        """The passage windows (``sql``, :func:`_windows` of :func:`.pgrows.rec_cols`: each row in full after its
        anchor's seq; None: none), kept in ``pool`` with the rows ``pool.want`` read in the same round trip (a
        pipeline): records by id, without vectors (their cosines are known), and articles by id with the homes
        of the candidate records."""
        recs, arts, homes_of = pool.want
        pool.want = ([], [], [])
        asks = {"windows": (sql, params) if sql is not None else None,
                "records": (f"SELECT {rec_cols(vectors=False)} FROM engrain_mem_records WHERE id = ANY(%s)", (recs,))
                if recs else None,
                "articles": (f"SELECT {_ART_COLS} FROM engrain_mem_articles WHERE id = ANY(%s) OR id IN (SELECT "
                             "article_id FROM engrain_mem_records WHERE id = ANY(%s) AND article_id IS NOT NULL)",
                             (arts, homes_of)) if arts else None}
        asks = {k: q for k, q in asks.items() if q is not None}
        # One statement goes alone: entering and leaving a pipeline costs a little.
        with self._lock, (self._db.pipeline() if len(asks) > 1 else contextlib.nullcontext()):
            curs = {k: self._db.execute(q, p, binary=True) for k, (q, p) in asks.items()}
            got = {k: c.fetchall() for k, c in curs.items()}
        rows = got.get("windows", [])
        pool.add_records([r[1:] for r in rows])
        pool.add_records(got.get("records", []), asked=recs)
        if "articles" in got:
            pool.add_articles(got["articles"], arts, homes_of)
        return rows

    def _literal(self, vec: np.ndarray) -> PgVector:
        """``vec`` as a query parameter, remembered for the next call: a recall searches both tiers with one vector."""
        last = self._last_literal
        if last is None or not np.array_equal(last[0], vec):
            last = self._last_literal = (np.array(vec, dtype=np.float32), PgVector.of(vec))
        return last[1]

    def _pg_rows(self, sql: str, params: Sequence[Any]) -> float:
        """The planner's estimate of the rows ``sql`` returns (planning only: a fraction of a millisecond)."""
        plan = self._x("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()[0]
        if isinstance(plan, str):
            plan = json.loads(plan)
        return float(plan[0]["Plan"]["Plan Rows"])
