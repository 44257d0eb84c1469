"""eg.wrap journals every way it lets a run reach the model, and the providers name what a bad reply got wrong.

Against the scripted model server (``engrain._agent.scripted``) through the official SDKs, on a
SQLite store in ``tmp_path``:

* the SDKs' ``parse`` and ``.stream()`` helpers are journaled LLM steps: a resume after a crash
  sends no request and gets the SDK's own parsed objects back;
* ``with_raw_response``/``with_streaming_response`` and the other resources, which the journal
  cannot record, raise ``NotJournaledError`` inside a run instead of being paid again on resume;
* a malformed Chat Completions or Messages reply fails the run with the SDK's ``APIError`` naming
  the bad field, not a ``TypeError`` from the parsing;
* streamed tool calls without ``index`` (Ollama) are told apart by their ids.

Malformed replies are scripted by patching the server's body builders (``_Chat``/``_Messages``)
for one test: the server, the HTTP and the SDK are the real ones.
"""

from __future__ import annotations

import asyncio
import json

import pydantic
import pytest

import engrain as eg
from engrain._agent import scripted
from engrain._agent.scripted import ScriptedModel, say, tool_calls
from engrain._durable.context import steps_of


@pytest.fixture
def journal(tmp_path):
    j = eg.open(f"sqlite:///{tmp_path / 'engrain.db'}")
    yield j
    j.close()


@pytest.fixture
def model():
    m = ScriptedModel().start()
    yield m
    m.stop()


class Answer(pydantic.BaseModel):
    x: int


def _clients(model: ScriptedModel, *, is_async: bool = False):
    import anthropic
    import openai

    if is_async:
        return (eg.wrap(openai.AsyncOpenAI(base_url=model.openai_url, api_key="scripted")),
                eg.wrap(anthropic.AsyncAnthropic(base_url=model.url, api_key="scripted")))
    return (eg.wrap(openai.OpenAI(base_url=model.openai_url, api_key="scripted")),
            eg.wrap(anthropic.Anthropic(base_url=model.url, api_key="scripted")))


MSGS = [{"role": "user", "content": "hi"}]


# -- bug 6: parse and the stream helpers are journaled ------------------------------------------


def test_parse_and_stream_helpers_are_journaled_and_replay_the_sdks_own_objects(model, journal):
    model.script = lambda api, body: say('{"x": 7}')
    oc, ac = _clients(model)
    crash = [True]
    seen: list[list] = []

    def agent(task: str) -> list:
        out = []
        p = oc.chat.completions.parse(model="m", messages=MSGS, response_format=Answer)
        out.append([type(p).__name__, p.choices[0].message.parsed])
        r = oc.responses.parse(model="m", input=task, text_format=Answer)
        out.append([type(r).__name__, r.output_parsed])
        a = ac.messages.parse(model="m", max_tokens=10, messages=MSGS, output_format=Answer)
        out.append([type(a).__name__, a.parsed_output])
        with oc.chat.completions.stream(model="m", messages=MSGS, response_format=Answer) as s:
            f = s.get_final_completion()
        out.append([type(f).__name__, f.choices[0].message.parsed])
        with oc.responses.stream(model="m", input=task, text_format=Answer) as s:
            out.append([type(s.get_final_response()).__name__, s.get_final_response().output_parsed])
        with ac.messages.stream(model="m", max_tokens=10, messages=MSGS) as s:
            m = s.get_final_message()
        out.append([type(m).__name__, m.content[0].text])
        seen.append(out)
        if crash[0]:
            crash[0] = False
            raise KeyboardInterrupt  # the process dies here: the run stays resumable
        return [[name, v.x if isinstance(v, Answer) else v] for name, v in out]

    with pytest.raises(KeyboardInterrupt):
        eg.run(agent, "hi", run_id="helpers", journal=journal)
    assert model.calls == 6
    res = eg.run(agent, "hi", run_id="helpers", journal=journal)
    assert res.status == "ok", res.error
    assert model.calls == 6 and res.replayed == 6 and res.executed == 0  # nothing sent again
    live, replayed = seen
    # the same SDK types, with the caller's response_format applied to the recorded reply
    assert [[n, type(v).__name__] for n, v in replayed] == [[n, type(v).__name__] for n, v in live]
    assert all(v == Answer(x=7) for _, v in replayed[:5]) and replayed[5][1] == '{"x": 7}'
    steps = steps_of(journal.read("helpers")).values()
    assert [s.name for s in steps] == [
        "openai.chat.completions.parse", "openai.responses.parse", "anthropic.messages.parse",
        "openai.chat.completions.stream", "openai.responses.stream", "anthropic.messages.stream"]
    assert {s.type for s in steps} == {"llm"}


