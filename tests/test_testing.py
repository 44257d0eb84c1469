"""engrain.testing: TestModel and FunctionModel, in process (eg.Agent) and over the three wire formats."""

from __future__ import annotations

import json
import typing
from typing import Literal, TypedDict

import jsonschema
import pytest

import engrain as eg
from engrain._agent.schema_values import example_value
from engrain._agent.toolspec import from_function
from engrain.testing import (
    AgentInfo,
    FunctionModel,
    Reply,
    ScriptExhaustedError,
    TestModel,
    say,
    tool_call,
    tool_calls,
)


class Address(TypedDict):
    street: str
    zip: int


RAN: list[tuple[str, dict]] = []


def lookup_order(order_id: int, verbose: bool = False) -> dict:
    """Look up an order by id."""
    RAN.append(("lookup_order", {"order_id": order_id, "verbose": verbose}))
    return {"order": order_id, "status": "shipped"}


def ship(items: list[str], speed: Literal["slow", "fast"], to: Address, note: str | None, count: float = 1.0) -> str:
    """Ship items somewhere."""
    RAN.append(("ship", {"items": items, "speed": speed, "to": to, "note": note}))
    return f"shipped {len(items)} item(s) {speed} to {to['street']}"


@pytest.fixture(autouse=True)
def _clear():
    RAN.clear()


def test_test_model_calls_each_tool_once_with_valid_arguments_then_summarizes(journal):
    model = TestModel()
    agent = eg.Agent("support", model, tools=[lookup_order, ship], journal=journal)
    res = agent.run("help me", run_id="t1")
    assert res.status == "ok", res.error
    assert sorted(name for name, _ in RAN) == ["lookup_order", "ship"]  # each once: the arguments passed the schema
    out = json.loads(res.output)
    assert out == {"lookup_order": {"order": 0, "status": "shipped"},
                   "ship": f"shipped 1 item(s) slow to {RAN[[n for n, _ in RAN].index('ship')][1]['to']['street']}"}
    assert model.calls == 2
    (first, info), (second, _) = model.requests
    assert [m["role"] for m in first] == ["user"] and first[0]["content"] == "help me"
    assert {t["name"] for t in info.tools} == {"lookup_order", "ship"} and info.api == "agent"
    assert [m["role"] for m in second] == ["user", "assistant", "tool", "tool"]
    # A resumed run replays the recorded replies: the model is not asked again.
    again = agent.run("help me", run_id="t1")
    assert again.output == res.output and model.calls == 2 and len(RAN) == 2
    assert agent.describe()["model"] == "test:test-model"


def test_test_model_options(journal):
    m = TestModel(call_tools=["lookup_order"], text="all done", seed=7)
    res = eg.Agent("a", m, tools=[lookup_order, ship], journal=journal).run("go")
    assert res.output == "all done" and RAN == [("lookup_order", {"order_id": 7, "verbose": False})]
    assert eg.Agent("b", TestModel(), journal=journal).run("hello").output == "success (no tool calls)"
    with pytest.raises(eg.ConfigError, match="takes no base_url"):
        eg.Agent("d", TestModel(), base_url="http://127.0.0.1:9/v1")
    bad = eg.Agent("c", TestModel(call_tools=["nope"]), tools=[lookup_order], journal=journal).run("go")
    assert bad.status == "failed" and "call_tools names 'nope'" in bad.error and "lookup_order" in bad.error


SCHEMAS = [
    {"type": "integer", "minimum": 5, "maximum": 9},
    {"type": "integer", "exclusiveMaximum": -3},
    {"type": "number", "exclusiveMinimum": 0.1, "maximum": 0.2},
    {"type": "integer", "multipleOf": 7, "minimum": 10, "maximum": 20},
    {"type": "string", "minLength": 3, "maxLength": 4},
    {"type": "string", "pattern": "^[0-9]+$"},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "email"},
    {"anyOf": [{"type": "null"}, {"type": "integer"}]},
    {"type": ["null", "boolean"]},
    {"enum": ["x", "y", 3]},
    {"const": {"a": 1}},
    {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 3, "uniqueItems": True},
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}]},
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/X"}}, "required": ["a"],
     "$defs": {"X": {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"],
                     "additionalProperties": False}}},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
               {"properties": {"b": {"type": "integer", "minimum": 1}}, "required": ["b"]}]},
    {"type": "object", "minProperties": 2, "properties": {"p": {"type": "string"}, "q": {"type": "number"}}},
    {"oneOf": [{"type": "string", "maxLength": 0}, {"type": "integer", "minimum": 100}]},
    {},
]


