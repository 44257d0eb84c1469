"""PostgreSQL + pgvector side of the memory benchmark: a cached store per size, bulk-loaded with COPY.

Each size lives in schema ``mem_<n>_<VERSION>`` of the database ``engrain_bench``
on the pgvector server (created if missing, never dropped by the bench), so a
second run reuses the 1M store at once. Building one:

1. ``Memory`` creates engrain's own tables and indexes in the schema (so the
   store is exactly what engrain makes);
2. the secondary indexes are dropped, the records are written with one binary
   ``COPY`` (ids ``rec_<20 hex of i>``, the corpus's skill and metadata, vector in
   both engrain's ``embedding`` bytes and pgvector's ``vec``), the narrow
   full-text table is filled from them, as engrain's own migration does;
3. the indexes are rebuilt from their saved definitions, the HNSW one last and
   timed, its server process (and parallel workers) reniced to 10, with
   ``maintenance_work_mem`` large enough for the graph (``--pg-build-mem``);
4. ``VACUUM ANALYZE`` (the full-text half reads word frequencies from the
   planner's statistics).

Records are loaded as consolidated history: no buffer deposits.
"""

from __future__ import annotations

import struct
import subprocess
import threading
import time
from typing import Any
from urllib.parse import quote

import numpy as np

import memory_corpus as mc

VERSION = "v2"  # v2: the vectors of engrain's default since 2026-11-27 (integer compute, embed.block_model)
DB = "engrain_bench"


def rec_id(i: int) -> str:
    return f"rec_{i:020x}"


def _db_url(admin: str, db: str) -> str:
    base, _, query = admin.partition("?")
    return base.rsplit("/", 1)[0] + "/" + db + ("?" + query if query else "")


def store_url(admin: str, n: int) -> str:
    """The engrain URL of size ``n``'s cached store (database ``engrain_bench``, its own schema)."""
    url = _db_url(admin, DB)
    return f"{url}{'&' if '?' in url else '?'}options={quote(f'-csearch_path=mem_{n}_{VERSION}', safe='')}"


def _connect(admin: str, db: str = DB):
    import psycopg

    return psycopg.connect(_db_url(admin, db), autocommit=True)


def ready(admin: str, n: int) -> bool:
    import psycopg

    with psycopg.connect(admin, autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB,)).fetchone():
            c.execute(f"CREATE DATABASE {DB}")
    with _connect(admin) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS vector")
        try:
            row = c.execute(f"SELECT value FROM mem_{n}_{VERSION}.engrain_mem_state WHERE name = 'bench:ready'").fetchone()
        except psycopg.Error:
            return False
        return bool(row and row[0] == n)


def _renice_backend(c, url: str, stop: threading.Event) -> None:
    """Renice this connection's server process and its parallel workers to 10 until ``stop``."""
    pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
    done: set[int] = set()

    def loop() -> None:
        import psycopg

        with psycopg.connect(url, autocommit=True) as w:
            while not stop.is_set():
                pids = {pid} | {r[0] for r in w.execute("SELECT pid FROM pg_stat_activity WHERE leader_pid = %s", (pid,))}
                for p in pids - done:
                    subprocess.run(["renice", "-n", "10", "-p", str(p)], capture_output=True)
                    done.add(p)
                stop.wait(0.5)

    threading.Thread(target=loop, daemon=True).start()


def _vec_bin(v: np.ndarray) -> bytes:
    return struct.pack(">hh", len(v), 0) + v.astype(">f4").tobytes()


def _field(b: bytes | None) -> bytes:
    return b"\xff\xff\xff\xff" if b is None else struct.pack(">i", len(b)) + b


