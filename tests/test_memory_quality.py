"""bench/memory_quality.py: its metric code on known rankings, and hybrid recall on its two data sets.

The chat slice is built offline from the chitchat-dataset package like the
bench's full set, the FAQ sets from the zaragoza-construction-faq package (whole),
all embedded with the real packaged MiniLM model.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mq():
    spec = importlib.util.spec_from_file_location("memory_quality", ROOT / "bench" / "memory_quality.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["memory_quality"] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("memory_quality", None)


def test_recall_at_on_known_rankings(mq):
    ranked = ["a", "b", "c", "d", "e", "f"]
    assert mq.recall_at(ranked, {"c"}, 3) == (1.0, 1.0)
    assert mq.recall_at(ranked, {"d"}, 3) == (0.0, 0.0)
    assert mq.recall_at(ranked, {"a", "f"}, 5) == (1.0, 0.0)  # one of two in the top 5: any, not all
    assert mq.recall_at(ranked, {"a", "f"}, 6) == (1.0, 1.0)
    assert mq.recall_at(["a"], {"a", "z"}, 10) == (1.0, 0.0)  # a short ranking counts what it has
    with pytest.raises(ValueError):
        mq.recall_at(ranked, set(), 5)


def test_score_averages_over_questions(mq):
    rankings = [["a", "b", "x", "y", "z", "c"], ["q", "r"], ["m", "n", "o"]]
    evidence = [{"a", "c"}, {"r"}, {"zz"}]
    s = mq.score(rankings, evidence, ks=(1, 5, 10))
    assert s == {"any@1": pytest.approx(1 / 3), "all@1": 0.0,
                 "any@5": pytest.approx(2 / 3), "all@5": pytest.approx(1 / 3),
                 "any@10": pytest.approx(2 / 3), "all@10": pytest.approx(2 / 3)}
    with pytest.raises(ValueError):
        mq.score(rankings, evidence[:2])


def test_rrf_order(mq):
    # "b" is 2nd in both lists: 2/(60+2) beats "a" (1st in one list only: 1/61) and "c".
    assert mq.rrf(["a", "b"], ["b", "c"]) == ["b", "a", "c"]
    assert mq.rrf(["a", "b", "c"], [], k=1) == ["a", "b", "c"]


def test_questions_are_topical_and_answers_substantive(mq):
    assert mq.is_question("What kind of music do you listen to?")
    assert not mq.is_question("how are you?")
    assert not mq.is_question("What about you?")
    assert not mq.is_question("I play the guitar.")
    assert mq.is_answer("mostly indie rock lately")
    assert not mq.is_answer("haha")
    assert not mq.is_answer("what do you listen to?")


@pytest.fixture(scope="module")
def slice_store(mq, embedder, tmp_path_factory):
    ds = mq.build(mq.load_corpus(), owners=6, sessions=8, per_owner=30)
    st = mq.fill(ds, embedder, "plain", tmp_path_factory.mktemp("mq"), "slice", cache=False)
    yield ds, st
    st.mem.close()


def test_slice_is_multi_session_with_held_out_questions(mq, slice_store):
    ds, st = slice_store
    assert len(ds.owners) == 6 and len(ds.questions) >= 30
    for owner in ds.owners:
        assert len({t.session for t in ds.turns if t.owner == owner}) == 8
    stored = {(t.owner, t.text) for t in ds.turns}
    # The question message is held out; the same words said again elsewhere by the two people stay in memory.
    assert sum((q.owner, q.text) in stored for q in ds.questions) <= len(ds.questions) // 10
    for q in ds.questions:
        assert q.evidence
        for i in q.evidence:
            t = ds.turns[i]
            assert t.owner == q.owner and t.session == q.session and t.speaker == "owner" and t.time >= q.time
            assert mq.is_answer(t.text)


def test_hybrid_recall_against_each_single_method_on_the_slice(mq, slice_store):
    """Hybrid beats BM25 alone and the fixed 0.20 text weight it replaced; with neighbouring turns it beats both
    single methods on all-evidence recall.

    Not asserted on this 43-question slice: hybrid >= dense alone (on the full
    525-question set it holds on all four figures, bench/memory_quality.py; here
    one question decides it either way).
    """
    ds, st = slice_store
    res = mq.run_methods(ds, st, ["engrain", "bm25", "dense", "fixed", "expand"])
    s = {m: r[0] for m, r in res.items()}
    for k in ("any@5", "any@10", "all@10"):
        assert s["engrain"][k] >= s["bm25"][k], (k, s)
        assert s["engrain"][k] >= s["fixed"][k], (k, s)
    for single in ("bm25", "dense"):
        assert s["expand"]["all@10"] > s[single]["all@10"], (single, s)
    # Not strictly above recall's own on this slice since asking turns keep 0.6 of their match (their
    # answers then rank on their own: 0.395 both with onnxruntime 1.31, one question below with 1.32, whose
    # integer kernels move a few vectors in the last digits); on the full set (525 questions) .467 against
    # .404, bench/memory_quality.py.
    assert s["expand"]["all@10"] >= s["engrain"]["all@10"] - 1.0 / len(ds.questions) - 1e-9
    assert s["engrain"]["any@10"] > 0.3  # far above chance: each owner holds ~350 messages
    for _, p50 in res.values():
        assert p50 > 0


@pytest.fixture(scope="module")
def faq_sets(mq, embedder, tmp_path_factory):
    out = {}
    for lang in ("sv", "en"):
        ds = mq.build_faq(mq.load_faq(lang))
        out[lang] = (ds, mq.fill(ds, embedder, "plain", tmp_path_factory.mktemp("faq"), f"faq-{lang}", cache=False))
    yield out
    for _, st in out.values():
        st.mem.close()


def test_faq_set_is_one_record_per_answer_with_its_question(mq, faq_sets):
    ds, st = faq_sets["sv"]
    assert len(ds.turns) >= 450 and len(ds.questions) >= 450
    assert len({t.text for t in ds.turns}) == len(ds.turns)
    for q in ds.questions:
        assert len(q.evidence) == 1 and q.owner == "faq" and q.text.endswith("?")
    assert len(st.ids) == len(ds.turns)


def test_hybrid_beats_both_single_methods_on_the_keyword_heavy_set(mq, faq_sets):
    """Swedish answers, an English embedder: words carry the match, and the per-query text weight lets them.

    On the English answers the embedder knows the words: hybrid stays with dense
    alone (within 1%, ~5 of 500 questions) where the fixed 0.20 weight fell below it.
    """
    res = {lang: {m: r[0] for m, r in mq.run_methods(ds, st, ["engrain", "bm25", "dense", "fixed"]).items()}
           for lang, (ds, st) in faq_sets.items()}
    sv, en = res["sv"], res["en"]
    for k in ("any@5", "any@10"):
        assert sv["engrain"][k] > sv["bm25"][k] > sv["dense"][k], (k, sv)
        assert en["engrain"][k] >= en["dense"][k] - 0.01, (k, en)
        assert en["engrain"][k] > en["fixed"][k], (k, en)
        assert en["engrain"][k] > en["bm25"][k], (k, en)


def test_text_weight_follows_the_spread_of_the_top_cosines():
    from engrain._memory.fusion import SPREAD_REF, W_TEXT_MAX, W_TEXT_REF, text_weight

    rng = np.random.default_rng(0)
    wide = rng.normal(0.5, 0.08, 40)  # an embedder that tells these apart
    assert text_weight(wide) < W_TEXT_REF
    bunched = rng.normal(0.6, 0.02, 40)  # words it does not know
    assert W_TEXT_REF < text_weight(bunched) <= W_TEXT_MAX
    ref = np.concatenate([np.full(20, 0.5 + SPREAD_REF), np.full(20, 0.5 - SPREAD_REF)])  # std exactly SPREAD_REF
    assert text_weight(ref) == pytest.approx(W_TEXT_REF)
    assert text_weight([0.7] * 40) == W_TEXT_MAX
    assert text_weight([0.9, 0.1, 0.5]) == W_TEXT_REF  # too few hits to measure a spread
    # Only the best 40 count: a long tail of weak hits does not flatten a wide top.
    assert text_weight(np.concatenate([wide, np.full(400, 0.1)])) == pytest.approx(text_weight(wide))


def test_recall_neighbours_brings_the_turn_beside_a_hit(store_url, embedder):
    """``recall(neighbours=True)``: the answer stored right after the matching question comes with it."""
    from engrain._memory import Memory
    from engrain._memory.ranking import NEIGHBOUR_SHARE, Ranking
    from engrain._memory.synth import ExtractiveSynthesizer

    turns = ["What instrument did you learn as a kid?", "the cello, for about eight years",
             "We adopted a puppy last spring.", "Which city did you grow up in?", "mostly in Porto, near the river"]
    with Memory(store_url, embedder=embedder, synthesizer=ExtractiveSynthesizer()) as mem:
        ids = mem.remember_many([{"data": t, "skill": "chat", "metadata": {"who": "ann" if i % 2 else "bob"}}
                                 for i, t in enumerate(turns)])
        mem.remember("Which instrument is the loudest in an orchestra?", skill="other")  # another skill: never a neighbour
        q = "what instrument did you learn as a child?"
        # The asking turns at their full match, so the answer ranks by the share its question lends it.
        mem.ranking = Ranking(question=1.0)
        plain = mem.recall(q, skill="chat", top_k=2)
        near = mem.recall(q, skill="chat", top_k=2, neighbours=True)
        assert plain[0].id == ids[0] and near[0].id == ids[0]
        assert near[1].id == ids[1] and near[1].provenance["neighbour_of"] == ids[0]
        assert near[1].score == pytest.approx(NEIGHBOUR_SHARE * near[0].score, abs=1e-5)
        # A metadata filter also holds for neighbours: bob's question has no neighbour by bob.
        only_bob = mem.recall(q, skill="chat", top_k=3, where={"who": "bob"}, neighbours=True)
        assert ids[1] not in {r.id for r in only_bob}
        assert all(r.skill == "chat" for r in mem.recall(q, top_k=5, neighbours=True) if r.id in ids[:2])


def test_session_hit_reads_the_top_record_only(mq):
    session_of = {"a": 1, "b": 1, "c": 2, "d": 3}
    assert mq.session_hit([["a", "c"], ["d", "c"], []], [{"b"}, {"c"}, {"a"}], session_of) == pytest.approx(1 / 3)


def test_locomo_dev_split_follows_the_protocol(mq):
    """One record per turn in the protocol's form, evidence resolved to turns (skipped without the shared data)."""
    folder = mq.locomo_dir()
    if folder is None:
        pytest.skip("no LoCoMo dev split under ../shared/data/locomo-dev")
    ds = mq.build_locomo(folder)
    assert len(ds.owners) == 3 and len(ds.questions) == 354
    assert {q.kind for q in ds.questions} == {"multi-hop", "temporal", "open-domain", "single-hop"}
    t = ds.turns[0]
    assert t.dia_id == "D1:1" and t.text.startswith(f"{t.speaker} ({t.time}): ")
    for q in ds.questions:
        assert q.evidence and all(ds.turns[e].owner == q.owner for e in q.evidence)


