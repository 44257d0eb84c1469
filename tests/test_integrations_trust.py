"""What the framework adapters may be trusted with: every model call of a durable agent run is
journaled wherever the framework took the model from, a store search with a filter misses no
matching item, any id the framework accepts names a log, and a session behaves as the SDK's own.

The frameworks are the real packages; the models are scripted (PydanticAI's ``FunctionModel``, and
tests/scripted_agents_model.py's SDK ``Model``): no LLM can be reached from here.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import sys
from typing import Annotated, TypedDict

import pytest

pytest.importorskip("agents")
pytest.importorskip("pydantic_ai")
pytest.importorskip("langgraph.store.memory")

from agents import Agent as SDKAgent  # noqa: E402
from agents import RunConfig, Runner, SQLiteSession, function_tool  # noqa: E402
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage  # noqa: E402
from langgraph.graph import START, StateGraph  # noqa: E402
from langgraph.graph.message import add_messages  # noqa: E402
from langgraph.store.memory import InMemoryStore  # noqa: E402
from pydantic_ai import Agent as PAIAgent  # noqa: E402
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart  # noqa: E402
from pydantic_ai.models.function import FunctionModel  # noqa: E402

import engrain as eg  # noqa: E402
from engrain.integrations import pydantic_ai as eg_pai  # noqa: E402
from engrain.integrations.langgraph import EngrainCheckpointer, EngrainStore, thread_run_id  # noqa: E402
from engrain.integrations.openai_agents import EngrainSession, durable  # noqa: E402

HERE = pathlib.Path(__file__).parent
# No trace export from tests (there is no OpenAI key here, and nothing to send it to).
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
sys.path.insert(0, str(HERE))
from scripted_agents_model import ScriptedModel, text, tool_call  # noqa: E402


class Crash(BaseException):
    """Not an Exception: the run is left resumable, as a killed process leaves it."""


def _steps(journal, run_id: str) -> list[str]:
    return [e.name for e in journal.read(run_id) if e.kind == "step.completed"]


def _crashing_once(body):
    """An agent running ``body(task)`` that dies the first time after it returned, before the run ended."""
    crash = [True]

    def support(task: str) -> str:
        out = body(task)
        if crash[0]:
            crash[0] = False
            raise Crash
        return out

    return support


# -- PydanticAI: a model given at run time ---------------------------------------------------

def _pai_script(calls: list[str], name: str):
    def script(messages, info) -> ModelResponse:
        calls.append(name)
        if not any(isinstance(p, ToolReturnPart) for m in messages for p in getattr(m, "parts", [])):
            return ModelResponse(parts=[ToolCallPart("charge", {"amount": 5}, tool_call_id="t1")])
        return ModelResponse(parts=[TextPart(f"charged by {name}")])

    return script


def _pai_agent(model, effects: list[str]) -> PAIAgent:
    agent = PAIAgent(model, instructions="Help.")

    @agent.tool_plain
    def charge(amount: int) -> str:
        """Charge the card."""
        effects.append(f"charge {amount}")
        return f"charged {amount}"

    return agent


def test_pydantic_ai_model_given_at_run_time_is_journaled_and_replayed(store_url):
    # Agent(None) + run_sync(model=...): the model requests were not journaled, so a resume paid them again.
    calls: list[str] = []
    effects: list[str] = []
    agent = _pai_agent(None, effects)
    model = FunctionModel(_pai_script(calls, "runtime"))
    def body(task: str) -> str:
        with eg_pai.durable(agent):
            return agent.run_sync(task, model=model).output

    support = _crashing_once(body)

    j = eg.open(store_url)
    with pytest.raises(Crash):
        eg.run(support, "charge 5", run_id="pai-rt", journal=j)
    assert calls == ["runtime", "runtime"] and effects == ["charge 5"]
    res = eg.run(support, "charge 5", run_id="pai-rt", journal=j)
    assert res.status == "ok" and res.output == "charged by runtime"
    assert calls == ["runtime", "runtime"] and effects == ["charge 5"]  # replayed: nothing paid twice
    assert _steps(j, "pai-rt") == ["llm:function:script:", "tool:charge", "llm:function:script:"]
    j.close()


def test_pydantic_ai_durable_runs_the_model_the_run_asks_for(store_url):
    # durable() used to override the agent's model, which beat the one given at run time: the block
    # changed which model ran. The run-time model runs (and is journaled); the agent is left as it was.
    own: list[str] = []
    asked: list[str] = []
    effects: list[str] = []
    agent = _pai_agent(FunctionModel(_pai_script(own, "own")), effects)
    other = FunctionModel(_pai_script(asked, "asked"))

    def support(task: str) -> str:
        with eg_pai.durable(agent):
            return agent.run_sync(task, model=other).output

    j = eg.open(store_url)
    res = eg.run(support, "charge 5", run_id="pai-other", journal=j)
    assert res.status == "ok" and res.output == "charged by asked"
    assert own == [] and asked == ["asked", "asked"]
    assert _steps(j, "pai-other") == ["llm:function:script:", "tool:charge", "llm:function:script:"]
    assert "iter" not in vars(agent)  # the block's hook is gone with the block
    # Outside a block nothing is journaled or changed: the agent's own model answers.
    assert agent.run_sync("charge 5").output == "charged by own" and own == ["own", "own"]
    j.close()


def test_pydantic_ai_toolsets_given_at_run_time_are_kept_and_journaled(store_url):
    # durable() installed the agent's toolsets with Agent.override(toolsets=), which replaced the
    # ones given to run(toolsets=...): the run lost its tools. They are kept, and journaled.
    from pydantic_ai.toolsets import FunctionToolset

    calls: list[str] = []
    own: list[str] = []
    agent = _pai_agent(FunctionModel(_pai_script(calls, "agent")), own)
    refunds: list[int] = []

    def refund(amount: int) -> str:
        """Refund the card."""
        refunds.append(amount)
        return f"refunded {amount}"

    def script(messages, info) -> ModelResponse:
        calls.append(sorted(t.name for t in info.function_tools))
        if not any(isinstance(p, ToolReturnPart) for m in messages for p in getattr(m, "parts", [])):
            return ModelResponse(parts=[ToolCallPart("refund", {"amount": 5}, tool_call_id="r1")])
        return ModelResponse(parts=[TextPart("refunded")])

    extra = FunctionToolset([refund])
    def body(task: str) -> str:
        with eg_pai.durable(agent):
            return agent.run_sync(task, model=FunctionModel(script), toolsets=[extra]).output

    support = _crashing_once(body)

    j = eg.open(store_url)
    with pytest.raises(Crash):
        eg.run(support, "refund 5", run_id="pai-ts", journal=j)
    assert calls == [["charge", "refund"], ["charge", "refund"]] and refunds == [5]
    res = eg.run(support, "refund 5", run_id="pai-ts", journal=j)
    assert res.status == "ok" and res.output == "refunded"
    assert refunds == [5] and len(calls) == 2  # replayed: the run-time tool did not run twice
    assert _steps(j, "pai-ts") == ["llm:function:script:", "tool:refund", "llm:function:script:"]
    j.close()


# -- OpenAI Agents SDK: RunConfig(model=...) -------------------------------------------------

def _sdk_agent(effects: list[int]) -> SDKAgent:
    @function_tool
    def charge(amount: int) -> str:
        """Charge the card."""
        effects.append(amount)
        return f"charged {amount}"

    return SDKAgent(name="biller", instructions="Bill.", tools=[charge],
                    model=ScriptedModel([text("the agent's own model")]))


def test_sdk_run_config_model_is_journaled_through_durable_run_config(store_url):
    # The SDK prefers RunConfig.model to the durable agent's DurableModel: the calls went unjournaled.
    from engrain.integrations.openai_agents import durable_run_config

    effects: list[int] = []
    agent = _sdk_agent(effects)
    model = ScriptedModel([tool_call("charge", {"amount": 5}), text("done")])
    def body(task: str) -> str:
        config = durable_run_config(RunConfig(model=model))
        return Runner.run_sync(durable(agent), task, run_config=config).final_output

    support = _crashing_once(body)

    j = eg.open(store_url)
    with pytest.raises(Crash):
        eg.run(support, "bill 5", run_id="sdk-rc", journal=j)
    assert model.calls == 2 and effects == [5]
    res = eg.run(support, "bill 5", run_id="sdk-rc", journal=j)
    assert res.status == "ok" and res.output == "done"
    assert model.calls == 2 and effects == [5]  # replayed from the journal
    assert _steps(j, "sdk-rc") == ["llm:default", "tool:charge", "llm:default"]
    j.close()


def test_sdk_run_config_model_that_bypasses_the_journal_is_refused_before_its_tools_run(store_url):
    # Forgetting durable_run_config is not silent: the first unjournaled response fails the run with a
    # typed error, before the tool it asked for runs.
    from engrain.integrations.openai_agents import NotDurableError

    effects: list[int] = []
    agent = _sdk_agent(effects)
    model = ScriptedModel([tool_call("charge", {"amount": 5}), text("done")])

    def support(task: str) -> str:
        return Runner.run_sync(durable(agent), task, run_config=RunConfig(model=model)).final_output

    j = eg.open(store_url)
    res = eg.run(support, "bill 5", run_id="sdk-bypass", journal=j)
    assert res.status == "failed" and "NotDurableError" in str(res.error) and "durable_run_config" in str(res.error)
    assert effects == [] and model.calls == 1
    assert issubclass(NotDurableError, eg.EngrainError)
    # Outside an engrain run there is nothing to journal, so nothing is refused.
    assert Runner.run_sync(durable(agent), "hi", run_config=RunConfig(model=ScriptedModel([text("hi")]))
                           ).final_output == "hi"
    j.close()


# -- LangGraph store: a query with a filter ----------------------------------------------------

def test_lgstore_query_with_filter_returns_matching_items_the_query_ranks_low(store_url, embedder):
    # Recall took the query's top max(4 * limit, 10) hits and filtered those: 30 red items about apples
    # hid the 3 blue ones. InMemoryStore filters first; so does EngrainStore now (offset included).
    ref = InMemoryStore()
    store = EngrainStore(memory=eg.Memory(store_url, embedder=embedder))
    for s in (ref, store):
        for i in range(30):
            s.put(("docs",), f"fruit{i}", {"text": f"fresh red apples and pears, crate {i}", "color": "red"})
        for i in range(3):
            s.put(("docs",), f"car{i}", {"text": f"a blue sports car, model {i}", "color": "blue"})

    def keys(s, **kw) -> list[str]:
        return [h.key for h in s.search(("docs",), query="apples", **kw)]

    blue = {"filter": {"color": "blue"}}
    assert sorted(keys(ref, limit=2, **blue)) == ["car0", "car1"]  # the reference
    got = keys(store, limit=2, **blue)
    assert len(got) == 2 and set(got) <= {"car0", "car1", "car2"}
    everything = keys(store, limit=10, **blue)
    assert sorted(everything) == ["car0", "car1", "car2"] == sorted(keys(ref, limit=10, **blue))
    assert keys(store, limit=2, offset=2, **blue) == everything[2:] and len(keys(ref, limit=2, offset=2, **blue)) == 1
    assert keys(store, filter={"color": "green"}) == keys(ref, filter={"color": "green"}) == []
    # Without a filter the query still ranks by meaning: a red crate first.
    assert keys(store, limit=1)[0].startswith("fruit")
    store.memory.close()


# -- ids of any length -------------------------------------------------------------------------

class Counter(TypedDict):
    log: Annotated[list[AnyMessage], add_messages]
    n: int


def _counting_graph(saver):
    def bump(state: Counter) -> dict:
        return {"n": state.get("n", 0) + 1, "log": [AIMessage(f"n={state.get('n', 0) + 1}")]}

    b = StateGraph(Counter)
    b.add_node("bump", bump)
    b.add_edge(START, "bump")
    return b.compile(checkpointer=saver)


def test_langgraph_thread_id_of_any_length_is_a_thread(store_url):
    # A thread id over ~190 characters raised a raw ValueError about a run id the user never passed.
    long_a, long_b = "t" * 250, "t" * 250 + "-other"  # the same readable head: still two threads
    graph = _counting_graph(EngrainCheckpointer(store_url))
    for thread, runs in ((long_a, 2), (long_b, 1)):
        cfg = {"configurable": {"thread_id": thread}}
        for _ in range(runs):
            graph.invoke({"log": [HumanMessage("go")]}, cfg)
    again = _counting_graph(EngrainCheckpointer(store_url))  # another process's view
    assert again.get_state({"configurable": {"thread_id": long_a}}).values["n"] == 2
    assert again.get_state({"configurable": {"thread_id": long_b}}).values["n"] == 1
    # Listing every thread gives the ids LangGraph was given, not the run ids that hold them.
    listed = {t.config["configurable"]["thread_id"] for t in EngrainCheckpointer(store_url).list(None)}
    assert listed == {long_a, long_b}
    run_a = thread_run_id(long_a)
    assert len(run_a) == 200 and run_a.startswith("langgraph:ttt") and run_a != thread_run_id(long_b)
    # Ids that always fitted keep the run id they always had (stores written before are read as they were).
    assert thread_run_id("t-1") == "langgraph:t-1" and thread_run_id("x" * 190) == "langgraph:" + "x" * 190
    j = eg.open(store_url)
    assert j.read(run_a)[0].data["inputs"] == {"thread_id": long_a}
    j.close()
    EngrainCheckpointer(store_url).delete_thread(long_a)
    assert {t.config["configurable"]["thread_id"] for t in EngrainCheckpointer(store_url).list(None)} == {long_b}


def test_sdk_session_id_of_any_length_is_a_session(store_url):
    # A session id over ~186 characters raised a raw ValueError; SQLiteSession takes any id.
    long_a, long_b = "q" * 250, "q" * 250 + "-other"

    async def go():
        a, b = EngrainSession(long_a, store_url), EngrainSession(long_b, store_url)
        await a.add_items([{"role": "user", "content": "for a"}])
        await b.add_items([{"role": "user", "content": "for b"}])
        return await EngrainSession(long_a, store_url).get_items(), await b.get_items()

    got_a, got_b = asyncio.run(go())
    assert [i["content"] for i in got_a] == ["for a"] and [i["content"] for i in got_b] == ["for b"]
    asyncio.run(EngrainSession("short", store_url).add_items([{"role": "user", "content": "x"}]))
    j = eg.open(store_url)
    assert j.get_run("openai-agents:short") is not None  # a short id keeps its run id
    j.close()


# -- the session against SQLiteSession ---------------------------------------------------------

def _five(s) -> None:
    asyncio.run(s.add_items([{"role": "user", "content": f"m{i}"} for i in range(5)]))


def test_sdk_session_limits_as_sqlite_session(store_url):
    # get_items(limit=-1) gave []; SQLiteSession passes a negative limit to SQLite, which reads it as none.
    ref, ours = SQLiteSession("cmp"), EngrainSession("cmp", store_url)
    for s in (ref, ours):
        _five(s)

    def limits(s) -> dict:
        return {n: [i["content"] for i in asyncio.run(s.get_items(limit=n))] for n in (None, 0, 2, 9, -1, -3)}

    got = limits(ours)
    assert got == limits(ref)
    assert got[-1] == got[-3] == got[None] == [f"m{i}" for i in range(5)] and got[0] == []


def test_sdk_session_refuses_non_json_items_as_sqlite_session(store_url):
    # A datetime in an item was stored as its str(), so the history no longer held what was given;
    # SQLiteSession raises TypeError. NotJSONError is one, and names the item.
    import datetime

    bad = [{"role": "user", "content": "ok"}, {"role": "user", "content": "x", "when": datetime.datetime(2020, 1, 1)}]
    ref, ours = SQLiteSession("cmp"), EngrainSession("cmp", store_url)
    with pytest.raises(TypeError):
        asyncio.run(ref.add_items(bad))
    with pytest.raises(eg.NotJSONError, match=r"items\[1\].*datetime"):
        asyncio.run(ours.add_items(bad))
    assert asyncio.run(ours.get_items()) == asyncio.run(ref.get_items()) == []  # nothing was added
    # What json.dumps takes, SQLiteSession and the session both keep (a tuple comes back a list).
    asyncio.run(ours.add_items([{"role": "user", "content": ("a", "b")}]))
    assert asyncio.run(ours.get_items()) == [{"role": "user", "content": ["a", "b"]}]
