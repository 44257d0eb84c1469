"""Per skill, the vector mirror's positions of its rows in seq order, held in numpy arrays (:class:`SkillRows`).

A million positions as Python ints in lists (as the mirror's ids in a list) is
a million objects every full collection of Python's garbage collector visits,
one cache miss each: with the 1M-record bench store loaded, ``gc.collect()``
took ~80 ms, a pause the host application pays whenever its own allocations
trigger one, and a recall caught in it. Arrays of int64 (and the ids in an
object array) are not tracked by the collector: the same collection then takes
a few milliseconds.
"""

from __future__ import annotations

import numpy as np


class SkillRows:
    """The mirror positions of each skill's rows (by skill code), in the order they were appended."""

    def __init__(self) -> None:
        self._rows: dict[int, np.ndarray] = {}
        self._n: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def of(self, code: int) -> np.ndarray:
        """The positions of skill ``code``'s rows, oldest first (a view: do not keep it across appends)."""
        rows = self._rows.get(code)
        return np.zeros(0, dtype=np.int64) if rows is None else rows[: self._n[code]]

    def add(self, codes: np.ndarray, start: int) -> np.ndarray:
        """Append the rows at positions ``start, start + 1, ...`` whose skill codes are ``codes``; returns each
        row's place among its skill's rows."""
        codes = np.asarray(codes, dtype=np.int64)
        ords = np.zeros(len(codes), dtype=np.int64)
        if not len(codes):
            return ords
        for code in np.unique(codes).tolist():
            at = np.flatnonzero(codes == code)
            have = self._n.get(code, 0)
            rows = self._rows.get(code)
            need = have + len(at)
            if rows is None or len(rows) < need:  # grown by doubling, so a stream of single appends stays linear
                grown = np.zeros(max(need, 2 * (0 if rows is None else len(rows)), 16), dtype=np.int64)
                if rows is not None:
                    grown[:have] = rows[:have]
                rows = self._rows[code] = grown
            rows[have:need] = at + start
            ords[at] = np.arange(have, need, dtype=np.int64)
            self._n[code] = need
        return ords
