"""What recall on PostgreSQL + pgvector skips to be fast changes no result (the timings are bench/memory.py's).

* the record and article vector searches and the full-text hits' rows come in one statement
  (``pg_vector_search_both``), which ``pg_around`` then takes instead of reading them again;
* scoring reads no row of its own: the vector hits' and full-text hits' rows come with the search, the
  passage windows' rows and the other candidates' rows and articles in the windows' round trip, kept in a
  ``RowPool`` (``pgrows.py``) that reads only what it lacks (a long row, a candidate nothing read); a plain
  recall is four round trips (the full text beside the embedding, the search, the windows, the recall event);
* recall's rows come in PostgreSQL's binary format (a vector's bytea as its bytes, not as hex);
* ``folded_records`` reads a partial index that holds folded records only, and recall asks which of its
  candidates are folded in the statement that reads its best ones (``records(folded_of=...)``).

Real PostgreSQL with pgvector (``$ENGRAIN_TEST_PGVECTOR_URL``); without it, these skip.
"""

from __future__ import annotations

import time

import pytest

from engrain._memory import Memory
from tests.test_memory_latency import FACTS, QUERIES, pg_memory


@pytest.fixture
def pg_mem(embedder):
    """A pgvector store of 240 records in 4 skills (80 folded into articles, 40 with a TTL)."""
    with pg_memory(embedder) as mem:
        mem.remember_many([{"data": f"{FACTS[i % len(FACTS)]} (later note {i})", "skill": f"team{i % 4}",
                            "metadata": {"user": f"u{i % 5}"}, **({"ttl": 3600} if i % 3 == 0 else {})}
                           for i in range(120)])
        yield mem


def _recalls(mem: Memory, qs: list | None = None) -> list:
    return [[r.to_dict() for r in mem.recall(q, **kw)] for q, kw in (QUERIES if qs is None else qs)]


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
    none = st.pg_vector_search_both(qv, None, now, 20, None, [])[2]
    assert none.own == set() and none.own_rows == []


def test_recall_on_pgvector_sends_fewer_statements_and_ranks_the_same(pg_mem, monkeypatch):
    from tests.test_memory_latency import _frozen_clock

    _frozen_clock(monkeypatch)  # the two runs of the recalls compare scores to their sixth decimal
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


