"""Metadata filters: ``recall(..., where={"user": "ann"})``.

A filter is a dict of metadata keys to JSON scalars; a record matches when
every key is present in its metadata with that exact value (type included:
``1`` does not match ``"1"``, ``True`` does not match ``1``). An article
matches when every one of its source records does, so a filtered recall never
shows an article that also speaks of someone else's facts.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .._errors import MemoryInputError
from .inputs import check_text

#: Limits of one filter (keys, key length, string value length).
MAX_KEYS, MAX_KEY, MAX_VALUE = 16, 200, 10_000
#: Keys SQLite's JSON path reads literally, whatever escaping the stored text has.
_PLAIN_KEY = re.compile(r'[\x20\x21\x23-\x5b\x5d-\x7e]+')


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
            if "\x00" in text:
                # PostgreSQL's jsonb holds no NUL and SQLite's JSON functions cut text at one: no store could
                # answer this filter as matches() would, so it is refused rather than answered differently.
                raise MemoryInputError(f"{step}: where[{k!r}] holds a NUL character, which no store's JSON compares")
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
        if _PLAIN_KEY.fullmatch(k):
            # Printable ASCII without '"' or '\\' reads the same in any writer's escaping and any SQLite's path
            # grammar: a quoted path label, json_extract's one parse of the row shared by both calls.
            path = "$." + json.dumps(k)
            typ, val, kp = f"json_type({column}, ?)", f"json_extract({column}, ?)", [path]
        else:
            # Any other key is a bound value compared with json_each's decoded label: SQLite's path grammar has no
            # escape for '"' in a quoted label, and older versions compare a path's label with the key as escaped
            # in the stored text (which writers escape differently). The scalar subquery stops at the key's entry.
            typ = f"(SELECT type FROM json_each({column}) WHERE key = ?)"
            val = f"(SELECT atom FROM json_each({column}) WHERE key = ?)"
            kp = [k]
        if v is None:
            parts.append(f"{typ} = 'null'")
            params += kp
        elif isinstance(v, bool):
            parts.append(f"{typ} = ?")
            params += [*kp, "true" if v else "false"]
        elif isinstance(v, (int, float)):
            parts.append(f"{typ} IN ('integer', 'real') AND {val} = ?")
            params += [*kp, *kp, v]
        else:
            parts.append(f"{typ} = 'text' AND {val} = ?")
            params += [*kp, *kp, v]
    return " AND " + " AND ".join(parts), params
