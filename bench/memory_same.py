"""Do two trees' ``recall`` give the same results? (a check for changes meant to be faster, not different)

``dump`` runs recalls with one tree's ``src`` (``--src``) and writes every
result (tier, id, score, content, metadata, provenance, in order) to a JSON
file; ``compare`` says whether two dumps are identical. The clock recall reads
is fixed (recency would otherwise move between the runs). Recalls run on copies
of the memory bench's cached SQLite stores (10k, 100k; ``memory.py`` builds
them) and on a small store with articles (``build``: 3,000 records of the
corpus, consolidated, made once and copied for each run), with labels,
``neighbours=True``, metadata filters, skills and top_k 1/5/10 mixed in.
``--pg`` runs them on the memory bench's PostgreSQL + pgvector stores instead
(read in place) and on a store with articles made the same way in schema
``mem_same_articles`` of its database.
Usage:
    python bench/memory_same.py build OUT_DIR
    python bench/memory_same.py dump OUT_DIR --src PATH/src --out a.json [--sizes 10000,100000] [--queries 300] [--pg]
    python bench/memory_same.py compare a.json b.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOW = 1_790_000_000.0  # the clock every recall reads (after the stores were filled)


class _Clock:
    """``time`` for the recall module: a fixed ``time()``, everything else the real one."""

    def __init__(self, real):  # noqa: ANN001
        self._real = real

    def time(self) -> float:
        return NOW

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._real, name)


def _recalls(mem, qs: list[str], variants: bool) -> list:  # noqa: ANN001
    import memory_corpus as mc

    out = []
    for i, q in enumerate(qs):
        kw: dict = {}
        if variants:
            kw = [{}, {"top_k": 10}, {"top_k": 1}, {"skill": mc.skill(i)}, {"neighbours": True},
                  {"label": "ops"}, {"where": {"user": mc.user(i)}}, {"top_k": 3, "neighbours": True}][i % 8]
        elif i % 5 == 4:
            kw = {"top_k": 10}
        res = mem.recall(q, **kw)
        out.append({"q": q, "kw": kw, "hits": [r.to_dict() for r in res]})
    return out


def build(out: Path) -> None:
    sys.path.insert(0, str(ROOT / "src"))
    import memory_corpus as mc

    from engrain._memory.embed import default_embedder

    out.mkdir(parents=True, exist_ok=True)
    path = out / "articles.db"
    for f in out.glob("articles.db*"):
        f.unlink()
    texts, vecs = mc.corpus(3000)

    class Lookup:
        dim = 384
        name = default_embedder().name
        by = dict(zip(texts, vecs))

        def embed(self, xs: list[str]):  # noqa: ANN201
            import numpy as np

            real = default_embedder()  # articles' texts: the real model
            return np.stack([self.by[x] if x in self.by else real.embed([x])[0] for x in xs]).astype(np.float32)

    fill(f"sqlite:///{path}", Lookup())


def fill(url: str, embedder) -> None:  # noqa: ANN001
    """The store with articles at ``url``: 2,000 records consolidated, 1,000 more after them."""
    import memory_corpus as mc

    from engrain._memory import Memory
    from engrain._memory.synth import ExtractiveSynthesizer

    texts, _ = mc.corpus(3000)
    mem = Memory(url, embedder=embedder, synthesizer=ExtractiveSynthesizer())
    mem.remember_many([{"data": t, "skill": mc.skill(i % 5), "metadata": {"user": mc.user(i % 40)},
                        "label": "ops" if i % 7 == 0 else None, "hint": (i % 10) / 10 if i % 3 else None}
                       for i, t in enumerate(texts[:2000])])
    summary = mem.consolidate(num_records=1200)
    mem.remember_many([{"data": t, "skill": mc.skill(i % 5), "metadata": {"user": mc.user(i % 40)}}
                       for i, t in enumerate(texts[2000:3000])])
    print(f"built {url}: {mem.stats()}; {summary}")
    mem.close()


def _pg_runs(sizes: list[int]) -> list:
    """The bench's PostgreSQL stores, and one with articles (schema ``mem_same_articles``, filled once)."""
    import memory_pg as mp
    from memory import pgvector_url

    import psycopg

    pg = pgvector_url()
    mp.ready(pg, 0)  # creates the bench database if missing
    url = mp.store_url(pg, 0).replace("mem_0_" + mp.VERSION, "mem_same_articles")
    with psycopg.connect(mp._db_url(pg, mp.DB), autocommit=True) as c:
        try:
            done = c.execute("SELECT value FROM mem_same_articles.engrain_mem_state WHERE name = 'same:ready'").fetchone()
        except psycopg.Error:
            done = None
        if not done:
            c.execute("DROP SCHEMA IF EXISTS mem_same_articles CASCADE")
            c.execute("CREATE SCHEMA mem_same_articles")
    if not done:
        from engrain._memory.embed import default_embedder

        fill(url, default_embedder())
        with psycopg.connect(mp._db_url(pg, mp.DB), autocommit=True) as c:
            c.execute("INSERT INTO mem_same_articles.engrain_mem_state (name, value) VALUES ('same:ready', 1)")
    return [("pg articles", url, 3000)] + [(f"pg {n}", mp.store_url(pg, n), n) for n in sizes]


