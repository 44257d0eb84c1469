"""Sandboxed expressions for routine ``when`` and ``assert`` fields.

An expression is parsed with :func:`ast.parse` (``mode="eval"``), checked against
a whitelist of node types, and turned into a tree of Python closures that
interpret it. No code object is ever compiled or executed, so routine text never
reaches :func:`eval`.

What is allowed: literals (numbers, strings, ``True``/``False``/``None``, lists,
tuples, dicts, sets), names, ``a.b`` (which reads the *mapping key* ``"b"``: there
is no access to Python attributes at all), subscripts and slices, comparisons
(``== != < <= > >= in not in is is not``), ``and``/``or``/``not``, unary ``-``/``+``,
``+ - * / // % **``, ``x if c else y`` and calls of the builtins in
:data:`FUNCTIONS` or of functions the caller passes in (UDFs; they take precedence
over a builtin of the same name, but ``eval``, ``open``, ``getattr`` and the like are
never callable whatever the caller passes). What is refused:
any name or key segment starting with ``_``, lambdas, comprehensions, f-strings,
starred and ``**`` arguments, walrus, bit operators, and method calls.

Bounds: :data:`MAX_SOURCE` characters, :data:`MAX_NODES` AST nodes and
:data:`MAX_DEPTH` nesting levels at compile time. At run time the sizes of built
values, of integers and the time spent are limited as :mod:`.expr_limits` says;
its limits are re-exported here.

Errors are :class:`~engrain.ExpressionError`, at compile time and at run time
(an unknown name, a missing key, division by zero, a type error). Exceptions
raised inside a caller's function propagate unchanged.
"""

from __future__ import annotations

import ast
import operator
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from .._errors import ExpressionError
from . import expr_limits as limits
from .expr_limits import (
    MAX_BUILT,
    MAX_INT_BITS,
    MAX_INT_DIGITS,
    MAX_OPERAND_BITS,
    MAX_SECONDS,
    MAX_SIZE,
    RUN_SECONDS,
    Budget,
    _add,
    _arith,
    _fail,
    _float,
    _int,
    _mod,
    _mul,
    _pow,
    _round,
    _str,
    _sum,
    _tick,
)

__all__ = ["BUILTINS", "FUNCTIONS", "MAX_BUILT", "MAX_DEPTH", "MAX_INT_BITS", "MAX_INT_DIGITS", "MAX_NODES",
           "MAX_OPERAND_BITS", "MAX_SECONDS", "MAX_SIZE", "MAX_SOURCE", "RUN_SECONDS", "Budget", "Expr", "compile_expr"]

MAX_SOURCE = 2000
MAX_NODES = 400
MAX_DEPTH = 40

# Never callable, even when a caller passes a function by that name: they reach
# outside the data an expression may see.
_FORBIDDEN_CALLS = frozenset({
    "eval", "exec", "compile", "open", "getattr", "setattr", "delattr", "globals", "locals", "vars", "dir",
    "type", "breakpoint", "input", "help", "memoryview", "object", "super", "classmethod", "staticmethod",
    "property", "exit", "quit",
})

# A closure takes env = [scope, functions, items left in the size budget, deadline (monotonic)].
_Fn = Callable[[list[Any]], Any]


class _Raised(Exception):
    """Carries an exception raised by a caller's function past our own error translation."""

    def __init__(self, error: BaseException):
        self.error = error


_BINOPS: dict[type, Callable[[list[Any], Any, Any], Any]] = {
    ast.Add: _add,
    ast.Sub: _arith(operator.sub, "'-'"),
    ast.Mult: _mul,
    ast.Div: _arith(operator.truediv, "'/'"),
    ast.FloorDiv: _arith(operator.floordiv, "'//'"),
    ast.Mod: _mod,
    ast.Pow: _pow,
}

_CMPOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}


#: Builtins callable from every expression, with the keyword arguments each accepts.
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "len": len,
    "min": min,
    "max": max,
    "sum": _sum,
    "abs": abs,
    "round": _round,
    "int": _int,
    "float": _float,
    "str": _str,
    "bool": bool,
    "sorted": sorted,
    "any": any,
    "all": all,
}
BUILTINS = frozenset(FUNCTIONS)
_KEYWORDS: dict[str, frozenset[str]] = {
    "min": frozenset({"default"}),
    "max": frozenset({"default"}),
    "sorted": frozenset({"reverse"}),
    "round": frozenset({"ndigits"}),
    "int": frozenset({"base"}),
    "sum": frozenset({"start"}),
}


