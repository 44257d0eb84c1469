"""Which call ``params`` a cached trajectory may re-bind, and the task key that says so.

A hit replays recorded tool arguments with placeholders filled from the
current ``params``. That is only right when every place a param's value went
into an argument is a placeholder; a value left literal would replay the old
value under a new param. So when a trajectory is stored each param is either

* **bound**: its value is used (a whole value of the same type, or text at
  word boundaries inside a string) and every use in the arguments and output
  is a placeholder, so a hit re-binds all of them; or
* **pinned**: its value becomes part of the key and only a call with the same
  value can hit. A param is pinned when some use cannot be bound (inside a
  word, in a dict key, as another type, overlapping another param's value),
  when its value is not found at all (the agent may have derived what it
  passed from it: 1000 dollars sent as 100000 cents), and when it is a list or
  dict some part of which (an element, a key, a nested value or its text) is
  found outside a whole use (files deleted one by one).

The task text of a call is canonicalized at lookup, before any trajectory is
known: a *strong* param value (text of 3+ characters, a number with |v| >= 2)
found at word boundaries in the task is replaced by its placeholder, so
"order 3 boxes" and "order 7 boxes" share a shape. Weak values (0, 1,
booleans, short text) stay literal in the key, since such values are also
common constants an agent did not take from the task. Whitespace inside the
task is kept as given (indentation can be meaning); only line endings and the
whitespace around the text are tidied (:func:`tidy`). The entry's key is the
shape plus its pinned values; each shape remembers which sets of names were
pinned under it, so a lookup tries exactly those keys.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Binding", "bind", "canonical_task", "entry_key", "json_type", "key", "shape_key", "strong", "task_key", "text_of", "tidy",
    "usable",
]


#: Past these, a trajectory binds no param (each is pinned into the key instead).
MAX_PARAMS = 64
MAX_SCAN_BYTES = 1 << 20
#: A list or dict param with more parts than this is pinned without looking for them.
MAX_PARTS = 256


def key(*parts: Any) -> str:
    """A stable 32-hex key of JSON ``parts``."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


#: The key part added for a task given as a JSON value rather than a string: ``["abc"]`` and the
#: string ``'["abc"]'`` have one text, and neither may replay the other's calls. A string task's key
#: has no such part, so the keys entries of string tasks were stored under stay as they were.
_JSON_TASK: tuple[tuple[str, ...], tuple[str, ...]] = ((), ("engrain.task=json",))

_task_keys: dict[tuple[str, tuple[str, ...], bool], str] = {}


def task_key(task: str, tags: list[str], json_task: bool = False) -> str:
    """The key of a call without params: its canonical ``task`` text, ``tags`` and whether the task was JSON.

    Memoized: every lookup needs it, and encoding and hashing cost ~2.5 µs.
    """
    memo = (task, tuple(tags), json_task)
    k = _task_keys.get(memo)
    if k is None:
        if len(_task_keys) >= 4096:
            _task_keys.clear()
        k = _task_keys[memo] = key(task, tags, *_JSON_TASK[json_task])
    return k


def usable(name: str) -> bool:
    """Whether a template path can name the param (others are always pinned)."""
    return name.isidentifier() and not name.startswith("_")


def _placeholder(name: str) -> str:
    return "{{ params." + name + " }}"


def json_type(v: Any) -> str:
    """The type name a bound param must keep for a hit (int and float stay apart: str() differs)."""
    return type(v).__name__


def text_of(v: Any) -> str | None:
    """The text a value becomes inside a rendered string (``None``: it cannot be bound inside text)."""
    if isinstance(v, str):
        return v if v and "{{" not in v and "}}" not in v else None
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        s = str(v)
        return s if s == json.dumps(v) else None
    return None


def _forms(v: Any) -> set[str]:
    """Every text a value may leave in a string (any of them found there is a use)."""
    out = {str(v)}
    try:
        out.add(json.dumps(v, sort_keys=True))
        out.add(json.dumps(v))
    except (TypeError, ValueError):
        pass
    return {f for f in out if f}


def strong(v: Any) -> bool:
    """A value distinctive enough to template out of the task text."""
    if isinstance(v, str):
        return len(v) >= 3 and text_of(v) is not None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return abs(v) >= 2 and text_of(v) is not None
    return False


