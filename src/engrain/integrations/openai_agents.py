"""engrain under the OpenAI Agents SDK: durable sessions, and durable runs of SDK agents.

    from agents import Agent, Runner
    from engrain.integrations.openai_agents import EngrainSession, durable

    session = EngrainSession("user-42")                       # conversation history in the engrain store
    result = Runner.run_sync(agent, "hi", session=session)

    def support(task):                                        # an engrain durable run around Runner.run
        return Runner.run_sync(durable(agent), task).final_output
    eg.run(support, "refund order 42", run_id="r-42")         # kill it, run it again: nothing paid twice

Extension points used, and why:

* **Sessions**: the SDK's ``Session`` protocol (``get_items``, ``add_items``,
  ``pop_item``, ``clear_session``). A session is an engrain run
  (``openai-agents:<session_id>``; an id too long for a run id ends in its
  SHA-256 instead) whose items are ``log.entry`` events, so it is
  durable on SQLite or PostgreSQL and listed by ``engrain runs``. Inside an
  engrain run each session operation is also a step, so a resumed run sees the
  history its first attempt saw and never adds its items twice.
* **Model calls**: a ``Model`` wrapper (the SDK's model interface), because it is
  the one place every model call of every agent passes through with its full
  response in hand; tracing processors and hooks see calls but cannot answer
  them from the journal. Inside an engrain run each ``get_response`` is an
  ``llm`` step: on resume the recorded response is returned and the provider is
  not called. The SDK prefers ``RunConfig.model`` to the agent's model, so
  :func:`durable_run_config` wraps a run config's model and provider too, and a
  durable agent's hooks (``AgentHooks.on_llm_end``, before any tool of the
  response runs) raise :class:`NotDurableError` on a response that bypassed the
  journal inside an engrain run.
* **Tools**: each ``FunctionTool``'s ``on_invoke_tool`` is wrapped (the SDK's
  tool object), so a tool call is a ``tool`` step: a finished call is replayed
  from the journal, not run again. A tool result that is not JSON is journaled,
  and returned live, as its ``str()`` so that a replay gives the model the same text.

* **Behavior cache**: :func:`cached` registers each ``FunctionTool`` as a tool of
  an engrain :class:`~engrain.Engine`, so a repeated task replays its tool
  trajectory with no model call at all (the engine never calls the agent).

Outside an engrain run the wrappers pass every call through unchanged.
Streamed runs (``Runner.run_streamed``) are not journaled: inside an engrain run
they raise :class:`~engrain.EngrainError` rather than run without durability.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import json
import weakref
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, AgentHooks, FunctionTool, Model, ModelProvider, ModelResponse, RunConfig, Usage
from agents.items import TResponseInputItem
from agents.memory.session_settings import SessionSettings
from agents.models.multi_provider import MultiProvider
from pydantic import TypeAdapter

from .._durable.context import current, default_journal, idempotency_key
from .._durable.log import EntryLog
from .._errors import EngrainError, NotDurableError, NotJSONError
from .._journal import Journal, open_journal
from ._common import log_run_id, recordable, tool_arguments

__all__ = ["DurableModel", "DurableModelProvider", "EngrainSession", "NotDurableError", "cached", "durable",
           "durable_run_config"]

RUN_PREFIX = "openai-agents:"
TAG = "openai-agents"


def _jsonable(value: Any) -> Any:
    """A JSON copy of SDK input/output (pydantic models and TypedDicts alike)."""
    return json.loads(json.dumps(value, default=lambda o: o.model_dump(mode="json") if hasattr(o, "model_dump")
                                 else str(o)))


def _session_items(items: list[Any]) -> list[Any]:
    """``items`` as JSON, as ``SQLiteSession`` stores them (``json.dumps``: a tuple becomes a list), or
    :class:`~engrain.NotJSONError` naming the first item that is not JSON. A pydantic model (an SDK
    output item) is stored as its JSON dump."""
    out = []
    for i, item in enumerate(items):
        where = f"EngrainSession.add_items: items[{i}]"

        def default(o: Any) -> Any:
            if hasattr(o, "model_dump"):
                return o.model_dump(mode="json")
            raise NotJSONError(where, "a value", o)

        try:
            out.append(json.loads(json.dumps(item, default=default, allow_nan=False)))
        except ValueError as e:  # NaN or infinity: JSON has no such number, and the journal stores JSON
            raise NotJSONError(where, "a number", item, f"is not JSON ({e})") from None
    return out


def _step_key() -> str | None:
    """The idempotency key of the run's session step running now (None outside runs: inside a tool's step
    the key is the tool's, shared by every change the tool makes)."""
    return idempotency_key() if current() is not None else None