def test_async_parse_and_stream_helpers_are_journaled(model, journal):
    model.script = lambda api, body: say('{"x": 3}')
    oc, ac = _clients(model, is_async=True)
    crash = [True]

    async def agent(task: str) -> list:
        p = await oc.chat.completions.parse(model="m", messages=MSGS, response_format=Answer)
        r = await oc.responses.parse(model="m", input=task, text_format=Answer)
        a = await ac.messages.parse(model="m", max_tokens=10, messages=MSGS, output_format=Answer)
        async with oc.chat.completions.stream(model="m", messages=MSGS, response_format=Answer) as s:
            f = await s.get_final_completion()
        async with ac.messages.stream(model="m", max_tokens=10, messages=MSGS) as s:
            m = await s.get_final_message()
        if crash[0]:
            crash[0] = False
            raise KeyboardInterrupt
        return [p.choices[0].message.parsed.x, r.output_parsed.x, a.parsed_output.x,
                f.choices[0].message.parsed.x, m.content[0].text]

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(eg.run_async(agent, "hi", run_id="async-helpers", journal=journal))
    assert model.calls == 5
    res = asyncio.run(eg.run_async(agent, "hi", run_id="async-helpers", journal=journal))
    assert res.status == "ok", res.error
    assert res.output == [3, 3, 3, 3, '{"x": 3}'] and model.calls == 5 and res.replayed == 5


def test_a_parse_error_is_raised_again_from_the_recorded_reply(model, journal):
    # The reply is journaled before the SDK parses it: content that does not fit the
    # response_format fails the same way on resume, without asking the model again.
    model.script = lambda api, body: say('{"x": "not a number"}')
    oc, _ = _clients(model)
    crash = [True]

    def agent(task: str) -> str:
        try:
            oc.chat.completions.parse(model="m", messages=MSGS, response_format=Answer)
            got = "parsed"
        except pydantic.ValidationError as e:
            got = f"ValidationError: {e.errors()[0]['loc']}"
        if crash[0]:
            crash[0] = False
            raise KeyboardInterrupt
        return got

    with pytest.raises(KeyboardInterrupt):
        eg.run(agent, "hi", run_id="parse-error", journal=journal)
    res = eg.run(agent, "hi", run_id="parse-error", journal=journal)
    assert res.output == "ValidationError: ('x',)" and model.calls == 1


def test_the_probe_scenario_raw_response_then_parse_is_refused_then_journaled(model, journal):
    """/tmp/probe_agent/p11: with_raw_response and parse inside a run were sent again on every resume."""
    model.script = lambda api, body: say('{"x": 1}')
    oc, _ = _clients(model)

    def agent(task: str) -> str:
        return oc.chat.completions.with_raw_response.create(model="m", messages=MSGS).parse() \
            .choices[0].message.content

    res = eg.run(agent, "t", run_id="raw", journal=journal)
    assert res.status == "failed" and res.error_type == "NotJournaledError" and model.calls == 0
    assert "openai.chat.completions.with_raw_response.create is not journaled" in res.message
    assert "call openai.chat.completions.create(...) instead" in res.message


# -- bug 6: everything else that reaches the API is refused inside a run ------------------------


