"""Rows a recall on PostgreSQL has read already, served again instead of read again.

A recall on pgvector reads rows in two statements it sends anyway: the vector
search (the hits' rows, which its HNSW scan reads anyway, and the full-text
hits' rows, whose cosines it needs) and the passage windows (the rows around
its best candidates, and, in the same round trip, whatever candidates and
articles nothing read yet). Scoring then takes its records and articles from
here (:meth:`RowPool.records`, :meth:`RowPool.articles`, the store's own
signatures) and reads only what is not here, exactly as the store would have:
the same rows, so the same results, two round trips fewer a recall.

What is here: a row read in full (its content short enough,
:data:`SMALL_ROW`); and which ids were asked by id, so a row that is not there
is known to be absent. Rows read under a filter (live records only) say
nothing of the ids they did not return: those are read as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .items import Article, Record, _article, _record

#: Content and label bytes up to which a row read for context is read in full, in case scoring needs it
#: (longer rows are read again by id only if they are among the best: a window reads ~180 rows for ~15 used).
SMALL_ROW = 2048
_SMALL = "octet_length({p}content) + octet_length({p}hint) <= " + str(SMALL_ROW)  # sizes, read without detoasting


def rec_cols(alias: str = "", vectors: bool = True) -> str:
    """The record columns in ``items._REC_COLS``' order, content and label only of small rows (NULL otherwise),
    of the table aliased ``alias``; ``vectors=False`` reads an empty embedding."""
    p = alias + "." if alias else ""
    small = _SMALL.format(p=p)
    emb = f"{p}embedding" if vectors else "''::bytea"
    return (f"{p}seq, {p}id, {p}skill, CASE WHEN {small} THEN {p}content END, CASE WHEN {small} THEN {p}hint END, "
            f"{p}metadata, {p}created, {p}expires, {p}article_id, {emb}, {p}importance")


class RowPool:
    """Record and article rows one recall read, by id (``store``: whose ``records``/``articles`` read the rest)."""

    def __init__(self, store: Any, own: Iterable[str] = ()):
        self.store = store
        #: The full-text hits whose live rows the vector search read (``own``), and those rows as
        #: :meth:`~engrain._memory.pgvector.PgVectorSearch.pg_around` reads them with radius 0.
        self.own: set[str] = set(own)
        self.own_rows: list[tuple] = []
        self._recs: dict[str, tuple] = {}
        self._known: set[str] = set()  # ids whose row is here, or was asked by id and is absent
        self._arts: dict[str, tuple] = {}
        self._arts_known: set[str] = set()
        #: Rows still to read with the passage windows (:meth:`plan`).
        self.want: tuple[list[str], list[str], list[str]] = ([], [], [])

    def plan(self, records: Iterable[str], articles: Iterable[str], homes_of: Iterable[str]) -> None:
        """Ask for these rows with the passage windows: ``records`` (those not here yet) by id, and the
        ``articles`` with the homes of the records ``homes_of`` (none when no article is asked: a store
        without articles reads none)."""
        arts = list(articles)
        self.want = ([i for i in records if i not in self._known], arts, list(homes_of) if arts else [])

    def add_records(self, rows: Iterable[Sequence[Any]], asked: Iterable[str] = ()) -> None:
        """Keep records (rows in :func:`rec_cols`' order); ``asked``: ids read by id without a filter."""
        short = set()
        for r in rows:
            if r[3] is None:  # long content: not read here
                short.add(r[1])
                continue
            self._recs[r[1]] = tuple(r)
            self._known.add(r[1])
        self._known.update(i for i in asked if i not in short)

    def add_articles(self, rows: Iterable[Sequence[Any]], asked: Iterable[str], homes_of: Iterable[str]) -> None:
        """Keep articles (``_ART_COLS``' order) read by id (``asked``) and as the homes of the records ``homes_of``."""
        for r in rows:
            self._arts[r[1]] = tuple(r)
        self._arts_known.update(asked)
        # A home is known when its record's row is here (it says which article that is).
        self._arts_known.update(r[8] for r in (self._recs.get(i) for i in homes_of) if r is not None and r[8] is not None)

    def records(self, ids: Sequence[str], vectors: bool = True, folded_of: Sequence[str] = ()) -> dict[str, Record]:
        """:meth:`MemoryStore.records <engrain._memory.store.MemoryStore.records>`, from the kept rows where it can."""
        out: dict[str, Record] = {}
        miss, miss_folded = [], []
        for group, dest, folded in ((ids, miss, False), (folded_of, miss_folded, True)):
            for i in group:
                row = self._recs.get(i)
                if i not in self._known or (vectors and row is not None and not row[9]):
                    dest.append(i)
                elif row is not None and (not folded or row[8] is not None):
                    out[i] = _record(row)
        if miss or miss_folded:
            out.update(self.store.records(miss, vectors=vectors, folded_of=miss_folded))
        return out

    def articles(self, skill: str | None = None, ids: Sequence[str] | None = None) -> list[Article]:
        """:meth:`MemoryStore.articles <engrain._memory.store.MemoryStore.articles>` by ``ids``: the kept rows, and
        those not kept read (oldest first, as the store returns them)."""
        if skill is not None or ids is None:
            return self.store.articles(skill=skill, ids=ids)
        miss = [i for i in ids if i not in self._arts_known]
        out = [_article(self._arts[i]) for i in ids if i in self._arts]
        if miss:
            out += self.store.articles(ids=miss)
        return sorted(out, key=lambda a: a.seq)
