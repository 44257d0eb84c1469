"""In-process vector search over one tier (records or articles).

The index mirrors the tier's embeddings from the store and stays current
cheaply: each search first loads only rows with a higher ``seq`` than it has
seen. Two counters in the store say when that is not enough: the tier's
*generation* (``records_gen``) moves when stored vectors were rewritten, and
everything is rebuilt; the *deletions* counter (``records_del``) moves when
rows were deleted (TTL purge, forget), and only the mirror reloads: the graph
keeps its vectors and marks the missing rows deleted, because graph labels are
row ``seq``s, which are never reused.

Search is exact (one matrix-vector product in numpy) up to ``ann_threshold``
rows, then approximate with a usearch HNSW graph (cosine via inner product on
unit vectors; usearch ships wheels for Linux, macOS and Windows, where hnswlib
needed a C++ compiler), over-fetching and filtering by skill and TTL; when the
filter leaves too few hits it falls back to the exact scan of the matching rows.

On SQLite the graph is persisted next to the database (``<db>.<tier>.usearch``
plus a ``.json`` sidecar) so a new process loads it instead of rebuilding; a
PostgreSQL store searched in-process (``Memory(vector_search="local")``) keeps
it in this machine's cache folder instead (:func:`.graphfile.pg_graph_path`). The
sidecar records what the graph covers (the store's identity, embedder,
dimension, the tier's generation, the last ``seq`` it holds) and a digest of
the graph file itself; a file that does not match, or that lacks a live row
up to its last ``seq``, is never trusted and is rebuilt. Rows deleted since
it was saved are marked deleted on load, rows added since are topped up.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from .._disk_cache import is_private_file
from .fusion import CROWDING_SAMPLE, crowding
from .graphfile import file_digest, mark_used, pg_graph_path, prune_graph_cache, write_graph
from .items import VECTOR_CHUNK
from .prefilter import Int8Rows, best
from .seqrows import live_rows
from .skillrows import SkillRows
from .store import HNSW_EF, HNSW_EF_CONSTRUCTION, HNSW_M, MemoryStore

#: Rows past which a usearch graph replaces the exact scan.
ANN_THRESHOLD = 50_000
#: How the graph stores its copy of the vectors: bfloat16 halves its memory and walks faster (the
#: mirror keeps float32, and the hits' cosines are recomputed from it), at the same recall@10 vs exact
#: (bench/memory_index.py).
GRAPH_DTYPE = "bf16"

#: Rows added to a graph since it was last saved, as a share of its size, past
#: which it is saved again (saving rewrites the whole file, so not per append).
SAVE_SLACK = 0.05

_FORMAT = 3  # 3: usearch (2 was hnswlib's file, ignored and rebuilt)
_M, _EF_CONSTRUCTION, _EF = HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF

log = logging.getLogger("engrain.memory")


def _dot(mat: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """``mat @ vec`` on this thread: numpy hands a large matrix-vector product to OpenBLAS's threads, which
    on a busy machine wait on each other (10k rows: 0.3 ms idle, 38 ms beside two busy processes; this
    loop: 0.5 ms either way)."""
    return np.einsum("ij,j->i", mat, vec)


def _usearch_index() -> Any:
    """usearch's ``Index``, with onnxruntime imported first when it is installed.

    onnxruntime (1.32) imported after usearch's compiled module (2.26) crashes the
    process in its own import, so a process whose first recall loads a graph before
    the local model (a recall's mirrors catch up before its query is embedded) would
    die there; the other order is fine.
    """
    if importlib.util.find_spec("onnxruntime") is not None:
        import onnxruntime  # noqa: F401

    from usearch.index import Index

    return Index


class VectorIndex:
    """Vectors of one tier (``"record"`` or ``"article"``) of a :class:`MemoryStore`."""

    def __init__(self, store: MemoryStore, tier: str, *, ann_threshold: int = ANN_THRESHOLD,
                 persist: bool = True):
        self.store = store
        self.tier = tier
        self.ann_threshold = ann_threshold
        self._gen_key = f"{tier}s_gen"
        self._del_key = f"{tier}s_del"
        self._del = -1
        self._lock = threading.Lock()
        #: Graphs built from scratch / loaded from the file by this index (for tests and benchmarks).
        self.builds = 0
        self.loads = 0
        self.graph_path: Path | None = None
        path = store.path
        if persist and store.backend == "sqlite" and path is not None and path.is_file():
            self.graph_path = path.with_name(f"{path.name}.{tier}.usearch")
        # PostgreSQL: the cache file is named once a graph is needed (a store searched with pgvector never asks).
        self._pg_cache = persist and store.backend != "sqlite"
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
        self._ids = np.empty(0, dtype=object)  # each row's id: an object array, which the GC does not walk (.skillrows)
        self._pos: dict[str, int] = {}
        self._seq_pos = np.zeros(0, dtype=np.int64)  # mirror position of each seq (-1: none), for graph hits
        self._seq_pos_n = 0  # mirror rows entered in _seq_pos
        self._skill_codes = np.zeros(0, dtype=np.int32)
        self._skills: dict[str, int] = {}
        self._by_skill = SkillRows()  # mirror positions of each skill's rows, in seq order
        self._ords = np.zeros(0, dtype=np.int64)  # each row's place in its skill's list above
        self._crowding: dict[str | None, tuple[tuple[int, int], float]] = {}  # per skill: (mirror state, value)
        self._expires = np.zeros(0, dtype=np.float64)
        self._seqs = np.zeros(0, dtype=np.int64)
        self._q8 = Int8Rows()  # the exact scan's int8 first pass (:mod:`.prefilter`), kept below ann_threshold
        self._ann: Any = None
        self._ann_n = 0  # vectors added to the graph (deleted ones included)
        self._ann_last = 0  # highest seq in the graph
        self._saved_n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def last_seq(self) -> int:
        """The highest seq the mirror holds (rows after it are new to it)."""
        return self._last

    def refresh(self, state: dict[str, int], new: tuple[int, tuple] | None = None) -> None:
        """Bring the mirror up to date with the store (``state`` from ``store.state()``); ``new``: ``(after, rows)``,
        the tier's ``store.vectors(tier, after)`` read already, used when ``after`` is still where the mirror is."""
        with self._lock:
            gen, dele = state.get(self._gen_key, 0), state.get(self._del_key, 0)
            if gen != self._gen:
                self._reset(gen)
            elif dele != self._del:
                self._reload_keep_graph()
            self._del = dele
            fresh = new[1] if new is not None and new[0] == self._last else self.store.vectors(self.tier, self._last)
            while True:  # a chunk at a time (a full chunk: there may be more)
                seqs, ids, skills, expires, mat = fresh
                if len(ids):
                    self._append(seqs, ids, skills, expires, mat)
                    self._last = int(seqs[-1])
                if len(ids) < VECTOR_CHUNK:
                    break
                fresh = self.store.vectors(self.tier, self._last)
            if self._n >= self.ann_threshold:
                if self._pg_cache:
                    self._pg_cache = False
                    self.graph_path = pg_graph_path(self.store, self.tier)
                embedder = next((k[9:] for k in state if k.startswith("embedder:")), "")
                if self._ann is None and self.graph_path is not None:
                    self._load_ann(embedder)
                self._sync_ann()
                if self.graph_path is not None and self._ann_n - self._saved_n > SAVE_SLACK * self._saved_n:
                    self._save_ann(embedder)

    def _reload_keep_graph(self) -> None:
        """Rows were deleted: drop them from the mirror, mark them deleted in the graph, keep everything else.

        Only live seqs and expiries are read (a covering index: 0.35 s at 1M records); the rows still there keep
        the vectors, ids and skills held here (rewritten only with a new generation), where reading every vector
        again stalled the next recall 6.7 s at 1M. A live row missing below the last seq (PostgreSQL may commit
        out of seq order) reads everything again."""
        n, last = self._n, self._last
        old = self._seqs[:n].copy()
        ann, ann_n, ann_last, saved = self._ann, self._ann_n, self._ann_last, self._saved_n
        live, expires = live_rows(self.store, self.tier)
        at = np.minimum(np.searchsorted(old, live), max(n - 1, 0))
        held = (old[at] == live) if n else np.zeros(len(live), dtype=bool)
        if (~held & (live <= last)).any():
            seqs, ids, skills, expires, mat = self.store.vectors(self.tier, 0)
            last = int(seqs[-1]) if len(seqs) else 0
        else:  # rows past `last` are read by the catch-up that follows
            keep, names = at[held], {c: name for name, c in self._skills.items()}
            seqs, ids, expires, mat = old[keep], self._ids[keep].tolist(), expires[held], self._mat[keep]
            skills = [names[c] for c in self._skill_codes[keep].tolist()]
        self._reset(self._gen)
        if len(ids):
            self._append(seqs, ids, skills, expires, mat)
        self._last = last
        self._ann, self._ann_n, self._ann_last, self._saved_n = ann, ann_n, ann_last, saved
        if ann is not None:
            gone = np.setdiff1d(old[old <= ann_last], live, assume_unique=True)
            if len(gone):
                ann.remove(gone.astype(np.uint64))

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
            self._ords = np.resize(self._ords, cap)
            grown_ids = np.empty(cap, dtype=object)
            grown_ids[: self._n] = self._ids[: self._n]
            self._ids = grown_ids
        self._mat[self._n:need] = mat
        if need <= self.ann_threshold:
            self._q8.append(mat)
        elif self._q8.n:
            self._q8 = Int8Rows()  # past the threshold the graph searches: not worth a quarter of the mirror again
        self._expires[self._n:need] = expires
        self._seqs[self._n:need] = seqs
        codes = [self._skills.setdefault(s, len(self._skills)) for s in skills]
        self._skill_codes[self._n:need] = codes
        self._ords[self._n:need] = self._by_skill.add(np.asarray(codes, dtype=np.int64), self._n)
        self._ids[self._n:need] = ids
        self._pos.update(zip(ids, range(self._n, need)))  # kept here: rebuilding it after appends cost ~0.1 s at 1M
        self._n = need

    @staticmethod
    def _new_graph(dim: int) -> Any:
        Index = _usearch_index()  # noqa: N806

        return Index(ndim=dim, metric="ip", dtype=GRAPH_DTYPE, connectivity=_M, expansion_add=_EF_CONSTRUCTION,
                     expansion_search=_EF)

    def _sync_ann(self) -> None:
        if self._ann is None:
            self._ann = self._new_graph(self._mat.shape[1])
            self._ann_n = self._ann_last = 0
            self.builds += 1
        start = int(np.searchsorted(self._seqs[: self._n], self._ann_last, side="right"))
        if start < self._n:
            self._ann.add(self._seqs[start:self._n].astype(np.uint64), self._mat[start:self._n])
            self._ann_n += self._n - start
            self._ann_last = int(self._seqs[self._n - 1])

    def _covered(self) -> bool:
        return self._ann is not None and (self._n == 0 or self._ann_last >= int(self._seqs[self._n - 1]))

    def _meta(self, embedder: str) -> dict[str, Any]:
        """What a graph built for this store, tier, model and generation records (not what rows it holds)."""
        return {"format": _FORMAT, "store": self.store.identity(), "tier": self.tier, "embedder": embedder,
                "dim": int(self._mat.shape[1]), "gen": self._gen, "M": _M, "ef_construction": _EF_CONSTRUCTION,
                "dtype": GRAPH_DTYPE}

    def _load_ann(self, embedder: str) -> None:
        """Adopt the saved graph when it covers a prefix of the mirror; otherwise leave it to a rebuild."""
        assert self.graph_path is not None and self.meta_path is not None
        if not self.meta_path.exists() or not self.graph_path.exists():
            return
        in_cache = self.store.backend != "sqlite"  # (a SQLite store's graph sits beside its file, as the file does)
        if in_cache and not all(is_private_file(p) for p in (self.meta_path, self.graph_path)):
            log.warning("ignoring %s: in the cache folder, a graph and its sidecar must be regular files of this "
                        "user that nobody else can write; rebuilding", self.graph_path)
            return
        try:
            meta = json.loads(self.meta_path.read_text())
            if not isinstance(meta, dict):
                raise ValueError("the sidecar is not a JSON object")
            want = self._meta(embedder)
            if any(meta.get(k) != v for k, v in want.items()):
                log.info("ignoring %s: it was built for another store, generation or embedder; rebuilding",
                         self.graph_path)
                return
            digest, size = file_digest(self.graph_path)
            if (digest, size) != (meta.get("graph_sha256"), meta.get("graph_bytes")):
                log.warning("ignoring %s: the file does not match its sidecar (corrupt or half-written); "
                            "rebuilding", self.graph_path)
                return
            last, count = meta.get("last_seq"), meta.get("elements")
            ann = self._new_graph(want["dim"])
            ann.load(str(self.graph_path))
            if len(ann) != count or ann.ndim != want["dim"] or not isinstance(last, int):
                log.warning("ignoring %s: it holds %d vectors, its sidecar says %s; rebuilding",
                            self.graph_path, len(ann), count)
                return
            labels = np.asarray(ann.keys, dtype=np.int64)
            mine = self._seqs[: self._n]
            mine = mine[mine <= last]
            if len(np.setdiff1d(mine, labels)):
                log.info("ignoring %s: it lacks rows this store has; rebuilding", self.graph_path)
                return
            gone = np.setdiff1d(labels, mine)  # deleted since it was saved
            if len(gone):
                ann.remove(gone.astype(np.uint64))
        except (OSError, ValueError, RuntimeError, TypeError) as e:  # ValueError covers malformed JSON
            log.warning("ignoring unreadable %s (%s); rebuilding", self.graph_path, e)
            return
        ann.expansion_search = _EF  # a loaded file keeps usearch's default, not ours
        self._ann, self._ann_n, self._ann_last, self._saved_n = ann, int(count), last, int(count)
        self.loads += 1
        if in_cache:
            mark_used(self.graph_path, self.meta_path)

    def _save_ann(self, embedder: str) -> None:
        """Write graph and sidecar (:func:`.graphfile.write_graph`); failures only cost a rebuild later."""
        assert self.graph_path is not None and self.meta_path is not None
        meta = {**self._meta(embedder), "last_seq": self._ann_last, "elements": len(self._ann)}
        try:
            # The database's permissions (mkstemp's would be private); a cached graph stays private.
            write_graph(self._ann, self.graph_path, self.meta_path, meta,
                        self.store.path.stat().st_mode & 0o777 if self.store.path is not None else 0o600)
            if self.store.backend != "sqlite":  # in the cache folder: where dropped stores' graphs pile up
                prune_graph_cache(self.graph_path.parent)
        except (OSError, RuntimeError) as e:
            log.warning("could not save the vector index to %s (%s); the next process will rebuild it",
                        self.graph_path, e)
        self._saved_n = self._ann_n  # saved, or not retried on every search

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
            if self._covered():
                hits = self._ann_search(vec, k, code, now)
                if hits is not None:
                    return hits
            return self._exact(vec, k, code, now)

    def crowding(self, skill: str | None) -> float:
        """The mean cosine between two of the most recent ``CROWDING_SAMPLE`` rows of ``skill`` (or of all skills).

        How much the skill's vectors share one direction, which the text weight
        of a recall reads (:func:`.fusion.crowding`); 0.0 for an unknown skill.
        """
        with self._lock:
            # Kept until the mirror changes (rows added, or reloaded): ~0.2 ms a recall otherwise.
            key = self.state()
            hit = self._crowding.get(skill)
            if hit is not None and hit[0] == key:
                return hit[1]
            if skill is None:
                vecs = self._mat[max(0, self._n - CROWDING_SAMPLE):self._n]
            else:
                code = self._skills.get(skill)
                if code is None:
                    return 0.0
                vecs = self._mat[self._by_skill.of(code)[-CROWDING_SAMPLE:]]
            value = crowding(vecs.sum(axis=0, dtype=np.float64), float(np.einsum("ij,ij->", vecs, vecs)), len(vecs))
            if len(self._crowding) > 1000:
                self._crowding.clear()
            self._crowding[skill] = (key, value)
            return value

    def state(self) -> tuple[int, int]:
        """A value that changes whenever the mirror does (rows added, or reloaded): what values derived from its
        rows are kept by (a skill's crowding here, its speakers in :mod:`.voice`)."""
        return self._n, id(self._mat)

    def recent(self, skill: str | None, n: int) -> list[int]:
        """The seqs of the newest ``n`` rows of ``skill`` (of all skills for None), oldest first: what a skill's
        speakers are read from (:mod:`.voice`)."""
        with self._lock:
            if skill is None:
                return self._seqs[max(0, self._n - n):self._n].tolist()
            code = self._skills.get(skill)
            return [] if code is None else self._seqs[self._by_skill.of(code)[-n:]].tolist()

    def seqs_of(self, ids: list[str]) -> dict[str, int]:
        """``{id: seq}`` of those of ``ids`` the mirror holds (how :mod:`.seqrows` reads their rows)."""
        with self._lock:
            seqs = self._seqs
            return {rid: int(seqs[p]) for rid in ids if (p := self._pos.get(rid)) is not None}

    def around(self, ids: list[str], radius: int, now: float, allow: set[str] | None = None
               ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """The rows ``ids`` and the live rows of their skills within ``radius`` of them, in each skill's order.

        Returns ``(ids, skill codes, ordinals, vectors)``: a row's ordinal is its
        place among its skill's rows (what recall's passage context counts in).
        ``allow`` keeps only those ids (a metadata filter's matches).
        """
        with self._lock:
            found: dict[int, int] = {}
            for rid in ids:
                p = self._pos.get(rid)
                if p is None:
                    continue
                rows = self._by_skill.of(int(self._skill_codes[p]))
                o = int(self._ords[p])  # kept at append: bisecting a 1M-row skill's list took ~5 us a row
                lo = max(0, o - radius)
                for q, r in enumerate(rows[lo:o + radius + 1].tolist(), lo):
                    found[r] = q
            pos = np.fromiter(found, dtype=np.int64, count=len(found))
            ords = np.fromiter(found.values(), dtype=np.int64, count=len(found))
            keep = self._expires[pos] > now
            if allow is not None:
                keep &= np.fromiter((rid in allow for rid in self._ids[pos].tolist()), dtype=bool, count=len(pos))
            pos, ords = pos[keep], ords[keep]
            return self._ids[pos].tolist(), self._skill_codes[pos], ords, self._mat[pos]

    def _exact_among(self, vec: np.ndarray, k: int, allow: set[str], now: float) -> list[tuple[str, float]]:
        pos = np.fromiter((p for rid in allow if (p := self._pos.get(rid)) is not None), dtype=np.int64)
        pos = pos[self._expires[pos] > now]
        if not len(pos):
            return []
        sims = _dot(self._mat[pos], vec)
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
        rows = self._q8.candidates(vec, k, n, pos)  # a superset of the top k, read from the int8 copy
        if rows is None:
            rows = pos
        sims = _dot(self._mat[:n], vec) if rows is None else _dot(self._mat[rows], vec)
        top = best(sims, min(k, sims.shape[0]))
        real = top if rows is None else rows[top]
        ids = self._ids
        return [(ids[p], s) for p, s in zip(np.asarray(real).tolist(), sims[top].tolist())]

    def _positions(self, seqs: np.ndarray) -> np.ndarray:
        """The mirror positions of ``seqs`` (-1: not held), from a seq-indexed table kept up to date here (binary
        searches of 160 graph hits in 1M seqs miss the CPU cache at each step: 0.15-0.4 ms, this 0.03-0.09)."""
        n = self._n
        if self._seq_pos_n != n:
            new = self._seqs[self._seq_pos_n:n]
            top = int(new[-1]) + 1
            if len(self._seq_pos) < top:  # grown by doubling, so appends stay linear overall
                grown = np.full(max(top, 2 * len(self._seq_pos)), -1, dtype=np.int64)
                grown[: len(self._seq_pos)] = self._seq_pos
                self._seq_pos = grown
            self._seq_pos[new] = np.arange(self._seq_pos_n, n, dtype=np.int64)
            self._seq_pos_n = n
        out = np.full(len(seqs), -1, dtype=np.int64)
        inside = (seqs >= 0) & (seqs < len(self._seq_pos))
        out[inside] = self._seq_pos[seqs[inside]]
        return out

    def _ann_search(self, vec: np.ndarray, k: int, code: int | None, now: float) -> list[tuple[str, float]] | None:
        # Past the rows the caller wants, room for those the mirror drops (expired, deleted since, another
        # skill). Unfiltered, those are rare: 4x, with the walk's breadth (usearch walks max(expansion, count)
        # wide) at least twice ef_search; a skill filter drops most of what the graph returns: 8x.
        fetch = min(self._n, max(4 * k, 2 * _EF) if code is None else max(8 * k, 64))
        found = self._ann.search(vec, fetch, threads=1)  # one query: a thread pool only adds hand-offs
        seqs = np.asarray(found.keys, dtype=np.int64)
        pos = self._positions(seqs)
        labels = pos[pos >= 0]  # -1: a row deleted by another process since this mirror loaded
        labels = labels[self._live(labels, code, now)]
        # Exact cosines from the float32 mirror (the graph's are bfloat16), in exact order.
        sims = _dot(self._mat[labels], vec)
        order = np.argsort(-sims, kind="stable")
        labels, sims = labels[order], sims[order]
        if len(labels) < k and fetch < self._n:
            return None  # the filter is selective: the exact scan of the matching rows is both right and cheap
        ids = self._ids  # Python ints and floats at once (float() of each float32 element is the same value)
        return [(ids[p], s) for p, s in zip(labels[:k].tolist(), sims[:k].tolist())]