@pytest.mark.parametrize("seed", [0, 1, 2, 13])
@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: json.dumps(s)[:40])
def test_generated_arguments_are_valid_for_their_schema(schema, seed):
    jsonschema.Draft202012Validator(schema).validate(example_value(schema, seed))


def test_generated_arguments_for_function_signatures():
    def many(a: int, b: list[dict], c: Literal[1, 2], d: typing.Optional[list[float]], e: Address,
             f: tuple[int, ...] = (), g: str = "x") -> None: ...

    for fn in (lookup_order, ship, many):
        params = from_function(fn).parameters
        for seed in range(5):
            args = TestModel(seed=seed).arguments({"name": fn.__name__, "parameters": params})
            jsonschema.Draft202012Validator(params).validate(args)


def test_schemas_no_value_fits_are_a_clear_error():
    with pytest.raises(ValueError, match="no integer fits"):
        example_value({"type": "object", "properties": {"n": {"type": "integer", "exclusiveMinimum": 0,
                                                              "exclusiveMaximum": 1}}, "required": ["n"]})
    with pytest.raises(ValueError, match="recursive"):
        example_value({"$ref": "#"})
    with pytest.raises(eg.ConfigError, match="tool 't'.*pattern"):
        TestModel().arguments({"name": "t", "parameters": {"type": "object", "required": ["s"],
                                                            "properties": {"s": {"pattern": "^zz[#]{3}$"}}}})


def plan(messages: list[dict], info: AgentInfo) -> Reply | str:
    """Look the order up, then answer from the tool's result."""
    if messages[-1]["role"] == "tool":
        assert messages[-1]["name"] == "lookup_order" and messages[-1]["error"] is False
        return f"Order {json.loads(messages[-1]['content'])['order']} is shipped."
    assert info.tool("lookup_order") is not None
    return tool_call("lookup_order", order_id=int(messages[-1]["content"].split()[-1]))


def test_function_model_decides_from_the_conversation_and_the_cache_skips_it(journal):
    model = FunctionModel(plan)
    agent = eg.Agent("support", model, "Be brief.", tools=[lookup_order], journal=journal, cache=True)
    assert agent.run("where is order 42").output == "Order 42 is shipped."
    assert model.calls == 2 and "Be brief." in model.requests[0][1].system
    assert agent.run("where is order 42").output == "Order 42 is shipped."
    assert model.calls == 2  # a cache hit: zero model calls
    assert agent.run("where is order 7").output == "Order 7 is shipped." and model.calls == 4


def test_function_model_script_and_its_errors(journal):
    model = FunctionModel([tool_calls(("lookup_order", {"order_id": 1}), ("lookup_order", {"order_id": 2})), say("Two.")])
    agent = eg.Agent("a", model, tools=[lookup_order], journal=journal)
    events = list(agent.chat("look up 1 and 2", session="s"))
    assert [e["type"] for e in events].count("tool_result") == 2 and events[-1]["text"] == "Two."
    assert "".join(e["delta"] for e in events if e["type"] == "text") == "Two."  # streamed word by word
    done = agent.run("again")
    assert done.status == "failed" and "request 3 of a 2-reply script" in done.error
    model.reset()
    assert model.calls == 0 and agent.run("again").status == "ok"
    wrong = eg.Agent("w", FunctionModel(lambda m, i: 42), journal=journal).run("x")
    assert wrong.status == "failed" and "must be a str or a Reply" in wrong.error
    with pytest.raises(eg.ConfigError):
        FunctionModel([1])
    with pytest.raises(ScriptExhaustedError):
        FunctionModel([]).reply([{"role": "user", "content": "x"}], AgentInfo())


def _tools_for(api: str) -> list[dict]:
    params = from_function(lookup_order).parameters
    if api == "chat":
        return [{"type": "function", "function": {"name": "lookup_order", "description": "d", "parameters": params}}]
    if api == "responses":
        return [{"type": "function", "name": "lookup_order", "description": "d", "parameters": params}]
    return [{"name": "lookup_order", "description": "d", "input_schema": params}]