def test_unjournaled_attributes_are_refused_inside_a_run_and_pass_through_outside(model, journal):
    model.script = lambda api, body: say("outside")
    oc, ac = _clients(model)
    raw_create = oc.chat.completions.with_raw_response.create  # taken outside the run, called inside
    refused: dict[str, eg.EngrainError] = {}

    def attempt(label: str, call) -> None:
        try:
            call()
        except eg.EngrainError as e:  # NotJournaledError (engrain._agent.wrap), one of engrain's errors
            refused[label] = e

    @eg.tool
    def count_models() -> int:
        """Inside a step its result is journaled: the wrapper passes through."""
        return len(oc.chat.completions.with_raw_response.create(model="m", messages=MSGS).parse().choices)

    def agent(task: str) -> int:
        attempt("raw", lambda: raw_create(model="m", messages=MSGS))
        attempt("streaming", lambda: oc.chat.completions.with_streaming_response.create(model="m", messages=MSGS))
        attempt("raw parse", lambda: oc.chat.completions.with_raw_response.parse(model="m", messages=MSGS))
        attempt("models", lambda: oc.models.list())
        attempt("http", lambda: oc.post("/chat/completions", cast_to=object, body={}))
        attempt("beta", lambda: ac.beta.messages.create(model="m", max_tokens=5, messages=MSGS))
        attempt("raw messages", lambda: ac.messages.with_raw_response.create(model="m", max_tokens=5, messages=MSGS))
        return count_models()

    res = eg.run(agent, "t", run_id="refused", journal=journal)
    assert res.status == "ok", res.error
    assert sorted(refused) == sorted(["raw", "streaming", "raw parse", "models", "http", "beta", "raw messages"])
    assert model.calls == 1 and res.output == 1  # only the step's own call was sent
    assert {type(e).__name__ for e in refused.values()} == {"NotJournaledError"}
    assert refused["raw"].attribute == "openai.chat.completions.with_raw_response.create"
    assert "call openai.chat.completions.create(...) instead" in str(refused["raw"])
    assert "call openai.chat.completions.parse(...) instead" in str(refused["raw parse"])
    assert "call anthropic.messages.create(...) instead" in str(refused["raw messages"])
    assert refused["models"].attribute == "openai.models.list" and "@eg.tool" in str(refused["models"])
    assert refused["beta"].attribute == "anthropic.beta.messages.create"
    # outside a run every attribute passes through, unjournaled
    assert raw_create(model="m", messages=MSGS).parse().choices[0].message.content == "outside"
    with oc.chat.completions.with_streaming_response.create(model="m", messages=MSGS) as r:
        assert json.loads(r.read())["choices"][0]["message"]["content"] == "outside"
    assert model.calls == 3


def test_async_raw_response_is_refused_inside_a_run(model, journal):
    oc, _ = _clients(model, is_async=True)

    async def agent(task: str) -> str:
        await oc.chat.completions.with_raw_response.create(model="m", messages=MSGS)
        return "sent"

    res = asyncio.run(eg.run_async(agent, "t", run_id="async-raw", journal=journal))
    assert res.status == "failed" and res.error_type == "NotJournaledError" and model.calls == 0


# -- bug 10: malformed replies fail with the SDK's APIError naming the field --------------------


def _chunk(delta) -> dict:
    return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


