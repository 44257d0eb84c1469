"""The exact scan's int8 first pass (``_memory/prefilter.py``) returns exactly the float32 scan's top k.

Vectors here are built to be hard: near-ties far closer than the int8 rounding,
exact duplicates across the k-th place, rows of very different lengths, one
dominant component. The float32 scan (``index._dot`` over every row, best first,
equal scores in row order) is the reference: the first pass must give the same
rows, scores and order, on the bare arrays and through a store's vector index
(SQLite, and PostgreSQL without pgvector, whose mirror is the same class).
"""

from __future__ import annotations

import sys
import time
import types
import uuid

import numpy as np
import pytest

from engrain._memory import Memory, prefilter
from engrain._memory.index import _dot
from engrain._memory.prefilter import PREFILTER_MIN, Int8Rows, best
from engrain._memory.synth import ExtractiveSynthesizer
from tests.conftest import drop_pg_schema, pg_schema_url

DIM = 384


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _adversarial(seed: int, n: int = 6000) -> tuple[np.ndarray, np.ndarray]:
    """Rows crowding a query's neighbourhood: ``(rows, query)``."""
    rng = np.random.default_rng(seed)
    q = _unit(rng.standard_normal(DIM))
    rows = _unit(rng.standard_normal((n, DIM)))
    # 400 rows at nearly one cosine with q (0.8), apart by 1e-7..1e-3: far inside the int8 rounding.
    base = _unit(rng.standard_normal(DIM))
    base = _unit(base - (base @ q) * q)
    for i, eps in enumerate(np.geomspace(1e-7, 1e-3, 400)):
        rows[i] = _unit(0.8 * q + 0.6 * base + eps * rng.standard_normal(DIM))
    rows[400:440] = rows[5]  # exact duplicates: ties at the k-th place, whatever k
    rows[440:460] = rows[399]
    rows[460:500] *= np.geomspace(1e-3, 30, 40)[:, None].astype(np.float32)  # far from unit length
    rows[500, :] = 1e-4  # one dominant component, the rest near the int8 step
    rows[500, 7] = 1.0
    rows[501] = 0.0  # a zero row
    perm = rng.permutation(n)  # spread the hard rows over the mirror
    return np.ascontiguousarray(rows[perm]), q


def _reference(rows: np.ndarray, q: np.ndarray, k: int, pos: np.ndarray | None = None) -> list[tuple[int, float]]:
    sims = _dot(rows, q) if pos is None else _dot(rows[pos], q)
    top = best(sims, min(k, len(sims)))
    real = top if pos is None else pos[top]
    return [(int(p), float(sims[t])) for p, t in zip(real, top)]


def _first_pass(rows: np.ndarray, q: np.ndarray, k: int, pos: np.ndarray | None = None,
                piece: int = 1700) -> list[tuple[int, float]]:
    copy = Int8Rows()
    for start in range(0, len(rows), piece):  # appended in pieces, as a mirror catches up (or all at once)
        copy.append(rows[start:start + piece])
    keep = copy.candidates(q, k, len(rows), pos)
    assert keep is not None, "the first pass should apply here"
    assert np.all(np.diff(keep) > 0)
    sims = _dot(rows[keep], q)
    top = best(sims, min(k, len(keep)))
    return [(int(keep[t]), float(sims[t])) for t in top]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [1, 5, 40, 41, 200])
def test_first_pass_gives_the_float32_top_k(seed, k):
    rows, q = _adversarial(seed)
    piece = 1700 if seed % 2 else len(rows)  # a whole mirror at once is quantized in chunks of its own
    for query in (q, _unit(rows[17] + 1e-6), rows[17], _unit(0.8 * q + 0.6 * rows[3])):
        assert _first_pass(rows, query, k, piece=piece) == _reference(rows, query, k)
    # Restricted to some rows (a skill, unexpired ones): the same over those rows.
    pos = np.flatnonzero(np.random.default_rng(seed).random(len(rows)) < 0.6)
    assert _first_pass(rows, q, k, pos) == _reference(rows, q, k, pos)


def test_first_pass_reads_few_float32_rows():
    rows, q = _adversarial(0)
    copy = Int8Rows()
    copy.append(rows)
    rng = np.random.default_rng(1)
    spread = _unit(rng.standard_normal((8000, DIM)))
    plain = Int8Rows()
    plain.append(spread)
    keep = plain.candidates(_unit(spread[3] + 0.5 * rng.standard_normal(DIM)), 40, len(spread), None)
    assert keep is not None and 40 <= len(keep) < 400  # a small superset, not the whole mirror
    assert copy.candidates(q, 40, len(rows), None) is not None


