"""The memory benchmark's corpus: up to 1M varied records, cheap to build, the same on every system.

Embedding 1M texts with MiniLM on two shared cores takes hours, so the corpus is
built from a pool:

* a pool of ``POOL`` (20k) unique sentences (``sentences()``: who did what to which
  system, where, when, with a ticket number) is embedded once, exactly, in batches
  (cached under ``$ENGRAIN_BENCH_CACHE``, default ``/var/tmp/engrain-bench``: the 1M
  stores take several GB and half an hour each to build, so they live where
  a reboot or a clean of /tmp keeps them);
* record ``i < POOL`` is pool sentence ``i`` with its exact embedding;
* record ``i >= POOL`` joins two pool sentences chosen at random (their ticket
  numbers replaced by the record's own) and its vector is the normalised sum of
  the two sentences' exact embeddings. MiniLM mean-pools its token vectors, so a
  two-sentence text embeds close to that; :func:`derived_fidelity` measures how
  close (cosine to the true embedding of a sample), and the bench prints it.

Every record has a skill (``team0`` .. ``team49``, 2% each) and metadata
``{"user": "u0" .. "u999"}`` (0.1% each), so filtered recalls have something to
filter. Sizes are prefixes of one corpus: the 10k set is all exact embeddings.
Cached stores are named by :func:`version`, a digest of the records themselves,
so a change to the corpus makes new stores instead of measuring stale ones.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

POOL = 20_000
SKILLS = 50
USERS = 1000
CACHE = Path(os.environ.get("ENGRAIN_BENCH_CACHE") or "/var/tmp/engrain-bench")

NAMES = "Alice Bob Carol Dave Erin Frank Grace Heidi Ivan Judy Mallory Niaj Olivia Peggy Rupert Sybil Trent Victor Walter Yolanda".split()
VERBS = ["fixed", "reported", "deployed", "reviewed", "scheduled", "cancelled", "approved", "migrated", "tested",
         "documented", "rolled back", "escalated", "benchmarked", "archived", "renamed"]
ADJS = ["flaky", "slow", "new", "legacy", "critical", "blue", "nightly", "shared", "encrypted", "temporary", "primary"]
OBJS = ["login service", "billing job", "search index", "payment gateway", "cache cluster", "mobile app", "data pipeline",
        "email queue", "analytics dashboard", "backup volume", "load balancer", "auth token", "invoice export",
        "chat widget", "GPU node", "DNS record", "feature flag", "report generator", "sensor feed", "CI runner"]
PLACES = ["Berlin", "Tokyo", "Lagos", "Lima", "Oslo", "Austin", "Pune", "Sydney", "Toronto", "Nairobi", "Madrid", "Seoul"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
METHOD = (f"corpus: {POOL} unique sentences embedded exactly; records past {POOL} join two pool sentences "
          "(own ticket number) with the normalised sum of their exact embeddings as vector")


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        out.append(f"{rng.choice(NAMES)} {rng.choice(VERBS)} the {rng.choice(ADJS)} {rng.choice(OBJS)} in "
                   f"{rng.choice(PLACES)} on {rng.choice(DAYS)} at {rng.randrange(24):02d}:{rng.randrange(60):02d} "
                   f"(ticket {seed * 1_000_000 + i}).")
    return out


def ticket(i: int) -> int:
    """Record ``i``'s ticket number (unique: a rare word the full-text half can find)."""
    return 1_000_000 + i


def queries(n: int, size: int) -> list[str]:
    """``n`` queries: questions over the vocabulary, and one in five names a ticket of the first ``size`` records."""
    rng = random.Random(7)
    forms = ["who {v} the {o} in {p}?", "what happened to the {o} on {d}", "{o} problems in {p}",
             "when was the {a} {o} {v}", "did anyone touch the {o} last {d}?", "what was ticket {t} about?"]
    return [rng.choice(forms).format(v=rng.choice(VERBS), o=rng.choice(OBJS), p=rng.choice(PLACES),
                                     d=rng.choice(DAYS), a=rng.choice(ADJS), t=ticket(rng.randrange(size)))
            for _ in range(n)]


