"""Write a compiled routine's ``udfs.py``: recorded functions, and replay stubs for the rest.

A UDF recorded with its source (``@engrain.udf``, see :mod:`engrain._durable.udf_source`)
is written as that source, so it runs on any input. Any other UDF (an LLM call,
``@tool(type="udf")``, a function whose source could not be captured, an em-core
``udf_call``) becomes a stub that replays its recorded results and raises
``UnknownInputError`` for other arguments. Recorded sources come from a trace, i.e.
from data: they are parsed and checked (one plain ``def``, allow-listed imports,
literal constants) and never executed here.
"""

from __future__ import annotations

import ast
import keyword
import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

_MAX_SOURCE = 256 * 1024  # per recorded UDF, helpers included


@dataclass(frozen=True, slots=True)
class UdfReport:
    """How one UDF of a compiled routine was written: the real function, or a replay stub and why."""

    name: str
    generalized: bool
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "generalized": self.generalized, "reason": self.reason}


def _literal(v: Any) -> str:
    """A Python literal for a JSON value (valid for any string and float)."""
    if isinstance(v, float) and not math.isfinite(v):
        return f'_b.float("{v}")'
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_literal(str(k))}: {_literal(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_literal(x) for x in v) + "]"
    return repr(v)


_STUB_DOC = '''"""UDFs compiled by engrain from a trace.

Each function replays the results recorded in the trace for the arguments it
was called with, and raises UnknownInputError for any other arguments: its real
behaviour could not be derived from the trace. Replace a function's body with
real code to generalize the routine.
"""
'''

_REAL_DOC = '''"""UDFs compiled by engrain from a trace.

Each function is the source recorded with @engrain.udf: it runs on any input.
"""
'''

_MIXED_DOC = '''"""UDFs compiled by engrain from a trace.

Functions recorded with @engrain.udf are their own source: they run on any
input. The others (marked "replays recorded results") return the results
recorded in the trace for the arguments they were called with, and raise
UnknownInputError for any other arguments; replace such a function's body with
real code to generalize the routine.
"""
'''

_STUB_MACHINERY = '''
# Helpers reach builtins through _b: a UDF may be named dict, list, len or float.
import builtins as _b

try:
    from engrain import UnknownInputError
except ImportError:  # inside the UDF sandbox engrain is not importable

    class UnknownInputError(LookupError):
        def __init__(self, function, args):
            _b.LookupError.__init__(self, f"udfs.py: {function}() has no recorded result for arguments {args!r}")

_Unknown = UnknownInputError


def _same(a, b):
    """JSON equality that tells True from 1 and 1 from 1.0 apart."""
    if _b.isinstance(a, _b.dict) and _b.isinstance(b, _b.dict):
        return a.keys() == b.keys() and _b.all(_same(a[k], b[k]) for k in a)
    if _b.isinstance(a, _b.list) and _b.isinstance(b, _b.list):
        return _b.len(a) == _b.len(b) and _b.all(_same(x, y) for x, y in _b.zip(a, b))
    return _b.type(a) is _b.type(b) and a == b


def _copy(v):
    if _b.isinstance(v, _b.dict):
        return {k: _copy(x) for k, x in v.items()}
    if _b.isinstance(v, _b.list):
        return [_copy(x) for x in v]
    return v


def _replay(name, table, args):
    for seen, result in table:
        if _same(seen, args):
            return _copy(result)
    raise _Unknown(name, args)
'''


def _param_name(k: Any) -> bool:
    """Whether a recorded argument name can be a Python parameter as is.

    Python folds identifiers to NFKC ("\ufb00" is ``ff``), so a name that changes
    under NFKC would be read back under another name: such UDFs take ``**kwargs``.
    """
    return (isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k) and not k.startswith("_")
            and unicodedata.normalize("NFKC", k) == k)


def _stub(fname: str, records: list[tuple[dict[str, Any], Any]], reason: str | None) -> str:
    keys = [list(a) for a, _ in records]
    same = all(k == keys[0] for k in keys)
    simple = same and all(_param_name(k) for k in keys[0])
    table = f"_CALLS_{fname}"  # keeps case: U and u are two functions
    rows = "".join(f"    ({_literal(a)}, {_literal(r)}),\n" for a, r in records)
    note = "".join(f"# {line}\n" for line in (f"replays recorded results: {reason}" if reason else "").splitlines())
    out = f"\n\n{note}{table} = [\n{rows}]\n"
    if simple:
        params = ", ".join(keys[0])
        pack = "{" + ", ".join(f"{k!r}: {k}" for k in keys[0]) + "}"
        return out + f"\n\ndef {fname}({params}):\n    return _replay({fname!r}, {table}, {pack})\n"
    return out + f"\n\ndef {fname}(**kwargs):\n    return _replay({fname!r}, {table}, kwargs)\n"


