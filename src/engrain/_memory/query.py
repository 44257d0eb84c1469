"""A recall's query vector: recent ones kept, and the rest embedded while the store works beside it.

Embedding the query is most of a recall (~4 ms of the shipped MiniLM on one
core, against ~3 ms of everything else at 10k records). Two things make it
cost less without changing a result:

* :class:`QueryVectors` keeps the most recent query vectors (agents repeat
  their questions), each with the embedder object that made it: a vector is
  only returned for that same embedder, so a memory moved to another embedder
  (``reembed``) or two embedders sharing a name never get each other's vectors;
* :func:`start_beside` runs work that does not need the vector (the full-text
  search) on a worker thread while this thread embeds the query and searches
  the vectors; the caller takes its result when it ranks. The side work reads
  the same rows it would have read on this thread: no write happens in between
  on this thread. It pays with the local model too (one onnxruntime thread per
  query, so the second core is free unless the machine is busy): at 10k records
  on bench/memory.py's two shared cores (load ~2), recall p50 8.6-8.7 ms against
  9.9-10.2 without it, in the same rounds. When both workers are busy (many
  recalls at once) the side work runs on the caller's thread instead of queueing.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

#: Query embeddings a memory keeps (the most recent; a repeated query skips the model, ~4 ms).
QUERY_CACHE = 256

T = TypeVar("T")

_WORKERS = 2  # recalls from two threads at once each get their side work run beside them
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_busy = 0  # side work handed to the workers and not finished


def _after_fork() -> None:
    """A forked child starts without the parent's worker threads: its first recall makes a pool of its own
    (the inherited one would queue side work to threads that do not exist there, and wait for ever)."""
    global _pool, _pool_lock, _busy
    _pool, _pool_lock, _busy = None, threading.Lock(), 0


os.register_at_fork(after_in_child=_after_fork)


def _worker() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="engrain-recall")
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


def start_beside(side: Callable[[], T]) -> Future[T]:
    """Run ``side`` on a worker thread (on this one when both workers are busy); take its ``result()`` when it
    is needed, or :func:`settle` it when the caller fails first."""
    global _busy
    with _pool_lock:
        free = _busy < _WORKERS
        if free:
            _busy += 1
    if not free:
        done: Future[T] = Future()
        try:
            done.set_result(side())
        except BaseException as e:  # noqa: BLE001 (handed to the caller through result(), as a worker's would be)
            done.set_exception(e)
        return done

    def run() -> T:
        global _busy
        try:
            return side()
        finally:
            with _pool_lock:
                _busy -= 1

    try:
        return _worker().submit(run)
    except BaseException:
        with _pool_lock:
            _busy -= 1
        raise


def settle(fut: Future[Any]) -> None:
    """Wait for side work whose result is no longer wanted (the caller failed): it never outlives the call."""
    try:
        fut.result()
    except BaseException:  # noqa: S110 (the caller's own error is the one to report)
        pass
