"""What a ``when``/``assert`` expression may cost: size, integer and time limits.

:mod:`.expr` parses and interprets expressions; the operators and builtins that
can build big values or burn CPU are the guarded versions defined here, so the
limits live in one place.

Sizes: ``+`` and ``*`` on strings, lists and tuples may not build more than
:data:`MAX_SIZE` items per value (nested items and repeated references counted) nor
:data:`MAX_BUILT` in all; integer results of ``*`` and ``**`` may not exceed
:data:`MAX_INT_BITS` bits (so ``'a' * 10**9`` and ``10**10**10`` fail at once instead
of eating memory); ``%`` on a string (printf formatting) is refused; ``str()`` and
``round()`` have similar guards. ``int()`` of a string longer than
:data:`MAX_INT_DIGITS` characters is refused and no arithmetic takes an integer
operand over :data:`MAX_OPERAND_BITS` bits, because division and conversion are
quadratic in the size of an integer (``int('f'*999999, 16) // int('f'*499999, 16)``
took 8.5 s).

Time: each evaluation is stopped after :data:`MAX_SECONDS` of its own work, and a
:class:`Budget` (one per routine run) caps the total across all of a run's
expressions at :data:`RUN_SECONDS`, so a routine cannot stack many slow ones. Time
spent in a caller's functions (UDFs, which are journaled steps with their own
limits) is not counted. The clock is read between operations; the size caps keep
every single operation far shorter than the limits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from .._errors import ExpressionError

MAX_SIZE = 1_000_000
MAX_BUILT = 4 * MAX_SIZE
MAX_INT_BITS = 4096
#: Longest string ``int()`` converts (4096 bits in base 2 need 4096 digits).
MAX_INT_DIGITS = 4096
#: Largest integer operand of any arithmetic: more than JSON inputs can hold (4300 decimal digits).
MAX_OPERAND_BITS = 16_384
#: Seconds one evaluation may take, and all expressions of one routine run together.
MAX_SECONDS = 0.25
RUN_SECONDS = 1.0

class Budget:
    """Seconds of expression evaluation left to one routine run (see :data:`RUN_SECONDS`)."""

    __slots__ = ("left",)

    def __init__(self, seconds: float | None = None):
        self.left = RUN_SECONDS if seconds is None else seconds


def _tick(env: list[Any]) -> None:
    if time.monotonic() > env[3]:
        raise _fail("took too long (time budget of the expression or of the routine run spent)")

def _fail(reason: str) -> ExpressionError:
    # The expression text is filled in by Expr.evaluate, which knows it.
    return ExpressionError("", reason)


_ATOMS = frozenset({int, float, bool, type(None)})


def _weight(v: Any, limit: int) -> int:
    """Items in ``v`` counted through nested lists, tuples, sets and dicts (characters for strings).

    Stops counting once past ``limit``; shared sub-objects count each time they
    appear, because that is what printing or comparing them costs.
    """
    total = 0
    stack = [v]
    while stack and total <= limit:
        x = stack.pop()
        if isinstance(x, str):
            total += len(x) or 1
        elif isinstance(x, (list, tuple, set, frozenset)):
            total += 1
            if set(map(type, x)) <= _ATOMS:  # C-speed test: a flat sequence of numbers costs one per item
                total += len(x)
            else:
                stack.extend(x)
        elif isinstance(x, Mapping):
            total += 1
            stack.extend(x.keys())
            stack.extend(x.values())
        else:
            total += 1
    return total


def _charge(env: list[Any], cost: int, what: str) -> None:
    env[2] -= cost
    if env[2] < 0:
        raise _fail(f"{what}: the expression would build more than {MAX_BUILT} items in total")


def _big_ints(what: str, *values: Any) -> None:
    for v in values:
        if isinstance(v, int) and v.bit_length() > MAX_OPERAND_BITS:
            raise _fail(f"{what} on an integer over {MAX_OPERAND_BITS} bits")


def _arith(op: Callable[[Any, Any], Any], what: str) -> Callable[[list[Any], Any, Any], Any]:
    def fn(env: list[Any], a: Any, b: Any) -> Any:
        _big_ints(what, a, b)
        return op(a, b)

    return fn


def _add(env: list[Any], a: Any, b: Any) -> Any:
    if isinstance(a, (str, list, tuple)) and isinstance(b, (str, list, tuple)):
        size = _weight(a, MAX_SIZE) + _weight(b, MAX_SIZE)
        if size > MAX_SIZE:
            raise _fail(f"'+' would build {size} items (limit {MAX_SIZE})")
        _charge(env, size, "'+'")
    _big_ints("'+'", a, b)
    return a + b


def _mul(env: list[Any], a: Any, b: Any) -> Any:
    for seq, n in ((a, b), (b, a)):
        if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
            if n > 0:
                # Items the copies hold, not counting the container being copied.
                per = max(_weight(seq, MAX_SIZE) - (not isinstance(seq, str)), 1)
                if per * n > MAX_SIZE:
                    raise _fail(f"'*' would build {per * n} items (limit {MAX_SIZE})")
                _charge(env, per * n, "'*'")
            return a * b
    _big_ints("'*'", a, b)
    if isinstance(a, int) and isinstance(b, int) and a.bit_length() + b.bit_length() > MAX_INT_BITS:
        raise _fail(f"'*' would build an integer over {MAX_INT_BITS} bits")
    return a * b


def _pow(env: list[Any], a: Any, b: Any) -> Any:
    _big_ints("'**'", a, b)
    if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1 and abs(a).bit_length() * b > MAX_INT_BITS:
        raise _fail(f"'**' would build an integer over {MAX_INT_BITS} bits")
    result = a**b
    if isinstance(result, complex):
        raise _fail("'**' gave a complex number")
    return result


def _mod(env: list[Any], a: Any, b: Any) -> Any:
    if isinstance(a, str):
        raise _fail("'%' on a string (printf formatting) is not allowed")
    _big_ints("'%'", a, b)
    return a % b

def _sum(values: Any, start: Any = 0) -> Any:
    # Numbers only: sum(lists, []) would concatenate around our size checks.
    items = list(values)
    for v in (start, *items):
        if not isinstance(v, (int, float)):
            raise _fail(f"sum() adds numbers only, got a {type(v).__name__}")
    return sum(items, start)


def _round(x: Any, ndigits: Any = None) -> Any:
    if ndigits is None:
        return round(x)
    if isinstance(ndigits, int) and abs(ndigits) > 1000:
        raise _fail(f"round() ndigits {ndigits} is out of range (limit 1000)")
    return round(x, ndigits)


def _int(x: Any = 0, base: Any = None) -> int:
    if isinstance(x, (str, bytes)) and len(x) > MAX_INT_DIGITS:
        raise _fail(f"int() of a string of {len(x)} characters (limit {MAX_INT_DIGITS})")
    out = int(x) if base is None else int(x, base)
    if out.bit_length() > MAX_INT_BITS:
        raise _fail(f"int() would build an integer over {MAX_INT_BITS} bits")
    return out


def _float(x: Any = 0.0) -> float:
    if isinstance(x, str) and len(x) > MAX_INT_DIGITS:
        raise _fail(f"float() of a string of {len(x)} characters (limit {MAX_INT_DIGITS})")
    _big_ints("float()", x)
    return float(x)


def _str(x: Any = "") -> str:
    if _weight(x, 4 * MAX_SIZE) > 4 * MAX_SIZE:
        raise _fail(f"str() of a value with more than {4 * MAX_SIZE} items")
    return str(x)
