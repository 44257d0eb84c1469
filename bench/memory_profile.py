"""Where one recall's time goes, per phase, on the memory bench's cached SQLite stores (``memory.py`` builds them).

Each phase is timed by wrapping the function that does it (perf counters around
the call, nothing else changed), over ``--queries`` distinct queries after a
warm-up, the recent-vector cache cleared so every query pays its embedding:

* ``embed``: the query embedding (tokenizer + onnxruntime);
* ``refresh``: the store's counters and the vector mirrors' catch-up;
* ``vector``: the record and article vector searches;
* ``text``: full-text search;
* ``context``: cosines of text-only hits, passage context, pruning, temporal prior;
* ``fetch``: reading the candidates' rows (records, articles);
* ``score``: scoring the candidates, less ``fetch``;
* ``write``: the recall event left in the buffer;
* ``other``: the rest of ``recall`` (argument checks, text weight, candidate dicts, waiting for side work).

Work that runs on the recall's worker thread (the full text, :func:`engrain._memory.query.start_beside`)
is printed apart: it overlaps the embedding and the vector search, so it is not part of the sum.

Where text and refresh run beside the embedding (:mod:`engrain._memory.query`), the span
of the three is printed too, and ``other`` counts only that span on the critical path.

``--src`` picks the tree whose ``src`` is imported (A/B against another worktree).
``--cprofile`` also prints cProfile's top functions by own time. Usage:
    python bench/memory_profile.py [--sizes 10000,100000] [--queries 300] [--src PATH] [--cpu] [--cached] [--cprofile]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import os
import pstats
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--src", default=str(ROOT / "src"))
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--cached", action="store_true",
                    help="also time recalls whose query vectors are already kept (engrain's own part alone), words "
                         "learned (two passes over the queries; CPU time)")
    ap.add_argument("--cpu", action="store_true",
                    help="time phases in this thread's CPU time (time.thread_time), not wall time: less swayed by load")
    a = ap.parse_args()
    sys.path.insert(0, a.src)
    sys.path.insert(1, str(ROOT / "bench"))
    import memory_corpus as mc

    from engrain._memory import api, ranking
    from engrain._memory.api import Memory
    from engrain._memory.embed import default_embedder
    from engrain._memory.synth import ExtractiveSynthesizer

    clock = time.thread_time if a.cpu else time.perf_counter
    print(f"src {a.src}; {'CPU' if a.cpu else 'wall'} time; load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    for n in [int(s) for s in a.sizes.split(",") if s.strip()]:
        texts, vecs = mc.corpus(n)
        path = mc.CACHE / f"sqlite-{n}-{mc.version(texts, vecs)}.db"
        if not path.exists():
            print(f"{path} missing: run bench/memory.py --build-only --sizes {n}")
            continue
        mem = Memory(f"sqlite:///{path}", embedder=default_embedder(), synthesizer=ExtractiveSynthesizer())
        qs = list(dict.fromkeys(mc.queries(a.queries * 2, n)))[: a.queries]
        for q in qs[:20]:
            mem.recall(q)
        spent: dict[str, float] = {}
        local = threading.local()

        def timed(name: str, fn):  # noqa: ANN001, ANN202
            @functools.wraps(fn)
            def wrap(*args, **kw):  # noqa: ANN002, ANN003, ANN202
                if name.startswith("="):  # a wall-clock span around other phases: not part of the sum
                    t = clock()
                    try:
                        return fn(*args, **kw)
                    finally:
                        spent[name] = spent.get(name, 0.0) + clock() - t
                if threading.current_thread().name.startswith("engrain-recall"):  # side work, beside the rest
                    t = clock()
                    try:
                        return fn(*args, **kw)
                    finally:
                        spent["~" + name] = spent.get("~" + name, 0.0) + clock() - t
                stack = local.__dict__.setdefault("stack", [])  # per thread: side work runs on a worker
                if stack:  # nested in a timed phase: counted once, in the outer one, except fetch inside score
                    if not (name == "fetch" and stack[-1] == "score"):
                        return fn(*args, **kw)
                stack.append(name)
                t = clock()
                try:
                    return fn(*args, **kw)
                finally:
                    dt = clock() - t
                    stack.pop()
                    spent[name] = spent.get(name, 0.0) + dt
                    if name == "fetch" and stack and stack[-1] == "score":
                        spent["score"] = spent.get("score", 0.0) - dt
            return wrap

        emb = mem.embedder
        patches = [(emb, "embed", "embed"), (mem.store, "state", "refresh"), (mem._records, "refresh", "refresh"),
                   (mem._articles, "refresh", "refresh"), (mem._records, "search", "vector"),
                   (mem._articles, "search", "vector"), (mem.store, "text_search", "text"),
                   (ranking, "fill_cosines", "context"), (ranking, "add_context", "context"),
                   (ranking, "prune", "context"), (api._temporal, "prior", "context"),
                   (mem.store, "records", "fetch"), (mem.store, "articles", "fetch"),
                   (ranking, "score", "score"), (mem.store, "add_recall_event", "write")]
        if hasattr(api, "embed_beside"):
            patches.append((api, "embed_beside", "=embed with text/refresh beside it (wall)"))
        saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
        for obj, attr, name in patches:
            setattr(obj, attr, timed(name, getattr(obj, attr)))
        if hasattr(mem, "_qcache"):
            mem._qcache.clear()
        total = []
        for q in qs:
            t = clock()
            mem.recall(q)
            total.append(clock() - t)
            if hasattr(mem, "_qcache"):
                mem._qcache.clear()
        for obj, attr, fn in saved:
            setattr(obj, attr, fn)
        n_q = len(qs)
        mean = sum(total) / n_q * 1000
        parts = {k: v / n_q * 1000 for k, v in spent.items()}
        wall = parts.pop("=embed with text/refresh beside it (wall)", None)
        beside = {k[1:]: parts.pop(k) for k in list(parts) if k.startswith("~")}
        known = sum(parts.values())
        if wall is not None:  # text and refresh ran beside the embedding: the span replaces the three
            known += wall - parts.get("embed", 0.0) - parts.get("text", 0.0) - parts.get("refresh", 0.0)
        parts["other"] = mean - known
        print(f"\n{n} records, {n_q} queries: recall mean {mean:.2f} ms, p50 {statistics.median(total) * 1000:.2f} ms; "
              f"without embed {mean - parts.get('embed', 0.0):.2f} ms")
        for k in ("embed", "refresh", "vector", "text", "context", "fetch", "score", "write", "other"):
            print(f"  {k:<8} {parts.get(k, 0.0):6.3f} ms")
        for k, v in beside.items():  # on the worker thread, beside the embedding and the vector search
            print(f"  {k:<8} {v:6.3f} ms on a worker thread, beside the rest (not in the sum; waiting for it is in other)")
        if wall is not None:
            print(f"  (text and refresh ran beside the embedding: that span took {wall:.3f} ms, "
                  f"{wall - parts.get('embed', 0.0):.3f} more than the embedding alone)")
        if a.cached:
            cq = qs[: getattr(mem._qcache, "size", 200)]  # more than the cache keeps would miss every time
            vecs = emb.embed(cq)
            for q, vec in zip(cq, vecs):
                vec.setflags(write=False)
                if isinstance(mem._qcache, dict):  # the older tree's cache: (embedder name, text) -> vector
                    mem._qcache[(emb.name, q)] = vec
                else:
                    mem._qcache.put(emb, q, vec)
            for q in cq:
                mem.recall(q)
            own = []
            for q in cq:
                t = time.thread_time()
                mem.recall(q)
                own.append(time.thread_time() - t)
            print(f"  query vectors kept, words learned: recall CPU p50 {statistics.median(own) * 1000:.3f} ms, "
                  f"mean {sum(own) / len(own) * 1000:.3f} ms")
        if a.cprofile:
            prof = cProfile.Profile()
            prof.enable()
            for q in qs:
                mem.recall(q)
                if hasattr(mem, "_qcache"):
                    mem._qcache.clear()
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        mem.close()


if __name__ == "__main__":
    main()
