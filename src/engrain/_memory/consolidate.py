"""Consolidation: turn the buffer into articles, once.

One pass claims buffer rows (oldest or newest first, up to ``num_records``),
then per skill, never mixing skills:

1. deposits whose record is gone (TTL) or already in an article are dropped;
2. recall events mark the articles they returned as *recalled*, and carry the
   query that found them;
3. each new record joins the closest article of its skill when related (the
   cut of :mod:`.cluster`, derived from the embedder; a recalled article also
   accepts records related to the query that recalled it); the rest are
   grouped by average linkage with the same cut, a pronoun-led record ("It
   opened in 1889") leaning on the record deposited before it;
4. every touched article is rewritten from its live sources plus the new ones
   (*reconsolidated* when it had been recalled, *updated* otherwise), every new
   cluster forms an article, and an article that ends up a near-duplicate of
   another of its skill absorbs it (the other is *superseded* and removed).

Everything is written in one transaction that also deletes the claimed buffer
rows, so a crash leaves the buffer as it was and a finished pass never sees
the same row again. A cluster whose synthesis fails is reported in ``errors``
and its rows go back to the buffer for the next pass.

The claim on buffer rows is a lease: a thread renews it every
:data:`LEASE_RENEW` seconds while the pass runs, and a claim not renewed for
:data:`LEASE` seconds is free for the next consolidator. A consolidator that
dies mid-pass (killed, out of memory) so holds its rows for seconds, not the
length of the longest imaginable pass.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol

import numpy as np

from . import cluster as _cluster
from .embed import Embedder, embed_queries
from .items import Article, BufferItem, Record
from .store import MemoryStore
from .synth import Synthesizer


class Memory(Protocol):
    """What a pass uses of :class:`~engrain.Memory` (declared here so this module does not import the facade)."""

    store: MemoryStore
    embedder: Embedder
    synthesizer: Synthesizer

#: Cosine at which two articles of a skill are the same knowledge and merge.
MERGE = 0.9
#: A claim not renewed for this long (seconds) is free: its consolidator died.
LEASE = 10.0
#: How often a running pass renews its claim (seconds).
LEASE_RENEW = 2.0


@dataclass
class ConsolidationSummary(Mapping[str, Any]):
    """What one ``consolidate()`` did; also a read-only mapping (``dict(summary)``, ``summary["formed"]``).

    etchmem's keys (``formed, reconsolidated, dropped, kept, flushed,
    superseded``) come first, then engrain's.

    ``formed``: new articles; ``reconsolidated``: recalled articles rewritten
    with fresh records; ``updated``: other articles that took in new records;
    ``superseded``: articles merged into another and removed; ``removed``:
    articles whose every source record expired; ``expired``: records deleted
    because their TTL passed (articles built on them are rewritten); ``dropped``:
    deposits discarded (their record expired, was forgotten or is
    already in an article); ``flushed``: buffer rows processed and removed;
    ``kept``: rows left in the buffer (beyond ``num_records``, or of a failed
    cluster); ``errors``: one message per failure; ``synthesizer``: which
    synthesizer wrote the articles (says when no LLM was used).
    """

    formed: int = 0
    reconsolidated: int = 0
    dropped: int = 0
    kept: int = 0
    flushed: int = 0
    superseded: int = 0
    updated: int = 0
    removed: int = 0
    expired: int = 0
    errors: list[str] = field(default_factory=list)
    synthesizer: str = ""
    articles: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view."""
        return asdict(self)

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    @classmethod
    def _keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def _unit(v: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(v))
    return (v / n).astype(np.float32) if n > 0 else v.astype(np.float32)


@dataclass
class _Outcome:
    """One skill's writes and counts, merged into the pass only if the whole skill succeeded."""

    upserts: list[Article] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    assign: dict[str, str] = field(default_factory=dict)
    expect: dict[str, int] = field(default_factory=dict)
    read: dict[str, str] = field(default_factory=dict)  # record id -> digest of the content an article was written from
    formed: int = 0
    reconsolidated: int = 0
    updated: int = 0
    superseded: int = 0
    removed: int = 0


