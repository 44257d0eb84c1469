"""A question about a chat-log speaker is embedded in that speaker's voice (``engrain._memory.voice``).

The rules are checked on their own; the wiring with the shipped MiniLM behind
a class that logs the texts its query side embeds (a real model), on SQLite
and on PostgreSQL + pgvector (``$ENGRAIN_TEST_PGVECTOR_URL``; skips without).
"""

from __future__ import annotations

import numpy as np
import pytest

from engrain._memory import Memory
from engrain._memory.embed import default_embedder
from engrain._memory.ranking import Ranking
from engrain._memory.synth import ExtractiveSynthesizer
from engrain._memory.voice import Speakers, in_voice, speaker, speakers_of, wanted

CHAT = [
    ("Melanie", "We always look forward to our family camping trip. We roast marshmallows around the campfire."),
    ("Caroline", "That sounds lovely, Melanie! I went to a support group yesterday."),
    ("Melanie", "I finished a pottery project last week, a bowl with bright colours."),
    ("Caroline", "Wow, Melanie, the colours blend nicely. I'm researching adoption agencies."),
    ("Melanie", "Thanks! Painting and pottery help me relax after a long day."),
    ("Caroline", "I'm going to a pride parade next month with friends."),
]


def _chat(n: int = len(CHAT)) -> list[str]:
    return [f"{who} (1:56 pm on {8 + i} May, 2023): {text}" for i, (who, text) in enumerate(CHAT[:n])]


class Logged:
    """The shipped MiniLM, logging the texts its query side embeds; ``speaker_voice`` as the shipped one has it."""

    def __init__(self, speaker_voice: bool | None = True):
        self.inner = default_embedder()
        self.name, self.dim = "logged-minilm", self.inner.dim
        if speaker_voice is not None:
            self.speaker_voice = speaker_voice
        self.queries: list[str] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.inner.embed(texts)

    def embed_query(self, texts: list[str]) -> np.ndarray:
        self.queries += texts
        return self.inner.embed(texts)


def test_a_chat_log_header_names_its_speaker():
    assert speaker("Melanie (8:56 pm on 20 July, 2023): We always...") == "Melanie"
    assert speaker("Mary Ann: hi there") == "Mary Ann"
    assert speaker("Åsa (9 maj 2023): hej") == "Åsa"
    assert speaker("Dr. Smith: take two") == "Dr. Smith"
    assert speaker("mary ann: hi") is None and speaker("Mary ann: hi") is None
    assert speaker("  Jon (10:04 am): ok") == "Jon"
    assert speaker("no header here: lower case") is None
    assert speaker("The meeting moved to 3 pm") is None
    assert speaker("https://example.com: a link") is None


def test_a_chat_log_needs_two_speakers_with_several_turns_each():
    assert speakers_of(_chat()) == {"Melanie", "Caroline"}
    # one name heading many records is a label, not a chat
    assert speakers_of(["Note: the server runs at 10.0.0.2", "Note: backups at 3 am", "Note: rotate keys"]) == set()
    # a name heading one record only is not a speaker
    assert speakers_of(_chat() + ["Summary: two friends talk"]) == {"Melanie", "Caroline"}
    assert speakers_of([]) == set()
    # a joke told in a few headed lines among a skill's notes is no chat log; a log with a few notes still is
    notes = [f"The nightly backup of shard {i} finished in {i + 3} minutes." for i in range(12)]
    joke = ["Teacher: why is your homework late?", "Student: the dog ate it.", "Teacher: you have no dog.",
            "Student: it was a borrowed dog."]
    assert speakers_of(notes + joke) == set()
    assert speakers_of(_chat() + notes[:len(_chat()) - 1]) == {"Melanie", "Caroline"}


def test_a_question_naming_one_speaker_is_asked_in_that_speaker_voice():
    sp = frozenset({"Melanie", "Caroline"})
    assert in_voice("What does Melanie do with her family on hikes?", sp) == \
        "Melanie: What does I do with my family on hikes?"
    assert in_voice("When did Caroline's dog get sick?", sp) == "Caroline: When did my dog get sick?"
    assert in_voice("Why did Caroline’s sister call her?", sp) == "Caroline: Why did my sister call my?"
    roles = frozenset({"User", "Assistant"})
    assert in_voice("What editor does the User prefer?", roles) == "User: What editor does I prefer?"
    # two speakers named, none named, not a question, no chat log, a name inside a longer word: as asked
    for q in ["What did Caroline and Melanie paint?", "What did they paint?", "Melanie hiking trip",
              "What does Melanies do?", "Does Melanie still paint?", "Was macht Melanie heute?"]:
        assert in_voice(q, sp) == q
    assert in_voice("What does Melanie do?", frozenset()) == "What does Melanie do?"
    long = "What does Melanie do " + "and more " * 400 + "?"
    assert in_voice(long, sp) == long


