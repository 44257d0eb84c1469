"""engrain under PydanticAI: durable runs of a PydanticAI agent inside an engrain run.

    from engrain.integrations.pydantic_ai import durable

    def support(task):
        with durable(agent):                          # the one-line change
            return agent.run_sync(task).output
    eg.run(support, "refund order 42", run_id="r-42")  # kill it, run it again: nothing paid twice

Extension points used, the ones PydanticAI's own durable-execution integrations
use: a ``WrapperModel`` (every model request passes through ``request`` with
its response) and a ``WrapperToolset`` (every tool call passes through
``call_tool``). Both are installed by a capability: ``get_wrapper_model``, which
PydanticAI calls with whichever model serves each request (the agent's, one
given at run time with ``run(model=...)``, an ``override``'s or a capability's),
and ``get_wrapper_toolset``, which it calls with the run's assembled toolset
(the agent's own tools and toolsets, and those given at run time with
``run(toolsets=...)``). So the block journals the model and the tools the run
really uses and never changes which ones those are.
The capability is added to each run the agent starts inside the block (its
``iter``, which ``run``, ``run_sync`` and ``run_stream`` go through).
Inside an engrain run a model request is an ``llm`` step and a tool call a
``tool`` step: on resume the recorded response or result is returned and the
provider or the tool is not called. Outside an engrain run they pass through.
A tool result that is not JSON is journaled, and returned live, as its ``str()``.
Streamed requests are not journaled: inside an engrain run they raise
:class:`~engrain.EngrainError` rather than run without durability.

:func:`cached` puts an agent behind the behavior cache: its plain tools become
tools of an engrain :class:`~engrain.Engine`, so a repeated task replays them
and returns the recorded output without any model request.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse
from pydantic_ai.models import Model
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.toolsets.wrapper import WrapperToolset

from .._durable.context import current
from .._errors import CacheError, EngrainError
from ._common import recordable

__all__ = ["DurableModel", "DurableToolset", "cached", "durable"]


def _dump(messages: list[Any]) -> list[Any]:
    return ModelMessagesTypeAdapter.dump_python(messages, mode="json")


class DurableModel(WrapperModel):
    """A model whose requests are journaled ``llm`` steps inside an engrain run."""

    async def request(self, messages, model_settings, model_request_parameters) -> ModelResponse:
        """The wrapped model's response; inside an engrain run a journaled step (replayed on resume)."""
        run = current()
        if run is None:
            return await self.wrapped.request(messages, model_settings, model_request_parameters)

        async def call() -> Any:
            response = await self.wrapped.request(messages, model_settings, model_request_parameters)
            return _dump([response])[0]

        name = self.wrapped.model_name
        recorded = await run.acall(f"llm:{name}", "llm", {"model": name, "messages": _dump(messages)}, call)
        return ModelMessagesTypeAdapter.validate_python([recorded])[0]

    @asynccontextmanager
    async def request_stream(self, messages, model_settings, model_request_parameters,
                             run_context=None) -> AsyncIterator[Any]:
        """The wrapped model's stream, outside runs only (inside one it raises: streams are not journaled yet)."""
        if current() is not None:
            raise EngrainError("durable(agent): streamed requests are not journaled yet; use run/run_sync "
                               "inside an engrain run")
        async with self.wrapped.request_stream(messages, model_settings, model_request_parameters,
                                               run_context) as stream:
            yield stream


class DurableToolset(WrapperToolset):
    """A toolset whose tool calls are journaled ``tool`` steps inside an engrain run."""

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
        """Call the tool; inside an engrain run a journaled step (its result replayed on resume)."""
        run = current()
        if run is None:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)

        async def call() -> Any:
            return recordable(await self.wrapped.call_tool(name, tool_args, ctx, tool))

        return await run.acall(f"tool:{name}", "tool", {"arguments": tool_args}, call)


@dataclass
class _DurableRun(AbstractCapability[Any]):
    """Wraps the model that serves each request of a run in a :class:`DurableModel`, and the run's
    toolset in a :class:`DurableToolset` (unless ``tools`` is False).

    PydanticAI calls ``get_wrapper_model`` for every attempt at a model request, with the model
    the run really uses, wherever it came from; so no model request of a durable run escapes
    the journal (``Agent.override(model=)`` would lose to, or replace, a model given at run time).
    ``get_wrapper_toolset`` likewise gets every toolset of the run at once: ``Agent.override(toolsets=)``
    replaced, and so silently dropped, the toolsets given at run time with ``run(toolsets=...)``.
    """

    tools: bool = True

    def get_wrapper_model(self, model: Model) -> Model | None:
        """``model`` journaled (``None``: it already is)."""
        return None if isinstance(model, DurableModel) else DurableModel(model)

    def get_wrapper_toolset(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any] | None:
        """``toolset`` journaled (``None``: it already is, or this block leaves tools to the cache)."""
        return None if not self.tools or isinstance(toolset, DurableToolset) else DurableToolset(toolset)


