"""Behavior cache with ``params``: a hit never replays an argument taken from another param value.

Each param is either bound in every argument that used its value or pinned
into the key (engrain/_cache/binding.py). The two regression cases come from
the issue; the property test draws random tasks, params and trajectories and
checks that a second call with new params replays exactly the arguments the
agent would have produced, or misses.
"""

from __future__ import annotations

import itertools
import os
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engrain as eg
from engrain import Engine
from engrain._cache.binding import bind, canonical_task


def test_add_1_never_replays_for_add_5(store_url):
    """Issue example 1: 'add 1' (n=1) and 'add 5' (n=5) used to share a key and replay increment(n=1)."""
    engine = Engine(eg.open(store_url))
    state = {"val": 0}

    @engine.function()
    def increment(n: int) -> None:
        state["val"] += n

    engine.set_agent(lambda t: increment(int(t.split()[1]))).finalize()
    assert not engine("add 1", params={"n": 1})
    state["val"] = 0
    out = engine("add 5", params={"n": 5})
    assert not out and out.agent_called and state["val"] == 5
    state["val"] = 0
    again = engine("add 7", params={"n": 7})  # 5 was templated out of the task and bound: 7 re-binds it
    assert again and state["val"] == 7
    assert [s["args"] for s in again.steps] == [{"n": 7}]


def test_order_7_boxes_never_replays_3_boxes(store_url):
    """Issue example 2: an int param used inside a longer string argument is bound there too."""
    engine = Engine(eg.open(store_url))
    sent: list[str] = []

    @engine.function()
    def send(text: str) -> str:
        sent.append(text)
        return "sent"

    def agent(task: str) -> None:
        send(f"{task.split()[1]} boxes please")

    engine.set_agent(agent).finalize()
    assert not engine("order 3 boxes", params={"qty": 3})
    out = engine("order 7 boxes", params={"qty": 7})
    assert out and sent == ["3 boxes please", "7 boxes please"]


def test_a_use_inside_a_word_pins_the_value_into_the_key(store_url):
    engine = Engine(eg.open(store_url))
    sent: list[str] = []

    @engine.function()
    def label(code: str) -> None:
        sent.append(code)

    engine.set_agent(lambda task: label("box" + task.split()[1])).finalize()
    assert not engine("label 12 now", params={"n": 12})
    assert engine("label 12 now", params={"n": 12})  # same value: the pinned key matches
    out = engine("label 40 now", params={"n": 40})
    assert not out and sent == ["box12", "box12", "box40"]