def _word(c: str) -> bool:
    # '.', '-' and '+' bind to a neighbouring number ("1.5", "-5", "+3"): a value next to them is not a whole token.
    return c.isalnum() or c in "_.-+"


def _bounded(s: str, i: int, j: int) -> bool:
    return (i == 0 or not _word(s[i - 1])) and (j == len(s) or not _word(s[j]))


def _occurrences(s: str, needle: str) -> list[tuple[int, int]]:
    out, i = [], s.find(needle)
    while i >= 0:
        out.append((i, i + len(needle)))
        i = s.find(needle, i + 1)
    return out


def tidy(task: str) -> str:
    """The task text a key holds: line endings as ``\\n``, leading blank lines and trailing whitespace dropped.

    Inside the text every whitespace character stays as given: two tasks that
    differ in indentation or in a no-break space may mean different things
    (a Python script, an amount), and sharing their entry would replay one's
    calls for the other. A single-line task also loses its leading blanks; a
    longer one keeps its first line's indent, which later lines are read against.
    """
    text = task.replace("\r\n", "\n").rstrip()
    body = text.lstrip()
    if "\n" not in body:
        return body
    return text[text.rfind("\n", 0, len(text) - len(body)) + 1 :]


def canonical_task(task: str, params: dict[str, Any]) -> str:
    """The tidied task (:func:`tidy`) with strong param values replaced by placeholders (the lookup shape)."""
    text = tidy(task)
    if not params or "{{" in text or "}}" in text:
        # No params: nothing to replace. Placeholders: one could not be told from the text; the key says "no placeholders".
        return text
    return _fill(text, _in_text(text, params))


def _in_text(text: str, params: dict[str, Any]) -> dict[str, str]:
    """Strong usable params found at word boundaries in ``text`` whose text no other such param shares."""
    found: dict[str, str] = {}
    for name, v in params.items():
        t = text_of(v)
        if usable(name) and strong(v) and t is not None and any(_bounded(text, i, j) for i, j in _occurrences(text, t)):
            found[name] = t
    texts = list(found.values())
    return {n: t for n, t in found.items() if texts.count(t) == 1}


