"""The sandboxed expression evaluator used by routine ``when`` and ``assert``."""

from __future__ import annotations

import ast
import builtins
import operator
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engrain._routines import expr as _expr
from engrain._routines import expr_limits as _limits
from engrain._errors import EngrainError, ExpressionError
from engrain._routines.expr import MAX_DEPTH, MAX_NODES, MAX_SIZE, MAX_SOURCE, compile_expr

SCOPE = {
    "inputs": {"limit": 3, "dept": "Sales", "tags": ["a", "b"]},
    "step1": {"rows": [{"dept": "Sales", "amount": 10}, {"dept": "Ops", "amount": 4}], "approved": True},
    "x": "abc",
    "n": 7,
    "f": 2.5,
    "empty": [],
    "none": None,
}


def ev(text, scope=SCOPE, functions=None):
    return compile_expr(text).evaluate(scope, functions)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("-7 % 3", 2),
        ("2 ** 10", 1024),
        ("2 ** -1", 0.5),
        ("-n", -7),
        ("+f", 2.5),
        ("'ab' + 'cd'", "abcd"),
        ("'ab' * 3", "ababab"),
        ("[1] * 3", [1, 1, 1]),
        ("(1, 2) + (3,)", (1, 2, 3)),
        ("[1, 2] + [3]", [1, 2, 3]),
        ("{'a': 1, 'b': [2]}", {"a": 1, "b": [2]}),
        ("{1, 2, 2}", {1, 2}),
        ("True and False", False),
        ("0 or 'x'", "x"),
        ("none or 5", 5),
        ("not empty", True),
        ("1 < 2 < 3", True),
        ("1 < 3 < 2", False),
        ("n == 7 != 8", True),
        ("'b' in x", True),
        ("'z' not in x", True),
        ("none is None", True),
        ("n is not None", True),
        ("'yes' if n > 5 else 'no'", "yes"),
        ("'yes' if n > 50 else 'no'", "no"),
        ("inputs.limit", 3),
        ("inputs['dept']", "Sales"),
        ("step1.rows[0].amount + step1.rows[1].amount", 14),
        ("step1.rows[-1]['dept']", "Ops"),
        ("inputs.tags[0:1]", ["a"]),
        ("x[::-1]", "cba"),
        ("x[1:]", "bc"),
        ("len(step1.rows) == 2 and step1.approved", True),
        ("len(x)", 3),
        ("min(3, 1, 2)", 1),
        ("max([4, 9, 2])", 9),
        ("max([], default=0)", 0),
        ("sum([1, 2, 3.5])", 6.5),
        ("sum([1, 2], start=10)", 13),
        ("abs(-4)", 4),
        ("round(2.567, 2)", 2.57),
        ("round(2.5)", 2),
        ("int('42')", 42),
        ("int('ff', base=16)", 255),
        ("float('1.5')", 1.5),
        ("str(12)", "12"),
        ("bool([])", False),
        ("sorted([3, 1, 2])", [1, 2, 3]),
        ("sorted([3, 1, 2], reverse=True)", [3, 2, 1]),
        ("any([0, 1])", True),
        ("all([1, 0])", False),
    ],
)
def test_evaluates_like_python(text, expected):
    out = ev(text)
    assert out == expected
    assert type(out) is type(expected)


def test_and_or_short_circuit():
    calls = []

    def boom():
        calls.append(1)
        raise AssertionError("must not be called")

    assert ev("False and boom()", functions={"boom": boom}) is False
    assert ev("True or boom()", functions={"boom": boom}) is True
    assert ev("1 if True else boom()", functions={"boom": boom}) == 1
    assert calls == []


def test_names_and_calls_are_reported_for_validation():
    e = compile_expr("len(step1.rows) > inputs.limit and check(x, mode=n) and not flag")
    assert e.names == {"step1", "inputs", "x", "n", "flag"}
    assert e.calls == {"len", "check"}
    assert compile_expr("1 + 2").names == frozenset()
    assert {"len", "min", "max", "sum", "abs", "round", "int", "float", "str", "bool", "sorted", "any", "all"} == set(
        _expr.FUNCTIONS
    )
    assert _expr.BUILTINS == set(_expr.FUNCTIONS)


