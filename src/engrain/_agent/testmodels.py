"""Offline models for tests: :class:`TestModel` and :class:`FunctionModel` (public in ``engrain.testing``).

Each is a provider (``eg.Agent(..., model=TestModel())`` calls it in process,
no server, no SDK) and can also :meth:`~_TestingModel.serve` itself over HTTP in
the Chat Completions, Responses and Messages wire formats (the scripted-model
server of :mod:`.scripted`), for code that calls an SDK itself (``eg.wrap``).
Both ways, the model sees the same neutral conversation (:mod:`.wire_in`) and
decides the same reply, and counts the requests it got.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._errors import ConfigError
from .providers import Delta, Provider, _reply
from .schema_values import example_value
from .scripted import Reply, ScriptedModel, _args_json, _words
from .wire_in import conversation


class ScriptExhaustedError(RuntimeError):
    """A :class:`FunctionModel` given a list of replies got more requests than the list holds."""


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """What a test model knows about a request besides its messages.

    ``system`` is the system text; ``tools`` the tools offered, each
    ``{"name", "description", "parameters"}`` (a JSON schema); ``api`` how the
    request came: ``"agent"`` (in process, from ``eg.Agent``), ``"chat"``,
    ``"responses"`` or ``"messages"`` (over HTTP); ``model`` the model name asked for.
    """

    system: str = ""
    tools: list[dict[str, Any]] = field(default_factory=list)
    api: str = "agent"
    model: str = ""

    def tool(self, name: str) -> dict[str, Any] | None:
        """The offered tool called ``name``, or None."""
        return next((t for t in self.tools if t.get("name") == name), None)


Messages = list[dict[str, Any]]


class _TestingModel(Provider):
    """What both test models share: the provider side, the HTTP side and the request log."""

    name = "test"

    def __init__(self, model_name: str):
        super().__init__(model_name, None)
        #: Every request so far, in order: ``(messages, info)``.
        self.requests: list[tuple[Messages, AgentInfo]] = []
        self._lock = threading.Lock()

    @property
    def calls(self) -> int:
        """How many requests the model has answered (in process and over HTTP)."""
        return len(self.requests)

    def reset(self) -> None:
        """Forget the requests so far (``calls`` back to 0; a reply script starts over)."""
        with self._lock:
            self.requests.clear()

    def respond(self, messages: Messages, info: AgentInfo, n: int) -> Reply | str:
        """The reply to request number ``n`` (from 0); each test model decides its own way."""
        raise NotImplementedError

    def reply(self, messages: Messages, info: AgentInfo) -> Reply:
        """Log one request and decide its reply (what both the provider and the server call)."""
        with self._lock:
            n = len(self.requests)
            self.requests.append((messages, info))
        out = self.respond(messages, info, n)
        if isinstance(out, str):
            return Reply(text=out)
        if not isinstance(out, Reply):
            raise TypeError(f"{type(self).__name__}: a reply must be a str or a Reply (say(...), tool_call(...)), "
                            f"got {type(out).__name__}")
        return out

    # -- in process: the agent's provider ------------------------------------------------

    def complete(self, system: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 on_delta: Delta | None = None) -> dict[str, Any]:
        """Answer one model call of ``eg.Agent`` (streamed word by word to ``on_delta`` when given)."""
        msgs = [dict(m, tool_calls=[dict(c) for c in m["tool_calls"]]) if m.get("tool_calls") else dict(m)
                for m in messages]
        reply = self.reply(msgs, AgentInfo(system, [dict(t) for t in tools], "agent", self.model))
        if on_delta is not None:
            for piece in _words(reply.text):
                on_delta(piece)
        if reply.stream_error:
            raise RuntimeError(f"{type(self).__name__}: {reply.stream_error}")
        calls = [{"id": f"call_{os.urandom(8).hex()}", "name": name, "arguments": _args_json(args)}
                 for name, args in reply.calls]
        prompt = max(1, len(json.dumps(messages, default=str)) // 4)
        return _reply(reply.text, calls, {"input": prompt, "output": len(_words(reply.text)) + len(calls)})

    # -- over HTTP: the wire formats -------------------------------------------------------

    def serve(self, *, port: int = 0, chunk_delay: float = 0.0, first_token_delay: float = 0.0) -> ScriptedModel:
        """Start serving this model on 127.0.0.1 and return the server.

        Point an SDK at it: ``openai.OpenAI(base_url=server.openai_url,
        api_key="test")`` or ``anthropic.Anthropic(base_url=server.anthropic_url,
        api_key="test")``; ``eg.Agent(..., "openai:test", base_url=server.openai_url)``
        works too. Use it as a context manager (``with model.serve() as server:``)
        or call ``server.stop()``. Requests reach :meth:`reply` as the same neutral
        messages an in-process agent sends; a reply that raises answers HTTP 400
        with the error's text (the SDKs do not retry it).
        """

        def respond(api: str, body: dict[str, Any]) -> Reply:
            system, messages, tools = conversation(api, body)
            return self.reply(messages, AgentInfo(system, tools, api, str(body.get("model", ""))))

        return ScriptedModel(respond, port=port, chunk_delay=chunk_delay, first_token_delay=first_token_delay).start()


def _after_last_user(messages: Messages) -> Messages:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return messages[i + 1:]
    return list(messages)


def _parsed(text: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


class TestModel(_TestingModel):
    """A model that calls each tool once with schema-valid arguments, then answers.

    To the first request of a turn (nothing since the user's message) it calls
    every offered tool at once (or those named in ``call_tools``), each with
    arguments made up from the tool's JSON schema (``seed`` varies them). Once
    the tools answered, it replies with ``text``, by default a JSON object of
    each tool's result by tool name, so a test sees what the tools returned.
    With no tools to call it answers at once (``text``, default ``"success (no
    tool calls)"``). No network, no key, the same reply every time.

        agent = eg.Agent("support", TestModel(), tools=[lookup_order])
        assert agent.run("where is my order?").output == '{"lookup_order": {...}}'
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, *, call_tools: Iterable[str] | Literal["all"] = "all", text: str | None = None,
                 seed: int = 0, model_name: str = "test-model"):
        super().__init__(model_name)
        self.call_tools: list[str] | Literal["all"] = call_tools if call_tools == "all" else list(call_tools)
        self.text, self.seed = text, seed

    def arguments(self, tool: dict[str, Any]) -> dict[str, Any]:
        """The arguments this model sends ``tool`` (``{"name", "parameters", ...}``): valid for its schema."""
        try:
            args = example_value(tool.get("parameters") or {"type": "object"}, self.seed)
        except ValueError as e:
            raise ConfigError(f"TestModel: cannot make arguments for tool {tool.get('name')!r}: {e}") from None
        if not isinstance(args, dict):
            raise ConfigError(f"TestModel: tool {tool.get('name')!r} takes {type(args).__name__}, not an object")
        return args

    def respond(self, messages: Messages, info: AgentInfo, n: int) -> Reply:
        """Tool calls first, then a text answer (see the class docstring)."""
        since = _after_last_user(messages)
        results = [m for m in since if m.get("role") == "tool"]
        if not since:
            offered = [t["name"] for t in info.tools]
            wanted = offered if self.call_tools == "all" else self.call_tools
            missing = [w for w in wanted if w not in offered]
            if missing:
                raise ConfigError(f"TestModel: call_tools names {', '.join(map(repr, missing))}, which the request "
                                  f"does not offer (it offers: {', '.join(offered) or 'no tools'})")
            if wanted:
                return Reply(calls=[(name, self.arguments(info.tool(name) or {})) for name in wanted])
        if self.text is not None:
            return Reply(text=self.text)
        if not results:
            return Reply(text="success (no tool calls)")
        return Reply(text=json.dumps({m.get("name") or m.get("tool_call_id"): _parsed(m.get("content"))
                                      for m in results}, ensure_ascii=False, default=str))


