"""Semantic lookup of cached tasks: unit task embeddings and the nearest entries above a threshold.

Shared by the :class:`~.engine.Engine` (its ``Continuation.plan``) and the
agent's cache (a proposed plan for a reworded task): a similar task is only
ever suggested to the model, never replayed.
"""

from __future__ import annotations

from typing import Any

from .store import Entry

__all__ = ["nearest", "unit"]


def unit(embedder: Any, text: str) -> Any:
    """``embedder.embed([text])`` as a float32 unit vector."""
    import numpy as np

    vec = np.asarray(embedder.embed([text]), dtype=np.float32).reshape(-1)
    n = float(np.linalg.norm(vec))
    return vec / n if n else vec


def nearest(entries: list[Entry], query: Any, threshold: float, limit: int) -> list[tuple[Entry, float]]:
    """The ``limit`` entries most similar to the unit vector ``query``, at cosine >= ``threshold``."""
    import numpy as np

    entries = [e for e in entries if e.embedding is not None and len(e.embedding) == len(query)]
    if not entries:
        return []
    sims = np.asarray([e.embedding for e in entries], dtype=np.float32) @ query
    order = [i for i in np.argsort(-sims) if sims[i] >= threshold]
    return [(entries[i], float(sims[i])) for i in order[:limit]]