def test_compile_is_cached_by_text():
    assert compile_expr("n + 1") is compile_expr("n + 1")


def test_udfs_are_called_with_args_and_keywords():
    seen = []

    def classify(amount, threshold=5):
        seen.append((amount, threshold))
        return "big" if amount > threshold else "small"

    fns = {"classify": classify}
    assert ev("classify(step1.rows[0].amount)", functions=fns) == "big"
    assert ev("classify(step1.rows[1].amount, threshold=1)", functions=fns) == "big"
    assert seen == [(10, 5), (4, 1)]


def test_udf_exceptions_propagate_unchanged():
    class Custom(LookupError):
        pass

    def fail():
        raise Custom("from the udf")

    with pytest.raises(Custom, match="from the udf"):
        ev("fail()", functions={"fail": fail})


def test_caller_function_shadows_a_builtin_but_never_a_forbidden_name():
    assert ev("len(x)", functions={"len": lambda v: 99}) == 99
    with pytest.raises(ExpressionError, match="calling 'open' is not allowed"):
        compile_expr("open('x')")
    with pytest.raises(ExpressionError, match="calling 'getattr' is not allowed"):
        compile_expr("getattr(x, 'upper')")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("1 / 0", "division by zero"),
        ("n // 0", "division by zero"),
        ("n % 0", "division by zero"),
        ("missing + 1", "unknown name 'missing'"),
        ("inputs.nope", "no key 'nope'"),
        ("inputs['nope']", "no key 'nope'"),
        ("x.upper", "cannot read .upper of a str"),
        ("n.real", "cannot read .real of a int"),
        ("step1.rows[9]", "index 9 is out of range"),
        ("step1.rows['a']", "index must be an integer"),
        ("n[0]", "cannot index a int"),
        ("n[0:1]", "cannot slice a int"),
        ("x[0:'a']", "slice bounds must be integers"),
        ("x[::0]", "ValueError"),
        ("1 + 'a'", "TypeError"),
        ("int('zz')", "ValueError"),
        ("nope()", "unknown function 'nope'"),
        ("min([])", "ValueError"),
        ("sum(['a'])", "sum() adds numbers only"),
        ("sum([[1]], [])", "sum() adds numbers only"),
        ("{[1]: 2}", "TypeError"),
        ("{[1], 2}", "TypeError"),
        ("(-8) ** 0.5", "complex"),
        ("10 ** 400 / 1.5", "OverflowError"),
        ("'%s' % x", "'%' on a string"),
        ("len", "unknown name 'len'"),
    ],
)
def test_runtime_errors_are_typed(text, fragment):
    with pytest.raises(ExpressionError) as info:
        compile_expr(text).evaluate(SCOPE, where="step 'check' field 'when'")
    msg = str(info.value)
    assert fragment in msg
    assert msg.startswith("step 'check' field 'when': expression ")
    assert info.value.expression == text
    assert isinstance(info.value, EngrainError)


ESCAPES = [
    "().__class__.__mro__[1].__subclasses__()",
    "().__class__",
    "[].__class__",
    "x.__class__.__base__",
    "inputs.__dict__",
    "__import__('os')",
    "__import__('os').system('echo pwned')",
    "__builtins__",
    "(lambda: 1)()",
    "lambda: 1",
    "open('x')",
    "open('/etc/passwd').read()",
    "getattr(x, 'y')",
    "getattr(x, '__class__')",
    "eval('1')",
    "exec('1')",
    "compile('1', 'x', 'eval')",
    "globals()",
    "vars()",
    "type(x)",
    "x.upper()",
    "'{0.__class__}'.format(x)",
    "f'{x}'",
    "f'{x!r:>10}'",
    "[c for c in x]",
    "{c: 1 for c in x}",
    "{c for c in x}",
    "list(c for c in x)",
    "(y := 1)",
    "[*x]",
    "f(*x)",
    "f(**inputs)",
    "{**inputs}",
    "~n",
    "n << 2",
    "n >> 2",
    "n & 1",
    "n | 1",
    "n ^ 1",
    "b'bytes'",
    "1j",
    "...",
    "await x",
    "x; y",
    "import os",
    "x = 1",
    "yield x",
    "_private",
    "inputs._secret",
    "f(_x=1)",
    "x[1:2, 3]",
    "sorted(x, key=len)",
    "max(x, key=len)",
]


