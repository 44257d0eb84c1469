"""Skill memory: per-sentence vectors for long records, max-sim at ranking (an idea of issue 25, measured).

A record of at least ``--min-words`` words whose text holds two or more
sentences is also embedded sentence by sentence (``--window`` sentences a
piece; on LoCoMo each piece keeps the ``"<speaker>: "`` head of its turn).
At ranking, a record's cosine becomes ``whole + alpha * max(0, best piece -
whole)``: its own cosine, lifted part way toward its best sentence's. The
record's pieces also bring it in as a vector candidate. The rest of
:meth:`Memory.recall` (text weight, passage context, priors) is unchanged.

The library is not changed: the script wraps a filled store's vector mirror
(``search`` and ``around``) with the pieces' vectors, on bench/memory_quality.py's
sets, its stores and its embedding cache, and scores ``engrain`` (recall) and
``dense`` (vector search alone) with and without the pieces, all sets in one run.

Measured 2026-11-26 22:50-23:01 (load 3.4-7.5, 2 cores shared with other work; default embedder; any@5
all@5 any@10 sess@1; a config is min_words:window:alpha). All four sets in one run:

    set        whole records            +pieces 30:1:0.5         +pieces 20:1:0.5         +pieces 30:1:1.0 (max)
    LoCoMo dev .684 .554 .788 .667      .701 .576 .799 .684      .695 .568 .802 .675      .655 .556 .797 .655
    chat       .406 .246 .556 .592      .408 .246 .554 .589      .404 .246 .558 .592      .400 .240 .558 .590
    FAQ sv     .528 .610 (any@5 @10)    .514 .596                .540 .594                .494 .578
    FAQ en     .821 .901                .815 .889                .817 .895                .769 .853

LoCoMo per conversation (any@5 / sess@1), whole against 30:1:0.5: 26 .707/.713 -> .713/.713, 30 .667/.654
-> .716/.704, 44 .667/.618 -> .675/.634. A second run (locomo, FAQ): 30:1:0.25 LoCoMo .689 .559 .797 .686
(44's any@5 .667 -> .650), FAQ sv .528 .602, FAQ en .821 .895; 30:1:0.0 (pieces bring candidates, no lift)
gives the baseline exactly. Dense search alone gains most (LoCoMo .477 -> .571 any@5), but inside the
hybrid the gain is 4-6 of 354 questions, the FAQ sets lose 3-7 of ~500, and writing LoCoMo's turns
embeds 2.6x the texts (1,463 records + 2,357 pieces: 68 -> 33 records/s on the loaded machine).
Not adopted in the library: no configuration helped LoCoMo and held on every other set.

Usage:
    python bench/memory_sentences.py [--sets locomo,chat,faq-sv,faq-en] [--configs 30:1:0.5,20:1:0.5]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))
import memory_quality as mq  # noqa: E402

_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=\S)")
#: LoCoMo's record head, "<speaker> (<session date_time>): ".
_HEAD = re.compile(r"^([^()]{1,40}) \(([^)]*)\): ")


def pieces(text: str, min_words: int, window: int) -> list[str]:
    """The sentence windows of a long record (none for a short or one-sentence one)."""
    if len(text.split()) < min_words:
        return []
    head, body = "", text
    m = _HEAD.match(text)
    if m:  # the speaker stays with each sentence; the date is the whole record's business
        head, body = m.group(1) + ": ", text[m.end():]
    sents = [s for s in _SENTENCE.split(body) if s.strip()]
    if len(sents) < 2:
        return []
    return [head + " ".join(sents[i:i + window]) for i in range(max(1, len(sents) - window + 1))]


class Pieces:
    """A filled store's vector mirror, wrapped so each record's cosine counts its best piece."""

    def __init__(self, st: mq.Store, ds: mq.Dataset, tag: str, min_words: int, window: int, alpha: float):
        self.idx, self.alpha = st.mem._records, alpha
        self.skill_of = {rid: t.owner for rid, t in zip(st.ids, ds.turns)}
        texts: list[str] = []
        parent: list[str] = []
        for rid, t in zip(st.ids, ds.turns):
            ps = pieces(t.text, min_words, window)
            texts += ps
            parent += [rid] * len(ps)
        self.n = len(texts)
        cached = mq.Cached(st.embedder.inner)
        if texts:
            cached.preload(texts, f"pieces-{tag}")
        self.vecs = cached.embed(texts)
        self.parent = np.array(parent)
        self.rows: dict[str, list[int]] = {}
        for j, p in enumerate(parent):
            self.rows.setdefault(p, []).append(j)
        self.qv: np.ndarray | None = None
        self.search0, self.around0 = self.idx.search, self.idx.around

    def __enter__(self) -> Pieces:
        self.idx.search, self.idx.around = self.search, self.around
        return self

    def __exit__(self, *exc: Any) -> None:
        self.idx.search, self.idx.around = self.search0, self.around0

    def lifted(self, rid: str, whole: float) -> float:
        rows = self.rows.get(rid)
        if not rows or self.qv is None:
            return whole
        best = float(np.max(self.vecs[rows] @ self.qv))
        return whole + self.alpha * max(0.0, best - whole)

    def search(self, vec: np.ndarray, k: int, skill: str | None, now: float, allow: set[str] | None = None
               ) -> list[tuple[str, float]]:
        self.qv = vec  # recall searches before it reads windows: around() scores against this query
        whole = dict(self.search0(vec, k, skill, now, allow))
        extra: list[str] = []
        for j in np.argsort(-(self.vecs @ vec)) if self.n else ():
            p = str(self.parent[j])
            if p not in whole and p not in extra and (skill is None or self.skill_of.get(p) == skill):
                extra.append(p)
                if len(extra) >= k:
                    break
        if extra:
            ids, _, _, vecs = self.around0(extra, 0, now, allow)
            whole.update(zip(ids, (vecs @ vec).tolist()))
        return sorted(((i, self.lifted(i, c)) for i, c in whole.items()), key=lambda h: -h[1])[:k]

    def around(self, ids: list[str], radius: int, now: float, allow: set[str] | None = None) -> tuple:
        got, groups, ords, vecs = self.around0(ids, radius, now, allow)
        if self.qv is None or not len(got):
            return got, groups, ords, vecs
        lifted = [self.lifted(i, c) for i, c in zip(got, (vecs @ self.qv).tolist())]
        # Recall reads a row's cosine as vector @ query: a row of lifted * query gives exactly that.
        return got, groups, ords, np.outer(np.asarray(lifted, np.float32), self.qv).astype(np.float32)


def row(label: str, sc: dict[str, float], owners: list[str]) -> str:
    per = "  ".join(f"{o.rsplit('-', 1)[-1]} {sc[f'{o} any@5']:.3f}/{sc[f'{o} session@1']:.3f}"
                    for o in owners if f"{o} any@5" in sc)
    return f"{label:<34} {sc['any@5']:.3f} {sc['all@5']:.3f} {sc['any@10']:.3f} {sc['session@1']:.3f}  {per}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="locomo,chat,faq-sv,faq-en")
    ap.add_argument("--configs", default="30:1:0.5,20:1:0.5,30:1:1.0",
                    help="comma list of min_words:window:alpha")
    ap.add_argument("--cost", type=int, default=1, help="time embedding LoCoMo's turns with and without pieces")
    a = ap.parse_args(argv)
    from engrain._memory.embed import default_embedder

    emb = default_embedder()
    with tempfile.TemporaryDirectory(prefix="engrain-pieces-") as d:
        for name in [x for x in a.sets.split(",") if x]:
            if name == "locomo":
                folder = mq.locomo_dir()
                if folder is None:
                    print("locomo: skipped (no LoCoMo dev split under ../shared/data/locomo-dev)")
                    continue
                ds = mq.build_locomo(folder)
            elif name == "chat":
                ds = mq.build(mq.load_corpus())
            else:
                ds = mq.build_faq(mq.load_faq(name[-2:]))
            st = mq.fill(ds, emb, "plain", Path(d), name)
            res = mq.run_methods(ds, st, ["engrain", "dense"])
            lines = [row(f"{m} (whole records)", res[m][0], ds.owners) for m in ("engrain", "dense")]
            for cfg in [c for c in a.configs.split(",") if c]:
                mw, win, alpha = cfg.split(":")
                with Pieces(st, ds, name, int(mw), int(win), float(alpha)) as p:
                    r = mq.run_methods(ds, st, ["engrain", "dense"])
                lines += [row(f"{m} +pieces {cfg} ({p.n})", r[m][0], ds.owners) for m in ("engrain", "dense")]
            st.mem.close()
            print(f"\n{name}: {len(ds.turns)} records, {len(ds.questions)} questions; any@5 all@5 any@10 sess@1 "
                  f"(load {os.getloadavg()[0]:.1f})")
            print("\n".join(lines), flush=True)
            if name == "locomo" and a.cost:
                texts = [t.text for t in ds.turns]
                extra = [p for t in texts for p in pieces(t, 30, 1)]
                for label, batch in (("records", texts), ("records + pieces 30:1", texts + extra)):
                    t0 = time.perf_counter()
                    emb.embed(batch)
                    dt = time.perf_counter() - t0
                    print(f"  embedding {label}: {len(batch)} texts in {dt:.1f}s = {len(texts) / dt:.0f} records/s")


if __name__ == "__main__":
    main()
