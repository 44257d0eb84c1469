"""The shapes of model replies, checked as they are read: a malformed one names its field.

A reply (or a streamed piece of one) that is not the provider's shape raises :class:`_Malformed`,
which :mod:`.providers` turns into the SDK's own ``APIError``, so a bad reply fails the step with
the provider's error type instead of a ``TypeError`` from deep inside the parsing.
"""

from __future__ import annotations

import json
from typing import Any


class _Malformed(Exception):
    """A reply (or a streamed piece of one) whose shape is not the provider's: ``field`` names where.

    Raised by the readers below and turned into the SDK's ``APIError`` by :func:`_malformed`, so a
    bad reply fails the step with the provider's error type and a message naming the field,
    instead of a ``TypeError`` from deep inside the parsing.
    """

    def __init__(self, what: str, field: str, problem: str):
        super().__init__(f"{what}: {field} {problem}")
        self.what, self.field, self.problem = what, field, problem


_REPLY = "Chat Completions reply"
_CHUNK = "Chat Completions stream chunk"
_MESSAGE = "Messages reply"
_EVENT = "Messages stream event"


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, (list, tuple)):
        return "a list"
    if _is_object(v):
        return "an object"
    return f"a {type(v).__name__}"


def _not(v: Any, expected: str) -> str:
    return "is missing (or null)" if v is None else f"is {_kind(v)}, not {expected}"


def _is_object(v: Any) -> bool:
    """A JSON object: a dict, or the SDK's object built from one."""
    return isinstance(v, dict) or hasattr(v, "model_dump")


def _field(obj: Any, key: str) -> Any:
    """``obj[key]`` of a JSON object, or the attribute of the SDK's object built from it (None when absent).

    The SDKs build their objects without validating them, so a field holds whatever the server
    sent (a number where text belongs, a dict where a list does): the readers check each one.
    """
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _usage(u: Any, inp: str, out: str) -> dict[str, Any]:
    """Token counts (a malformed usage is left out: it is not worth failing a reply for)."""
    return {"input": _count(_field(u, inp)), "output": _count(_field(u, out))} if _is_object(u) else {}


def _call_head(what: str, cid: Any, id_field: str, name: Any, name_field: str) -> tuple[str, str]:
    """A tool call's id (``""`` when absent) and name, as both formats require them: a string id, a non-empty name."""
    if cid is not None and not isinstance(cid, str):
        raise _Malformed(what, id_field, _not(cid, "a string"))
    if not isinstance(name, str) or not name:
        raise _Malformed(what, name_field, "is empty" if name == "" else _not(name, "a string"))
    return cid or "", name


def _chat_message(body: Any) -> tuple[str, list[dict[str, Any]]]:
    """Text and tool calls of a Chat Completions reply (its JSON body, or the SDK's object for it)."""
    if not _is_object(body):
        raise _Malformed(_REPLY, "the body", _not(body, "an object"))
    choices = _field(body, "choices")
    if not isinstance(choices, list) or not choices:
        raise _Malformed(_REPLY, "choices", "is an empty list" if isinstance(choices, list) else
                         _not(choices, "a list"))
    msg = _field(choices[0], "message") if _is_object(choices[0]) else None
    if not _is_object(msg):
        raise _Malformed(_REPLY, "choices[0]" if not _is_object(choices[0]) else "choices[0].message",
                         _not(choices[0] if not _is_object(choices[0]) else msg, "an object"))
    content = _field(msg, "content")
    if content is not None and not isinstance(content, str):
        raise _Malformed(_REPLY, "choices[0].message.content", _not(content, "a string"))
    tool_calls = _field(msg, "tool_calls")
    if tool_calls is not None and not isinstance(tool_calls, list):
        raise _Malformed(_REPLY, "choices[0].message.tool_calls", _not(tool_calls, "a list"))
    calls = []
    for i, c in enumerate(tool_calls or []):
        where = f"choices[0].message.tool_calls[{i}]"
        if not _is_object(c):
            raise _Malformed(_REPLY, where, _not(c, "an object"))
        fn = _field(c, "function")
        if fn is None and isinstance(_field(c, "type"), str) and _field(c, "type") != "function":
            continue  # a custom tool's call: this agent offers functions only
        if not _is_object(fn):
            raise _Malformed(_REPLY, f"{where}.function", _not(fn, "an object"))
        cid, name = _call_head(_REPLY, _field(c, "id"), f"{where}.id", _field(fn, "name"), f"{where}.function.name")
        args = _field(fn, "arguments")
        if args is not None and not isinstance(args, str):
            raise _Malformed(_REPLY, f"{where}.function.arguments", _not(args, "a string (the arguments' JSON text)"))
        calls.append({"id": cid, "name": name, "arguments": args or "{}"})
    return content or "", calls


