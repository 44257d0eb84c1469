"""What a memory call accepts: its arguments checked, and a record's row built from them.

Every check raises :class:`~engrain.MemoryInputError` naming the argument (and the
call, for ``hint``), before anything is embedded or written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

from .._errors import JSONTooDeepError, MemoryInputError
from .._events import check_depth

#: Longest ``skill`` or ``label``: names, not texts (a ``where`` value may be as long).
MAX_NAME = 10_000
#: Longest ``ttl`` in seconds (~31 million years): past it, use None; an expiry time stays a finite float.
MAX_TTL = 1e15


def check_nesting(value: Any, name: str, step: str = "remember") -> None:
    """Refuse a value nested deeper than ``MAX_DEPTH`` levels (a deeper one would stop ``json.dumps`` with a
    RecursionError, and every later reader walks it recursively)."""
    try:
        check_depth(value, step, name)
    except JSONTooDeepError as e:
        raise MemoryInputError(str(e)) from None


def check_ttl(ttl: float | None) -> float | None:
    """``ttl`` if it is None or a positive number of seconds up to ``MAX_TTL`` (None is "never expires")."""
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl <= MAX_TTL):
        shown = repr(ttl) if not isinstance(ttl, int) or abs(ttl) < 10**30 else f"an integer of {ttl.bit_length()} bits"
        raise MemoryInputError(f"ttl must be a positive number of seconds up to {MAX_TTL:.0e}, or None (never "
                               f"expires), not {shown}")
    return ttl


def check_text(value: str, name: str) -> bytes:
    """``value`` in UTF-8; refused if it is not Unicode text (a lone surrogate such as ``"\\ud800"``): no store, digest
    or tokenizer takes it; or, unless it is a query, if it holds a NUL character."""
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise MemoryInputError(f"{name} is not Unicode text: a lone surrogate {value[e.start]!r} at "
                               f"character {e.start}") from None
    if "\x00" in value and name != "query":  # a query is only read: a NUL in it matches nothing, harmlessly
        # PostgreSQL's text and jsonb cannot hold it: refused on every backend, so a store can move between them.
        raise MemoryInputError(f"{name} holds a NUL character (U+0000) at character {value.index(chr(0))}; "
                               "no store keeps it (PostgreSQL cannot), so remove it")
    return raw


def check_str(value: Any, name: str, *, empty_ok: bool = False) -> str:
    """``value`` as a string ("" for None); refused when not a string, not Unicode, blank unless ``empty_ok``, or a
    ``skill``/``label`` (a name, not a text) longer than ``MAX_NAME`` characters."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MemoryInputError(f"{name} must be a string, not {type(value).__name__}")
    if not empty_ok and not value.strip():
        raise MemoryInputError(f"{name} is empty")
    if name in ("skill", "label") and len(value) > MAX_NAME:
        raise MemoryInputError(f"{name} is {len(value):,} characters long; at most {MAX_NAME:,}")
    check_text(value, name)
    return value


def check_hint(hint: Any, step: str) -> float | None:
    """``hint`` as an importance from 0 to 1 (etchmem's meaning), or None; ``step`` names the call in errors."""
    if hint is None:
        return None
    if isinstance(hint, str):
        raise MemoryInputError(f"{step}: hint is an importance from 0 to 1 (etchmem's meaning), not text "
                               f"{hint[:40]!r}; pass a text label as label=")
    if isinstance(hint, bool) or not isinstance(hint, (int, float)) or not 0.0 <= float(hint) <= 1.0:
        raise MemoryInputError(f"{step}: hint must be a number from 0 to 1, not {hint!r}")
    return float(hint)


#: A NUL's escape in JSON text (\u0000 after an even run of backslashes, not an escaped backslash's text).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def check_metadata(metadata: Any, step: str = "remember", name: str = "metadata") -> dict[str, Any]:
    """``metadata`` (``{}`` for None) if it is a JSON object every store and export can hold: a dict, nested at
    most ``MAX_DEPTH`` levels, no NaN or infinity (not JSON), no lone surrogate, no set or other object."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise MemoryInputError(f"{name} must be a dict, not {type(metadata).__name__}")
    check_nesting(metadata, name, step)
    # json.dumps writes a key 1 as "1": {1: "a", "1": "b"} would be stored with the key twice, which SQLite's
    # filter reads as "a" and every reader as "b".
    stack: list[Any] = [metadata]
    while stack:
        v = stack.pop()
        for k, x in v.items() if isinstance(v, dict) else enumerate(v):
            if isinstance(v, dict) and not isinstance(k, str):
                raise MemoryInputError(f"{step}: {name} key {k!r} is a {type(k).__name__}; JSON object keys are text")
            if isinstance(x, (dict, list)):
                stack.append(x)
    try:
        text = json.dumps(metadata, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise MemoryInputError(f"{name} must be JSON: {e}") from None
    check_text(text, name)  # PostgreSQL's jsonb refuses a lone surrogate's escape too, and an export's UTF-8 file
    if _NUL_ESCAPE.search(text):  # json.dumps wrote a NUL as \u0000, which jsonb refuses as well
        raise MemoryInputError(f"{name} holds a NUL character (U+0000); no store keeps it (PostgreSQL cannot), "
                               "so remove it")
    return metadata


def new_row(data: Any, hint: Any, skill: str | None, metadata: dict[str, Any] | None, ttl: float | None,
            default_ttl: float | None, now: float, label: str | None = None, step: str = "remember") -> dict[str, Any]:
    """A new record's row (a fresh id, its content's digest, its expiry from ``ttl`` or ``default_ttl``) from
    what ``remember`` (or ``step``) was given: ``data`` a string or a JSON value, ``metadata`` a JSON object."""
    if isinstance(data, str):
        content = data
    else:
        check_nesting(data, "data", step)
        try:
            content = json.dumps(data, sort_keys=True, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise MemoryInputError(f"data must be a string or a JSON value: {e}") from None
    if not content.strip():
        raise MemoryInputError("data is empty")
    raw = check_text(content, "data")
    check_metadata(metadata, step)
    life = check_ttl(ttl) if ttl is not None else default_ttl
    return {
        "id": "rec_" + os.urandom(10).hex(), "skill": check_str(skill, "skill", empty_ok=True),
        "content": content, "hint": check_str(label, "label", empty_ok=True), "metadata": metadata or {},
        "importance": check_hint(hint, step),
        "digest": hashlib.sha256(raw).hexdigest(),
        "expires": None if life is None else now + life,
    }