def build(admin: str, n: int, texts: list[str], vecs: np.ndarray, embedder_name: str, dim: int,
          build_mem: str, workers: int) -> dict:
    """Create size ``n``'s cached store; returns load and index build times."""
    import json

    from engrain._memory import Memory
    from engrain._memory.synth import ExtractiveSynthesizer

    class _Named:  # binds the store to the embedder's name; never asked to embed
        def embed(self, texts: list[str]) -> Any:
            raise AssertionError("the build's Memory only binds the store; it never embeds")

    named = _Named()
    named.name, named.dim = embedder_name, dim  # type: ignore[attr-defined]
    schema = f"mem_{n}_{VERSION}"
    with _connect(admin) as c:
        c.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        c.execute(f"CREATE SCHEMA {schema}")
    Memory(store_url(admin, n), embedder=named, synthesizer=ExtractiveSynthesizer()).close()  # type: ignore[arg-type]
    out: dict = {}
    with _connect(admin) as c:
        c.execute(f"SET search_path = {schema}, public")
        idx = c.execute("SELECT i.indexname, i.indexdef FROM pg_indexes i WHERE i.schemaname = %s AND i.tablename IN "
                        "('engrain_mem_records', 'engrain_mem_text') AND NOT EXISTS (SELECT 1 FROM pg_constraint k "
                        "WHERE k.conname = i.indexname AND k.connamespace = %s::regnamespace)",
                        (schema, schema)).fetchall()
        for name, _ in idx:
            c.execute(f"DROP INDEX {schema}.{name}")
        t = time.perf_counter()
        now = time.time()
        cols = "id, skill, content, hint, metadata, digest, created, expires, embedding, importance, vec"
        import hashlib

        with c.cursor() as cur, cur.copy(f"COPY engrain_mem_records ({cols}) FROM STDIN (FORMAT BINARY)") as cp:
            cp.write(b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0))
            buf = []
            for i, (s, v) in enumerate(zip(texts, vecs)):
                meta = json.dumps({"user": mc.user(i)})
                buf.append(struct.pack(">h", 11) + b"".join((
                    _field(rec_id(i).encode()), _field(mc.skill(i).encode()), _field(s.encode()), _field(b""),
                    _field(meta.encode()), _field(hashlib.sha256(s.encode()).hexdigest().encode()),
                    _field(struct.pack(">d", now - (n - i))), _field(None), _field(v.astype("<f4").tobytes()),
                    _field(None), _field(_vec_bin(v)))))
                if len(buf) >= 5000:
                    cp.write(b"".join(buf))
                    buf.clear()
            cp.write(b"".join(buf) + b"\xff\xff")
        c.execute("INSERT INTO engrain_mem_text (rowid, id, skill, expires, tsv) "
                  "SELECT seq, id, skill, expires, tsv FROM engrain_mem_records")
        out["load_s"] = time.perf_counter() - t
        stop = threading.Event()
        _renice_backend(c, _db_url(admin, DB), stop)
        c.execute(f"SET maintenance_work_mem = '{build_mem}'")
        c.execute(f"SET max_parallel_maintenance_workers = {int(workers)}")
        t = time.perf_counter()
        for name, sql in idx:
            if " hnsw " not in sql:
                c.execute(sql)
        out["other_index_s"] = time.perf_counter() - t
        for name, sql in idx:
            if " hnsw " in sql:
                t = time.perf_counter()
                c.execute(sql)
                out["hnsw_s"] = time.perf_counter() - t
        stop.set()
        c.execute("VACUUM ANALYZE engrain_mem_records")
        c.execute("VACUUM ANALYZE engrain_mem_text")
        c.execute("INSERT INTO engrain_mem_state (name, value) VALUES ('bench:ready', %s)", (n,))
        out["index_sizes"] = dict(c.execute(
            "SELECT indexname, pg_size_pretty(pg_relation_size((%s || '.' || indexname)::regclass)) FROM pg_indexes "
            "WHERE schemaname = %s", (schema, schema)).fetchall())
    return out


def fits(admin: str, n: int) -> tuple[int, int]:
    """``(bytes of size n's store: its tables, their TOAST and indexes; the server's shared_buffers in bytes)``."""
    with _connect(admin) as c:
        size = c.execute("SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c JOIN pg_namespace s "
                         "ON s.oid = c.relnamespace WHERE s.nspname = %s AND c.relkind = 'r'",
                         (f"mem_{n}_{VERSION}",)).fetchone()[0]
        buffers = c.execute("SELECT pg_size_bytes(current_setting('shared_buffers'))").fetchone()[0]
    return int(size), int(buffers)


def warm(admin: str, n: int) -> float:
    """Bring size ``n``'s store into memory as a server that has been serving it would hold it; seconds taken.

    Right after a build, or on a machine whose page cache other jobs have
    churned, each first touch of a page is a disk read (a filtered recall of
    1000 rows took 490 ms that way at 1M). Reads every file of the records and
    full-text tables and their indexes once (into the OS cache), and scans both
    tables (into shared_buffers). pg_prewarm would do this; the bundled server
    does not ship it.
    """
    t = time.perf_counter()
    with _connect(admin) as c:
        c.execute(f"SET search_path = mem_{n}_{VERSION}, public")
        rels = [r[0] for r in c.execute(
            "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace "
            "WHERE s.nspname = %s AND c.relkind IN ('r', 'i', 't') AND c.relname NOT LIKE '%%buffer%%'",
            (f"mem_{n}_{VERSION}",))]
        chunk = 64 << 20
        for rel in rels:
            path = c.execute("SELECT pg_relation_filepath(%s)", (rel,)).fetchone()[0]
            size = c.execute("SELECT pg_relation_size(%s)", (rel,)).fetchone()[0]
            for seg in range(0, size, 1 << 30):  # 1 GB segment files: path, path.1, ...
                name = path if seg == 0 else f"{path}.{seg >> 30}"
                for off in range(0, min(1 << 30, size - seg), chunk):
                    c.execute("SELECT length(pg_read_binary_file(%s, %s, %s))", (name, off, chunk))
        c.execute("SELECT count(vec) FROM engrain_mem_records")
        c.execute("SELECT count(tsv) FROM engrain_mem_text")
    return time.perf_counter() - t