@pytest.mark.parametrize("text", ESCAPES)
def test_known_escapes_are_refused_at_compile_time(text):
    with pytest.raises(ExpressionError) as info:
        compile_expr(text)
    assert info.value.expression == text


class _Secret:
    token = "s3cret"

    def __getitem__(self, key):
        return f"item {key}"


@pytest.mark.parametrize("text", ["obj.token", "obj['token']", "obj[0]"])
def test_objects_in_scope_expose_nothing(text):
    with pytest.raises(ExpressionError):
        ev(text, scope={"obj": _Secret()})


def test_attribute_syntax_reads_only_mapping_keys():
    assert ev("d.items", scope={"d": {"items": 5}}) == 5  # the key, not dict.items
    assert ev("d.keys", scope={"d": {"keys": [1]}}) == [1]
    with pytest.raises(ExpressionError, match="no key 'items'"):
        ev("d.items", scope={"d": {}})


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("'a' * 10**9", "would build"),
        ("10**9 * 'a'", "would build"),
        ("[0] * 10**9", "would build"),
        ("[[0] * 1000] * 10**4", "would build"),
        ("'ab' * 600000", "would build"),
        ("[1] * 600000 + [2] * 600000", "would build"),
        ("str([x] * 10**6)", "would build"),
        ("10 ** 10 ** 10", "over 4096 bits"),
        ("2 ** 100000", "over 4096 bits"),
        ("(10 ** 1000) ** 10", "over 4096 bits"),
        ("(10 ** 1000) * (10 ** 1000) * (10 ** 1000) * (10 ** 1000) * (10 ** 1000)", "over 4096 bits"),
        ("round(5, -10 ** 9)", "out of range"),
        ("int('9' * 5000)", "of a string of 5000"),
        ("'x' * 900000 + 'y' * 900000", "would build"),
        (" + ".join(["[0] * 999999"] * 5), "would build"),
    ],
)
def test_huge_values_are_refused_fast(text, fragment):
    start = time.perf_counter()
    with pytest.raises(ExpressionError, match=fragment.replace("(", r"\(")):
        ev(text)
    assert time.perf_counter() - start < 2.0


def test_big_but_allowed_values_still_work():
    assert len(ev("'a' * 1000000")) == MAX_SIZE
    assert ev("2 ** 1000") == 2**1000
    assert ev("1 ** (10 ** 100)") == 1


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("1 + " * 1000 + "1", "characters long"),
        ("-" * 200 + "1", "nested too deeply"),
        ("not " * 200 + "x", "nested too deeply"),
        ("[" * 60 + "]" * 60, "nested too deeply"),
        ("(" * 300 + "1" + ")" * 300, "too many nested parentheses"),
        ("a." * 100 + "b", "nested too deeply"),
        ("[" + ", ".join(["1"] * (MAX_NODES + 5)) + "]", "too large"),
        ("", "is empty"),
        ("   ", "is empty"),
        ("1 +", "syntax error"),
        ("'a\\ b' == x", "invalid escape sequence"),
        ("x\x00", "null bytes"),
    ],
)
def test_size_and_nesting_bounds(text, fragment):
    with pytest.raises(ExpressionError, match=fragment):
        compile_expr(text)


def test_limits_are_sane():
    assert MAX_SOURCE == 2000 and MAX_DEPTH >= 20 and MAX_NODES >= 200


def test_non_string_expression_is_a_typed_error():
    with pytest.raises(ExpressionError, match="must be a string"):
        compile_expr(42)  # type: ignore[arg-type]


def test_never_uses_python_eval(monkeypatch):
    real_compile = builtins.compile

    def refuse(*a, **k):
        raise AssertionError("eval/exec must not be used")

    def parse_only(source, filename, mode, flags=0, *a, **k):
        # ast.parse goes through compile() with PyCF_ONLY_AST; nothing else may.
        if not flags & ast.PyCF_ONLY_AST:
            raise AssertionError("compile() to a code object must not be used")
        return real_compile(source, filename, mode, flags, *a, **k)

    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "exec", refuse)
    monkeypatch.setattr(builtins, "compile", parse_only)
    assert compile_expr("len(inputs.tags) * 2 + n  # fresh text").evaluate(SCOPE) == 11


