"""Full text on SQLite: the kept per-word scores rank exactly as FTS5's own BM25 over the whole query."""

from __future__ import annotations

import random
import time

import pytest

from engrain._memory import Memory
from engrain._memory.synth import ExtractiveSynthesizer
from engrain._memory.text import query_terms

WORDS = ("deploy billing gateway cache login pipeline invoice report backup sensor tokyo berlin lima oslo "
         "monday friday slow flaky nightly legacy router queue").split()


@pytest.fixture()
def mem(tmp_path):
    m = Memory(f"sqlite:///{tmp_path / 'm.db'}", synthesizer=ExtractiveSynthesizer())
    rng = random.Random(3)
    m.remember_many([{"data": " ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 12))) + f" item{i}",
                      "skill": "abc"[i % 3]} for i in range(300)])
    m.consolidate()  # articles join the full-text table too (negative rowids)
    yield m
    m.close()


def fts5_ranking(mem: Memory, query: str, skill: str | None, limit: int) -> list[tuple[str, str, float]]:
    """FTS5 ranking the whole OR query itself (ORDER BY rank), as text_search did before it kept word scores."""
    db = mem.store._db
    match = " OR ".join(f'"{t}"' for t in query_terms(query))
    sql = "SELECT rowid, -bm25(engrain_mem_fts) FROM engrain_mem_fts WHERE engrain_mem_fts MATCH ?"
    params: list = [match]
    if skill is not None:
        sql += " AND skill = ?"
        params.append(skill)
    out = []
    for rowid, score in db.execute(sql + " ORDER BY rank LIMIT ?", (*params, limit)).fetchall():
        table = "engrain_mem_records" if rowid > 0 else "engrain_mem_articles"
        row = db.execute(f"SELECT id FROM {table} WHERE seq = ?", (abs(rowid),)).fetchone()
        out.append(("record" if rowid > 0 else "article", row[0], score))
    return out


def test_kept_word_scores_rank_as_fts5_does(mem):
    """Same rows, same order, same floats as FTS5's bm25() of the whole query: cold, then from kept words."""
    rng = random.Random(5)
    queries = [" ".join(rng.sample(WORDS, rng.randrange(1, 5))) for _ in range(40)] + ["item7 deploy", "item299"]
    assert any(t == "article" for q in queries for t, _, _ in fts5_ranking(mem, q, None, 30))
    now = time.time()
    for _ in range(3):  # the first round runs FTS5's query and keeps recurring words; later rounds use them
        for q in queries:
            for skill in (None, "b"):
                assert mem.store.text_search(q, skill, now, 30) == fts5_ranking(mem, q, skill, 30), (q, skill)
    assert len(mem.store._df[2]) >= 10  # words were kept, and the rounds above ranked from them


def test_a_write_drops_the_kept_word_scores(mem, tmp_path):
    """A new record (this connection's or another's) is found by the next search, with FTS5's scores."""
    now = time.time()
    for _ in range(3):
        mem.store.text_search("zebra deploy", None, now, 30)
    assert "deploy" in mem.store._df[2]
    rid = mem.remember("zebra deploy crossing", skill="a")
    hits = mem.store.text_search("zebra deploy", None, time.time(), 30)
    assert hits[0][1] == rid and hits == fts5_ranking(mem, "zebra deploy", None, 30)
    other = Memory(f"sqlite:///{tmp_path / 'm.db'}", synthesizer=ExtractiveSynthesizer())
    for _ in range(3):
        mem.store.text_search("zebra deploy", None, now, 30)
    rid2 = other.remember("zebra zebra deploy", skill="a")  # another connection's commit
    other.close()
    hits = mem.store.text_search("zebra deploy", None, time.time(), 30)
    assert rid2 in [h[1] for h in hits] and hits == fts5_ranking(mem, "zebra deploy", None, 30)


def test_postgres_stop_words_leave_the_other_words_weights_alone(pg_url):
    """A word PostgreSQL drops as a stop word ("after", "she": not engrain's own stop words) matches nothing
    and weighs nothing: the other words of the question keep the IDF they have without it.

    Before, its "never matched" count (2**62) was summed into the row total every IDF is taken against, which
    made all weights nearly equal on any question holding one, once the table had statistics.
    """
    from engrain._memory.text import bm25_idf

    m = Memory(pg_url, synthesizer=ExtractiveSynthesizer())
    try:
        rng = random.Random(7)
        data = [" ".join(rng.choice(WORDS[:6]) for _ in range(4)) + f" item{i}" + (" tokyo" if i % 25 == 0 else "")
                for i in range(200)]
        ids = m.remember_many([{"data": d, "skill": "a"} for d in data])
        m.store._x("ANALYZE engrain_mem_text")  # word counts from the statistics, as a served store has them
        now = time.time()
        for q in ("tokyo deploy", "billing tokyo gateway", "item7 cache"):
            plain = m.store.text_search(q, None, now, 30)
            assert plain
            for extra in (" after", " she", " after she about"):
                assert m.store.text_search(q + extra, None, now, 30) == plain, (q, extra)
        # Each row scores the BM25 IDF of the words it holds, against the table's 200 rows.
        tokyo = sum("tokyo" in d for d in data)
        deploy = sum("deploy" in d for d in data)
        got = {i: r for _, i, r in m.store.text_search("tokyo deploy after", None, now, 300)}
        for i, d in zip(ids, data):
            want = bm25_idf(tokyo, 200.0) * ("tokyo" in d) + bm25_idf(deploy, 200.0) * ("deploy" in d)
            assert got.get(i, 0.0) == pytest.approx(want, rel=0.05), d
    finally:
        m.close()
