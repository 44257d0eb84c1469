"""``{{ path }}`` templates of routine steps.

A template is any JSON value whose strings may hold placeholders. A placeholder
names a *path* into the run's scope: a root name followed by ``.key``,
``["key"]`` or ``[index]`` segments (``inputs.url``, ``step1.rows[0].dept``). There
are no calls or operators here; logic belongs to :mod:`engrain._expr`.

Rendering is type-preserving: a string that is exactly one placeholder becomes
the referenced value itself (an int stays an int, a list a list); a placeholder
inside other text is interpolated (strings as they are, other values as JSON).
``{{ '{{' }}`` is a literal ``{{`` (see :func:`escape`) and a ``}}`` outside a
placeholder is plain text, so recorded text that contains braces (JSON in a
string, say) survives a round trip; an unclosed ``{{`` is an error.

Paths resolve only mapping keys and list indexes, never Python attributes, and
a dotted segment may not start with ``_``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .._errors import TemplateError

__all__ = ["escape", "needs_render", "parse_path", "placeholder", "render", "variables"]

Segment = str | int
Path = tuple[Segment, ...]

_OPEN, _CLOSE = "{{", "}}"
_MAX_CACHE = 8192


class _Literal(str):
    """Text of a ``{{ 'quoted' }}`` placeholder (a literal, not a path)."""


# A compiled string: None (plain text), a single path or literal (whole value),
# or a list of parts (str text, Path, or _Literal) to interpolate.
_cache: dict[str, Any] = {}


def placeholder(path: str) -> str:
    """The placeholder text ``"{{ path }}"`` for ``path`` (validated with :func:`parse_path`)."""
    parse_path(path)
    return f"{_OPEN} {path.strip()} {_CLOSE}"


def escape(text: str) -> str:
    """``text`` with every ``{{`` made literal, so :func:`render` returns it unchanged."""
    if _OPEN not in text:
        return text
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        pair = text[i : i + 2]
        if pair == _OPEN:
            out.append(f"{_OPEN} '{pair}' {_CLOSE}")
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse_path(text: str, where: str | None = None) -> Path:
    """Parse a path such as ``step1.rows[0].dept`` into ``("step1", "rows", 0, "dept")``.

    Raises :class:`~engrain.TemplateError` on bad syntax or a dotted segment
    that starts with ``_``.
    """
    parsed = _parse_inner(text, f"{_OPEN} {text} {_CLOSE}", where)
    if isinstance(parsed, _Literal):
        raise TemplateError(f"{_OPEN} {text} {_CLOSE}", "expected a path, not a quoted literal", where)
    return parsed


def render(value: Any, scope: Mapping[str, Any], where: str | None = None) -> Any:
    """Render every placeholder in ``value`` (dicts, lists and strings, recursively) from ``scope``.

    Dict keys are not templated. Raises :class:`~engrain.TemplateError` naming
    the path when a variable, key or index is missing.
    """
    if isinstance(value, str):
        if _OPEN not in value:
            return value
        return _render_str(value, scope, where)
    if isinstance(value, dict):
        return {k: render(v, scope, where) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, scope, where) for v in value]
    return value


def variables(value: Any, where: str | None = None) -> set[str]:
    """Root names referenced anywhere in ``value`` (e.g. ``{"inputs", "step1"}``).

    Raises :class:`~engrain.TemplateError` on malformed placeholders, so it doubles
    as a syntax check.
    """
    names: set[str] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if _OPEN in v:
                compiled = _compile(v, where)
                if isinstance(compiled, tuple):
                    names.add(compiled[0])  # type: ignore[arg-type]
                elif isinstance(compiled, list):
                    names.update(p[0] for p in compiled if isinstance(p, tuple))
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return names


def needs_render(value: Any) -> bool:
    """Whether :func:`render` may return something other than ``value`` itself.

    Not the same as having :func:`variables`: an escaped literal (``{{ '{{' }}``)
    names no variable yet renders to other text, so any string holding ``{{``
    counts.
    """
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if _OPEN in v:
                return True
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def _render_str(text: str, scope: Mapping[str, Any], where: str | None) -> Any:
    compiled = _cache.get(text)
    if compiled is None:
        compiled = _compile(text, where)
    if isinstance(compiled, tuple):
        return _resolve(compiled, scope, text, where)
    if isinstance(compiled, _Literal):
        return str(compiled)
    out: list[str] = []
    for part in compiled:
        if isinstance(part, tuple):
            v = _resolve(part, scope, text, where)
            out.append(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str))
        else:
            out.append(str(part))
    return "".join(out)


def _compile(text: str, where: str | None) -> Any:
    compiled = _cache.get(text)
    if compiled is not None:
        return compiled
    parts: list[Any] = []
    i, n = 0, len(text)
    buf: list[str] = []
    while i < n:
        start = text.find(_OPEN, i)
        if start == -1:
            buf.append(text[i:])
            break
        buf.append(text[i:start])
        end = _find_close(text, start + 2)
        if end == -1:
            raise TemplateError(text, f"'{{{{' at offset {start} is never closed with '}}}}'", where)
        inner = text[start + 2 : end]
        item = _parse_inner(inner, text[start : end + 2], where)
        if isinstance(item, _Literal):
            buf.append(str(item))
        else:
            if "".join(buf):
                parts.append("".join(buf))
            buf = []
            parts.append(item)
        i = end + 2
    if buf and "".join(buf):
        parts.append("".join(buf))
    result: Any
    if not parts:
        result = _Literal("")
    elif len(parts) == 1 and isinstance(parts[0], tuple):
        result = parts[0]
    elif all(isinstance(p, str) for p in parts):
        result = _Literal("".join(parts))
    else:
        result = parts
    if len(_cache) >= _MAX_CACHE:
        _cache.clear()
    _cache[text] = result
    return result


def _find_close(text: str, i: int) -> int:
    """Offset of the ``}}`` closing a placeholder whose body starts at ``i`` (quotes respected)."""
    n = len(text)
    quote = ""
    while i < n:
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "}" and text.startswith(_CLOSE, i):
            return i
        i += 1
    return -1


def _parse_inner(inner: str, shown: str, where: str | None) -> Path | _Literal:
    s = inner.strip()
    if not s:
        raise TemplateError(shown, "empty placeholder", where)
    if s[0] in "'\"":
        lit, end = _quoted(s, 0, shown, where)
        if end != len(s):
            raise TemplateError(shown, "a quoted literal must be the whole placeholder", where)
        return _Literal(lit)
    segs: list[Segment] = []
    i, n = 0, len(s)
    name, i = _ident(s, i, shown, where)
    segs.append(name)
    while i < n:
        c = s[i]
        if c == ".":
            name, i = _ident(s, i + 1, shown, where)
            segs.append(name)
        elif c == "[":
            j = i + 1
            while j < n and s[j] == " ":
                j += 1
            if j < n and s[j] in "'\"":
                key, j = _quoted(s, j, shown, where)
                segs.append(key)
            else:
                k = j
                if k < n and s[k] == "-":
                    k += 1
                while k < n and s[k].isascii() and s[k].isdigit():
                    k += 1
                digits = s[j:k]
                if digits in ("", "-"):
                    raise TemplateError(shown, f"expected an integer index or a quoted key after '[' at offset {i}", where)
                segs.append(int(digits))
                j = k
            while j < n and s[j] == " ":
                j += 1
            if j >= n or s[j] != "]":
                raise TemplateError(shown, f"'[' at offset {i} is not closed with ']'", where)
            i = j + 1
        else:
            raise TemplateError(
                shown, f"unexpected {c!r} at offset {i}: a placeholder holds a path like name.key[0], not an expression", where
            )
    return tuple(segs)


def _ident(s: str, i: int, shown: str, where: str | None) -> tuple[str, int]:
    j = i
    n = len(s)
    while j < n and (s[j].isalnum() or s[j] == "_"):
        j += 1
    name = s[i:j]
    if not name or not name.isidentifier():
        raise TemplateError(shown, f"expected a name at offset {i}", where)
    if name.startswith("_"):
        raise TemplateError(shown, f"name {name!r} starts with '_', which is not allowed", where)
    return name, j


def _quoted(s: str, i: int, shown: str, where: str | None) -> tuple[str, int]:
    quote = s[i]
    out: list[str] = []
    j = i + 1
    n = len(s)
    while j < n:
        c = s[j]
        if c == "\\" and j + 1 < n:
            out.append(s[j + 1])
            j += 2
            continue
        if c == quote:
            return "".join(out), j + 1
        out.append(c)
        j += 1
    raise TemplateError(shown, f"unterminated quoted string at offset {i}", where)


def _show(path: Path, upto: int) -> str:
    out = [str(path[0])]
    for seg in path[1:upto]:
        if isinstance(seg, int):
            out.append(f"[{seg}]")
        elif seg.isidentifier() and not seg.startswith("_"):
            out.append(f".{seg}")
        else:
            out.append(f"[{json.dumps(seg)}]")
    return "".join(out)


def _resolve(path: Path, scope: Mapping[str, Any], text: str, where: str | None) -> Any:
    # Fast path for plain dicts and lists; anything unusual takes the checked walk below.
    try:
        cur = scope[path[0]]  # type: ignore[index]
        for seg in path[1:]:
            if type(seg) is str and type(cur) is dict or type(seg) is int and type(cur) is list:
                cur = cur[seg]
            else:
                break
        else:
            return cur
    except (KeyError, IndexError):
        pass
    return _walk(path, scope, text, where)


def _walk(path: Path, scope: Mapping[str, Any], text: str, where: str | None) -> Any:
    root = path[0]
    try:
        cur = scope[root]  # type: ignore[index]
    except KeyError:
        names = ", ".join(sorted(map(str, scope))) or "none"
        raise TemplateError(text, f"undefined variable {root!r} (defined: {names})", where) from None
    for k, seg in enumerate(path[1:], 1):
        if isinstance(seg, int):
            if not isinstance(cur, (list, tuple)):
                raise TemplateError(text, f"{_show(path, k)} is a {type(cur).__name__}, not a list; cannot take [{seg}]", where)
            try:
                cur = cur[seg]
            except IndexError:
                raise TemplateError(
                    text, f"index {seg} is out of range for {_show(path, k)} (length {len(cur)})", where
                ) from None
        else:
            if not isinstance(cur, Mapping):
                raise TemplateError(
                    text, f"{_show(path, k)} is a {type(cur).__name__}, not a mapping; cannot read key {seg!r}", where
                )
            try:
                cur = cur[seg]
            except KeyError:
                keys = ", ".join(sorted(map(str, cur))[:20]) or "none"
                raise TemplateError(text, f"no key {seg!r} in {_show(path, k)} (keys: {keys})", where) from None
    return cur