# --- fuzzing -------------------------------------------------------------------------------------


def _only_expression_errors(text: str, scope=SCOPE) -> None:
    start = time.perf_counter()
    try:
        e = compile_expr(text)
    except ExpressionError:
        return
    try:
        e.evaluate(scope, {"udf": lambda *a, **k: len(a) + len(k)})
    except ExpressionError:
        pass
    assert time.perf_counter() - start < 2.0, text


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.text(max_size=60))
def test_fuzz_random_text(text):
    _only_expression_errors(text)


_tokens = st.sampled_from(
    [
        "x", "n", "f", "inputs", "step1", "rows", "none", "empty", "__class__", "__mro__", "_x", "len", "open",
        "udf", "sorted", "str", "int", "sum", "round", "max", "lambda", "for", "in", "not", "and", "or", "if",
        "else", "is", "0", "1", "-1", "2", "10", "999999", "1e308", "0.5", "'a'", "'%s'", "True", "None",
        "(", ")", "[", "]", "{", "}", ",", ":", ".", "+", "-", "*", "**", "/", "//", "%", "<", "==", "!=",
        ":=", "~", "<<", "@", "f'", "'", "\\", "\n", " ",
    ]
)


@FUZZ
@given(st.lists(_tokens, max_size=25))
def test_fuzz_token_soup(tokens):
    _only_expression_errors(" ".join(tokens))


_leaf = st.sampled_from(
    ["x", "n", "f", "none", "empty", "inputs", "step1", "missing", "0", "1", "-3", "2.5", "'ab'", "''", "True",
     "None", "[1, 2]", "(1,)", "{'k': 1}", "{1}", "10 ** 6", "999999999"]
)


def _grow(inner):
    binop = st.sampled_from(["+", "-", "*", "/", "//", "%", "**", "==", "<", ">=", "in", "not in", "is", "and", "or"])
    attr = st.sampled_from(["limit", "rows", "tags", "dept", "approved", "amount", "keys", "__class__"])
    fn = st.sampled_from(["len", "min", "max", "sum", "abs", "round", "int", "float", "str", "bool", "sorted", "any",
                          "all", "udf", "nope"])
    return st.one_of(
        st.tuples(inner, binop, inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(["not ", "-", "+"]), inner).map(lambda t: f"({t[0]}{t[1]})"),
        st.tuples(inner, attr).map(lambda t: f"{t[0]}.{t[1]}"),
        st.tuples(inner, inner).map(lambda t: f"{t[0]}[{t[1]}]"),
        st.tuples(inner, inner, inner).map(lambda t: f"{t[0]}[{t[1]}:{t[2]}]"),
        st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
        st.tuples(fn, st.lists(inner, max_size=3)).map(lambda t: f"{t[0]}({', '.join(t[1])})"),
        st.lists(inner, max_size=3).map(lambda xs: f"[{', '.join(xs)}]"),
        st.lists(st.tuples(inner, inner), max_size=2).map(lambda kv: "{" + ", ".join(f"{k}: {v}" for k, v in kv) + "}"),
    )


_grammar = st.recursive(_leaf, _grow, max_leaves=20)


@FUZZ
@given(_grammar)
def test_fuzz_random_expressions(text):
    _only_expression_errors(text)


_AST_LEAVES = [
    ast.Constant(1), ast.Constant("s"), ast.Constant(None), ast.Constant(b"b"), ast.Constant(10**6),
    ast.Name("x", ast.Load()), ast.Name("__import__", ast.Load()), ast.Name("n", ast.Load()),
]