def _fill(text: str, names: dict[str, str]) -> str:
    # Longest value first, never inside a placeholder already put in.
    parts: list[tuple[str, bool]] = [(text, False)]
    for name, t in sorted(names.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        nxt: list[tuple[str, bool]] = []
        for seg, done in parts:
            if done:
                nxt.append((seg, done))
                continue
            last = 0
            for i, j in _occurrences(seg, t):
                if i >= last and _bounded(seg, i, j):
                    nxt.append((seg[last:i], False))
                    nxt.append((_placeholder(name), True))
                    last = j
            nxt.append((seg[last:], False))
        parts = nxt
    return "".join(seg for seg, _ in parts)


_shapes: dict[Any, tuple[str, str]] = {}


def _memo(v: Any) -> Any:
    # A float by its text: 0.0 == -0.0 (and they hash alike), yet their JSON and so their keys differ.
    return repr(v) if type(v) is float else v


def shape_key(task: str, tags: list[str], params: dict[str, Any], json_task: bool = False) -> tuple[str, str]:
    """``(canonical task, shape key)`` of a call: the key also names the params and those templated into the text.

    ``json_task``: the task was given as a JSON value and ``task`` is its text
    (see :func:`task_key`). Memoized for scalar params (every lookup with params
    needs it); the memo key holds each value's type, as 2 and 2.0 shape a task differently.
    """
    try:
        memo: Any = (task, tuple(tags), tuple((k, type(v), _memo(v)) for k, v in params.items()), json_task)
        hit = _shapes.get(memo)
    except TypeError:  # a list or dict param: not hashable, computed each time
        memo, hit = None, None
    if hit is not None:
        return hit
    out = _shape_key(task, tags, params, json_task)
    if memo is not None:
        if len(_shapes) >= 4096:
            _shapes.clear()
        _shapes[memo] = out
    return out


def _shape_key(task: str, tags: list[str], params: dict[str, Any], json_task: bool) -> tuple[str, str]:
    canon = canonical_task(task, params)
    if not params:
        return canon, task_key(canon, tags, json_task)
    text = tidy(task)
    placed = [] if "{{" in text or "}}" in text else sorted(_in_text(text, params))
    return canon, key(canon, tags, sorted(params), placed, *_JSON_TASK[json_task])


_entry_keys: dict[Any, str] = {}


def entry_key(shape: str, params: dict[str, Any], pinned: list[str]) -> str:
    """The key of an entry under ``shape`` whose ``pinned`` params have these values (memoized like :func:`shape_key`)."""
    if not params:
        return shape
    if not pinned:
        memo: Any = shape
    else:
        try:
            memo = (shape, tuple((n, type(params[n]), _memo(params[n])) for n in pinned))
            hash(memo)
        except TypeError:
            return key(shape, {n: params[n] for n in pinned})
    k = _entry_keys.get(memo)
    if k is None:
        if len(_entry_keys) >= 4096:
            _entry_keys.clear()
        k = _entry_keys[memo] = key(shape, {n: params[n] for n in pinned})
    return k


@dataclass(slots=True)
class Binding:
    """How one trajectory's values relate to its call's params.

    ``values`` are the arguments (and output) with bound params' uses
    replaced by placeholders (literal text escaped where a value has one);
    ``templated[i]`` says whether value ``i`` holds any placeholder.
    """

    values: list[Any]
    templated: list[bool]
    pinned: list[str]
    bound: list[str]


def _parts(v: Any) -> list[Any] | None:
    """Every key and value nested in a list or dict (``None``: more than :data:`MAX_PARTS`)."""
    out: list[Any] = []
    todo = [v]
    while todo:
        x = todo.pop()
        if isinstance(x, dict):
            out.extend(x)
            kids = list(x.values())
        elif isinstance(x, list):
            kids = x
        else:
            continue
        out.extend(kids)
        todo.extend(kids)
        if len(out) > MAX_PARTS:
            return None
    return out


def _canon(x: Any) -> str:
    return json.dumps(x, sort_keys=True, default=str)


class _Parts:
    """The parts of a list or dict param: a value equal to one, or a string holding one's text, is a use of the param."""

    __slots__ = ("containers", "scalars", "texts")

    def __init__(self, parts: list[Any]):
        scalars = [p for p in parts if not isinstance(p, (dict, list))]
        self.scalars = set(scalars)
        self.containers = {_canon(p) for p in parts if isinstance(p, (dict, list))}
        self.texts = {f for p in scalars for f in (({p} - {""}) if isinstance(p, str) else _forms(p))}

    def found(self, x: Any) -> bool:
        if isinstance(x, str):
            return x in self.scalars or any(f in x for f in self.texts)
        if isinstance(x, (dict, list)):
            return bool(self.containers) and _canon(x) in self.containers
        try:
            return x in self.scalars  # by ==, so True, 1 and 1.0 all count: a use in another type is still a use
        except TypeError:
            return True


class _Scan:
    """One pass over the values: every use of each param, and whether it can be bound."""

    def __init__(self, params: dict[str, Any]):
        self.params = {n: v for n, v in params.items() if usable(n)}
        self.forms = {n: ({v} if isinstance(v, str) else _forms(v)) - {""} for n, v in self.params.items()}
        self.texts = {n: text_of(v) for n, v in self.params.items()}
        self.bad: set[str] = set()
        # Placeholders re-bind a list or dict only where it is used whole; an element used on its own would
        # replay the recorded element under a new list, so any such use pins the param.
        self.parts: dict[str, _Parts] = {}
        for n, v in self.params.items():
            if isinstance(v, (dict, list)):
                parts = _parts(v)
                if parts is None:
                    self.bad.add(n)
                elif parts:
                    self.parts[n] = _Parts(parts)

    def part_uses(self, x: Any, within: frozenset[str]) -> None:
        """Mark list and dict params a part of which ``x`` is or holds (not inside ``within``: their whole values)."""
        for n, parts in self.parts.items():
            if n not in within and n not in self.bad and parts.found(x):
                self.bad.add(n)

    def whole(self, x: Any) -> set[str]:
        """Params whose value ``x`` is as a whole (same type); a cross-type equal value is a bad use."""
        out = set()
        for n, v in self.params.items():
            if type(x) is type(v) and x == v:
                out.add(n)
            elif not isinstance(x, str) and not isinstance(v, str) and x == v:
                self.bad.add(n)  # True == 1 == 1.0: re-binding would change the type
        if len(out) > 1:
            self.bad.update(out)  # two params with this value: which one it came from is unknown
        return out

    def spans(self, s: str) -> set[str]:
        """Params used inside ``s``; marks unbindable and overlapping uses bad."""
        found: list[tuple[int, int, str]] = []
        used = set()
        for n, forms in self.forms.items():
            t, v = self.texts[n], self.params[n]
            for f in forms:
                for i, j in _occurrences(s, f):
                    used.add(n)
                    if f == t and _bounded(s, i, j) and not (i == 0 and j == len(s) and not isinstance(v, str)):
                        found.append((i, j, n))
                    else:
                        self.bad.add(n)  # inside a word, another type's text, or a number's text as a whole string
        for a in found:
            for b in found:
                if a is not b and a[0] < b[1] and b[0] < a[1]:
                    self.bad.update((a[2], b[2]))
        return used

    def visit(self, x: Any, within: frozenset[str] = frozenset()) -> set[str]:
        """Mark the uses in ``x`` (``within``: params whose whole value holds it); returns the params used in it."""
        if isinstance(x, str):
            self.part_uses(x, within)
            return self.spans(x)
        whole = self.whole(x)
        if self.parts:
            self.part_uses(x, within | whole)
        if isinstance(x, (dict, list)):
            inner: set[str] = set()
            inside = within | whole
            for k, v in (x.items() if isinstance(x, dict) else enumerate(x)):
                if isinstance(x, dict):
                    self.part_uses(k, inside)
                    for n, forms in self.forms.items():
                        if k == self.params[n] or any(f in str(k) for f in forms):
                            self.bad.add(n)  # keys are never templated
                            inner.add(n)
                inner |= self.visit(v, inside)
            if whole and inner - whole:
                self.bad |= whole | inner  # a bound container holding another param's value: ambiguous
            return whole | inner
        return whole


def _templatize(x: Any, params: dict[str, Any]) -> tuple[Any, bool]:
    """``x`` with uses of ``params`` (all bindable, checked by :class:`_Scan`) as placeholders, other text escaped."""
    from .._routines.template import escape

    for n, v in params.items():
        if type(x) is type(v) and x == v:
            return _placeholder(n), True
    if isinstance(x, str):
        spans = sorted(
            (i, j, n) for n, v in params.items() if (t := text_of(v)) is not None for i, j in _occurrences(x, t) if _bounded(x, i, j)
        )
        if not spans:
            return escape(x), False
        out, last = [], 0
        for i, j, n in spans:
            out.append(escape(x[last:i]))
            out.append(_placeholder(n))
            last = j
        out.append(escape(x[last:]))
        return "".join(out), True
    if isinstance(x, dict):
        pairs = {k: _templatize(v, params) for k, v in x.items()}
        return {k: v for k, (v, _) in pairs.items()}, any(c for _, c in pairs.values())
    if isinstance(x, list):
        items = [_templatize(v, params) for v in x]
        return [v for v, _ in items], any(c for _, c in items)
    return x, False


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def bind(values: list[Any], params: dict[str, Any]) -> Binding:
    """Bind the params used in ``values`` whose every use can be a placeholder; pin the others."""
    from .._routines.template import render

    if len(params) > MAX_PARAMS or len(json.dumps(values, default=str)) > MAX_SCAN_BYTES:
        # Scanning is quadratic-ish in text and params: past these bounds every param is pinned (always safe).
        return Binding(list(values), [False] * len(values), sorted(params), [])
    scan = _Scan(params)
    used: set[str] = set()
    for v in values:
        used |= scan.visit(v)
    # A param found nowhere is pinned: what the agent passed may still come from it (derived, reformatted).
    bound = {n: v for n, v in scan.params.items() if n in used and n not in scan.bad}
    out, flags = [], []
    for v in values:
        t, changed = _templatize(v, bound) if bound else (v, False)
        if changed and not _same(render(t, {"params": params}), v):
            # Never store a template that does not give back what ran: pin every param instead.
            return Binding(list(values), [False] * len(values), sorted(params), [])
        out.append(t if changed else v)
        flags.append(changed)
    return Binding(out, flags, sorted(n for n in params if n not in bound), sorted(bound))