def correctness(admin: str, n: int, vecs: np.ndarray, qvecs: np.ndarray, k: int = 10) -> dict:
    """recall@k of the HNSW path (the store's session settings) against exact search, plain and filtered.

    Exact answers come from numpy over the same float32 vectors. Filtered: one
    user (0.1% of rows) and one skill (2%), each must still return k rows.
    """
    from engrain._memory.store import MemoryStore

    st = MemoryStore("postgres", url=store_url(admin, n))
    assert st.pgvector
    users = np.array([mc.user(i) for i in range(n)])
    skills = np.array([mc.skill(i) for i in range(n)])
    res: dict = {}
    for label, where, skill, mask in (("all", None, None, None),
                                       ("user filter (0.1%)", {"user": "u17"}, None, users == "u17"),
                                       ("skill filter (2%)", None, "team7", skills == "team7")):
        hits, full, lat, denom = 0, 0, [], 0
        for q in qvecs:
            t = time.perf_counter()
            got = [h[0] for h in st.pg_vector_search("record", q, skill, time.time(), k, where)]
            lat.append((time.perf_counter() - t) * 1000)
            sims = vecs @ q
            if mask is not None:
                sims = np.where(mask, sims, -np.inf)
            want = {rec_id(int(i)) for i in np.argsort(-sims)[:k] if np.isfinite(sims[i])}
            hits += len(want & set(got))
            denom += min(k, len(want))
            full += len(got) >= min(k, len(want))
        res[label] = {"recall": hits / max(denom, 1), "full": full / len(qvecs), "p50_ms": float(np.median(lat))}
    st.close()
    return res


def explain(admin: str, n: int, qvec: np.ndarray, query: str) -> list[tuple[str, str]]:
    """EXPLAIN ANALYZE of each half of a recall at this size: ``[(what, plan summary)]``."""
    from engrain._memory.store import MemoryStore

    st = MemoryStore("postgres", url=store_url(admin, n))
    out = []
    captured: list[tuple[str, list]] = []
    real = st._db.execute

    def spy(sql, params=None, **kw):  # the statements recall sends, to EXPLAIN them as sent
        if sql.lstrip().upper().startswith(("SELECT", "WITH")) and "ORDER BY" in sql:
            captured.append((sql, list(params or [])))
        return real(sql, params, **kw)

    st._db.execute = spy  # type: ignore[method-assign]
    names = []
    for name, call in (("vector half", lambda: st.pg_vector_search("record", qvec, None, time.time(), 20)),
                       ("vector half, where user (0.1%)",
                        lambda: st.pg_vector_search("record", qvec, None, time.time(), 20, {"user": "u17"})),
                       ("vector half, skill (2%)", lambda: st.pg_vector_search("record", qvec, "team7", time.time(), 20)),
                       ("full-text half", lambda: st.text_search(query, None, time.time(), 20))):
        before = len(captured)
        call()
        names += [name] * (len(captured) - before)
    st._db.execute = real  # type: ignore[method-assign]
    for name, (sql, params) in zip(names, captured):
        plan = [r[0] for r in st._db.execute("EXPLAIN (ANALYZE, BUFFERS OFF) " + sql, params).fetchall()]
        nodes = [p.strip().lstrip("-> ").split("  (")[0] for p in plan if "(cost=" in p]
        ms = next((p.split(":")[1].strip() for p in plan if p.startswith("Execution Time")), "?")
        out.append((name, f"{ms}; " + " > ".join(nodes[:5])))
    st.close()
    return out


