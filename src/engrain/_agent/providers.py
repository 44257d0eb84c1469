"""Model providers: one neutral conversation, sent through the official SDKs.

The agent keeps its conversation as JSON messages (journaled, replayed):

* ``{"role": "user", "content", "ts"}``
* ``{"role": "assistant", "content", "tool_calls": [{"id", "name", "arguments"}], "ts"}``
  (``arguments`` is the model's raw JSON text, so malformed arguments survive
  to be reported back to the model)
* ``{"role": "tool", "tool_call_id", "name", "content", "error", "ts"}``

A provider turns that into its wire format, calls the model (streaming when
asked), and returns one *reply* ``{"text", "tool_calls", "usage", "ts"}``: the
result of the journaled LLM step.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from .._errors import ConfigError
from .reply_shapes import (  # the replies' shape checks
    _CHUNK,
    _EVENT,
    _Malformed,
    _chat_message,
    _chunk_calls,
    _chunk_delta,
    _count,
    _event_index,
    _field,
    _message_content,
    _not,
    _usage,
)

OLLAMA_URL = "http://localhost:11434/v1"
PROVIDERS = ("openai", "anthropic", "ollama")

Delta = Callable[[str], None]
MAX_EVENT = 8 * 1024 * 1024  # characters of one streamed event read from a model server
WHOLE = "_engrain_whole"  # the key under which _chunks hands over a reply sent as one JSON body


# The last whole second formatted (its epoch second and its text up to the seconds): every model
# reply and every turn's system message reads the clock, and strftime costs more than the rest.
_second: tuple[int, str] = (-1, "")


def _now_second(sec: int) -> str:
    global _second
    last = _second
    if last[0] != sec:
        last = _second = (sec, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)))
    return last[1]


def utc_iso(t: _dt.datetime | None = None) -> str:
    """``2026-11-23T10:00:00.123Z``: how messages carry their time."""
    if t is None:
        now = time.time()
        sec = int(now)
        return f"{_now_second(sec)}.{int((now - sec) * 1000):03d}Z"
    t = t.astimezone(_dt.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def marker(ts: str | None) -> str:
    """The ``[2026-11-23T10:00:00Z] `` prefix the model sees on a message (seconds precision)."""
    return f"[{ts[:19]}Z] " if ts else ""


def parse_model(model: str) -> tuple[str, str]:
    """``"openai:gpt-4.1-mini"`` -> ``("openai", "gpt-4.1-mini")``; the model part may hold ``:``."""
    if not isinstance(model, str) or ":" not in model:
        raise ConfigError(f"model {model!r}: write it as '<provider>:<model>', provider one of {', '.join(PROVIDERS)}")
    provider, name = model.split(":", 1)
    if provider not in PROVIDERS or not name:
        raise ConfigError(f"model {model!r}: unknown provider {provider!r} (use one of {', '.join(PROVIDERS)})")
    return provider, name


def missing_key(provider: str) -> str | None:
    """What this process lacks to call ``provider``'s models (the environment variable to set), or ``None``.

    The same rule :func:`make_provider` applies without ``api_key=``/``base_url=``: a key, or a
    base URL (a compatible or local server takes any key); ``ollama`` needs neither.
    """
    if provider == "ollama":
        return None
    if provider == "anthropic":
        ok = os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_BASE_URL")
        return None if ok else "ANTHROPIC_API_KEY"
    ok = os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL")
    return None if ok else "OPENAI_API_KEY"


def system_text(instructions: str, extra: str = "") -> str:
    """The system message: instructions, the current time, and how message times are shown."""
    global _system
    sec = int(time.time())
    last = _system
    if last[0] == sec and last[1] == instructions and last[2] == extra:
        return last[3]  # a turn in the same second as the last (most are): the same text
    now = _now_second(sec) + "Z"
    parts = [instructions.strip()] if instructions.strip() else []
    if extra:
        parts.append(extra)
    parts.append(
        f"Current time: {now}. Earlier messages begin with the time they were written, as [YYYY-MM-DDTHH:MM:SSZ]; "
        "do not write such markers yourself."
    )
    text = "\n\n".join(parts)
    _system = (sec, instructions, extra, text)
    return text


_system: tuple[int, str, str, str] = (-1, "", "", "")  # the last system message: its second and arguments


class Provider:
    """One model behind one SDK client."""

    name = ""

    def __init__(self, model: str, client: Any):
        self.model = model
        self.client = client

    def complete(self, system: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 on_delta: Delta | None = None) -> dict[str, Any]:
        """Call the model once and return the neutral reply (streamed when ``on_delta`` is given)."""
        raise NotImplementedError


def _reply(text: str, calls: list[dict[str, Any]], usage: dict[str, int]) -> dict[str, Any]:
    return {"text": text, "tool_calls": calls, "usage": usage, "ts": utc_iso()}


class OpenAIChat(Provider):
    """OpenAI Chat Completions (also Ollama, vLLM, LM Studio: any compatible server)."""

    name = "openai"

    def _messages(self, system: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"role": "system", "content": system}]
        for m in messages:
            if m["role"] == "user":
                out.append({"role": "user", "content": marker(m.get("ts")) + m["content"]})
            elif m["role"] == "assistant":
                msg: dict[str, Any] = {"role": "assistant", "content": (marker(m.get("ts")) + m["content"]) if m["content"] else None}
                if m.get("tool_calls"):
                    msg["tool_calls"] = [
                        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                        for c in m["tool_calls"]
                    ]
                out.append(msg)
            else:
                out.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": m["content"]})
        return out

    def complete(self, system: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 on_delta: Delta | None = None) -> dict[str, Any]:
        kw: dict[str, Any] = {"model": self.model, "messages": self._messages(system, messages)}
        if tools:
            kw["tools"] = [{"type": "function", "function": t} for t in tools]
        if on_delta is None:
            r = self.client.chat.completions.create(**kw)
            try:
                text, calls = _chat_message(r)
            except _Malformed as e:
                raise _malformed(self, e, r) from None
            return _reply(text, calls, _usage(_field(r, "usage"), "prompt_tokens", "completion_tokens"))
        parts: list[str] = []
        acc: dict[int, dict[str, Any]] = {}
        last: int | None = None  # the slot of the latest tool-call piece
        usage: dict[str, Any] = {}
        chunks = _chunks(self.client.chat.completions, "openai",
                         {**kw, "stream": True, "stream_options": {"include_usage": True}})
        try:
            for chunk in chunks:
                if WHOLE in chunk:  # the server ignored stream=true and sent the whole completion
                    return _openai_whole(chunk[WHOLE], on_delta)
                u = chunk.get("usage")
                if isinstance(u, dict):
                    usage = _usage(u, "prompt_tokens", "completion_tokens")
                d = _chunk_delta(chunk)
                if d is None:
                    continue
                content = d.get("content")
                if content is not None and not isinstance(content, str):
                    raise _Malformed(_CHUNK, "choices[0].delta.content", _not(content, "a string"))
                if content:
                    parts.append(content)
                    on_delta(content)
                for index, cid, name, args in _chunk_calls(d):
                    if index is None:
                        # Servers such as Ollama send no ``index``: a piece bringing a new call id
                        # starts a new call, one without an id (or with the same id) continues the last.
                        if last is None or (cid and acc[last]["id"] and cid != acc[last]["id"]):
                            index = max(acc) + 1 if acc else 0
                        else:
                            index = last
                    slot = acc.setdefault(index, {"id": "", "name": "", "arguments": ""})
                    last = index
                    if cid:
                        slot["id"] = cid
                    slot["name"] += name or ""
                    slot["arguments"] += args or ""
        except _Malformed as e:
            raise _malformed(self, e, None) from None
        finally:
            chunks.close()
        calls = [{**acc[i], "arguments": acc[i]["arguments"] or "{}"} for i in sorted(acc)]
        return _reply("".join(parts), calls, usage)


def _malformed(provider: Provider, err: _Malformed, body: Any) -> Exception:
    """The SDK's ``APIError`` for a malformed reply (what :func:`_stream_error` is for a stream's error event)."""
    route = "v1/messages" if provider.name == "anthropic" else "chat/completions"
    if body is not None and not isinstance(body, (dict, list)):
        try:  # the SDK's object, as the JSON it was built from
            body = body.model_dump(mode="json", warnings=False)
        except Exception:  # noqa: BLE001 - only the error's detail
            body = None
    return _api_error(provider.name, _request_of(provider.client, route),
                      f"the model server sent a malformed {err}", body)


def _request_of(client: Any, route: str) -> Any:
    """An HTTP request object for ``route`` of ``client``'s server (an ``APIError`` names the request it is about).

    The SDKs' reply objects keep no reference to their request; this one has the method and URL.
    """
    try:
        url = client.base_url
        http = importlib.import_module(type(url).__module__.split(".")[0])  # httpx, or the SDK's own fork of it
        return http.Request("POST", url.join(route))
    except Exception:  # noqa: BLE001 - a client without a base_url: the error goes without a request
        return None


def _sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The ``data`` of each server-sent event (multi-line data joined, comments and other fields skipped)."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[6:] if line.startswith("data: ") else line[5:])
    if data:
        yield "\n".join(data)


def _chunks(resource: Any, sdk: str, kw: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A streamed call's events as JSON dicts.

    The SDK sends the request (auth, retries, errors for a bad status); its
    streaming response is read as plain JSON here because building the SDK's
    typed object for each chunk costs ~0.1-0.25 ms, paid before every token
    reaches the user. An error event in the stream raises the SDK's
    ``APIError``, as its typed stream does.
    """
    with resource.with_streaming_response.create(**kw) as resp:
        if "json" in resp.headers.get("content-type", "").lower():
            # Some compatible servers ignore ``stream`` and answer with the whole reply as JSON:
            # read it (bounded) instead of finding no events in it and returning an empty reply.
            yield {WHOLE: _json_body(sdk, resp)}
            return
        for data in _sse_data(resp.iter_lines()):
            if data.startswith("[DONE]"):
                return
            if len(data) > MAX_EVENT:
                raise _stream_error(sdk, resp, f"the model's stream sent an event of {len(data)} characters "
                                    f"(at most {MAX_EVENT})", None)
            try:
                event = json.loads(data)
            except ValueError:
                raise _stream_error(sdk, resp, f"the model's stream sent data that is not JSON: {data[:100]!r}",
                                    None) from None
            if isinstance(event, dict) and event.get("error") and (sdk == "openai" or event.get("type") == "error"):
                err = event["error"]
                msg = err.get("message") if isinstance(err, dict) else None
                raise _stream_error(sdk, resp, msg if isinstance(msg, str) and msg else
                                    "An error occurred during streaming", err)
            if isinstance(event, dict):
                yield event


