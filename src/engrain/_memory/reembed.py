"""Move a memory store to another embedder (``engrain memory reembed``, :meth:`Memory.reembed`).

Vectors of two embedders never mix, so the move is staged: the new vectors go
to ``engrain_mem_reembed`` (one row per record or article, with the digest of
the text it embeds), a batch per transaction, while the store keeps serving
recalls with the old ones. When every row has a vector of the new embedder
for its current text, one transaction swaps them in, records the new
embedder and tells the in-process indexes to rebuild. A crash (or SIGKILL)
loses at most the batch in flight: running it again skips the rows already
staged, re-embeds rows written or rewritten since, and finishes. Starting a
move to a third embedder drops what another unfinished move staged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from .embed import Embedder
from .items import from_blob, to_blob
from .pgvector import _vec_literal

#: Rows embedded per batch (and per staging transaction).
BATCH = 256

_TABLES = {"record": "engrain_mem_records", "article": "engrain_mem_articles"}
_TEXT = {"record": "content", "article": "title || char(10) || content"}


def _schema(store: Any) -> None:
    blob = "BLOB" if store.backend == "sqlite" else "BYTEA"
    store._x(f"CREATE TABLE IF NOT EXISTS engrain_mem_reembed (tier TEXT NOT NULL, seq BIGINT NOT NULL, "
             f"digest TEXT NOT NULL, embedding {blob} NOT NULL, PRIMARY KEY (tier, seq))")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _rows(store: Any, tier: str) -> list[tuple[int, str]]:
    """``(seq, text embedded)`` of every row of ``tier`` (the text as remember/consolidate embed it)."""
    text = _TEXT[tier] if store.backend == "sqlite" else _TEXT[tier].replace("char(10)", "chr(10)")
    return [(int(s), t) for s, t in store._x(f"SELECT seq, {text} FROM {_TABLES[tier]} ORDER BY seq").fetchall()]


def pending(store: Any) -> dict[str, list[tuple[int, str]]]:
    """Rows whose staged vector is missing or was made from other text, per tier."""
    out: dict[str, list[tuple[int, str]]] = {}
    with store._lock:
        for tier in _TABLES:
            staged = dict(store._x("SELECT seq, digest FROM engrain_mem_reembed WHERE tier = ?", (tier,)).fetchall())
            out[tier] = [(s, t) for s, t in _rows(store, tier) if staged.get(s) != _digest(t)]
    return out


def reembed(store: Any, target: Embedder, *, batch_size: int = BATCH,
            progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Move ``store`` to ``target`` (see the module docstring); ``progress(done, total)`` after each batch.

    Returns ``{"from", "to", "records", "articles", "embedded", "resumed"}``
    (``embedded``: texts embedded by this call; ``resumed``: rows a crashed
    move had already staged). A store already on ``target`` is left alone.
    """
    source = store.bound_embedder()
    with store._lock:  # every use of the store's connection holds its lock (a PostgreSQL one may be replaced)
        counts = {t: int(store._x(f"SELECT count(*) FROM {tb}").fetchone()[0]) for t, tb in _TABLES.items()}
    out: dict[str, Any] = {"from": source, "to": target.name, "records": counts["record"],
                           "articles": counts["article"], "embedded": 0, "resumed": 0}
    if source == target.name:
        return out
    dim = int(target.dim)
    with store.tx():
        _schema(store)
        moving = [n for (n,) in store._x("SELECT name FROM engrain_mem_state WHERE name LIKE ?",
                                         ("reembed:%",)).fetchall()]
        if moving != [f"reembed:{target.name}"]:  # a move to another embedder was left unfinished: start over
            store._x("DELETE FROM engrain_mem_reembed")
            store._x("DELETE FROM engrain_mem_state WHERE name LIKE ?", ("reembed:%",))
            store._x("INSERT INTO engrain_mem_state (name, value) VALUES (?, ?)", (f"reembed:{target.name}", dim))
    total = sum(counts.values())
    while True:
        todo = pending(store)
        left = sum(len(v) for v in todo.values())
        if out["embedded"] == 0:
            out["resumed"] = max(0, total - left)
        done = total - left
        if progress:
            progress(done, total)
        if left == 0 and _swap(store, target.name, dim):
            break
        for tier, rows in todo.items():
            for i in range(0, len(rows), batch_size):
                chunk = rows[i:i + batch_size]
                vecs = np.asarray(target.embed([t for _, t in chunk]), dtype=np.float32)
                if vecs.shape != (len(chunk), dim):
                    from .._errors import EmbeddingError

                    raise EmbeddingError(f"embedder {target.name!r} returned vectors of shape {vecs.shape} "
                                         f"for {len(chunk)} texts of dimension {dim}")
                with store.tx():
                    store._x("DELETE FROM engrain_mem_reembed WHERE tier = ? AND seq IN (%s)"
                             % ",".join("?" * len(chunk)), (tier, *[s for s, _ in chunk]))
                    for (s, t), v in zip(chunk, vecs):
                        store._x("INSERT INTO engrain_mem_reembed (tier, seq, digest, embedding) VALUES (?, ?, ?, ?)",
                                 (tier, s, _digest(t), to_blob(v)))
                out["embedded"] += len(chunk)
                done += len(chunk)
                if progress:
                    progress(min(done, total), total)
    return out


def reembed_url(url: str | None, target: str, *, base_url: str | None = None, api_key: str | None = None,
                batch_size: int = BATCH, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """:func:`reembed` on the store at ``url`` (default: the journal's), whatever embedder filled it."""
    from .._journal import default_url
    from .embedders import resolve
    from .store import open_store

    store = open_store(url or default_url())
    try:
        return reembed(store, resolve(target, base_url=base_url, api_key=api_key), batch_size=batch_size,
                       progress=progress)
    finally:
        store.close()


def _swap(store: Any, name: str, dim: int) -> bool:
    """Put the staged vectors in place and record ``name`` as the store's embedder, in one transaction.

    False (nothing changed) when a row was written since the check: the caller stages it and tries again.
    """
    with store.tx():  # BEGIN IMMEDIATE on SQLite: no writer slips in between the check and the swap
        if store.backend != "sqlite":
            store._x("LOCK TABLE engrain_mem_records, engrain_mem_articles IN SHARE ROW EXCLUSIVE MODE")
        if any(pending(store).values()):
            return False
        if store.pgvector:
            for tb in _TABLES.values():
                store._x(f"DROP INDEX IF EXISTS {tb}_vec")
                store._x(f"ALTER TABLE {tb} ALTER COLUMN vec TYPE {store._vtype} USING NULL")
        for tier, tb in _TABLES.items():
            rows = store._x("SELECT seq, embedding FROM engrain_mem_reembed WHERE tier = ?", (tier,)).fetchall()
            for s, e in rows:
                if store.pgvector:
                    store._x(f"UPDATE {tb} SET embedding = ?, vec = ?::{store._vtype} WHERE seq = ?",
                             (bytes(e), _vec_literal(from_blob(e)), s))
                else:
                    store._x(f"UPDATE {tb} SET embedding = ? WHERE seq = ?", (bytes(e), s))
        store._x("DELETE FROM engrain_mem_state WHERE name LIKE ? OR name LIKE ?", ("embedder:%", "reembed:%"))
        store._x("INSERT INTO engrain_mem_state (name, value) VALUES (?, ?)", (f"embedder:{name}", dim))
        for tier in _TABLES:  # the in-process indexes (this and other processes) rebuild from the new vectors
            store._bump(f"{tier}s_gen")
        store._x("DELETE FROM engrain_mem_reembed")
        if store.pgvector:
            store._pg_vector_index(dim)
    return True