class FloorSide:
    """What the server itself costs a recall: the query embedding, then one round trip of pgvector's bare HNSW
    top-k statement on the same table (same ``hnsw.ef_search`` as engrain's session), no full text, no
    scoring: the least any client of this server can answer a query in. A side of ``memory.measure`` (its
    blocks rotate with the others', so it runs under the same load); filtered queries are not its to run.

    Each query is embedded anew (no cache), as engrain's measured recalls are, and the statement runs
    right after the embedding, as a recall's does: a server process that sat idle through the embedding
    answers slower than one in a tight loop (at 10k, 1.5 against 0.8 ms for the same HNSW statement).
    """

    def __init__(self, admin: str, n: int, k: int = 5):
        import psycopg

        from engrain._memory.embed import default_embedder
        from engrain._memory.pgvector import HNSW_EF

        self.k, self.info = k, {}
        self.name = f"floor: embed + HNSW top-{k}, 1 trip"
        self.emb = default_embedder()
        self.emb.embed(["warm up"])
        self.db = psycopg.connect(store_url(admin, n), autocommit=True)
        ns = self.db.execute("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
                             "WHERE extname = 'vector'").fetchone()[0]
        self.db.execute(f"SET hnsw.ef_search = {HNSW_EF}")
        from engrain._memory.pgvector import register_vector_dumper

        # The query vector goes as engrain sends it (binary, pgvector's own form): no text to format or parse.
        register_vector_dumper(self.db, self.db.execute(f"SELECT '\"{ns}\".vector'::regtype::oid").fetchone()[0])
        # The limit written in, as engrain writes it: the prepared statement then keeps one plan (no planning a query).
        self.sql = (f'SELECT id, vec OPERATOR("{ns}".<=>) %s::"{ns}".vector AS d FROM engrain_mem_records '
                    "ORDER BY d LIMIT {}")
        self.parts: dict[str, list[float]] = {"embed": [], f"HNSW top-{k}": []}

    def _literal(self, v: np.ndarray) -> Any:
        from engrain._memory.pgvector import PgVector

        return PgVector.of(v)

    def single(self, texts: list[str]) -> float:
        return float("nan")

    def recall(self, qs: list[str], where: dict | None = None, k: int = 5) -> tuple[list[float], int]:
        if where is not None:
            return [], 0
        lat, full = [], 0
        for q in qs:
            t = time.perf_counter()
            v = self.emb.embed([q])[0]
            e = time.perf_counter()
            got = self.db.execute(self.sql.format(self.k), (self._literal(v),)).fetchall()
            done = time.perf_counter()
            lat.append((done - t) * 1000)
            self.parts["embed"].append((e - t) * 1000)
            self.parts[f"HNSW top-{self.k}"].append((done - e) * 1000)
            full += len(got) >= self.k
        return lat, full

    def extra(self, qs: list[str]) -> dict[str, float]:
        """p50 ms of the floor's parts over the measured rounds, and of two more statements each sent right after
        an embedding: ``SELECT 1`` (the round trip alone) and the HNSW top 40 (the vector candidates recall asks)."""
        more: dict[str, list[float]] = {"SELECT 1": [], "HNSW top-40": []}
        for i, q in enumerate(qs):
            name = "SELECT 1" if i % 2 else "HNSW top-40"
            v = self.emb.embed([q])[0]
            t = time.perf_counter()
            if i % 2:
                self.db.execute("SELECT 1").fetchall()
            else:
                self.db.execute(self.sql.format(40), (self._literal(v),)).fetchall()
            more[name].append((time.perf_counter() - t) * 1000)
        return {k: float(np.median(v)) for k, v in {**self.parts, **more}.items() if v}

    def clear_cache(self) -> None:
        pass

    def close(self) -> None:
        self.db.close()


def main() -> None:
    """``python bench/memory_pg.py SIZE [BUILD_MEM] [WORKERS]``: build (or keep) one cached store ahead of a bench run."""
    import os
    import sys

    from memory import pgvector_url

    from engrain._memory.embed import default_embedder

    n = int(sys.argv[1])
    admin = pgvector_url()
    if ready(admin, n) and not os.environ.get("REBUILD"):
        print(f"mem_{n}_{VERSION} is ready")
        return
    texts, vecs = mc.corpus(n)
    print(f"corpus of {n} built; loading ...", flush=True)
    emb = default_embedder()  # the store is that model's, as memory.py's recalls open it
    info = build(admin, n, texts, vecs, emb.name, emb.dim, sys.argv[2] if len(sys.argv) > 2 else "4GB",
                 int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    print(info, flush=True)


def phases(url: str, qs: list[str]) -> dict[str, float]:
    """p50 ms of each step of a recall on the store at ``url`` (query embedding, each half, the whole recall)."""
    from engrain._memory import Memory
    from engrain._memory.synth import ExtractiveSynthesizer

    m = Memory(url, synthesizer=ExtractiveSynthesizer())
    st, t_ = m.store, {"embed": [], "vector records": [], "vector articles": [], "full text": [], "whole recall": []}
    for q in qs[:5]:
        m.recall(q)
    for q in qs:
        t = time.perf_counter()
        qv = m.embedder.embed([q])[0]
        t_["embed"].append(time.perf_counter() - t)
        for name, call in (("vector records", lambda: st.pg_vector_search("record", qv, None, time.time(), 20)),
                           ("vector articles", lambda: st.pg_vector_search("article", qv, None, time.time(), 20)),
                           ("full text", lambda: st.text_search(q, None, time.time(), 20)),
                           ("whole recall", lambda: m.recall(q))):
            t = time.perf_counter()
            call()
            t_[name].append(time.perf_counter() - t)
    m.close()
    return {k: float(np.median(v)) * 1000 for k, v in t_.items()}


if __name__ == "__main__":
    main()
