"""Recall's ranking (``_memory/ranking.py``): the passage context, on known values and on real conversations.

Quality is measured on slices of bench/memory_quality.py's sets with the real
packaged MiniLM model; the full sets are the bench's.
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from engrain._memory import Memory
from engrain._memory.ranking import Ranking, ordinals_from_runs, window_context
from engrain._memory.synth import ExtractiveSynthesizer
from tests.test_memory import PGVECTOR_URL, drop_pgvector_schema, pgvector_schema_url

ROOT = Path(__file__).resolve().parents[1]


def test_window_context_is_the_mean_of_the_two_best_matches_nearby():
    groups = np.array([0, 0, 0, 1, 1, 0])
    ordinals = np.array([0, 1, 5, 0, 2, 2])
    match = np.array([1.0, 0.5, 0.9, 0.2, 0.4, 0.3])
    got = window_context(groups, ordinals, match, radius=2)
    # ordinal 5 of group 0 is alone within 2 (a missing neighbour counts 0); groups never mix
    assert got == pytest.approx([0.75, 0.75, 0.45, 0.3, 0.3, 0.75])
    assert window_context(np.array([0]), np.array([0]), np.array([0.8]), radius=4) == pytest.approx([0.4])
    assert len(window_context(np.zeros(0), np.zeros(0), np.zeros(0), radius=4)) == 0


def test_ordinals_from_runs_keep_unjoined_rows_apart():
    ords = ordinals_from_runs([[("a", 1), ("a", 2), ("a", 3)], [("a", 10), ("a", 11)], [("b", 1)]], radius=4)
    assert [ords[("a", s)] for s in (1, 2, 3)] == [0, 1, 2]
    assert ords[("a", 10)] - ords[("a", 3)] > 4 and ords[("a", 11)] - ords[("a", 10)] == 1


@pytest.fixture(scope="module")
def mq():
    spec = importlib.util.spec_from_file_location("memory_quality", ROOT / "bench" / "memory_quality.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["memory_quality"] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("memory_quality", None)


def test_context_on_the_locomo_dev_split(mq, embedder, tmp_path):
    """LoCoMo's dev split (3 conversations, 354 questions; skipped without the shared data): the passage context,
    the steeper text weight, the temporal prior and a chat log's passage words beat the rankings without them,
    and recall beats both single methods.

    Not per conversation: on conversation 30 alone (81 questions) session-hit@1 is one question below.
    """
    folder = mq.locomo_dir()
    if folder is None:
        pytest.skip("no LoCoMo dev split under ../shared/data/locomo-dev")
    ds = mq.build_locomo(folder)
    st = mq.fill(ds, embedder, "plain", tmp_path, "locomo", cache=False)
    try:
        res = {m: r[0] for m, r in mq.run_methods(
            ds, st, ["engrain", "before", "no-context", "no-when", "no-floor", "no-cover", "bm25", "dense"]).items()}
    finally:
        st.mem.close()
    for k in ("any@5", "session@1"):
        assert res["engrain"][k] > res["before"][k], (k, res)
    # The temporal prior: more questions find their session first, none of the top 5 is lost (any@10 is one
    # question below since the passage words: 0.814 against 0.816).
    assert res["engrain"]["session@1"] > res["no-when"]["session@1"], res
    for k in ("any@5", "all@5"):
        assert res["engrain"][k] >= res["no-when"][k], (k, res)
    assert res["engrain"]["any@10"] > res["no-context"]["any@10"], res
    # A chat log's passage words: 0.703 -> 0.749 any@5, 0.576 -> 0.616 all@5, 0.715 -> 0.723 session-hit@1.
    assert res["engrain"]["any@5"] > res["no-cover"]["any@5"] + 0.03, res
    assert res["engrain"]["all@5"] > res["no-cover"]["all@5"] + 0.02, res
    assert res["engrain"]["session@1"] >= res["no-cover"]["session@1"], res
    # The crowded skill's text-weight floor lifted session-hit@1 here (0.667 -> 0.706) before the passage words;
    # with them it no longer does (0.723 against 0.729 without it), and it is kept for the Swedish FAQ (0.530 ->
    # 0.536 any@5). BM25 alone does not beat recall on it, and the top 5 holds.
    assert res["engrain"]["session@1"] > res["bm25"]["session@1"], res
    for k in ("any@5", "all@5"):
        assert res["engrain"][k] >= res["no-floor"][k], (k, res)
    for single in ("bm25", "dense"):
        assert res["engrain"]["any@5"] > res[single]["any@5"], (single, res)


def test_temporal_prior_reads_questions_and_records():
    from engrain._memory.temporal import asks_when, dates, prior, states_time

    assert asks_when("When did Caroline go to the LGBTQ support group?")
    assert asks_when("how long ago was Caroline's 18th birthday?") and asks_when("What year did Audrey adopt Pixie?")
    assert not asks_when("When is a building permit required?")  # a condition, not an event's time
    assert not asks_when("What does Caroline research?")
    head = "Caroline (1:56 pm on 8 May, 2023): "
    assert states_time(head + "I went to a LGBTQ support group yesterday and it was so powerful.")
    assert states_time("Last Friday I finally took the kids to a pottery workshop.")
    # The header says when the message was said, on every record alike: not a time the message states.
    assert not states_time(head + "The support group has made me feel accepted.")
    assert dates(head + "hi") == {(8, "may", 2023)}
    assert dates("on October 13th, 2023 and in June 2022") == {(13, "october", 2023), (None, "june", 2022)}
    assert prior("What does Caroline research?", 0.05) is None
    assert prior("When did Caroline move?", 0.0) is None  # switched off
    p = prior("What painting did Melanie show on 13 October, 2023?", 0.05)
    assert p is not None and not p.when and p.most == pytest.approx(0.05)
    assert p("Melanie (10:31 am on 13 October, 2023): Here's one I did.") == pytest.approx(0.05)
    assert p("Melanie (10:31 am on 14 October, 2023): Here's one I did.") == 0.0  # another day
    both = prior("When did Melanie paint in October 2023?", 0.05)
    assert both.most == pytest.approx(0.10)
    assert both("Melanie (1 October, 2023): I painted a lake last week.") == pytest.approx(0.10)
    assert both("x" * 10_000 + " yesterday") == 0.0  # only a bounded head of a text is read


def test_temporal_prior_ranks_the_turn_that_says_when(tmp_path, embedder):
    """Real MiniLM: the turn reporting the event ("last Friday") outranks turns that only talk about the topic."""
    turns = [
        "Melanie (2 July, 2023): Pottery is such a calming hobby, I love working with clay.",
        "Caroline (2 July, 2023): Your pottery bowls are beautiful! Do you sell them?",
        "Melanie (2 July, 2023): Not yet, pottery is just for fun and for the kids.",
        "Melanie (15 July, 2023): It has been super busy here, so much since we talked! Last Friday I finally "
        "took my kids to a pottery workshop and we each made our own pots; they loved getting their hands dirty.",
        "Caroline (15 July, 2023): That sounds lovely, the kids must have had a blast.",
    ]
    mem = Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=embedder, synthesizer=ExtractiveSynthesizer())
    try:
        mem.remember_many([{"data": t, "skill": "chat"} for t in turns])
        q = "When did Melanie go to the pottery workshop?"
        assert mem.recall(q, skill="chat", top_k=5)[0].content == turns[3]
        # Five records under one header form crowd, which lifts the text weight to its floor (its words alone
        # then find the turn): at the per-query weight the cosines of the question as asked lead, and the prior is
        # what puts it first (asked in Melanie's voice, engrain._memory.voice, the cosines alone already do).
        mem.ranking = Ranking(text_weight=0.05, voice=False)
        with_prior = [h.content for h in mem.recall(q, skill="chat", top_k=5)]
        mem.ranking = Ranking(text_weight=0.05, when=0.0, voice=False)
        without = [h.content for h in mem.recall(q, skill="chat", top_k=5)]
        assert with_prior[0] == turns[3], with_prior
        assert without.index(turns[3]) > 0, without  # what the prior changed
        # A question that does not ask when ranks as before.
        mem.ranking = Ranking()
        plain = [h.score for h in mem.recall("Melanie's pottery", skill="chat", top_k=5)]
        mem.ranking = Ranking(when=0.0)
        assert plain == [h.score for h in mem.recall("Melanie's pottery", skill="chat", top_k=5)]
    finally:
        mem.close()


def _turns() -> list[str]:
    return [
        "Anna: How was the weekend?",
        "Ben: Busy! We finally went to the shelter on Saturday.",
        "Anna: Oh nice, did you find one?",
        "Ben: Yes, a three-year-old beagle. We named him Rex.",
        "Anna: I love that name.",
        "Ben: Work has been hectic, the quarterly report is due Friday.",
        "Anna: Good luck with the report.",
        "Ben: I also started learning the cello last month.",
        "Anna: The cello is hard to learn, isn't it?",
        "Ben: It is, my fingers hurt after every lesson.",
    ]


def test_pgvector_context_ranks_as_the_in_process_index(tmp_path, embedder):
    """The passage context reads neighbours from the in-process mirror on SQLite, in SQL on pgvector: same ranking."""
    if not PGVECTOR_URL:
        pytest.skip("set ENGRAIN_TEST_PGVECTOR_URL to a PostgreSQL server with pgvector")
    schema = "t_" + uuid.uuid4().hex[:12]
    pg = Memory(pgvector_schema_url(schema), embedder=embedder, synthesizer=ExtractiveSynthesizer())
    lite = Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=embedder, synthesizer=ExtractiveSynthesizer())
    try:
        assert pg.store.pgvector
        for m in (pg, lite):
            m.remember_many([{"data": t, "skill": "chat"} for t in _turns()])
            m.remember_many([{"data": t, "skill": "other"} for t in ("Rex is a common dog name.", "Cello strings")])
        for q in ("what dog did Ben adopt?", "which instrument is Ben learning?", "when is the report due?"):
            # The same answer first; below it the full text's ranks may part (PostgreSQL sums IDF, SQLite's
            # FTS5 computes BM25), and this crowded little skill gives the full text its floor weight.
            assert pg.recall(q, skill="chat", top_k=1)[0].content == lite.recall(q, skill="chat", top_k=1)[0].content
            # Without the full text, ranking and scores match: the context reads the same neighbours.
            pg.ranking = lite.ranking = Ranking(text_weight=0.0, cover=0.0)  # no words: neither half's nor passages
            a2 = [(h.content, round(h.score, 4)) for h in pg.recall(q, skill="chat", top_k=5)]
            b2 = [(h.content, round(h.score, 4)) for h in lite.recall(q, skill="chat", top_k=5)]
            pg.ranking = lite.ranking = Ranking()
            assert [x for x, _ in a2] == [x for x, _ in b2], q
            assert [s for _, s in a2] == pytest.approx([s for _, s in b2], abs=1e-3)
        assert [h.content for h in pg.recall("dog", top_k=3)] == [h.content for h in lite.recall("dog", top_k=3)]
        # The skill's crowding (what the text weight's floor reads) is summed in SQL on pgvector.
        for skill in ("chat", "other", None):
            assert pg.store.pg_crowding(skill, 0.0) == pytest.approx(lite._records.crowding(skill), abs=1e-6)
    finally:
        pg.close()
        lite.close()
        drop_pgvector_schema(schema)


def test_context_lifts_the_turn_beside_the_match(tmp_path, embedder):
    """A turn that answers without repeating the question's words ranks higher with its neighbours' context."""
    mem = Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=embedder, synthesizer=ExtractiveSynthesizer())
    try:
        mem.remember_many([{"data": t, "skill": "chat"} for t in _turns()])
        q = "what dog did Ben get from the shelter?"
        with_ctx = [h.content for h in mem.recall(q, skill="chat", top_k=10)]
        mem.ranking = Ranking(context=0)
        without = [h.content for h in mem.recall(q, skill="chat", top_k=10)]
        answer = _turns()[3]
        assert with_ctx.index(answer) <= without.index(answer)
        assert with_ctx.index(answer) < 3
    finally:
        mem.close()


def test_prune_keeps_every_candidate_that_can_reach_the_top():
    from engrain._memory.ranking import prune

    cands = {("record", f"r{i}"): {"cos": c, "text": 0.0} for i, c in enumerate([0.9, 0.8, 0.7, 0.6, 0.2, 0.1])}
    cands[("article", "a")] = {"cos": None, "text": 1.0}  # no cosine yet: kept
    kept = prune(cands, w_text=0.1, context=0.0, keep=2)
    # 2nd best match 0.56; priors add at most 0.15: 0.42 (cos 0.6) stays, 0.14 and 0.07 go
    assert set(kept) == {("record", "r0"), ("record", "r1"), ("record", "r2"), ("record", "r3"), ("article", "a")}
    assert prune(cands, 0.1, 0.0, keep=10) is cands


def test_pruned_recall_ranks_as_the_full_one(tmp_path, embedder, monkeypatch):
    from engrain._memory import ranking

    mem = Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=embedder, synthesizer=ExtractiveSynthesizer())
    try:
        mem.remember_many([{"data": t, "skill": "chat", "hint": (i % 5) / 4} for i, t in enumerate(_turns() * 1)])
        mem.remember_many([f"Ticket {i}: the printer on floor {i % 7} jams on A3 paper." for i in range(80)])
        qs = ["what dog did Ben adopt?", "printer jams", "when is the report due?", "cello lessons",
              "when did Ben start the cello?"]
        pruned = [[(h.id, h.score) for h in mem.recall(q, top_k=5)] for q in qs]
        monkeypatch.setattr(ranking, "prune", lambda cands, *a: cands)
        full = [[(h.id, h.score) for h in mem.recall(q, top_k=5)] for q in qs]
        assert pruned == full
    finally:
        mem.close()


def test_crowding_and_the_text_weight_floor():
    from engrain._memory.fusion import CROWDING_REF, W_TEXT_FLOOR, W_TEXT_REF, crowding, text_weight

    rng = np.random.default_rng(7)
    apart = np.eye(8, dtype=np.float32)  # orthogonal: no two share a direction
    assert crowding(apart.sum(axis=0), 8.0, 8) == pytest.approx(0.0)
    shared = rng.normal(size=16)
    crowd = np.stack([shared + 0.5 * rng.normal(size=16) for _ in range(50)])
    crowd /= np.linalg.norm(crowd, axis=1, keepdims=True)
    mean_pair = (crowd @ crowd.T)[~np.eye(50, dtype=bool)].mean()
    assert crowding(crowd.sum(axis=0), float((crowd * crowd).sum()), 50) == pytest.approx(mean_pair)
    assert crowding(apart[0], 1.0, 1) == 0.0
    # Cosines spread as MiniLM's do on English it knows: the per-query weight is tiny ...
    wide = [0.8 - 0.01 * i for i in range(40)]
    alone = text_weight(wide)
    assert alone < W_TEXT_REF / 4
    assert text_weight(wide, 0.1) == pytest.approx(max(alone, W_TEXT_FLOOR * (0.1 / CROWDING_REF) ** 3))
    # ... on a skill whose records crowd, it is at least the floor; a higher per-query weight stays.
    assert text_weight(wide, CROWDING_REF) == pytest.approx(W_TEXT_FLOOR)
    assert text_weight(wide, 0.9) == pytest.approx(W_TEXT_FLOOR)
    bunched = [0.6 - 0.001 * i for i in range(40)]
    assert text_weight(bunched, 0.9) == text_weight(bunched) > W_TEXT_FLOOR


def _conversation() -> list[str]:
    h = {("Jon", 1): "Jon (4:04 pm on 20 January, 2023): ", ("Gina", 1): "Gina (4:04 pm on 20 January, 2023): ",
         ("Jon", 2): "Jon (2:10 pm on 3 March, 2023): ", ("Gina", 2): "Gina (2:10 pm on 3 March, 2023): "}
    return [h["Jon", 1] + "Hey Gina, long time no see! How have you been?",
            h["Gina", 1] + "Good! Busy with the store, sales picked up after the holidays.",
            h["Jon", 1] + "I lost my job at the bank, so I'm going to start my own dance studio.",
            h["Gina", 1] + "Wow, that is brave. Dancing has always been your passion.",
            h["Jon", 1] + "Yes, I have danced since I was a kid, it is my escape.",
            h["Gina", 1] + "I know the feeling, my clothing line is my escape too.",
            h["Jon", 1] + "Do you have any tips for running a business?",
            h["Gina", 1] + "Keep your costs low at first and talk to your customers every day.",
            h["Jon", 2] + "Gina! I found a location for the studio downtown, near the river.",
            h["Gina", 2] + "That's amazing, congrats! When do you open?",
            h["Jon", 2] + "Hopefully in June. I still need mirrors and a sprung floor.",
            h["Gina", 2] + "My store got a feature in a fashion magazine last week.",
            h["Jon", 2] + "Congrats! You deserve it, you worked so hard.",
            h["Gina", 2] + "Thanks! I also hired my first employee, a designer named Lisa.",
            h["Jon", 2] + "Nice. I went to a networking fair yesterday to find students for the studio.",
            h["Gina", 2] + "Good idea, fairs bring a lot of people."]


def test_crowded_chat_log_ranks_the_answering_turn_first(tmp_path, embedder, monkeypatch):
    """Real MiniLM on a chat log whose every record opens with speaker and date: the vectors crowd (mean cosine
    ~0.47), the text weight gets its floor, and the turn holding the answer's words comes first more often."""
    from engrain._memory import fusion

    turns = _conversation()
    answers = {"Where is Jon's dance studio located?": 8, "What did Gina get featured in?": 11,
               "Who did Gina hire?": 13, "Why did Jon go to a fair?": 14, "What does Jon still need for the studio?": 10,
               "What advice did Gina give about business?": 7, "What happened to Jon's job?": 2}
    mem = Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=embedder, synthesizer=ExtractiveSynthesizer())
    try:
        mem.remember_many([{"data": t, "skill": "conv"} for t in turns])
        mem.recall("warm up", skill="conv")
        assert mem._records.crowding("conv") > fusion.CROWDING_REF

        def firsts() -> set[str]:
            return {q for q, a in answers.items() if mem.recall(q, skill="conv", top_k=1)[0].content == turns[a]}

        ranked = firsts()
        mem.ranking = Ranking(cover=0.0)  # the floor alone, as it was measured before the passage words
        with_floor = firsts()
        monkeypatch.setattr(fusion, "W_TEXT_FLOOR", 0.0)
        without = firsts()
        assert len(with_floor) >= 6, with_floor
        assert len(with_floor) > len(without), (with_floor, without)
        assert {"Where is Jon's dance studio located?", "Why did Jon go to a fair?"} <= with_floor - without
        assert len(ranked) >= len(with_floor), (ranked, with_floor)
    finally:
        mem.close()


