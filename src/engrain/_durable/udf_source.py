"""Capture a UDF's source for the journal: the function, its allow-listed imports and helpers.

A UDF call is a durable step of type ``udf``. The first call of a function in a
run also records the function's source in its ``step.completed`` event
(``data["udf"]``: ``name``, ``source``, ``imports``, ``helpers``, ``sha256``;
later calls in the same run carry only the ``sha256``), so the compiler can
write the real function into a routine's ``udfs.py`` and the routine runs on new
inputs. Only what can run on its own is captured: a module-level function whose
free names are builtins, allow-listed standard modules (:data:`ALLOWED_MODULES`),
immutable literal constants or other capturable functions of its module. For
anything else (a lambda, a closure, a method, a C function, a module outside the
allow-list, mutable module state) ``data["udf"]`` says why instead, and the
compiler falls back to replaying the recorded results.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import inspect
import json
import sys
import textwrap
import types
from collections.abc import Callable
from typing import Any

#: Standard modules a captured UDF may import (they exist in the WASM sandbox's CPython).
ALLOWED_MODULES = frozenset({
    "csv", "json", "math", "re", "statistics", "datetime", "collections", "itertools", "io", "string",
    "functools", "operator", "typing",
})
_MAX_HELPERS = 32
_LITERALS = (type(None), bool, int, float, str)


class _Uncapturable(Exception):
    pass


def _allowed(module: str) -> bool:
    return module.split(".")[0] in ALLOWED_MODULES


def _literal_ok(v: Any, depth: int = 0) -> bool:
    """Immutable values whose ``repr`` reads back as the same value."""
    if depth > 8:
        return False
    if isinstance(v, float):
        return v == v and v not in (float("inf"), float("-inf"))
    if isinstance(v, _LITERALS):
        return True
    if isinstance(v, (tuple, frozenset)):
        return len(v) <= 1000 and all(_literal_ok(x, depth + 1) for x in v)
    return False


def _module_names(source: str, name: str) -> set[str]:
    """The names the function ``name`` in ``source`` (one ``def``) reads from its module, scope by scope.

    A name is the module's only where it is not bound in the scope that reads it nor in an
    enclosing function: ``[UNIT for UNIT in xs]`` binds ``UNIT`` in the comprehension, not in
    the function, so ``UNIT`` read elsewhere in the function is still the module's (and so is
    ``math`` read by the function beside ``lambda math: ...``). Python's own scoping answers
    (:mod:`symtable`), with the defaults evaluated in the module's scope. The source is analysed
    as ``udfs.py`` holds it, under ``from __future__ import annotations``: annotations are never
    evaluated, so the names they mention are not needed.
    """
    import symtable

    try:
        top = symtable.symtable(f"from __future__ import annotations\n{source}", "<udf>", "exec")
    except SyntaxError as e:
        raise _Uncapturable(f"its source does not compile on its own ({e.msg})") from None
    out = {s.get_name() for s in top.get_symbols() if s.is_referenced()}  # the def's defaults
    stack = [t for t in top.get_children() if t.get_name() == name]
    while stack:
        table = stack.pop()
        out |= {s.get_name() for s in table.get_symbols() if s.is_referenced() and s.is_global()}
        stack.extend(table.get_children())
    return out - {name}


def _function_source(fn: types.FunctionType) -> tuple[str, ast.FunctionDef]:
    """The dedented ``def`` of ``fn`` without its decorators, and its AST."""
    if fn.__name__ == "<lambda>":
        raise _Uncapturable("a lambda (define it with def at module level)")
    if fn.__code__.co_freevars:
        raise _Uncapturable(f"a closure over {', '.join(fn.__code__.co_freevars)} (pass them as arguments)")
    if "<locals>" in fn.__qualname__:
        raise _Uncapturable("defined inside another function (move it to module level)")
    if inspect.iscoroutinefunction(fn) or inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise _Uncapturable("an async function or generator (a UDF returns its result)")
    try:
        text = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise _Uncapturable(f"its source is not available ({e})") from None
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        raise _Uncapturable(f"its source does not parse on its own ({e.msg})") from None
    node = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(node, ast.FunctionDef) or node.name != fn.__name__:
        raise _Uncapturable("its source is not a single def statement")
    lines = text.splitlines()[node.lineno - 1 : node.end_lineno]
    source = textwrap.dedent("\n".join(lines)) + "\n"
    tree = ast.parse(source)
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef)
    for n in ast.walk(node):
        if isinstance(n, (ast.Global, ast.Nonlocal)):
            raise _Uncapturable("it writes module state (global/nonlocal)")
    if node.args.args and node.args.args[0].arg in ("self", "cls") and "." in fn.__qualname__:
        raise _Uncapturable("a method (a UDF is a module-level function)")
    return source, node


class _Capture:
    """Walks a function and the module names it reads into imports and helpers."""

    def __init__(self) -> None:
        self.imports: set[str] = set()
        self.helpers: dict[str, str] = {}
        self.seen: set[int] = set()

    def function(self, fn: types.FunctionType) -> str:
        source, node = _function_source(fn)
        self.seen.add(id(fn))
        for n in ast.walk(node):
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                self._inner_import(n)
        # Only names the function (or a scope inside it) reads from the module: a name it binds
        # itself is local, and a UDF that both assigns and reads a module name would fail in
        # Python anyway (UnboundLocalError).
        for name in sorted(_module_names(source, node.name)):
            self._resolve(fn, name)
        return source

    def _inner_import(self, n: ast.Import | ast.ImportFrom) -> None:
        if isinstance(n, ast.ImportFrom):
            if n.level or not n.module or not _allowed(n.module):
                raise _Uncapturable(f"imports {n.module or '.'!r}, which is not on the allow-list ({', '.join(sorted(ALLOWED_MODULES))})")
        else:
            for a in n.names:
                if not _allowed(a.name):
                    raise _Uncapturable(f"imports {a.name!r}, which is not on the allow-list ({', '.join(sorted(ALLOWED_MODULES))})")

    def _resolve(self, fn: types.FunctionType, name: str) -> None:
        g = fn.__globals__
        if name not in g:
            if hasattr(builtins, name):
                return
            raise _Uncapturable(f"reads {name!r}, which is not defined in its module")
        v = g[name]
        if isinstance(v, types.ModuleType):
            mod = v.__name__
            if not _allowed(mod):
                raise _Uncapturable(f"uses module {mod!r}, which is not on the allow-list ({', '.join(sorted(ALLOWED_MODULES))})")
            self.imports.add(f"import {mod}" if name == mod else f"import {mod} as {name}")
            return
        inner = getattr(v, "__wrapped__", None) if getattr(v, "__engrain_step__", None) else None
        target = inner if isinstance(inner, types.FunctionType) else v
        if isinstance(target, types.FunctionType) and target.__module__ == fn.__module__:
            if id(target) in self.seen:
                return
            if len(self.helpers) >= _MAX_HELPERS:
                raise _Uncapturable(f"calls more than {_MAX_HELPERS} helper functions")
            src = self.function(target)
            if target.__name__ != name:
                src += f"\n{name} = {target.__name__}\n"
            self.helpers[name] = src
            return
        mod = getattr(v, "__module__", None)
        if isinstance(mod, str) and _allowed(mod) and not isinstance(v, _LITERALS):
            attr = getattr(v, "__name__", None)
            if isinstance(attr, str) and getattr(sys.modules.get(mod), attr, None) is v:
                self.imports.add(f"from {mod} import {attr}" + (f" as {name}" if name != attr else ""))
                return
        if _literal_ok(v):
            self.helpers[name] = f"{name} = {v!r}\n"
            return
        kind = type(v).__name__
        raise _Uncapturable(f"reads module state {name!r} (a {kind}); pass it as an argument or make it a constant")


def capture(fn: Callable[..., Any]) -> dict[str, Any]:
    """What the journal records about UDF ``fn``: its portable source, or why there is none."""
    name = getattr(fn, "__name__", repr(fn))
    if not isinstance(fn, types.FunctionType):
        return {"name": name, "uncaptured": "not a Python function (a C extension or builtin has no source)"}
    cap = _Capture()
    try:
        source = cap.function(fn)
    except _Uncapturable as e:
        return {"name": name, "uncaptured": str(e)}
    info = {
        "name": fn.__name__,
        "source": source,
        "imports": sorted(cap.imports),
        "helpers": [{"name": k, "source": v} for k, v in sorted(cap.helpers.items())],
    }
    info["sha256"] = hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()
    return info
