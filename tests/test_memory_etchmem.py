"""etchmem's API as its README writes it, and the clustering that forms one article per subject.

The hello world below is etchmem's README example with only the import (and
the store location) changed; it runs on every backend with the real MiniLM
model and the offline extractive synthesizer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from engrain import MemoryInputError
from engrain._memory import Memory
from engrain._memory import cluster as C
from engrain._memory.synth import ExtractiveSynthesizer
from tests.test_memory import mem, store_url  # noqa: F401  (fixtures: every backend incl. pgvector)

EIFFEL = [
    "The Eiffel Tower is 330 metres tall including its antenna.",
    "The tower was completed in 1889 and was originally intended to be temporary.",
    "It receives about 7 million visitors per year, making it the world's most visited paid monument.",
]

#: Small realistic sets: each inner list is one subject; one skill per set.
SUBJECTS = {
    "eiffel": [EIFFEL],
    "ops": [["Deploys to production happen on Tuesdays after the change review.",
             "A production deploy needs two approvals in the release channel.",
             "Rollbacks of a deploy are done with the previous container image tag."],
            ["The nightly database backup runs at 02:00 UTC.",
             "Backups are kept for 30 days in the cold storage bucket.",
             "Restoring a backup to staging takes about forty minutes."]],
    "customer": [["Ann prefers to be contacted by email rather than phone.",
                  "Ann's company renews its subscription every March.",
                  "She asked for invoices to be addressed to the finance department."],
                 ["Bob reported that the mobile app crashes when he uploads photos.",
                  "The crash Bob sees happens on Android 12 with the camera permission denied."]],
    "cooking": [["The sourdough starter needs feeding every twelve hours.",
                 "Keep the starter at room temperature before baking day.",
                 "The starter doubles in size about six hours after a feed."],
                ["The lasagne uses a béchamel flavoured with nutmeg.",
                 "Bake the lasagne at 180 degrees for forty-five minutes."]],
    "travel": [["The Louvre is closed on Tuesdays.",
                "The Louvre's glass pyramid entrance gets long queues in the morning."],
               ["Flights to Lisbon leave from terminal 2.",
                "The Lisbon flight allows one cabin bag of up to 10 kg."],
               ["The hotel in Porto offers breakfast from 7 to 10.",
                "Its rooftop bar closes at midnight."]],
    "billing": [["Refunds over 500 euros need approval from a finance manager.",
                 "A refund is paid back to the original payment method within 10 days."],
                ["Invoices for German customers must include VAT.",
                 "The invoice number format is year, dash, six digits."]],
}


def test_etchmem_hello_world(mem):
    engine = mem  # from etchmem import Engine; engine = Engine()  ->  engrain.Memory(url)

    # Add some facts
    engine.remember("The Eiffel Tower is 330 metres tall including its antenna.", hint=0.9)
    engine.remember("The tower was completed in 1889 and was originally intended to be temporary.")
    engine.remember("It receives about 7 million visitors per year, making it the world's most visited paid monument.")

    # Retrieve relevant knowledge
    results = engine.recall("How tall is the Eiffel Tower?")
    for r in results:
        print(r.score, r.content)
    assert "330 metres" in results[0].content

    # Consolidate — synthesizes the raw deposits into a compact knowledge article
    summary = engine.consolidate()
    print(summary)
    assert isinstance(summary, Mapping)
    d = dict(summary)
    assert {k: d[k] for k in ("formed", "reconsolidated", "dropped", "kept", "superseded")} == {
        "formed": 1, "reconsolidated": 0, "dropped": 0, "kept": 0, "superseded": 0}
    assert d["flushed"] == 4 and d["errors"] == []  # three deposits and the recall event

    results = engine.recall("Eiffel Tower visitors")
    print(results[0].content)
    assert results[0].tier == "article" and "7 million visitors" in results[0].content
    assert [r.tier for r in results] == ["article"]  # the raw records are folded into it, not listed twice

    result = engine.export()
    print(result["export_dir"])
    print(result["count"])
    assert result["count"] == 1 and Path(result["export_dir"]).is_dir()
    assert set(result) >= {"export_dir", "count", "documents"} and len(result["documents"]) == 1
    stats = engine.stats()
    assert stats["relational"] == stats["records"] == 3 and stats["injected"] == stats["articles"] == 1
    assert stats["buffer"] == 1  # the last recall's event, waiting for the next consolidation


def test_hint_is_importance_and_label_is_text(mem):
    low = mem.remember("Office plants are watered on Mondays by the facilities team.", hint=0.1)
    high = mem.remember("Office plants get water on Mondays from facilities staff.", hint=1.0)
    hits = mem.recall("who waters the office plants and when?", top_k=2)
    assert [h.id for h in hits] == [high, low] and hits[0].provenance["importance"] == 1.0
    with pytest.raises(MemoryInputError, match="label="):
        mem.remember("x", hint="billing")
    for bad in (1.5, -0.1, True, "0.5", [0.5]):
        with pytest.raises(MemoryInputError, match="hint"):
            mem.remember("y", hint=bad)
    with pytest.raises(MemoryInputError, match="label"):
        mem.remember("z", label=3)
    rid = mem.remember("Quarterly numbers are due on the 5th.", label="finance", hint=0)
    assert mem.recall("quarterly numbers", label="finance")[0].id == rid
    mem.consolidate()
    art = mem.recall("office plants watering")[0]
    assert art.tier == "article" and art.provenance["importance"] == 1.0  # its most important source's


def test_summary_is_a_mapping_with_etchmem_keys_first(mem):
    s = mem.consolidate()
    assert list(s)[:6] == ["formed", "reconsolidated", "dropped", "kept", "flushed", "superseded"]
    assert s["formed"] == 0 and len(s) == len(dict(s)) and "errors" in s
    with pytest.raises(KeyError):
        s["nope"]
    assert json.loads(json.dumps(dict(s)))["synthesizer"].startswith("extractive")


def test_related_cut_comes_from_the_embedder(embedder):
    cut = C.related_cut(embedder)
    v = embedder.embed(list(C.UNRELATED))
    sims = (v @ v.T)[np.triu_indices(len(C.UNRELATED), 1)]
    assert np.mean(sims >= cut) == pytest.approx(1 - C.NULL_QUANTILE, abs=0.002)
    assert 0.15 < cut < 0.45  # MiniLM's unrelated pairs sit near 0.04; related facts well above

    class Shifted:  # a model whose every cosine is higher (as with OpenAI's embeddings) gets a higher cut
        name = "shifted"

        def embed(self, texts):
            x = embedder.embed(texts)
            x = np.hstack([x, np.full((len(x), 1), 1.0, dtype=np.float32)])
            return x / np.linalg.norm(x, axis=1, keepdims=True)

    assert C.related_cut(Shifted()) > cut + 0.2


@pytest.mark.parametrize("name", sorted(SUBJECTS))
def test_one_article_per_subject(name, tmp_path, embedder):
    groups = SUBJECTS[name]
    with Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=embedder, synthesizer=ExtractiveSynthesizer()) as m:
        ids = [[m.remember(t, skill=name) for t in g] for g in groups]
        s = m.consolidate()
        assert not s.errors and s.formed == len(groups), (name, s)
        got = sorted(sorted(a.sources) for a in m.store.articles(skill=name))
        assert got == sorted(sorted(g) for g in ids)


def test_a_later_fact_joins_its_subjects_article(mem):
    mem.remember(EIFFEL[0])
    mem.remember(EIFFEL[1])
    assert mem.consolidate().formed == 1
    mem.remember(EIFFEL[2])  # "It ..." continues the previous deposit, already in the article
    mem.remember("Sourdough starter needs feeding every twelve hours.")
    s = mem.consolidate()
    assert s.formed == 1 and s.updated == 1, s
    arts = {len(a.sources) for a in mem.store.articles()}
    assert arts == {3, 1}


def test_folded_record_does_not_crowd_out_its_article(mem):
    ids = [mem.remember(t) for t in EIFFEL]
    mem.remember("Sourdough starter needs feeding every twelve hours.")
    before = mem.recall("how tall is the Eiffel Tower", top_k=3)
    assert before[0].id == ids[0] and before[0].tier == "record"
    mem.consolidate()
    hits = mem.recall("how tall is the Eiffel Tower", top_k=3)
    assert hits[0].tier == "article" and hits[0].provenance["via"][0] == ids[0]
    assert hits[0].score >= before[0].score - 0.06  # it ranks at least as its best record did (minus recency)
    assert not {h.id for h in hits} & set(ids)


def test_labels_keep_subjects_apart(tmp_path, embedder):
    """Deploy days and rollbacks are alike in wording; the depositor's labels say they are two topics."""
    facts = [("deploy day", "Production deploys happen on Tuesday mornings."),
             ("deploy day", "We deploy to production every Tuesday morning after the stand-up."),
             ("rollback", "Roll back a bad deploy with make rollback; it takes about four minutes."),
             ("rollback", "To undo a broken deploy, run make rollback (about four minutes).")]
    for labelled in (True, False):
        with Memory(f"sqlite:///{tmp_path / f'{labelled}.db'}", embedder=embedder,
                    synthesizer=ExtractiveSynthesizer()) as m:
            m.remember_many([{"data": t, "label": lab if labelled else None} for lab, t in facts])
            assert m.consolidate().formed == (2 if labelled else 1)
