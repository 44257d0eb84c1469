"""Metadata filters: ``recall(..., where={"user": "ann"})``.

A filter is a dict of metadata keys to JSON scalars; a record matches when
every key is present in its metadata with that exact value (type included:
``1`` does not match ``"1"``, ``True`` does not match ``1``). An article
matches when every one of its source records does, so a filtered recall never
shows an article that also speaks of someone else's facts.
"""

from __future__ import annotations

import json
from typing import Any

from .._errors import MemoryInputError
from .inputs import check_text

#: Limits of one filter (keys, key length, string value length).
MAX_KEYS, MAX_KEY, MAX_VALUE = 16, 200, 10_000


def check_where(where: Any, step: str = "recall") -> dict[str, Any] | None:
    """``where`` validated (None or an empty dict means no filter)."""
    if where is None:
        return None
    if not isinstance(where, dict):
        raise MemoryInputError(f"{step}: where must be a dict of metadata key -> value, not {type(where).__name__}")
    if len(where) > MAX_KEYS:
        raise MemoryInputError(f"{step}: where has {len(where)} keys; at most {MAX_KEYS}")
    for k, v in where.items():
        if not isinstance(k, str) or not k or len(k) > MAX_KEY:
            raise MemoryInputError(f"{step}: where key {k!r} must be a non-empty string of at most {MAX_KEY} chars")
        if v is not None and not isinstance(v, (str, int, float, bool)):
            raise MemoryInputError(f"{step}: where[{k!r}] must be a string, number, boolean or null, "
                                   f"not {type(v).__name__}")
        if isinstance(v, float) and v != v:
            raise MemoryInputError(f"{step}: where[{k!r}] is NaN")
        if isinstance(v, str) and len(v) > MAX_VALUE:
            raise MemoryInputError(f"{step}: where[{k!r}] is longer than {MAX_VALUE} chars")
        if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**63:
            raise MemoryInputError(f"{step}: where[{k!r}] is an integer past 64 bits, which no store compares")
        for text in (k, v) if isinstance(v, str) else (k,):
            check_text(text, f"{step}: where[{k!r}]")
    return where or None


def matches(metadata: dict[str, Any], where: dict[str, Any] | None) -> bool:
    """Whether ``metadata`` satisfies ``where`` (same rule as the SQL)."""
    if not where:
        return True
    for k, v in where.items():
        if k not in metadata:
            return False
        m = metadata[k]
        if isinstance(v, bool) or isinstance(m, bool) or v is None or m is None:
            if type(m) is not type(v):
                return False
        elif isinstance(v, (int, float)) != isinstance(m, (int, float)):
            return False
        if m != v:
            return False
    return True


def sql(backend: str, where: dict[str, Any] | None, column: str = "metadata") -> tuple[str, list[Any]]:
    """An SQL condition (``" AND ..."``, ``?`` placeholders) and its parameters for ``where``."""
    if not where:
        return "", []
    if backend != "sqlite":
        # jsonb containment compares types the way matches() does; the metadata column holds JSON text.
        return f" AND {column}::jsonb @> ?::jsonb", [json.dumps(where)]
    parts, params = [], []
    for k, v in where.items():
        path = "$." + json.dumps(k)  # a quoted path element: any key text is literal
        if v is None:
            parts.append(f"json_type({column}, ?) = 'null'")
            params.append(path)
        elif isinstance(v, bool):
            parts.append(f"json_type({column}, ?) = ?")
            params += [path, "true" if v else "false"]
        elif isinstance(v, (int, float)):
            parts.append(f"json_type({column}, ?) IN ('integer', 'real') AND json_extract({column}, ?) = ?")
            params += [path, path, v]
        else:
            parts.append(f"json_type({column}, ?) = 'text' AND json_extract({column}, ?) = ?")
            params += [path, path, v]
    return " AND " + " AND ".join(parts), params