Respond = Callable[[Messages, AgentInfo], "Reply | str"]


class FunctionModel(_TestingModel):
    """A model whose replies come from your Python function, or from a list of replies.

    ``function(messages, info)`` is called for each request with the
    conversation (``{"role": "user"|"assistant"|"tool", "content", ...}``; an
    assistant's ``tool_calls`` are ``[{"id", "name", "arguments"}]`` with
    arguments as JSON text; a tool message carries ``name``, ``tool_call_id``
    and ``error``) and an :class:`AgentInfo` (system text, tools offered), and
    returns the reply: a ``str`` (the final answer) or a :class:`Reply` from
    ``say(text)``, ``tool_call(name, **args)`` or ``tool_calls(...)``. Given a
    list instead, the N-th request gets the N-th reply; one more raises
    :class:`ScriptExhaustedError`.

        def plan(messages, info):
            if messages[-1]["role"] == "tool":
                return f"The order is {json.loads(messages[-1]['content'])['status']}."
            return tool_call("lookup_order", order_id=42)

        agent = eg.Agent("support", FunctionModel(plan), tools=[lookup_order])
    """

    def __init__(self, function: Respond | Sequence[Reply | str], *, model_name: str = "function-model"):
        super().__init__(model_name)
        if callable(function):
            self.function: Respond | None = function
            self.script: list[Reply | str] = []
        elif isinstance(function, Sequence) and not isinstance(function, (str, bytes)):
            bad = [r for r in function if not isinstance(r, (Reply, str))]
            if bad:
                raise ConfigError(f"FunctionModel: a scripted reply must be a str or a Reply, got {bad[0]!r}")
            self.function, self.script = None, list(function)
        else:
            raise ConfigError("FunctionModel: give a function (messages, info) -> reply, or a list of replies")

    def respond(self, messages: Messages, info: AgentInfo, n: int) -> Reply | str:
        """The function's reply, or the script's ``n``-th."""
        if self.function is not None:
            return self.function(messages, info)
        if n >= len(self.script):
            raise ScriptExhaustedError(f"FunctionModel: request {n + 1} of a {len(self.script)}-reply script")
        return self.script[n]
