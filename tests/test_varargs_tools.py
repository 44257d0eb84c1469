"""Tools with ``*args``: a durable run records the extra positional arguments as a list (JSON has no tuple)
and a resume, or a cached replay, calls the tool with them spread back."""

from __future__ import annotations

import engrain as eg
from engrain import Engine


def test_a_var_positional_tool_runs_in_a_durable_run_and_resumes(tmp_path):
    j = eg.open(tmp_path / "j.db")
    calls: list[tuple] = []

    @eg.tool(registry=eg.ToolRegistry())
    def tag(name: str, *labels: str) -> list[str]:
        calls.append((name, *labels))
        return [name, *labels]

    def agent(task: str) -> list[str]:
        return tag("a", "x", "y") + tag("b")

    first = eg.run(agent, "tag them", run_id="tags", journal=j)
    assert first.status == "ok", first.error
    assert first.output == ["a", "x", "y", "b"]
    steps = [e.data["args"] for e in j.read("tags") if e.kind == "step.completed"]
    assert steps == [{"name": "a", "labels": ["x", "y"]}, {"name": "b", "labels": []}]
    again = eg.run(agent, "tag them", run_id="tags", journal=j)  # finished steps answer from the journal
    assert again.output == first.output and calls == [("a", "x", "y"), ("b",)]
    j.close()


def test_a_cached_replay_spreads_the_recorded_positional_arguments_back(tmp_path):
    engine = Engine(eg.open(tmp_path / "c.db"))
    effects: list[tuple] = []
    agent_calls = []

    @engine.function()
    def tag(name: str, *labels: str) -> str:
        effects.append((name, *labels))
        return f"{name}:{','.join(labels)}"

    def agent(task: str) -> str:
        agent_calls.append(task)
        return tag("ticket-7", "urgent", "billing")

    engine.set_agent(agent).finalize()
    assert engine("label ticket 7").output == "ticket-7:urgent,billing"
    hit = engine("label ticket 7")
    assert hit.hit and hit.output == "ticket-7:urgent,billing"
    assert agent_calls == ["label ticket 7"]  # the second answer came from the cache
    assert effects == [("ticket-7", "urgent", "billing")] * 2  # the replay called the tool the same way
