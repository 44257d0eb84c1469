"""In-process vector search over one tier (records or articles).

The index mirrors the tier's embeddings from the store and stays current
cheaply: each search first loads only rows with a higher ``seq`` than it has
seen, and reloads everything when the store's generation counter for the tier
moved (rows were deleted or rewritten, possibly by another process).

Search is exact (one matrix-vector product in numpy) up to ``ann_threshold``
rows, then approximate with an hnswlib graph (cosine via inner product on unit
vectors), over-fetching and filtering by skill and TTL; when the filter leaves
too few hits it falls back to the exact scan of the matching rows.

On SQLite the graph is persisted next to the database (``<db>.<tier>.hnsw``
plus a ``.json`` sidecar) so a new process loads it instead of rebuilding. The
sidecar records what the graph covers (embedder, dimension, the tier's
generation, row count, last ``seq``, a digest of the row ids in order) and a
digest of the graph file itself; a file that does not match is never trusted:
a prefix of today's rows is loaded and topped up, anything else is rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from .store import MemoryStore

#: Rows past which an hnswlib graph replaces the exact scan.
ANN_THRESHOLD = 50_000

#: Rows added to a graph since it was last saved, as a share of its size, past
#: which it is saved again (saving rewrites the whole file, so not per append).
SAVE_SLACK = 0.05

_FORMAT = 1
_M, _EF_CONSTRUCTION, _EF = 16, 100, 96

log = logging.getLogger("engrain.memory")


def _file_digest(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def _ids_digest(ids: list[str]) -> str:
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()


class VectorIndex:
    """Vectors of one tier (``"record"`` or ``"article"``) of a :class:`MemoryStore`."""

    def __init__(self, store: MemoryStore, tier: str, *, ann_threshold: int = ANN_THRESHOLD,
                 persist: bool = True):
        self.store = store
        self.tier = tier
        self.ann_threshold = ann_threshold
        self._gen_key = f"{tier}s_gen"
        self._lock = threading.Lock()
        #: Graphs built from scratch / loaded from the file by this index (for tests and benchmarks).
        self.builds = 0
        self.loads = 0
        self.graph_path: Path | None = None
        path = store.path
        if persist and store.backend == "sqlite" and path is not None and path.is_file():
            # PostgreSQL has no local directory of its own to cache in: its stores rebuild per process.
            self.graph_path = path.with_name(f"{path.name}.{tier}.hnsw")
        self._reset(-1)

    @property
    def meta_path(self) -> Path | None:
        """The sidecar describing :attr:`graph_path` (None when the graph is not persisted)."""
        return None if self.graph_path is None else self.graph_path.with_name(self.graph_path.name + ".json")

    def _reset(self, gen: int) -> None:
        self._gen = gen
        self._last = 0
        self._n = 0
        self._mat = np.zeros((0, 0), dtype=np.float32)
        self._ids: list[str] = []
        self._pos: dict[str, int] = {}
        self._skill_codes = np.zeros(0, dtype=np.int32)
        self._skills: dict[str, int] = {}
        self._expires = np.zeros(0, dtype=np.float64)
        self._seqs = np.zeros(0, dtype=np.int64)
        self._ann: Any = None
        self._ann_n = 0
        self._saved_n = 0

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
                self._append(seqs, ids, skills, expires, mat)
                self._last = int(seqs[-1])
            if self._n >= self.ann_threshold:
                embedder = next((k[9:] for k in state if k.startswith("embedder:")), "")
                if self._ann is None and self.graph_path is not None:
                    self._load_ann(embedder)
                self._sync_ann()
                if self.graph_path is not None and self._ann_n - self._saved_n > SAVE_SLACK * self._saved_n:
                    self._save_ann(embedder)

    def _append(self, seqs: np.ndarray, ids: list[str], skills: list[str], expires: np.ndarray,
                mat: np.ndarray) -> None:
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
            self._seqs = np.resize(self._seqs, cap)
        self._mat[self._n:need] = mat
        self._expires[self._n:need] = expires
        self._seqs[self._n:need] = seqs
        self._skill_codes[self._n:need] = [self._skills.setdefault(s, len(self._skills)) for s in skills]
        self._ids.extend(ids)
        self._n = need

    def _sync_ann(self) -> None:
        import hnswlib

        if self._ann is None:
            self._ann = hnswlib.Index(space="ip", dim=self._mat.shape[1])
            self._ann.init_index(max_elements=max(2 * self._n, 1024), ef_construction=_EF_CONSTRUCTION, M=_M)
            self._ann.set_ef(_EF)
            self._ann_n = 0
            self.builds += 1
        if self._ann_n < self._n:
            if self._n > self._ann.get_max_elements():
                self._ann.resize_index(2 * self._n)
            self._ann.add_items(self._mat[self._ann_n:self._n], np.arange(self._ann_n, self._n))
            self._ann_n = self._n

    def _meta(self, embedder: str, rows: int) -> dict[str, Any]:
        """What a graph over the first ``rows`` rows of the mirror covers."""
        return {"format": _FORMAT, "tier": self.tier, "embedder": embedder, "dim": int(self._mat.shape[1]),
                "gen": self._gen, "rows": rows, "last_seq": int(self._seqs[rows - 1]) if rows else 0,
                "ids_sha256": _ids_digest(self._ids[:rows]), "M": _M, "ef_construction": _EF_CONSTRUCTION}

    def _load_ann(self, embedder: str) -> None:
        """Adopt the saved graph when it covers a prefix of the mirror; otherwise leave it to a rebuild."""
        import hnswlib

        assert self.graph_path is not None and self.meta_path is not None
        if not self.meta_path.exists() or not self.graph_path.exists():
            return
        try:
            meta = json.loads(self.meta_path.read_text())
            rows = meta.get("rows") if isinstance(meta, dict) else None
            if not isinstance(rows, int) or not 0 < rows <= self._n:
                log.info("ignoring %s: it covers rows this store no longer has; rebuilding", self.graph_path)
                return
            want = self._meta(embedder, rows)
            if any(meta.get(k) != v for k, v in want.items()):
                log.info("ignoring %s: it was built over other rows or another embedder; rebuilding", self.graph_path)
                return
            digest, size = _file_digest(self.graph_path)
            if (digest, size) != (meta.get("graph_sha256"), meta.get("graph_bytes")):
                log.warning("ignoring %s: the file does not match its sidecar (corrupt or half-written); "
                            "rebuilding", self.graph_path)
                return
            ann = hnswlib.Index(space="ip", dim=want["dim"])
            ann.load_index(str(self.graph_path), max_elements=max(2 * self._n, 1024))
            if ann.get_current_count() != rows:
                log.warning("ignoring %s: it holds %d vectors, its sidecar says %d; rebuilding",
                            self.graph_path, ann.get_current_count(), rows)
                return
        except (OSError, ValueError, RuntimeError) as e:  # ValueError covers malformed JSON
            log.warning("ignoring unreadable %s (%s); rebuilding", self.graph_path, e)
            return
        ann.set_ef(_EF)
        self._ann, self._ann_n, self._saved_n = ann, rows, rows
        self.loads += 1

    def _save_ann(self, embedder: str) -> None:
        """Write graph and sidecar atomically (temp files + ``os.replace``); failures only cost a rebuild later."""
        assert self.graph_path is not None and self.meta_path is not None
        meta = self._meta(embedder, self._ann_n)
        tmps: list[str] = []
        try:
            for _ in range(2):
                fd, tmp = tempfile.mkstemp(dir=self.graph_path.parent, prefix=self.graph_path.name + ".",
                                           suffix=".tmp")
                os.close(fd)
                tmps.append(tmp)
                # mkstemp makes the file private; give it the database's permissions instead.
                os.chmod(tmp, self.store.path.stat().st_mode & 0o777)  # type: ignore[union-attr]
            self._ann.save_index(tmps[0])
            meta["graph_sha256"], meta["graph_bytes"] = _file_digest(Path(tmps[0]))
            Path(tmps[1]).write_text(json.dumps(meta))
            # Graph first, sidecar second: a crash in between leaves a sidecar whose
            # digest does not match the graph, which the next load detects.
            os.replace(tmps[0], self.graph_path)
            os.replace(tmps[1], self.meta_path)
            self._saved_n = self._ann_n
        except (OSError, RuntimeError) as e:
            log.warning("could not save the vector index to %s (%s); the next process will rebuild it",
                        self.graph_path, e)
            self._saved_n = self._ann_n  # do not retry on every search
        finally:
            for tmp in tmps:
                with contextlib.suppress(OSError):  # already renamed, or never written
                    os.unlink(tmp)

    def search(self, vec: np.ndarray, k: int, skill: str | None, now: float,
               allow: set[str] | None = None) -> list[tuple[str, float]]:
        """Up to ``k`` ``(id, cosine)`` pairs, best first, of live rows (optionally of one skill).

        ``allow`` limits the search to these ids (a metadata filter's matches):
        an exact scan of just those rows.
        """
        with self._lock:
            n = self._n
            if n == 0 or k <= 0:
                return []
            if allow is not None:
                return self._exact_among(vec, k, allow, now)
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

    def _exact_among(self, vec: np.ndarray, k: int, allow: set[str], now: float) -> list[tuple[str, float]]:
        if len(self._pos) != self._n:
            self._pos = {rid: p for p, rid in enumerate(self._ids)}
        pos = np.fromiter((p for rid in allow if (p := self._pos.get(rid)) is not None), dtype=np.int64)
        pos = pos[self._expires[pos] > now]
        if not len(pos):
            return []
        sims = self._mat[pos] @ vec
        kk = min(k, len(pos))
        top = np.argpartition(-sims, kk - 1)[:kk]
        top = top[np.argsort(-sims[top])]
        return [(self._ids[int(pos[t])], float(sims[t])) for t in top]

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
