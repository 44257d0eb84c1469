"""What a learned routine checks before it acts: the asserts and doubts induction derives from the runs.

:class:`Preconditions` is the part of :mod:`.induce` that reads what the runs
relied on rather than what they passed: the flags and status words of the
results the model saw, the lengths of lists it indexed, the order of numbers it
compared with an argument, and the choices no number of runs explains (an
element picked from a list of several), which keep a routine a candidate.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .agent_trace import AgentTrace, _leaves
from .compiler import _child, _key

_MAX_ASSERTS = 12  # invariant asserts per result
_RECORD_DEPTH = 3  # records held by key this deep in a result have their flags asserted
_SEGMENT = r"\[\d+\]|\.[A-Za-z_]\w*|\[\"[^\"]*\"\]"  # one step of a result path
_ENUMISH = re.compile(r"^[A-Za-z][A-Za-z_\- ]{0,31}$")  # status-like words: "unpaid", "in stock"


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values, type included (``1`` is not ``True`` nor ``1.0``)."""
    return type(a) is type(b) and _key(a) == _key(b)


def _in_task(v: Any, task: str) -> bool:
    return _task_count(v, task) > 0


def _task_count(v: Any, task: str) -> int:
    """How many places of ``task`` (the task text, or other text) hold ``v`` (as a whole word or number)."""
    if isinstance(v, bool) or v is None:
        return 0
    if isinstance(v, str):
        if not v.strip():
            return 0
        # whole words only where the value starts or ends with one ("cat" is not in "concatenate")
        left = r"(?<![^\W_])" if v[0].isalnum() else ""
        right = r"(?![^\W_])" if v[-1].isalnum() else ""
        return len(re.findall(left + re.escape(v) + right, task))
    if isinstance(v, (int, float)):
        forms = {str(v)} | ({str(int(v))} if isinstance(v, float) and v.is_integer() else set())
        return sum(len(re.findall(rf"(?<![\w.]){re.escape(f)}(?![\w]|\.\d)", task)) for f in forms)
    return 0


@dataclass(slots=True)
class Problem:
    """Why a step is not compilable: the step, its tool, the argument and the reason."""

    step: str
    tool: str
    arg: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "tool": self.tool, "arg": self.arg, "reason": self.reason}


def _literal(v: Any) -> str:
    """``v`` as an expression literal (scalars only)."""
    return json.dumps(v) if isinstance(v, str) else repr(v)


class _NoType:
    def __repr__(self) -> str:
        return "<none>"


_NO = _NoType()


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _order(pairs: list[tuple[Any, Any]]) -> str | None:
    """The comparison ``b OP a`` that held for every pair, or None (no order, or only equality)."""
    for op, holds in ((">", lambda b, a: b > a), ("<", lambda b, a: b < a),
                      (">=", lambda b, a: b >= a), ("<=", lambda b, a: b <= a)):
        if all(holds(b, a) for b, a in pairs) and not all(b == a for b, a in pairs):
            return op
    return None


def _short(v: Any) -> str:
    s = json.dumps(v, default=str)
    return s if len(s) <= 40 else s[:37] + "..."


