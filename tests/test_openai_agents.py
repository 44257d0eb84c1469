"""engrain under the OpenAI Agents SDK: EngrainSession (the SDK's Session protocol) and durable(agent) runs.

The model is a scripted model implementing the SDK's own ``Model`` interface
(tests/scripted_agents_model.py): no LLM can be reached from here.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import subprocess
import sys
import threading

import pytest

pytest.importorskip("agents")

from agents import Agent, Runner, function_tool  # noqa: E402
from agents.memory import Session  # noqa: E402
from agents.memory.session_settings import SessionSettings  # noqa: E402

import engrain as eg  # noqa: E402
from engrain.integrations.openai_agents import EngrainSession, durable  # noqa: E402

HERE = pathlib.Path(__file__).parent
# No trace export from tests (there is no OpenAI key here, and nothing to send it to).
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
sys.path.insert(0, str(HERE))
from scripted_agents_model import ScriptedModel, text, tool_call  # noqa: E402


def _msg(role: str, content: str) -> dict:
    return {"role": role, "content": content}


def test_session_implements_the_sdk_protocol(store_url):
    s = EngrainSession("s1", store_url)
    assert isinstance(s, Session)

    async def go():
        assert await s.get_items() == [] and await s.pop_item() is None
        await s.add_items([_msg("user", "hi"), _msg("assistant", "hello")])
        await s.add_items([_msg("user", "how are you?")])
        assert [i["content"] for i in await s.get_items()] == ["hi", "hello", "how are you?"]
        assert [i["content"] for i in await s.get_items(limit=2)] == ["hello", "how are you?"]
        assert await s.get_items(limit=0) == []
        assert (await s.pop_item())["content"] == "how are you?"
        assert [i["content"] for i in await s.get_items()] == ["hi", "hello"]
        await s.clear_session()
        assert await s.get_items() == [] and await s.pop_item() is None
        await s.add_items([_msg("user", "again")])
        return await s.get_items()

    assert [i["content"] for i in asyncio.run(go())] == ["again"]


def test_session_survives_a_new_process_view_and_honours_settings(store_url):
    asyncio.run(EngrainSession("s2", store_url).add_items([_msg("user", str(k)) for k in range(5)]))
    # Another instance (another process, another journal connection) sees the same history.
    again = EngrainSession("s2", store_url, session_settings=SessionSettings(limit=3))
    assert [i["content"] for i in asyncio.run(again.get_items())] == ["2", "3", "4"]
    other = EngrainSession("s3", store_url)
    assert asyncio.run(other.get_items()) == []  # sessions are separate
    j = eg.open(store_url)
    info = j.get_run("openai-agents:s2")
    assert info is not None and "openai-agents" in info.tags
    j.close()


def test_concurrent_pops_never_return_the_same_item(store_url):
    asyncio.run(EngrainSession("race", store_url).add_items([_msg("user", str(k)) for k in range(20)]))
    got: list[str] = []
    lock = threading.Lock()

    def popper():
        s = EngrainSession("race", journal=eg.open(store_url))  # its own connection, like another process
        for _ in range(5):
            item = asyncio.run(s.pop_item())
            with lock:
                got.append(item["content"])

    threads = [threading.Thread(target=popper) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got, key=int) == [str(k) for k in range(20)]  # each item popped exactly once
    assert asyncio.run(EngrainSession("race", store_url).get_items()) == []


def test_runner_keeps_conversation_history_in_the_session(store_url):
    model = ScriptedModel([text("Noted: the code is 42.")])
    agent = Agent(name="helper", instructions="Remember things.", model=model)
    session = EngrainSession("chat-1", store_url)
    Runner.run_sync(agent, "The secret code is 42.", session=session)
    # A new session object (a restarted process) gives the model the earlier turns.
    Runner.run_sync(agent, "What is the code?", session=EngrainSession("chat-1", store_url))
    second = model.inputs[-1]
    contents = [i.get("content") for i in second if isinstance(i, dict)]
    assert "The secret code is 42." in str(contents) and "What is the code?" in str(contents)
    assert model.calls == 2


def test_killed_runner_run_resumes_without_paying_twice(store_url, tmp_path):
    """SIGKILL in model turn 2, after the tool ran: the resumed run replays turn 1 and the tool."""
    effects = tmp_path / "effects.txt"
    cmd = [sys.executable, str(HERE / "oa_agent.py"), store_url, str(effects)]
    env = {**os.environ, "OPENAI_AGENTS_DISABLE_TRACING": "1"}
    crashed = subprocess.run([*cmd, "crash"], capture_output=True, text=True, timeout=120, env=env)
    assert crashed.returncode == -9, crashed.stderr
    assert effects.read_text().splitlines() == ["model turn 1", "charge 42", "model turn 2"]
    resumed = subprocess.run([*cmd, "run"], capture_output=True, text=True, timeout=120, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "ok Charged 42 and done."
    # Across the crash: the tool ran once, model turn 1 was paid once; only the killed turn 2 ran again.
    assert effects.read_text().splitlines() == ["model turn 1", "charge 42", "model turn 2", "model turn 2"]
    j = eg.open(store_url)
    steps = [(e.kind, e.name) for e in j.read("bill-42") if e.kind == "step.completed"]
    j.close()
    assert steps == [("step.completed", "llm:default"), ("step.completed", "tool:charge_card"),
                     ("step.completed", "llm:default")]


def test_durable_agent_outside_a_run_passes_through_and_finished_runs_cost_nothing(store_url):
    calls: list[int] = []

    @function_tool
    def lookup(order: int) -> str:
        """Look an order up."""
        calls.append(order)
        return f"order {order} shipped"

    model = ScriptedModel([tool_call("lookup", {"order": 7}), text("Order 7 has shipped.")])
    agent = durable(Agent(name="support", instructions="Help.", model=model, tools=[lookup]))
    # Outside an engrain run the wrappers change nothing.
    assert Runner.run_sync(agent, "where is 7?").final_output == "Order 7 has shipped."
    assert model.calls == 2 and calls == [7]
    j = eg.open(store_url)
    first = eg.run(lambda task: Runner.run_sync(agent, task).final_output, "where is 7?", run_id="r7", journal=j)
    assert first.status == "ok" and first.output == "Order 7 has shipped." and model.calls == 4 and calls == [7, 7]
    # The same run id again: the finished run's outcome, no model call, no tool call.
    again = eg.run(lambda task: Runner.run_sync(agent, task).final_output, "where is 7?", run_id="r7", journal=j)
    assert again.output == first.output and model.calls == 4 and calls == [7, 7]
    j.close()


def test_streamed_runs_are_refused_inside_an_engrain_run(store_url):
    agent = durable(Agent(name="s", instructions="x", model=ScriptedModel([text("hi")])))

    async def streamed(task):
        result = Runner.run_streamed(agent, task)
        async for _ in result.stream_events():
            pass
        return result.final_output

    try:
        res = eg.run(streamed, "hi", run_id="st", journal=eg.open(store_url))
    except eg.EngrainError as e:  # engrain's own errors are not the agent's failure: they reach the caller
        message = str(e)
    else:
        assert res.status == "failed"
        message = str(res.error)
    assert "streamed runs are not journaled" in message


def test_behavior_cache_replays_an_sdk_agents_tools_with_zero_model_calls(store_url):
    from engrain.integrations.openai_agents import cached

    shipped: list[int] = []

    @function_tool
    def ship(order: int) -> str:
        """Ship an order."""
        shipped.append(order)
        return f"order {order} shipped"

    model = ScriptedModel([tool_call("ship", {"order": 42}), text("Shipped order 42.")])
    engine = eg.Engine(journal=eg.open(store_url))
    sdk_agent = cached(Agent(name="shipper", instructions="Ship orders.", model=model, tools=[ship]), engine)

    async def run(task: str) -> str:
        return (await Runner.run(sdk_agent, task)).final_output

    engine.set_agent(run).finalize()
    first = asyncio.run(engine("ship order 42"))
    assert not first and first.agent_called and first.stored and model.calls == 2 and shipped == [42]
    again = asyncio.run(engine("ship order 42"))
    # A hit: the tool trajectory replays (the tool really runs again), the model is not called.
    assert again and again.output == "Shipped order 42." and model.calls == 2 and shipped == [42, 42]
    assert [s["source"] for s in again.steps] == ["replayed"]
    engine.close()


def test_a_resumed_run_does_not_add_its_session_items_twice(store_url, tmp_path):
    j = eg.open(store_url)
    session = EngrainSession("resume-chat", journal=j)
    model = ScriptedModel([text("Hello!")])
    agent = durable(Agent(name="greeter", instructions="Greet.", model=model))
    crash = {"on": True}

    def chat(task: str) -> str:
        out = Runner.run_sync(agent, task, session=session).final_output
        if crash["on"]:
            raise KeyboardInterrupt  # the process "dies" after the turn was saved
        return out

    with pytest.raises(KeyboardInterrupt):
        eg.run(chat, "hi there", run_id="chat-run", journal=j)
    crash["on"] = False
    assert eg.run(chat, "hi there", run_id="chat-run", journal=j).output == "Hello!"
    items = asyncio.run(EngrainSession("resume-chat", store_url).get_items())
    assert [i.get("content") if i.get("role") == "user" else "reply" for i in items] == ["hi there", "reply"]
    assert model.calls == 1  # the resumed run replayed the model call too
    j.close()


def test_the_example_runs_crashes_and_resumes(tmp_path):
    url = f"sqlite:///{tmp_path / 'ex.db'}"
    example = [sys.executable, str(HERE.parent / "examples/openai_agents/agent.py"), "--url", url]
    crashed = subprocess.run([*example, "--crash"], capture_output=True, text=True, timeout=120)
    assert crashed.returncode == -9 and "refunding order 7" in crashed.stdout, crashed.stderr
    resumed = subprocess.run(example, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert "refunding" not in resumed.stdout and "ok Done: refunded 19.99 on order 7." in resumed.stdout
    # Only the killed model turn ran again.
    assert resumed.stdout.count("[model] call") == 1