class _Skill:
    """Working state of one skill during a pass."""

    def __init__(self) -> None:
        self.deposits: list[tuple[BufferItem, Record]] = []
        self.recalled: dict[str, list[str]] = {}  # article id -> queries that returned it
        self.seqs: list[int] = []
        self.stale: set[str] = set()  # articles with expired sources
        self.gone: set[str] = set()


def run(mem: Memory, num_records: int | None, newest_first: bool) -> ConsolidationSummary:
    """One consolidation pass over ``mem``'s buffer."""
    store, synth = mem.store, mem.synthesizer
    summary = ConsolidationSummary(synthesizer=synth.name)
    now = time.time()
    expired = store.expired(now)
    gone = {rid for _, rid, _ in expired}
    token = uuid.uuid4().hex
    items = store.claim(token, num_records, newest_first, now, LEASE)
    lease = _Lease(store, token) if items else None
    try:
        return _pass(mem, summary, token, items, expired, now)
    finally:
        if lease is not None:
            lease.stop()


class _Lease:
    """Renews a pass's claim every :data:`LEASE_RENEW` seconds until stopped."""

    def __init__(self, store: MemoryStore, token: str):
        self._store, self._token = store, token
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engrain-memory-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(LEASE_RENEW):
            try:
                self._store.renew_claim(self._token, time.time())
            except Exception:  # a closed store or a lost connection: the commit will say what went wrong
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def citing(mem: Memory, ids: list[str], homes: set[str] | None = None) -> set[str]:
    """Ids of the articles whose sources hold any of the record ids ``ids``, plus ``homes``."""
    st, want = mem.store, set(ids)
    out = set(homes or ())
    for i in range(0, len(ids), 50):
        # A record id is quoted in the sources' JSON: the LIKE narrows the read, the JSON decides.
        chunk = ids[i:i + 50]
        cond = " OR ".join("sources LIKE ?" for _ in chunk)
        with st._lock:
            rows = st._x(f"SELECT id, sources FROM engrain_mem_articles WHERE {cond}",
                         [f'%"{r}"%' for r in chunk]).fetchall()
        for aid, srcs in rows:
            if want.intersection(json.loads(srcs)):
                out.add(aid)
    return out


def _pass(mem: Memory, summary: ConsolidationSummary, token: str, items: list[BufferItem],
          expired: list[tuple[int, str, str | None]], now: float) -> ConsolidationSummary:
    store = mem.store
    gone = {rid for _, rid, _ in expired}
    recs = store.records([i.ref for i in items if i.kind == "deposit" and i.ref])
    recs = {k: r for k, r in recs.items() if k not in gone}
    skills: dict[str, _Skill] = {}
    # Articles built on expired records are rewritten without them (or removed): their homes, and the
    # articles that cite one homed elsewhere (an import's), which would otherwise keep the text.
    stale = citing(mem, sorted(gone), {aid for _, _, aid in expired if aid}) if gone else set()
    for a in store.articles(ids=sorted(stale)):
        skills.setdefault(a.skill, _Skill()).stale.add(a.id)
    done: list[int] = []
    for it in items:
        if it.kind == "deposit":
            r = recs.get(it.ref or "")
            if r is None or r.article_id is not None:
                summary.dropped += 1
                done.append(it.seq)
                continue
            sk = skills.setdefault(r.skill, _Skill())
            sk.deposits.append((it, r))
            sk.seqs.append(it.seq)
        else:
            hits = [h for h in it.data.get("hits", []) if h.get("tier") == "article"]
            for h in hits:
                sk = skills.setdefault(h.get("skill") or "", _Skill())  # a hit's skill None is the "" skill
                sk.recalled.setdefault(h["id"], []).append(it.data.get("query", ""))
            done.append(it.seq)  # a recall event is signal for this pass only

    upserts: list[Article] = []
    deletes: list[str] = []
    assign: dict[str, str] = {}
    expect: dict[str, int] = {}
    read: dict[str, str] = {}
    kept_alive: set[str] = set()
    for skill, sk in skills.items():
        sk.gone = gone
        part = _Outcome()
        try:
            _one_skill(mem, skill, sk, now, part)
        except Exception as e:  # one skill's failure must not lose the others' work
            summary.errors.append(f"skill {skill!r}: {type(e).__name__}: {e}")
            store.release(token, sk.seqs)
            kept_alive |= sk.stale  # their expired records stay until the article is rewritten
            continue
        done.extend(sk.seqs)
        upserts += part.upserts
        deletes += part.deletes
        assign.update(part.assign)
        expect.update(part.expect)
        read.update(part.read)
        for k in ("formed", "reconsolidated", "updated", "superseded", "removed"):
            setattr(summary, k, getattr(summary, k) + getattr(part, k))
        summary.articles += [a.id for a in part.upserts]
    purge = [seq for seq, _, aid in expired if aid not in kept_alive]
    try:
        purged = store.commit(token, done, upserts, deletes, assign, expect, purge, read)
    except Exception as e:
        summary.errors.append(f"commit: {type(e).__name__}: {e}")
        store.release(token, [i.seq for i in items])
        summary.formed = summary.reconsolidated = summary.updated = summary.superseded = summary.dropped = 0
        summary.expired = summary.removed = 0
        summary.articles = []
    else:
        summary.flushed = len(done)
        summary.expired = purged
    summary.kept = store.buffer_size()
    return summary