class Preconditions:
    """The asserts and doubts of an induction (a mixin: ``traces``, ``n`` and ``index`` are its runs)."""

    traces: list[AgentTrace]
    n: int
    index: list[list[dict[str, Any]]]
    asserts: dict[int, list[tuple[str, str]]]
    consumed: dict[int, set[str]]
    doubts: list[Problem]

    def _assert(self, paths: list[str], expr: str, message: str) -> None:
        # after the last step the expression reads, before the step that relies on it
        step = max(int(re.match(r"step(\d+)", p).group(1)) for p in paths) - 1  # type: ignore[union-attr]
        items = self.asserts.setdefault(step, [])
        if expr not in [e for e, _ in items]:
            items.append((expr, message))

    def pin_embedded(self, k: int, text: str) -> None:
        """Assert the earlier results' values that step k's literal ``text`` holds and every run shared.

        "Your 60.0 EUR bill is due in 3 days", learned from two bills of 60.0
        due in 3 days, must not be sent about a bill of 75.0: the runs cannot
        tell the number was read from the result, so the result must still hold it.
        """
        turn, added = self.traces[0].calls[k].turn, 0
        for j in range(k):
            if self.traces[0].calls[j].turn >= turn:
                break
            for p, v in self.index[0][j].items():
                small = _number(v) or isinstance(v, str) and 2 <= len(v) <= 200 and "\n" not in v
                if added < _MAX_ASSERTS and small and _task_count(v, text) and all(
                        _same(self.index[r][j].get(p, _NO), v) for r in range(self.n)):
                    added += 1
                    self._assert([p], f"{p} == {_literal(v)}", f"{p} is no longer {_short(v)}")

    def pin_numbers(self, k: int) -> None:
        """Assert the numbers of earlier results every run shared, for a constant number step k wrote after them.

        Two orders of 2 boxes at 30.0 both had the total 60.0: the runs cannot
        tell it was computed, so it holds only while the price does. A number
        that differed between the runs while the constant did not is no such source.
        """
        turn, added = self.traces[0].calls[k].turn, 0
        for j in range(k):
            if self.traces[0].calls[j].turn >= turn:
                break
            for p in self._fields(j):
                v = self.index[0][j].get(p)
                if added < _MAX_ASSERTS and _number(v) and all(
                        _same(self.index[r][j].get(p, _NO), v) for r in range(self.n)):
                    added += 1
                    self._assert([p], f"{p} == {_literal(v)}", f"{p} is no longer {_short(v)}")

    def _chosen(self, k: int, arg: str, path: str) -> None:
        """Doubt a value read from one element of a list that held several items in some run.

        The model picked that element on its meaning ("the latest", "the one
        from Bob"); that it sat at the same index in every run may be the
        order's coincidence, and a routine that takes that index would pay
        another invoice. Only a human can say the order is by contract.
        """
        j = int(re.match(r"step(\d+)", path).group(1)) - 1  # type: ignore[union-attr]
        for m in re.finditer(r"\[\d+\]", path):
            n = max((len(x) for r in range(self.n) if isinstance(x := self.index[r][j].get(path[: m.start()]), list)),
                    default=0)
            if n > 1:
                why = (f"read from {path[: m.end()]}, one of {n} items: the runs cannot tell why the model chose that "
                       "one (a human may promote it if the order is by contract)")
                self.doubts.append(Problem(f"step{k + 1}", self.traces[0].calls[k].name, arg, why))
                return

    def _consume(self, path: str) -> None:
        step = int(re.match(r"step(\d+)", path).group(1)) - 1  # type: ignore[union-attr]
        self.consumed.setdefault(step, set()).add(path)

    def invariants(self, j: int) -> None:
        """Asserts on what step j's result held in every run: its top-level flags and status words (the
        model saw them before it went on, whether or not a later argument reads them), and the same in
        the records and lists that later arguments read from."""
        read = self.consumed.get(j, set())
        idx0 = self.index[0][j]
        found: list[tuple[str, str]] = []
        for parent in self._records(j):
            node = idx0.get(parent, _NO)
            if isinstance(node, list):
                if all(isinstance(self.index[r][j].get(parent), list) and len(self.index[r][j][parent]) == len(node)
                       for r in range(self.n)) and self.n >= 2:
                    found.append((f"len({parent}) == {len(node)}", f"{parent} no longer has {len(node)} items"))
                continue
            if not isinstance(node, dict):
                continue
            for key, v in node.items():
                p = _child(parent, key)
                if p is None or p in read or not (v is None or isinstance(v, bool) or isinstance(v, str) and _ENUMISH.match(v)):
                    continue
                if all(_same(self.index[r][j].get(p, _NO), v) for r in range(self.n)):
                    found.append((f"{p} == {_literal(v)}", f"{p} is no longer {_short(v)}"))
        for expr, msg in found[:_MAX_ASSERTS]:
            self._assert([f"step{j + 1}"], expr, msg)

    def _records(self, j: int) -> list[str]:
        """Step j's result, the records it holds by key (not in lists), and the records (and lists) that
        values later steps read sit in, shortest first."""
        parents: set[str] = {f"step{j + 1}"}
        for p in self.consumed.get(j, set()):
            for m in re.finditer(_SEGMENT, p):
                parents.add(p[: m.start()])
        # a record beside the one read ({"customer": {"blocked": false}, "bill": {...}}) was seen all the same
        parents.update(p for p, v in self.index[0][j].items() if isinstance(v, dict) and not re.search(r"\[\d+\]", p)
                       and len(re.findall(_SEGMENT, p)) <= _RECORD_DEPTH)
        return sorted(parents, key=len)

    def _fields(self, j: int) -> list[str]:
        """The paths of the fields of step j's records (:meth:`_records`), and of the result if it is a number."""
        out = []
        for parent in self._records(j):
            node = self.index[0][j].get(parent)
            if _number(node):
                out.append(parent)
            elif isinstance(node, dict):
                out += [c for key in node if (c := _child(parent, key)) is not None]
        return out

    def relations(self, k: int, args: Any) -> None:
        """Asserts on how step k's numeric arguments compared with numbers the model saw before it asked.

        A model that sends 100 EUR after reading a balance of 500 may have
        checked the balance; when one order held in every run (balance above
        the amount), the routine stops where it does not, instead of sending
        money the model would not have sent.
        """
        turn = self.traces[0].calls[k].turn
        added = 0
        for path, tpl in _leaves(args):
            m = re.fullmatch(r"\{\{ ((?:inputs|step\d+)[^ ]*) \}\}", tpl) if isinstance(tpl, str) else None
            vals = [dict(_leaves(t.calls[k].args)).get(path) for t in self.traces]
            if m is None or not all(_number(v) for v in vals):
                continue
            src = m.group(1)
            for j in range(k):
                if self.traces[0].calls[j].turn >= turn:
                    break
                for p in self._fields(j):
                    seen = [self.index[r][j].get(p, _NO) for r in range(self.n)]
                    if p == src or not all(_number(b) for b in seen):
                        continue
                    op = _order([(b, a) for b, a in zip(seen, vals)])
                    if op is not None and added < _MAX_ASSERTS:
                        added += 1
                        self._assert([p, *([src] if src.startswith("step") else [])], f"{p} {op} {src}",
                                     f"{p} is not {op} {src} as in the learned runs")
