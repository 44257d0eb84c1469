"""A memory's in-process vector mirrors: keeping them current (where their graphs are kept: :mod:`.graphfile`).

Recall searches an in-process mirror of each tier (:class:`~engrain._memory.index.VectorIndex`)
on SQLite, and on PostgreSQL without pgvector or with ``Memory(vector_search="local")``.
Before each search the mirrors catch up with the store (:func:`catch_up`): on SQLite only
when the file changed since (``store.version``); on PostgreSQL, which cannot tell, every
time, with the counters and both tiers' new rows read in one round trip (one more per
``items.VECTOR_CHUNK`` rows, and after a deletion the live rows' seqs). That suffices because
rows commit in seq order (``store._seqs_in_order``).
"""

from __future__ import annotations

from typing import Any


def catch_up(store: Any, records: Any, articles: Any, seen: Any) -> Any:
    """Bring the ``records`` and ``articles`` mirrors of ``store`` up to date; returns the store version they now
    reflect (``seen``: the one they reflected, so an unchanged SQLite store costs one pragma)."""
    now = store.version()
    if now is None:  # PostgreSQL
        after = {"record": records.last_seq, "article": articles.last_seq}
        state, rows = store.pg_state_and_vectors(after)
        records.refresh(state, (after["record"], rows["record"]))
        articles.refresh(state, (after["article"], rows["article"]))
    elif now != seen:
        state = store.state()
        records.refresh(state)
        articles.refresh(state)
    return now