class Expr:
    """A compiled expression: ``names`` it reads, ``calls`` it makes, and :meth:`evaluate`."""

    __slots__ = ("_fn", "calls", "names", "text")

    def __init__(self, text: str, names: frozenset[str], calls: frozenset[str], fn: _Fn):
        self.text = text
        self.names = names
        self.calls = calls
        self._fn = fn

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"

    def evaluate(
        self,
        scope: Mapping[str, Any],
        functions: Mapping[str, Callable[..., Any]] | None = None,
        where: str | None = None,
        budget: Budget | None = None,
    ) -> Any:
        """The value of the expression with names from ``scope`` and UDFs from ``functions``.

        ``budget`` (one per routine run) is charged the time spent; the evaluation
        stops after :data:`MAX_SECONDS` or when the budget is spent. Raises
        :class:`~engrain.ExpressionError`; an exception raised by one of
        ``functions`` propagates as it is.
        """
        if budget is not None and budget.left <= 0:
            raise ExpressionError(self.text, f"not evaluated: the routine run's expressions already took "
                                             f"their {limits.RUN_SECONDS} s budget", where)
        start = time.monotonic()
        allowed = limits.MAX_SECONDS if budget is None else min(limits.MAX_SECONDS, budget.left)
        # env[4] accumulates time spent inside the caller's functions, which is not ours to charge.
        env = [scope, functions or {}, MAX_BUILT, start + allowed, 0.0]
        try:
            return self._fn(env)
        except ExpressionError as e:
            raise ExpressionError(self.text, e.reason, where) from None
        except _Raised as r:
            raise r.error from None
        except ZeroDivisionError:
            raise ExpressionError(self.text, "division by zero", where) from None
        except (ArithmeticError, TypeError, ValueError, LookupError, AttributeError, RecursionError, MemoryError) as e:
            raise ExpressionError(self.text, f"{type(e).__name__}: {e}", where) from None
        finally:
            if budget is not None:
                budget.left -= time.monotonic() - start - env[4]


_compiled: dict[str, Expr] = {}


def compile_expr(text: str, where: str | None = None) -> Expr:
    """Parse and check ``text``; the result is cached by text.

    Raises :class:`~engrain.ExpressionError` when the text is not an expression
    or uses anything outside the whitelist (see the module docstring).
    """
    hit = _compiled.get(text) if isinstance(text, str) else None
    if hit is not None:
        return hit
    if not isinstance(text, str):
        raise ExpressionError(repr(text), f"must be a string, got {type(text).__name__}", where)
    if len(text) > MAX_SOURCE:
        raise ExpressionError(text[:80] + "...", f"is {len(text)} characters long (limit {MAX_SOURCE})", where)
    if not text.strip():
        raise ExpressionError(text, "is empty", where)
    try:
        with warnings.catch_warnings():
            # An invalid escape like "\\ " is only a warning in Python today: make it a syntax error here.
            warnings.simplefilter("error", DeprecationWarning)
            warnings.simplefilter("error", SyntaxWarning)
            tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ExpressionError(text, f"syntax error: {e.msg}", where) from None
    except (ValueError, RecursionError, MemoryError) as e:
        raise ExpressionError(text, f"cannot be parsed: {type(e).__name__}", where) from None
    builder = _Builder(text, where)
    try:
        fn = builder.build(tree.body, 1)
    except RecursionError:
        raise ExpressionError(text, f"is nested too deeply (limit {MAX_DEPTH})", where) from None
    expr = Expr(text, frozenset(builder.names), frozenset(builder.calls), fn)
    if len(_compiled) > 4096:
        _compiled.clear()
    _compiled[text] = expr
    return expr


