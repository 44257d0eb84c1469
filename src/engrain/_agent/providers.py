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
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from .._errors import ConfigError

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
            msg = r.choices[0].message
            calls = [
                {"id": c.id, "name": c.function.name, "arguments": c.function.arguments or "{}"}
                for c in (msg.tool_calls or []) if getattr(c, "function", None) is not None
            ]
            u = r.usage
            usage = {"input": u.prompt_tokens, "output": u.completion_tokens} if u else {}
            return _reply(msg.content or "", calls, usage)
        text: list[str] = []
        acc: dict[int, dict[str, Any]] = {}
        usage = {}
        for chunk in _chunks(self.client.chat.completions, "openai",
                             {**kw, "stream": True, "stream_options": {"include_usage": True}}):
            if WHOLE in chunk:  # the server ignored stream=true and sent the whole completion
                return _openai_whole(chunk[WHOLE], on_delta)
            u = chunk.get("usage")
            if u:
                usage = {"input": u.get("prompt_tokens"), "output": u.get("completion_tokens")}
            choices = chunk.get("choices")
            if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
                continue
            d = choices[0].get("delta") or {}
            if d.get("content"):
                text.append(d["content"])
                on_delta(d["content"])
            for tc in d.get("tool_calls") or []:
                slot = acc.setdefault(tc.get("index", 0), {"id": "", "name": "", "arguments": ""})
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function")
                if fn:
                    slot["name"] += fn.get("name") or ""
                    slot["arguments"] += fn.get("arguments") or ""
        calls = [{**acc[i], "arguments": acc[i]["arguments"] or "{}"} for i in sorted(acc)]
        return _reply("".join(text), calls, usage)


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
    choices = body.get("choices")
    msg = choices[0].get("message") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    msg = msg if isinstance(msg, dict) else {}
    text = msg.get("content") if isinstance(msg.get("content"), str) else ""
    calls = []
    for c in msg.get("tool_calls") or []:
        fn = c.get("function") if isinstance(c, dict) else None
        if isinstance(fn, dict):
            calls.append({"id": str(c.get("id") or ""), "name": str(fn.get("name") or ""),
                          "arguments": fn.get("arguments") or "{}"})
    u = body.get("usage") if isinstance(body.get("usage"), dict) else None
    if text:
        on_delta(text)
    return _reply(text, calls, {"input": u.get("prompt_tokens"), "output": u.get("completion_tokens")} if u else {})


def _anthropic_whole(body: dict[str, Any], on_delta: Delta) -> dict[str, Any]:
    """The neutral reply of a Messages body (``content`` blocks, ``usage``)."""
    blocks = [b for b in body.get("content") or [] if isinstance(b, dict)]
    text = "".join(b.get("text") or "" for b in blocks if b.get("type") == "text")
    calls = [{"id": str(b.get("id") or ""), "name": str(b.get("name") or ""),
              "arguments": json.dumps(b.get("input") or {})} for b in blocks if b.get("type") == "tool_use"]
    u = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    if text:
        on_delta(text)
    return _reply(text, calls, {"input": u.get("input_tokens"), "output": u.get("output_tokens")})


def _stream_error(sdk: str, resp: Any, message: str, body: Any) -> Exception:
    """The SDK's own ``APIError`` for an error sent inside a stream (as its typed stream raises)."""
    if sdk == "anthropic":
        import anthropic

        return anthropic.APIError(message, resp.http_request, body=body)
    import openai

    return openai.APIError(message, resp.http_request, body=body)


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
            text = "".join(b.text for b in r.content if b.type == "text")
            calls = [{"id": b.id, "name": b.name, "arguments": json.dumps(b.input)} for b in r.content if b.type == "tool_use"]
            return _reply(text, calls, {"input": r.usage.input_tokens, "output": r.usage.output_tokens})
        text_parts: list[str] = []
        blocks: dict[int, dict[str, Any]] = {}
        usage: dict[str, int] = {}
        for e in _chunks(self.client.messages, "anthropic", {**kw, "stream": True}):
            if WHOLE in e:  # the server ignored stream=true and sent the whole message
                return _anthropic_whole(e[WHOLE], on_delta)
            kind = e.get("type")
            if kind == "message_start":
                usage["input"] = ((e.get("message") or {}).get("usage") or {}).get("input_tokens")
            elif kind == "content_block_start" and (e.get("content_block") or {}).get("type") == "tool_use":
                b = e["content_block"]
                blocks[e.get("index", 0)] = {"id": b.get("id", ""), "name": b.get("name", ""), "arguments": ""}
            elif kind == "content_block_delta":
                d = e.get("delta") or {}
                if d.get("type") == "text_delta" and d.get("text"):
                    text_parts.append(d["text"])
                    on_delta(d["text"])
                elif d.get("type") == "input_json_delta" and e.get("index", 0) in blocks:
                    blocks[e.get("index", 0)]["arguments"] += d.get("partial_json") or ""
            elif kind == "message_delta":
                usage["output"] = (e.get("usage") or {}).get("output_tokens")
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