def dump(work: Path, src: str, dest: Path, sizes: list[int], n_q: int, pg: bool = False) -> None:
    sys.path.insert(0, src)
    import memory_corpus as mc

    from engrain._memory import api
    from engrain._memory.api import Memory
    from engrain._memory.embed import default_embedder
    from engrain._memory.synth import ExtractiveSynthesizer

    api.time = _Clock(api.time)  # type: ignore[assignment]
    result: dict = {}
    runs = [(f"articles", work / "articles.db", 3000, True)]
    for n in sizes:
        texts, vecs = mc.corpus(n)
        runs.append((f"{n}", mc.CACHE / f"sqlite-{n}-{mc.version(texts, vecs)}.db", n, False))
    if pg:  # recalls on PostgreSQL + pgvector (every kind of call mixed in); its stores are read, not copied
        for name, url, n in _pg_runs(sizes):
            mem = Memory(url, embedder=default_embedder(), synthesizer=ExtractiveSynthesizer())
            qs = list(dict.fromkeys(mc.queries(n_q * 2, n)))[:n_q]
            result[name] = _recalls(mem, qs, True)
            result[name + " again"] = _recalls(mem, qs[: n_q // 3], True)
            mem.close()
            print(f"{name}: {len(qs)} queries", flush=True)
        dest.write_text(json.dumps(result))
        return
    for name, path, n, variants in runs:
        copy = work / f"run-{name}.db"
        for f in work.glob(copy.name + "*"):
            f.unlink()
        shutil.copyfile(path, copy)
        for side in (".record.usearch", ".record.usearch.json"):
            if Path(str(path) + side).exists():
                shutil.copyfile(str(path) + side, str(copy) + side)
        mem = Memory(f"sqlite:///{copy}", embedder=default_embedder(), synthesizer=ExtractiveSynthesizer())
        qs = list(dict.fromkeys(mc.queries(n_q * 2, n)))[:n_q]
        result[name] = _recalls(mem, qs, variants)
        result[name + " again"] = _recalls(mem, qs[: n_q // 3], variants)  # repeated queries: cached vectors, words
        mem.close()
        print(f"{name}: {len(qs)} queries", flush=True)
    dest.write_text(json.dumps(result))


def compare(a: Path, b: Path) -> int:
    x, y = json.loads(a.read_text()), json.loads(b.read_text())
    bad = 0
    for name in x:
        for i, (p, q) in enumerate(zip(x[name], y.get(name, []))):
            if p != q:
                bad += 1
                if bad <= 5:
                    print(f"{name} #{i} {p['q']!r} {p['kw']}:\n  {[(h['id'], h['score']) for h in p['hits']]}\n  "
                          f"{[(h['id'], h['score']) for h in q['hits']]}")
        hits = sum(len(r["hits"]) for r in x[name])
        print(f"{name}: {len(x[name])} recalls, {hits} hits, {'same' if len(x[name]) == len(y.get(name, [])) else 'COUNT DIFFERS'}")
    print("IDENTICAL" if bad == 0 else f"{bad} recalls differ")
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=["build", "dump", "compare"])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--src", default=str(ROOT / "src"))
    ap.add_argument("--out", default="recalls.json")
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--pg", action="store_true", help="dump: recall on the bench's PostgreSQL + pgvector stores")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    if a.cmd == "build":
        build(Path(a.paths[0]))
    elif a.cmd == "dump":
        dump(Path(a.paths[0]), a.src, Path(a.out), [int(s) for s in a.sizes.split(",") if s.strip()], a.queries,
             a.pg)
    else:
        raise SystemExit(compare(Path(a.paths[0]), Path(a.paths[1])))


if __name__ == "__main__":
    main()