def test_an_extra_embedder_is_measured_with_its_query_side_and_queries_embedded_once(mq, embedder, tmp_path,
                                                                                      monkeypatch):
    """``--embedder``: recall and dense search embed each question through the embedder's query side, once per
    run in one batch (kept on disk beside the documents), however many methods rank it."""
    monkeypatch.setattr(mq, "CACHE", tmp_path / "cache")

    class Sided:
        name, dim = "sided-minilm-bench", embedder.dim

        def __init__(self) -> None:
            self.queries: list[list[str]] = []

        def embed(self, texts: list[str]) -> np.ndarray:
            return embedder.embed(texts)

        def embed_query(self, texts: list[str]) -> np.ndarray:
            self.queries.append(list(texts))
            return embedder.embed(texts)

    ds = mq.build_faq(mq.load_faq("en"), limit=40)
    sided = Sided()
    st = mq.fill(ds, sided, "plain", tmp_path, "faq-en", keep_queries=True)
    assert sided.queries == [list(dict.fromkeys(q.text for q in ds.questions))]  # one batch, before any method
    res = mq.run_methods(ds, st, ["engrain", "dense", "fixed", "w0.05", "unscaled"])
    st.mem.close()
    later = {t for call in sided.queries[1:] for t in call}  # the warm-up, the null spread's sentences
    assert later and not later & {q.text for q in ds.questions}  # no question embedded again
    assert res["engrain"][0]["any@5"] > res["w0.05"][0]["any@5"] - 0.2 and res["dense"][0]["any@5"] > 0.5
    again = mq.fill(ds, Sided(), "plain", tmp_path, "faq-en", keep_queries=True)
    assert not again.embedder.inner.queries  # read back from the cache
    again.mem.close()
    labels = [label for label, _ in mq.extra_embedders(["int8=minilm-int8", "openai:text-embedding-3-small"], "both")]
    assert labels == ["int8", "openai:text-embedding-3-small"]


