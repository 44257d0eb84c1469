"""Exact top-k over a float32 mirror that reads an int8 copy of it first: a proven bound, then float32 rescoring.

An exact scan of 10k MiniLM vectors reads 15 MB of float32 per recall; on
bench/memory.py's machine that costs ~1 ms and, worse, evicts the embedding
model's weights, so the next query's embedding runs ~1 ms slower. The int8 copy
is a quarter of that. It only proposes candidates: every row that can be in
the exact top k is rescored from float32 with the very product the plain scan
uses (``index._dot``), so the hits, their scores and their order are the plain
scan's.

Why no row of the exact top k is missed. A row ``x`` is kept as ``s·x̂`` (``x̂``
int8, ``s = max|x| / 127``), with ``r = ‖x - s·x̂‖`` and ``m = ‖s·x̂‖`` computed in
float64 when it is stored; the query ``q`` the same way (``t``, ``q̂``, ``ρ``).
The int8 product ``q̂·x̂`` is an exact integer (numkong promotes int8 to int32;
checked once per process, :func:`_kernel`), so ``a = s·t·(q̂·x̂)`` is exact up
to float64 rounding, and by Cauchy-Schwarz

    |q·x - a| <= ‖q‖·r + ρ·m.

The float32 product the plain scan computes differs from ``q·x`` by at most
``γ·‖q‖·‖x‖`` with ``γ = n·u / (1 - n·u)``, ``u = 2^-24``, ``n`` the dimension
(a dot product of ``n`` terms summed in any order). So each row's float32 score
lies within ``a ± B`` for ``B = ‖q‖·(r + γ‖x‖) + ρ·m`` (+ ``SLACK`` for float64
rounding). If ``L`` is the k-th largest ``a - B``, at least k rows score ``>= L``;
a row with ``a + B < L`` scores below all of them, so it is not in the top k,
ties included. The rows left are rescored; on the bench corpus (10k records, k
40) that is 73 rows at the median, 238 at most.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

#: Rows below which the plain float32 scan is used (it reads under 3 MB; the bound's bookkeeping would not pay).
PREFILTER_MIN = 2048
#: Absolute slack on the bound for the float64 arithmetic that computes it (terms of ~1e-16 each).
SLACK = 1e-9

_U = 2.0 ** -24
_CHUNK = 4096  # rows quantized at a time

_kernel_lock = threading.Lock()
_kernels: dict[int, Any] = {}


def _kernel(dim: int) -> Any:
    """numkong when its int8 dot products are exact integers at dimension ``dim`` on this machine, else None.

    Checked once per process and dimension against numpy's int64 products, on rows
    of extreme values (where a kernel that saturated 16-bit partial sums would show)
    and random ones; a machine whose kernel fails keeps the plain float32 scan.
    """
    with _kernel_lock:
        if dim in _kernels:
            return _kernels[dim]
        try:
            import numkong as nk

            rng = np.random.default_rng(dim)
            rows = rng.integers(-127, 128, (PREFILTER_MIN + 7, dim)).astype(np.int8)  # as many as a real scan
            rows[0], rows[1], rows[2] = 127, -127, 0
            rows[3, ::2], rows[3, 1::2] = 127, -127
            queries = [rows[i] for i in range(4)] + [rng.integers(-127, 128, dim).astype(np.int8) for _ in range(4)]
            ok = all(
                np.array_equal(np.asarray(nk.cdist(qv[None], rows, "dot"))[0],
                               rows.astype(np.int64) @ qv.astype(np.int64))
                for qv in queries)
            _kernels[dim] = nk if ok else None
        except Exception:  # noqa: BLE001 (no usable kernel: the plain scan is always right)
            _kernels[dim] = None
        return _kernels[dim]


def _quantize(mat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(int8 rows, scales, residual norms r, norms of the int8 rows as kept m)`` of float rows, in float64."""
    m64 = mat.astype(np.float64)
    scale = np.abs(m64).max(axis=1) / 127.0
    scale[scale == 0] = 1.0
    q8 = np.clip(np.rint(m64 / scale[:, None]), -127, 127).astype(np.int8)
    kept = q8.astype(np.float64) * scale[:, None]
    return q8, scale, np.linalg.norm(m64 - kept, axis=1), np.linalg.norm(kept, axis=1)


