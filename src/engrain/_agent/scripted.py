"""A scripted model: a local HTTP server that plays a script of LLM replies.

It speaks three wire formats, each with tool calls and SSE streaming, so the
real ``openai`` and ``anthropic`` SDKs can be pointed at it:

* OpenAI Chat Completions: ``POST /v1/chat/completions``
* OpenAI Responses: ``POST /v1/responses``
* Anthropic Messages: ``POST /v1/messages``

It is not a model: it answers the N-th request with the N-th reply of its
script (or with what a ``respond(api, body)`` function returns) and counts the
requests, which is what lets tests assert "0 LLM calls on a cache hit" or
"exactly N calls across a crash". The offline demo uses it too, and says so.

    with ScriptedModel([tool_call("lookup", order=42), say("Refunded.")]) as model:
        client = openai.OpenAI(base_url=model.openai_url, api_key="scripted")
        ...
        assert model.calls == 2

The whole API: :class:`Reply` (built by :func:`say` and :func:`tool_call` /
:func:`tool_calls`), :class:`ScriptedModel` (``start``/``stop``, ``url``,
``openai_url``, ``anthropic_url``, ``calls``, ``requests``, ``script``,
``first_text_sent``).
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Reply", "ScriptedModel", "say", "tool_call", "tool_calls"]


@dataclass(slots=True)
class Reply:
    """One model reply: text, tool calls, or both (public as ``engrain.testing.Reply``).

    ``calls`` holds ``(tool name, arguments)`` pairs; arguments are a dict, or a
    string sent verbatim (to script malformed arguments). ``stream_error`` makes a streamed Chat Completions or
    Messages reply break off after its text with an error event carrying that
    message, as a provider's stream does when it fails midway.
    """

    text: str = ""
    calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)
    stream_error: str = ""


def say(text: str) -> Reply:
    """A reply that is just ``text``."""
    return Reply(text=text)


def tool_call(name: str, /, **args: Any) -> Reply:
    """A reply that calls one tool with ``args``."""
    return Reply(calls=[(name, args)])


def tool_calls(*calls: tuple[str, dict[str, Any] | str], text: str = "") -> Reply:
    """A reply that calls several tools at once (the model asks for them in parallel)."""
    return Reply(text=text, calls=list(calls))


def _words(text: str) -> list[str]:
    """``text`` cut into streaming pieces (a word with its trailing space each)."""
    out, cur = [], ""
    for ch in text:
        cur += ch
        if ch == " ":
            out.append(cur)
            cur = ""
    if cur:
        out.append(cur)
    return out


def _args_json(args: dict[str, Any] | str) -> str:
    return args if isinstance(args, str) else json.dumps(args)


def _tokens(body: Any) -> int:
    return max(1, len(json.dumps(body)) // 4)


class ScriptedModel:
    """A scripted model server on 127.0.0.1 (see the module docstring).

    ``script`` is a list of :class:`Reply` played in order, or a function
    ``respond(api, body) -> Reply`` (``api`` is ``"chat"``, ``"responses"`` or
    ``"messages"``; ``body`` the request JSON). A request past the end of a list,
    or one the function raises on, gets HTTP 400 (not retried by the SDKs) with
    the reason, so a test sees it. ``engrain.testing``'s models serve through this.
    ``chunk_delay`` sleeps between streamed chunks; ``first_token_delay``
    before the first one (and before a non-streamed answer). ``ignore_stream``
    answers a streamed request with the whole JSON reply, as some compatible
    servers do.
    """

    def __init__(
        self,
        script: list[Reply] | Callable[[str, dict[str, Any]], Reply] | None = None,
        *,
        chunk_delay: float = 0.0,
        first_token_delay: float = 0.0,
        port: int = 0,
        ignore_stream: bool = False,
    ):
        self.script = script if script is not None else []
        self.ignore_stream = ignore_stream
        self.chunk_delay = chunk_delay
        self.first_token_delay = first_token_delay
        self.requests: list[tuple[str, dict[str, Any]]] = []
        #: ``time.monotonic()`` when each streamed reply's first text piece was flushed to the socket.
        self.first_text_sent: list[float] = []
        self._lock = threading.Lock()
        self._port = port
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> ScriptedModel:
        """Listen on 127.0.0.1 (a free port unless one was given) in a daemon thread."""
        model = self

        class Handler(_Handler):
            scripted = model

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted-model", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> ScriptedModel:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: the Anthropic SDK's ``base_url``."""
        assert self._server is not None, "ScriptedModel not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def openai_url(self) -> str:
        """``<url>/v1``: the OpenAI SDK's ``base_url``."""
        return self.url + "/v1"

    anthropic_url = url

    @property
    def calls(self) -> int:
        """Requests received so far (every API, streamed or not)."""
        return len(self.requests)

    # -- script ----------------------------------------------------------------

    def _next(self, api: str, body: dict[str, Any]) -> Reply | None:
        with self._lock:
            n = len(self.requests)
            self.requests.append((api, body))
        if callable(self.script):
            return self.script(api, body)
        return self.script[n] if n < len(self.script) else None