def _done(entries: list[Any], key: str | None) -> Any:
    """The entry a session step with ``key`` appended already, if any. A process killed after the
    session's append and before the run journaled the step runs the step again on resume: the
    change is found here and not made twice (items added twice, a second item popped)."""
    if key is None:
        return None
    return next((e for e in reversed(entries) if e.data.get("key") == key), None)


class EngrainSession:
    """The SDK's ``Session`` protocol on the engrain store: history survives restarts and is shared by processes.

    ``url`` picks the store (default: ``ENGRAIN_URL`` or ``./.engrain/``), or pass
    an open ``journal``. ``pop_item`` and ``clear_session`` append a marker instead
    of rewriting history, so every change is one atomic append.
    """

    def __init__(self, session_id: str, url: str | None = None, *, journal: Journal | None = None,
                 session_settings: SessionSettings | None = None):
        if not isinstance(session_id, str) or not session_id:
            raise EngrainError("EngrainSession: session_id must be a non-empty string")
        self.session_id = session_id
        self.session_settings = session_settings
        self.journal = journal or (open_journal(url) if url else default_journal())
        # A session id too long for a run id gets its digest (log_run_id): the SDK accepts any id.
        self._log = EntryLog(self.journal, log_run_id(RUN_PREFIX, session_id),
                             task=f"OpenAI Agents session {session_id}",
                             tags=[TAG], agent="openai-agents", inputs={"session_id": session_id})

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The history in order; with ``limit``, its latest ``limit`` items.

        As the SDK's ``SQLiteSession``: ``limit=0`` gives no items and a negative ``limit``
        all of them (SQLite reads a negative ``LIMIT`` as none).
        """
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit

        async def read() -> list[Any]:
            items = self._items_of(await asyncio.to_thread(self._log.entries))
            if limit is None or limit < 0:
                return items
            return items[-limit:] if limit > 0 else []

        return await self._step("get_items", {"limit": limit}, read)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` to the history (one atomic append).

        An item that is not JSON (a ``datetime`` in it, say) raises :class:`~engrain.NotJSONError`, a
        ``TypeError`` as ``SQLiteSession`` raises, and nothing is added: it is never stored as some
        other value than the one given.
        """
        if not items:
            return
        data = {"items": _session_items(items), "summary": {"added": len(items)}}

        async def add() -> None:
            key = _step_key()
            if key is None:
                await asyncio.to_thread(self._log.append, [("items", data)])
            else:
                await asyncio.to_thread(self._log.update, lambda e: [] if _done(e, key) else [("items", {**data, "key": key})])

        await self._step("add_items", {"count": len(items)}, add)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item (``None`` when empty); two concurrent pops never return the same one."""
        popped: list[Any] = []

        def decide(entries: list[Any], key: str | None) -> list[tuple[str, dict[str, Any]]]:
            popped.clear()
            done = _done(entries, key)
            if done is not None:  # this step's pop, made before a crash lost its result: not a second one
                popped.extend(done.data.get("item", [None])[:1])
                return []
            live = self._items_of(entries)
            if not live:
                return []
            popped.append(live[-1])
            return [("pop", {"summary": {"popped": 1}, **({"key": key, "item": [live[-1]]} if key else {})})]

        async def pop() -> Any:
            key = _step_key()
            await asyncio.to_thread(self._log.update, lambda e: decide(e, key))
            return popped[0] if popped else None

        return await self._step("pop_item", {}, pop)

    @staticmethod
    def _items_of(entries: list[Any]) -> list[Any]:
        """The live items: those added, minus those popped or cleared since."""
        live: list[Any] = []
        for e in entries:
            if e.name == "items":
                live += e.data["items"]
            elif e.name == "pop" and live:
                live.pop()
            elif e.name == "clear":
                live = []
        return live

    async def clear_session(self) -> None:
        """Forget every item (the record of what was said stays in the journal until ``engrain gc``)."""
        async def clear() -> None:
            key = _step_key()
            entry = {"summary": {"cleared": True}, **({"key": key} if key else {})}
            await asyncio.to_thread(self._log.update, lambda e: [] if _done(e, key) else [("clear", entry)])

        await self._step("clear_session", {}, clear)

    async def _step(self, op: str, args: dict[str, Any], thunk: Any) -> Any:
        """Inside an engrain run a session operation is a step: a resumed run reads the history its
        first attempt read and does not add its items twice. Outside a run it just runs."""
        run = current()
        if run is None:
            return await thunk()
        return await run.acall(f"session.{op}", "tool", {"session_id": self.session_id, **args}, thunk)


# -- durable runs -------------------------------------------------------------------------

def _response_to_json(r: ModelResponse) -> dict[str, Any]:
    u = r.usage
    return {
        "output": [o.model_dump(mode="json") for o in r.output],
        "usage": {"requests": u.requests, "input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
                  "total_tokens": u.total_tokens},
        "response_id": r.response_id,
    }


def _response_from_json(d: dict[str, Any]) -> ModelResponse:
    from openai.types.responses import ResponseOutputItem

    items = TypeAdapter(list[ResponseOutputItem]).validate_python(d["output"])
    return ModelResponse(output=items, usage=Usage(**d["usage"]), response_id=d.get("response_id"))


class DurableModel(Model):
    """A ``Model`` whose ``get_response`` is a journaled ``llm`` step inside an engrain run."""

    def __init__(self, inner: Model | None = None, *, name: str | None = None, provider: ModelProvider | None = None):
        if inner is None and provider is None:
            provider = MultiProvider()
        if isinstance(provider, DurableModelProvider):
            provider = provider.inner  # its models are DurableModels: this one would journal each call twice
        self._inner, self._provider, self.name = inner, provider, name or getattr(inner, "model", None) or "default"

    def _model(self) -> Model:
        if self._inner is None:
            assert self._provider is not None
            # Resolved on first use, so building a durable agent needs no API key.
            self._inner = self._provider.get_model(None if self.name == "default" else self.name)
        return self._inner

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, *, previous_response_id, conversation_id, prompt) -> ModelResponse:
        """The wrapped model's response; inside an engrain run a journaled step (replayed on resume)."""
        async def respond() -> ModelResponse:
            return await self._model().get_response(
                system_instructions, input, model_settings, tools, output_schema, handoffs, tracing,
                previous_response_id=previous_response_id, conversation_id=conversation_id, prompt=prompt,
            )

        async def call() -> dict[str, Any]:
            return _response_to_json(await respond())

        run = current()
        if run is None:
            return await respond()  # outside a run: the model's own response, untouched
        # Inside a run the live call returns the journaled form too, so a first run and its replay agree.
        args = {"model": self.name, "instructions": system_instructions, "input": _jsonable(input)}
        response = _response_from_json(await run.acall(f"llm:{self.name}", "llm", args, call))
        _journaled[id(response)] = response  # what _DurableHooks.on_llm_end checks the SDK's response against
        return response

    def stream_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs, tracing,
                        *, previous_response_id, conversation_id, prompt) -> AsyncIterator[Any]:
        """The wrapped model's stream, outside runs only (inside one it raises: streams are not journaled yet)."""
        if current() is not None:
            raise EngrainError("durable(agent): streamed runs are not journaled yet; use Runner.run or run_sync "
                               "inside an engrain run")
        return self._model().stream_response(
            system_instructions, input, model_settings, tools, output_schema, handoffs, tracing,
            previous_response_id=previous_response_id, conversation_id=conversation_id, prompt=prompt,
        )