def _one(text: str, what: str) -> list[ast.stmt]:
    if not isinstance(text, str) or len(text) > _MAX_SOURCE:
        raise ValueError(f"{what} is not a source text (or is over {_MAX_SOURCE} characters)")
    try:
        return ast.parse(text).body
    except SyntaxError as e:
        raise ValueError(f"{what} does not parse ({e.msg}, line {e.lineno})") from None


def _plain_def(node: ast.stmt, what: str) -> ast.FunctionDef:
    if not isinstance(node, ast.FunctionDef) or node.decorator_list:
        raise ValueError(f"{what} must be one def statement without decorators")
    return node


def check_recorded(info: Any) -> str | None:
    """Why the recorded UDF ``info`` (from a trace) cannot be written into udfs.py, or None."""
    from .._durable.udf_source import ALLOWED_MODULES

    if not isinstance(info, dict):
        return "recorded without its source (record it with @engrain.udf)"
    if "uncaptured" in info:
        return str(info["uncaptured"])
    if not isinstance(info.get("source"), str):
        return "recorded without its source (record it with @engrain.udf)"
    try:
        body = _one(info["source"], "source")
        if len(body) != 1:
            raise ValueError("source must be one def statement")
        fn = _plain_def(body[0], "source")
        if fn.name != info.get("name"):
            raise ValueError(f"source defines {fn.name!r}, not {info.get('name')!r}")
        imports = info.get("imports") or []
        if not isinstance(imports, list):
            raise ValueError("imports must be a list")
        for line in imports:
            for node in _one(line, "an import"):
                mods = [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else (
                    [a.name for a in node.names] if isinstance(node, ast.Import) else None)
                if not mods or any(m.split(".")[0] not in ALLOWED_MODULES for m in mods):
                    raise ValueError(f"import {line!r} is not an allow-listed standard module")
        helpers = info.get("helpers") or []
        if not isinstance(helpers, list):
            raise ValueError("helpers must be a list")
        for h in helpers:
            if not isinstance(h, dict) or not isinstance(h.get("name"), str) or not h["name"].isidentifier():
                raise ValueError("each helper needs a name and a source")
            for node in _one(h.get("source"), f"helper {h['name']!r}"):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    if not isinstance(node.value, ast.Name):
                        ast.literal_eval(node.value)  # constants only: ValueError otherwise
                else:
                    _plain_def(node, f"helper {h['name']!r}")
    except (ValueError, TypeError, SyntaxError, RecursionError) as e:
        return f"recorded source rejected: {e}"
    return None


def _renamed(source: str, old: str, new: str) -> str:
    if old == new:
        return source
    return re.sub(rf"^def\s+{re.escape(old)}\s*\(", f"def {new}(", source, count=1)


def udfs_source(
    udfs: dict[str, list[tuple[dict[str, Any], Any]]],
    recorded: dict[str, dict[str, Any]],
    reasons: dict[str, str],
) -> tuple[str, list[UdfReport]]:
    """``udfs.py`` for the functions in ``udfs`` (name -> recorded calls) and how each was written.

    ``recorded`` maps a function to its recorded source (checked with
    :func:`check_recorded`); ``reasons`` says why a function without one is a stub.
    """
    imports: set[str] = set()
    helpers: dict[str, str] = {}
    real: dict[str, str] = {}
    report: list[UdfReport] = []
    for fname in udfs:
        info = recorded.get(fname)
        reason = reasons.get(fname) or "no source was recorded"
        if info is not None:
            # A helper that is itself a recorded UDF of this routine is written once, as that UDF.
            own = [h for h in info.get("helpers") or []
                   if not (h["name"] in recorded and recorded[h["name"]].get("source") == h["source"])]
            clash = next((h["name"] for h in own if h["name"] in udfs
                          or helpers.get(h["name"], h["source"]) != h["source"]), None)
            if clash is None:
                imports.update(info.get("imports") or [])
                helpers.update({h["name"]: h["source"] for h in own})
                real[fname] = _renamed(info["source"], info["name"], fname)
                report.append(UdfReport(fname, True))
                continue
            reason = f"its helper {clash!r} clashes with another function of the same name"
        report.append(UdfReport(fname, False, reason))
    stubs = [r for r in report if not r.generalized]
    parts = [_STUB_DOC if not real else _MIXED_DOC if stubs else _REAL_DOC]
    if real:
        parts.append("\nfrom __future__ import annotations\n")
        if imports:
            parts.append("\n" + "".join(f"{i}\n" for i in sorted(imports)))
    if stubs:
        parts.append(_STUB_MACHINERY)
    for name in sorted(helpers):
        parts.append(f"\n\n{helpers[name].rstrip()}\n")
    for r in report:
        parts.append(f"\n\n{real[r.name].rstrip()}\n" if r.generalized else _stub(r.name, udfs[r.name], r.reason))
    source = "".join(parts)
    compile(source, "udfs.py", "exec", dont_inherit=True)  # never emit invalid Python (compiled, not run)
    return source, report