def _random_ast(draw, depth):
    if depth <= 0 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(_AST_LEAVES))
    sub = lambda: _random_ast(draw, depth - 1)
    kind = draw(st.integers(0, 13))
    if kind == 0:
        return ast.BinOp(sub(), draw(st.sampled_from([ast.Add(), ast.Mult(), ast.Pow(), ast.Mod(), ast.LShift(),
                                                        ast.BitOr(), ast.MatMult(), ast.Div()])), sub())
    if kind == 1:
        return ast.Attribute(sub(), draw(st.sampled_from(["a", "__class__", "__globals__", "rows"])), ast.Load())
    if kind == 2:
        return ast.Call(ast.Name(draw(st.sampled_from(["len", "str", "udf", "eval", "open", "x"])), ast.Load()),
                        [sub() for _ in range(draw(st.integers(0, 2)))], [])
    if kind == 3:
        return ast.Call(sub(), [], [])
    if kind == 4:
        return ast.Lambda(ast.arguments([], [], None, [], [], None, []), sub())
    if kind == 5:
        return ast.ListComp(sub(), [ast.comprehension(ast.Name("c", ast.Store()), sub(), [], 0)])
    if kind == 6:
        return ast.Subscript(sub(), sub(), ast.Load())
    if kind == 7:
        return ast.Compare(sub(), [draw(st.sampled_from([ast.In(), ast.Is(), ast.Lt(), ast.Eq()]))], [sub()])
    if kind == 8:
        return ast.BoolOp(draw(st.sampled_from([ast.And(), ast.Or()])), [sub(), sub()])
    if kind == 9:
        return ast.UnaryOp(draw(st.sampled_from([ast.Not(), ast.USub(), ast.Invert()])), sub())
    if kind == 10:
        return ast.JoinedStr([ast.FormattedValue(sub(), -1, None)])
    if kind == 11:
        return ast.NamedExpr(ast.Name("w", ast.Store()), sub())
    if kind == 12:
        return ast.List([sub(), ast.Starred(sub(), ast.Load())], ast.Load())
    return ast.IfExp(sub(), sub(), sub())


@FUZZ
@given(st.data())
def test_fuzz_random_asts(data):
    node = _random_ast(data.draw, 5)
    try:
        text = ast.unparse(ast.fix_missing_locations(ast.Expression(node)))
    except Exception:  # noqa: BLE001 - an AST unparse cannot print is not our concern
        return
    _only_expression_errors(text)


# Differential check: expressions generated together with their value.
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod,
        "<": operator.lt, "==": operator.eq, "!=": operator.ne}


def _valued(inner):
    def combine(t):
        (ls, lv), op, (rs, rv) = t
        if lv is ZeroDivisionError or rv is ZeroDivisionError:
            return f"({ls} {op} {rs})", ZeroDivisionError
        try:
            value = _OPS[op](lv, rv)
        except ZeroDivisionError:
            value = ZeroDivisionError
        return f"({ls} {op} {rs})", value

    def negate(t):
        s, v = t
        return f"(not {s})", (ZeroDivisionError if v is ZeroDivisionError else (not v))

    def choose(t):
        (cs, cv), (as_, av), (bs, bv) = t
        if cv is ZeroDivisionError:
            return f"({as_} if {cs} else {bs})", ZeroDivisionError
        return f"({as_} if {cs} else {bs})", av if cv else bv

    return st.one_of(
        st.tuples(inner, st.sampled_from(sorted(_OPS)), inner).map(combine),
        inner.map(negate),
        st.tuples(inner, inner, inner).map(choose),
    )


_valued_exprs = st.recursive(st.integers(-20, 20).map(lambda i: (f"({i})", i)), _valued, max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(_valued_exprs)
def test_differential_against_operator_semantics(pair):
    text, value = pair
    if value is ZeroDivisionError:
        with pytest.raises(ExpressionError, match="division by zero"):
            ev(text)
    else:
        assert ev(text) == value


# --- CPU: integer sizes, operation costs and time budgets (issue 12 #8) ---------------------------

_CPU_SCOPE = {**SCOPE, "big": 10**4299, "hexes": "f" * 999_999, "nines": "9" * 4000, "many": list(range(100_000))}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("int('f'*999999,16) // int('f'*499999,16) > 0", "int() of a string"),
        ("int(hexes, 16) > 0", "int() of a string"),
        ("int('1' * 4097, 2)", "int() of a string"),
        ("int('f' * 4096, 16)", "over 4096 bits"),
        ("float('9' * 999999)", "float() of a string"),
        ("big * big * big * big", "over"),
        ("big ** 3", "over"),
        ("(big * big) // 7", "over"),
        ("int(nines) * int(nines)", "over 4096 bits"),
        ("2 ** 4095 * 2 ** 4095", "over 4096 bits"),
        ("'x' * 999999 * 2", "would build"),
        ("[many] * 100", "would build"),
    ],
)
def test_cpu_heavy_expressions_are_refused_well_under_a_second(text, fragment):
    start = time.perf_counter()
    with pytest.raises(ExpressionError, match=re.escape(fragment)):
        compile_expr(text).evaluate(_CPU_SCOPE)
    assert time.perf_counter() - start < 0.5, text