def _json_body(sdk: str, resp: Any) -> dict[str, Any]:
    """A whole JSON reply read from a streamed request, at most ``MAX_EVENT`` bytes."""
    buf = bytearray()
    for piece in resp.iter_bytes():
        buf += piece
        if len(buf) > MAX_EVENT:
            raise _stream_error(sdk, resp, f"the model server sent a JSON body of more than {MAX_EVENT} bytes", None)
    try:
        body = json.loads(bytes(buf))
    except ValueError:
        raise _stream_error(sdk, resp, f"the model server sent a body that is not JSON: {bytes(buf[:100])!r}",
                            None) from None
    if not isinstance(body, dict):
        raise _stream_error(sdk, resp, f"the model server sent JSON that is not an object: {bytes(buf[:100])!r}", None)
    if body.get("error"):
        err = body["error"]
        msg = err.get("message") if isinstance(err, dict) else None
        raise _stream_error(sdk, resp, msg if isinstance(msg, str) and msg else "the model server sent an error", err)
    return body


def _openai_whole(body: dict[str, Any], on_delta: Delta) -> dict[str, Any]:
    """The neutral reply of a Chat Completions body (``choices[0].message``, ``usage``)."""
    text, calls = _chat_message(body)
    if text:
        on_delta(text)
    return _reply(text, calls, _usage(body.get("usage"), "prompt_tokens", "completion_tokens"))


