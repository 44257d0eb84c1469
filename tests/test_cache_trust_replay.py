"""Behavior cache: a resumed or continued call never replays a step made for other values.

A resume with other params or tags is refused before anything is written (as
one with another task is); a done step answers an agent call, a switch takes
another candidate and a step's result stands for the output only when the
values are the same JSON, kinds included (``True``, ``1`` and ``1.0`` differ,
though Python's ``==`` says they are equal).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import engrain as eg
from engrain import Engine, EngrainError, NondeterminismError


def _open(tmp_path) -> Any:
    return eg.open(f"sqlite:///{tmp_path / 'cache.db'}")


def _transfer_engine(journal, *, namespace: str | None = None) -> tuple[Engine, dict[str, Any]]:
    """Two steps keyed on a pinned param (``user`` is used inside a word); ``transfer`` can crash."""
    eng = Engine(journal, namespace=namespace)
    state: dict[str, Any] = {"crash": False, "opened": [], "transfers": []}

    @eng.function()
    def open_account(login: str) -> str:
        state["opened"].append(login)
        return f"opened {login}"

    @eng.function()
    def transfer(from_login: str, note: str) -> str:
        if state["crash"]:
            raise KeyboardInterrupt  # the process dies before the step is journaled
        state["transfers"].append(from_login)
        return "ok"

    def agent(task: str, user: Any = None) -> str:
        open_account(f"{user}_main")
        return transfer(f"{user}_main", "monthly")

    eng.set_agent(agent).finalize()
    return eng, state


def _crash(eng: Engine, state: dict[str, Any], run_id: str, **call: Any) -> None:
    state["crash"] = True
    try:
        with pytest.raises(KeyboardInterrupt):
            eng("do the monthly transfer", run_id=run_id, **call)
    finally:
        state["crash"] = False
    assert eng.journal.get_run(run_id).status == "running"
    state["opened"].clear()
    state["transfers"].clear()


# -- bug 2: a resume must give the params and tags the run was started with -----------------------


def test_resume_with_other_params_is_refused_and_the_same_params_resume(tmp_path):
    j = _open(tmp_path)
    eng, state = _transfer_engine(j)
    jane = {"user": "jane"}
    assert not eng("do the monthly transfer", params=jane, user="jane")  # recorded
    _crash(eng, state, "call-2", params=jane, user="jane")  # replaying: open_account done, transfer not
    before = len(j.read("call-2"))

    with pytest.raises(EngrainError, match=r"run 'call-2' was started with params \{'user': 'jane'\}, not \{'user': 'omar'\}"):
        eng("do the monthly transfer", params={"user": "omar"}, run_id="call-2", user="omar")
    assert state["transfers"] == [] and state["opened"] == []  # jane's transfer was not replayed for omar
    assert len(j.read("call-2")) == before and j.get_run("call-2").status == "running"  # nothing written

    out = eng("do the monthly transfer", params=jane, run_id="call-2", user="jane")
    assert out.hit and out.status == "ok" and out.output == "ok"
    assert state["opened"] == [] and state["transfers"] == ["jane_main"]  # the done step is not run again
    j.close()


@pytest.mark.parametrize("first,then", [(1, 1.0), (1, True), (0, False), ([1], [True]), ({"a": 1.0}, {"a": 1})])
def test_resume_with_params_of_another_kind_is_refused(tmp_path, first, then):
    j = _open(tmp_path)
    eng, state = _transfer_engine(j)
    assert not eng("do the monthly transfer", params={"user": first}, user=first)
    _crash(eng, state, "r", params={"user": first}, user=first)
    with pytest.raises(EngrainError, match="run 'r' was started with params"):
        eng("do the monthly transfer", params={"user": then}, run_id="r", user=then)
    assert state["transfers"] == []
    assert eng("do the monthly transfer", params={"user": first}, run_id="r", user=first).hit
    assert state["transfers"] == [f"{first}_main"]
    j.close()


def test_resume_with_other_tags_is_refused(tmp_path):
    j = _open(tmp_path)
    eng, state = _transfer_engine(j)
    assert not eng("do the monthly transfer", tags=["eu"], user="jane")
    _crash(eng, state, "r", tags=["eu"], user="jane")
    with pytest.raises(EngrainError, match=r"run 'r' was started with tags \['engrain.cache', 'eu'\], not \['engrain.cache', 'us'\]"):
        eng("do the monthly transfer", tags=["us"], run_id="r", user="jane")
    with pytest.raises(EngrainError, match="run 'r' was started with params"):
        eng("do the monthly transfer", tags=["eu"], params={"user": "jane"}, run_id="r", user="jane")
    assert state["transfers"] == []
    assert eng("do the monthly transfer", tags=["eu"], run_id="r", user="jane").hit
    assert state["transfers"] == ["jane_main"]
    j.close()


def test_a_finished_call_is_not_reported_for_other_params(tmp_path):
    j = _open(tmp_path)
    eng, state = _transfer_engine(j)
    assert eng("do the monthly transfer", params={"user": "jane"}, run_id="r", user="jane").output == "ok"
    state["transfers"].clear()
    with pytest.raises(EngrainError, match="run 'r' was started with params"):
        eng("do the monthly transfer", params={"user": "omar"}, run_id="r", user="omar")
    again = eng("do the monthly transfer", params={"user": "jane"}, run_id="r", user="jane")
    assert again.status == "ok" and state["transfers"] == []  # its recorded outcome, nothing run
    j.close()


def test_an_async_call_records_and_checks_its_params(tmp_path):
    j = _open(tmp_path)
    eng = Engine(j)
    sent: list[str] = []

    @eng.function()
    async def send(to: str) -> str:
        sent.append(to)
        return f"sent to {to}"

    async def agent(task: str, to: str) -> str:
        return await send(f"{to}_box")

    eng.set_agent(agent).finalize()
    assert asyncio.run(eng("mail it", params={"to": "jane"}, run_id="a", to="jane")).output == "sent to jane_box"
    with pytest.raises(EngrainError, match=r"run 'a' was started with params \{'to': 'jane'\}, not \{'to': 'omar'\}"):
        asyncio.run(eng("mail it", params={"to": "omar"}, run_id="a", to="omar"))
    assert asyncio.run(eng("mail it", params={"to": "jane"}, run_id="a", to="jane")).status == "ok"
    assert sent == ["jane_box"]
    assert j.read("a")[0].data["params"] == {"to": "jane"}
    j.close()


def test_a_resume_whose_lookup_was_made_elsewhere_never_replays_its_choice(tmp_path):
    """Same task, params and tags, but another namespace: the journaled choice is another engine's."""
    j = _open(tmp_path)
    eng, state = _transfer_engine(j, namespace="team-a")
    assert not eng("do the monthly transfer", user="jane")
    _crash(eng, state, "r", user="jane")
    other, other_state = _transfer_engine(j, namespace="team-b")
    out = other("do the monthly transfer", run_id="r", user="omar")
    assert not out.hit and out.status == "failed" and "NondeterminismError" in (out.error or "")
    assert other_state["transfers"] == [] and state["transfers"] == []
    assert issubclass(NondeterminismError, EngrainError)
    j.close()


