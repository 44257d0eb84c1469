"""A value that a JSON schema accepts, made up from the schema alone (for test models).

:func:`example_value` walks the schema (``type``, ``enum``/``const``, ``anyOf``/
``oneOf``/``allOf``, local ``$ref``, string formats and lengths, number bounds
and ``multipleOf``, array and object sizes) and builds a small value. ``seed``
picks among alternatives (enum members, ``anyOf`` branches, numbers) so two
seeds give two different, equally valid, arguments. Objects get their required
properties only (a tool's optional parameters keep their defaults). A
``pattern`` is honoured when one of a few simple strings matches it; schemas
this cannot satisfy raise ``ValueError`` naming where.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from typing import Any

MAX_DEPTH = 32  # nested schemas (or $ref hops) followed before giving up: a recursive schema that never ends

_FORMATS: dict[str, Any] = {
    "date": lambda s: (_dt.date(2026, 1, 1) + _dt.timedelta(days=s)).isoformat(),
    "date-time": lambda s: f"{(_dt.date(2026, 1, 1) + _dt.timedelta(days=s)).isoformat()}T12:00:00Z",
    "time": lambda s: f"12:{s % 60:02d}:00Z",
    "email": lambda s: f"user{s}@example.com",
    "uri": lambda s: f"https://example.com/{s}",
    "url": lambda s: f"https://example.com/{s}",
    "uuid": lambda s: f"00000000-0000-4000-8000-{s:012d}",
    "ipv4": lambda s: f"192.0.2.{s % 255}",
    "ipv6": lambda s: f"2001:db8::{s % 65535:x}",
    "hostname": lambda s: "example.com",
}
_PATTERN_CANDIDATES = ("a", "abc", "A", "0", "1", "a1", "A1", "abc123", "a-b", "a_b", "a.b", "a b", "")


def example_value(schema: Any, seed: int = 0) -> Any:
    """A value ``schema`` accepts; ``ValueError`` when none can be made from it."""
    return _Gen(schema, seed).value(schema, "", 0)


class _Gen:
    def __init__(self, root: Any, seed: int):
        self.root, self.seed = root, max(0, int(seed))

    def value(self, s: Any, where: str, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise ValueError(f"schema at {where or '/'}: nested more than {MAX_DEPTH} levels (a recursive schema?)")
        if s is True or s is None or s == {}:
            return "a"
        if s is False or not isinstance(s, dict):
            raise ValueError(f"schema at {where or '/'}: no value is valid")
        if "$ref" in s:
            return self.value({**self._ref(s["$ref"], where), **{k: v for k, v in s.items() if k != "$ref"}},
                              where, depth + 1)
        if "const" in s:
            return s["const"]
        if isinstance(s.get("enum"), list) and s["enum"]:
            return s["enum"][self.seed % len(s["enum"])]
        if isinstance(s.get("examples"), list) and s["examples"]:
            return s["examples"][self.seed % len(s["examples"])]
        if isinstance(s.get("allOf"), list) and s["allOf"]:
            merged = {k: v for k, v in s.items() if k != "allOf"}
            for part in s["allOf"]:
                merged = _merge(merged, self._ref(part["$ref"], where) if isinstance(part, dict) and "$ref" in part
                                else part)
            return self.value(merged, where, depth + 1)
        for key in ("anyOf", "oneOf"):
            options = s.get(key)
            if isinstance(options, list) and options:
                rest = {k: v for k, v in s.items() if k != key}
                # Non-null branches first: an Optional[int] parameter gets an int.
                ordered = sorted(options, key=lambda o: isinstance(o, dict) and o.get("type") == "null")
                pick = ordered[self.seed % len(ordered)]
                return self.value(_merge(rest, pick if isinstance(pick, dict) else {}), f"{where}/{key}", depth + 1)
        kind = s.get("type")
        if isinstance(kind, list):
            kinds = [k for k in kind if k != "null"] or kind
            kind = kinds[self.seed % len(kinds)] if kinds else None
        if kind is None:
            kind = ("object" if "properties" in s or "required" in s else "array" if "items" in s or "prefixItems" in s
                    else "number" if any(k in s for k in ("minimum", "maximum", "multipleOf")) else "string")
        maker = getattr(self, f"_{kind}", None)
        if maker is None:
            raise ValueError(f"schema at {where or '/'}: unknown type {kind!r}")
        return maker(s, where, depth)

    def _ref(self, ref: Any, where: str) -> dict[str, Any]:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise ValueError(f"schema at {where or '/'}: only local $refs (#/...) are followed, not {ref!r}")
        node: Any = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise ValueError(f"schema at {where or '/'}: $ref {ref!r} points nowhere")
            node = node[part]
        return node if isinstance(node, dict) else {}

    def _null(self, s: dict[str, Any], where: str, depth: int) -> None:
        return None

    def _boolean(self, s: dict[str, Any], where: str, depth: int) -> bool:
        return self.seed % 2 == 0

    def _string(self, s: dict[str, Any], where: str, depth: int) -> str:
        lo, hi = int(s.get("minLength", 0)), s.get("maxLength")
        fmt = _FORMATS.get(s.get("format", ""))
        text = fmt(self.seed) if fmt else "abcdefghijklmnopqrstuvwxyz"[self.seed % 26]
        pattern = s.get("pattern")
        if isinstance(pattern, str):
            fits = [c for c in (text, *_PATTERN_CANDIDATES) if _search(pattern, c)]
            if not fits:
                raise ValueError(f"schema at {where or '/'}: no simple string matches pattern {pattern!r}")
            text = fits[0]
        if len(text) < lo:
            text += "a" * (lo - len(text))
        if hi is not None and len(text) > int(hi):
            text = text[: int(hi)]
        return text

    def _integer(self, s: dict[str, Any], where: str, depth: int) -> int:
        return int(self._number(s, where, depth, integer=True))

    def _number(self, s: dict[str, Any], where: str, depth: int, integer: bool = False) -> int | float:
        lo, hi = _bound(s.get("minimum")), _bound(s.get("maximum"))
        xlo, xhi = _bound(s.get("exclusiveMinimum")), _bound(s.get("exclusiveMaximum"))

        def fits(v: float) -> bool:
            return ((lo is None or v >= lo) and (hi is None or v <= hi) and (xlo is None or v > xlo)
                    and (xhi is None or v < xhi))

        low = max([b for b in (lo, xlo) if b is not None], default=None)
        high = min([b for b in (hi, xhi) if b is not None], default=None)
        v: float = self.seed
        if not fits(v):
            if low is not None and high is not None:
                v = (low + high) / 2
            else:
                v = low + 1 if low is not None else high - 1  # type: ignore[operator]
            if integer:
                v = math.floor(v) if fits(math.floor(v)) else math.ceil(v)
        step = s.get("multipleOf")
        if isinstance(step, (int, float)) and step > 0:
            v = math.ceil(v / step) * step
            if not fits(v):
                v = math.floor((high if high is not None else v) / step) * step
        if integer and v != int(v) or not fits(v):
            raise ValueError(f"schema at {where or '/'}: no {'integer' if integer else 'number'} fits its bounds")
        return int(v) if integer or float(v).is_integer() else v

    def _array(self, s: dict[str, Any], where: str, depth: int) -> list[Any]:
        lo, hi = int(s.get("minItems", 0)), s.get("maxItems")
        found = s.get("prefixItems")
        prefix: list[Any] = found if isinstance(found, list) else []
        items = s.get("items", {})
        n = max(lo, len(prefix), 1 if hi is None or int(hi) > 0 else 0)
        if hi is not None:
            n = min(n, int(hi))
        out = []
        for i in range(n):
            sub = prefix[i] if i < len(prefix) else items
            # Distinct seeds give distinct members, for uniqueItems.
            out.append(_Gen(self.root, self.seed + i).value(sub, f"{where}/{i}", depth + 1))
        return out

    def _object(self, s: dict[str, Any], where: str, depth: int) -> dict[str, Any]:
        found = s.get("properties")
        props: dict[str, Any] = found if isinstance(found, dict) else {}
        required = [r for r in s.get("required", []) if isinstance(r, str)]
        names = list(dict.fromkeys(required))
        want = int(s.get("minProperties", 0))
        names += [p for p in props if p not in names][: max(0, want - len(names))]
        out = {}
        for name in names:
            sub = props.get(name, s.get("additionalProperties", {}))
            out[name] = self.value(sub if sub is not True else {}, f"{where}/{name}", depth + 1)
        return out


def _bound(v: Any) -> float | None:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two schemas that must both hold, as one (properties and required lists joined)."""
    out = {**a, **b}
    if "properties" in a or "properties" in b:
        out["properties"] = {**a.get("properties", {}), **b.get("properties", {})}
    if "required" in a or "required" in b:
        out["required"] = list(dict.fromkeys([*a.get("required", []), *b.get("required", [])]))
    return out


def _search(pattern: str, text: str) -> bool:
    try:
        return re.search(pattern, text) is not None
    except re.error:
        return False