def _anthropic_whole(body: dict[str, Any], on_delta: Delta) -> dict[str, Any]:
    """The neutral reply of a Messages body (``content`` blocks, ``usage``)."""
    text, calls = _message_content(body)
    if text:
        on_delta(text)
    u = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    return _reply(text, calls, {"input": _count(u.get("input_tokens")), "output": _count(u.get("output_tokens"))})


def _api_error(sdk: str, request: Any, message: str, body: Any) -> Exception:
    """The SDK's own ``APIError``: what it raises itself for an error the server sent."""
    if sdk == "anthropic":
        import anthropic

        return anthropic.APIError(message, request, body=body)
    import openai

    return openai.APIError(message, request, body=body)


def _stream_error(sdk: str, resp: Any, message: str, body: Any) -> Exception:
    """The SDK's own ``APIError`` for an error sent inside a stream (as its typed stream raises)."""
    return _api_error(sdk, resp.http_request, message, body)


class AnthropicMessages(Provider):
    """Anthropic Messages."""

    name = "anthropic"
    max_tokens = 4096

    def _messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []

        def add(role: str, blocks: list[dict[str, Any]]) -> None:
            if out and out[-1]["role"] == role:  # the API wants roles to alternate
                out[-1]["content"].extend(blocks)
            else:
                out.append({"role": role, "content": blocks})

        for m in messages:
            if m["role"] == "user":
                add("user", [{"type": "text", "text": marker(m.get("ts")) + m["content"]}])
            elif m["role"] == "assistant":
                blocks: list[dict[str, Any]] = []
                if m["content"]:
                    blocks.append({"type": "text", "text": marker(m.get("ts")) + m["content"]})
                for c in m.get("tool_calls") or []:
                    try:
                        args = json.loads(c["arguments"] or "{}")
                    except ValueError:
                        args = {}
                    blocks.append({"type": "tool_use", "id": c["id"], "name": c["name"],
                                   "input": args if isinstance(args, dict) else {}})
                add("assistant", blocks or [{"type": "text", "text": "(no reply)"}])
            else:
                block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
                if m.get("error"):
                    block["is_error"] = True
                add("user", [block])
        return out

    def complete(self, system: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 on_delta: Delta | None = None) -> dict[str, Any]:
        kw: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "system": system,
                              "messages": self._messages(messages)}
        if tools:
            kw["tools"] = [{"name": t["name"], "description": t.get("description", ""), "input_schema": t["parameters"]}
                           for t in tools]
        if on_delta is None:
            r = self.client.messages.create(**kw)
            try:
                text, calls = _message_content(r)
            except _Malformed as e:
                raise _malformed(self, e, r) from None
            return _reply(text, calls, _usage(_field(r, "usage"), "input_tokens", "output_tokens"))
        text_parts: list[str] = []
        blocks: dict[int, dict[str, Any]] = {}
        usage: dict[str, Any] = {}
        events = _chunks(self.client.messages, "anthropic", {**kw, "stream": True})
        try:
            for e in events:
                if WHOLE in e:  # the server ignored stream=true and sent the whole message
                    return _anthropic_whole(e[WHOLE], on_delta)
                kind = e.get("type")
                if kind == "message_start":
                    m = e.get("message")
                    if m is not None and not isinstance(m, dict):
                        raise _Malformed(_EVENT, "message of the message_start event", _not(m, "an object"))
                    u = (m or {}).get("usage")
                    usage["input"] = _count(u.get("input_tokens")) if isinstance(u, dict) else None
                elif kind == "content_block_start":
                    b = e.get("content_block")
                    if not isinstance(b, dict):
                        raise _Malformed(_EVENT, "content_block of a content_block_start event",
                                         _not(b, "an object"))
                    if b.get("type") == "tool_use":
                        bid, name = b.get("id"), b.get("name")
                        if bid is not None and not isinstance(bid, str):
                            raise _Malformed(_EVENT, "content_block.id of a tool_use block", _not(bid, "a string"))
                        if not isinstance(name, str) or not name:
                            raise _Malformed(_EVENT, "content_block.name of a tool_use block",
                                             "is empty" if name == "" else _not(name, "a string"))
                        blocks[_event_index(e)] = {"id": bid or "", "name": name, "arguments": ""}
                elif kind == "content_block_delta":
                    d = e.get("delta")
                    if not isinstance(d, dict):
                        raise _Malformed(_EVENT, "delta of a content_block_delta event", _not(d, "an object"))
                    if d.get("type") == "text_delta":
                        piece = d.get("text")
                        if piece is not None and not isinstance(piece, str):
                            raise _Malformed(_EVENT, "delta.text of a text_delta", _not(piece, "a string"))
                        if piece:
                            text_parts.append(piece)
                            on_delta(piece)
                    elif d.get("type") == "input_json_delta":
                        piece = d.get("partial_json")
                        if piece is not None and not isinstance(piece, str):
                            raise _Malformed(_EVENT, "delta.partial_json of an input_json_delta",
                                             _not(piece, "a string"))
                        index = _event_index(e)
                        if index in blocks:
                            blocks[index]["arguments"] += piece or ""
                elif kind == "message_delta":
                    u = e.get("usage")
                    usage["output"] = _count(u.get("output_tokens")) if isinstance(u, dict) else None
        except _Malformed as err:
            raise _malformed(self, err, None) from None
        finally:
            events.close()
        calls = [{**blocks[i], "arguments": blocks[i]["arguments"] or "{}"} for i in sorted(blocks)]
        return _reply("".join(text_parts), calls, usage)