class _Builder:
    """Checks each AST node against the whitelist and returns the closure that evaluates it."""

    def __init__(self, text: str, where: str | None):
        self.text = text
        self.where = where
        self.nodes = 0
        self.names: set[str] = set()
        self.calls: set[str] = set()

    def refuse(self, reason: str) -> ExpressionError:
        return ExpressionError(self.text, reason, self.where)

    def build(self, node: ast.AST, depth: int) -> _Fn:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.refuse(f"is too large (more than {MAX_NODES} syntax nodes)")
        if depth > MAX_DEPTH:
            raise self.refuse(f"is nested too deeply (limit {MAX_DEPTH})")
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise self.refuse(f"{_describe(node)} is not allowed")
        return method(node, depth + 1)

    def _Constant(self, node: ast.Constant, d: int) -> _Fn:
        v = node.value
        if v is not None and not isinstance(v, (bool, int, float, str)):
            raise self.refuse(f"a {type(v).__name__} literal is not allowed")
        return lambda env: v

    def _Name(self, node: ast.Name, d: int) -> _Fn:
        name = node.id
        if name.startswith("_"):
            raise self.refuse(f"name {name!r} starts with '_', which is not allowed")
        self.names.add(name)

        def load(env: Any) -> Any:
            try:
                return env[0][name]
            except KeyError:
                raise _fail(f"unknown name {name!r} (defined: {', '.join(sorted(map(str, env[0]))) or 'none'})") from None

        return load

    def _Attribute(self, node: ast.Attribute, d: int) -> _Fn:
        key = node.attr
        if key.startswith("_"):
            raise self.refuse(f"attribute {key!r} starts with '_', which is not allowed")
        inner = self.build(node.value, d)

        def attr(env: Any) -> Any:
            obj = inner(env)
            if not isinstance(obj, Mapping):
                raise _fail(f"cannot read .{key} of a {type(obj).__name__} (only mapping keys can be read with '.')")
            try:
                return obj[key]
            except KeyError:
                keys = ", ".join(sorted(map(str, obj))[:20]) or "none"
                raise _fail(f"no key {key!r} (keys: {keys})") from None

        return attr

    def _Subscript(self, node: ast.Subscript, d: int) -> _Fn:
        inner = self.build(node.value, d)
        if isinstance(node.slice, ast.Slice):
            s = node.slice
            parts = [self.build(p, d) if p is not None else None for p in (s.lower, s.upper, s.step)]

            def sliced(env: Any) -> Any:
                obj = inner(env)
                if not isinstance(obj, (list, tuple, str)):
                    raise _fail(f"cannot slice a {type(obj).__name__}")
                bounds = [p(env) if p is not None else None for p in parts]
                for b in bounds:
                    if b is not None and not isinstance(b, int):
                        raise _fail(f"slice bounds must be integers, got a {type(b).__name__}")
                return obj[slice(*bounds)]

            return sliced
        index = self.build(node.slice, d)

        def item(env: Any) -> Any:
            obj = inner(env)
            key = index(env)
            if isinstance(obj, Mapping):
                try:
                    return obj[key]
                except KeyError:
                    raise _fail(f"no key {key!r}") from None
            if isinstance(obj, (list, tuple, str)):
                if not isinstance(key, int):
                    raise _fail(f"a {type(obj).__name__} index must be an integer, got a {type(key).__name__}")
                try:
                    return obj[key]
                except IndexError:
                    raise _fail(f"index {key} is out of range (length {len(obj)})") from None
            raise _fail(f"cannot index a {type(obj).__name__}")

        return item

    def _List(self, node: ast.List, d: int) -> _Fn:
        items = self._items(node.elts, d)
        return lambda env: [f(env) for f in items]

    def _Tuple(self, node: ast.Tuple, d: int) -> _Fn:
        items = self._items(node.elts, d)
        return lambda env: tuple(f(env) for f in items)

    def _Set(self, node: ast.Set, d: int) -> _Fn:
        items = self._items(node.elts, d)
        return lambda env: {f(env) for f in items}

    def _Dict(self, node: ast.Dict, d: int) -> _Fn:
        if any(k is None for k in node.keys):
            raise self.refuse("'**' unpacking in a dict is not allowed")
        keys = self._items(node.keys, d)  # type: ignore[arg-type]
        values = self._items(node.values, d)
        pairs = list(zip(keys, values))
        return lambda env: {k(env): v(env) for k, v in pairs}

    def _items(self, elts: list[ast.expr], d: int) -> list[_Fn]:
        out = []
        for e in elts:
            if isinstance(e, ast.Starred):
                raise self.refuse("'*' unpacking is not allowed")
            out.append(self.build(e, d))
        return out

    def _Compare(self, node: ast.Compare, d: int) -> _Fn:
        left = self.build(node.left, d)
        ops = []
        for op, right in zip(node.ops, node.comparators):
            fn = _CMPOPS.get(type(op))
            if fn is None:
                raise self.refuse(f"{_describe(op)} is not allowed")
            ops.append((fn, self.build(right, d)))

        def compare(env: Any) -> Any:
            a = left(env)
            for fn, right_fn in ops:
                b = right_fn(env)
                _tick(env)
                if not fn(a, b):
                    return False
                a = b
            return True

        return compare

    def _BoolOp(self, node: ast.BoolOp, d: int) -> _Fn:
        values = self._items(node.values, d)
        if isinstance(node.op, ast.And):

            def and_(env: Any) -> Any:
                v = None
                for f in values:
                    v = f(env)
                    if not v:
                        return v
                return v

            return and_

        def or_(env: Any) -> Any:
            v = None
            for f in values:
                v = f(env)
                if v:
                    return v
            return v

        return or_

    def _UnaryOp(self, node: ast.UnaryOp, d: int) -> _Fn:
        inner = self.build(node.operand, d)
        if isinstance(node.op, ast.Not):
            return lambda env: not inner(env)
        if isinstance(node.op, ast.USub):
            return lambda env: -inner(env)
        if isinstance(node.op, ast.UAdd):
            return lambda env: +inner(env)
        raise self.refuse(f"{_describe(node.op)} is not allowed")

    def _BinOp(self, node: ast.BinOp, d: int) -> _Fn:
        fn = _BINOPS.get(type(node.op))
        if fn is None:
            raise self.refuse(f"{_describe(node.op)} is not allowed")
        left = self.build(node.left, d)
        right = self.build(node.right, d)

        def binop(env: Any) -> Any:
            a, b = left(env), right(env)
            _tick(env)
            return fn(env, a, b)

        return binop

    def _IfExp(self, node: ast.IfExp, d: int) -> _Fn:
        test = self.build(node.test, d)
        body = self.build(node.body, d)
        orelse = self.build(node.orelse, d)
        return lambda env: body(env) if test(env) else orelse(env)

    def _Call(self, node: ast.Call, d: int) -> _Fn:
        if not isinstance(node.func, ast.Name):
            raise self.refuse("only calls of named functions are allowed (no methods, no calls of call results)")
        name = node.func.id
        if name.startswith("_") or name in _FORBIDDEN_CALLS:
            raise self.refuse(f"calling {name!r} is not allowed")
        self.calls.add(name)
        args = self._items(node.args, d)
        kwargs = []
        for kw in node.keywords:
            if kw.arg is None:
                raise self.refuse("'**' arguments are not allowed")
            if kw.arg.startswith("_"):
                raise self.refuse(f"keyword argument {kw.arg!r} starts with '_', which is not allowed")
            if name in BUILTINS and kw.arg not in _KEYWORDS.get(name, ()):
                raise self.refuse(f"{name}() takes no keyword argument {kw.arg!r}")
            kwargs.append((kw.arg, self.build(kw.value, d)))

        def call(env: Any) -> Any:
            udf = env[1].get(name)
            a = [f(env) for f in args]
            kw = {k: f(env) for k, f in kwargs}
            _tick(env)
            if udf is None:
                builtin = FUNCTIONS.get(name)
                if builtin is None:
                    raise _fail(f"unknown function {name!r}")
                return builtin(*a, **kw)
            t0 = time.monotonic()
            try:
                return udf(*a, **kw)
            except Exception as e:  # noqa: BLE001 - re-raised unchanged by Expr.evaluate
                raise _Raised(e) from None
            finally:
                spent = time.monotonic() - t0
                env[3] += spent  # a UDF's time is its own step's, not the expression's
                env[4] += spent

        return call


def _describe(node: ast.AST) -> str:
    kind = type(node).__name__
    return {
        "Lambda": "lambda",
        "ListComp": "a list comprehension",
        "SetComp": "a set comprehension",
        "DictComp": "a dict comprehension",
        "GeneratorExp": "a generator expression",
        "JoinedStr": "an f-string",
        "FormattedValue": "an f-string",
        "NamedExpr": "':=' (walrus)",
        "Starred": "'*' unpacking",
        "Await": "await",
        "Yield": "yield",
        "YieldFrom": "yield",
        "BitAnd": "'&'",
        "BitOr": "'|'",
        "BitXor": "'^'",
        "LShift": "'<<'",
        "RShift": "'>>'",
        "Invert": "'~'",
        "MatMult": "'@'",
    }.get(kind, f"{kind} syntax")