def test_the_speakers_are_read_only_for_an_english_question():
    calls: list[int] = []

    def speakers() -> frozenset[str]:
        calls.append(1)
        return frozenset({"Melanie", "Caroline"})

    assert in_voice("Melanie hiking", speakers) == "Melanie hiking" and not calls
    assert in_voice("Where did Melanie camp?", speakers) == "Melanie: Where did I camp?" and calls == [1]


def test_speakers_are_kept_while_their_key_holds():
    kept, reads = Speakers(), []

    def heads() -> list[str]:
        reads.append(1)
        return _chat()

    assert kept.get("s", 1, heads) == {"Melanie", "Caroline"}
    assert kept.get("s", 1, heads) == {"Melanie", "Caroline"} and len(reads) == 1
    assert kept.get("s", 2, heads) == {"Melanie", "Caroline"} and len(reads) == 2
    assert kept.get("other", 2, lambda: ["Note: x", "Note: y"]) == set()


def test_the_embedder_decides_unless_the_ranking_says():
    assert wanted(default_embedder(), None) is True  # the shipped MiniLM: measured to help it
    assert wanted(object(), None) is False  # a user's embedder without the attribute: the question as asked
    assert wanted(object(), True) is True and wanted(default_embedder(), False) is False


def _recall_asks(mem: Memory, emb: Logged, query: str, **kw) -> str:  # noqa: ANN003
    """The one text recall embedded as its query (the embedder's null figures are made before, once)."""
    mem.recall("warm up", skill="none")
    mem._qcache.clear()
    emb.queries.clear()
    mem.recall(query, **kw)
    assert len(emb.queries) == 1
    return emb.queries[0]


def _check_wiring(mem: Memory, emb: Logged) -> None:
    q = "What does Melanie do to relax?"
    assert _recall_asks(mem, emb, q, skill="chat") == "Melanie: What does I do to relax?"
    assert _recall_asks(mem, emb, q) == "Melanie: What does I do to relax?"  # every skill: the newest records
    assert _recall_asks(mem, emb, q, skill="notes") == q  # that skill is no chat log
    # the recall event keeps the question as asked
    events = mem.store._x("SELECT data FROM engrain_mem_buffer WHERE kind = 'recall' ORDER BY seq").fetchall()
    assert events and all("Melanie: " not in d for (d,) in events)
    mem.ranking = Ranking(voice=False)
    assert _recall_asks(mem, emb, q, skill="chat") == q
    mem.ranking = Ranking()


def _fill(mem: Memory) -> None:
    mem.remember_many([{"data": t, "skill": "chat"} for t in _chat()])
    mem.remember_many([{"data": "Melanie: the build server moved to rack 4", "skill": "notes"},
                       {"data": "Deploys run every Friday at noon", "skill": "notes"}])


def test_recall_embeds_the_voiced_question_on_sqlite(tmp_path):
    emb = Logged()
    mem = Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=emb, synthesizer=ExtractiveSynthesizer())
    _fill(mem)
    _check_wiring(mem, emb)
    hits = mem.recall("What does Melanie do to relax?", skill="chat", top_k=3)
    assert hits and all(h.skill == "chat" for h in hits)


def test_a_skill_becomes_a_chat_log_when_its_second_speaker_arrives(tmp_path):
    emb = Logged()
    mem = Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=emb, synthesizer=ExtractiveSynthesizer())
    mem.remember_many([{"data": t, "skill": "chat"} for t in _chat() if t.startswith("Melanie")])
    q = "What does Melanie do to relax?"
    assert _recall_asks(mem, emb, q, skill="chat") == q  # one speaker: a label, not yet a chat
    mem.remember_many([{"data": t, "skill": "chat"} for t in _chat() if t.startswith("Caroline")])
    assert _recall_asks(mem, emb, q, skill="chat") == "Melanie: What does I do to relax?"


def test_an_embedder_without_speaker_voice_gets_the_question_as_asked(tmp_path):
    for flag in (None, False):
        emb = Logged(speaker_voice=flag)
        mem = Memory(f"sqlite:///{tmp_path / f'm{flag}.db'}", embedder=emb, synthesizer=ExtractiveSynthesizer())
        _fill(mem)
        assert _recall_asks(mem, emb, "What does Melanie do to relax?", skill="chat") == \
            "What does Melanie do to relax?"


def test_recall_embeds_the_voiced_question_on_pgvector():
    import uuid

    from tests.test_memory import PGVECTOR_URL, drop_pgvector_schema, pgvector_schema_url

    if not PGVECTOR_URL:
        pytest.skip("set ENGRAIN_TEST_PGVECTOR_URL to a PostgreSQL server with pgvector")
    schema = "t_" + uuid.uuid4().hex[:12]
    emb = Logged()
    mem = Memory(pgvector_schema_url(schema), embedder=emb, synthesizer=ExtractiveSynthesizer())
    try:
        assert mem.store.pgvector
        _fill(mem)
        _check_wiring(mem, emb)
        assert mem.store.heads(9, skill="chat", newest=2) == [t[:9] for t in _chat()[-2:][::-1]]
    finally:
        mem.store.close()
        drop_pgvector_schema(schema)
