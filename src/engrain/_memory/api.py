"""The :class:`Memory` facade of skill memory (see the package docstring) and ``engrain.memory``, its default instance.

Ranking lives in :mod:`.ranking`, storage in :mod:`.store`, vectors in :mod:`.index`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._errors import MemoryInputError
from .._journal.failures import storage_errors
from . import edit as _edit
from . import transfer as _transfer
from .consolidate import ConsolidationSummary
from . import ranking as _ranking
from . import temporal as _temporal
from . import voice as _voice
from .filters import check_where
from . import cluster as _cluster
from . import fusion as _fusion
from .fusion import SPREAD_DEPTH, recall_text_weight
from . import embedders as _embedders
from .embed import Embedder, embed_queries
from .index import ANN_THRESHOLD, VectorIndex
from .inputs import check_hint, check_str, check_ttl, new_row
from .items import Record
from .mirrors import catch_up
from .pgvector import VECTOR_SEARCH, check_vector_search, vector_search_of  # noqa: F401  (VECTOR_SEARCH: re-exported)
from .query import QUERY_CACHE, QueryVectors, settle, start_beside  # noqa: F401  (QUERY_CACHE: re-exported)
from .ranking import Ranking, SearchResult
from .seqrows import MirrorRows
from .store import open_store
from .synth import Synthesizer, default_synthesizer



class Memory:
    """Memory on the store at ``url`` (default: the journal's default store).

    ``embedder`` is a model string (``"openai:text-embedding-3-small"``,
    ``"ollama:<model>"``, ``"sentence-transformers:<name or path>"``, ``"default"``;
    :mod:`engrain._memory.embedders`) or an object with ``name``, ``dim`` and
    ``embed``; ``embedder_base_url``/``embedder_api_key`` point ``openai:`` at any
    compatible server. None: ``$ENGRAIN_EMBEDDER``, else the embedder the store
    was filled with, else the local MiniLM model (shared per process). A store
    filled by one embedder refuses another (``engrain memory reembed`` moves it).
    ``synthesizer`` to an LLM when ``OPENAI_API_KEY``/``ANTHROPIC_API_KEY`` is
    set, else the offline extractive one. ``ttl`` (seconds) is the default
    lifetime of records (None: forever). ``half_life`` (seconds) sets how fast
    the recency part of the score fades.

    ``vector_search`` (:data:`VECTOR_SEARCH`; None: ``$ENGRAIN_VECTOR_SEARCH``, else
    ``"auto"``): ``"auto"`` searches with pgvector
    in SQL where the PostgreSQL server has it, else in-process; ``"pgvector"``
    demands it; ``"local"`` searches an in-process mirror on PostgreSQL too, as on
    SQLite: after the embedding only the rows it scores and the recall event are
    sent, for the mirror's memory (~1.5 kB a record) in each process; its graph is cached under
    ``$ENGRAIN_CACHE_DIR/graphs``. Either way the store is the same one.
    """

    def __init__(self, url: str | None = None, *, embedder: Embedder | str | None = None,
                 embedder_base_url: str | None = None, embedder_api_key: str | None = None,
                 synthesizer: Synthesizer | None = None, ttl: float | None = None, top_k: int = 5,
                 half_life: float = 30 * 86400.0, ann_threshold: int = ANN_THRESHOLD,
                 vector_search: str | None = None):
        from .._journal import default_url

        if url is not None and not isinstance(url, str):  # a Journal: use its database
            url = url.url
        self.url = url or default_url()
        vector_search = check_vector_search(vector_search)
        # Checked before the store opens: a refused argument leaves no connection behind.
        self.ttl = check_ttl(ttl)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise MemoryInputError(f"top_k must be a positive integer, not {top_k!r}")
        # Recall divides ages by it: 0 stopped every recall, NaN made every score NaN, a negative one overflowed.
        if isinstance(half_life, bool) or not isinstance(half_life, (int, float)) or not half_life > 0:
            raise MemoryInputError(f"half_life must be a positive number of seconds, not {half_life!r}")
        self.store = open_store(self.url)
        self.backend = self.store.backend
        try:
            #: Where recall searches vectors: ``"pgvector"`` (in SQL) or ``"local"`` (the in-process mirror).
            self.vector_search = vector_search_of(self.store, vector_search)
            if embedder is None and not os.environ.get("ENGRAIN_EMBEDDER"):
                bound = self.store.bound_embedder()
                if bound is not None and _embedders.is_spec(bound):
                    embedder = bound  # the store says what filled it
            self.embedder: Embedder = _embedders.resolve(embedder, base_url=embedder_base_url,
                                                         api_key=embedder_api_key)
            self.store.bind_embedder(self.embedder.name, self.embedder.dim)
        except Exception:
            self.store.close()
            raise
        self._pg = self.vector_search == "pgvector"
        self.synthesizer: Synthesizer = synthesizer or default_synthesizer()
        self.top_k = top_k
        self.half_life = half_life
        #: How recall ranks (the measured defaults; a benchmark may switch a part off).
        self.ranking = Ranking()
        self._qcache = QueryVectors()  # recent query vectors, per embedder object (:mod:`.query`)
        self._speakers = _voice.Speakers()  # per skill, its chat-log speakers (:mod:`.voice`)
        self._seen: tuple[int, int] | None = None  # the store's version() when the mirrors were last refreshed
        self._catching = threading.Lock()
        self._records = VectorIndex(self.store, "record", ann_threshold=ann_threshold)
        self._articles = VectorIndex(self.store, "article", ann_threshold=ann_threshold)

    def close(self) -> None:
        """Close the store's connection."""
        self.store.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- API -------------------------------------------------------------------

    @storage_errors
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

    @storage_errors
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
            rows.append(new_row(it["data"], it.get("hint"), it.get("skill"), it.get("metadata"), it.get("ttl"),
                                self.ttl, now, it.get("label")))
        if not rows:
            return []
        vecs = self.embedder.embed([r["content"] for r in rows])
        for r, v in zip(rows, vecs):
            r["embedding"] = v
        return [rid for rid, _ in self.store.add_records(rows, now, self.embedder.name)]

    @storage_errors
    def recall(self, query: str, skill: str | None = None, top_k: int | None = None,
               hint: float | None = None, *, label: str | None = None,
               where: dict[str, Any] | None = None, neighbours: bool = False) -> list[SearchResult]:
        """Records and articles most relevant to ``query``, best first.

        ``score = (match + context) / 2 + 0.20·cover + 0.05·recency + 0.05·importance + 0.05·label + 0.05·temporal``
        with ``match = 0.70·cos + w·text``, where ``cos`` is the cosine between the query and item embeddings (floored
        at 0), ``text`` the item's full-text rank (BM25 on SQLite, summed IDF of
        the matched words on PostgreSQL) divided by the best rank of this query
        (0 when the words do not match), ``w`` the query's text weight: 0.05 when
        its top 40 vector hits' cosines spread as an embedder's do on text it
        knows (std 0.05), growing as the inverse cube of that spread up to 0.5
        when they bunch (words the embedder does not know: codes, jargon, another
        language), and never below ``0.20 * min(1, (crowding / 0.4) ** 3)``, where
        ``crowding`` is the mean cosine between two of the skill's most recent 512
        records (high when they share a chat log's header, or a language the
        embedder does not know; see :mod:`engrain._memory.fusion`). A record all
        of whose sentences are questions keeps 0.6 of its match (it asks, the
        next turn answers). ``context`` is a record's
        passage score: the mean of the two best matches among the records of its
        skill stored within 4 of it, itself included (an article's: half its
        match; see :mod:`engrain._memory.ranking`). ``cover``, for the turns of a chat log (records headed
        by its speakers, ``"Melanie (1:56 pm on 8 May, 2023): ..."``), is the IDF-weighted share of the
        query's full-text words held by the turn or the turns within 3 of it: a question's words spread over
        a few turns (0 elsewhere). ``recency`` is ``0.5 ** (age / half_life)`` (age since the
        record was stored or the article last rewritten), ``importance`` the
        item's ``hint`` from :meth:`remember` (an article's is its most
        important source's; 0.5 when none was given) and ``label`` is 1 when the
        item's label equals ``label``, else the share of ``label``'s words in the
        item's label (an article's label is its title). ``temporal`` counts 1 when
        the query asks when a past event happened and the item's text states a
        time ("last Friday"), 1 more when it carries a date the query names
        (:mod:`engrain._memory.temporal`). Candidates are the union
        of the vector and full-text top hits (at least 40 of each) and the
        records beside the best of them. Full text matches any query word
        except words found in more than 1000 items: those carry almost no BM25
        weight and would make every search linear in the store's size.
        ``Memory.ranking`` (:class:`~engrain._memory.ranking.Ranking`) holds the
        weights, so a benchmark can switch a part off.

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
        bench/memory_quality.py's chats it raises all-evidence recall@10 from
        0.38 to 0.44 (any@10 holds); it is off by default because records that
        are independent facts have no meaningful neighbours.

        Every call leaves a recall event in
        the buffer, which the next :meth:`consolidate` uses to reconsolidate the
        articles returned.
        """
        query = check_str(query, "query")
        if skill is not None:
            check_str(skill, "skill", empty_ok=True)
        label = check_str(label, "label", empty_ok=True) or None
        importance = check_hint(hint, "recall")
        where = check_where(where)
        k = self.top_k if top_k is None else top_k
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise MemoryInputError(f"top_k must be a positive integer, not {top_k!r}")
        now = time.time()
        # Candidates: the best `fetch` of each half. At least SPREAD_DEPTH, so top_k=5 ranks like the first
        # five of top_k=10 (the vector search reads that many for the text weight anyway).
        fetch = max(4 * min(k, 1_000_000), SPREAD_DEPTH)  # a huge top_k must not overflow SQL's 64-bit LIMIT
        embedder = self.embedder

        fresh = None  # no in-process mirror on pgvector: skip the state round trip
        if not self._pg and self.backend == "sqlite":
            self._refresh()
        elif not self._pg:  # PostgreSQL searched in-process: the counters' and new rows' round trips run beside
            fresh = start_beside(self._refresh)
        # Full text and the metadata filter's ids need no query vector: they run on worker threads beside the
        # embedding (on SQLite, the full text beside the vector search too; on pgvector its hits' rows come in the
        # vector search's statement).
        text = start_beside(lambda: self.store.text_search(query, skill, now, fetch, where=where))
        allowed = (start_beside(lambda: self.store.filtered_ids(where, skill, now))
                   if where and not self._pg else None)
        try:
            rk = self.ranking
            # The vector half may ask in the voice of the chat-log speaker the question names (:mod:`.voice`).
            asked = (_voice.in_voice(query, lambda: self._speakers_of(skill, now)) if _voice.wanted(embedder, rk.voice)
                     else query)
            qv = self._qcache.get(embedder, asked)
            if qv is None:
                qv = self._qcache.put(embedder, asked, embed_queries(embedder, [asked])[0])
            if self._pg:
                # The full-text hits' rows come in the vector search's statement (their cosines need them):
                # the full text is done by now (it took less than the embedding), so nothing waits for it.
                text_hits = text.result()
                recs, arts, read = self.store.pg_vector_search_both(
                    qv, skill, now, fetch, where, [i for t, i, _ in text_hits if t == "record"])
                allow = None
            else:
                allow = allowed.result() if allowed is not None else None
                if fresh is not None:
                    fresh.result()
                recs = self._records.search(qv, fetch, skill, now, allow)
                arts = self._articles.search(qv, fetch, skill, now)
            if rk.text_weight is None:
                crowd = self.store.pg_crowding(skill, now) if self._pg else self._records.crowding(skill)
                crowd = _fusion.in_reference_units(crowd, *_cluster.null_documents(self.embedder))
                w_text = recall_text_weight((s for _, s in recs + arts), crowd,
                                            _cluster.null_spread(self.embedder) / _fusion.NULL_SPREAD_REF)
            else:
                w_text = rk.text_weight
        except BaseException:
            for side in (text, allowed, fresh):
                if side is not None:
                    settle(side)
            raise
        if not self._pg:
            text_hits, read = text.result(), None
        cands: dict[tuple[str, str], dict[str, float]] = {}
        for tier, hits in (("record", recs), ("article", arts)):
            for i, s in hits:
                cands[(tier, i)] = {"cos": s, "text": 0.0}
        best = max((r for _, _, r in text_hits), default=0.0)
        for tier, i, r in text_hits:
            cands.setdefault((tier, i), {"cos": None, "text": 0.0})["text"] = r / best if best > 0 else 0.0  # type: ignore[dict-item]
        if read is not None:  # the candidates' rows (and articles) come with the passage windows' round trip
            ids = [i for t, i in cands if t == "record"]
            read.plan(ids, [i for t, i in cands if t == "article"], ids)
        def around(ids: list[str], radius: int) -> tuple:
            if self._pg:
                return self.store.pg_around(ids, radius, now, where, read)
            return self._records.around(ids, radius, now, allow)

        _ranking.fill_cosines(cands, qv, around)
        windows = _ranking.add_context(cands, qv, w_text, rk, around, fetch)
        _ranking.add_cover(cands, windows, lambda ids: self.store.passage_words(ids, query, _voice.HEAD_CHARS),
                           lambda: self._speakers_of(skill, now), rk)
        prior = _temporal.prior(query, rk.when)
        cands = _ranking.prune(cands, w_text, rk.context, (4 if neighbours else 2) * k, prior.most if prior else 0.0)
        if read is None and self.backend != "sqlite":  # searched in-process: the rows scoring reads, in one trip
            read = self.store.pg_candidate_rows([i for t, i in cands if t == "record"],
                                                [i for t, i in cands if t == "article"])
        # Only the top k are returned (neighbours=True lends scores from the top 2k to any record: all of them).
        results = _ranking.score(self, cands, qv, label, now, where, w_text, rk.context, prior, rk.question,
                                 keep=None if neighbours else k,
                                 rows=read if read is not None else MirrorRows.of(self.store, self._records))
        results = _ranking.add_neighbours(self, results, k, now, where) if neighbours else results[:k]
        self.store.add_recall_event(skill, {
            "query": query, "label": label, "hint": importance, "where": where,
            "hits": [{"tier": r.tier, "id": r.id, "skill": r.skill, "score": round(r.score, 4)} for r in results],
        }, now)
        return results

    def _speakers_of(self, skill: str | None, now: float) -> frozenset[str]:
        """``skill``'s chat-log speakers (:func:`.voice.speakers_of` its newest records), read again when the
        vector mirror changed (SQLite) or after ``voice.KEEP_SECONDS`` (PostgreSQL, whose mirror, if any, cannot tell)."""
        if self.store.backend == "sqlite":  # the rows are only read when the mirror changed since
            return self._speakers.get(skill, self._records.state(), lambda: self.store.heads(
                _voice.HEAD_CHARS, self._records.recent(skill, _voice.SAMPLE)))
        return self._speakers.get(skill, int(now // _voice.KEEP_SECONDS), lambda: self.store.heads(
            _voice.HEAD_CHARS, skill=skill, newest=_voice.SAMPLE))

    def _refresh(self) -> None:
        """Bring the vector mirrors up to date (:func:`.mirrors.catch_up`), one thread at a time: a catch-up reads
        the store, then applies what it read, which another thread's must not come between."""
        with self._catching:
            self._seen = catch_up(self.store, self._records, self._articles, self._seen)

    @storage_errors
    def reembed(self, embedder: Embedder | str, *, base_url: str | None = None, api_key: str | None = None,
                batch_size: int = 256, progress: Any = None) -> dict[str, Any]:
        """Move this store to ``embedder`` (a model string or object): every record and article re-embedded.

        Staged and resumable (:mod:`engrain._memory.reembed`): recalls keep working
        on the old vectors until one transaction swaps the new ones in; after a
        crash, calling it again finishes the move. ``progress(done, total)`` is
        called after each batch. This memory then uses the new embedder. Returns
        counts (``records``, ``articles``, ``embedded``, ``resumed``) and ``from``/``to``.
        """
        from .reembed import reembed

        target = _embedders.resolve(embedder, base_url=base_url, api_key=api_key)
        out = reembed(self.store, target, batch_size=batch_size, progress=progress)
        self.embedder = target
        return out

    @storage_errors
    def consolidate(self, num_records: int | str | None = "all", method: str | None = "LIFO") -> ConsolidationSummary:
        """Process the buffer into articles (see :mod:`engrain._memory.consolidate`).

        ``num_records`` is how many buffer rows to take (``"all"`` for every
        row); ``method`` takes the newest (``"LIFO"``) or oldest (``"FIFO"``)
        first. None means the default of either (etchmem's signature).
        Each row is processed exactly once across calls and processes.
        Failures are listed in ``summary.errors``, never swallowed.
        """
        from . import consolidate as _c

        if num_records is None or num_records == "all":
            limit = None
        elif isinstance(num_records, int) and not isinstance(num_records, bool) and num_records > 0:
            # Past SQL's 64-bit LIMIT a count means every row; SQLite would refuse it as a type mismatch.
            limit = num_records if num_records < 2**62 else None
        else:
            raise MemoryInputError(f"num_records must be 'all' or a positive integer, not {num_records!r}")
        if method is None:
            method = "LIFO"
        if not isinstance(method, str) or method.upper() not in ("LIFO", "FIFO"):
            raise MemoryInputError(f"method must be 'LIFO' or 'FIFO', not {method!r}")
        return _c.run(self, limit, method.upper() == "LIFO")

    def export_dir(self) -> Path:
        """Where exports go: ``export/`` next to the SQLite file, else ``$ENGRAIN_HOME`` (default ``.engrain``)."""
        if self.store.path is not None:
            return self.store.path.parent / "export"
        return Path(os.environ.get("ENGRAIN_HOME") or ".engrain") / "export"

    @storage_errors
    def export(self) -> dict[str, Any]:
        """Write one JSON file per article (with its source records) under ``export/<UTC-timestamp>/``.

        Returns etchmem's ``{"export_dir": str, "count": int, "documents": [...]}``;
        :meth:`import_` on another memory loads either the folder or this dict.
        """
        return _transfer.export(self)

    @storage_errors
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

    @storage_errors
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

    @storage_errors
    def forget(self, id: str | None = None, *, skill: str | None = None) -> dict[str, int]:
        """Delete a record or an article (with its source records) by ``id``, or everything of ``skill``.

        An article built on a forgotten record is rewritten at once without it
        (deleted when it has no source left), so the fact disappears from
        recall. Returns counts ``records``, ``articles`` (deleted) and
        ``rewritten``.
        """
        return _edit.forget(self, id, skill)

    @storage_errors
    def update(self, id: str, data: Any, *, hint: float | None = None, label: str | None = None,
               metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """Replace the content of a record (re-embedded; its article is rewritten) or the text of an article.

        ``hint``, ``label`` and ``metadata`` replace the stored ones when given.
        """
        return _edit.update(self, id, data, hint, label, metadata)

    @storage_errors
    def stats(self) -> dict[str, Any]:
        """Counts per tier: etchmem's ``relational``, ``buffer``, ``injected`` and engrain's names.

        ``records`` = ``relational`` (live records), ``articles`` = ``injected``,
        ``buffer``; then consolidation counters, backend, embedder and vector search.
        """
        st = self.store.state()
        out: dict[str, Any] = self.store.counts(time.time())
        out = {"relational": out["records"], "buffer": out["buffer"], "injected": out["articles"], **out}
        out.update(consolidations=st.get("consolidations", 0), cursor=st.get("cursor", 0), backend=self.backend,
                   embedder=self.embedder.name, vector_search="pgvector" if self._pg else (
                       "usearch" if out["records"] >= self._records.ann_threshold else "numpy exact"))
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