# -- bug 12: a done step answers an agent call only for the same JSON kinds -------------------------


@pytest.mark.parametrize("recorded,asked", [(1, True), (1, 1.0), (True, 1), ([1, 2], [1.0, 2]), ({"k": 0}, {"k": False})])
def test_a_done_step_answers_only_a_call_of_the_same_kinds(tmp_path, recorded, asked):
    j = _open(tmp_path)
    eng = Engine(j)
    env = {"page": "A"}
    ran: list[Any] = []

    @eng.function()
    def set_flag(value: Any) -> str:
        ran.append(value)
        return f"set to {value!r}"

    @eng.function(pre_check=eg.Check(capture=lambda: env["page"], compare=lambda a, b: a == b))
    def finish() -> str:
        return "finished"

    mode = {"v": recorded}

    def agent(task: str, continuation: Any = None) -> str:
        set_flag(mode["v"])
        finish()
        return "ok"

    eng.set_agent(agent).finalize()
    assert not eng("configure")
    env["page"], mode["v"] = "B", asked
    ran.clear()
    out = eng("configure")
    assert not out.hit and out.agent_called
    assert [type(v) for v in ran] == [type(recorded), type(asked)] and ran == [recorded, asked]
    assert [(s["name"], s["source"]) for s in out.steps] == [("set_flag", "replayed"), ("set_flag", "agent"), ("finish", "agent")]
    assert out.steps[1]["args"] == {"value": asked} and type(out.steps[1]["args"]["value"]) is type(asked)
    j.close()


