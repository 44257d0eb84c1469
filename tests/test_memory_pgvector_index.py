"""Memory's indexes on a real PostgreSQL server with pgvector: HNSW, filtered scans, the full-text GIN.

Vectors come from a *word-hash embedder* (each word a fixed random direction,
a text the normalised sum of its words): 32 dimensions, so a few thousand
records load in seconds, with neighbours that share words like a real model's.
The planner is steered onto the HNSW index where a table this small would be
scanned instead, because the index path is what runs at scale. Skips without
``$ENGRAIN_TEST_PGVECTOR_URL``, naming it; CI sets it.
"""

from __future__ import annotations

import time
import uuid
import zlib
from collections.abc import Iterator

import numpy as np
import pytest

from engrain._memory import Memory
from engrain._memory import pgvector as pgvector_mod
from engrain._memory.store import HNSW_EF, HNSW_EF_CONSTRUCTION, HNSW_M
from engrain._memory.synth import ExtractiveSynthesizer
from tests.test_memory import PGVECTOR_URL, drop_pgvector_schema, pgvector_schema_url

pytestmark = pytest.mark.skipif(
    not PGVECTOR_URL, reason="ENGRAIN_TEST_PGVECTOR_URL is not set (scripts/pgvector.sh starts a server with pgvector)")

WHO = "ann bob cid dee eve fay gus hal ivy jon".split()
DID = "fixed broke moved tested renamed archived deployed reviewed".split()
WHAT = "router printer database invoice laptop badge ticket server pipeline dashboard backup token".split()
WHERE = "paris lima oslo tokyo cairo quito".split()
N = 2000


class WordHashEmbedder:
    name, dim = "word-hash-32", 32

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().replace(".", " ").split():
                out[i] += np.random.default_rng(zlib.crc32(w.encode())).standard_normal(self.dim)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def _text(i: int) -> str:
    return f"{WHO[i % 10]} {DID[i // 10 % 8]} the {WHAT[i // 80 % 12]} in {WHERE[i * 7 % 6]} item{i}."


@pytest.fixture(scope="module")
def mem() -> Iterator[Memory]:
    """One store of N records: every 67th record (30) has user "rare", every 401st (5) skill "tiny"."""
    schema = "t_" + uuid.uuid4().hex[:12]
    m = Memory(pgvector_schema_url(schema), embedder=WordHashEmbedder(), synthesizer=ExtractiveSynthesizer())
    m.remember_many([{"data": _text(i), "skill": "tiny" if i % 401 == 0 else "main",
                      "metadata": {"user": "rare" if i % 67 == 0 else f"u{i % 7}"}} for i in range(N)])
    m.store._db.execute("ANALYZE")
    yield m
    m.close()
    drop_pgvector_schema(schema)


@pytest.fixture
def forced(mem: Memory) -> Iterator[Memory]:
    """The store's connection with sequential and bitmap scans off: vector searches go through HNSW."""
    db = mem.store._db
    db.execute("SET enable_seqscan = off")
    db.execute("SET enable_bitmapscan = off")
    yield mem
    for s in ("enable_seqscan", "enable_bitmapscan", "hnsw.iterative_scan", "hnsw.max_scan_tuples"):
        db.execute(f"RESET {s}")
    mem.store._pg_session(db)


def _exact(mem: Memory, qv: np.ndarray, k: int, keep=lambda i: True) -> list[str]:
    ids = [r[0] for r in mem.store._db.execute("SELECT id FROM engrain_mem_records")]
    recs = mem.store.records(ids)
    sims = sorted(((float(r.embedding @ qv), r.id) for r in recs.values() if keep(r)), reverse=True)
    return [i for _, i in sims[:k]]


def _plan(mem: Memory, sql: str, params: list) -> str:
    return "\n".join(r[0] for r in mem.store._db.execute("EXPLAIN " + sql, params).fetchall())


def _captured(mem: Memory, call) -> list[tuple[str, list]]:
    """The ranked SELECTs ``call`` sends to the server, to EXPLAIN them as sent."""
    db, real, seen = mem.store._db, mem.store._db.execute, []

    def spy(sql, params=None, **kw):
        if sql.lstrip().upper().startswith(("SELECT", "WITH")) and "ORDER BY" in sql:
            seen.append((sql, list(params or [])))
        return real(sql, params, **kw)

    db.execute = spy
    try:
        call()
    finally:
        del db.execute
    return seen


def test_indexes_and_search_settings_after_open(mem: Memory):
    idx = dict(mem.store._db.execute("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"))
    vec = idx["engrain_mem_records_vec"]
    assert "USING hnsw" in vec and "vector_cosine_ops" in vec
    assert f"m='{HNSW_M}'" in vec and f"ef_construction='{HNSW_EF_CONSTRUCTION}'" in vec
    assert "USING hnsw" in idx["engrain_mem_articles_vec"]
    assert "USING gin (tsv)" in idx["engrain_mem_text_tsv"]
    assert "USING gin" in idx["engrain_mem_records_meta"] and "jsonb_path_ops" in idx["engrain_mem_records_meta"]
    # The wide tables' own tsvector GINs are not searched (the narrow table is): none is maintained.
    assert "engrain_mem_records_tsv" not in idx and "engrain_mem_articles_tsv" not in idx
    show = {s: mem.store._db.execute(f"SHOW {s}").fetchone()[0] for s in ("hnsw.ef_search", "hnsw.iterative_scan")}
    assert show == {"hnsw.ef_search": str(HNSW_EF), "hnsw.iterative_scan": "relaxed_order"}


