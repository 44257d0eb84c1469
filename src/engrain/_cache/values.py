"""Values a trajectory records: as a call had them, and which earlier results later calls used.

A recorded argument or result must stay what the call got or returned, even
when a tool or the agent changes a list afterwards (:func:`as_called`).

A replay calls each step with its recorded arguments. When one of them was
taken from an earlier step's result (a customer id a lookup returned, an
order number a create call made), the recorded value is only right while that
step returns it again. So an entry keeps, for each step, the parts of its
result that later arguments (or a recorded output) used (:func:`find_feeds`);
a replayed step whose result no longer holds them stops the replay before a
stale value is sent anywhere (:func:`feeds_hold`). Uses are found by value,
generously (a false use only costs a hand-over when that part changes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .._durable.steps import same_json
from .._errors import CacheError
from .._events import check_json, check_text, is_json, json_copy
from .binding import MAX_SCAN_BYTES, key

__all__ = ["args_as_called", "as_called", "call_inputs", "feeds_hold", "find_feeds"]

#: A result with more leaves than this is kept whole (by digest) when anything after it may use it.
MAX_LEAVES = 256


def as_called(x: Any) -> Any:
    """A copy of a list or dict ``x`` (what a call got or returned, as it was then); anything else as it is.

    A value that is not JSON (refused by the journal with a typed error, or too deep to copy) is kept.
    """
    return json_copy(x) if type(x) in (dict, list) and is_json(x) else x


def args_as_called(args: dict[str, Any]) -> dict[str, Any]:
    """:func:`as_called` for the binder's own dict of arguments: only a list or dict inside it can change."""
    return as_called(args) if any(type(v) in (dict, list) for v in args.values()) else args


def call_inputs(task: Any, tags: Any, params: Any, reserved: str) -> tuple[str, list[str], dict[str, Any]]:
    """An engine call's task text, tags (sorted, unique) and a copy of its params; a typed error for others.

    Tags that are a str would key as its letters (``"ab"`` as ``["a", "b"]``),
    params that are a list of pairs as a dict; tags starting with ``reserved``
    would reach another namespace's entries. Params are copied as called: the
    agent or a tool may change a list it gets, and the key and binding must
    hold the values the call was made with.
    """
    if tags is not None and (not isinstance(tags, (list, tuple, set, frozenset)) or not all(type(t) is str for t in tags)):
        raise CacheError(f"tags must be a list of strings, got {tags!r:.200}")
    tags_l = sorted(set(tags)) if tags else []
    if any(t.startswith(reserved) for t in tags_l):
        raise CacheError(f"tags starting with {reserved!r} are reserved: they would reach another namespace's entries")
    if params is not None and not isinstance(params, Mapping):
        raise CacheError(f"params must be a dict, got {type(params).__name__}")
    params_d = dict(params) if params else {}
    if params_d:
        check_json(params_d, "engine call", "params")
        params_d = json_copy(params_d)
    if isinstance(task, str):
        text = task
    else:
        check_json(task, "engine call", "task")
        text = json.dumps(task, sort_keys=True)
    # The key's text, tags and params are stored whatever the durability (with "off" no journal refuses them).
    check_text(task if isinstance(task, str) else json.dumps(task, ensure_ascii=False), task, "engine call", "task")
    check_text(json.dumps(tags_l, ensure_ascii=False), tags_l, "engine call", "tags")
    check_text(json.dumps(params_d, ensure_ascii=False), params_d, "engine call", "params")
    return text, tags_l, params_d


def _leaves(x: Any) -> list[tuple[list[Any], str, Any]] | None:
    """``(path, kind, value)`` of every scalar and dict key in ``x`` (``None``: more than :data:`MAX_LEAVES`)."""
    out: list[tuple[list[Any], str, Any]] = []
    todo: list[tuple[list[Any], Any]] = [([], x)]
    while todo:
        path, v = todo.pop()
        if type(v) is dict:
            for k, item in v.items():
                if k:
                    out.append((path, "key", k))
                todo.append(([*path, k], item))
        elif type(v) is list:
            todo.extend(([*path, i], item) for i, item in enumerate(v))
        elif v is not None and type(v) is not bool and v != "":
            out.append((path, "value", v))  # None and bools say too little to trace
        if len(out) > MAX_LEAVES:
            return None
    return out


class _Later:
    """The scalars and texts of the values after a step, to look its result's leaves up in."""

    def __init__(self) -> None:
        self.whole: set[tuple[type, Any]] = set()
        self.texts: list[str] = []
        self.chars = 0
        self._joined: str | None = None

    def add(self, x: Any) -> None:
        todo = [x]
        while todo:
            v = todo.pop()
            if type(v) is dict:
                for k in v:  # a dict key may hold a value taken from a result
                    self._text(k)
                todo.extend(v.values())
            elif type(v) is list:
                todo.extend(v)
            elif type(v) is str:
                if v:
                    self._text(v)
                    self.whole.add((str, v))
            elif v is not None and type(v) is not bool:
                self.whole.add((type(v), v))

    def _text(self, t: str) -> None:
        self.texts.append(t)
        self.chars += len(t)
        self._joined = None

    def used(self, v: Any) -> bool:
        if (type(v), v) in self.whole:
            return True
        # Inside text: an id of 3+ characters, a number of 2+ digits (a shorter one is in too many texts).
        t = v if type(v) is str else str(v)
        if len(t) < (3 if type(v) is str else 2):
            return False
        if self._joined is None:
            self._joined = "\0".join(self.texts)
        return t in self._joined


def find_feeds(results: list[Any], args: list[Any], tail: Any = None) -> list[list[dict[str, Any]]]:
    """For each step, the parts of its result that a later value uses.

    ``results[i]`` and ``args[i]`` are step ``i``'s result and (recorded)
    arguments; ``tail``, what a hit returns as recorded (``None``: nothing, its
    output is a step's fresh result). A feed is ``{"at": path, "value": v}``
    (the leaf at ``path``), ``{"at": path, "key": k}`` (the dict at ``path``
    has the key) or ``{"digest": d}`` (the whole result, too large to trace).
    """
    n = len(results)
    feeds: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    later = _Later()
    for i in range(n - 1, -1, -1):
        # A step's argument names are the tool's, never taken from a result: only their values are looked in.
        after = list(args[i + 1].values()) if i + 1 < n else tail
        if after is not None:
            later.add(after)
        if not later.whole and not later.texts:
            continue
        leaves = _leaves(results[i]) if later.chars <= MAX_SCAN_BYTES else None
        if leaves is None:
            feeds[i].append({"digest": key(results[i])})
            continue
        for path, kind, v in leaves:
            if later.used(v):
                feeds[i].append({"at": path, kind: v})
    return feeds


def _at(x: Any, path: list[Any]) -> tuple[bool, Any]:
    for p in path:
        if type(x) is dict and type(p) is str and p in x:
            x = x[p]
        elif type(x) is list and type(p) is int and 0 <= p < len(x):
            x = x[p]
        else:
            return False, None
    return True, x


def feeds_hold(feeds: list[dict[str, Any]], result: Any) -> bool:
    """Whether a replayed step's ``result`` still holds every part of the recorded one that later steps used."""
    for f in feeds:
        if "digest" in f:
            if not is_json(result) or key(result) != f["digest"]:
                return False
            continue
        found, x = _at(result, f["at"])
        if not found:
            return False
        if "key" in f:
            if type(x) is not dict or f["key"] not in x:
                return False
        elif not same_json(x, f["value"]):
            return False
    return True