def test_binding_rules():
    # Whole values of the same type, and text at word boundaries, are bound.
    b = bind([{"to": "Sarah Baker", "note": "lunch with Sarah Baker at 12:30", "n": 12}], {"who": "Sarah Baker", "n": 12})
    assert b.pinned == [] and b.values[0] == {
        "to": "{{ params.who }}", "note": "lunch with {{ params.who }} at {{ params.n }}:30", "n": "{{ params.n }}"
    }
    # Another type, a dict key, inside a word, or overlapping another param: pinned.
    assert bind([{"x": 7.0}], {"n": 7}).pinned == ["n"]
    assert bind([{"x": True}], {"n": 1}).pinned == ["n"]
    assert bind([{"x": "7"}], {"n": 7}).pinned == ["n"]
    assert bind([{"x": {"bob": 1}}], {"who": "bob"}).pinned == ["who"]
    assert bind([{"x": "bobby"}], {"who": "bob"}).pinned == ["who"]
    assert bind([{"x": "Sarah Baker"}], {"full": "Sarah Baker", "first": "Sarah"}).pinned == ["first", "full"]
    assert bind([{"x": 5}], {"a": 5, "b": 5}).pinned == ["a", "b"]
    assert bind([{"x": 5}], {"not-a-name": 5}).pinned == ["not-a-name"]
    # Literal braces survive a templated step.
    b = bind([{"x": "{{ raw }} for bob"}], {"who": "bob"})
    from engrain._routines.template import render

    assert render(b.values[0], {"params": {"who": "ann"}}) == {"x": "{{ raw }} for ann"}
    # Past the scan bounds nothing is bound (pinned is always safe).
    from engrain._cache import binding

    assert bind([{"x": "bob " * (binding.MAX_SCAN_BYTES // 4)}], {"who": "bob"}).pinned == ["who"]
    assert bind([{"x": 5}], {f"p{i}": i for i in range(binding.MAX_PARAMS + 1)}).bound == []
    # Only strong values found at word boundaries leave the task text.
    assert canonical_task("add 1 to order 30", {"n": 1, "o": 30}) == "add 1 to order {{ params.o }}"
    assert canonical_task("price 1.5 each", {"n": 5}) == "price 1.5 each"
    assert canonical_task("lunch with Sarah Baker", {"who": "Sarah Baker"}) == "lunch with {{ params.who }}"
    # Without params only line endings and the ends change (the hit path skips the search for values).
    assert canonical_task("  lunch \n with   Sarah ", {}) == "  lunch \n with   Sarah"
    assert canonical_task("a {{ b }}  c", {}) == "a {{ b }}  c"


# -- property: replay == what the agent would do, or a miss ------------------------------------------------

WORDS = ["ab", "abc", "add", "to", "12", "bob", "x", "1", "order", "with"]
PARAM_VALUES = st.one_of(
    st.integers(-3, 40),
    st.sampled_from([2.5, 0.5, 12.0]),
    st.booleans(),
    st.text("abcx", min_size=1, max_size=5),
    st.sampled_from(["Sarah Baker", "Sarah", "bob", "ab", "2026-03-04"]),
)
# Constants an agent uses on its own: never equal to, nor containing, a param value's text.
CONSTS = st.sampled_from(["KEEP", "ONE TWO", 1000, -999, None, "", ["Q", "R"]])
NAMES = ["p0", "p1", "p2"]


def _expr(depth: int = 0) -> st.SearchStrategy:
    leaf = st.one_of(
        st.tuples(st.just("param"), st.sampled_from(NAMES)),
        st.tuples(st.just("fmt"), st.sampled_from(["", "Q ", "Q-", "Q", "@"]), st.sampled_from(NAMES), st.sampled_from(["", " Z", ".", "Z", "/Z"])),
        st.tuples(st.just("const"), CONSTS),
    )
    if depth >= 1:
        return leaf
    return st.one_of(leaf, st.tuples(st.just("list"), st.lists(_expr(depth + 1), max_size=2)))


def _eval(e: tuple, params: dict) -> object:
    if e[0] == "param":
        return params[e[1]]
    if e[0] == "fmt":
        return f"{e[1]}{params[e[2]]}{e[3]}"
    if e[0] == "const":
        return e[1]
    return [_eval(x, params) for x in e[1]]


def _fill(template: list, params: dict) -> str:
    return " ".join(str(params[t[1]]) if isinstance(t, tuple) else t for t in template)


TEMPLATE = st.lists(st.one_of(st.sampled_from(WORDS), st.tuples(st.just("slot"), st.sampled_from(NAMES))), min_size=1, max_size=5)
PROGRAM = st.lists(st.tuples(_expr(), _expr()), min_size=0, max_size=3)
PARAMS = st.fixed_dictionaries({n: PARAM_VALUES for n in NAMES})


@pytest.fixture(scope="module")
def prop_engine(tmp_path_factory):
    engine = Engine(eg.open(str(tmp_path_factory.mktemp("prop") / "cache.db")), durability="off")
    holder: dict = {}

    @engine.function()
    def act(a: object, b: object) -> str:
        return "done"

    def agent(task: str) -> object:
        program, params = holder["program"], holder["params"]
        for a, b in program:
            act(_eval(a, params), _eval(b, params))
        return holder["output"]

    engine.set_agent(agent).finalize()
    return engine, holder


_ids = itertools.count()


@settings(max_examples=int(os.environ.get("ENGRAIN_PROP_EXAMPLES", "400")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(template=TEMPLATE, program=PROGRAM, out=_expr(), first=PARAMS, second=PARAMS, keep=st.sets(st.sampled_from(NAMES)))
def test_replay_with_new_params_is_what_the_agent_would_do(prop_engine, template, program, out, first, second, keep):
    engine, holder = prop_engine
    second = {n: first[n] if n in keep else v for n, v in second.items()}
    tags = [f"case-{next(_ids)}"]
    holder.update(program=program, params=first, output=_eval(out, first))
    recorded = engine(_fill(template, first), tags=tags, params=first)
    assert not recorded and recorded.status == "ok"
    holder.update(params=second, output=_eval(out, second))
    expected = [{"a": _eval(a, second), "b": _eval(b, second)} for a, b in program]
    res = engine(_fill(template, second), tags=tags, params=second)
    assert res.status == "ok"
    if res.hit:
        replayed = [s["args"] for s in res.steps]
        assert json.dumps(replayed, sort_keys=True) == json.dumps(expected, sort_keys=True)
        assert json.dumps(res.output) == json.dumps(_eval(out, second))
    else:
        assert res.agent_called


def test_strong_params_re_bind_on_a_hit(prop_engine):
    """The property above also holds by always missing; this shows bound params do hit."""
    engine, holder = prop_engine
    template = ["lunch", "with", ("slot", "p0"), "on", ("slot", "p1")]
    program = [(("param", "p0"), ("fmt", "Q ", "p1", "")), (("const", "KEEP"), ("param", "p2"))]
    hits = 0
    values = [("Sarah Baker", "2026-03-04", 12), ("Ann Lee", "2026-04-01", 30), ("Bob Ray", "2027-01-09", 41)]
    for p0, p1, p2 in values:
        params = {"p0": p0, "p1": p1, "p2": p2}
        holder.update(program=program, params=params, output="ok")
        res = engine(_fill(template, params), tags=["strong"], params=params)
        hits += res.hit
        assert [s["args"] for s in res.steps] == [{"a": p0, "b": f"Q {p1}"}, {"a": "KEEP", "b": p2}]
    assert hits == 2