def test_a_done_step_still_answers_the_same_call(tmp_path):
    j = _open(tmp_path)
    eng = Engine(j)
    env = {"page": "A"}
    ran: list[Any] = []

    @eng.function()
    def set_flag(value: Any) -> str:
        ran.append(value)
        return "set"

    @eng.function(pre_check=eg.Check(capture=lambda: env["page"], compare=lambda a, b: a == b))
    def finish() -> str:
        return "finished"

    def agent(task: str, continuation: Any = None) -> str:
        set_flag([1, {"x": 2.5}])
        finish()
        return "ok"

    eng.set_agent(agent).finalize()
    assert not eng("configure")
    env["page"] = "B"
    ran.clear()
    out = eng("configure")
    assert ran == [[1, {"x": 2.5}]]  # replayed once; the agent's repeat was answered from it
    assert [s["source"] for s in out.steps] == ["replayed", "continued", "agent"]
    j.close()


def test_a_switch_needs_the_done_steps_with_their_kinds(tmp_path):
    """Candidate A did set_flag(1), B set_flag(True): after A's set_flag(1), a failed check never switches to B."""
    j = _open(tmp_path)
    eng = Engine(j)
    env = {"page": "P", "door": "D1"}
    ran: list[Any] = []
    same = lambda a, b: a == b  # noqa: E731

    @eng.function(pre_check=eg.Check(capture=lambda value: env["page"], compare=same))
    def set_flag(value: Any) -> str:
        ran.append(value)
        return "set"

    @eng.function(pre_check=eg.Check(capture=lambda: env["door"], compare=same))
    def go() -> str:
        return "gone"

    mode = {"v": 1}

    def agent(task: str, continuation: Any = None) -> str:
        set_flag(mode["v"])
        go()
        return "ok"

    eng.set_agent(agent).finalize()
    assert not eng("open up")  # A: set_flag(1) on page P, go at door D1
    assert eng("open up")  # A is hit once, so it ranks first
    env["page"], env["door"], mode["v"] = "Q", "D2", True
    assert not eng("open up")  # A's first check fails: B, set_flag(True) on page Q, go at door D2
    assert len(eng.entries()) == 2
    env["page"], mode["v"] = "P", 1
    ran.clear()
    out = eng("open up")  # A's set_flag(1) replays, its go fails at D2; B did set_flag(True) first
    assert not out.hit and out.agent_called and out.reason.startswith("diverged")
    assert ran == [1] and type(ran[0]) is int
    assert [s["source"] for s in out.steps] == ["replayed", "continued", "agent"]
    j.close()


# -- bug 13: a step's result is the output's producer only when it is the same JSON value ----------------


@pytest.mark.parametrize("result,output", [(2, 2.0), (2.0, 2), ([1], [1.0]), ({"n": 1}, {"n": True})])
def test_a_hit_returns_the_output_with_its_own_kind(tmp_path, result, output):
    j = _open(tmp_path)
    eng = Engine(j)

    @eng.function()
    def add_items(n: int) -> Any:
        return result

    def agent(task: str) -> Any:
        add_items(2)
        return output

    eng.set_agent(agent).finalize()
    first = eng("add two items")
    second = eng("add two items")
    assert second.hit
    assert second.output == output and type(second.output) is type(output)
    assert second.output == first.output
    assert eng.entries()[0].output.get("value") == output
    j.close()


def test_a_hit_returns_a_producing_steps_result(tmp_path):
    j = _open(tmp_path)
    eng = Engine(j)
    calls: list[int] = []

    @eng.function()
    def count(n: int) -> list[Any]:
        calls.append(n)
        return [n, 0.5]

    eng.set_agent(lambda task: count(3)).finalize()
    assert not eng("count")
    assert eng.entries()[0].output.get("step") == 0
    hit = eng("count")
    assert hit.hit and hit.output == [3, 0.5] and calls == [3, 3]
    j.close()
