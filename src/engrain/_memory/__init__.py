"""Skill memory: ``remember``, ``recall``, ``consolidate``, ``export``, ``import_``, ``forget``, ``update``, ``stats``.

Memory lives in the journal's database in three tiers: **records** (raw
deposits, deduplicated per skill, with an optional TTL), the **buffer**
(deposits and recall events waiting for consolidation) and **articles**
(knowledge synthesized from records, with provenance to them).

    import engrain as eg

    mem = eg.Memory()                      # the default store, or Memory("postgresql://...")
    mem.remember("Deploys happen on Tuesdays", hint=0.9, skill="ops", metadata={"source": "runbook"})
    hits = mem.recall("when do we ship releases?", skill="ops", where={"source": "runbook"})
    mem.consolidate()                      # forms / reconsolidates articles
    other.import_(mem.export())            # hand the articles to another agent

The API is etchmem's (``hint`` is an importance from 0 to 1, ``consolidate``
returns a mapping, ``export`` a dict) with engrain's additions: a text
``label``, ``ttl``, ``where`` filters, ``forget``, ``update`` and ``import_``.

May import: ``_journal`` (store URLs), ``_errors``. Never a surface.
"""

from __future__ import annotations

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
from . import edit as _edit
from . import transfer as _transfer
from .consolidate import ConsolidationSummary
from .filters import check_where, matches
from .fusion import SPREAD_DEPTH, text_weight
from .embed import Embedder, default_embedder
from .index import ANN_THRESHOLD, VectorIndex
from .items import Record
from .store import MemoryStore
from .synth import Synthesizer, default_synthesizer

__all__ = ["ConsolidationSummary", "Memory", "SearchResult", "memory"]

#: Weights of the recall score (see :meth:`Memory.recall`; the text weight is per query, :mod:`.fusion`).
W_VECTOR, W_RECENCY, W_LABEL, W_IMPORTANCE = 0.70, 0.05, 0.05, 0.05
#: Importance of items deposited without a ``hint`` (the middle of etchmem's 0..1 scale).
DEFAULT_IMPORTANCE = 0.5
#: Share of a hit's score a neighbouring record gets with ``recall(neighbours=True)``; tuned on
#: bench/memory_quality.py (0.8 to 1.0 all help; 0.9 loses no recall@5 and keeps most of 1.0's all-evidence gain).
NEIGHBOUR_SHARE = 0.9