def _chunk_delta(chunk: dict[str, Any]) -> dict[str, Any] | None:
    """``choices[0].delta`` of a streamed chunk, or None for a chunk without one (the usage chunk)."""
    choices = chunk.get("choices")
    if not choices:
        return None
    if not isinstance(choices, list):
        raise _Malformed(_CHUNK, "choices", _not(choices, "a list"))
    if not isinstance(choices[0], dict):
        raise _Malformed(_CHUNK, "choices[0]", _not(choices[0], "an object"))
    d = choices[0].get("delta")
    if d is not None and not isinstance(d, dict):
        raise _Malformed(_CHUNK, "choices[0].delta", _not(d, "an object"))
    return d


def _chunk_calls(d: dict[str, Any]) -> list[tuple[int | None, str | None, str | None, str | None]]:
    """``(index, id, name piece, arguments piece)`` of each tool-call piece in a chunk's delta."""
    tool_calls = d.get("tool_calls")
    if tool_calls is None:
        return []
    if not isinstance(tool_calls, list):
        raise _Malformed(_CHUNK, "choices[0].delta.tool_calls", _not(tool_calls, "a list"))
    out = []
    for j, tc in enumerate(tool_calls):
        where = f"choices[0].delta.tool_calls[{j}]"
        if not isinstance(tc, dict):
            raise _Malformed(_CHUNK, where, _not(tc, "an object"))
        index, cid, fn = tc.get("index"), tc.get("id"), tc.get("function")
        if index is not None and (not isinstance(index, int) or isinstance(index, bool)):
            raise _Malformed(_CHUNK, f"{where}.index", _not(index, "an integer"))
        if cid is not None and not isinstance(cid, str):
            raise _Malformed(_CHUNK, f"{where}.id", _not(cid, "a string"))
        if fn is not None and not isinstance(fn, dict):
            raise _Malformed(_CHUNK, f"{where}.function", _not(fn, "an object"))
        name, args = (fn or {}).get("name"), (fn or {}).get("arguments")
        for key, v in (("name", name), ("arguments", args)):
            if v is not None and not isinstance(v, str):
                raise _Malformed(_CHUNK, f"{where}.function.{key}", _not(v, "a string"))
        out.append((index, cid, name, args))
    return out


def _message_content(body: Any) -> tuple[str, list[dict[str, Any]]]:
    """Text and tool calls of a Messages reply (its JSON body, or the SDK's object for it)."""
    if not _is_object(body):
        raise _Malformed(_MESSAGE, "the body", _not(body, "an object"))
    content = _field(body, "content")
    if not isinstance(content, list):
        raise _Malformed(_MESSAGE, "content", _not(content, "a list of blocks"))
    parts, calls = [], []
    for i, b in enumerate(content):
        if not _is_object(b):
            raise _Malformed(_MESSAGE, f"content[{i}]", _not(b, "an object"))
        kind = _field(b, "type")
        if kind == "text":
            text = _field(b, "text")
            if not isinstance(text, str):
                raise _Malformed(_MESSAGE, f"content[{i}].text", _not(text, "a string"))
            parts.append(text)
        elif kind == "tool_use":
            bid, name = _call_head(_MESSAGE, _field(b, "id"), f"content[{i}].id", _field(b, "name"), f"content[{i}].name")
            args = _field(b, "input")
            if args is not None and not isinstance(args, dict):
                raise _Malformed(_MESSAGE, f"content[{i}].input", _not(args, "an object"))
            calls.append({"id": bid, "name": name, "arguments": json.dumps(args or {})})
    return "".join(parts), calls


def _event_index(e: dict[str, Any]) -> int:
    index = e.get("index", 0)
    if not isinstance(index, int) or isinstance(index, bool):
        raise _Malformed(_EVENT, f"index of a {e.get('type')} event", _not(index, "an integer"))
    return index
