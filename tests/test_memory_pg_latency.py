"""What recall on PostgreSQL + pgvector skips to be fast changes no result (the timings are bench/memory.py's).

* the record and article vector searches and the full-text hits' rows come in one statement
  (``pg_vector_search_both``), which ``pg_around`` then takes instead of reading them again;
* recall's rows come in PostgreSQL's binary format (a vector's bytea as its bytes, not as hex);
* ``folded_records`` reads a partial index that holds folded records only, and recall asks which of its
  candidates are folded in the statement that reads its best ones (``records(folded_of=...)``).

Real PostgreSQL with pgvector (``$ENGRAIN_TEST_PGVECTOR_URL``); without it, these skip.
"""

from __future__ import annotations

import time

import pytest

from engrain._memory import Memory
from tests.test_memory_latency import FACTS, _recalls, pg_memory


@pytest.fixture
def pg_mem(embedder):
    """A pgvector store of 240 records in 4 skills (80 folded into articles, 40 with a TTL)."""
    with pg_memory(embedder) as mem:
        mem.remember_many([{"data": f"{FACTS[i % len(FACTS)]} (later note {i})", "skill": f"team{i % 4}",
                            "metadata": {"user": f"u{i % 5}"}, **({"ttl": 3600} if i % 3 == 0 else {})}
                           for i in range(120)])
        yield mem


def _counting(mem: Memory) -> list[str]:
    """The SQL of every statement ``mem``'s store sends from now on."""
    sent: list[str] = []
    real = mem.store._db.execute

    def execute(sql, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        sent.append(str(sql))
        return real(sql, *a, **kw)

    mem.store._db.execute = execute  # type: ignore[method-assign]
    return sent


def test_one_statement_searches_both_tiers_and_reads_the_text_hits(pg_mem, embedder):
    st = pg_mem.store
    qv = embedder.embed(["who fixed the login service in Berlin?"])[0]
    now = time.time()
    ttl_ids = [i for (i,) in st._x("SELECT id FROM engrain_mem_records WHERE expires IS NOT NULL").fetchall()]
    own = [i for (i,) in st._x("SELECT id FROM engrain_mem_records ORDER BY seq DESC LIMIT 30").fetchall()]
    assert set(ttl_ids) & set(own)
    for skill, where, limit, at in [(None, None, 20, now), ("team1", None, 20, now), (None, {"user": "u2"}, 20, now),
                                    (None, None, 500, now), ("team2", {"user": "u3"}, 7, now + 7200),
                                    (None, None, 40, now + 7200), ("no-such-skill", None, 5, now)]:
        sent = _counting(pg_mem)
        recs, arts, read = st.pg_vector_search_both(qv, skill, at, limit, where, own)
        del st._db.execute
        assert recs == st.pg_vector_search("record", qv, skill, at, limit, where)
        assert arts == st.pg_vector_search("article", qv, skill, at, limit)
        if skill is None and where is None and limit <= len(recs):
            assert len(sent) == 1  # both tiers and the rows: one round trip
        alone = st.pg_around(own, 0, at, where)
        sent = _counting(pg_mem)
        taken = st.pg_around(own, 0, at, where, read)
        del st._db.execute
        assert sent == []  # taken from what the search read
        assert taken[0] == alone[0] and (taken[1] == alone[1]).all() and (taken[2] == alone[2]).all()
        assert (taken[3] == alone[3]).all() and taken[3].shape == alone[3].shape
        expired = at > now + 3600
        assert (set(ttl_ids) & set(taken[0]) == set()) == expired  # a record past its TTL is never read
    # Rows it did not read (not among ``own``) are read as before.
    more = [i for (i,) in st._x("SELECT id FROM engrain_mem_records ORDER BY seq LIMIT 5").fetchall()]
    _, _, read = st.pg_vector_search_both(qv, None, now, 20, None, own)
    sent = _counting(pg_mem)
    got = st.pg_around(own[:3] + more, 0, now, None, read)
    del st._db.execute
    assert len(sent) == 1 and got[0] == st.pg_around(own[:3] + more, 0, now)[0]
    assert st.pg_vector_search_both(qv, None, now, 20, None, [])[2] == (set(), [])


def test_recall_on_pgvector_sends_fewer_statements_and_ranks_the_same(pg_mem, monkeypatch):
    sent = _counting(pg_mem)
    got = _recalls(pg_mem)
    del pg_mem.store._db.execute
    assert not any(s.startswith("SELECT seq, id, skill, seq") for s in sent)  # text hits' rows: no read of their own
    assert not any(s.startswith("SELECT id, vec") for s in sent)  # no tier's first search on its own
    # The way before: each tier searched on its own, the text hits' rows read apart, rows in the text format.
    st = pg_mem.store

    def apart(qv, skill, now, limit, where=None, own=()):  # noqa: ANN001, ANN202
        return st.pg_vector_search("record", qv, skill, now, limit, where), st.pg_vector_search(
            "article", qv, skill, now, limit), None

    real_x = st._x
    monkeypatch.setattr(st, "pg_vector_search_both", apart)
    monkeypatch.setattr(st, "_x", lambda sql, params=(), binary=False: real_x(sql, params))
    pg_mem._qcache.clear()
    assert _recalls(pg_mem) == got
    ids = [i for (i,) in real_x("SELECT id FROM engrain_mem_records").fetchall()]
    text_rows = st.records(ids)
    monkeypatch.undo()
    binary_rows = st.records(ids)
    assert text_rows.keys() == binary_rows.keys()
    for i, r in text_rows.items():
        b = binary_rows[i]
        assert (r.content, r.metadata, r.created, r.expires, r.article_id, r.importance, r.hint) == \
            (b.content, b.metadata, b.created, b.expires, b.article_id, b.importance, b.hint)
        assert r.embedding.tobytes() == b.embedding.tobytes()


def test_folded_records_read_a_partial_index_on_pgvector(pg_mem):
    st = pg_mem.store
    (definition,) = st._x("SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() "
                          "AND indexname = 'engrain_mem_records_folded'").fetchone()
    assert "WHERE (article_id IS NOT NULL)" in definition
    rows = st._x("SELECT id, article_id FROM engrain_mem_records").fetchall()
    folded = {i for i, a in rows if a is not None}
    assert folded and len(folded) < len(rows)
    assert st.folded_records([i for i, _ in rows]) == folded
    assert st.folded_records([]) == set()
    # recall's read of its best candidates, with which of the rest are folded, in one statement
    head = [i for i, _ in rows[::3]]
    tail = [i for i, _ in rows][1::3] + [i for i, _ in rows][2::3]
    assert set(tail) & folded and set(head) & folded
    both = st.records(head, vectors=False, folded_of=tail)
    assert set(both) == set(head) | (set(tail) & folded)
    apart = st.records(list(both), vectors=False)
    assert [(r.id, r.content, r.metadata, r.created, r.article_id) for r in apart.values()] == \
        [(r.id, r.content, r.metadata, r.created, r.article_id) for r in (both[i] for i in apart)]
    with st._db.transaction():  # the planner takes it when scans of the table are priced out
        st._db.execute("SET LOCAL enable_seqscan = off")
        plan = st._db.execute("EXPLAIN SELECT id FROM engrain_mem_records WHERE article_id IS NOT NULL "
                              "AND id = ANY(%s)", ([i for i, _ in rows[:50]],)).fetchall()
    assert "engrain_mem_records_folded" in " ".join(r[0] for r in plan)