def test_ties_rank_in_row_order():
    sims = np.array([0.5, 0.9, 0.5, 0.9, 0.1, 0.5], dtype=np.float32)
    assert best(sims, 3).tolist() == [1, 3, 0]
    assert best(sims, 4).tolist() == [1, 3, 0, 2]
    assert best(sims, 10).tolist() == [1, 3, 0, 2, 5, 4]
    assert best(sims, 0).tolist() == []


def test_first_pass_steps_aside_when_it_cannot_say(monkeypatch):
    rows, q = _adversarial(2, n=PREFILTER_MIN + 10)
    copy = Int8Rows()
    copy.append(rows)
    assert copy.candidates(q, 5, len(rows), None) is not None
    assert copy.candidates(q, 5, len(rows) + 1, None) is None  # rows it does not hold
    assert copy.candidates(q, 5, PREFILTER_MIN - 1, None) is None  # a small mirror: the plain scan
    bad_q = q.copy()
    bad_q[3] = np.nan
    assert copy.candidates(bad_q, 5, len(rows), None) is None
    bad = rows.copy()
    bad[10, 0] = np.inf
    odd = Int8Rows()
    odd.append(bad)
    assert odd.candidates(q, 5, len(bad), None) is None

    class Saturating:
        """An int8 kernel as pmaddubsw computes: the query offset to unsigned, pairs of products summed into
        saturating 16-bit lanes, the offset taken off after; wrong on large values, so the check must refuse it."""

        @staticmethod
        def cdist(a, b, metric):
            u, s = a.astype(np.int64) + 128, b.astype(np.int64)
            pairs = np.clip((u * s).reshape(len(s), -1, 2).sum(axis=2), -32768, 32767)
            return (pairs.sum(axis=1) - 128 * s.sum(axis=1))[None].astype(float)

    monkeypatch.setitem(sys.modules, "numkong", types.SimpleNamespace(cdist=Saturating.cdist))
    monkeypatch.setattr(prefilter, "_kernels", {})
    assert prefilter._kernel(DIM) is None
    assert copy.candidates(q, 5, len(rows), None) is None


class _Table:
    """An embedder that returns the vectors it was given for each text (the adversarial rows), for this test only."""

    name = "prefilter-test-table"
    dim = DIM

    def __init__(self, texts: list[str], rows: np.ndarray):
        self.by = dict(zip(texts, rows))

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.by[t] for t in texts]).astype(np.float32)


def _store_case(url: str) -> None:
    rows, q = _adversarial(3, n=3000)
    rows = np.where(np.linalg.norm(rows, axis=1, keepdims=True) > 0, rows, _unit(np.ones(DIM)))  # stored: nonzero
    texts = [f"row {i}" for i in range(len(rows))]
    table = _Table(texts + ["the query"], np.vstack([rows, q[None]]))
    with Memory(url, embedder=table, synthesizer=ExtractiveSynthesizer()) as m:  # type: ignore[arg-type]
        m.remember_many([{"data": t, "skill": f"s{i % 3}", "ttl": 0.5 if i % 11 == 0 else None}
                         for i, t in enumerate(texts)])
        m._refresh()
        idx = m._records
        assert idx._q8.n == len(idx)
        used = []
        real = idx._q8.candidates

        def spy(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            got = real(*a, **kw)
            used.append(got is not None)
            return got

        idx._q8.candidates = spy  # type: ignore[method-assign]
        for now in (time.time(), time.time() + 5):  # before and after the short-lived rows expire
            for skill in (None, "s1"):
                for vec in (q, rows[5], rows[399]):
                    with_pass = idx.search(vec, 40, skill, now)
                    saved, prefilter.PREFILTER_MIN = prefilter.PREFILTER_MIN, 10**9
                    try:
                        plain = idx.search(vec, 40, skill, now)
                    finally:
                        prefilter.PREFILTER_MIN = saved
                    assert with_pass == plain and len(plain) == 40
        assert used.count(True) == 12 and used.count(False) == 12


def test_store_index_gives_the_plain_scan_results_on_sqlite(tmp_path):
    _store_case(f"sqlite:///{tmp_path / 'mem.db'}")


def test_store_index_gives_the_plain_scan_results_on_postgres():
    schema = "t_" + uuid.uuid4().hex[:12]
    try:
        url = pg_schema_url(schema)
        with Memory(url, embedder=_Table([], np.zeros((0, DIM))), synthesizer=ExtractiveSynthesizer()) as m:  # type: ignore[arg-type]
            if m.store.pgvector:
                pytest.skip("this server has pgvector: vectors are searched in the database, not the mirror")
        _store_case(url)
    finally:
        drop_pg_schema(schema)