def _trips(mem: Memory) -> tuple[list[str], list[int]]:
    """The SQL of every statement ``mem``'s store sends from now on, and the number of round trips (a pipeline's
    statements share one): ``(sent, [trips])``; undo with :func:`_stop`."""
    sent: list[str] = []
    trips = [0]
    db = mem.store._db
    real_execute, real_pipeline = db.execute, db.pipeline
    depth = [0]

    def execute(sql, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        sent.append(str(sql))
        trips[0] += depth[0] == 0
        return real_execute(sql, *a, **kw)

    class _Pipe:
        def __enter__(self):  # noqa: ANN204
            self.p = real_pipeline()
            depth[0] += 1
            trips[0] += 1
            return self.p.__enter__()

        def __exit__(self, *exc):  # noqa: ANN002, ANN204
            depth[0] -= 1
            return self.p.__exit__(*exc)

    db.execute = execute  # type: ignore[method-assign]
    db.pipeline = lambda: _Pipe()  # type: ignore[method-assign]
    return sent, trips


def _stop(mem: Memory) -> None:
    del mem.store._db.execute
    del mem.store._db.pipeline


def _store_reads(monkeypatch, mem: Memory) -> None:
    """Scoring reads every row from the store again (the way before ``RowPool``: none of the rows read kept)."""
    from engrain._memory import pgrows

    monkeypatch.setattr(pgrows.RowPool, "records", lambda self, ids, vectors=True, folded_of=():
                        self.store.records(ids, vectors=vectors, folded_of=folded_of) if folded_of
                        else self.store.records(ids, vectors=vectors))
    monkeypatch.setattr(pgrows.RowPool, "articles", lambda self, skill=None, ids=None:
                        self.store.articles(skill=skill, ids=ids))


def test_recall_on_pgvector_is_four_round_trips_and_ranks_the_same(pg_mem, monkeypatch):
    from tests.test_memory_latency import _frozen_clock

    _frozen_clock(monkeypatch)
    long = "Alice fixed the login service in Berlin; the full incident report follows. " + "x" * 3000
    pg_mem.remember(long, skill="team1")  # content past pgrows.SMALL_ROW: read by id when it ranks
    pg_mem.remember_many([{"data": f"Berlin login outage, hour {h}", "skill": "team1"} for h in range(6)])
    pg_mem.store._x("ANALYZE engrain_mem_text")  # word counts from the statistics, as a served store has them
    qs = [("when did Alice fix the login service?", {}), ("login service Berlin report", {"top_k": 8})] + QUERIES
    got = _recalls(pg_mem, qs)  # words' statistics and lexemes are kept from here on
    assert any(h["content"] == long for hits in got for h in hits)
    assert any(h["tier"] == "article" for hits in got for h in hits)
    assert _recalls(pg_mem, qs) == got
    reads = {}
    for q, kw in [("billing job problems", {"top_k": 10}), ("staging database reset", {}),
                  ("when did Alice fix the login service?", {})]:
        pg_mem.recall(q, **kw)
        pg_mem._qcache.clear()
        sent, trips = _trips(pg_mem)
        pg_mem.recall(q, **kw)
        _stop(pg_mem)
        by_id = [s for s in sent if s.startswith("SELECT seq, id, skill, content")]  # records read by id
        reads[q] = len(by_id)
        # The full text (beside the embedding), the search with its rows, the windows with the rest, the event;
        # an article that only a window's record is folded into may take one more, a long row that ranks one.
        assert trips[0] <= 4 + 1 + len(by_id), sent
        assert not any("greatest(reltuples" in s for s in sent)  # the row count comes with the word statistics
    assert reads == {"billing job problems": 0, "staging database reset": 0,
                     "when did Alice fix the login service?": 1}  # the long row, which ranks
    # Against the way before: every row read again by scoring, none kept.
    pg_mem._qcache.clear()
    _store_reads(monkeypatch, pg_mem)
    assert _recalls(pg_mem, qs) == got


def test_recall_on_pgvector_without_articles_sends_four_statements(embedder, monkeypatch):
    import uuid

    from engrain._memory.synth import ExtractiveSynthesizer
    from tests.test_memory import PGVECTOR_URL, drop_pgvector_schema, pgvector_schema_url
    from tests.test_memory_latency import _frozen_clock

    if not PGVECTOR_URL:
        pytest.skip("set ENGRAIN_TEST_PGVECTOR_URL to a PostgreSQL server with pgvector")
    schema = "t_" + uuid.uuid4().hex[:12]
    mem = Memory(pgvector_schema_url(schema), embedder=embedder, synthesizer=ExtractiveSynthesizer())
    try:
        _frozen_clock(monkeypatch)
        mem.remember_many([{"data": f"{FACTS[i % len(FACTS)]} (note {i})", "skill": f"team{i % 4}",
                            "metadata": {"user": f"u{i % 5}"}} for i in range(200)])
        mem.store._x("ANALYZE engrain_mem_text")  # word counts from the statistics, as a served store has them
        got = _recalls(mem, QUERIES)
        for q, kw in QUERIES[:3]:
            mem._qcache.clear()
            sent, trips = _trips(mem)
            mem.recall(q, **kw)
            _stop(mem)
            assert (len(sent), trips[0]) == (4, 4), sent  # full text, search with rows, windows with rows, event
        for _ in range(12):  # the search's and the windows' limits are written in: their prepared plans are kept
            mem._qcache.clear()
            mem.recall(QUERIES[0][0])
        plans = dict(mem.store._x("SELECT left(statement, 13), max(generic_plans) FROM pg_prepared_statements "
                                  "WHERE statement LIKE 'SELECT 0, r.*%%' OR statement LIKE 'SELECT c.seq, n.*%%' "
                                  "GROUP BY 1").fetchall())
        assert plans.keys() == {"SELECT 0, r.*", "SELECT c.seq,"} and min(plans.values()) > 0, plans
        _store_reads(monkeypatch, mem)
        mem._qcache.clear()
        assert _recalls(mem, QUERIES) == got
    finally:
        mem.close()
        drop_pgvector_schema(schema)