#: Responses DurableModel returned inside an engrain run (by id, held weakly): a response the SDK hands
#: to on_llm_end that is not here came from a model that bypassed the journal.
_journaled: weakref.WeakValueDictionary[int, ModelResponse] = weakref.WeakValueDictionary()


class DurableModelProvider(ModelProvider):
    """A ``ModelProvider`` whose models are ``inner``'s (default: ``MultiProvider``), each in a :class:`DurableModel`.

    ``RunConfig(model_provider=...)`` resolves every model named by a string; :func:`durable_run_config`
    puts one there.
    """

    def __init__(self, inner: ModelProvider | None = None):
        self.inner = inner.inner if isinstance(inner, DurableModelProvider) else inner or MultiProvider()

    def get_model(self, model_name: str | None) -> Model:
        """``model_name`` of the inner provider, journaled (resolved on first use)."""
        return DurableModel(name=model_name, provider=self.inner)

    async def aclose(self) -> None:
        """Close the inner provider."""
        await self.inner.aclose()


def durable_run_config(run_config: RunConfig | None = None) -> RunConfig:
    """A copy of ``run_config`` (default: ``RunConfig()``) whose model and model provider are journaled.

    The SDK prefers ``RunConfig.model`` to every agent's own model, so a durable agent run with
    ``RunConfig(model=...)`` would call that model unjournaled; pass the config through this::

        Runner.run_sync(durable(agent), task, run_config=durable_run_config(RunConfig(model=m)))

    Forgetting it is not silent: inside an engrain run the durable agent raises
    :class:`NotDurableError` on the first response that did not come through the journal.
    """
    rc = run_config if run_config is not None else RunConfig()
    model = rc.model
    if isinstance(model, Model) and not isinstance(model, DurableModel):
        model = DurableModel(model)
    elif isinstance(model, str):
        model = DurableModel(name=model, provider=rc.model_provider)
    return dataclasses.replace(rc, model=model, model_provider=DurableModelProvider(rc.model_provider))


