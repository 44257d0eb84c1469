"""LLM agents over HTTP: a real ``engrain serve`` whose models are a scripted model (a local stub
server speaking the OpenAI wire format, not an LLM), reached through ``OPENAI_BASE_URL``."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

import engrain as eg
from engrain._agent.scripted import say, tool_call, tool_calls
from tests.servers import serve

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "llm-agents-token"


@pytest.fixture
def model(scripted_openai):
    return scripted_openai


@pytest.fixture(scope="module")
def wasm_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wasm")
    subprocess.run(["bash", str(ROOT / "scripts/build_wasm_tools.sh"), str(out)], check=True, capture_output=True)
    (out / "hostile.wasm").unlink()
    return out


def test_create_chat_run_and_restart(store_url, tmp_path, model, wasm_dir):
    spec = f"{ROOT / 'tests' / 'agent_tools.py'}:tools"
    model.script = [
        tool_calls(("lookup_order", {"order_id": 5}), ("wordcount", {"args": {"text": "a b"}})),
        say("Order 5 has shipped."),
        say("Done."),
    ]
    with serve(store_url, tmp_path, token=TOKEN, tools=spec, tools_dir=wasm_dir, name="first") as base, \
            eg.Client(base, token=TOKEN) as c:
        made = c.create_agent("support", "openai:scripted", "Answer order questions.", ["lookup_order", "wordcount"])
        assert made["kind"] == "llm" and made["tools"] == ["lookup_order", "wordcount"]
        assert c.create_agent("support", "openai:scripted", "Answer order questions.",
                              ["lookup_order", "wordcount"])["name"] == "support"  # same definition: fine
        with pytest.raises(eg.RemoteError) as e:
            c.create_agent("support", "openai:other", "x")
        assert e.value.status == 409
        with pytest.raises(eg.RemoteError) as e:
            c.create_agent("evil", "openai:scripted", "x", ["os.system"])
        assert e.value.status == 422 and "no tool named 'os.system'" in str(e.value)
        with pytest.raises(eg.RemoteError) as e:
            c.create_agent("../x", "openai:scripted")
        assert e.value.status == 422
        assert [a["name"] for a in c.agents() if a["kind"] == "llm"] == ["support"]

        events = list(c.chat("support", "Where is order 5?", session="web-1"))
        kinds = [e["type"] for e in events]
        assert kinds[:4] == ["tool_call", "tool_call", "tool_result", "tool_result"] and kinds[-1] == "done"
        assert events[2]["content"] == '{"order": 5, "status": "shipped", "total": 19.5}'
        assert events[3]["content"] == '{"bytes": 3, "words": 2}'
        assert "".join(e["delta"] for e in events if e["type"] == "text") == "Order 5 has shipped."
        assert events[-1]["status"] == "ok"
        res = c.run_agent("support", "say done", run_id="api-run-1")
        assert res and res.output == "Done." and res.run_id == "api-run-1"
        assert model.calls == 3
        with pytest.raises(eg.RemoteError) as e:
            list(c.chat("nobody", "hi", session="s"))
        assert e.value.status == 404
    # a second server on the same store knows the agent and the session
    with serve(store_url, tmp_path, token=TOKEN, tools=spec, tools_dir=wasm_dir, name="second") as base, \
            eg.Client(base, token=TOKEN) as c:
        assert [a["name"] for a in c.agents() if a["kind"] == "llm"] == ["support"]
        hist = c.history("support", "web-1")
        assert [m["role"] for m in hist] == ["user", "assistant", "tool", "tool", "assistant"]
        assert all(m["ts"].endswith("Z") for m in hist)
        model.script.append(tool_call("lookup_order", order_id="not a number"))
        model.script.append(say("Sorry."))
        events = list(c.chat("support", "And order x?", session="web-1"))
        assert events[-1]["turn"] == 1 and events[-1]["text"] == "Sorry."
        result = next(e for e in events if e["type"] == "tool_result")
        assert result["error"] and "bad arguments" in result["content"]


def test_chat_body_is_validated(tmp_path, model):
    with serve(f"sqlite:///{tmp_path / 'x.db'}", tmp_path, token=TOKEN) as base:
        h = {"Authorization": f"Bearer {TOKEN}"}
        r = httpx.post(f"{base}/api/agents", json={"name": "a", "model": "gpt"}, headers=h)
        assert r.status_code == 422 and r.json()["error"] == "ValidationError" and "body.model" in r.json()["detail"]
        httpx.post(f"{base}/api/agents", json={"name": "a", "model": "openai:m"}, headers=h).raise_for_status()
        r = httpx.post(f"{base}/api/agents/a/chat", json={"session": "../../etc", "message": "hi"}, headers=h)
        assert r.status_code == 422
        r = httpx.post(f"{base}/api/agents/a/chat", json={"session": "s", "message": ""}, headers=h)
        assert r.status_code == 422


def test_a_client_that_leaves_mid_stream_does_not_stall_the_turn(tmp_path, model):
    # The server paces the agent's thread on the SSE writes (first token out before the next chunk
    # is parsed); a reader that goes away must release it: the turn finishes in the journal.
    text = " ".join(f"word{i}" for i in range(60))
    model.script = [say(text), say("Second answer.")]
    model.chunk_delay = 0.002
    with serve(f"sqlite:///{tmp_path / 'x.db'}", tmp_path, token=TOKEN) as base, \
            eg.Client(base, token=TOKEN) as c:
        c.create_agent("talker", "openai:scripted", "Talk.")
        h = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.stream("POST", f"{base}/api/agents/talker/chat", json={"session": "s1", "message": "go"},
                          headers=h) as resp:
            for line in resp.iter_lines():
                if line.startswith("event: text"):
                    break  # leave after the first token
        left = time.monotonic()
        while not c.history("talker", "s1") and time.monotonic() < left + 20:
            time.sleep(0.05)
        waited = time.monotonic() - left
        hist = c.history("talker", "s1")
        # paced on a gone reader, 60 words would take >= 3 s (one 50 ms wait each): it took one at most
        assert waited < 2.5, waited
        assert [m["role"] for m in hist] == ["user", "assistant"] and hist[1]["content"] == text
        events = list(c.chat("talker", "again", session="s1"))
        assert events[-1]["status"] == "ok" and events[-1]["turn"] == 1
        assert "".join(e["delta"] for e in events if e["type"] == "text") == "Second answer."


def test_sigkill_the_server_mid_stream_after_a_tool_call_then_resume_on_another(store_url, tmp_path, model,
                                                                                 monkeypatch):
    effects = tmp_path / "effects.log"
    monkeypatch.setenv("ENGRAIN_TEST_EFFECTS", str(effects))  # the servers inherit it
    spec = f"{ROOT / 'tests' / 'agent_tools.py'}:tools"
    long = "Order 5 has shipped and this reply streams slowly so that the server can be killed in the middle."
    model.script = [tool_call("lookup_order", order_id=5), say(long), say(long)]
    model.chunk_delay = 0.1  # ~1.8 s of stream to kill the server in
    procs: list[subprocess.Popen] = []
    with serve(store_url, tmp_path, token=TOKEN, tools=spec, name="killed", procs=procs) as base, \
            eg.Client(base, token=TOKEN) as c:
        c.create_agent("support", "openai:scripted", "Answer order questions.", ["lookup_order"])
        seen = []
        for e in c.chat("support", "Where is order 5?", session="k1"):
            seen.append(e["type"])
            if e["type"] == "text":
                procs[0].send_signal(signal.SIGKILL)
                procs[0].wait()
                break
    assert seen == ["tool_call", "tool_result", "text"] and model.calls == 2
    with serve(store_url, tmp_path, token=TOKEN, tools=spec, name="after") as base, \
            eg.Client(base, token=TOKEN) as c:
        events = list(c.chat("support", "Where is order 5?", session="k1"))  # the same message: that turn resumes
        assert events[-1]["status"] == "ok" and events[-1]["turn"] == 0
        assert "".join(e["delta"] for e in events if e["type"] == "text") == long
        assert model.calls == 3  # the cut stream was asked again; the tool-calling reply was replayed
        assert effects.read_text().splitlines() == ["lookup_order 5"]  # the tool ran once
        hist = c.history("support", "k1")
        assert [m["role"] for m in hist] == ["user", "assistant", "tool", "assistant"]
        assert hist[-1]["content"] == long


def test_an_app_started_again_runs_its_llm_agents_on_the_reopened_store(tmp_path, scripted_openai):
    """The lifespan closes the journal and the agents' pool at shutdown and reopens the journal at the
    next start: an agent defined before must then run on the new journal and pool, not the closed ones."""
    from fastapi.testclient import TestClient

    from engrain._server import create_app

    app = create_app(f"sqlite:///{tmp_path / 'a.db'}")
    with TestClient(app, base_url="http://127.0.0.1") as c:
        assert c.post("/api/agents", json={"name": "again", "model": "openai:scripted"}).status_code == 201
        assert c.get("/api/agents/again/sessions/s1").json() == []
    scripted_openai.script = [say("Hello again.")]
    with TestClient(app, base_url="http://127.0.0.1") as c:  # the same app, started again
        assert c.get("/api/agents/again/sessions/s1").status_code == 200
        r = c.post("/api/agents/again/runs", json={"task": "hi"})
        assert r.status_code == 200 and (r.json()["status"], r.json()["output"]) == ("ok", "Hello again."), r.text
