"""``engrain mcp``: the MCP server over stdio, driven by the official SDK's own stdio client."""

from __future__ import annotations

import json
import os
import select
import shutil
import sys
from pathlib import Path

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

import engrain as eg

ROUTINE = """\
name: hello
description: Greets someone
inputs:
  type: object
  properties:
    who: {type: string}
  required: [who]
steps:
  - id: result
    type: return
    value: "hello {{ inputs.who }}"
"""

ASKING = """\
name: asking
inputs: {type: object, properties: {who: {type: string}}, required: [who]}
steps:
  - id: confirm
    type: prompt.user
    prompt: "Greet {{ inputs.who }}?"
    fields: [{name: greeting, type: text}, {name: ok, type: boolean}]
  - {id: check, type: assert, expr: confirm.ok, message: declined}
  - id: result
    type: return
    value: "{{ confirm.greeting }} {{ inputs.who }}"
"""


def _payload(result) -> object:
    """The tool's JSON result (structured content, unwrapping the SDK's {"result": ...} for lists)."""
    sc = result.structured_content
    if isinstance(sc, dict) and set(sc) == {"result"}:
        return sc["result"]
    if sc is not None:
        return sc
    return json.loads(result.content[0].text)


@pytest.fixture
def store(tmp_path):
    url = f"sqlite:///{tmp_path / 'mcp.db'}"
    (tmp_path / "routines" / "hello").mkdir(parents=True)
    (tmp_path / "routines" / "hello" / "routine.yaml").write_text(ROUTINE)
    (tmp_path / "routines" / "asking").mkdir(parents=True)
    (tmp_path / "routines" / "asking" / "routine.yaml").write_text(ASKING)
    j = eg.open(url)
    j.append("seeded-run", [eg.NewEvent("run.started", "", {"task": "seeded", "inputs": {}, "tags": []})], 0)
    j.append("seeded-run", [eg.NewEvent("run.completed", "", {"output": 1})], 1)
    j.close()
    return url, tmp_path


def test_mcp_tools_over_stdio(store):
    url, tmp = store
    exe_path = Path(sys.executable).with_name("engrain")  # this venv's engrain, not one on PATH
    exe = str(exe_path) if exe_path.exists() else shutil.which("engrain") or "engrain"
    params = StdioServerParameters(
        command=exe, args=["mcp", "--url", url, "--routines", str(tmp / "routines")],
        env={"ENGRAIN_HOME": str(tmp / "home")}, cwd=str(tmp),
    )

    async def main() -> dict:
        out: dict = {}
        with anyio.fail_after(120), open(tmp / "mcp-stderr.log", "w") as errlog:
            async with stdio_client(params, errlog=errlog) as streams:
                async with ClientSession(streams[0], streams[1]) as s:
                    await s.initialize()
                    out["tools"] = sorted(t.name for t in (await s.list_tools()).tools)
                    out["runs"] = _payload(await s.call_tool("list_runs", {}))
                    out["done"] = _payload(await s.call_tool("list_runs", {"status": "ok"}))
                    out["none"] = _payload(await s.call_tool("list_runs", {"status": "failed"}))
                    out["id1"] = _payload(await s.call_tool("remember", {"data": "Deploys happen on Tuesdays", "skill": "ops"}))
                    await s.call_tool("remember", {"data": "Deploys are frozen in late December", "skill": "ops"})
                    await s.call_tool("remember", {"data": "Lunch is served at noon", "skill": "office"})
                    out["recall"] = _payload(await s.call_tool("recall", {"query": "when do we deploy?", "skill": "ops", "top_k": 2}))
                    out["consolidate"] = _payload(await s.call_tool("consolidate", {}))
                    out["routines"] = _payload(await s.call_tool("list_routines", {}))
                    out["bad"] = await s.call_tool("run_routine", {"name": "../etc"})
                    out["bad_recall"] = await s.call_tool("recall", {"query": "   "})
                    out["run"] = await s.call_tool("run_routine", {"name": "hello", "inputs": {"who": "Ada"}})
                    paused = _payload(await s.call_tool("run_routine", {"name": "asking", "inputs": {"who": "Ada"}}))
                    out["paused"] = paused
                    rid = paused["run_id"]
                    out["bad_answer"] = await s.call_tool("answer_routine", {"run_id": rid, "answers": {"greeting": "hi", "okay": True}})
                    out["bad_shape"] = await s.call_tool("answer_routine", {"run_id": rid, "answers": {"nope": {"ok": True}}})
                    out["answered"] = _payload(await s.call_tool("answer_routine", {"run_id": rid, "answers": {"greeting": "Hi", "ok": "yes"}}))
                    out["again"] = await s.call_tool("answer_routine", {"run_id": rid, "answers": {"ok": True}})
                    out["not_routine"] = await s.call_tool("answer_routine", {"run_id": "seeded-run", "answers": {}})
                    out["missing"] = await s.call_tool("answer_routine", {"run_id": "nosuch", "answers": {}})
        return out

    out = anyio.run(main)
    assert out["tools"] == ["answer_routine", "consolidate", "list_routines", "list_runs", "recall", "remember", "run_routine"]
    assert [r["run_id"] for r in out["runs"]] == ["seeded-run"] and out["runs"][0]["status"] == "ok"
    assert len(out["done"]) == 1 and out["none"] == []
    assert out["id1"]["id"].startswith("rec_")
    assert len(out["recall"]) == 2 and all("Deploy" in h["content"] for h in out["recall"])
    assert out["recall"][0]["skill"] == "ops"
    assert out["consolidate"]["errors"] == [] and out["consolidate"]["formed"] >= 1
    assert [r["name"] for r in out["routines"]] == ["asking", "hello"]
    assert out["routines"][1]["description"] == "Greets someone"
    assert out["bad"].is_error and "BadRoutineName" in out["bad"].content[0].text
    assert out["bad_recall"].is_error and "query" in out["bad_recall"].content[0].text
    assert not out["run"].is_error, out["run"].content
    res = _payload(out["run"])
    assert res["status"] == "ok" and res["output"] == "hello Ada"
    # answer_routine finishes what run_routine started; bad answers are typed errors that record nothing.
    assert out["paused"]["status"] == "needs_input" and out["paused"]["prompt"]["step"] == "confirm"
    assert out["bad_answer"].is_error and "RoutineInputError" in out["bad_answer"].content[0].text
    assert "okay" in out["bad_answer"].content[0].text
    assert out["bad_shape"].is_error and "no prompt.user step" in out["bad_shape"].content[0].text
    assert out["answered"]["status"] == "ok" and out["answered"]["output"] == "Hi Ada", out["answered"]
    assert out["again"].is_error and "not waiting for input" in out["again"].content[0].text
    assert out["not_routine"].is_error and "not waiting for input" in out["not_routine"].content[0].text
    assert out["missing"].is_error and "nosuch" in out["missing"].content[0].text
    # The run went to the shared store: visible to the Python API too.
    j = eg.open(url)
    assert j.get_run(res["run_id"]).status == "ok"
    j.close()