CHAT_BODIES = {
    "no choices": ({"id": "x", "object": "chat.completion", "created": 0, "model": "m"}, "choices is missing"),
    "empty choices": ({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []},
                      "choices is an empty list"),
    "message null": ({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                      "choices": [{"index": 0, "message": None, "finish_reason": "stop"}]},
                     "choices[0].message is missing"),
    "body is a list": ([1, 2], "the body is a list, not an object"),
    "tool_calls a dict": ({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
        {"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "tool_calls": {"a": 1}}}]},
        "choices[0].message.tool_calls is an object, not a list"),
    "tool call a string": ({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
        {"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "tool_calls": ["oops"]}}]},
        "choices[0].message.tool_calls[0] is a string, not an object"),
    "numeric content": ({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": 5}}]},
        "choices[0].message.content is a number, not a string"),
    "nameless tool call": ({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
        {"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"arguments": "{}"}}]}}]},
        "choices[0].message.tool_calls[0].function.name is missing"),
}
CHAT_CHUNKS = {
    "tool_calls a dict": ([_chunk({"tool_calls": {"a": 1}})], "choices[0].delta.tool_calls is an object, not a list"),
    "tool call a string": ([_chunk({"tool_calls": ["oops"]})], "choices[0].delta.tool_calls[0] is a string"),
    "function a string": ([_chunk({"tool_calls": [{"index": 0, "id": "c1", "function": "lookup"}]})],
                          "choices[0].delta.tool_calls[0].function is a string, not an object"),
    "numeric content": ([_chunk({"content": 5})], "choices[0].delta.content is a number, not a string"),
    "delta a string": ([_chunk("hello")], "choices[0].delta is a string, not an object"),
    "choices an object": ([{"id": "c", "choices": {"0": {}}}], "choices is an object, not a list"),
}


def _lookup_agent(model: ScriptedModel, provider: str, journal, ran: list, stream: bool) -> eg.Agent:
    def lookup(order_id: int) -> str:
        """Look an order up."""
        ran.append(order_id)
        return "found"

    if not model.script:  # the malformed tests replace the body the reply would be sent as
        model.script = lambda api, body: say("unused")
    url = model.openai_url if provider == "openai" else model.url
    return eg.Agent("m", f"{provider}:scripted", "", [lookup], base_url=url, api_key="k", journal=journal,
                    stream=stream, max_turns=2)


def _assert_api_error(res, what: str, field: str) -> None:
    # the SDK's own APIError (as for an error event in a stream), not a TypeError from the parsing
    assert res.status == "failed" and res.error_type == "APIError", (res.error_type, res.message)
    assert res.message.startswith(f"the model server sent a malformed {what}: "), res.message
    assert field in res.message


@pytest.mark.parametrize("case", sorted(CHAT_BODIES))
def test_a_malformed_chat_completions_reply_fails_with_the_sdks_api_error(case, model, journal, monkeypatch):
    body, field = CHAT_BODIES[case]
    monkeypatch.setattr(scripted._Chat, "whole", lambda self: body)
    ran: list = []
    res = _lookup_agent(model, "openai", journal, ran, stream=False).run("go")
    _assert_api_error(res, "Chat Completions reply", field)
    assert ran == [] and model.calls == 1


# (a list body is refused while it is read, as before: "JSON that is not an object")
@pytest.mark.parametrize("case", sorted(set(CHAT_BODIES) - {"body is a list"}))
def test_a_malformed_whole_reply_to_a_streamed_request_fails_the_same_way(case, journal, monkeypatch):
    body, field = CHAT_BODIES[case]
    monkeypatch.setattr(scripted._Chat, "whole", lambda self: body)
    with ScriptedModel(lambda api, b: say("unused"), ignore_stream=True) as m:
        res = _lookup_agent(m, "openai", journal, [], stream=True).run("go")
    _assert_api_error(res, "Chat Completions reply", field)


@pytest.mark.parametrize("case", sorted(CHAT_CHUNKS))
def test_a_malformed_stream_chunk_fails_with_the_sdks_api_error(case, model, journal, monkeypatch):
    chunks, field = CHAT_CHUNKS[case]
    monkeypatch.setattr(scripted._Chat, "events",
                        # sent as text: the server's own look at each event would trip over these
                        lambda self, include_usage: iter([*((None, json.dumps(c)) for c in chunks), (None, "[DONE]")]))
    ran: list = []
    res = _lookup_agent(model, "openai", journal, ran, stream=True).run("go")
    _assert_api_error(res, "Chat Completions stream chunk", field)
    assert ran == [] and model.calls == 1


def _message(content) -> dict:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": content,
            "stop_reason": "end_turn", "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}


MESSAGES_BODIES = {
    "no content": ({k: v for k, v in _message([]).items() if k != "content"}, "content is missing"),
    "content an object": (_message({"type": "text"}), "content is an object, not a list of blocks"),
    "block a string": (_message(["hi"]), "content[0] is a string, not an object"),
    "numeric text": (_message([{"type": "text", "text": 5}]), "content[0].text is a number, not a string"),
    "input a string": (_message([{"type": "tool_use", "id": "t1", "name": "lookup", "input": "{}"}]),
                       "content[0].input is a string, not an object"),
    "nameless tool use": (_message([{"type": "tool_use", "id": "t1", "input": {}}]), "content[0].name is missing"),
    "body is a list": ([1, 2], "the body is a list, not an object"),
}
MESSAGES_EVENTS = {
    "message a string": ([("message_start", {"type": "message_start", "message": "hi"})],
                         "message of the message_start event is a string"),
    "content_block a string": (
        [("content_block_start", {"type": "content_block_start", "index": 0, "content_block": "text"})],
        "content_block of a content_block_start event is a string"),
    "delta a string": ([("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": "hi"})],
                       "delta of a content_block_delta event is a string"),
    "numeric text": ([("content_block_delta", {"type": "content_block_delta", "index": 0,
                                               "delta": {"type": "text_delta", "text": 5}})],
                     "delta.text of a text_delta is a number"),
    "index a string": ([("content_block_start", {"type": "content_block_start", "index": "0", "content_block": {
        "type": "tool_use", "id": "t1", "name": "lookup", "input": {}}})],
        "index of a content_block_start event is a string, not an integer"),
}


@pytest.mark.parametrize("case", sorted(MESSAGES_BODIES))
def test_a_malformed_messages_reply_fails_with_the_sdks_api_error(case, model, journal, monkeypatch):
    body, field = MESSAGES_BODIES[case]
    monkeypatch.setattr(scripted._Messages, "whole", lambda self: body)
    ran: list = []
    res = _lookup_agent(model, "anthropic", journal, ran, stream=False).run("go")
    _assert_api_error(res, "Messages reply", field)
    assert ran == [] and model.calls == 1


@pytest.mark.parametrize("case", sorted(MESSAGES_EVENTS))
def test_a_malformed_messages_stream_event_fails_with_the_sdks_api_error(case, model, journal, monkeypatch):
    events, field = MESSAGES_EVENTS[case]
    monkeypatch.setattr(scripted._Messages, "events",  # sent as text, as above
                        lambda self, include_usage: iter([(name, json.dumps(e)) for name, e in events]))
    ran: list = []
    res = _lookup_agent(model, "anthropic", journal, ran, stream=True).run("go")
    _assert_api_error(res, "Messages stream event", field)
    assert ran == [] and model.calls == 1


def test_the_api_error_names_the_request_it_is_about(model, monkeypatch):
    import openai

    from engrain._agent.providers import make_provider

    monkeypatch.setattr(scripted._Chat, "whole", lambda self: CHAT_BODIES["message null"][0])
    model.script = [say("unused")]
    provider = make_provider("openai:scripted", base_url=model.openai_url, api_key="k")
    with pytest.raises(openai.APIError, match=r"choices\[0\]\.message is missing") as err:
        provider.complete("sys", [{"role": "user", "content": "hi", "ts": None}], [])
    assert err.value.request.method == "POST" and str(err.value.request.url).endswith("/v1/chat/completions")
    assert err.value.body["choices"][0]["message"] is None


# -- bug 11: streamed tool calls without index ---------------------------------------------------


def test_streamed_tool_calls_without_index_are_told_apart_by_their_ids(model, journal, monkeypatch):
    real = scripted._Chat.events

    def without_index(self, include_usage):  # as Ollama streams them
        for name, data in real(self, include_usage):
            if isinstance(data, dict):
                for choice in data.get("choices") or []:
                    for tc in choice["delta"].get("tool_calls") or []:
                        tc.pop("index", None)
            yield name, data

    monkeypatch.setattr(scripted._Chat, "events", without_index)
    model.script = [tool_calls(("lookup", {"order_id": 1}), ("lookup", {"order_id": 2})), say("Both found.")]
    ran: list = []
    events: list[dict] = []
    res = _lookup_agent(model, "openai", journal, ran, stream=True).run("go", on_event=events.append)
    assert res.status == "ok", res.error
    assert res.output == "Both found." and sorted(ran) == [1, 2]
    assert [(e["name"], json.loads(e["arguments"])) for e in events if e["type"] == "tool_call"] == [
        ("lookup", {"order_id": 1}), ("lookup", {"order_id": 2})]