def test_postgres_option_fills_a_schema_of_its_own_analyzed_and_drops_it(mq, embedder, tmp_path, monkeypatch):
    """``--postgres URL``: the same records ranked by a PostgreSQL store (its word counts from the statistics,
    as a served store has them), in a schema that is gone once the store is closed."""
    import psycopg

    from tests.conftest import PG_URL

    monkeypatch.setattr(mq, "CACHE", tmp_path / "cache")
    ds = mq.build_faq(mq.load_faq("en"), limit=40)
    st = mq.fill(ds, embedder, "plain", tmp_path, "faq-en", postgres=PG_URL)
    try:
        schema = st.mem.store._x("SELECT current_schema()").fetchone()[0]
        assert schema.startswith("engrain_memquality_")
        analyzed = st.mem.store._x("SELECT reltuples FROM pg_class WHERE oid = 'engrain_mem_text'::regclass")
        assert analyzed.fetchone()[0] == len(ds.turns)
        res = {m: r[0] for m, r in mq.run_methods(ds, st, ["engrain", "bm25"]).items()}
        assert res["engrain"]["any@5"] > 0.7 and res["engrain"]["any@5"] > res["bm25"]["any@5"] > 0.4, res
    finally:
        st.close()
    with psycopg.connect(PG_URL) as c:
        assert c.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()[0] == 0