@dataclass(slots=True)
class SearchResult:
    """One recall hit.

    ``tier`` is ``"record"`` or ``"article"``; ``provenance`` tells where it came
    from (a record's creation time, label, importance and the article it was
    folded into; an article's source record ids, version and synthesizer, and
    under ``via`` the ids of its records that matched the query).
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

    @staticmethod
    def _check_hint(hint: Any, step: str) -> float | None:
        if hint is None:
            return None
        if isinstance(hint, str):
            raise MemoryInputError(f"{step}: hint is an importance from 0 to 1 (etchmem's meaning), not text "
                                   f"{hint[:40]!r}; pass a text label as label=")
        if isinstance(hint, bool) or not isinstance(hint, (int, float)) or not 0.0 <= float(hint) <= 1.0:
            raise MemoryInputError(f"{step}: hint must be a number from 0 to 1, not {hint!r}")
        return float(hint)

    def _row(self, data: Any, hint: Any, skill: str | None, metadata: dict[str, Any] | None,
             ttl: float | None, now: float, label: str | None = None) -> dict[str, Any]:
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
            "content": content, "hint": self._check_str(label, "label", empty_ok=True), "metadata": metadata or {},
            "importance": self._check_hint(hint, "remember"),
            "digest": hashlib.sha256(content.encode()).hexdigest(),
            "expires": None if life is None else now + life,
        }

    # -- API -------------------------------------------------------------------

    def remember(self, data: Any, hint: float | None = None, skill: str | None = None,
                 metadata: dict[str, Any] | None = None, *, label: str | None = None, ttl: float | None = None) -> str:
        """Store ``data`` (a string or JSON value) as a record and deposit it in the buffer.

        ``hint`` is the importance of the record from 0 to 1 (etchmem's
        meaning; None counts as 0.5), used in ranking. ``label`` is an optional
        short text topic, matched by ``recall(label=...)`` and searched as text.
        No LLM is called: the text is embedded locally and indexed for full text.
        Identical content within a skill is stored once; the existing id is
        returned. ``ttl`` (seconds) overrides the memory's default lifetime.
        Returns the record id.
        """
        return self.remember_many([{"data": data, "hint": hint, "label": label, "skill": skill, "metadata": metadata,
                                    "ttl": ttl}])[0]

    def remember_many(self, items: Iterable[Any]) -> list[str]:
        """``remember`` for many items at once (embedded in batches, one transaction).

        Each item is a string or a dict with ``data`` and optional ``hint``,
        ``label``, ``skill``, ``metadata``, ``ttl``. Returns the record ids in order.
        """
        now = time.time()
        rows = []
        for i, it in enumerate(items):
            if not isinstance(it, dict):
                it = {"data": it}
            if "data" not in it:
                raise MemoryInputError(f"item {i} has no 'data'")
            rows.append(self._row(it["data"], it.get("hint"), it.get("skill"), it.get("metadata"), it.get("ttl"), now,
                                  it.get("label")))
        if not rows:
            return []
        vecs = self.embedder.embed([r["content"] for r in rows])
        for r, v in zip(rows, vecs):
            r["embedding"] = v
        return [rid for rid, _ in self.store.add_records(rows, now)]

    def recall(self, query: str, skill: str | None = None, top_k: int | None = None,
               hint: float | None = None, *, label: str | None = None,
               where: dict[str, Any] | None = None, neighbours: bool = False) -> list[SearchResult]:
        """Records and articles most relevant to ``query``, best first.

        ``score = 0.70·cos + w·text + 0.05·recency + 0.05·importance + 0.05·label``
        where ``cos`` is the cosine between the query and item embeddings (floored
        at 0), ``text`` the item's full-text rank (BM25 on SQLite, summed IDF of
        the matched words on PostgreSQL) divided by the best rank of this query
        (0 when the words do not match), ``w`` the query's text weight: 0.05 when
        its top 40 vector hits' cosines spread as an embedder's do on text it
        knows (std 0.05), growing as the inverse square of that spread up to 0.5
        when they bunch (words the embedder does not know: codes, jargon, another
        language; see :mod:`engrain._memory.fusion`), ``recency`` is ``0.5 ** (age / half_life)`` (age since the
        record was stored or the article last rewritten), ``importance`` the
        item's ``hint`` from :meth:`remember` (an article's is its most
        important source's; 0.5 when none was given) and ``label`` is 1 when the
        item's label equals ``label``, else the share of ``label``'s words in the
        item's label (an article's label is its title). Candidates are the union
        of the vector and full-text top hits. Full text matches any query word
        except words found in more than 1000 items: those carry almost no BM25
        weight and would make every search linear in the store's size.

        Articles are the primary tier: a record already folded into an article
        is not returned beside it; its article is, scored by the better of the
        two (the record's id is listed in ``provenance["via"]``).

        ``skill`` limits the search to that skill (None: all skills). ``where``
        keeps records whose metadata has these exact values (and articles all
        of whose sources do). ``hint`` (etchmem's importance prior for the
        query) is kept in the recall event.

        ``neighbours=True`` is for memories of conversations, stored one turn
        per record in order: each record hit also brings the records of its
        skill stored just before and after it (the turns around it, where an
        answer or its question usually sits), scored at ``NEIGHBOUR_SHARE`` of
        the hit's score, with ``provenance["neighbour_of"]``. On
        bench/memory_quality.py it raises recall@10 from 0.47 to 0.50 and
        all-evidence recall@10 from 0.27 to 0.39; it is off by default because
        records that are independent facts have no meaningful neighbours.

        Every call leaves a recall event in
        the buffer, which the next :meth:`consolidate` uses to reconsolidate the
        articles returned.
        """
        query = self._check_str(query, "query")
        if skill is not None:
            self._check_str(skill, "skill", empty_ok=True)
        label = self._check_str(label, "label", empty_ok=True) or None
        importance = self._check_hint(hint, "recall")
        where = check_where(where)
        k = self.top_k if top_k is None else top_k
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise MemoryInputError(f"top_k must be a positive integer, not {top_k!r}")
        now = time.time()
        qv = self.embedder.embed([query])[0]
        fetch = max(4 * min(k, 1_000_000), 20)  # a huge top_k must not overflow SQL's 64-bit LIMIT
        # The text weight reads the spread of the best SPREAD_DEPTH cosines whatever top_k is; the graph
        # walk (ef_search) costs about the same for 20 or 40 neighbours, and only `fetch` of them become candidates.
        depth = max(fetch, SPREAD_DEPTH)
        cands: dict[tuple[str, str], dict[str, float]] = {}
        if self.store.pgvector:  # no in-process mirror to refresh: skip the state round trip
            recs = self.store.pg_vector_search("record", qv, skill, now, depth, where)
            arts = self.store.pg_vector_search("article", qv, skill, now, depth)
        else:
            state = self.store.state()
            self._records.refresh(state)
            self._articles.refresh(state)
            allow = self.store.filtered_ids(where, skill, now) if where else None
            recs = self._records.search(qv, depth, skill, now, allow)
            arts = self._articles.search(qv, depth, skill, now)
        w_text = text_weight(s for _, s in recs + arts)
        vec_hits = [("record", i, s) for i, s in recs[:fetch]] + [("article", i, s) for i, s in arts[:fetch]]
        for tier, i, s in vec_hits:
            cands[(tier, i)] = {"cos": s, "text": 0.0}
        text_hits = self.store.text_search(query, skill, now, fetch, where=where)
        best = max((r for _, _, r in text_hits), default=0.0)
        for tier, i, r in text_hits:
            cands.setdefault((tier, i), {"cos": None, "text": 0.0})["text"] = r / best if best > 0 else 0.0  # type: ignore[dict-item]
        results = self._score(cands, qv, label, now, where, w_text)
        results = self._add_neighbours(results, k, now, where) if neighbours else results[:k]
        self.store.add_recall_event(skill, {
            "query": query, "label": label, "hint": importance, "where": where,
            "hits": [{"tier": r.tier, "id": r.id, "skill": r.skill, "score": round(r.score, 4)} for r in results],
        }, now)
        return results

    def _score(self, cands: dict[tuple[str, str], dict[str, Any]], qv: Any, label: str | None,
               now: float, where: dict[str, Any] | None, w_text: float) -> list[SearchResult]:
        recs = self.store.records([i for t, i in cands if t == "record"])
        # Articles of candidate records come in too: the article stands for its records.
        homes = {r.article_id for r in recs.values() if r.article_id}
        art_ids = {i for t, i in cands if t == "article"} | homes
        arts = {a.id: a for a in self.store.articles(ids=sorted(art_ids))}
        if where:  # an article shows only if every source it still has matches the filter
            srcs = self.store.records([s for a in arts.values() for s in a.sources])
            arts = {aid: a for aid, a in arts.items()
                    if all(matches(srcs[s].metadata, where) for s in a.sources if s in srcs)}
        for aid in arts:
            cands.setdefault(("article", aid), {"cos": None, "text": 0.0})
        label_words = _words(label) if label else set()
        scored: dict[tuple[str, str], SearchResult] = {}
        via: dict[str, list[tuple[str, float]]] = {}
        for (tier, i), c in cands.items():
            item = recs.get(i) if tier == "record" else arts.get(i)
            if item is None or (tier == "record" and item.expires is not None and item.expires <= now):
                continue
            cos = c["cos"] if c["cos"] is not None else float(item.embedding @ qv)
            born = item.created if tier == "record" else item.updated
            recency = 0.5 ** (max(0.0, now - born) / self.half_life)
            item_label = item.hint if tier == "record" else item.title
            lab = 0.0
            if label:
                lab = 1.0 if item_label.strip().lower() == label.strip().lower() else (
                    len(label_words & _words(item_label)) / len(label_words) if label_words else 0.0)
            imp = DEFAULT_IMPORTANCE if item.importance is None else item.importance
            score = (W_VECTOR * max(cos, 0.0) + w_text * c["text"] + W_RECENCY * recency + W_LABEL * lab
                     + W_IMPORTANCE * imp)
            if tier == "record":
                if item.article_id in arts:  # folded into an article that is shown: count for it instead
                    via.setdefault(item.article_id, []).append((i, score))
                    continue
                prov = {"created": item.created, "label": item.hint, "importance": item.importance,
                        "article_id": item.article_id, "expires": item.expires}
            else:
                prov = {"sources": item.sources, "version": item.version, "created": item.created,
                        "updated": item.updated, "synthesizer": item.synthesizer, "title": item.title,
                        "importance": item.importance}
            scored[(tier, i)] = SearchResult(score, item.content, tier, i, item.skill or None, item.metadata, prov)
        for aid, hits in via.items():
            res = scored.get(("article", aid))
            if res is None:
                continue
            res.score = max(res.score, *(s for _, s in hits))
            res.provenance["via"] = [rid for rid, _ in sorted(hits, key=lambda h: -h[1])]
        out = list(scored.values())
        for r in out:
            r.score = round(r.score, 6)
        out.sort(key=lambda r: -r.score)
        return out

    def _add_neighbours(self, results: list[SearchResult], k: int, now: float,
                        where: dict[str, Any] | None) -> list[SearchResult]:
        """The top ``k`` of ``results`` after each record hit among the top ``2k`` lends its neighbours a score."""
        head = results[: 2 * k]
        hits = self.store.records([r.id for r in head if r.tier == "record"])
        near = self.store.adjacent_records(list(hits.values()), now)
        by_id = {r.id: r for r in results}
        for r in head:
            for n in near.get(r.id, ()):
                if n.article_id or (where and not matches(n.metadata, where)):
                    continue  # folded into an article (which stands for it), or filtered out
                s = round(NEIGHBOUR_SHARE * r.score, 6)
                cur = by_id.get(n.id)
                if cur is None:
                    by_id[n.id] = SearchResult(s, n.content, "record", n.id, n.skill or None, n.metadata, {
                        "created": n.created, "label": n.hint, "importance": n.importance, "article_id": None,
                        "expires": n.expires, "neighbour_of": r.id})
                elif cur.score < s:
                    cur.score = s
                    cur.provenance["neighbour_of"] = r.id
        return sorted(by_id.values(), key=lambda r: -r.score)[:k]

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

    def export(self) -> dict[str, Any]:
        """Write one JSON file per article (with its source records) under ``export/<UTC-timestamp>/``.

        Returns etchmem's ``{"export_dir": str, "count": int, "documents": [...]}``;
        :meth:`import_` on another memory loads either the folder or this dict.
        """
        return _transfer.export(self)

    def import_(self, source: str | os.PathLike[str] | dict[str, Any], *,
                skill_map: dict[str, str] | str | None = None) -> dict[str, Any]:
        """Load another agent's export (a folder, or the dict :meth:`export` returned).

        Each article comes in with its source records and its provenance
        (``metadata["imported"]``: original id, skill, version, synthesizer,
        origin); importing the same export again changes nothing, a newer
        version of an article replaces the older import. ``skill_map`` renames
        skills (``{"ops": "devops"}``) or files everything under one skill
        (a string). Returns counts ``imported``, ``updated``, ``unchanged``,
        ``records`` (new records) and the article ids.
        """
        return _transfer.import_(self, source, skill_map)

    def find(self, where: dict[str, Any], *, skill: str | None = None) -> list[Record]:
        """Live records whose metadata matches ``where`` (same rule as ``recall(where=)``), oldest first.

        A lookup by metadata, with no query and no ranking: adapters keep their
        own keys in metadata and fetch them here (the LangGraph store does).
        """
        where = check_where(where, "find")
        if not where:
            raise MemoryInputError("find: where must name at least one metadata key")
        ids = self.store.filtered_ids(where, skill, time.time())
        return sorted(self.store.records(sorted(ids)).values(), key=lambda r: (r.created, r.seq))

    def forget(self, id: str | None = None, *, skill: str | None = None) -> dict[str, int]:
        """Delete a record or an article (with its source records) by ``id``, or everything of ``skill``.

        An article built on a forgotten record is rewritten at once without it
        (deleted when it has no source left), so the fact disappears from
        recall. Returns counts ``records``, ``articles`` (deleted) and
        ``rewritten``.
        """
        return _edit.forget(self, id, skill)

    def update(self, id: str, data: Any, *, hint: float | None = None, label: str | None = None,
               metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """Replace the content of a record (re-embedded; its article is rewritten) or the text of an article.

        ``hint``, ``label`` and ``metadata`` replace the stored ones when given.
        """
        return _edit.update(self, id, data, hint, label, metadata)

    def stats(self) -> dict[str, Any]:
        """Counts per tier: etchmem's ``relational``, ``buffer``, ``injected`` and engrain's names.

        ``records`` = ``relational`` (live records), ``articles`` = ``injected``,
        ``buffer``; then consolidation counters, backend, embedder and vector search.
        """
        st = self.store.state()
        out: dict[str, Any] = self.store.counts(time.time())
        out = {"relational": out["records"], "buffer": out["buffer"], "injected": out["articles"], **out}
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
