"""The agent engine against a scripted model (a local stub server, not an LLM) through the real SDKs.

The scripted model (``engrain._agent.scripted``) speaks the OpenAI Chat
Completions and Anthropic Messages wire formats, with tool calls and SSE
streaming, and counts the requests it receives: that count is how these tests
prove "0 LLM calls on a cache hit" and "exactly N calls across a crash".
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Literal

import pytest

import engrain as eg
from engrain._agent import sessions
from engrain._agent.loop import TurnLimitError
from engrain._agent.scripted import Reply, ScriptedModel, say, tool_call, tool_calls
from engrain._durable.context import steps_of

CHILD = Path(__file__).with_name("agent_child.py")
PROVIDERS = ["openai", "anthropic"]


@pytest.fixture
def model():
    m = ScriptedModel().start()
    yield m
    m.stop()


def _agent(model: ScriptedModel, provider: str, journal, tools=(), **kw) -> eg.Agent:
    url = model.openai_url if provider == "openai" else model.url
    return eg.Agent("helper", f"{provider}:scripted", "Help with orders.", list(tools), base_url=url,
                    journal=journal, **kw)


def _tool_messages(provider: str, body: dict) -> list[tuple[str, bool]]:
    """(content, is_error) of the tool results in a request the scripted model received."""
    if provider == "openai":
        return [(m["content"], m["content"].startswith("error:")) for m in body["messages"] if m["role"] == "tool"]
    out = []
    for m in body["messages"]:
        if m["role"] == "user" and isinstance(m["content"], list):
            out += [(b["content"], bool(b.get("is_error"))) for b in m["content"] if b["type"] == "tool_result"]
    return out


def _system(provider: str, body: dict) -> str:
    return body["messages"][0]["content"] if provider == "openai" else body["system"]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_loop_runs_tools_in_parallel_and_feeds_errors_back(model, journal, provider):
    barrier = threading.Barrier(2, timeout=10)  # both tools must be inside their call at once
    done: list[str] = []

    def lookup_order(order_id: int) -> dict:
        """Look up an order by id."""
        barrier.wait()
        done.append(f"lookup {order_id}")
        return {"order": order_id, "status": "paid"}

    def lookup_customer(name: str) -> str:
        """Find a customer."""
        barrier.wait()
        done.append(f"customer {name}")
        return f"customer {name} is gold"

    def refund(order_id: int, reason: str = "") -> str:
        """Refund an order."""
        done.append(f"refund {order_id}")
        return f"refunded {order_id}"

    model.script = [
        tool_calls(("lookup_order", {"order_id": 42}), ("lookup_customer", {"name": "Ann"})),
        tool_calls(("no_such_tool", {}), ("refund", {"order_id": "forty-two"})),
        tool_call("refund", order_id=42, reason="damaged"),
        say("Refunded order 42."),
    ]
    events: list[dict] = []
    agent = _agent(model, provider, journal, [lookup_order, lookup_customer, refund])
    res = agent.run("refund order 42", on_event=events.append)
    assert res and res.output == "Refunded order 42."
    assert model.calls == 4
    assert sorted(done[:2]) == ["customer Ann", "lookup 42"] and done[2:] == ["refund 42"]
    # the second request carries both parallel results, in the model's order
    assert [c for c, _ in _tool_messages(provider, model.requests[1][1])] == [
        '{"order": 42, "status": "paid"}', "customer Ann is gold"]
    errors = _tool_messages(provider, model.requests[2][1])[2:]
    assert errors[0][1] and "unknown tool 'no_such_tool'" in errors[0][0] and "lookup_order" in errors[0][0]
    assert errors[1][1] and "bad arguments for tool 'refund'" in errors[1][0] and "order_id" in errors[1][0]
    # the tools were declared with schemas from their signatures and docstrings
    body = model.requests[0][1]
    decl = body["tools"][2]["function"] if provider == "openai" else body["tools"][2]
    schema = decl["parameters"] if provider == "openai" else decl["input_schema"]
    assert decl["name"] == "refund" and decl["description"] == "Refund an order."
    assert schema["required"] == ["order_id"] and schema["properties"]["order_id"] == {"type": "integer"}
    kinds = [e["type"] for e in events]
    assert kinds.count("tool_call") == 5 and kinds.count("tool_result") == 5 and kinds[-1] == "text"
    # every LLM call and every executed tool call is a journaled step; errors never ran a tool
    steps = dict(sorted(steps_of(journal.read(res.run_id)).items()))  # by call_id: parallel tools finish in any order
    names = [(s.name, s.type) for s in steps.values()]
    assert names.count(("agent.llm", "llm")) == 4
    assert [n for n, t in names if t == "tool"] == ["lookup_order", "lookup_customer", "refund"]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_streamed_replies_parse_usage_and_a_stream_error_fails_the_step(model, journal, provider):
    model.script = [say("All good here."), Reply(text="Half an answer", stream_error="the model overloaded")]
    events: list[dict] = []
    agent = _agent(model, provider, journal)
    res = agent.run("first", on_event=events.append)
    assert res and res.output == "All good here."
    assert "".join(e["delta"] for e in events if e["type"] == "text") == "All good here."
    llm = [s for s in steps_of(journal.read(res.run_id)).values() if s.name == "agent.llm"]
    usage = llm[0].result["usage"]  # read from the stream's usage chunk / message_start + message_delta
    assert usage["input"] > 0 and usage["output"] == 3
    events.clear()
    bad = agent.run("second", on_event=events.append)
    # the SDK's own error type, as its typed stream raises it; the text before the error was streamed
    assert not bad and bad.error_type == "APIError" and "the model overloaded" in bad.message
    assert "".join(e["delta"] for e in events if e["type"] == "text") == "Half an answer"
    assert model.calls == 2


def test_a_turn_flushes_once_and_every_result_is_flushed_before_use(model, tmp_path):
    # On a "full" store each flush is a disk sync. A reply that calls tools is flushed before the
    # tools run; run.started, a tool's result and the final reply are committed unflushed and
    # flushed by the next durable append (the next model step, run.completed), which always follows.
    from engrain._journal.sqlite import SQLiteJournal

    appends: list[tuple[str, str, bool]] = []
    unwaited: list[str] = []  # sent with wait=False: the next append (before any effect) reads the answer

    class Recording(SQLiteJournal):
        def append(self, run_id, events, expected_seq, *, durable=True, **kw):
            out = super().append(run_id, events, expected_seq, durable=durable, **kw)
            appends.extend((e.kind, e.name, durable) for e in events)
            unwaited.extend(e.name for e in events if not kw.get("wait", True))
            return out

        def append_one(self, run_id, kind, name, data, expected_seq, *, durable=True, **kw):
            super().append_one(run_id, kind, name, data, expected_seq, durable=durable, **kw)
            appends.append((kind, name, durable))
            if not kw.get("wait", True):
                unwaited.append(name)

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    j = Recording(tmp_path / "full.db", durability="full")
    model.script = [tool_call("add", a=1, b=2), tool_calls(("add", {"a": 3, "b": 4}), ("add", {"a": 5, "b": 6})),
                    say("Done.")]
    res = _agent(model, "openai", j, [add]).run("add", run_id="flush-1")
    assert res and res.output == "Done."
    assert appends == [
        ("run.started", "", False), ("step.completed", "engrain.now", False),
        ("step.completed", "agent.llm", True), ("step.completed", "add", False),
        ("step.completed", "agent.llm", True), ("step.completed", "add", False), ("step.completed", "add", False),
        ("step.completed", "agent.llm", False), ("run.completed", "", True)]
    # each followed by a model step's append, or the final reply by run.completed
    assert unwaited == ["engrain.now", "add", "add", "add", "agent.llm"]
    # resumed from the journal these unflushed commits replay like any others: nothing runs again
    again = eg.Agent("helper", "openai:scripted", "Help with orders.", [add], base_url=model.openai_url,
                     journal=j).run("add", run_id="flush-1")
    assert again.output == "Done." and model.calls == 3
    j.close()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_unstreamed_model_calls(model, journal, provider):
    def lookup_order(order_id: int) -> dict:
        """Look up an order by id."""
        return {"order": order_id, "status": "paid"}

    model.script = [tool_call("lookup_order", order_id=3), say("Order 3 is paid.")]
    events: list[dict] = []
    res = _agent(model, provider, journal, [lookup_order], stream=False).run("order 3?", on_event=events.append)
    assert res and res.output == "Order 3 is paid." and model.calls == 2
    assert not any(body.get("stream") for _, body in model.requests)
    assert [e["type"] for e in events] == ["tool_call", "tool_result", "text"]
    assert events[1]["content"] == '{"order": 3, "status": "paid"}'
    llm = [s for s in steps_of(journal.read(res.run_id)).values() if s.name == "agent.llm"]
    assert llm[0].result["tool_calls"][0]["name"] == "lookup_order" and llm[1].result["usage"]["output"] > 0


def test_tool_exception_is_fed_back_and_replayed(model, journal):
    calls = []

    def flaky(x: int) -> int:
        """Fails."""
        calls.append(x)
        raise ValueError("the warehouse is closed")

    model.script = [tool_call("flaky", x=1), say("Could not do it.")]
    res = _agent(model, "openai", journal, [flaky]).run("try it", run_id="r-flaky")
    assert res.output == "Could not do it."
    assert _tool_messages("openai", model.requests[1][1]) == [("error: ValueError: the warehouse is closed", True)]
    assert calls == [1]


def test_max_turns_fails_the_run(model, journal):
    model.script = [tool_call("ping") for _ in range(3)]

    def ping() -> str:
        """Ping."""
        return "pong"

    res = _agent(model, "openai", journal, [ping], max_turns=3).run("loop forever")
    assert res.status == "failed" and "TurnLimitError" in res.error and "max_turns=3" in res.error
    assert model.calls == 3
    assert issubclass(TurnLimitError, RuntimeError)


def test_bad_configuration_is_a_typed_error(model, journal):
    with pytest.raises(eg.ConfigError, match="provider"):
        eg.Agent("a", "gpt-4", "x")
    with pytest.raises(eg.ConfigError, match="unknown provider 'mistral'"):
        eg.Agent("a", "mistral:large", "x")
    with pytest.raises(eg.ConfigError, match="no tool named 'missing'"):
        eg.Agent("a", "openai:m", "x", ["missing"])
    with pytest.raises(eg.ConfigError, match="max_turns"):
        eg.Agent("a", "openai:m", "x", max_turns=0)
    with pytest.raises(eg.ConfigError, match="session id"):
        next(_agent(model, "openai", journal).chat("hi", session="../etc"))


def test_model_strings_pick_the_provider(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    a = eg.Agent("o", "ollama:llama3.1:70b", "x")
    assert a.provider.model == "llama3.1:70b" and str(a.provider.client.base_url).startswith("http://localhost:11434/v1")
    b = eg.Agent("v", "openai:qwen", "x", base_url="http://127.0.0.1:9/v1")
    assert b.provider.name == "openai" and str(b.provider.client.base_url) == "http://127.0.0.1:9/v1/"
    c = eg.Agent("c", "anthropic:claude-x", "x", api_key="k")
    assert c.provider.name == "anthropic" and c.provider.model == "claude-x"


def test_wasm_tools_from_load_dir(model, journal, tmp_path):
    folder = tmp_path / "tools"
    root = Path(__file__).parents[1]
    subprocess.run(["bash", str(root / "scripts/build_wasm_tools.sh"), str(folder)], check=True, capture_output=True)
    (folder / "hostile.wasm").unlink()
    reg = eg.ToolRegistry()
    names = reg.load_dir(folder)
    model.script = [tool_call("wordcount", args={"text": "one two three"}), say("Three words.")]
    res = _agent(model, "openai", journal, names, registry=reg).run("count the words")
    assert res.output == "Three words."
    assert json.loads(_tool_messages("openai", model.requests[1][1])[0][0]) == {"bytes": 13, "words": 3}


# -- crashes -------------------------------------------------------------------


class Child:
    def __init__(self, url: str, model: ScriptedModel, effects: Path, *args: str):
        self.proc = subprocess.Popen([sys.executable, str(CHILD), url, model.openai_url, str(effects), *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def until(self, pred, timeout: float = 30) -> list[dict]:
        """Read event lines until ``pred(event)``; return them."""
        seen = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"child ended early: {self.proc.stderr.read().decode()[-2000:]}")
            seen.append(json.loads(line))
            if pred(seen[-1]):
                return seen
        raise AssertionError("timed out waiting for the child")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def finish(self) -> list[dict]:
        out, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err.decode()[-2000:]
        return [json.loads(x) for x in out.decode().splitlines()]


def test_sigkill_after_a_tool_call_then_resume(store_url, tmp_path):
    effects = tmp_path / "effects.log"
    effects.touch()
    blocked, release = threading.Event(), threading.Event()
    replies = [tool_call("lookup", order_id=7), tool_call("charge", order_id=7, amount=12.5), say("Charged 12.5.")]

    def respond(api, body):
        n = model.calls  # this request is already counted
        if n == 3 and not release.is_set():  # the killed process's third call: hang until it dies
            blocked.set()
            release.wait(30)
        return replies[min(n, 3) - 1]  # the resumed call (4th) gets the reply the killed one never read

    model = ScriptedModel(respond).start()
    try:
        child = Child(store_url, model, effects, "run", "charge order 7", "r-kill")
        assert blocked.wait(30)
        child.kill()
        release.set()
        assert effects.read_text().split() == ["lookup", "7", "r-kill:2", "charge", "7", "r-kill:4"]
        res = Child(store_url, model, effects, "run", "charge order 7", "r-kill").finish()[-1]
        assert res["status"] == "ok" and res["output"] == "Charged 12.5."
        # 3 model calls before the kill (the last one cut short), 1 after: the two finished ones were replayed
        assert model.calls == 4
        # each tool ran exactly once, with its idempotency key
        assert effects.read_text().count("charge") == 1 and effects.read_text().count("lookup") == 1
    finally:
        release.set()
        model.stop()
    j = eg.open(store_url)
    steps = steps_of(j.read("r-kill"))
    assert [s.name for s in steps.values()] == ["engrain.now", "agent.llm", "lookup", "agent.llm", "charge", "agent.llm"]
    # Steps journal only their completion (DESIGN: one commit per step), so the model call the
    # kill cut short left no record: it ran again as attempt 1, and its cost shows in model.calls.
    assert [s.attempts for s in steps.values()] == [1, 1, 1, 1, 1, 1]
    j.close()


def test_sigkill_during_a_streamed_reply_then_resume_the_session(store_url, tmp_path):
    effects = tmp_path / "effects.log"
    effects.touch()
    long = "This reply streams slowly, word by word, so the test can kill it in the middle of the stream."
    model = ScriptedModel([tool_call("lookup", order_id=9), say(long), say(long), say("Yes, order 9.")],
                          chunk_delay=0.1).start()  # ~1.8 s of stream left to kill it in
    try:
        child = Child(store_url, model, effects, "chat", "What is in order 9?", "s-kill")
        seen = child.until(lambda e: e["type"] == "text")
        assert seen[-1]["delta"] == "This "
        child.kill()
        assert model.calls == 2
        time.sleep(1.1)  # a gap the model can see: the resumed call's current time is past the message's
        events = Child(store_url, model, effects, "chat", "What is in order 9?", "s-kill").finish()
        assert model.calls == 3  # the cut stream was asked again; the first reply was replayed
        said = model.requests[0][1]["messages"][1]["content"]  # "[<time it was sent>Z] What is in order 9?"
        resumed = model.requests[2][1]["messages"]
        assert resumed[1]["content"] == said  # its original time, replayed from the journal after the kill
        assert resumed[0]["content"].split("Current time: ")[1][:20] > said[1:21]
        assert "".join(e["delta"] for e in events if e["type"] == "text") == long
        assert events[-1]["status"] == "ok" and events[-1]["turn"] == 0
        assert effects.read_text().count("lookup") == 1
        # the session goes on after the crash, in a third process
        events = Child(store_url, model, effects, "chat", "Is it order 9?", "s-kill").finish()
        assert events[-1]["text"] == "Yes, order 9." and events[-1]["turn"] == 1
        assert model.calls == 4
        body = model.requests[-1][1]
        assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool", "assistant", "user"]
    finally:
        model.stop()


# -- sessions and time ---------------------------------------------------------


def test_sessions_survive_a_restart_with_original_timestamps(model, journal):
    model.script = [say("Noted: the code is 42."), say("The code is 42.")]
    a = _agent(model, "anthropic", journal)
    events = list(a.chat("Remember that the secret code is 42.", session="s1"))
    assert [e["type"] for e in events] == ["text"] * 5 + ["done"] and events[-1]["status"] == "ok"
    first = a.history("s1")
    assert [m["role"] for m in first] == ["user", "assistant"]
    sessions._finished.clear()  # what a new process starts with
    b = _agent(model, "anthropic", journal)
    assert b.history("s1") == first
    time.sleep(1.1)
    events = list(b.chat("What is the code?", session="s1"))
    assert events[-1]["text"] == "The code is 42."
    hist = b.history("s1")
    assert hist[:2] == first and len(hist) == 4
    assert hist[2]["ts"] > first[1]["ts"]
    # the model sees each earlier message with its original time, and the current time
    body = model.requests[1][1]
    ts0 = first[0]["ts"]
    assert body["messages"][0]["content"][0]["text"] == f"[{ts0[:19]}Z] Remember that the secret code is 42."
    assert body["messages"][1]["content"][0]["text"].startswith(f"[{first[1]['ts'][:19]}Z] ")
    assert "Current time: " in body["system"]
    now = body["system"].split("Current time: ")[1][:20]
    assert now > ts0[:19]
    # other sessions are separate
    model.script.append(say("Hello."))
    list(b.chat("hi", session="s2"))
    assert len(model.requests[2][1]["messages"]) == 1


# -- wrapped clients -----------------------------------------------------------


def _wrap_script() -> list[Reply]:
    return [say("chat answer"), say("chat streamed answer"), say("responses answer"),
            say("responses streamed"), Reply(text="anthropic answer"), say("anthropic streamed")]


def test_wrap_sync_clients_journal_and_replay(model, journal):
    import anthropic
    import openai

    model.script = _wrap_script()
    oc = eg.wrap(openai.OpenAI(base_url=model.openai_url, api_key="scripted"))
    ac = eg.wrap(anthropic.Anthropic(base_url=model.url, api_key="scripted"))
    crash = [True]

    def agent(task: str) -> list[str]:
        out = [oc.chat.completions.create(model="m", messages=[{"role": "user", "content": task}])
               .choices[0].message.content]
        stream = oc.chat.completions.create(model="m", messages=[{"role": "user", "content": task}], stream=True)
        head = [next(stream), next(stream)]  # the SDK's streams are iterators too
        out.append("".join(c.choices[0].delta.content or "" for c in [*head, *stream] if c.choices))
        out.append(oc.responses.create(model="m", input=task).output_text)
        with oc.responses.create(model="m", input=task, stream=True) as s:
            out.append("".join(e.delta for e in s if e.type == "response.output_text.delta"))
        out.append(ac.messages.create(model="m", max_tokens=50, messages=[{"role": "user", "content": task}])
                   .content[0].text)
        s = ac.messages.create(model="m", max_tokens=50, messages=[{"role": "user", "content": task}], stream=True)
        out.append("".join(e.delta.text for e in s if e.type == "content_block_delta"))
        if crash[0]:
            crash[0] = False
            raise KeyboardInterrupt  # the process dies here: the run stays resumable
        return out

    with pytest.raises(KeyboardInterrupt):
        eg.run(agent, "hello", run_id="w1", journal=journal)
    assert model.calls == 6
    res = eg.run(agent, "hello", run_id="w1", journal=journal)
    assert res.output == ["chat answer", "chat streamed answer", "responses answer", "responses streamed",
                          "anthropic answer", "anthropic streamed"]
    assert model.calls == 6 and res.replayed == 6 and res.executed == 0
    names = [s.name for s in steps_of(journal.read("w1")).values()]
    assert names == ["openai.chat.completions.create"] * 2 + ["openai.responses.create"] * 2 + \
        ["anthropic.messages.create"] * 2
    assert {s.type for s in steps_of(journal.read("w1")).values()} == {"llm"}
    # outside a run the wrapper passes through
    model.script.append(say("outside"))
    assert oc.chat.completions.create(model="m", messages=[]).choices[0].message.content == "outside"
    assert model.calls == 7 and oc.models is not None
    assert type(oc.with_options(timeout=5)).__name__ == "Wrapped"


def test_wrap_async_clients_journal_and_replay(model, journal):
    import asyncio

    import anthropic
    import openai

    model.script = _wrap_script()
    oc = eg.wrap(openai.AsyncOpenAI(base_url=model.openai_url, api_key="scripted"))
    ac = eg.wrap(anthropic.AsyncAnthropic(base_url=model.url, api_key="scripted"))
    crash = [True]

    async def agent(task: str) -> list[str]:
        msgs = [{"role": "user", "content": task}]
        out = [(await oc.chat.completions.create(model="m", messages=msgs)).choices[0].message.content]
        s = await oc.chat.completions.create(model="m", messages=msgs, stream=True)
        out.append("".join([c.choices[0].delta.content or "" async for c in s if c.choices]))
        out.append((await oc.responses.create(model="m", input=task)).output_text)
        s = await oc.responses.create(model="m", input=task, stream=True)
        out.append("".join([e.delta async for e in s if e.type == "response.output_text.delta"]))
        out.append((await ac.messages.create(model="m", max_tokens=9, messages=msgs)).content[0].text)
        s = await ac.messages.create(model="m", max_tokens=9, messages=msgs, stream=True)
        out.append("".join([e.delta.text async for e in s if e.type == "content_block_delta"]))
        if crash[0]:
            crash[0] = False
            raise KeyboardInterrupt
        return out

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(eg.run_async(agent, "hi", run_id="w2", journal=journal))
    assert model.calls == 6
    res = asyncio.run(eg.run_async(agent, "hi", run_id="w2", journal=journal))
    assert res.output[1] == "chat streamed answer" and res.output[5] == "anthropic streamed"
    assert model.calls == 6 and res.replayed == 6


def test_wrap_refuses_other_objects():
    with pytest.raises(eg.ConfigError, match="cannot wrap"):
        eg.wrap(object())


# -- cache and memory ----------------------------------------------------------


def test_cache_hit_makes_zero_llm_calls_and_a_changed_tool_result_hands_off(model, journal):
    stock = {"widget": 3}

    def check_stock(item: str) -> int:
        """Units in stock."""
        return stock[item]

    model.script = [tool_call("check_stock", item="widget"), say("3 widgets in stock.")]
    a = _agent(model, "openai", journal, [check_stock], cache=True)
    first = a.run("how many widgets?")
    assert first.output == "3 widgets in stock." and model.calls == 2
    events: list[dict] = []
    hit = a.run("how  many widgets? ", on_event=events.append)  # same task up to whitespace
    assert hit.output == "3 widgets in stock."
    assert model.calls == 2  # 0 LLM calls on the hit
    assert {"type": "cache", "hit": True} in events
    assert [s.name for s in steps_of(journal.read(hit.run_id)).values()] == [
        "engrain.now", "agent.cache.lookup", "check_stock"]
    # the world changed: the replay must not answer from the old result
    stock["widget"] = 0
    model.script.append(say("Out of stock."))
    changed = a.run("how many widgets?")
    assert changed.output == "Out of stock." and model.calls == 3
    assert "0" == _tool_messages("openai", model.requests[2][1])[0][0]
    # a different task never hits
    model.script += [say("No idea.")]
    assert a.run("how many gadgets?").output == "No idea." and model.calls == 4


def test_memory_is_recalled_into_context_and_outcomes_remembered(model, journal, embedder):
    mem = eg.Memory(journal.url, embedder=embedder)
    mem.remember("Refunds above 100 EUR need a manager's approval.", skill="support")
    mem.remember("The office cat is called Miso.", skill="pets")
    model.script = [say("Asked a manager to approve the 150 EUR refund.")]
    a = _agent(model, "openai", journal, memory="support", memory_store=mem)
    res = a.run("Refund 150 EUR to order 77")
    assert res
    system = _system("openai", model.requests[0][1])
    assert "Refunds above 100 EUR need a manager's approval." in system and "Miso" not in system
    found = mem.recall("refund 150 EUR order 77 manager", skill="support")
    assert any("Asked a manager to approve" in r.content for r in found)
    mem.close()


def test_tool_schemas_from_type_hints():
    from engrain._agent.toolspec import from_function

    def search(query: str, limit: int = 5, tags: list[str] | None = None,
               order: Literal["new", "old"] = "new", ratio: float = 0.5, exact: bool = False) -> list:
        """Search the catalogue.

        Longer explanation that the model does not need.
        """

    t = from_function(search)
    assert t.description == "Search the catalogue."
    p = t.parameters
    assert p["required"] == ["query"] and p["additionalProperties"] is False
    assert p["properties"]["limit"] == {"type": "integer", "default": 5}
    assert p["properties"]["tags"]["anyOf"] == [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]
    assert p["properties"]["order"] == {"enum": ["new", "old"], "default": "new"}
    assert t.check('{"query": "x", "order": "old"}') == {"query": "x", "order": "old"}
    for bad, why in [('{"limit": 1}', "'query' is a required property"), ("[1]", "must be a JSON object"),
                     ('{"query": "x", "order": "mid"}', "argument order"), ("{nope", "not valid JSON"),
                     ('{"query": "x", "evil": 1}', "Additional properties")]:
        with pytest.raises(ValueError, match=re.escape(why)):
            t.check(bad)


def test_the_quick_argument_check_never_accepts_what_the_schema_refuses():
    # Flat schemas are checked in plain Python first (jsonschema costs ~0.1 ms a call); it may only
    # say "valid" where jsonschema does, and every verdict of check() is jsonschema's.
    import jsonschema

    from engrain._agent.toolspec import _quick_check, from_function

    def flat(name: str, n: int, x: float = 1.0, on: bool = False, meta: dict | None = None, items: list = [],
             anything=None) -> None:
        """A flat signature."""

    def nested(order: Literal["a", "b"], ids: list[int]) -> None:
        """Not flat: an enum and typed items."""

    assert _quick_check(from_function(nested).parameters) is None
    values = [None, True, False, 0, 1, -3, 1.0, 2.5, "", "s", [], [1], {}, {"k": 1}]
    for fn in (flat, nested):
        t = from_function(fn)
        quick, full = _quick_check(t.parameters), jsonschema.Draft202012Validator(t.parameters)
        names = list(t.parameters["properties"])
        cases = [{}, {"zzz": 1}] + [{k: v for k in names} for v in values]
        cases += [{names[0]: v, names[1]: w} for v in values for w in values]
        cases += [{**c, "extra": 1} for c in cases[:20]]
        if quick is not None:  # it does take the common case
            assert any(quick(c) for c in cases) and quick({"name": "s", "n": 1})
        for args in cases:
            valid = full.is_valid(args)
            if quick is not None and quick(args):
                assert valid, (fn.__name__, args)
            try:
                t.check(json.dumps(args))
                accepted = True
            except ValueError:
                accepted = False
            assert accepted == valid, (fn.__name__, args)


def test_an_unfinished_turn_is_finished_before_the_next_message(model, journal):
    class Crash(BaseException):
        pass

    calls: list[int] = []

    def step(n: int) -> int:
        """A step."""
        calls.append(n)
        if len(calls) == 1:
            raise Crash  # not an Exception: like a kill, the turn stays unfinished
        return n

    model.script = [tool_call("step", n=1), say("Step 1 done."), say("Hello again.")]
    a = _agent(model, "openai", journal, [step])
    events = list(a.chat("do step 1", session="s"))
    assert events[-1]["type"] == "done" and events[-1]["status"] == "running"  # the turn never finished
    assert a.history("s") == []
    events = list(a.chat("hello", session="s"))
    assert events[-1]["text"] == "Hello again." and events[-1]["turn"] == 1
    assert [m["content"] for m in a.history("s") if m["role"] != "tool"] == [
        "do step 1", "", "Step 1 done.", "hello", "Hello again."]
    assert calls == [1, 1] and model.calls == 3  # the model call before the crash was replayed


@pytest.mark.slow
def test_sigkill_at_random_points_never_pays_or_runs_twice(store_url, tmp_path):
    """Kill the agent's process at a random moment, resume, and check the journal against the model and tools."""
    import random

    def respond(api, body):
        done = sum(1 for m in body["messages"] if m["role"] == "tool")  # the conversation decides, not the count
        return [tool_call("lookup", order_id=3), tool_call("charge", order_id=3, amount=12.5), say("Charged.")][done]

    model = ScriptedModel(respond, first_token_delay=0.15).start()
    rng = random.Random(7)
    cut = 0
    try:
        for i in range(3):
            effects = tmp_path / f"effects-{i}.log"
            effects.touch()
            run_id = f"rand-{i}"
            child = Child(store_url, model, effects, "run", "charge order 3", run_id)
            deadline = time.monotonic() + 30
            while not model.requests and time.monotonic() < deadline:  # the run is under way
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.5))  # the three model calls take >= 0.45 s from here
            child.kill()
            j = eg.open(store_url)
            cut += j.read(run_id)[-1].kind != "run.completed"
            j.close()
            res = Child(store_url, model, effects, "run", "charge order 3", run_id).finish()[-1]
            assert res["status"] == "ok" and res["output"] == "Charged."
            j = eg.open(store_url)
            events = j.read(run_id)
            j.close()
            assert [e.seq for e in events] == list(range(len(events)))
            steps = steps_of(events)
            assert all(s.state == "completed" for s in steps.values())
            for tool in ("lookup", "charge"):
                (step,) = [s for s in steps.values() if s.name == tool]
                ran = effects.read_text().split().count(tool)
                assert 1 <= ran <= 2  # one kill per run: at most the one call it cut short runs again
            llm = [s for s in steps.values() if s.name == "agent.llm"]
            assert len(llm) == 3
            calls = [body for _, body in model.requests]
            model.requests.clear()
            assert 3 <= len(calls) <= len(llm) + 1  # paid twice at most for the one call the kill cut short
    finally:
        model.stop()
    assert cut >= 1  # at least one kill landed mid-run


def test_demo_agent_part_uses_the_model_the_environment_names(monkeypatch, journal):
    # `engrain demo` part 5 with OPENAI_BASE_URL set runs on that server, not on its own scripted
    # model. The server here is a scripted model too (playing the demo's replies), in this process,
    # so the test can see the requests arrive.
    from engrain._demo.agent import _scripted_reply, agent_section

    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "ENGRAIN_DEMO_MODEL"):
        monkeypatch.delenv(var, raising=False)
    with ScriptedModel(_scripted_reply) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.openai_url)
        lines: list[str] = []
        assert agent_section(journal, None, lines.append), "\n".join(lines)
        out = "\n".join(lines)
        assert f"model: openai:llama3.1 via OpenAI-compatible server {server.openai_url}" in out
        assert "scripted model (a local stub" not in out and "the scripted model received" not in out
        assert {body["model"] for _, body in server.requests} == {"llama3.1"}
        # lookup + refund + answer (one cut by the crash, replayed), the cache's first run, two chat turns
        assert server.calls >= 6 and "model calls 1 before + 2 after the crash" in out