def test_hnsw_search_equals_exact_search(forced: Memory):
    m, emb = forced, WordHashEmbedder()
    qs = [f"{WHO[i % 10]} {WHAT[i % 12]} {WHERE[i % 6]}" for i in range(20)]
    sent = _captured(m, lambda: m.store.pg_vector_search("record", emb.embed(qs[:1])[0], None, time.time(), 10))
    assert "Index Scan using engrain_mem_records_vec" in _plan(m, *sent[0])
    hits = 0
    for q in qs:
        qv = emb.embed([q])[0]
        got = [i for i, _ in m.store.pg_vector_search("record", qv, None, time.time(), 10)]
        assert len(got) == 10
        hits += len(set(got) & set(_exact(m, qv, 10)))
    assert hits / (10 * len(qs)) >= 0.95


def test_selective_filters_still_return_top_k(forced: Memory, monkeypatch):
    m, emb = forced, WordHashEmbedder()
    qv = emb.embed(["ann fixed the router in paris"])[0]
    rare = _exact(m, qv, 20, lambda r: r.metadata.get("user") == "rare")
    tiny = _exact(m, qv, 20, lambda r: r.skill == "tiny")
    assert len(rare) == 20 and len(tiny) == 5

    def search(skill=None, where=None):
        return [i for i, _ in m.store.pg_vector_search("record", qv, skill, time.time(), 20, where)]

    # 30 and 5 of 2000 rows match: the planner says so, and those rows are ranked exactly.
    sent = _captured(m, lambda: search(where={"user": "rare"}))
    assert sent[-1][0].startswith("WITH f AS MATERIALIZED")
    assert search(where={"user": "rare"}) == rare and search("tiny") == tiny
    # Past the threshold the HNSW graph is walked with an iterative scan (ef_search alone would see about
    # one of the 30 rows) and still fills the limit.
    monkeypatch.setattr(pgvector_mod, "PG_EXACT_ROWS", 0)
    sent = _captured(m, lambda: search(where={"user": "rare"}))
    assert not sent[-1][0].startswith("WITH") and "Index Scan using engrain_mem_records_vec" in _plan(m, *sent[-1])
    assert search(where={"user": "rare"}) == rare
    # When the scan gives up early (or iterative scans are off), the few matching rows are ranked exactly.
    m.store._db.execute("SET hnsw.max_scan_tuples = 50")
    assert search(where={"user": "rare"}) == rare
    m.store._db.execute("SET hnsw.iterative_scan = off")
    assert search("tiny") == tiny
    monkeypatch.undo()
    # Through recall: a filtered recall keeps top_k, every hit from the filter.
    hits = m.recall("ann fixed the router in paris", top_k=10, where={"user": "rare"})
    assert len(hits) == 10 and {h.metadata["user"] for h in hits} == {"rare"}


def test_text_half_uses_the_gin_index(mem: Memory):
    db = mem.store._db
    # Enough narrow rows that the planner prefers the index on its own (no settings forced).
    db.execute("INSERT INTO engrain_mem_text (rowid, id, skill, expires, tsv) SELECT 100000 + g, 'x' || g, 'bulk', "
               "NULL, array_to_tsvector(ARRAY['filler', (ARRAY['appl','pear','plum'])[g % 3 + 1]]) "
               "FROM generate_series(1, 200000) g")
    try:
        db.execute("ANALYZE engrain_mem_text")
        mem.store._pg_stats = None
        sent = _captured(mem, lambda: mem.store.text_search("item1234 and the lima router", None, time.time(), 20))
        plan = _plan(mem, *sent[-1])
        assert "Bitmap Index Scan on engrain_mem_text_tsv" in plan
        hits = mem.store.text_search("item1234 and the lima router", None, time.time(), 20)
        assert len(hits) == 20 and all(t == "record" for t, _, _ in hits)
        # Rows with more of the words come first: each matched word adds its IDF.
        both = {r.id for r in mem.store.records([i for _, i, _ in hits]).values()
                if "router" in r.content and "lima" in r.content}
        ranks = [i in both for _, i, _ in hits]
        assert ranks == sorted(ranks, reverse=True) and any(ranks)
        # A word in more rows than max_df ranks nothing: matching it would score every row.
        assert mem.store.text_search("apples", None, time.time(), 20) == []
    finally:
        db.execute("DELETE FROM engrain_mem_text WHERE skill = 'bulk'")
        db.execute("ANALYZE engrain_mem_text")
        mem.store._pg_stats = None