def test_only_asks_reads_sentences_past_the_header():
    from engrain._memory.ranking import only_asks

    assert only_asks("Anna: What instrument do you play these days?")
    assert only_asks("Caroline (1:56 pm on 8 May, 2023): Is that recent? Where was it taken?")
    assert not only_asks("Wow, what an amazing family pic! How long have you been married?")
    assert not only_asks("Ben: The cello, for two years now.")
    assert not only_asks("") and not only_asks("Anna: ")


def test_a_turn_that_only_asks_ranks_below_its_answer(tmp_path, embedder):
    """Real MiniLM: the question asked in the conversation matches a recall's question best, but it holds no
    answer; kept at 0.6 of its match it falls below the turn that answers it."""
    turns = ["Anna: How was your weekend?", "Ben: Great, we hiked up to the lake.",
             "Anna: What instrument do you play these days?", "Ben: The cello, I've been taking lessons for two years.",
             "Anna: Where do you take your lessons?", "Ben: At the music school next to the library.",
             "Anna: What do you do for work now?", "Ben: I write software for a bank.",
             "Anna: Do you still have the beagle?", "Ben: Yes, Rex is eight now and slower on walks."]
    answers = {"What instrument does Ben play?": 3, "Where does Ben take music lessons?": 5, "What is Ben's job?": 7,
               "What did Ben do at the weekend?": 1, "Does Ben still have his dog?": 9}
    mem = Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=embedder, synthesizer=ExtractiveSynthesizer())
    try:
        mem.remember_many([{"data": t, "skill": "chat"} for t in turns])
        for q, a in answers.items():
            top = [h.content for h in mem.recall(q, skill="chat", top_k=2)]
            assert turns[a] in top and not top[0].startswith("Anna"), (q, top)
        mem.ranking = Ranking(question=1.0)  # off: the asking turn comes first for some
        assert any(mem.recall(q, skill="chat", top_k=1)[0].content.startswith("Anna") for q in answers)
    finally:
        mem.close()
