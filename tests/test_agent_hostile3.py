"""Hostile inputs to the agent engine: tool arguments the journal cannot hold, SDK errors replayed by
``eg.wrap`` on resume, and tool schemas of Enum, dataclass, pydantic and tuple parameters."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import http.server
import json
import threading
from typing import Literal, Optional

import pydantic
import pytest

import engrain as eg
from engrain._agent.toolspec import from_function
from engrain.testing import FunctionModel, Reply


def _one_call(raw: str, seen: list[str]):
    def respond(messages, info):
        if messages[-1]["role"] == "tool":
            seen.append(messages[-1]["content"])
            return "done"
        return Reply(calls=[("charge", raw)])

    return FunctionModel(respond)


@pytest.mark.parametrize("raw", [
    '{"x": ' + "[" * 99 + "]" * 99 + "}",  # parsed, but one level too deep for the step's journal data
    '{"x": ' + "[" * 3000 + "]" * 3000 + "}",  # too deep for json.loads itself (RecursionError)
    '{"x": [NaN]}',  # json.loads takes NaN; the journal does not
    '{"x": ["\\ud800"]}',  # a lone surrogate: the tool ran, then its step could not be journaled
], ids=["deep", "deeper-than-the-parser", "nan", "lone-surrogate"])
def test_arguments_the_journal_cannot_hold_are_a_tool_error_and_the_tool_never_runs(tmp_path, raw):
    j = eg.open(f"sqlite:///{tmp_path / 'e.db'}")
    effects: list = []

    def charge(x: list) -> str:
        """Charge the card."""
        effects.append(x)
        return "charged"

    seen: list[str] = []
    res = eg.Agent("hostile", _one_call(raw, seen), tools=[charge], journal=j).run("go", run_id="r")
    assert res.status == "ok", res.error  # the model was told, the run went on
    assert effects == []  # never run: a run whose step is not journaled runs again on resume
    assert len(seen) == 1 and seen[0].startswith("error: bad arguments for tool 'charge'"), seen
    assert "charge" not in [e.name for e in j.read("r")]
    j.close()


class _ErrorServer(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = json.dumps({"type": "error", "error": {"message": "slow down", "type": "rate_limit_error",
                                                      "code": "rate_limited"}}).encode()
        self.send_response(429)
        self.send_header("content-type", "application/json")
        self.send_header("x-request-id", "req_1")
        self.send_header("request-id", "req_1")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def error_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ErrorServer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("sdk", ["openai", "anthropic", "async-openai"])
def test_a_wrapped_sdk_error_is_raised_again_as_the_sdk_built_it_on_resume(tmp_path, error_server, sdk):
    import anthropic
    import openai

    j = eg.open(f"sqlite:///{tmp_path / 'e.db'}")
    if sdk == "anthropic":
        client = eg.wrap(anthropic.Anthropic(base_url=error_server, api_key="k", max_retries=0))
        call = lambda: client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])  # noqa: E731
        base = anthropic.RateLimitError
    elif sdk == "openai":
        client = eg.wrap(openai.OpenAI(base_url=error_server + "/v1", api_key="k", max_retries=0))
        call = lambda: client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])  # noqa: E731
        base = openai.RateLimitError
    else:
        client = eg.wrap(openai.AsyncOpenAI(base_url=error_server + "/v1", api_key="k", max_retries=0))
        call = lambda: asyncio.run(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]))  # noqa: E731
        base = openai.RateLimitError
    crash = [True]

    def agent(task: str) -> list:
        try:
            call()
        except base as e:  # what code handling a rate limit reads
            seen = [type(e).__name__, e.status_code, e.body, e.request_id, e.response.status_code]
        if crash[0]:
            crash[0] = False
            raise KeyboardInterrupt  # the process dies: the failed step is replayed on resume
        return seen

    with pytest.raises(KeyboardInterrupt):
        eg.run(agent, "hi", run_id="w", journal=j)
    res = eg.run(agent, "hi", run_id="w", journal=j)
    assert res.status == "ok", res.error
    assert res.output == ["RateLimitError", 429, {"message": "slow down", "type": "rate_limit_error",
                                                  "code": "rate_limited"} if sdk != "anthropic" else
                          {"type": "error", "error": {"message": "slow down", "type": "rate_limit_error",
                                                     "code": "rate_limited"}}, "req_1", 429]
    assert res.replayed == 1 and res.executed == 0
    j.close()


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Point:
    x: int
    y: int = 0


class Order(pydantic.BaseModel):
    qty: int
    color: Color = Color.BLUE


def test_enum_dataclass_and_pydantic_parameters_are_described_and_built_for_the_tool(tmp_path):
    got: list = []

    def paint(color: Color, at: Point, order: Optional[Order] = None, only: Literal[Color.RED] = Color.RED,
              points: list[Point] = []) -> str:  # noqa: B006
        """Paint."""
        got.append((color, at, order, only, points))
        return "painted"

    props = from_function(paint).parameters["properties"]
    assert props["color"]["enum"] == ["red", "blue"]  # was {}: any value, and the tool got a str
    assert props["at"]["required"] == ["x"] and props["only"] == {"enum": ["red"], "default": "red"}
    json.dumps(from_function(paint).spec(), allow_nan=False)  # Literal[Color.RED] was an Enum object in the schema

    def respond(messages, info):
        if messages[-1]["role"] == "tool":
            return "done: " + messages[-1]["content"]
        return Reply(calls=[("paint", {"color": "red", "at": {"x": 1}, "order": {"qty": 2, "color": "red"},
                                       "only": "red", "points": [{"x": 3, "y": 4}]})])

    j = eg.open(f"sqlite:///{tmp_path / 'e.db'}")
    res = eg.Agent("painter", FunctionModel(respond), tools=[paint], journal=j).run("paint")
    assert res.output == "done: painted"
    assert got == [(Color.RED, Point(1), Order(qty=2, color=Color.RED), Color.RED, [Point(3, 4)])]
    j.close()


def test_tuple_and_nan_default_schemas():
    def f(pair: tuple[int, str], ratio: float = float("nan")) -> str:
        """F."""
        return ""

    t = from_function(f)
    assert t.parameters["properties"]["pair"]["prefixItems"] == [{"type": "integer"}, {"type": "string"}]
    json.dumps(t.spec(), allow_nan=False)  # a NaN default was written into the schema sent to the provider
    with pytest.raises(ValueError):
        t.check('{"pair": [1, 2]}')
    assert t.check('{"pair": [1, "a"]}') == {"pair": [1, "a"]}


@pytest.mark.parametrize("op", ["add", "pop"])
def test_a_session_change_cut_off_before_its_step_was_journaled_is_not_made_twice(tmp_path, monkeypatch, op):
    pytest.importorskip("agents")
    from engrain._durable import log as logmod
    from engrain.integrations.openai_agents import EngrainSession

    j = eg.open(f"sqlite:///{tmp_path / 'e.db'}")
    session = EngrainSession("s", journal=j)
    asyncio.run(session.add_items([{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]))
    write = logmod.EntryLog._write

    def killed_after_the_session_append(self, decide, optimistic):
        out = write(self, decide, optimistic)
        if out:  # the session's entry is stored; the process dies before the run journals the step
            monkeypatch.setattr(logmod.EntryLog, "_write", write)
            raise KeyboardInterrupt
        return out

    def chat(task: str):
        if op == "add":
            asyncio.run(session.add_items([{"role": "user", "content": task}]))
            return None
        return asyncio.run(session.pop_item())

    monkeypatch.setattr(logmod.EntryLog, "_write", killed_after_the_session_append)
    with pytest.raises(KeyboardInterrupt):
        eg.run(chat, "three", run_id="c", journal=j)
    res = eg.run(chat, "three", run_id="c", journal=j)
    items = [i["content"] for i in asyncio.run(EngrainSession("s", journal=j).get_items())]
    if op == "add":
        assert items == ["one", "two", "three"]  # was added twice
    else:
        assert res.output == {"role": "user", "content": "two"} and items == ["one"]  # a second item was popped
    j.close()