class _DurableHooks(AgentHooks):
    """A durable agent's hooks: the agent's own, and a check that each model response inside an engrain
    run came through the journal (a ``RunConfig(model=...)`` replaces the agent's DurableModel)."""

    def __init__(self, inner: Any):
        self.inner = inner

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        """Refuse a response that bypassed the journal (before any tool of it runs), then the agent's hook."""
        if current() is not None and _journaled.get(id(response)) is not response:
            raise NotDurableError(
                f"durable(agent): agent {getattr(agent, 'name', '?')!r} got a model response that was not journaled, "
                "so a resumed run would call the model again; the run's RunConfig names a model (or a provider) "
                "that is not durable: pass it through durable_run_config(run_config)")
        if self.inner is not None:
            await self.inner.on_llm_end(context, agent, response)

    async def on_start(self, context: Any, agent: Any) -> None:
        """The agent's own hook."""
        if self.inner is not None:
            await self.inner.on_start(context, agent)

    async def on_end(self, context: Any, agent: Any, output: Any) -> None:
        """The agent's own hook."""
        if self.inner is not None:
            await self.inner.on_end(context, agent, output)

    async def on_handoff(self, context: Any, agent: Any, source: Any) -> None:
        """The agent's own hook."""
        if self.inner is not None:
            await self.inner.on_handoff(context, agent, source)

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        """The agent's own hook."""
        if self.inner is not None:
            await self.inner.on_tool_start(context, agent, tool)

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        """The agent's own hook."""
        if self.inner is not None:
            await self.inner.on_tool_end(context, agent, tool, result)

    async def on_llm_start(self, context: Any, agent: Any, system_prompt: Any, input_items: Any) -> None:
        """The agent's own hook."""
        if self.inner is not None:
            await self.inner.on_llm_start(context, agent, system_prompt, input_items)


