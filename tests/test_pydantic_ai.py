"""engrain under PydanticAI: durable(agent) journals model requests and tool calls inside an engrain run.

The model is PydanticAI's own FunctionModel driven by a script (a scripted model): no LLM can be reached here.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent, RunContext  # noqa: E402
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart  # noqa: E402
from pydantic_ai.models.function import FunctionModel  # noqa: E402

import engrain as eg  # noqa: E402
from engrain.integrations.pydantic_ai import durable  # noqa: E402

HERE = pathlib.Path(__file__).parent


def test_killed_agent_run_resumes_without_paying_twice(store_url, tmp_path):
    effects = tmp_path / "effects.txt"
    cmd = [sys.executable, str(HERE / "pai_agent.py"), store_url, str(effects)]
    crashed = subprocess.run([*cmd, "crash"], capture_output=True, text=True, timeout=120)
    assert crashed.returncode == -9, crashed.stderr
    assert effects.read_text().splitlines() == ["model turn 1", "charge 42", "model turn 2"]
    resumed = subprocess.run([*cmd, "run"], capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "ok Charged 42 and done."
    assert effects.read_text().splitlines() == ["model turn 1", "charge 42", "model turn 2", "model turn 2"]
    j = eg.open(store_url)
    names = [e.name for e in j.read("bill-42") if e.kind == "step.completed"]
    j.close()
    assert names == ["llm:function:scripted_model:", "tool:charge_card", "llm:function:scripted_model:"]


def _agent(calls: list[str]) -> Agent:
    def script(messages, info) -> ModelResponse:
        calls.append("model")
        if not any(isinstance(p, ToolReturnPart) for m in messages for p in getattr(m, "parts", [])):
            return ModelResponse(parts=[ToolCallPart("lookup", {"order": 7}, tool_call_id="t1")])
        return ModelResponse(parts=[TextPart("Order 7 has shipped.")])

    agent = Agent(FunctionModel(script), instructions="Help.")

    @agent.tool_plain
    def lookup(order: int) -> str:
        """Look an order up."""
        calls.append(f"lookup {order}")
        return f"order {order} shipped"

    return agent


def test_outside_a_run_durable_changes_nothing_and_a_finished_run_costs_nothing(store_url):
    calls: list[str] = []
    agent = _agent(calls)
    with durable(agent):
        assert agent.run_sync("where is 7?").output == "Order 7 has shipped."
    assert calls == ["model", "lookup 7", "model"]

    def support(task: str) -> str:
        with durable(agent):
            return agent.run_sync(task).output

    j = eg.open(store_url)
    first = eg.run(support, "where is 7?", run_id="p7", journal=j)
    assert first.status == "ok" and first.output == "Order 7 has shipped." and len(calls) == 6
    steps = [e.name for e in j.read("p7") if e.kind == "step.completed"]
    assert steps == ["llm:function:script:", "tool:lookup", "llm:function:script:"]
    again = eg.run(support, "where is 7?", run_id="p7", journal=j)
    assert again.output == first.output and len(calls) == 6  # replayed: no model request, no tool call
    j.close()


def test_streamed_requests_are_refused_inside_an_engrain_run(store_url):
    agent = _agent([])

    async def streamed(task: str) -> str:
        with durable(agent):
            async with agent.run_stream(task) as result:
                return await result.get_output()

    try:
        res = eg.run(streamed, "hi", run_id="ps", journal=eg.open(store_url))
    except eg.EngrainError as e:
        message = str(e)
    else:
        assert res.status == "failed"
        message = str(res.error)
    assert "streamed requests are not journaled" in message


def test_behavior_cache_replays_a_pydantic_ai_agents_tools_with_zero_model_requests(store_url):
    from engrain.integrations.pydantic_ai import cached

    calls: list[str] = []
    agent = _agent(calls)
    engine = eg.Engine(journal=eg.open(store_url))
    engine.set_agent(cached(agent, engine)).finalize()
    first = engine("where is 7?")
    assert not first and first.stored and first.output == "Order 7 has shipped."
    assert calls == ["model", "lookup 7", "model"]
    again = engine("where is 7?")
    # A hit: the tool replays (it really runs), the model is not asked.
    assert again and again.output == "Order 7 has shipped." and calls == ["model", "lookup 7", "model", "lookup 7"]
    engine.close()


def test_cached_refuses_tools_that_need_the_run_context(store_url):
    from engrain.integrations.pydantic_ai import cached

    agent = Agent(FunctionModel(lambda m, i: ModelResponse(parts=[TextPart("x")])))

    @agent.tool
    def needs_ctx(ctx: RunContext[None], x: int) -> int:
        """Needs the context."""
        return x

    with pytest.raises(eg.CacheError, match="needs_ctx.*RunContext"):
        cached(agent, eg.Engine(journal=eg.open(store_url)))