def best(sims: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest ``sims``, highest first; equal scores in index order (so a subset of rows
    taken in index order ranks its rows as the whole array does)."""
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    if k < len(sims):
        part = np.argpartition(-sims, k - 1)[:k]
        part = np.flatnonzero(sims >= sims[part].min())  # every row tied with the k-th, in index order
    else:
        part = np.arange(len(sims))
    return part[np.lexsort((part, -sims[part]))[:k]]


class Int8Rows:
    """The int8 copy of a float32 mirror's first rows, with what the bound needs per row."""

    def __init__(self) -> None:
        self.n = 0
        self.ok = True  # False once a row was not finite: the bound says nothing about it
        self._q8 = np.zeros((0, 0), dtype=np.int8)
        self._scale = np.zeros(0)
        self._resid = np.zeros(0)  # r + γ‖x‖: the row's part of the bound per unit of ‖q‖
        self._kept = np.zeros(0)  # m

    def append(self, mat: np.ndarray) -> None:
        """Add float32 rows after the ones held."""
        if not len(mat):
            return
        if not self.ok or not np.isfinite(mat).all():
            self.ok = False  # the bound says nothing about such a row: the plain scan, until the mirror reloads
            return
        need, dim = self.n + len(mat), mat.shape[1]
        if self._q8.shape[0] < need or self._q8.shape[1] != dim:
            cap = max(need, 2 * self._q8.shape[0], 1024)
            q8 = np.zeros((cap, dim), dtype=np.int8)
            if self.n:
                q8[: self.n] = self._q8[: self.n]
            self._q8 = q8
            self._scale, self._resid, self._kept = (np.resize(a, cap) for a in (self._scale, self._resid, self._kept))
        gamma = dim * _U / (1 - dim * _U)
        for start in range(0, len(mat), _CHUNK):  # in pieces: float64 copies of a whole mirror would be 4x its size
            part = mat[start:start + _CHUNK]
            at = slice(self.n + start, self.n + start + len(part))
            self._q8[at], self._scale[at], resid, self._kept[at] = _quantize(part)
            self._resid[at] = resid + gamma * np.linalg.norm(part.astype(np.float64), axis=1)
        self.n = need

    def candidates(self, vec: np.ndarray, k: int, n: int, pos: np.ndarray | None) -> np.ndarray | None:
        """Rows (ascending) among the first ``n`` (or among ``pos``, ascending) that hold every row of the
        float32 scan's top ``k``, ties included; None when the copy cannot say (too few rows, not covered,
        a value that is not finite, no exact int8 kernel)."""
        if not self.ok or self.n < n or n < PREFILTER_MIN or k <= 0 or not np.isfinite(vec).all():
            return None
        nk = _kernel(vec.shape[0])
        if nk is None:
            return None
        (q8,), (t,), (rho,), _ = _quantize(vec[None])
        qn = float(np.linalg.norm(vec.astype(np.float64)))
        ints = np.asarray(nk.cdist(q8[None], self._q8[:n], "dot"))[0]  # exact integers, as float64
        approx = ints * (self._scale[:n] * t)
        bound = qn * self._resid[:n] + rho * self._kept[:n] + SLACK
        if pos is not None:
            approx, bound = approx[pos], bound[pos]
        m = len(approx)
        kk = min(k, m)
        if kk == 0:
            return None
        low = approx - bound
        floor = np.partition(low, m - kk)[m - kk]  # the kk-th largest lower bound
        keep = np.flatnonzero(approx + bound >= floor)
        return keep if pos is None else pos[keep]