class _Handler(http.server.BaseHTTPRequestHandler):
    scripted: ScriptedModel
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Small writes (SSE chunks, headers then body) would otherwise wait on Nagle + delayed ACK: ~40 ms each.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args: Any) -> None:  # quiet: tests read stdout
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?")[0].rstrip("/")
        api = {"/v1/chat/completions": "chat", "/v1/responses": "responses", "/v1/messages": "messages"}.get(path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if api is None:
            return self._json(404, {"error": {"message": f"scripted model: no endpoint {path}", "type": "not_found"}})
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return self._json(400, {"error": {"message": "scripted model: body is not JSON", "type": "invalid_request"}})
        try:
            reply = self.scripted._next(api, body)
        except Exception as e:  # noqa: BLE001 - a respond function's error is the test's to see, as a 400
            msg = f"scripted model: {type(e).__name__}: {e}"
            return self._json(400, {"type": "error", "error": {"message": msg, "type": "invalid_request_error"}})
        if reply is None:
            n = self.scripted.calls
            msg = f"scripted model: script exhausted (request {n} of a {len(self.scripted.script)}-reply script)"
            return self._json(400, {"type": "error", "error": {"message": msg, "type": "invalid_request_error"}})
        model = str(body.get("model", "scripted"))
        fmt = {"chat": _Chat, "responses": _Responses, "messages": _Messages}[api](reply, model, _tokens(body))
        if body.get("stream") and not self.scripted.ignore_stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return self._stream(fmt.events(include_usage))
        if self.scripted.first_token_delay:
            time.sleep(self.scripted.first_token_delay)
        return self._json(200, fmt.whole())

    def _json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, events: Iterator[tuple[str | None, Any]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        delay, first = self.scripted.chunk_delay, self.scripted.first_token_delay
        texted = False
        try:
            for i, (name, data) in enumerate(events):
                if i == 1 and first:
                    time.sleep(first)
                elif i > 1 and delay:
                    time.sleep(delay)
                head = f"event: {name}\n" if name else ""
                payload = data if isinstance(data, str) else json.dumps(data)
                self.wfile.write(f"{head}data: {payload}\n\n".encode())
                self.wfile.flush()
                if not texted and _is_text(data):
                    texted = True
                    self.scripted.first_text_sent.append(time.monotonic())
        except (BrokenPipeError, ConnectionResetError):  # the client went away mid-stream
            pass


def _is_text(data: Any) -> bool:
    """Whether a streamed event carries a piece of reply text (in any of the three formats)."""
    if not isinstance(data, dict):
        return False
    if data.get("object") == "chat.completion.chunk":
        return bool(data["choices"] and data["choices"][0]["delta"].get("content"))
    return data.get("type") == "response.output_text.delta" or (
        data.get("type") == "content_block_delta" and data["delta"].get("type") == "text_delta")


def _id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(8).hex()}"


class _Chat:
    """OpenAI Chat Completions bodies for one reply."""

    def __init__(self, reply: Reply, model: str, prompt_tokens: int):
        self.r, self.model, self.prompt = reply, model, prompt_tokens
        self.id, self.created = _id("chatcmpl"), int(time.time())
        self.calls = [(_id("call"), name, _args_json(a)) for name, a in reply.calls]
        self.finish = "tool_calls" if reply.calls else "stop"
        done = len(_words(reply.text)) + sum(len(a) // 4 + 1 for *_, a in self.calls)
        self.usage = {"prompt_tokens": prompt_tokens, "completion_tokens": done, "total_tokens": prompt_tokens + done}

    def whole(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.r.text or None}
        if self.calls:
            msg["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in self.calls
            ]
        return {
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "message": msg, "finish_reason": self.finish, "logprobs": None}],
            "usage": self.usage,
        }

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> tuple[None, dict[str, Any]]:
        return None, {
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }

    def events(self, include_usage: bool) -> Iterator[tuple[str | None, Any]]:
        yield self._chunk({"role": "assistant", "content": ""})
        for w in _words(self.r.text):
            yield self._chunk({"content": w})
        if self.r.stream_error:
            yield None, {"error": {"message": self.r.stream_error, "type": "server_error", "code": None}}
            return
        for k, (cid, name, args) in enumerate(self.calls):
            head = {"index": k, "id": cid, "type": "function", "function": {"name": name, "arguments": ""}}
            yield self._chunk({"tool_calls": [head]})
            for piece in (args[: len(args) // 2], args[len(args) // 2 :]):
                yield self._chunk({"tool_calls": [{"index": k, "function": {"arguments": piece}}]})
        yield self._chunk({}, self.finish)
        if include_usage:
            yield None, {
                "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [], "usage": self.usage,
            }
        yield None, "[DONE]"


class _Responses:
    """OpenAI Responses bodies for one reply."""

    def __init__(self, reply: Reply, model: str, prompt_tokens: int):
        self.r, self.model, self.prompt = reply, model, prompt_tokens
        self.id, self.created = _id("resp"), int(time.time())
        self.items: list[dict[str, Any]] = []
        if reply.text:
            self.items.append({
                "type": "message", "id": _id("msg"), "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": reply.text, "annotations": [], "logprobs": []}],
            })
        for name, a in reply.calls:
            self.items.append({
                "type": "function_call", "id": _id("fc"), "call_id": _id("call"), "name": name,
                "arguments": _args_json(a), "status": "completed",
            })
        out = len(_words(reply.text)) + len(reply.calls)
        self.usage = {
            "input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": out, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + out,
        }

    def _response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "id": self.id, "object": "response", "created_at": self.created, "model": self.model, "status": status,
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "error": None, "incomplete_details": None, "instructions": None, "metadata": {},
            "temperature": None, "top_p": None, "usage": usage,
        }

    def whole(self) -> dict[str, Any]:
        return self._response("completed", self.items, self.usage)

    def events(self, include_usage: bool) -> Iterator[tuple[str | None, Any]]:
        seq = iter(range(1 << 30))

        def event(type_: str, **data: Any) -> tuple[str, dict[str, Any]]:
            return type_, {"type": type_, "sequence_number": next(seq), **data}

        yield event("response.created", response=self._response("in_progress", [], None))
        for i, item in enumerate(self.items):
            if item["type"] == "message":
                text = item["content"][0]["text"]
                yield event("response.output_item.added", output_index=i, item={**item, "status": "in_progress", "content": []})
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                yield event("response.content_part.added", item_id=item["id"], output_index=i, content_index=0, part=part)
                for w in _words(text):
                    yield event("response.output_text.delta", item_id=item["id"], output_index=i, content_index=0,
                                delta=w, logprobs=[])
                yield event("response.output_text.done", item_id=item["id"], output_index=i, content_index=0,
                            text=text, logprobs=[])
                yield event("response.content_part.done", item_id=item["id"], output_index=i, content_index=0,
                            part=item["content"][0])
            else:
                args = item["arguments"]
                yield event("response.output_item.added", output_index=i,
                            item={**item, "arguments": "", "status": "in_progress"})
                yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=i, delta=args)
                yield event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                            arguments=args, name=item["name"])
            yield event("response.output_item.done", output_index=i, item=item)
        yield event("response.completed", response=self.whole())


