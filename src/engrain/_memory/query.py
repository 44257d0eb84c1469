"""A recall's query vector: recent ones kept, and the rest embedded while the store works beside it.

Embedding the query is most of a recall (~4 ms of the shipped MiniLM on one
core, against ~3 ms of everything else at 10k records). Two things make it
cost less without changing a result:

* :class:`QueryVectors` keeps the most recent query vectors (agents repeat
  their questions), each with the embedder object that made it: a vector is
  only returned for that same embedder, so a memory moved to another embedder
  (``reembed``) or two embedders sharing a name never get each other's vectors;
* :func:`embed_beside` runs work that does not need the vector (the full-text
  search, the vector mirrors' catch-up) on a worker thread while this thread
  waits for a remote embedder (:func:`waits`). The side work reads the same rows
  it would have read after the embedding: no write happens in between on this
  thread. The local model is not overlapped: it computes on this machine's
  cores, and on two loaded ones (bench/memory.py's machine, load ~4) handing
  the full text to a worker cost 0.5-1.7 ms of waiting for a core, more than
  the 0.2-1 ms it hid.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

#: Query embeddings a memory keeps (the most recent; a repeated query skips the model, ~4 ms).
QUERY_CACHE = 256

T = TypeVar("T")

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _worker() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            # Two: recalls from two threads at once each get their side work run beside their embedding.
            _pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="engrain-recall")
        return _pool


class QueryVectors:
    """The ``size`` most recent query vectors of one memory, per embedder object and text."""

    def __init__(self, size: int = QUERY_CACHE):
        self.size = size
        self._items: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, embedder: Any, text: str) -> Any:
        """The kept vector of ``text`` made by ``embedder`` (this very object), else None."""
        with self._lock:
            hit = self._items.get(text)
            if hit is None or hit[0] is not embedder:
                return None
            self._items.move_to_end(text)
            return hit[1]

    def put(self, embedder: Any, text: str, vec: Any) -> Any:
        """Keep ``vec`` (made read-only: later recalls share it) as ``text``'s vector by ``embedder``."""
        vec.setflags(write=False)
        with self._lock:
            self._items[text] = (embedder, vec)
            self._items.move_to_end(text)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return vec

    def clear(self) -> None:
        """Forget every kept vector (a benchmark measuring the embedding clears it)."""
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


def waits(embedder: Any) -> bool:
    """Whether ``embedder`` waits on another machine (an OpenAI-compatible server) rather than computing here."""
    from .embedders import RemoteEmbedder

    return isinstance(embedder, RemoteEmbedder)


def embed_beside(embed: Callable[[], Any], side: Callable[[], T]) -> tuple[Any, T]:
    """``(embed(), side())``, with ``side`` run on a worker thread while this thread runs ``embed``.

    Both finish before this returns (an error of either is raised here, the
    embedding's first), so the caller never races its own side work.
    """
    fut = _worker().submit(side)
    try:
        vec = embed()
    except BaseException:
        try:
            fut.result()
        except BaseException:  # noqa: S110 (the embedding's error is the one to report)
            pass
        raise
    return vec, fut.result()
