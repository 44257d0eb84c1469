"""In-process vector search over one tier (records or articles).

The index mirrors the tier's embeddings from the store and stays current
cheaply: each search first loads only rows with a higher ``seq`` than it has
seen, and reloads everything when the store's generation counter for the tier
moved (rows were deleted or rewritten, possibly by another process).

Search is exact (one matrix-vector product in numpy) up to ``ann_threshold``
rows, then approximate with an hnswlib graph (cosine via inner product on unit
vectors), over-fetching and filtering by skill and TTL; when the filter leaves
too few hits it falls back to the exact scan of the matching rows.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .store import MemoryStore

#: Rows past which an hnswlib graph replaces the exact scan.
ANN_THRESHOLD = 50_000


class VectorIndex:
    """Vectors of one tier (``"record"`` or ``"article"``) of a :class:`MemoryStore`."""

    def __init__(self, store: MemoryStore, tier: str, *, ann_threshold: int = ANN_THRESHOLD):
        self.store = store
        self.tier = tier
        self.ann_threshold = ann_threshold
        self._gen_key = f"{tier}s_gen"
        self._lock = threading.Lock()
        self._reset(-1)

    def _reset(self, gen: int) -> None:
        self._gen = gen
        self._last = 0
        self._n = 0
        self._mat = np.zeros((0, 0), dtype=np.float32)
        self._ids: list[str] = []
        self._skill_codes = np.zeros(0, dtype=np.int32)
        self._skills: dict[str, int] = {}
        self._expires = np.zeros(0, dtype=np.float64)
        self._ann: Any = None
        self._ann_n = 0

    def __len__(self) -> int:
        return self._n

    def refresh(self, state: dict[str, int]) -> None:
        """Bring the mirror up to date with the store (``state`` from ``store.state()``)."""
        with self._lock:
            gen = state.get(self._gen_key, 0)
            if gen != self._gen:
                self._reset(gen)
            seqs, ids, skills, expires, mat = self.store.vectors(self.tier, self._last)
            if len(ids):
                self._append(ids, skills, expires, mat)
                self._last = int(seqs[-1])
            if self._n >= self.ann_threshold:
                self._sync_ann()

    def _append(self, ids: list[str], skills: list[str], expires: np.ndarray, mat: np.ndarray) -> None:
        need = self._n + len(ids)
        if self._mat.shape[0] < need or self._mat.shape[1] != mat.shape[1]:
            # Grow by doubling so a stream of small appends stays linear overall.
            cap = max(need, 2 * self._mat.shape[0], 1024)
            grown = np.zeros((cap, mat.shape[1]), dtype=np.float32)
            if self._n:
                grown[: self._n] = self._mat[: self._n]
            self._mat = grown
            self._skill_codes = np.resize(self._skill_codes, cap)
            self._expires = np.resize(self._expires, cap)
        self._mat[self._n:need] = mat
        self._expires[self._n:need] = expires
        self._skill_codes[self._n:need] = [self._skills.setdefault(s, len(self._skills)) for s in skills]
        self._ids.extend(ids)
        self._n = need

    def _sync_ann(self) -> None:
        import hnswlib

        if self._ann is None:
            self._ann = hnswlib.Index(space="ip", dim=self._mat.shape[1])
            self._ann.init_index(max_elements=max(2 * self._n, 1024), ef_construction=100, M=16)
            self._ann.set_ef(96)
            self._ann_n = 0
        if self._ann_n < self._n:
            if self._n > self._ann.get_max_elements():
                self._ann.resize_index(2 * self._n)
            self._ann.add_items(self._mat[self._ann_n:self._n], np.arange(self._ann_n, self._n))
            self._ann_n = self._n

    def search(self, vec: np.ndarray, k: int, skill: str | None, now: float) -> list[tuple[str, float]]:
        """Up to ``k`` ``(id, cosine)`` pairs, best first, of live rows (optionally of one skill)."""
        with self._lock:
            n = self._n
            if n == 0 or k <= 0:
                return []
            code = None
            if skill is not None:
                code = self._skills.get(skill)
                if code is None:
                    return []
            if self._ann is not None and self._ann_n == n:
                hits = self._ann_search(vec, k, code, now)
                if hits is not None:
                    return hits
            return self._exact(vec, k, code, now)

    def _live(self, pos: np.ndarray, code: int | None, now: float) -> np.ndarray:
        ok = self._expires[pos] > now
        if code is not None:
            ok &= self._skill_codes[pos] == code
        return ok

    def _exact(self, vec: np.ndarray, k: int, code: int | None, now: float) -> list[tuple[str, float]]:
        n = self._n
        mask = self._expires[:n] > now
        if code is not None:
            mask &= self._skill_codes[:n] == code
        pos = np.flatnonzero(mask) if not mask.all() else None
        sims = self._mat[:n] @ vec if pos is None else self._mat[pos] @ vec
        kk = min(k, sims.shape[0])
        if kk == 0:
            return []
        top = np.argpartition(-sims, kk - 1)[:kk]
        top = top[np.argsort(-sims[top])]
        real = top if pos is None else pos[top]
        return [(self._ids[int(p)], float(sims[t])) for p, t in zip(real, top)]

    def _ann_search(self, vec: np.ndarray, k: int, code: int | None, now: float) -> list[tuple[str, float]] | None:
        fetch = min(self._n, max(8 * k, 64))
        labels, dists = self._ann.knn_query(vec.reshape(1, -1), k=fetch)
        labels, sims = labels[0].astype(np.int64), 1.0 - dists[0]
        keep = self._live(labels, code, now)
        labels, sims = labels[keep], sims[keep]
        if len(labels) < k and fetch < self._n:
            return None  # the filter is selective: the exact scan of the matching rows is both right and cheap
        return [(self._ids[int(p)], float(s)) for p, s in zip(labels[:k], sims[:k])]