class _Messages:
    """Anthropic Messages bodies for one reply."""

    def __init__(self, reply: Reply, model: str, prompt_tokens: int):
        self.r, self.model, self.prompt = reply, model, prompt_tokens
        self.id = _id("msg")
        self.blocks: list[dict[str, Any]] = []
        if reply.text:
            self.blocks.append({"type": "text", "text": reply.text})
        for name, a in reply.calls:
            args = a if isinstance(a, dict) else {"_raw": a}  # Anthropic sends objects only
            self.blocks.append({"type": "tool_use", "id": _id("toolu"), "name": name, "input": args})
        self.stop = "tool_use" if reply.calls else "end_turn"
        self.out = len(_words(reply.text)) + len(reply.calls)

    def _message(self, content: list[dict[str, Any]], stop: str | None, out: int) -> dict[str, Any]:
        return {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
            "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": self.prompt, "output_tokens": out},
        }

    def whole(self) -> dict[str, Any]:
        return self._message(self.blocks, self.stop, self.out)

    def events(self, include_usage: bool) -> Iterator[tuple[str | None, Any]]:
        yield "message_start", {"type": "message_start", "message": self._message([], None, 1)}
        for i, b in enumerate(self.blocks):
            if b["type"] == "text":
                yield "content_block_start", {"type": "content_block_start", "index": i,
                                              "content_block": {"type": "text", "text": ""}}
                for w in _words(b["text"]):
                    yield "content_block_delta", {"type": "content_block_delta", "index": i,
                                                  "delta": {"type": "text_delta", "text": w}}
                if self.r.stream_error:
                    yield "error", {"type": "error", "error": {"type": "overloaded_error",
                                                               "message": self.r.stream_error}}
                    return
            else:
                yield "content_block_start", {"type": "content_block_start", "index": i,
                                              "content_block": {**b, "input": {}}}
                args = json.dumps(b["input"])
                for piece in (args[: len(args) // 2], args[len(args) // 2 :]):
                    yield "content_block_delta", {"type": "content_block_delta", "index": i,
                                                  "delta": {"type": "input_json_delta", "partial_json": piece}}
            yield "content_block_stop", {"type": "content_block_stop", "index": i}
        yield "message_delta", {"type": "message_delta", "delta": {"stop_reason": self.stop, "stop_sequence": None},
                                "usage": {"output_tokens": self.out}}
        yield "message_stop", {"type": "message_stop"}
