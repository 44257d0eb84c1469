"""Skill memory: ``remember``, ``recall``, ``consolidate``, ``export``, ``stats``.

Memory lives in the journal's database in three tiers: **records** (raw
deposits, deduplicated per skill, with an optional TTL), the **buffer**
(deposits and recall events waiting for consolidation) and **articles**
(knowledge synthesized from records, with provenance to them).

    import engrain as eg

    mem = eg.Memory()                      # the default store, or Memory("postgresql://...")
    mem.remember("Deploys happen on Tuesdays", skill="ops", metadata={"source": "runbook"})
    hits = mem.recall("when do we ship releases?", skill="ops")
    mem.consolidate()                      # forms / reconsolidates articles

May import: ``_journal`` (store URLs), ``_errors``. Never a surface.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._errors import MemoryInputError
from .._journal import parse_url
from .consolidate import ConsolidationSummary
from .embed import Embedder, default_embedder
from .index import ANN_THRESHOLD, VectorIndex
from .store import MemoryStore
from .synth import Synthesizer, default_synthesizer

__all__ = ["ConsolidationSummary", "Memory", "SearchResult", "memory"]

#: Weights of the recall score (see :meth:`Memory.recall`).
W_VECTOR, W_TEXT, W_RECENCY, W_HINT = 0.70, 0.20, 0.05, 0.05


@dataclass(slots=True)
class SearchResult:
    """One recall hit.

    ``tier`` is ``"record"`` or ``"article"``; ``provenance`` tells where it came
    from (a record's creation time and the article it was folded into; an
    article's source record ids, version and synthesizer).
    """

    score: float
    content: str
    tier: str
    id: str
    skill: str | None
    metadata: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view."""
        return asdict(self)


def _words(text: str) -> set[str]:
    return {w for w in "".join(c.lower() if c.isalnum() else " " for c in text).split() if w}


class Memory:
    """Memory on the store at ``url`` (default: the journal's default store).

    ``embedder`` defaults to the local MiniLM model (shared per process);
    ``synthesizer`` to an LLM when ``OPENAI_API_KEY``/``ANTHROPIC_API_KEY`` is
    set, else the offline extractive one. ``ttl`` (seconds) is the default
    lifetime of records (None: forever). ``half_life`` (seconds) sets how fast
    the recency part of the score fades.
    """

    def __init__(self, url: str | None = None, *, embedder: Embedder | None = None,
                 synthesizer: Synthesizer | None = None, ttl: float | None = None, top_k: int = 5,
                 half_life: float = 30 * 86400.0, ann_threshold: int = ANN_THRESHOLD):
        from .._journal import default_url

        if url is not None and not isinstance(url, str):  # a Journal: use its database
            url = url.url
        self.url = url or default_url()
        backend, target, _ = parse_url(self.url)
        self.backend = backend
        if backend == "sqlite":
            self.store = MemoryStore("sqlite", path=target)
        else:
            self.store = MemoryStore("postgres", url=target)
        self.embedder: Embedder = embedder or default_embedder()
        self.store.bind_embedder(self.embedder.name, self.embedder.dim)
        self.synthesizer: Synthesizer = synthesizer or default_synthesizer()
        self.ttl = self._check_ttl(ttl)
        self.top_k = top_k
        self.half_life = half_life
        self._records = VectorIndex(self.store, "record", ann_threshold=ann_threshold)
        self._articles = VectorIndex(self.store, "article", ann_threshold=ann_threshold)

    def close(self) -> None:
        """Close the store's connection."""
        self.store.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- validation ------------------------------------------------------------

    @staticmethod
    def _check_ttl(ttl: float | None) -> float | None:
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0):
            raise MemoryInputError(f"ttl must be a positive number of seconds or None, not {ttl!r}")
        return ttl

    @staticmethod
    def _check_str(value: Any, name: str, *, empty_ok: bool = False) -> str:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise MemoryInputError(f"{name} must be a string, not {type(value).__name__}")
        if not empty_ok and not value.strip():
            raise MemoryInputError(f"{name} is empty")
        return value

    def _row(self, data: Any, hint: str | None, skill: str | None, metadata: dict[str, Any] | None,
             ttl: float | None, now: float) -> dict[str, Any]:
        if isinstance(data, str):
            content = data
        else:
            try:
                content = json.dumps(data, sort_keys=True, ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise MemoryInputError(f"data must be a string or a JSON value: {e}") from None
        if not content.strip():
            raise MemoryInputError("data is empty")
        if metadata is not None and not isinstance(metadata, dict):
            raise MemoryInputError(f"metadata must be a dict, not {type(metadata).__name__}")
        try:
            json.dumps(metadata or {}, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise MemoryInputError(f"metadata must be JSON: {e}") from None
        life = self._check_ttl(ttl) if ttl is not None else self.ttl
        return {
            "id": "rec_" + os.urandom(10).hex(), "skill": self._check_str(skill, "skill", empty_ok=True),
            "content": content, "hint": self._check_str(hint, "hint", empty_ok=True), "metadata": metadata or {},
            "digest": hashlib.sha256(content.encode()).hexdigest(),
            "expires": None if life is None else now + life,
        }

    # -- API -------------------------------------------------------------------

    def remember(self, data: Any, hint: str | None = None, skill: str | None = None,
                 metadata: dict[str, Any] | None = None, *, ttl: float | None = None) -> str:
        """Store ``data`` (a string or JSON value) as a record and deposit it in the buffer.

        No LLM is called: the text is embedded locally and indexed for full text.
        Identical content within a skill is stored once; the existing id is
        returned. ``ttl`` (seconds) overrides the memory's default lifetime.
        Returns the record id.
        """
        return self.remember_many([{"data": data, "hint": hint, "skill": skill, "metadata": metadata, "ttl": ttl}])[0]

    def remember_many(self, items: Iterable[Any]) -> list[str]:
        """``remember`` for many items at once (embedded in batches, one transaction).

        Each item is a string or a dict with ``data`` and optional ``hint``,
        ``skill``, ``metadata``, ``ttl``. Returns the record ids in order.
        """
        now = time.time()
        rows = []
        for i, it in enumerate(items):
            if not isinstance(it, dict):
                it = {"data": it}
            if "data" not in it:
                raise MemoryInputError(f"item {i} has no 'data'")
            rows.append(self._row(it["data"], it.get("hint"), it.get("skill"), it.get("metadata"), it.get("ttl"), now))
        if not rows:
            return []
        vecs = self.embedder.embed([r["content"] for r in rows])
        for r, v in zip(rows, vecs):
            r["embedding"] = v
        return [rid for rid, _ in self.store.add_records(rows, now)]

    def recall(self, query: str, skill: str | None = None, top_k: int | None = None,
               hint: str | None = None) -> list[SearchResult]:
        """Records and articles most relevant to ``query``, best first.

        ``score = 0.70·cos + 0.20·text + 0.05·recency + 0.05·hint`` where
        ``cos`` is the cosine between the query and item embeddings (floored
        at 0), ``text`` the item's full-text rank (BM25 on SQLite, ts_rank_cd
        on PostgreSQL) divided by the best rank of this query (0 when the words
        do not match), ``recency`` is ``0.5 ** (age / half_life)`` (age since the
        record was stored or the article last rewritten) and ``hint`` is 1 when
        the item's hint equals ``hint``, else the share of ``hint``'s words in
        the item's hint (0 without a hint). Candidates are the union of the
        vector and full-text top hits. Full text matches any query word except
        words found in more than 1000 items: those carry almost no BM25 weight
        and would make every search linear in the store's size. ``skill`` limits the search to that skill
        (None: all skills). Every call leaves a recall event in the buffer,
        which the next :meth:`consolidate` uses to reconsolidate the articles
        returned.
        """
        query = self._check_str(query, "query")
        if skill is not None:
            self._check_str(skill, "skill", empty_ok=True)
        k = self.top_k if top_k is None else top_k
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise MemoryInputError(f"top_k must be a positive integer, not {top_k!r}")
        now = time.time()
        qv = self.embedder.embed([query])[0]
        fetch = max(4 * min(k, 1_000_000), 20)  # a huge top_k must not overflow SQL's 64-bit LIMIT
        state = self.store.state()
        cands: dict[tuple[str, str], dict[str, float]] = {}
        if self.store.pgvector:
            vec_hits = [("record", i, s) for i, s in self.store.pg_vector_search("record", qv, skill, now, fetch)]
            vec_hits += [("article", i, s) for i, s in self.store.pg_vector_search("article", qv, skill, now, fetch)]
        else:
            self._records.refresh(state)
            self._articles.refresh(state)
            vec_hits = [("record", i, s) for i, s in self._records.search(qv, fetch, skill, now)]
            vec_hits += [("article", i, s) for i, s in self._articles.search(qv, fetch, skill, now)]
        for tier, i, s in vec_hits:
            cands[(tier, i)] = {"cos": s, "text": 0.0}
        text_hits = self.store.text_search(query, skill, now, fetch)
        best = max((r for _, _, r in text_hits), default=0.0)
        for tier, i, r in text_hits:
            cands.setdefault((tier, i), {"cos": None, "text": 0.0})["text"] = r / best if best > 0 else 0.0  # type: ignore[dict-item]
        results = self._score(cands, qv, hint, now)[:k]
        self.store.add_recall_event(skill, {
            "query": query, "hint": hint,
            "hits": [{"tier": r.tier, "id": r.id, "skill": r.skill, "score": round(r.score, 4)} for r in results],
        }, now)
        return results

    def _score(self, cands: dict[tuple[str, str], dict[str, Any]], qv: Any, hint: str | None,
               now: float) -> list[SearchResult]:
        recs = self.store.records([i for t, i in cands if t == "record"])
        arts = {a.id: a for a in self.store.articles(ids=[i for t, i in cands if t == "article"])}
        hint_words = _words(hint) if hint else set()
        out = []
        for (tier, i), c in cands.items():
            item = recs.get(i) if tier == "record" else arts.get(i)
            if item is None or (tier == "record" and item.expires is not None and item.expires <= now):
                continue
            cos = c["cos"] if c["cos"] is not None else float(item.embedding @ qv)
            born = item.created if tier == "record" else item.updated
            recency = 0.5 ** (max(0.0, now - born) / self.half_life)
            item_hint = item.hint if tier == "record" else item.title
            h = 0.0
            if hint:
                h = 1.0 if item_hint.strip().lower() == hint.strip().lower() else (
                    len(hint_words & _words(item_hint)) / len(hint_words) if hint_words else 0.0)
            score = W_VECTOR * max(cos, 0.0) + W_TEXT * c["text"] + W_RECENCY * recency + W_HINT * h
            if tier == "record":
                prov = {"created": item.created, "hint": item.hint, "article_id": item.article_id,
                        "expires": item.expires}
                content, meta = item.content, item.metadata
            else:
                prov = {"sources": item.sources, "version": item.version, "created": item.created,
                        "updated": item.updated, "synthesizer": item.synthesizer, "title": item.title}
                content, meta = item.content, item.metadata
            out.append(SearchResult(round(score, 6), content, tier, i, item.skill or None, meta, prov))
        out.sort(key=lambda r: -r.score)
        return out

    def consolidate(self, num_records: int | str = "all", method: str = "LIFO") -> ConsolidationSummary:
        """Process the buffer into articles (see :mod:`engrain._memory.consolidate`).

        ``num_records`` is how many buffer rows to take (``"all"`` for every
        row); ``method`` takes the newest (``"LIFO"``) or oldest (``"FIFO"``)
        first. Each row is processed exactly once across calls and processes.
        Failures are listed in ``summary.errors``, never swallowed.
        """
        from . import consolidate as _c

        if num_records == "all":
            limit = None
        elif isinstance(num_records, int) and not isinstance(num_records, bool) and num_records > 0:
            # Past SQL's 64-bit LIMIT a count means every row; SQLite would refuse it as a type mismatch.
            limit = num_records if num_records < 2**62 else None
        else:
            raise MemoryInputError(f"num_records must be 'all' or a positive integer, not {num_records!r}")
        if not isinstance(method, str) or method.upper() not in ("LIFO", "FIFO"):
            raise MemoryInputError(f"method must be 'LIFO' or 'FIFO', not {method!r}")
        return _c.run(self, limit, method.upper() == "LIFO")

    def export_dir(self) -> Path:
        """Where exports go: ``export/`` next to the SQLite file, else ``$ENGRAIN_HOME`` (default ``.engrain``)."""
        if self.store.path is not None:
            return self.store.path.parent / "export"
        return Path(os.environ.get("ENGRAIN_HOME") or ".engrain") / "export"

    def export(self) -> Path:
        """Write one JSON file per article (with its source records) under ``export/<UTC-timestamp>/``."""
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        out = self.export_dir() / stamp
        out.mkdir(parents=True, exist_ok=False)
        for a in self.store.articles():
            srcs = self.store.records(a.sources)
            doc = {
                "id": a.id, "skill": a.skill, "title": a.title, "content": a.content, "version": a.version,
                "created": a.created, "updated": a.updated, "synthesizer": a.synthesizer, "metadata": a.metadata,
                "sources": [{"id": s, **({"content": srcs[s].content, "hint": srcs[s].hint, "created": srcs[s].created,
                                          "metadata": srcs[s].metadata} if s in srcs else {"expired": True})}
                            for s in a.sources],
            }
            (out / f"{a.id}.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        return out

    def stats(self) -> dict[str, Any]:
        """Counts per tier (live ``records``, ``buffer``, ``articles``) and consolidation counters."""
        st = self.store.state()
        out: dict[str, Any] = self.store.counts(time.time())
        out.update(consolidations=st.get("consolidations", 0), cursor=st.get("cursor", 0), backend=self.backend,
                   embedder=self.embedder.name, vector_search="pgvector" if self.store.pgvector else (
                       "hnswlib" if out["records"] >= self._records.ann_threshold else "numpy exact"))
        return out


class _DefaultMemory:
    """``engrain.memory``: a :class:`Memory` on the default store, created on first use."""

    def __init__(self) -> None:
        self._mem: Memory | None = None
        self._lock = threading.Lock()

    def _get(self) -> Memory:
        with self._lock:
            if self._mem is None:
                self._mem = Memory()
            return self._mem

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)

    def __repr__(self) -> str:
        return "<engrain.memory (default Memory, created on first use)>"


memory = _DefaultMemory()
