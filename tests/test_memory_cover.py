"""A chat-log turn's passage words (``engrain._memory.ranking.add_cover``), on every backend.

A question whose words are spread over neighbouring turns ranks the passage
that holds them all; records that are not a chat log rank as they did. On
SQLite, on PostgreSQL searched in-process (the test server has no pgvector) and
on PostgreSQL + pgvector (``$ENGRAIN_TEST_PGVECTOR_URL``; skips without), with
the shipped MiniLM.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from engrain._memory import Memory
from engrain._memory.ranking import COVER_RADIUS, W_COVER, Ranking
from engrain._memory.synth import ExtractiveSynthesizer
from tests.conftest import drop_pg_schema, pg_schema_url
from tests.test_memory import PGVECTOR_URL, drop_pgvector_schema, pgvector_schema_url

# Two speakers over a few days. The question "What did Melanie paint after the camping trip?" is answered by
# turns 1-3 together: one names the trip, one the painting; no single turn holds both. Turns 6 and 9 each hold
# one of the words strongly, far (more than COVER_RADIUS turns) from the other.
LOG = [
    ("Caroline", "How was your weekend? I stayed home and read."),
    ("Melanie", "We went on a camping trip to the lake with the kids."),
    ("Caroline", "That sounds wonderful. Did you do anything creative there?"),
    ("Melanie", "Yes! Afterwards I painted the sunrise over the water."),
    ("Caroline", "I'd love to see it some time."),
    ("Melanie", "I'll bring it to the book club next week."),
    ("Caroline", "My brother loves to paint, he paints every single evening."),
    ("Melanie", "Mine bakes bread instead, sourdough mostly."),
    ("Caroline", "Sourdough takes patience, I never managed a good loaf."),
    ("Melanie", "The camping gear in our garage is old and needs replacing."),
    ("Caroline", "You could ask at the outdoor shop near the station."),
    ("Melanie", "Good idea, I will go there on Saturday."),
]
QUESTION = "What did Melanie paint after the camping trip?"


def _log() -> list[str]:
    return [f"{who} (2:10 pm on {3 + i} June, 2023): {text}" for i, (who, text) in enumerate(LOG)]


@pytest.fixture(params=["sqlite", "postgres", "pgvector"])
def url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'm.db'}"
        return
    schema = "t_" + uuid.uuid4().hex[:12]
    if request.param == "postgres":
        yield pg_schema_url(schema)
        drop_pg_schema(schema)
        return
    if not PGVECTOR_URL:
        pytest.skip("set ENGRAIN_TEST_PGVECTOR_URL to a PostgreSQL server with pgvector")
    yield pgvector_schema_url(schema)
    drop_pgvector_schema(schema)


def _open(url: str, embedder) -> Memory:
    return Memory(url, embedder=embedder, synthesizer=ExtractiveSynthesizer())


def _scores(mem: Memory, query: str, **kw) -> dict[str, float]:  # noqa: ANN003
    return {h.content: h.score for h in mem.recall(query, top_k=len(LOG), **kw)}


def test_the_store_says_which_query_words_each_record_holds_as_full_text_matches_them(url, embedder):
    mem = _open(url, embedder)
    try:
        ids = mem.remember_many([{"data": t, "skill": "chat"} for t in _log()])
        weights, held = mem.store.passage_words(ids, QUESTION, 9)
        # PostgreSQL's English configuration drops "after" as a stop word; SQLite's full text matches it.
        assert {"melanie", "paint", "camping", "trip"} <= set(weights) <= {"melanie", "paint", "after", "camping", "trip"}
        assert all(w > 0 for w in weights.values())
        assert weights["trip"] > weights["melanie"]  # a rarer word weighs more (BM25's IDF)
        assert held[ids[3]] == ("Melanie (", frozenset({"melanie", "paint"}))  # "painted": stemmed, as full text
        assert held[ids[1]][1] == frozenset({"melanie", "camping", "trip"})
        assert held[ids[6]][1] == frozenset({"paint"})
        assert held[ids[0]][1] == frozenset()
        assert mem.store.passage_words(ids, "painting?", 9) == ({}, {})  # one word: nothing to spread
        assert mem.store.passage_words([], QUESTION, 9) == ({}, {})
    finally:
        mem.close()


def test_a_turn_whose_passage_holds_the_question_words_gains_their_share(url, embedder):
    mem = _open(url, embedder)
    try:
        ids = mem.remember_many([{"data": t, "skill": "chat"} for t in _log()])
        on = _scores(mem, QUESTION, skill="chat")
        mem.ranking = Ranking(cover=0.0)
        off = _scores(mem, QUESTION, skill="chat")
        weights, held = mem.store.passage_words(ids, QUESTION, 9)
        total = sum(weights.values())
        texts = _log()
        for k in (1, 3, 6, 9):  # each turn's words and those of the turns within the radius
            near = set().union(*(held[ids[j]][1] for j in range(max(0, k - COVER_RADIUS), k + COVER_RADIUS + 1)
                                 if j < len(ids)))
            gain = W_COVER * sum(weights[t] for t in near) / total
            assert on[texts[k]] - off[texts[k]] == pytest.approx(gain, abs=2e-6)
        # The answer's turn and the trip's turn, whose passages hold every word, lead, and further ahead of the
        # painting brother (one of the words) and the old camping gear (two, and the brother three turns away)
        # than without the passage words.
        best = sorted(on, key=lambda t: -on[t])[:2]
        assert set(best) == {texts[1], texts[3]}
        for k in (6, 9):
            assert on[texts[3]] - on[texts[k]] > off[texts[3]] - off[texts[k]] + 0.01
    finally:
        mem.close()


def test_records_that_are_not_a_chat_log_rank_as_before_and_read_no_words(url, embedder, monkeypatch):
    mem = _open(url, embedder)
    try:
        mem.remember_many([{"data": text, "skill": "notes"} for _, text in LOG])  # no speaker headers
        mem.remember_many([{"data": f"Note: {text}", "skill": "labels"} for _, text in LOG])  # one label is no chat
        asked: list[list[str]] = []
        real = mem.store.passage_words
        monkeypatch.setattr(mem.store, "passage_words", lambda ids, *a: asked.append(ids) or real(ids, *a))
        for skill in ("notes", "labels"):
            on = _scores(mem, QUESTION, skill=skill)
            mem.ranking = Ranking(cover=0.0)
            assert _scores(mem, QUESTION, skill=skill) == on
            mem.ranking = Ranking()
        assert asked == []
    finally:
        mem.close()
