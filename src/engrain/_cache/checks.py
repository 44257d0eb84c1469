"""Checks: is the environment still the one a cached trajectory was recorded in?

A :class:`Check` captures a snapshot of what matters around a tool call and
compares it with the snapshot stored in the cache entry. What the cache keeps
is a copy: a ``capture`` may return live state that the tool then changes, and
a ``compare`` may change either argument (:func:`keep`, :func:`compare_copy`). Snapshots are stored
as JSON; bytes, numpy arrays, tuples and types with a registered codec are
stored as tagged JSON objects (never pickled). A dataclass or pydantic
snapshot is rebuilt with the type of the fresh snapshot (never with a type
named by stored data) before ``compare``.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import sys
from collections.abc import Callable
from typing import Any

from .._errors import CacheError, JSONTooDeepError
from .._durable.steps import SCALARS
from .._events import MAX_DEPTH, check_json, is_json, json_copy

__all__ = ["Check", "compare_copy", "decode_snapshot", "encode_snapshot", "keep", "register_codec"]


class Check:
    """An environment check around a tool call.

    ``capture`` is called with the tool's own arguments (``self`` first for a
    method) and returns a snapshot of what matters in the environment (JSON,
    a dataclass or a pydantic model). ``compare(current, candidate)`` returns
    a bool, or a score in ``[0, 1]`` that passes at ``threshold`` or above
    (a float is never taken as truthy; numpy's bools and numbers count as
    Python's, see :meth:`verdict`).
    """

    def __init__(self, capture: Callable[..., Any], compare: Callable[[Any, Any], bool | float], threshold: float = 0.5):
        if not callable(capture) or not callable(compare):
            raise CacheError("Check(capture, compare): both must be callables")
        if not 0.0 <= threshold <= 1.0:
            raise CacheError(f"Check threshold must be in [0, 1], got {threshold!r}")
        self.capture = capture
        self.compare = compare
        self.threshold = threshold

    @staticmethod
    def register_codec(cls: type, encode: Callable[[Any], Any], decode: Callable[[Any], Any], name: str | None = None) -> None:
        """Make snapshots of type ``cls`` storable: ``encode(obj)`` returns JSON, ``decode(json)`` rebuilds it (never pickle)."""
        register_codec(cls, encode, decode, name)

    def passes(self, current: Any, candidate: Any) -> bool:
        """Whether ``current`` matches ``candidate`` according to ``compare``."""
        r = self.compare(current, candidate)
        if r is True or r is False:  # the usual answer, before the type tests
            return r
        return self.verdict(r)

    def verdict(self, r: Any) -> bool:
        """Whether ``compare``'s answer ``r`` (any but ``True`` or ``False``: see :meth:`passes`) is a pass.

        numpy's booleans (``(a == b).all()``) count as bools, and its integers and
        floats as Python's do: scores, so ``1`` passes and ``0`` fails as ``1.0``
        and ``0.0`` would. Anything else (``None``, text, a list, NaN) is an error.
        """
        if isinstance(r, bool):
            return r
        np = sys.modules.get("numpy")  # a numpy value means numpy is imported already: never import it here
        if np is not None:
            if isinstance(r, np.bool_):  # named bool_ in numpy 1, bool in numpy 2
                return bool(r)
            if isinstance(r, (np.integer, np.floating)):
                r = r.item()
        if isinstance(r, (int, float)):
            if not 0.0 <= float(r) <= 1.0:
                raise CacheError(f"Check compare returned the score {r!r}: a score must be in [0, 1]")
            return float(r) >= self.threshold
        raise CacheError(f"Check compare returned {type(r).__name__}: return a bool or a score in [0, 1]")


_TAG = "__engrain__"
# Snapshot types stored through a codec the program registered: {type: (name, encode, decode)}.
_codecs: dict[type, tuple[str, Callable[[Any], Any], Callable[[Any], Any]]] = {}
_by_name: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {}


def register_codec(cls: type, encode: Callable[[Any], Any], decode: Callable[[Any], Any], name: str | None = None) -> None:
    """Store snapshots of type ``cls`` as ``encode(obj)`` (JSON) and rebuild them with ``decode(json)``.

    Never pickle: the decoder is code the program registered, chosen by the
    name it was registered under, so stored data cannot pick what runs.
    """
    if not isinstance(cls, type) or not callable(encode) or not callable(decode):
        raise CacheError("register_codec(cls, encode, decode): cls must be a type, encode and decode callables")
    key = name or f"{cls.__module__}.{cls.__qualname__}"
    _codecs[cls] = (key, encode, decode)
    _by_name[key] = (encode, decode)


def _codec(x: Any) -> tuple[str, Callable[[Any], Any], Callable[[Any], Any]] | None:
    for t in type(x).__mro__:
        c = _codecs.get(t)
        if c is not None:
            return c
    return None


def _encode(x: Any, where: str, path: str, depth: int = 0) -> Any:
    """``x`` as JSON, with bytes, numpy arrays and registered types as tagged objects."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if depth >= MAX_DEPTH:
        # A snapshot nested this deep (or holding itself, or a codec that returns its own type) is no
        # JSON the journal keeps: refused by name before Python's recursion limit stops the call untyped.
        raise JSONTooDeepError(where, path, MAX_DEPTH)
    depth += 1
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            if not isinstance(k, str):
                raise CacheError(f"{where}: the snapshot's key {k!r} at {path} is not a string; snapshot keys must be strings")
            out[k] = _encode(v, where, f"{path}.{k}", depth)
        return {_TAG: "dict", "items": out} if _TAG in out else out
    if isinstance(x, list):
        return [_encode(v, where, f"{path}[{i}]", depth) for i, v in enumerate(x)]
    c = _codec(x)
    if c is not None:
        return {_TAG: "codec", "name": c[0], "value": _encode(c[1](x), where, path, depth)}
    if isinstance(x, (bytes, bytearray)):
        return {_TAG: "bytes", "b64": base64.b64encode(bytes(x)).decode("ascii")}
    if type(x).__module__ == "numpy" and type(x).__name__ == "ndarray":
        if x.dtype.hasobject:
            raise CacheError(f"{where}: the numpy array at {path} holds Python objects; only numeric arrays are stored")
        return {_TAG: "ndarray", "dtype": x.dtype.str, "shape": list(x.shape), "b64": base64.b64encode(x.tobytes()).decode("ascii")}
    if type(x).__module__ == "numpy" and hasattr(x, "item"):  # a numpy scalar
        return _encode(x.item(), where, path)
    if isinstance(x, tuple):
        return {_TAG: "tuple", "items": [_encode(v, where, f"{path}[{i}]", depth) for i, v in enumerate(x)]}
    raise CacheError(
        f"{where}: the snapshot's {type(x).__name__} at {path} cannot be stored. Return JSON, a dataclass, a pydantic "
        f"model, bytes or a numpy array, or register a codec: Check.register_codec({type(x).__name__}, encode, decode)"
    )


def _decode(x: Any) -> Any:
    if isinstance(x, list):
        return [_decode(v) for v in x]
    if not isinstance(x, dict):
        return x
    tag = x.get(_TAG)
    if tag is None:
        return {k: _decode(v) for k, v in x.items()}
    if tag == "dict":
        return {k: _decode(v) for k, v in x["items"].items()}
    if tag == "tuple":
        return tuple(_decode(v) for v in x["items"])
    if tag == "bytes":
        return base64.b64decode(x["b64"])
    if tag == "ndarray":
        import numpy as np

        return np.frombuffer(base64.b64decode(x["b64"]), dtype=np.dtype(x["dtype"])).reshape(x["shape"]).copy()
    if tag == "codec":
        c = _by_name.get(x["name"])
        if c is None:
            raise CacheError(f"a stored snapshot needs the codec {x['name']!r}: register it with Check.register_codec")
        return c[1](_decode(x["value"]))
    raise CacheError(f"a stored snapshot has the unknown tag {tag!r}")


def encode_snapshot(snapshot: Any, where: str) -> dict[str, Any]:
    if dataclasses.is_dataclass(snapshot) and not isinstance(snapshot, type):
        kind, payload = "dataclass", dataclasses.asdict(snapshot)
    elif hasattr(snapshot, "model_dump") and _codec(snapshot) is None:
        kind, payload = "model", snapshot.model_dump(mode="json")
    else:
        kind, payload = "value", snapshot
    if is_json(payload):
        # A copy: the snapshot may be live state (``capture=lambda: env.files``) that the tool changes
        # before the entry is written, and a stored pre-check must hold the state before the call.
        value = {kind: json_copy(payload) if kind == "value" else payload}
    else:
        # "tagged": decode the tagged objects back; a plain JSON snapshot never is, so its dicts stay as they are.
        value = {kind: _encode(payload, where, "snapshot"), "tagged": True}
    check_json(value, where, "snapshot")
    return value


def decode_snapshot(stored: dict[str, Any], like: Any) -> Any:
    """The stored snapshot as a new object: ``compare`` may change it, and the entry must not change with it."""
    # Rebuilt with the type of the fresh one, never a type named by stored data.
    tagged = stored.get("tagged", False)
    if "dataclass" in stored and dataclasses.is_dataclass(like):
        payload = _decode(stored["dataclass"]) if tagged else json_copy(stored["dataclass"])
        return type(like)(**payload)
    if "model" in stored and hasattr(type(like), "model_validate"):
        return type(like).model_validate(json_copy(stored["model"]))  # a field typed Any would hold the stored list
    value = stored.get("dataclass", stored.get("model", stored.get("value")))
    return _decode(value) if tagged else json_copy(value)


def keep(snapshot: Any, where: str) -> Any:
    """What a step keeps of a fresh ``snapshot`` until its entry is stored, taken before ``compare`` sees it.

    As ``(snapshot, where)``, encoded only if it is stored (a hit rarely is), or
    encoded. Anything but a str, number or None is copied now: ``compare`` may
    change its ``current``, and a live object the later calls change would be
    stored as the state after them (a pre-check that then passes for a task
    already done). A list or dict is copied in one walk; another object is
    encoded, or kept as it is when it cannot be (refused as before if it is stored).
    """
    t = type(snapshot)
    if t in SCALARS:
        return (snapshot, where)
    if t is dict or t is list:  # the usual snapshot: copied in one walk, encoded only if stored
        try:
            return (_clone(snapshot), where)
        except _NotPlain:
            pass
    try:
        return encode_snapshot(snapshot, where)
    except Exception:  # a codec of the program's may raise anything: it raises again if the snapshot is stored
        return (snapshot, where)


def compare_copy(snapshot: Any) -> Any:
    """A copy of ``snapshot`` for one of several ``compare`` calls that share one capture: none sees what another changed.

    Of its own type (a dataclass stays one, nested ones included); one that cannot be copied is shared as before.
    """
    t = type(snapshot)
    if t in SCALARS:
        return snapshot
    if t is dict or t is list:
        try:
            return _clone(snapshot)
        except _NotPlain:
            pass
    try:
        return copy.deepcopy(snapshot)
    except Exception:  # a program's object that refuses to be copied (a lock, a handle)
        return snapshot


class _NotPlain(Exception):
    """What :func:`_clone` raises for a value holding something other than lists, dicts and JSON scalars."""


def _clone(x: Any, depth: int = 0) -> Any:
    """A copy of a snapshot's lists and dicts, scalars shared, in one walk with no JSON check first.

    A snapshot is the program's object, not known to be JSON (unlike what ``json_copy`` takes): anything
    else inside it, which a copy would share, or a nesting past ``MAX_DEPTH`` raises :class:`_NotPlain`.
    """
    t = type(x)
    if t is list and depth < MAX_DEPTH:
        return [v if type(v) in SCALARS else _clone(v, depth + 1) for v in x]
    if t is dict and depth < MAX_DEPTH:
        return {k: v if type(v) in SCALARS else _clone(v, depth + 1) for k, v in x.items()}
    if t in SCALARS:
        return x
    raise _NotPlain(t.__name__)