def _one_skill(mem: Memory, skill: str, sk: _Skill, now: float, out: _Outcome) -> None:
    arts = {a.id: a for a in mem.store.articles(skill=skill)}
    out.expect.update((a.id, a.version) for a in arts.values())
    recalled = {aid: qs for aid, qs in sk.recalled.items() if aid in arts}
    qvecs: dict[str, np.ndarray] = {}
    if recalled:
        queries = sorted({q for qs in recalled.values() for q in qs if q})
        qvecs = dict(zip(queries, embed_queries(mem.embedder, queries))) if queries else {}
    art_ids = list(arts)
    art_mat = np.stack([arts[a].embedding for a in art_ids]) if art_ids else None

    def write(records: list[Record], previous: Article | None, queries: list[str]) -> Article:
        # The commit checks these records still hold this text: one updated or forgotten meanwhile (its own
        # rewrite saw no article yet) must not come back inside the article written from it.
        out.read.update((r.id, hashlib.sha256(r.content.encode("utf-8")).hexdigest()) for r in records)
        return write_article(mem, skill, records, previous, now, queries)

    cut = _cluster.related_cut(mem.embedder)
    # A recalled query's cosine is held to the query side's own cut, moved onto the record cut's scale.
    q_shift = cut - _cluster.related_cut(mem.embedder, query=True) if qvecs else 0.0
    deps = [r for _, r in sorted(sk.deposits, key=lambda d: (d[1].created, d[1].seq))]
    # Each deposit's predecessor in its skill: the one before it in this pass, or the stored one
    # before the first (a pronoun-led record may continue a fact consolidated last time).
    before = mem.store.previous_record(skill, deps[0].seq) if deps and _cluster.continues(deps[0].content) else None
    chain = ([before] if before is not None else []) + deps
    ctx = _cluster.context_vectors([r.content for r in chain], np.stack([r.embedding for r in chain]),
                                   [r.created for r in chain], [None] + list(range(len(chain) - 1))
                                   )[len(chain) - len(deps):] if deps else np.zeros((0, 0), dtype=np.float32)
    home = {before.id: before.article_id} if before is not None and before.article_id in arts else {}

    joined: dict[str, list[Record]] = {}
    loose: list[int] = []
    for i, r in enumerate(deps):
        v = ctx[i]
        best, best_sim = None, -1.0
        if art_mat is not None:
            sims = art_mat @ v
            for j, aid in enumerate(art_ids):
                s = float(sims[j])
                if aid in recalled:
                    s = max(s, *(float(qvecs[q] @ v) + q_shift for q in recalled[aid] if q in qvecs), -1.0)
                if s >= cut and s > best_sim:
                    best, best_sim = aid, s
        if best is None and i == 0 and before is not None and _cluster.continues(r.content):
            best = home.get(before.id)  # "It ..." right after a fact already in an article
        if best is None:
            loose.append(i)
        else:
            joined.setdefault(best, []).append(r)

    clusters = [[deps[loose[j]] for j in g]
                for g in _cluster.cluster(ctx[loose], cut, [deps[j].hint for j in loose])] if loose else []

    written: list[Article] = []
    for aid, new in joined.items():
        old = arts[aid]
        sources = [s for s in old.sources if s not in {r.id for r in new} and s not in sk.gone]
        live = list(mem.store.records(sources).values())
        art = write(live + new, old, recalled.get(aid, []))
        written.append(art)
        if aid in recalled:
            out.reconsolidated += 1
        else:
            out.updated += 1
    for group in clusters:
        written.append(write(group, None, []))
        out.formed += 1
    for aid in sorted(sk.stale - set(joined)):
        old = arts.get(aid)
        if old is None:
            continue
        live = list(mem.store.records([s for s in old.sources if s not in sk.gone]).values())
        if live:
            written.append(write(live, old, recalled.pop(aid, [])))
            out.updated += 1
        else:
            out.deletes.append(aid)
            out.removed += 1
            arts.pop(aid)
            recalled.pop(aid, None)
    for aid, qs in recalled.items():  # recalled without fresh signal: only the recall is noted
        if aid not in joined:
            old = arts[aid]
            old.metadata = _recall_meta(old.metadata, qs, now)
            written.append(old)

    # Merge near-duplicates: the newest article absorbs the older one's sources.
    alive = {a.id: a for a in arts.values()}
    alive.update({a.id: a for a in written})
    touched = {a.id for a in written}
    for a in sorted(written, key=lambda a: -a.updated):
        if a.id not in alive:
            continue
        a = alive[a.id]
        for other in list(alive.values()):
            if other.id == a.id or float(other.embedding @ a.embedding) < MERGE:
                continue
            srcs = mem.store.records([x for x in dict.fromkeys(a.sources + other.sources) if x not in sk.gone])
            a = write(list(srcs.values()), a, [])
            alive[a.id] = a
            del alive[other.id]
            touched.discard(other.id)
            touched.add(a.id)
            out.deletes.append(other.id)
            out.superseded += 1
    out.expect = {aid: v for aid, v in out.expect.items() if aid in touched or aid in out.deletes}
    for aid in touched:
        art = alive[aid]
        out.upserts.append(art)
        for rid in art.sources:
            out.assign[rid] = aid


