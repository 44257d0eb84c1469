"""Checks: is the environment still the one a cached trajectory was recorded in?

A :class:`Check` captures a snapshot of what matters around a tool call and
compares it with the snapshot stored in the cache entry. Snapshots are stored
as JSON; a dataclass or pydantic snapshot is rebuilt with the type of the
fresh snapshot (never with a type named by stored data) before ``compare``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .._errors import CacheError
from .._events import check_json

__all__ = ["Check", "decode_snapshot", "encode_snapshot"]


class Check:
    """An environment check around a tool call.

    ``capture`` is called with the tool's own arguments (``self`` first for a
    method) and returns a snapshot of what matters in the environment (JSON,
    a dataclass or a pydantic model). ``compare(current, candidate)`` returns
    a bool, or a score in ``[0, 1]`` that passes at ``threshold`` or above
    (a float is never taken as truthy).
    """

    def __init__(self, capture: Callable[..., Any], compare: Callable[[Any, Any], bool | float], threshold: float = 0.5):
        if not callable(capture) or not callable(compare):
            raise CacheError("Check(capture, compare): both must be callables")
        if not 0.0 <= threshold <= 1.0:
            raise CacheError(f"Check threshold must be in [0, 1], got {threshold!r}")
        self.capture = capture
        self.compare = compare
        self.threshold = threshold

    def passes(self, current: Any, candidate: Any) -> bool:
        """Whether ``current`` matches ``candidate`` according to ``compare``."""
        r = self.compare(current, candidate)
        if isinstance(r, bool) or type(r).__name__ == "bool_":
            return bool(r)
        if isinstance(r, (int, float)):
            if not 0.0 <= float(r) <= 1.0:
                raise CacheError(f"Check compare returned the score {r!r}: a score must be in [0, 1]")
            return float(r) >= self.threshold
        raise CacheError(f"Check compare returned {type(r).__name__}: return a bool or a score in [0, 1]")


def encode_snapshot(snapshot: Any, where: str) -> dict[str, Any]:
    if dataclasses.is_dataclass(snapshot) and not isinstance(snapshot, type):
        value = {"dataclass": dataclasses.asdict(snapshot)}
    elif hasattr(snapshot, "model_dump"):
        value = {"model": snapshot.model_dump(mode="json")}
    else:
        value = {"value": snapshot}
    check_json(value, where, "snapshot")
    return value


def decode_snapshot(stored: dict[str, Any], like: Any) -> Any:
    # The stored snapshot is rebuilt with the type of the fresh one, never a type named by stored data.
    if "dataclass" in stored and dataclasses.is_dataclass(like):
        return type(like)(**stored["dataclass"])
    if "model" in stored and hasattr(type(like), "model_validate"):
        return type(like).model_validate(stored["model"])
    return stored.get("dataclass", stored.get("model", stored.get("value")))
