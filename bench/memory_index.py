"""The in-process vector index: usearch (engrain's) beside hnswlib (its former one), on the same vectors.

Called by ``bench/memory.py --index-sizes`` (or alone: ``python bench/memory_index.py 10000,100000``).
Both graphs get the parameters engrain uses (M 16, ef_construction 100, ef_search 80)
and the records of ``memory_corpus.py``; per size and library, in one process:

* build: wall time of adding every vector (both libraries use all cores; usearch's float32 graph only up to 100k);
* memory: resident memory the graph adds (``VmRSS`` before and after, vectors
  already loaded), and the size of its saved file;
* search: p50/p95 of one query (160 neighbours: what an unfiltered recall asks for),
  over ``--queries`` questions embedded with the default model, the two libraries
  alternating per query so load hits them alike;
* recall@10 against exact search (numpy over the same vectors).

hnswlib is optional here (no longer a dependency; it compiles from source): without it only usearch runs.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import memory_corpus as mc  # noqa: E402

M, EF_CONSTRUCTION, EF = 16, 100, 80
FETCH = 160  # an unfiltered recall: max(4 * 40 candidates, 2 * ef)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Usearch:
    def __init__(self, dtype: str):
        self.dtype = dtype
        self.name = f"usearch {dtype}"

    def build(self, vecs: np.ndarray) -> None:
        from usearch.index import Index

        self.ix = Index(ndim=vecs.shape[1], metric="ip", dtype=self.dtype, connectivity=M,
                        expansion_add=EF_CONSTRUCTION, expansion_search=EF)
        self.ix.add(np.arange(len(vecs), dtype=np.uint64), vecs)

    def search(self, q: np.ndarray, k: int) -> np.ndarray:
        return np.asarray(self.ix.search(q, k, threads=1).keys, dtype=np.int64)

    def save(self, path: str) -> None:
        self.ix.save(path)


class Hnswlib:
    name = "hnswlib"

    def build(self, vecs: np.ndarray) -> None:
        import hnswlib

        self.ix = hnswlib.Index(space="ip", dim=vecs.shape[1])
        self.ix.init_index(max_elements=len(vecs), ef_construction=EF_CONSTRUCTION, M=M)
        self.ix.set_ef(EF)
        self.ix.add_items(vecs, np.arange(len(vecs)))

    def search(self, q: np.ndarray, k: int) -> np.ndarray:
        return self.ix.knn_query(q.reshape(1, -1), k=k)[0][0].astype(np.int64)

    def save(self, path: str) -> None:
        self.ix.save_index(path)


def libraries(n: int) -> list[Any]:
    # float32 graphs only up to 100k: they walk slower than bfloat16 at the same recall, and at 1M build for long.
    out: list[Any] = [Usearch("bf16")] + ([Usearch("f32")] if n <= 100_000 else [])
    try:
        import hnswlib  # noqa: F401
    except ImportError:
        print("  (hnswlib not installed: usearch alone)")
    else:
        out.append(Hnswlib())
    return out


def compare(n: int, n_queries: int = 200) -> dict[str, dict[str, float]]:
    """Build, memory, search p50/p95 and recall@10 vs exact for each library at ``n`` records."""
    from engrain._memory.embed import default_embedder

    _, vecs = mc.corpus(n)
    qv = default_embedder().embed(mc.queries(n_queries, n))
    exact = [set(np.argsort(-(vecs @ q))[:10].tolist()) for q in qv]
    res: dict[str, dict[str, float]] = {}
    libs = libraries(n)
    for lib in libs:
        gc.collect()
        before = rss_mb()
        t = time.perf_counter()
        lib.build(vecs)
        res[lib.name] = {"build_s": time.perf_counter() - t, "rss_mb": rss_mb() - before}
        with tempfile.TemporaryDirectory() as d:
            f = os.path.join(d, "graph")
            lib.save(f)
            res[lib.name]["file_mb"] = os.path.getsize(f) / 2**20
    lat: dict[str, list[float]] = {lib.name: [] for lib in libs}
    hits: dict[str, int] = {lib.name: 0 for lib in libs}
    for q, ex in zip(qv, exact):
        for lib in libs:
            t = time.perf_counter()
            got = lib.search(q, FETCH)
            lat[lib.name].append((time.perf_counter() - t) * 1000)
            hits[lib.name] += len(ex & set(got[:10].tolist()))
    for lib in libs:
        xs = sorted(lat[lib.name])
        res[lib.name].update(p50=statistics.median(xs), p95=xs[max(0, int(len(xs) * 0.95) - 1)],
                             recall10=hits[lib.name] / (10 * len(qv)))
    return res


def report(sizes: list[int], n_queries: int = 200) -> None:
    print(f"\nin-process vector index (M {M}, ef_construction {EF_CONSTRUCTION}, ef {EF}; {FETCH} neighbours per "
          f"search, {n_queries} queries; load average {os.getloadavg()[0]:.1f}, 2 shared cores):")
    print(f"  {'size':>8} {'library':<13} {'build s':>8} {'RSS MB':>7} {'file MB':>8} {'p50 ms':>7} {'p95 ms':>7} "
          f"{'recall@10':>9}")
    for n in sizes:
        for name, r in compare(n, n_queries).items():
            print(f"  {n:>8} {name:<13} {r['build_s']:>8.1f} {r['rss_mb']:>7.0f} {r['file_mb']:>8.0f} {r['p50']:>7.2f} "
                  f"{r['p95']:>7.2f} {r['recall10']:>9.3f}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    report([int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "10000,100000").split(",")])