def _recall_meta(meta: dict[str, Any], queries: list[str], now: float) -> dict[str, Any]:
    m = dict(meta)
    if queries:
        m["recalls"] = int(m.get("recalls", 0)) + len(queries)
        m["last_recalled"] = now
        m["recent_queries"] = (list(m.get("recent_queries", [])) + queries)[-5:]
    return m


def write_article(mem: Memory, skill: str, records: list[Record], previous: Article | None, now: float,
           queries: list[str]) -> Article:
    title, content = mem.synthesizer.synthesize(skill, records, previous)
    # The article's vector leans on its sources' centre (robust to long texts the
    # model truncates) and on its own wording (what a reader will search for).
    text_vec = mem.embedder.embed([f"{title}\n{content}"])[0]
    centre = _unit(np.mean([r.embedding for r in records], axis=0))
    vec = _unit(centre + text_vec)
    meta = _recall_meta(previous.metadata if previous else {}, queries, now)
    return Article(
        seq=0, id=previous.id if previous else "art_" + uuid.uuid4().hex[:20], skill=skill, title=title,
        content=content, sources=[r.id for r in sorted(records, key=lambda r: (r.created, r.seq))], metadata=meta,
        created=previous.created if previous else now, updated=now,
        version=(previous.version + 1) if previous else 1, synthesizer=mem.synthesizer.name, embedding=vec,
        importance=max((r.importance for r in records if r.importance is not None), default=None))