def test_tool_descriptions_have_no_docstring_markup(store):
    """Models read these descriptions: ``x`` and :class:`~a.B` markup must not reach them (issue 12 #16)."""
    from engrain._mcp import build_server

    url, tmp = store
    server = build_server(url, str(tmp / "routines"))
    tools = anyio.run(server.list_tools)
    descriptions = {t.name: t.description for t in tools}
    assert descriptions["recall"] == "Records and articles most relevant to 'query', best first."
    for name, text in descriptions.items():
        assert "``" not in text and ":class:" not in text, (name, text)


def test_every_request_line_is_answered(store, tmp_path):
    """A line the SDK cannot take is answered (with its id when readable), so no client waits for ever."""
    import subprocess

    url, _ = store
    exe_path = Path(sys.executable).with_name("engrain")
    exe = str(exe_path) if exe_path.exists() else shutil.which("engrain") or "engrain"
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    lines = [
        json.dumps(init),
        json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        '{"jsonrpc":"2.0","id":2,',                                                    # cut short
        '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"recall","arguments":{"query":"\\ud800"}}}',
        '{"jsonrpc":"2.0","id":4,"method":"tools/list","params":' + "[" * 3000 + "]" * 3000 + "}",
        '{"jsonrpc":"2.0","id":"five","method":123}',                                  # JSON, not JSON-RPC
        "[1,2,3]",
        '{"jsonrpc":"2.0","id":6,"method":"tools/list","params":{"x":"' + "a" * 3_000_000 + '"}}',
        json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}),
    ]
    proc = subprocess.Popen([exe, "mcp", "--url", url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, cwd=str(tmp_path), env={**os.environ, "ENGRAIN_HOME": str(tmp_path / "home")})
    replies = []
    try:
        for line in lines:
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()
            if "notifications/" in line:  # answered by nothing, as JSON-RPC says
                continue
            ready, _, _ = select.select([proc.stdout], [], [], 30)
            assert ready, f"no reply to {line[:80]!r}"
            replies.append(json.loads(proc.stdout.readline()))
    finally:
        proc.kill()
        proc.wait()
    errors = [(r["id"], r["error"]["code"]) for r in replies[1:-1]]
    assert errors == [(None, -32700), (3, -32700), (None, -32700), ("five", -32600), (None, -32600), (None, -32600)]
    assert "limited to" in replies[-2]["error"]["message"]
    assert replies[-1]["id"] == 7 and "remember" in {t["name"] for t in replies[-1]["result"]["tools"]}