def _durable_tool(tool: Any) -> Any:
    if not isinstance(tool, FunctionTool):
        return tool  # hosted tools (web search, ...) run at the provider: their results come back in the response
    invoke = tool.on_invoke_tool

    async def on_invoke_tool(ctx: Any, arguments: str) -> Any:
        async def call() -> Any:
            return recordable(await invoke(ctx, arguments))

        run = current()
        if run is None:
            return await invoke(ctx, arguments)
        return await run.acall(f"tool:{tool.name}", "tool", {"arguments": tool_arguments(arguments)}, call)

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)


def durable(agent: Agent, *, model_provider: ModelProvider | None = None) -> Agent:
    """A copy of ``agent`` (and of the agents it hands off to) whose model calls and tool calls are journaled.

    Run it with ``Runner.run``/``run_sync`` inside :func:`engrain.run`. A model
    named by a string (or the default model) is resolved through
    ``model_provider`` (default: the SDK's ``MultiProvider``) on first use.
    A ``RunConfig(model=...)`` overrides every agent's model: give the run
    ``durable_run_config(run_config)``; inside an engrain run a response from
    a model that is not journaled raises :class:`NotDurableError`.
    """
    seen: dict[int, Agent] = {}

    def wrap(a: Agent) -> Agent:
        if id(a) in seen:
            return seen[id(a)]
        model = a.model if isinstance(a.model, DurableModel) else (
            DurableModel(a.model) if isinstance(a.model, Model) else DurableModel(name=a.model, provider=model_provider)
        )
        hooks = a.hooks if isinstance(a.hooks, _DurableHooks) else _DurableHooks(a.hooks)
        clone = a.clone(model=model, tools=[_durable_tool(t) for t in a.tools], hooks=hooks)
        seen[id(a)] = clone
        clone.handoffs = [wrap(h) if isinstance(h, Agent) else h for h in a.handoffs]
        return clone

    return wrap(agent)


# -- behavior cache -----------------------------------------------------------------------

#: The SDK's ToolContext of the call in flight, so a tool run by the agent gets the real one.
_tool_ctx: contextvars.ContextVar[Any] = contextvars.ContextVar("engrain_sdk_tool_ctx", default=None)


def _engine_tool(tool: Any, engine: Any) -> Any:
    if not isinstance(tool, FunctionTool):
        return tool
    invoke, name = tool.on_invoke_tool, tool.name

    async def call(arguments: Any) -> Any:
        from agents.tool_context import ToolContext

        ctx = _tool_ctx.get()
        raw = json.dumps(arguments)
        if ctx is None:  # replayed by the engine: the agent (and its run context) is not running
            ctx = ToolContext(context=None, tool_name=name, tool_call_id="engrain-replay", tool_arguments=raw)
        return recordable(await invoke(ctx, raw))

    call.__name__ = call.__qualname__ = name
    recorded = engine.function(name=name)(call)

    async def on_invoke_tool(ctx: Any, arguments: str) -> Any:
        token = _tool_ctx.set(ctx)
        try:
            return await recorded(tool_arguments(arguments))
        finally:
            _tool_ctx.reset(token)

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)


def cached(agent: Agent, engine: Any, *, model_provider: ModelProvider | None = None) -> Agent:
    """A copy of ``agent`` whose tools are ``engine``'s tools and whose model calls are journaled.

    Give the engine an agent that runs it, then call the engine::

        engine = eg.Engine()
        sdk_agent = cached(agent, engine)
        async def run(task):
            return (await Runner.run(sdk_agent, task)).final_output
        engine.set_agent(run).finalize()
        out = await engine("refund order 42")    # a hit replays the tools: 0 model calls

    The first run of a task records its tool trajectory; a repeat replays the
    tools (each checked by the engine's pre/post checks if declared) and
    returns the recorded output without calling the model.
    """
    durable_agent = durable(agent, model_provider=model_provider)
    return durable_agent.clone(tools=[_engine_tool(t, engine) for t in agent.tools])
