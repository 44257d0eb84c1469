"""How :meth:`Memory.recall <engrain._memory.api.Memory.recall>` orders its candidates.

An item's *match* is ``0.70·cos + w·text`` (``w`` per query, :mod:`.fusion`).
Records are also scored as passages: a record's *context* is the mean of the
two best matches among the records of its skill stored within ``radius``
(4) of it, itself included (a missing one counts 0), and adds to its score
with weight ``gain`` (1.0). A turn that answers the question beside it, or a
fact stated over three messages, then ranks with its passage; a lone good
match among unrelated records keeps its own score plus half of it. Articles
stand alone (their context is half their match). This is the late
interaction of session-level retrieval, without sessions: any store keeps
its records in order per skill, and a window of turns stands for the part of
a session around them. The sum is divided by ``1 + gain``, so scores stay on
a match's scale and the priors (recency, importance, label, and the temporal
one of :mod:`.temporal`) weigh what they did.

Measured on bench/memory_quality.py (default embedder, all sets in one run),
recall without the context against with it: LoCoMo's development
conversations any@5 0.624 -> 0.655 and session-hit@1 0.613 -> 0.633; the
chit-chat set any@5 0.356 -> 0.396 (all-evidence@10 0.265 -> 0.379); the FAQ
sets, whose answers stand alone, 0.516 -> 0.524 (Swedish) and 0.815 -> 0.813
(English). Windows are read around the best candidates only, and candidates
that cannot reach the top once the priors are added are never read (:func:`prune`).

A record all of whose sentences are questions ("What do you do for work
now?") keeps ``QUESTION_KEEP`` (0.6) of its own match: it often repeats a
question's words best of all, yet holds no answer, while the turn after it
(which its match still lends context to) does. On the chat set, whose
questions are answered in the owner's next turn, any@5 0.406 -> 0.457 and
session-hit@1 0.592 -> 0.611; LoCoMo (where such turns are 0.6% of all) and
the FAQ sets, which hold no such records, rank exactly as before.

:class:`Ranking` holds the knobs, so a benchmark can measure the ranking with
a part switched off (``Memory.ranking = Ranking(context=0)``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .filters import matches
from .temporal import Prior, body
from .voice import speaker

#: Weight of the cosine in an item's match (the text weight is per query, :mod:`.fusion`).
W_VECTOR = 0.70
#: Weight of a record's context (the mean of the two best matches within ``radius`` of it).
CONTEXT_GAIN = 1.0
#: Records either side of a record, in its skill's storage order, that make its context.
CONTEXT_RADIUS = 4
#: How many of the best matches in a window are averaged into the context.
CONTEXT_TOP = 2
#: Weights of the priors in the recall score (see :meth:`Memory.recall`).
W_RECENCY, W_LABEL, W_IMPORTANCE = 0.05, 0.05, 0.05
#: Weight of the temporal prior: a question asking when a past event happened lifts the candidates whose text
#: states a time, one naming a date those that carry it (:mod:`.temporal`); the scale of the other priors.
W_WHEN = 0.05
#: Importance of items deposited without a ``hint`` (the middle of etchmem's 0..1 scale).
DEFAULT_IMPORTANCE = 0.5
#: Weight of a chat-log turn's passage words (:func:`add_cover`): the IDF share of the query's words found in it
#: or in the turns within ``COVER_RADIUS`` of it.
W_COVER = 0.20
COVER_RADIUS = 3
#: Least share of the records read around the candidates that must be the chat log's turns for passage words.
COVER_TURNS = 0.5
#: Share of its own match a record keeps when all it says is questions (:func:`only_asks`).
QUESTION_KEEP = 0.6
#: Sentence ends: the split :func:`only_asks` reads a record's sentences by.
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
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
    ``source`` is etchmem's name for the same facts.
    """

    score: float
    content: str
    tier: str
    id: str
    skill: str | None
    metadata: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def source(self) -> str:
        """etchmem's ``SearchResult.source``: ``"relational"`` a record, ``"injected"`` an article, ``"blended"``
        an article that records of its own also matched (``provenance["via"]``).

        Derived from ``tier`` and ``provenance`` rather than stored, so it cannot disagree with them; etchmem
        blends an article with a raw hit of the same id, which in engrain is a record folded into it.
        """
        if self.tier != "article":
            return "relational"
        return "blended" if self.provenance.get("via") else "injected"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view."""
        return asdict(self)


def only_asks(text: str) -> bool:
    """Whether every sentence of ``text`` (past a chat-log header) is a question ("What do you do for fun?")."""
    sentences = [x for x in _SENTENCE.split(body(text).strip()) if x]
    return bool(sentences) and all(x.endswith("?") for x in sentences)


def _words(text: str) -> set[str]:
    return {w for w in "".join(c.lower() if c.isalnum() else " " for c in text).split() if w}


@dataclass(frozen=True, slots=True)
class Ranking:
    """Knobs of recall's ranking (defaults: the measured ones).

    ``text_weight`` None sets the full-text weight per query from the spread of
    the cosines (:func:`.fusion.text_weight`); a number fixes it. ``context`` is
    the weight of a record's passage context (0 turns it off) and ``radius``
    how many records either side make it. ``when`` is the weight of the
    temporal prior (:mod:`.temporal`; 0 turns it off). ``question`` is the
    share of its own match a record keeps when all it says is questions
    (:func:`only_asks`; 1 turns that off). ``voice``: whether the vector half
    asks a question about a chat-log speaker in that speaker's voice
    (:mod:`.voice`); None leaves it to the embedder (its ``speaker_voice``).
    ``cover`` is the weight of a chat-log turn's passage words and
    ``cover_radius`` the turns either side that make its passage (:func:`add_cover`; 0 turns it off).
    """

    text_weight: float | None = None
    context: float = CONTEXT_GAIN
    radius: int = CONTEXT_RADIUS
    when: float = W_WHEN
    question: float = QUESTION_KEEP
    voice: bool | None = None
    cover: float = W_COVER
    cover_radius: int = COVER_RADIUS


def window_context(groups: np.ndarray, ordinals: np.ndarray, match: np.ndarray, radius: int,
                   top: int = CONTEXT_TOP) -> np.ndarray:
    """Per row: the mean of the ``top`` best ``match`` values among rows of its group within ``radius`` ordinals.

    Rows absent from the arrays count 0 (``top`` values are averaged even when
    a window holds fewer rows), so a lone row gets ``match / top``.
    """
    n = len(match)
    out = np.zeros(n, dtype=np.float64)
    if n == 0:
        return out
    order = np.lexsort((ordinals, groups))
    g, o, m = groups[order], ordinals[order], match[order].astype(np.float64)
    # Ordinals are distinct within a group, so a window is at most `radius` rows either side in this order.
    window = np.zeros((n, 2 * radius + 1), dtype=np.float64)
    window[:, 0] = m
    for d in range(1, radius + 1):
        if d >= n:
            break
        near = (g[d:] == g[:-d]) & (o[d:] - o[:-d] <= radius)
        window[d:, d] = np.where(near, m[:-d], 0.0)  # the row d places before
        window[:-d, radius + d] = np.where(near, m[d:], 0.0)  # the row d places after
    best = -np.partition(-window, top - 1, axis=1)[:, :top] if window.shape[1] > top else window
    out[order] = best.sum(axis=1) / top
    return out


def ordinals_from_runs(runs: Sequence[Sequence[tuple[str, int]]], radius: int) -> dict[tuple[str, int], int]:
    """Ordinals for rows known only as runs of consecutive rows of a skill (``(skill, seq)``, in order).

    Two rows are one apart when some run holds them side by side; rows no run
    joins are put ``radius + 1`` apart (at least one unseen row lies between).
    """
    linked: set[tuple[tuple[str, int], tuple[str, int]]] = set()
    rows: set[tuple[str, int]] = set()
    for run in runs:
        rows.update(run)
        linked.update(zip(run, run[1:]))
    out: dict[tuple[str, int], int] = {}
    prev: tuple[str, int] | None = None
    ordinal = 0
    for row in sorted(rows):
        if prev is not None:
            ordinal += 1 if (prev, row) in linked else radius + 1
        out[row] = ordinal
        prev = row
    return out


def fill_cosines(cands: dict[tuple[str, str], dict[str, Any]], qv: np.ndarray, around: Any) -> None:
    """Cosines of the record candidates only full text found (``around(ids, 0)``: their own vectors)."""
    missing = [i for (t, i), c in cands.items() if t == "record" and c["cos"] is None]
    if missing:
        ids, _, _, vecs = around(missing, 0)
        for i, c in zip(ids, (vecs @ qv).tolist() if len(ids) else []):
            cands[("record", i)]["cos"] = c


def add_context(cands: dict[tuple[str, str], dict[str, Any]], qv: np.ndarray, w_text: float, ranking: Ranking,
                around: Any, keep: int) -> tuple[list[str], np.ndarray, np.ndarray] | None:
    """Give record candidates their ``ctx`` (see the module docstring), adding neighbours worth ranking.

    Windows are read around the best ``keep // 2`` record candidates by match
    (on the bench's four sets, the best 10 already give the same rankings as
    all of them: a passage far from every good match does not reach the top).
    ``around(ids, radius)`` returns ``(ids, groups, ordinals, vectors)`` of the
    given records and the live records of their skills within ``radius`` of
    them. Neighbours that are not candidates join ``cands`` when their score
    (match plus context) is among the best ``keep``; the rest only lend their
    match to the contexts of others. Candidates outside every window stand alone.
    Returns the windows' ``(ids, groups, ordinals)`` (None when none was read): :func:`add_cover` reads its
    passages from them.
    """
    rec = [(_match_of(c, w_text), i) for (t, i), c in cands.items() if t == "record" and c["cos"] is not None]
    if not rec or ranking.context <= 0:
        return None
    seeds = [i for _, i in sorted(rec, reverse=True)[: max(1, keep // 2)]]
    ids, groups, ordinals, vecs = around(seeds, ranking.radius)
    if not len(ids):
        return None
    cos = vecs @ qv
    text = np.array([cands[("record", i)]["text"] if ("record", i) in cands else 0.0 for i in ids])
    match = W_VECTOR * np.maximum(cos, 0.0) + w_text * text
    ctx = window_context(np.asarray(groups), np.asarray(ordinals), match, ranking.radius)
    total = match + ranking.context * ctx
    bar = float(np.sort(total)[::-1][min(keep, len(total)) - 1])
    # Python floats once (the same values float() of each element gives), not a numpy scalar per row.
    for i, t, cs, cx in zip(ids, total.tolist(), cos.tolist(), ctx.tolist()):
        c = cands.get(("record", i))
        if c is None:
            if t < bar:
                continue
            c = cands[("record", i)] = {"cos": cs, "text": 0.0}
        c["ctx"] = cx
    return ids, np.asarray(groups), np.asarray(ordinals)


def add_cover(cands: dict[tuple[str, str], dict[str, Any]], windows: tuple[list[str], Any, Any] | None,
              words_of: Any, speakers: Any, ranking: Ranking) -> None:
    """Give record candidates that are chat-log turns their passage words (``wcover``, added to their score).

    A question's words are often spread over a few turns (one turn names the camping trip, the next what
    was painted after it), so no one turn matches them well, and the passage context, which averages the
    turns' own matches, does not add them up. A turn's *cover* is the IDF-weighted share of the query's
    words (as full text matches them: stemmed) held by it or by the turns within ``cover_radius`` of it,
    and ``ranking.cover`` times it adds to the turn's score. Only records headed by one of the chat log's
    speakers (:mod:`.voice`) get it or lend their words, when such turns are at least ``COVER_TURNS`` of the
    records read around the candidates, and only for queries of at least two such words:
    records that are independent facts (a FAQ's answers, notes) have no passage whose words belong
    together. ``words_of(ids)`` is :meth:`~.text.TextSearch.passage_words` for the query, ``speakers()``
    the chat log's speakers; ``windows`` what :func:`add_context` read (a candidate outside them is a
    passage of one).
    """
    if ranking.cover <= 0.0:
        return
    rec = [i for (t, i), c in cands.items() if t == "record" and c["cos"] is not None]
    if not rec:
        return
    names = speakers()
    if not names:
        return
    ids, groups, ordinals = windows if windows is not None else ([], np.zeros(0), np.zeros(0))
    weights, held = words_of(sorted(set(rec) | set(ids)))
    total = sum(weights.values())
    if len(weights) < 2 or total <= 0.0:
        return
    turn = {i: words for i, (head, words) in held.items() if speaker(head) in names}
    if len(turn) < COVER_TURNS * len(held):  # a few lines headed "Teacher:" in a joke are no chat log
        return
    place = dict(zip(ids, zip(groups.tolist(), ordinals.tolist())))
    at = {p: i for i, p in place.items() if i in turn}
    r = ranking.cover_radius
    for i in rec:
        words = turn.get(i)
        if words is None:
            continue
        if i in place:
            g, o = place[i]
            words = words.union(*(turn[j] for d in range(-r, r + 1) if d and (j := at.get((g, o + d))) is not None))
        cands[("record", i)]["wcover"] = ranking.cover * sum(weights[t] for t in words) / total


def prune(cands: dict[tuple[str, str], dict[str, Any]], w_text: float, context: float, keep: int,
          slack: float = 0.0) -> dict[tuple[str, str], dict[str, Any]]:
    """The candidates that can still rank among the best ``keep`` once the priors are added.

    Match and context are known here; recency, importance and label add at most
    ``W_RECENCY + W_IMPORTANCE + W_LABEL`` (and ``slack``: the most this query's
    temporal prior adds). A candidate below the ``keep``-th best
    by more than that never reaches the top, so its row is not read (a recall
    reads ~15 rows instead of ~80). Items without a cosine yet are kept.
    """
    base: dict[tuple[str, str], float] = {}
    for key, c in cands.items():
        if c["cos"] is not None:
            base[key] = _base(c, w_text, context)
    if len(base) <= keep:
        return cands
    bar = sorted(base.values(), reverse=True)[keep - 1] - (W_RECENCY + W_IMPORTANCE + W_LABEL + slack)
    return {key: c for key, c in cands.items() if key not in base or base[key] >= bar}


def _match_of(c: dict[str, Any], w_text: float) -> float:
    return W_VECTOR * max(c["cos"], 0.0) + w_text * c["text"]


def _base(c: dict[str, Any], w_text: float, context: float) -> float:
    """Match and context on a match's scale: a candidate's score before the priors (as :func:`score` adds it)."""
    match = _match_of(c, w_text)
    return (match + context * c.get("ctx", match / CONTEXT_TOP)) / (1.0 + context) + c.get("wcover", 0.0)


def _fetch_best(mem: Any, cands: dict[tuple[str, str], dict[str, Any]], qv: Any, label: str | None, now: float,
                w_text: float, context: float, prior: Prior | None, keep: int, vectors: bool,
                question: float = QUESTION_KEEP, rows: Any = None) -> tuple[dict[str, Any], dict[str, float]]:
    """The record candidates' rows, leaving out those that cannot rank among the best ``keep``.

    :func:`prune` had to bound the priors by their most (0.15 and the temporal
    one's): of ~60 candidates it leaves, ~45 are read only to be ranked below the
    top. Here the best ``keep`` by match and context are read first and scored in
    full; the ``keep``-th of those scores is a floor the top ``keep`` never falls
    below, and a candidate whose match and context plus the most its priors can
    add stays under it is not read (~15 rows instead of ~60). Records folded into
    an article are always read (their article's score and ``via`` need them):
    on a store with articles, one narrow query says which those are. ``rows``: where the rows come from
    (the store, or on PostgreSQL the rows the recall read already, :class:`.pgrows.RowPool`: on a store
    searched in-process, every candidate's, read in one round trip, so the floor only saves scoring).
    """
    read = (rows if rows is not None else mem.store).records
    ids = [i for t, i in cands if t == "record"]
    known = sorted(((_base(c, w_text, context), i) for (t, i), c in cands.items()
                    if t == "record" and c["cos"] is not None), key=lambda x: -x[0])
    if len(known) <= keep:
        return read(ids, vectors=vectors), {}
    tail = [i for _, i in known[keep:]]
    if mem.store.backend != "sqlite" and tail:  # which of the tail are folded, and the rows to read now, at once
        in_tail = set(tail)
        recs = read([i for i in ids if i not in in_tail], vectors=vectors, folded_of=tail)
        later = in_tail - recs.keys()
    else:  # SQLite: a record can only be folded once its mirror holds an article
        folded = mem.store.folded_records(tail) if len(getattr(mem, "_articles", ())) > 0 else set()
        later = set(tail) - folded
        recs = read([i for i in ids if i not in later], vectors=vectors)
    words = _words(label) if label else None
    done = {r.id: item_score(mem, r, cands[("record", r.id)], label, now, w_text, context, prior, qv, "record",
                             question, words)
            for r in recs.values() if r.article_id is None and (r.expires is None or r.expires > now)}
    own = sorted(done.values(), reverse=True)
    if len(own) < keep:
        recs.update(read([i for i in ids if i in later], vectors=vectors))
        return recs, done
    # Recency and importance add at most their weights; the label its weight when one was asked; the temporal
    # prior its most. A margin keeps rounding (scores are rounded to 6 places) from ever tying across the floor.
    most = W_RECENCY + W_IMPORTANCE + (W_LABEL if label else 0.0) + (prior.most if prior else 0.0) + 1e-5
    floor = own[keep - 1]
    recs.update(read([i for b, i in known[keep:] if i in later and b + most >= floor], vectors=vectors))
    return recs, done


def item_score(mem: Any, item: Any, c: dict[str, Any], label: str | None, now: float, w_text: float, context: float,
               prior: Prior | None, qv: Any = None, tier: str = "record", question: float = QUESTION_KEEP,
               label_words: set[str] | None = None) -> float:
    """An item's recall score (see :meth:`Memory.recall`) from its candidate entry ``c`` and its row
    (``label_words``: ``label``'s words, when a caller scoring many items has them already)."""
    cos = c["cos"] if c["cos"] is not None else float(item.embedding @ qv)
    born = item.created if tier == "record" else item.updated
    recency = 0.5 ** (max(0.0, now - born) / mem.half_life)
    item_label = item.hint if tier == "record" else item.title
    lab = 0.0
    if label:
        if label_words is None:
            label_words = _words(label)
        lab = 1.0 if item_label.strip().lower() == label.strip().lower() else (
            len(label_words & _words(item_label)) / len(label_words) if label_words else 0.0)
    imp = DEFAULT_IMPORTANCE if item.importance is None else item.importance
    match = W_VECTOR * max(cos, 0.0) + w_text * c["text"]
    if tier == "record" and question < 1.0 and only_asks(item.content):
        match *= question  # it asks, it does not tell: its answer (in its context) should outrank it
    # Outside any window (articles, or context off): the item is its own passage, half its match.
    ctx = c.get("ctx", match / CONTEXT_TOP)
    # Divided back to a match's scale, so the priors weigh what they did against it.
    out = ((match + context * ctx) / (1.0 + context) + c.get("wcover", 0.0) + W_RECENCY * recency + W_LABEL * lab
           + W_IMPORTANCE * imp)
    if prior is not None:
        out += prior(item.content)
    return out


def score(mem: Any, cands: dict[tuple[str, str], dict[str, Any]], qv: Any, label: str | None, now: float,
          where: dict[str, Any] | None, w_text: float, context: float, prior: Prior | None = None,
          question: float = QUESTION_KEEP, keep: int | None = None, rows: Any = None) -> list[SearchResult]:
    """The candidates as results, best first (the score of :meth:`Memory.recall`).

    ``prior`` is the query's temporal prior (:mod:`.temporal`), added to each item by its text;
    a record that only asks questions keeps the share ``question`` of its own match.
    ``keep``: only the best ``keep`` results are used (the rest may be left out
    unread, :func:`_fetch_best`); None returns every candidate. ``rows``: where rows come from (None: the store).
    """
    vectors = any(c["cos"] is None for (t, _), c in cands.items() if t == "record")
    done: dict[str, float] = {}
    src = rows if rows is not None else mem.store
    if keep is None:
        recs = src.records([i for t, i in cands if t == "record"], vectors=vectors)
    else:
        recs, done = _fetch_best(mem, cands, qv, label, now, w_text, context, prior, keep, vectors, question, rows)
    # Articles of candidate records come in too: the article stands for its records.
    homes = {r.article_id for r in recs.values() if r.article_id}
    art_ids = {i for t, i in cands if t == "article"} | homes
    arts = {a.id: a for a in src.articles(ids=sorted(art_ids))}
    if where:  # an article shows only if every source it still has matches the filter
        srcs = mem.store.records([s for a in arts.values() for s in a.sources])
        arts = {aid: a for aid, a in arts.items()
                if all(matches(srcs[s].metadata, where) for s in a.sources if s in srcs)}
    arts = _live_articles(src, arts, recs, now)
    for aid in arts:
        cands.setdefault(("article", aid), {"cos": None, "text": 0.0})
    scored: dict[tuple[str, str], SearchResult] = {}
    via: dict[str, list[tuple[str, float]]] = {}
    words = _words(label) if label else None  # once, not per item
    for (tier, i), c in cands.items():
        item = recs.get(i) if tier == "record" else arts.get(i)
        if item is None or (tier == "record" and item.expires is not None and item.expires <= now):
            continue
        value = done.get(i) if tier == "record" else None
        if value is None:
            value = item_score(mem, item, c, label, now, w_text, context, prior, qv, tier, question, words)
        if tier == "record":
            if item.article_id in arts:  # folded into an article that is shown: count for it instead
                via.setdefault(item.article_id, []).append((i, value))
                continue
            prov = {"created": item.created, "label": item.hint, "importance": item.importance,
                    "article_id": item.article_id, "expires": item.expires}
        else:
            prov = {"sources": item.sources, "version": item.version, "created": item.created,
                    "updated": item.updated, "synthesizer": item.synthesizer, "title": item.title,
                    "importance": item.importance}
        scored[(tier, i)] = SearchResult(value, item.content, tier, i, item.skill or None, item.metadata, prov)
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

def _live_articles(src: Any, arts: dict[str, Any], recs: dict[str, Any], now: float) -> dict[str, Any]:
    """Those of ``arts`` with a live source: an article lives as long as its sources, so once every one has
    expired (or is gone) it is not returned, though consolidation removes it only on its next pass. The sources
    a recall read already decide most; the others' rows are read once, without vectors."""
    live = {i for i, r in recs.items() if r.expires is None or r.expires > now}
    unsure = [a for a in arts.values() if live.isdisjoint(a.sources)]
    if unsure:
        more = src.records([s for a in unsure for s in a.sources], vectors=False)
        live.update(i for i, r in more.items() if r.expires is None or r.expires > now)
    return {aid: a for aid, a in arts.items() if not live.isdisjoint(a.sources)}


def add_neighbours(mem: Any, results: list[SearchResult], k: int, now: float,
                   where: dict[str, Any] | None) -> list[SearchResult]:
    """The top ``k`` of ``results`` after each record hit among the top ``2k`` lends its neighbours a score."""
    head = results[: 2 * k]
    hits = mem.store.records([r.id for r in head if r.tier == "record"])
    near = mem.store.adjacent_records(list(hits.values()), now)
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
