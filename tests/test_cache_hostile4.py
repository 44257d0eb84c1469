"""Behavior cache, hostile cases: a hit never replays what another task recorded, and no caller's
code can change what the cache holds.

A wrong replay is the worst bug the cache can have. These tests name the ways
one could sneak in: two tasks of different JSON types that share one text, and
a snapshot, argument or output that user code (a check's ``compare``, a
``capture`` that returns live state, a caller or agent reading what the engine
gave it) changes in place after the cache kept it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

import engrain as eg
from engrain import Check, Engine


def _engine(tmp_path, **kw: Any) -> Engine:
    return Engine(eg.open(f"sqlite:///{tmp_path / 'cache.db'}"), **kw)


# -- tasks of other JSON types with the same text ---------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ('["abc"]', ["abc"]),
        (["abc"], '["abc"]'),
        ("0", 0),
        (0, "0"),
        ("false", False),
        ('{"a": 1}', {"a": 1}),
        ("null", None),
    ],
)
@pytest.mark.parametrize("with_params", [False, True])
def test_a_json_task_and_a_string_of_its_text_do_not_share_entries(tmp_path, first, second, with_params):
    eng = _engine(tmp_path, durability="off")
    ran: list[Any] = []

    @eng.function()
    def act(what: str) -> str:
        ran.append(what)
        return what

    def agent(task: Any) -> str:
        act(repr(task))  # what the agent does depends on the task's value, type included
        return "done"

    eng.set_agent(agent).finalize()
    params = {"n": 7} if with_params else None
    assert not eng(first, params=params)
    assert eng(first, params=params)  # the same task hits
    out = eng(second, params=params)
    assert not out, f"{second!r} replayed the entry of {first!r}: {out.reason}"
    assert ran[-1] == repr(second)
    assert eng(second, params=params)


def test_a_string_task_keeps_the_key_stored_entries_have(tmp_path):
    from engrain._cache.binding import key

    eng = _engine(tmp_path, durability="off")

    @eng.function()
    def act() -> int:
        return 1

    eng.set_agent(lambda task: act()).finalize()
    eng("count the boxes", tags=["b", "a"])
    (entry,) = eng.entries()
    assert entry.task_key == key("count the boxes", ["a", "b"])  # as before JSON tasks were keyed apart


def test_tags_mode_still_keys_by_tags_alone_whatever_the_task_type(tmp_path):
    eng = _engine(tmp_path, durability="off", match="tags")

    @eng.function()
    def act() -> int:
        return 1

    eng.set_agent(lambda task: act()).finalize()
    assert not eng("x", tags=["t"])
    assert eng(["a list task"], tags=["t"])  # muscle-mem's rule: the task is not part of the key


# -- a compare that changes its arguments ---------------------------------------------------------------


@pytest.mark.parametrize("where", ["pre of step 0", "pre of step 1", "post of step 1"])
@pytest.mark.parametrize("durability", ["step", "off", "off, timed"])
def test_a_compare_that_changes_the_recorded_snapshot_cannot_make_it_pass_later(tmp_path, where, durability):
    env = {"user": "alice"}
    paid: list[str] = []

    def adopt(current: dict, candidate: dict) -> bool:
        same = current == candidate
        candidate["user"] = current["user"]  # "normalizes" in place: the recorded user becomes the current one
        return same

    check = Check(capture=lambda *a, **k: dict(env), compare=adopt)
    eng = _engine(tmp_path, durability=durability.split(",")[0])
    if durability.endswith("timed"):  # engine.metrics times each capture and compare: replay's other path
        eng.metrics.enable()

    @eng.function(pre_check=check if where == "pre of step 0" else None)
    def look() -> str:
        return "invoice 7"

    @eng.function(pre_check=check if where == "pre of step 1" else None,
                  post_check=check if where == "post of step 1" else None)
    def pay(invoice: str) -> str:
        paid.append(env["user"])
        return "paid"

    def agent(task: str) -> str:
        if env["user"] != "alice":
            raise RuntimeError("only alice pays this invoice")
        return pay(look())

    eng.set_agent(agent).finalize()
    assert not eng("pay my invoice")
    assert eng("pay my invoice")
    env["user"] = "bob"
    for _ in range(2):  # the first check saw bob; the second must not pass because the first "adopted" him
        out = eng("pay my invoice")
        assert not out, f"bob got alice's replay: {out.reason}"
    (entry,) = eng.entries()
    step = entry.steps[0 if where == "pre of step 0" else 1]
    assert step["pre" if where.startswith("pre") else "post"] == {"value": {"user": "alice"}}
    env["user"] = "alice"
    assert eng("pay my invoice")


def test_a_compare_that_changes_the_current_snapshot_leaves_the_other_candidates_a_fair_one(tmp_path):
    env = {"user": "alice"}

    def pops(current: dict, candidate: dict) -> bool:
        return current.pop("user", None) == candidate.get("user")  # compares the one field, consuming it

    eng = _engine(tmp_path, durability="off")

    @eng.function(pre_check=Check(capture=lambda: dict(env), compare=pops))
    def greet() -> str:
        return f"hi {env['user']}"

    eng.set_agent(lambda task: greet()).finalize()
    assert not eng("greet")
    env["user"] = "bob"
    assert not eng("greet")  # alice's entry fails its check: bob's is recorded
    env["user"] = "alice"
    assert eng("greet") and eng("greet")  # alice's entry now ranks first
    env["user"] = "bob"
    out = eng("greet")  # alice's compare consumed "user"; bob's must still see it
    assert out and out.output == "hi bob", out.reason


# -- a capture that returns live state ---------------------------------------------------------------


def test_a_live_snapshot_is_stored_as_it_was_before_the_call(tmp_path):
    files = ["report.pdf"]  # the environment, which capture returns as is (not a copy)
    deleted: list[str] = []
    eng = _engine(tmp_path, durability="off")

    @eng.function(pre_check=Check(capture=lambda name: files, compare=lambda cur, cand: cur == cand))
    def delete(name: str) -> str:
        deleted.append(name)
        files.remove(name)
        return "deleted"

    eng.set_agent(lambda task: delete("report.pdf")).finalize()
    assert not eng("delete the report")
    assert eng.entries()[0].steps[0]["pre"] == {"value": ["report.pdf"]}  # the state the call was made in
    out = eng("delete the report")  # the file is gone: deleting it again is not the recorded call
    assert not out, f"replayed a deletion of a file that is gone: {out.reason}"


@pytest.mark.parametrize("timed", [False, True])
@pytest.mark.parametrize("step", [0, 1])
def test_a_refreshed_snapshot_is_the_one_captured_not_what_compare_or_later_calls_made_of_it(tmp_path, step, timed):
    env: dict[str, Any] = {"user": "alice", "done": [], "visit": 0}

    def compare(current: dict, candidate: dict) -> bool:  # "visit" differs on every call and is not compared
        ok = current["user"] == candidate["user"] and current["done"] == candidate["done"]
        current.pop("user")  # a compare that consumes what it checked
        return ok

    check = Check(capture=lambda: env, compare=compare)  # live: the tools change env["done"]
    eng = _engine(tmp_path, durability="off", refresh_snapshots=True)
    if timed:
        eng.metrics.enable()

    @eng.function(pre_check=check if step == 0 else None)
    def first() -> str:
        env["done"].append("first")
        return "1"

    @eng.function(pre_check=check if step == 1 else None)
    def second() -> str:
        env["done"].append("second")
        return "2"

    def agent(task: str) -> str:
        first()
        return second()

    eng.set_agent(agent).finalize()
    def expected(visit: int) -> dict[str, Any]:
        return {"value": {"user": "alice", "done": ["first"] if step else [], "visit": visit}}

    assert not eng("do both")
    assert eng.entries()[0].steps[step]["pre"] == expected(0)
    for visit in (1, 2):
        env.update(user="alice", done=[], visit=visit)
        assert eng("do both")
        assert eng.entries()[0].steps[step]["pre"] == expected(visit)


@dataclass
class _Snap:
    user: str
    seen: list[str] = field(default_factory=list)


def test_a_dataclass_snapshot_compare_that_changes_its_candidate_changes_no_entry(tmp_path):
    env = {"user": "alice"}

    def adopt(current: _Snap, candidate: _Snap) -> bool:
        same = current.user == candidate.user
        candidate.seen.append(current.user)  # a list field the stored snapshot would share
        return same and candidate.seen == [current.user]

    eng = _engine(tmp_path, durability="off")

    @eng.function(pre_check=Check(capture=lambda: _Snap(env["user"]), compare=adopt))
    def act() -> str:
        return "ok"

    eng.set_agent(lambda task: act()).finalize()
    assert not eng("act")
    for _ in range(3):
        assert eng("act")


# -- what the engine hands out ------------------------------------------------------------------------


def test_a_caller_that_changes_a_hits_output_does_not_change_the_next_hit(tmp_path):
    eng = _engine(tmp_path, durability="off")

    @eng.function()
    def fetch() -> int:
        return 3

    eng.set_agent(lambda task: {"count": fetch(), "unit": "boxes"}).finalize()
    eng("count the boxes")
    first = eng("count the boxes")
    assert first and first.output == {"count": 3, "unit": "boxes"}
    first.output["count"] = 999
    second = eng("count the boxes")
    assert second and second.output == {"count": 3, "unit": "boxes"}


@pytest.mark.parametrize("nested", [False, True])
def test_a_caller_that_redacts_an_outcomes_steps_does_not_change_the_entry(tmp_path, nested):
    eng = _engine(tmp_path, durability="off")
    got: list[Any] = []

    @eng.function()
    def call_api(token: Any, path: str) -> str:
        got.append(token)
        return "ok"

    token: Any = {"key": "s3cret"} if nested else "s3cret"
    eng.set_agent(lambda task: call_api(token, "/x")).finalize()
    eng("call the api")
    for _ in range(2):
        out = eng("call the api")
        assert out
        for st in out.steps:  # what a caller does before logging an outcome
            if nested:
                st["args"]["token"]["key"] = "***"
            else:
                st["args"]["token"] = "***"
    assert got == [token] * 3


def test_an_agent_that_changes_a_continuations_steps_gets_no_answer_for_a_call_it_did_not_make(tmp_path):
    env = {"ok": True}
    sent: list[int] = []
    eng = _engine(tmp_path, durability="off")

    @eng.function()
    def pay(amount: int) -> str:
        sent.append(amount)
        return f"paid {amount}"

    @eng.function(pre_check=Check(capture=lambda: env["ok"], compare=lambda cur, cand: cur == cand))
    def confirm() -> str:
        return "confirmed"

    def agent(task: str, continuation: Any = None) -> str:
        if continuation is not None:
            continuation.steps[0].args["amount"] = 200  # the agent edits the plan it was handed
            r = pay(200)  # a call that was never made: it must run
            return r
        pay(100)
        return confirm()

    eng.set_agent(agent).finalize()
    assert not eng("pay")
    env["ok"] = False
    out = eng("pay")  # replays pay(100), diverges at confirm, and the agent pays 200
    assert not out and out.output == "paid 200"
    assert sent == [100, 100, 200]
    assert eng.store.cached(out.entry_id).steps[0]["args"] == {"amount": 100}


@pytest.mark.parametrize(("first", "then"), [(["abc"], '["abc"]'), ('["abc"]', ["abc"]), (0, "0")])
def test_a_run_resumes_only_with_a_task_of_the_kind_it_was_started_with(tmp_path, first, then):
    state = {"crash": False, "sent": []}
    eng = _engine(tmp_path)

    @eng.function()
    def send(what: str) -> str:
        if state["crash"]:
            raise KeyboardInterrupt  # the process dies before the step is journaled
        state["sent"].append(what)
        return "sent"

    eng.set_agent(lambda task: send(repr(task))).finalize()
    assert not eng(first)
    state["crash"] = True
    with pytest.raises(KeyboardInterrupt):
        eng(first, run_id="r")  # dies replaying: the lookup chose the entry of `first`
    state["crash"] = False
    with pytest.raises(eg.EngrainError, match="run 'r' was started with"):
        eng(then, run_id="r")
    assert state["sent"] == [repr(first)]
    assert eng(first, run_id="r").hit
    with pytest.raises(eg.EngrainError, match="run 'r' was started with"):
        eng(then, run_id="r")  # finished: its outcome is not reported for the other task either


class _OneVector:
    """Every text is the same vector: any stored task is "similar" to any other."""

    def embed(self, texts: list[str]) -> list[list[float]]:
        return [[1.0, 0.0] for _ in texts]


def test_an_agent_that_edits_a_suggested_plan_does_not_edit_the_entry(tmp_path):
    pytest.importorskip("numpy")
    eng = _engine(tmp_path, durability="off", embedder=_OneVector())
    sent: list[str] = []

    @eng.function()
    def send(to: str) -> str:
        sent.append(to)
        return "sent"

    def agent(task: str, continuation: Any = None) -> str:
        if continuation is not None and continuation.plan:
            step = continuation.plan[0]
            step.args["to"] = "omar"  # the agent edits the suggestion for its own task
            return send(**step.args)
        return send("jane")

    eng.set_agent(agent).finalize()
    assert not eng("mail jane the report")
    assert not eng("mail omar the report")  # a similar task: a plan, never a replay
    out = eng("mail jane the report")
    assert out and out.steps[0]["args"] == {"to": "jane"}
    assert sent == ["jane", "omar", "jane"]