def make_provider(model: str, *, base_url: str | None = None, api_key: str | None = None,
                  client: Any = None) -> Provider:
    """The provider for ``model`` (``"openai:…"``, ``"anthropic:…"``, ``"ollama:…"``).

    SDK clients are created here, lazily imported; ``client`` overrides (an
    ``openai.OpenAI`` or ``anthropic.Anthropic`` you configured yourself).
    """
    provider, name = parse_model(model)
    if provider == "anthropic":
        if client is None:
            import anthropic

            base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL")
            key = api_key or os.environ.get("ANTHROPIC_API_KEY") or ("unused" if base_url else None)
            if key is None:
                raise ConfigError(f"model {model!r} needs ANTHROPIC_API_KEY (or api_key=, or base_url= for a local server)")
            client = anthropic.Anthropic(api_key=key, base_url=base_url, max_retries=2)
        return AnthropicMessages(name, client)
    if client is None:
        import openai

        if provider == "ollama":
            base_url = base_url or os.environ.get("OLLAMA_BASE_URL") or OLLAMA_URL
        base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        key = api_key or os.environ.get("OPENAI_API_KEY") or ("unused" if base_url else None)
        if key is None:
            raise ConfigError(f"model {model!r} needs OPENAI_API_KEY (or api_key=, or base_url= for a compatible server)")
        client = openai.OpenAI(api_key=key, base_url=base_url, max_retries=2)
    return OpenAIChat(name, client)