#: The agents inside a durable() block in this context (thread, task), by id: their runs get this capability.
_in_block: ContextVar[dict[int, _DurableRun]] = ContextVar("engrain_pydantic_ai_durable", default={})
#: id(agent) -> [open durable() blocks in any context, the instance ``iter`` it had before (or _NONE)].
_hooked: dict[int, list[Any]] = {}
_hooked_lock = threading.Lock()
_NONE = object()


def _hook_iter(agent: Agent[Any, Any]) -> None:
    """Make ``agent.iter`` add :class:`_DurableRun` to the runs started inside a durable() block.

    ``iter`` is where every run of the agent starts (``run``, ``run_sync``, ``run_stream`` call it)
    and the one place a capability can be added to a run without replacing the agent's own. It
    is set on the instance while any block on the agent is open, in any thread, and only runs
    started in a context inside a block get the capability; the last block to close restores it.
    """
    with _hooked_lock:
        entry = _hooked.get(id(agent))
        if entry is not None:
            entry[0] += 1
            return
        before = agent.__dict__.get("iter", _NONE)
        start = agent.iter

        @asynccontextmanager
        async def iter(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            capability = _in_block.get().get(id(agent))
            if capability is not None:
                kwargs["capabilities"] = [*(kwargs.get("capabilities") or ()), capability]
            async with start(*args, **kwargs) as run:
                yield run

        agent.iter = iter  # type: ignore[method-assign]
        _hooked[id(agent)] = [1, before]


def _unhook_iter(agent: Agent[Any, Any]) -> None:
    with _hooked_lock:
        entry = _hooked[id(agent)]
        entry[0] -= 1
        if entry[0]:
            return
        del _hooked[id(agent)]
        if entry[1] is _NONE:
            agent.__dict__.pop("iter", None)
        else:
            agent.iter = entry[1]  # type: ignore[method-assign]


@contextmanager
def durable(agent: Agent[Any, Any]) -> Iterator[Agent[Any, Any]]:
    """Within the block, ``agent``'s model requests and tool calls are journaled (inside an engrain run).

    Every model request is, whichever model serves it: the agent's, or one given at run time
    (``agent.run_sync(task, model=...)``); and every tool call, to the agent's tools or to
    toolsets given at run time (``toolsets=[...]``). The block does not change which model
    or tools a run uses.
    """
    with _block(agent, _DurableRun()):
        yield agent


@contextmanager
def _block(agent: Agent[Any, Any], capability: _DurableRun) -> Iterator[None]:
    _hook_iter(agent)
    token = _in_block.set({**_in_block.get(), id(agent): capability})
    try:
        yield
    finally:
        _in_block.reset(token)
        _unhook_iter(agent)


class _CachedToolset(WrapperToolset):
    """Tool calls go through the engine's recorded tools (by name)."""

    def __init__(self, wrapped: AbstractToolset[Any], recorded: dict[str, Callable[..., Any]]):
        super().__init__(wrapped)
        self._recorded = recorded

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
        fn = self._recorded.get(name)
        if fn is None:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        return fn(tool_args)


def _engine_tool(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The engine's tool for ``fn``: it takes the model's arguments as one JSON object."""

    # Synchronous, because the engine replays a hit without an event loop; an async tool runs on
    # its own loop in a worker thread (the agent's loop may be running in this one).
    def call(arguments: dict[str, Any]) -> Any:
        out = fn(**arguments)
        if inspect.isawaitable(out):
            import asyncio
            from concurrent.futures import ThreadPoolExecutor

            async def wait() -> Any:
                return await out

            with ThreadPoolExecutor(1) as pool:
                out = pool.submit(asyncio.run, wait()).result()
        return recordable(out)

    call.__name__ = call.__qualname__ = name
    return call


def cached(agent: Agent[Any, Any], engine: Any) -> Callable[[str], Any]:
    """The agent as an engine agent: ``engine.set_agent(cached(agent, engine)).finalize()``.

    Each plain tool of the agent (``@agent.tool_plain`` or a ``Tool`` without a
    ``RunContext``) is registered on ``engine``; ``engine(task)`` then records
    its tool trajectory on a miss and, on a hit, replays the tools and returns
    the recorded output with zero model requests. A tool that takes a
    ``RunContext`` cannot be replayed without the agent, so it is refused here.
    """
    from pydantic_ai.toolsets import FunctionToolset

    recorded: dict[str, Callable[..., Any]] = {}

    def register(ts: AbstractToolset[Any]) -> AbstractToolset[Any]:
        if isinstance(ts, FunctionToolset):
            for name, t in ts.tools.items():
                if t.takes_ctx:
                    raise CacheError(f"cached(agent): tool {name!r} takes a RunContext, so a cache hit could not "
                                     "replay it without the agent; make it a plain tool (tool_plain)")
                recorded[name] = engine.function(name=name)(_engine_tool(name, t.function))
        return ts

    for ts in agent.toolsets:
        ts.visit_and_replace(register)

    def run(task: str) -> Any:
        toolsets = [ts.visit_and_replace(lambda t: _CachedToolset(t, recorded)) for ts in agent.toolsets]
        # The engine records and replays the tools itself; only the model requests are journaled here.
        with _block(agent, _DurableRun(tools=False)), agent.override(toolsets=toolsets, tools=[]):
            return agent.run_sync(task).output

    return run
