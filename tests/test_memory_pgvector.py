"""Memory's pgvector path on a real PostgreSQL server with the extension (``scripts/pgvector.sh``).

The search in SQL must return what the numpy path returns on the same rows:
each test compares the two on one store (a second :class:`Memory` with
``vector_search="local"`` reads the same embeddings into the in-process index).
Skips, naming the variable, without ``$ENGRAIN_TEST_PGVECTOR_URL``; CI sets it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from engrain._journal import parse_url
from engrain._memory import Memory
from engrain._memory.embed import MiniLMEmbedder
from engrain._memory.store import MemoryStore
from engrain._memory.synth import ExtractiveSynthesizer
from tests.test_memory import FACTS, PGVECTOR_URL, drop_pgvector_schema, pgvector_schema_url

pytestmark = pytest.mark.skipif(
    not PGVECTOR_URL, reason="ENGRAIN_TEST_PGVECTOR_URL is not set (scripts/pgvector.sh starts a server with pgvector)")

OTHERS = [
    ("The VPN certificate is renewed every ninety days by the security team.", "ops"),
    ("Database backups are copied to the Frankfurt region each night.", "ops"),
    ("Bob takes his holidays in August and is unreachable then.", "chat"),
    ("The quarterly budget review happens in early April.", "finance"),
    ("Expense reports above 500 euros need a second signature.", "finance"),
    ("The build server runs out of disk space when logs are not rotated.", "ops"),
    ("Carol's team owns the mobile app and its store listing.", "chat"),
    ("Customer refunds are paid back within a fortnight.", "finance"),
]
QUERIES = [
    ("which day of the week do we ship releases to prod?", None),
    ("where can I get a coffee in the building", None),
    ("who signs off on paying a bill?", "finance"),
    ("when is the staging db recreated", "ops"),
    ("how long until a customer gets money back", None),
]


@pytest.fixture
def url() -> Iterator[str]:
    schema = "t_" + uuid.uuid4().hex[:12]
    yield pgvector_schema_url(schema)
    drop_pgvector_schema(schema)


def _pair(url: str, embedder: MiniLMEmbedder) -> tuple[Memory, Memory]:
    pg = Memory(url, embedder=embedder, synthesizer=ExtractiveSynthesizer())
    np_ = Memory(url, embedder=embedder, synthesizer=ExtractiveSynthesizer(), vector_search="local")
    assert pg.store.pgvector and pg.stats()["vector_search"] == "pgvector"
    assert np_.vector_search == "local" and np_.stats()["vector_search"] == "numpy exact"
    return pg, np_


def _same(a: list, b: list) -> None:
    assert [(h.tier, h.id) for h in a] == [(h.tier, h.id) for h in b]
    # Scores differ only by float4 rounding in pgvector and the recency of a later call.
    assert np.allclose([h.score for h in a], [h.score for h in b], atol=1e-4)


def test_pg_vector_search_returns_the_nearest_records(url, embedder):
    m = Memory(url, embedder=embedder, synthesizer=ExtractiveSynthesizer())
    try:
        ids = m.remember_many([{"data": t, "skill": s} for t, s in FACTS + OTHERS])
        ttl_id = m.remember("Payments to new suppliers wait for a bank check.", skill="finance", ttl=3600)
        recs = m.store.records([*ids, ttl_id])
        mat = np.stack([recs[i].embedding for i in ids])
        skills = [s for _, s in FACTS + OTHERS]
        now = time.time()
        for q, skill in QUERIES:
            qv = embedder.embed([q])[0]
            sims = mat @ qv
            order = [i for i in np.argsort(-sims) if skill is None or skills[i] == skill]
            want = [(ids[i], float(sims[i])) for i in order[:4]]
            got = m.store.pg_vector_search("record", qv, skill, now + 7200, 4)  # the TTL record has expired by then
            assert [i for i, _ in got] == [i for i, _ in want]
            assert np.allclose([c for _, c in got], [c for _, c in want], atol=1e-5)
        # Before its expiry the TTL record is found, and it is the nearest to its own text.
        qv = embedder.embed(["payments to a new supplier need a bank check"])[0]
        assert m.store.pg_vector_search("record", qv, "finance", now, 1)[0][0] == ttl_id
        assert ttl_id not in dict(m.store.pg_vector_search("record", qv, "finance", now + 7200, 20))
        assert m.store.pg_vector_search("record", qv, "no-such-skill", now, 5) == []
        # Articles are searched too, once consolidation has written them.
        m.consolidate()
        arts = m.store.articles()
        got = m.store.pg_vector_search("article", qv, None, now, len(arts))
        sims = {a.id: float(a.embedding @ qv) for a in arts}
        assert [i for i, _ in got] == sorted(sims, key=lambda i: -sims[i])
    finally:
        m.close()


def test_recall_agrees_with_the_numpy_path(url, embedder):
    pg, np_ = _pair(url, embedder)
    try:
        pg.remember_many([{"data": t, "skill": s} for t, s in FACTS + OTHERS])
        for q, skill in QUERIES:
            _same(pg.recall(q, skill=skill, top_k=4), np_.recall(q, skill=skill, top_k=4))
        hits = pg.recall("which day of the week do we ship releases to prod?")
        assert hits[0].content == FACTS[0][0]
        # Skill scoping, before and after articles exist.
        assert {h.skill for h in pg.recall("when is the budget reviewed?", skill="finance")} == {"finance"}
        pg.consolidate()
        assert pg.store.articles()
        for q, skill in QUERIES:
            a, b = pg.recall(q, skill=skill), np_.recall(q, skill=skill)
            _same(a, b)
            assert skill is None or {h.skill for h in a} == {skill}
            # Articles stand for the records folded into them: never both for one fact.
            assert "article" in {h.tier for h in a}
            shown = {s for h in a if h.tier == "article" for s in h.provenance["sources"]}
            assert not shown & {h.id for h in a if h.tier == "record"}
    finally:
        pg.close()
        np_.close()


def test_ttl_agrees_with_the_numpy_path(url, embedder):
    pg, np_ = _pair(url, embedder)
    try:
        keep = pg.remember("The wifi network is called engrain-guest.", skill="it")
        gone = pg.remember("Today's temporary door code is 4312.", skill="it", ttl=0.4)
        a, b = pg.recall("door code", skill="it"), np_.recall("door code", skill="it")
        _same(a, b)
        assert {h.id for h in a} == {keep, gone}
        time.sleep(0.5)
        a, b = pg.recall("door code", skill="it"), np_.recall("door code", skill="it")
        _same(a, b)
        assert [h.id for h in a] == [keep]
    finally:
        pg.close()
        np_.close()


def test_rows_stored_before_the_extension_are_backfilled(url, embedder):
    m = Memory(url, embedder=embedder, synthesizer=ExtractiveSynthesizer())
    ids = m.remember_many([{"data": t, "skill": s} for t, s in FACTS])
    m.consolidate()
    # As if the store had been written before pgvector was installed on the server.
    for table in ("engrain_mem_records", "engrain_mem_articles"):
        m.store._db.execute(f"ALTER TABLE {table} DROP COLUMN vec")
    m.close()
    store = MemoryStore("postgres", url=parse_url(url)[1])
    try:
        assert store.pgvector
        qv = embedder.embed([FACTS[3][0]])[0]
        got = store.pg_vector_search("record", qv, None, time.time(), len(FACTS))
        assert len(got) == len(FACTS) and got[0][0] == ids[3] and got[0][1] == pytest.approx(1.0, abs=1e-5)
        assert len(store.pg_vector_search("article", qv, None, time.time(), 50)) == len(store.articles())
    finally:
        store.close()