def test_big_json_integers_still_compute():
    # The largest integers JSON inputs can carry (4300 digits) are fine operands.
    assert ev("big // 7 > 0 and big % 1000 == 0", {"big": 10**4299})
    assert ev("int('f' * 1000, 16) % 7 >= 0")


def test_one_expression_is_stopped_by_its_time_limit(monkeypatch):
    monkeypatch.setattr(_limits, "MAX_SECONDS", 0.002)
    slow = compile_expr("sum(many) + sum(many) + sum(many) + sum(many) + sum(many) + sum(many) + sum(many) > 0")
    scope = {"many": list(range(1_000_000))}
    with pytest.raises(ExpressionError, match="took too long"):
        slow.evaluate(scope)  # stopped between operations, before all seven sums ran


def test_run_budget_stops_stacked_expressions():
    e = compile_expr("sum(many) > 0")
    scope = {"many": list(range(300_000))}
    budget = _expr.Budget(0.05)
    with pytest.raises(ExpressionError) as err:
        for _ in range(10_000):
            assert e.evaluate(scope, None, "when", budget)
    assert "budget" in str(err.value) or "took too long" in str(err.value)
    assert budget.left <= 0
    with pytest.raises(ExpressionError, match="budget"):
        e.evaluate(scope, None, "when", budget)  # spent: refused at once


def test_udf_time_is_not_charged_to_the_budget():
    budget = _expr.Budget(0.05)
    e = compile_expr("nap() == 1")
    for _ in range(3):
        assert e.evaluate({}, {"nap": lambda: time.sleep(0.03) or 1}, "when", budget)
    assert budget.left > 0


def test_routine_run_stacking_slow_expressions_fails_in_budget(tmp_path, monkeypatch):
    import engrain as eg

    monkeypatch.setattr(_limits, "RUN_SECONDS", 0.02)
    steps = "".join(f"- id: a{i}\n  type: assert\n  expr: sum(inputs.many) > 0\n" for i in range(200))
    pkg = tmp_path / "slow"
    pkg.mkdir()
    (pkg / "routine.yaml").write_text(
        "name: slow\ntrusted: true\ninputs: {type: object}\nsteps:\n" + steps + "- id: out\n  type: return\n  value: 1\n")
    j = eg.open(f"sqlite:///{tmp_path / 's.db'}")
    start = time.perf_counter()
    res = eg.run_routine(pkg, {"many": list(range(300_000))}, journal=j)
    assert res.status == "failed" and "ExpressionError" in res.error and "budget" in res.error
    assert time.perf_counter() - start < 3.0


_hostile_leaf = st.sampled_from([
    "hexes", "nines", "big", "many", "'f' * 999999", "'9' * 4096", "int(nines)", "2 ** 4095", "10 ** 1200",
    "[1] * 999999", "int('f' * 1024, 16)", "float(nines)", "str(many)", "sorted(many)", "-big", "1",
])


def _hostile_grow(inner):
    binop = st.sampled_from(["+", "-", "*", "/", "//", "%", "**", "==", "<", "in"])
    fn = st.sampled_from(["int", "float", "str", "len", "sum", "max", "sorted", "abs", "round"])
    return st.one_of(
        st.tuples(inner, binop, inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(fn, inner).map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(inner, inner).map(lambda t: f"int({t[0]}, 16) // int({t[1]}, 16)"),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.recursive(_hostile_leaf, _hostile_grow, max_leaves=8))
def test_fuzz_hostile_expressions_finish_under_a_second(text):
    start = time.perf_counter()
    try:
        compile_expr(text).evaluate(_CPU_SCOPE, None, "when", _expr.Budget())
    except ExpressionError:
        pass
    assert time.perf_counter() - start < 1.0, text