def _agent_over(api: str, client) -> typing.Callable[[str], str]:
    """A hand-written agent loop over one SDK (what a user wraps with eg.wrap)."""

    def run(task: str) -> str:
        if api == "chat":
            msgs: list = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": task}]
            while True:
                m = client.chat.completions.create(model="m", messages=msgs, tools=_tools_for(api)).choices[0].message
                if not m.tool_calls:
                    return m.content
                msgs.append({"role": "assistant", "content": m.content, "tool_calls": [
                    {"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                                  "arguments": c.function.arguments}}
                    for c in m.tool_calls]})
                for c in m.tool_calls:
                    msgs.append({"role": "tool", "tool_call_id": c.id,
                                 "content": json.dumps(lookup_order(**json.loads(c.function.arguments)))})
        if api == "responses":
            items: list = [{"role": "user", "content": task}]
            while True:
                r = client.responses.create(model="m", instructions="Be brief.", input=items, tools=_tools_for(api))
                calls = [o for o in r.output if o.type == "function_call"]
                if not calls:
                    return r.output_text
                for c in calls:
                    items.append({"type": "function_call", "call_id": c.call_id, "name": c.name,
                                  "arguments": c.arguments})
                    items.append({"type": "function_call_output", "call_id": c.call_id,
                                  "output": json.dumps(lookup_order(**json.loads(c.arguments)))})
        msgs = [{"role": "user", "content": task}]
        while True:
            with client.messages.stream(model="m", max_tokens=100, system="Be brief.", messages=msgs,
                                        tools=_tools_for(api)) as s:
                r = s.get_final_message()
            uses = [b for b in r.content if b.type == "tool_use"]
            if not uses:
                return "".join(b.text for b in r.content if b.type == "text")
            msgs.append({"role": "assistant", "content": [b.model_dump(include={"type", "id", "name", "input"})
                                                          for b in r.content]})
            msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id,
                                                      "content": json.dumps(lookup_order(**b.input))} for b in uses]})

    return run


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_function_model_over_the_wire_with_wrap(api, journal):
    import anthropic
    import openai

    model = FunctionModel(plan)
    with model.serve() as server:
        client = eg.wrap(anthropic.Anthropic(base_url=server.anthropic_url, api_key="test") if api == "messages"
                         else openai.OpenAI(base_url=server.openai_url, api_key="test"))
        agent = _agent_over(api, client)
        res = eg.run(agent, "where is order 42", run_id=f"w-{api}", journal=journal)
        assert res.status == "ok", res.error
        assert res.output == "Order 42 is shipped." and model.calls == 2
        again = eg.run(agent, "where is order 42", run_id=f"w-{api}", journal=journal)
        assert again.output == res.output and model.calls == 2  # replayed from the journal
    messages, info = model.requests[1]
    assert info.api == api and info.system == "Be brief." and info.model == "m"
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["name"] == "lookup_order"
    assert json.loads(messages[1]["tool_calls"][0]["arguments"]) == {"order_id": 42}
    assert messages[2]["name"] == "lookup_order" and json.loads(messages[2]["content"])["order"] == 42


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_test_model_serves_an_agent_through_the_sdks(provider, journal):
    model = TestModel()
    with model.serve() as server:
        url = server.openai_url if provider == "openai" else server.anthropic_url
        agent = eg.Agent("remote", f"{provider}:test", tools=[lookup_order, ship], base_url=url, api_key="k",
                         journal=journal)
        res = agent.run("help")
        assert res.status == "ok", res.error
    assert sorted(n for n, _ in RAN) == ["lookup_order", "ship"]
    assert json.loads(res.output)["lookup_order"] == {"order": 0, "status": "shipped"}
    assert [i.api for _, i in model.requests] == ["chat" if provider == "openai" else "messages"] * 2


def test_a_reply_that_raises_is_a_400_the_sdk_does_not_retry():
    import openai

    def broken(messages, info):
        raise ValueError("no plan for this")

    model = FunctionModel(broken)
    with model.serve() as server:
        client = openai.OpenAI(base_url=server.openai_url, api_key="test")
        with pytest.raises(openai.BadRequestError, match="ValueError: no plan for this"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert model.calls == 1


def test_public_names_are_documented():
    import engrain.testing as t

    assert eg.testing is t
    for name in t.__all__:
        assert getattr(t, name).__doc__, name
