"""Record rows read by ``seq`` (the table's rowid) where the vector mirror knows it: recall's scoring on SQLite.

By ``id``, each row is a walk of the id's UNIQUE index and then one of the
table. At 1M records that index is ~40 MB of random ids whose pages nothing
else reads (the mirror loads the table in seq order), so they are cold in the
page cache: 15 rows took 0.37 ms by id against 0.08 ms by seq on the memory
bench's 1M store (0.11 against 0.07 once warm). The mirror holds every row's
id and seq (seqs are never reused and a row's id never changes), so scoring
asks by seq and keeps a row only when it is the id asked; ids the mirror does
not hold, or whose row did not come back (deleted by another process since the
mirror caught up), are read by id as before: the same rows either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .items import _REC_COLS, Article, Record, _record


class MirrorRows:
    """``records``/``articles`` with the store's signatures, records read by the seqs ``index`` knows."""

    def __init__(self, store: Any, index: Any):
        self.store = store
        self.index = index

    @classmethod
    def of(cls, store: Any, index: Any) -> MirrorRows | None:
        """Rows by seq on SQLite; None elsewhere (PostgreSQL reads its rows by id, or keeps them: :mod:`.pgrows`)."""
        return cls(store, index) if store.backend == "sqlite" else None

    def records(self, ids: Sequence[str], vectors: bool = True, folded_of: Sequence[str] = ()) -> dict[str, Record]:
        """:meth:`MemoryStore.records <engrain._memory.store.MemoryStore.records>` (SQLite: no ``folded_of``)."""
        assert not folded_of, "folded_of is PostgreSQL's"
        ids = list(ids)
        at = self.index.seqs_of(ids)
        out: dict[str, Record] = {}
        if at:
            cols = _REC_COLS if vectors else _REC_COLS.replace("embedding", "x''")
            st = self.store
            with st._lock:
                for chunk, cond in st._id_chunks(sorted(set(at.values())), "seq"):
                    for row in st._x(f"SELECT {cols} FROM engrain_mem_records WHERE {cond}", chunk):
                        if at.get(row[1]) == row[0]:
                            out[row[1]] = _record(row)
        miss = [i for i in ids if i not in out]
        if miss:
            out.update(self.store.records(miss, vectors=vectors))
        return out

    def articles(self, skill: str | None = None, ids: Sequence[str] | None = None) -> list[Article]:
        """:meth:`MemoryStore.articles <engrain._memory.store.MemoryStore.articles>`, unchanged."""
        return self.store.articles(skill=skill, ids=ids)


def live_rows(store: Any, tier: str) -> tuple[np.ndarray, np.ndarray]:
    """``(seqs, expires)`` of a tier's rows, by seq (``expires`` ``inf`` without a TTL): which rows the vector
    mirror keeps after a deletion, without their vectors (on SQLite a scan of a covering index)."""
    sql = ("SELECT seq, expires FROM engrain_mem_records" if tier == "record"
           else "SELECT seq, NULL FROM engrain_mem_articles")
    with store._lock:
        rows = store._x(sql).fetchall()
    seqs = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    exp = np.fromiter((np.inf if r[1] is None else r[1] for r in rows), dtype=np.float64, count=len(rows))
    order = np.argsort(seqs, kind="stable")
    return seqs[order], exp[order]