def pool(quantized: bool = False, compute: str | None = None) -> tuple[list[str], np.ndarray]:
    """The pool sentences and their exact embeddings (embedded once, then cached).

    ``compute``: how the shipped MiniLM is computed (``engrain._memory.embed.MiniLMEmbedder``; default the
    default's, ``"fp32"`` as it ships, ``"dynamic"`` the opt-in ``"minilm-int8"``, as ``quantized=True``).
    """
    try:
        from engrain._memory.embed import default_embedder
    except ImportError:  # the ChromaDB peer's own venv: it loads embed.py by path, as engrain_embed (bench/memory.py)
        default_embedder = sys.modules["engrain_embed"].default_embedder

    texts = sentences(POOL, 1)
    CACHE.mkdir(parents=True, exist_ok=True)
    e = default_embedder(quantized, compute)
    f = CACHE / f"pool-{POOL}-{e.name}.npy"  # the embedder's name: a new model, a new pool
    if f.exists():
        v = np.load(f)
        if len(v) == POOL:
            return texts, v
    t = time.perf_counter()
    v = e.embed(texts)
    print(f"  (embedded the {POOL}-sentence pool in {time.perf_counter() - t:.0f}s; cached in {f})", flush=True)
    np.save(f, v)
    return texts, v


MAX = 1_000_000


def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The pool sentences joined in records ``POOL .. n-1``: always drawn for MAX records, so sizes are prefixes."""
    rng = np.random.default_rng(11)
    a = rng.integers(0, POOL, size=max(n, MAX) - POOL)
    b = (a + 1 + rng.integers(0, POOL - 1, size=len(a))) % POOL  # never a itself
    return a[:max(0, n - POOL)], b[:max(0, n - POOL)]


def corpus(n: int, quantized: bool = False, compute: str | None = None) -> tuple[list[str], np.ndarray]:
    """The first ``n`` records: texts and float32 unit vectors (deterministic; ``compute``: see :func:`pool`)."""
    ptexts, pvecs = pool(quantized, compute)
    base = [s.rsplit(" (ticket", 1)[0] for s in ptexts]
    texts = ptexts[:n]
    vecs = np.empty((n, pvecs.shape[1]), dtype=np.float32)
    vecs[:min(n, POOL)] = pvecs[:n]
    a, b = _pairs(n)
    for i0 in range(0, len(a), 100_000):
        aa, bb = a[i0:i0 + 100_000], b[i0:i0 + 100_000]
        v = pvecs[aa] + pvecs[bb]
        vecs[POOL + i0:POOL + i0 + len(aa)] = v / np.linalg.norm(v, axis=1, keepdims=True)
    texts += [f"{base[x]}; then {base[y][0].lower()}{base[y][1:]} (ticket {ticket(POOL + j)})."
              for j, (x, y) in enumerate(zip(a.tolist(), b.tolist()))]
    return texts, vecs


def skill(i: int) -> str:
    return f"team{i % SKILLS}"


def user(i: int) -> str:
    return f"u{(i * 7919) % USERS}"


def derived_fidelity(texts: list[str], vecs: np.ndarray, sample: int = 100) -> tuple[float, float] | None:
    """Median and minimum cosine between derived records' vectors and their true embeddings (None: no derived)."""
    if len(texts) <= POOL:
        return None
    from engrain._memory.embed import default_embedder

    rng = random.Random(3)
    idx = [rng.randrange(POOL, len(texts)) for _ in range(sample)]
    true = default_embedder().embed([texts[i] for i in idx])
    cos = np.sum(true * vecs[idx], axis=1)
    return float(np.median(cos)), float(cos.min())


def version(texts: list[str], vecs: np.ndarray, samples: int = 2000) -> str:
    """A short digest of the first ``len(texts)`` records (evenly sampled texts and vectors, and the count).

    Keys the cached stores: the same records give the same name on every run,
    and a change to the generator, the pool or its embeddings gives a new one.
    """
    h = hashlib.sha256(f"{len(texts)}:{vecs.shape[1]}".encode())
    for i in range(0, len(texts), max(1, len(texts) // samples)):
        h.update(texts[i].encode())
        h.update(np.round(vecs[i], 4).astype(np.float32).tobytes())
    h.update(texts[-1].encode())
    return h.hexdigest()[:10]
