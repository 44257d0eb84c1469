"""Requests in the three wire formats, read back into the agent's neutral conversation.

The providers (:mod:`.providers`) write the neutral conversation out as Chat
Completions, Responses or Messages requests; :func:`conversation` reads any of
those requests (from engrain or from a user's own SDK calls) back into

* ``system``: the system text (system/developer messages, ``instructions``, ``system``),
* ``messages``: ``{"role": "user"|"assistant"|"tool", "content", ...}`` with an
  assistant's ``tool_calls`` (``[{"id", "name", "arguments"}]``, arguments as JSON
  text) and a tool message's ``tool_call_id``, ``name`` and ``error``,
* ``tools``: ``[{"name", "description", "parameters"}]``,

so a test model decides the same way whichever way it is reached.
"""

from __future__ import annotations

import json
from typing import Any


def conversation(api: str, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """``(system, messages, tools)`` of a request body; ``api`` is ``chat``, ``responses`` or ``messages``."""
    if api == "chat":
        system, messages = _chat(body.get("messages") or [])
        tools = [_tool(t.get("function") or {}) for t in body.get("tools") or [] if isinstance(t, dict)]
    elif api == "responses":
        system, messages = _responses(body.get("input") or [])
        if isinstance(body.get("instructions"), str):
            system = "\n\n".join(p for p in (body["instructions"], system) if p)
        tools = [_tool(t) for t in body.get("tools") or [] if isinstance(t, dict) and t.get("type") == "function"]
    elif api == "messages":
        system = _text(body.get("system") or "")
        messages = _messages(body.get("messages") or [])
        tools = [_tool(t, "input_schema") for t in body.get("tools") or [] if isinstance(t, dict)]
    else:
        raise ValueError(f"unknown wire format {api!r}")
    names = {c["id"]: c["name"] for m in messages for c in m.get("tool_calls") or []}
    for m in messages:  # Chat Completions and Responses name a tool result's call only by id
        if m["role"] == "tool" and not m.get("name"):
            m["name"] = names.get(m["tool_call_id"], "")
    return system, messages, tools


def _tool(t: dict[str, Any], params: str = "parameters") -> dict[str, Any]:
    return {"name": str(t.get("name", "")), "description": str(t.get("description") or ""),
            "parameters": t.get(params) if isinstance(t.get(params), dict) else {"type": "object"}}


def _text(content: Any) -> str:
    """The text of a message content: a string, or a list of text parts of any of the formats."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text"))
    return ""


def _tool_msg(call_id: str, content: Any, error: bool = False, name: str = "") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": str(call_id), "name": name,
            "content": content if isinstance(content, str) else _text(content) or json.dumps(content), "error": error}


def _chat(items: list[Any]) -> tuple[str, list[dict[str, Any]]]:
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for m in items:
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        if role in ("system", "developer"):
            system.append(_text(m.get("content")))
        elif role == "user":
            out.append({"role": "user", "content": _text(m.get("content"))})
        elif role == "assistant":
            calls = [{"id": str(c.get("id", "")), "name": str((c.get("function") or {}).get("name", "")),
                      "arguments": (c.get("function") or {}).get("arguments") or "{}"}
                     for c in m.get("tool_calls") or [] if isinstance(c, dict)]
            out.append({"role": "assistant", "content": _text(m.get("content")), "tool_calls": calls})
        elif role == "tool":
            out.append(_tool_msg(m.get("tool_call_id", ""), m.get("content", "")))
    return "\n\n".join(system), out


def _responses(items: Any) -> tuple[str, list[dict[str, Any]]]:
    if isinstance(items, str):
        return "", [{"role": "user", "content": items}]
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for it in items if isinstance(items, list) else []:
        if not isinstance(it, dict):
            continue
        kind, role = it.get("type", "message"), it.get("role")
        if kind == "function_call":
            call = {"id": str(it.get("call_id", "")), "name": str(it.get("name", "")),
                    "arguments": it.get("arguments") or "{}"}
            if out and out[-1]["role"] == "assistant":  # parallel calls come as one item each
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append(_tool_msg(it.get("call_id", ""), it.get("output", "")))
        elif kind == "message" and role in ("system", "developer"):
            system.append(_text(it.get("content")))
        elif kind == "message" and role == "assistant":
            out.append({"role": "assistant", "content": _text(it.get("content")), "tool_calls": []})
        elif kind == "message" and role == "user":
            out.append({"role": "user", "content": _text(it.get("content"))})
    return "\n\n".join(system), out


def _messages(items: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in items:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        if m.get("role") == "assistant":
            calls = [{"id": str(b.get("id", "")), "name": str(b.get("name", "")), "arguments": json.dumps(b.get("input") or {})}
                     for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
            out.append({"role": "assistant", "content": _text(blocks), "tool_calls": calls})
            continue
        for b in blocks:  # a user turn holds tool results and text, in order
            if isinstance(b, dict) and b.get("type") == "tool_result":
                out.append(_tool_msg(b.get("tool_use_id", ""), b.get("content", ""), bool(b.get("is_error"))))
        text = _text(blocks)
        if text or not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks):
            out.append({"role": "user", "content": text})
    return out
