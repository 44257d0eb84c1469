"""``engrain.wrap(client)``: durable LLM calls for users' own OpenAI/Anthropic clients.

Inside a durable run, ``chat.completions.create``, ``responses.create`` and
``messages.create`` become journaled LLM steps: the response (or, when
``stream=True``, every streamed event) is recorded, and on resume the recorded
objects are rebuilt with the SDK's own types instead of calling the API again.
Outside a run, and for every other attribute, the wrapper passes through
(``with_options``/``copy`` return a wrapped client). The ``.stream()`` helpers
(``chat.completions.stream``, ``responses.stream``, ``messages.stream``) are
not journaled: use ``create(..., stream=True)`` inside runs.

A streamed call's step completes when the stream is read to its end; a stream
cut short (a crash, or the caller stopping early) is called again on resume.
"""

from __future__ import annotations

import importlib
from typing import Any

from .._durable.context import RunContext, StepRecord, _Pending, _replay, current
from .._errors import ConfigError
from .._events import is_json

# endpoint path -> (response type, stream event type), as "module:attribute" of the SDK
_OPENAI = {
    "chat.completions.create": ("openai.types.chat:ChatCompletion", "openai.types.chat:ChatCompletionChunk"),
    "responses.create": ("openai.types.responses:Response", "openai.types.responses:ResponseStreamEvent"),
}
_ANTHROPIC = {
    "messages.create": ("anthropic.types:Message", "anthropic.types:RawMessageStreamEvent"),
}


def _type(ref: str) -> Any:
    mod, attr = ref.split(":")
    return getattr(importlib.import_module(mod), attr)


def _dump(obj: Any) -> Any:
    return obj.model_dump(mode="json") if hasattr(obj, "model_dump") else obj


def _request(kw: dict[str, Any]) -> dict[str, Any]:
    """The JSON part of the call's keyword arguments, recorded as the step's arguments."""
    return {k: v for k, v in kw.items() if is_json(v)}


class _Spec:
    def __init__(self, sdk: str, endpoints: dict[str, tuple[str, str]], is_async: bool):
        self.sdk, self.endpoints, self.is_async = sdk, endpoints, is_async
        self.prefixes = {p[: i] for p in endpoints for i in range(len(p)) if p[i] == "."}

    def build(self, ref: str, data: Any) -> Any:
        construct = importlib.import_module(f"{self.sdk}._models").construct_type
        return construct(type_=_type(ref), value=data)


class Wrapped:
    """A proxy for an SDK client (or one of its resources) that journals LLM calls inside runs."""

    __slots__ = ("_target", "_path", "_spec")

    def __init__(self, target: Any, path: str, spec: _Spec):
        self._target, self._path, self._spec = target, path, spec

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        full = f"{self._path}.{name}" if self._path else name
        if full in self._spec.endpoints:
            return _method(attr, full, self._spec)
        if full in self._spec.prefixes:
            return Wrapped(attr, full, self._spec)
        if full in ("with_options", "copy"):  # a configured copy of the client stays wrapped
            spec = self._spec
            return lambda *a, **kw: Wrapped(attr(*a, **kw), "", spec)
        return attr

    def __repr__(self) -> str:
        return f"<engrain.wrap {self._target!r}>"


def _begin(ctx: RunContext, name: str, kw: dict[str, Any]) -> StepRecord | _Pending:
    return ctx._begin(name, "llm", _request(kw))


def _method(fn: Any, path: str, spec: _Spec) -> Any:
    name = f"{spec.sdk}.{path}"
    whole_t, event_t = spec.endpoints[path]

    def finish(ctx: RunContext, step: _Pending, value: Any) -> None:
        ctx._complete(step, value)

    if spec.is_async:

        async def acreate(*args: Any, **kw: Any) -> Any:
            ctx = current()
            if ctx is None:
                return await fn(*args, **kw)
            step = _begin(ctx, name, kw)
            if isinstance(step, StepRecord):
                rec = _replay(step)
                if kw.get("stream"):
                    return _AsyncStream(None, [spec.build(event_t, e) for e in rec["events"]], ctx, step)
                return spec.build(whole_t, rec["response"])
            try:
                out = await fn(*args, **kw)
            except Exception as e:
                ctx._fail(step, e)
                raise
            if kw.get("stream"):
                return _AsyncStream(out, None, ctx, step)
            finish(ctx, step, {"response": _dump(out)})
            return out

        return acreate

    def create(*args: Any, **kw: Any) -> Any:
        ctx = current()
        if ctx is None:
            return fn(*args, **kw)
        step = _begin(ctx, name, kw)
        if isinstance(step, StepRecord):
            rec = _replay(step)
            if kw.get("stream"):
                return _Stream(None, [spec.build(event_t, e) for e in rec["events"]], ctx, step)
            return spec.build(whole_t, rec["response"])
        try:
            out = fn(*args, **kw)
        except Exception as e:
            ctx._fail(step, e)
            raise
        if kw.get("stream"):
            return _Stream(out, None, ctx, step)
        finish(ctx, step, {"response": _dump(out)})
        return out

    return create


class _StreamBase:
    def __init__(self, live: Any, recorded: list[Any] | None, ctx: RunContext, step: Any):
        self._live, self._recorded, self._ctx, self._step = live, recorded, ctx, step
        self._events: list[Any] = []
        self._done = False
        self._it: Any = None
        self.replayed = recorded is not None

    def _record(self, event: Any) -> Any:
        self._events.append(_dump(event))
        return event

    def _end(self) -> None:
        if not self._done and self._live is not None:
            self._done = True
            self._ctx._complete(self._step, {"events": self._events})

    def _fail(self, e: Exception) -> None:
        if not self._done and self._live is not None:
            self._done = True
            self._ctx._fail(self._step, e)

    def __getattr__(self, name: str) -> Any:  # .response, .close() ... of the SDK's stream
        if self._live is None:
            raise AttributeError(name)
        return getattr(self._live, name)


class _Stream(_StreamBase):
    """The SDK's stream, recorded as it is read (or the recorded events, replayed)."""

    def __iter__(self) -> Any:
        if self._it is None:  # one pass, shared by for-loops and next()
            self._it = self._events_gen()
        return self._it

    def __next__(self) -> Any:
        return next(iter(self))

    def _events_gen(self) -> Any:
        if self._recorded is not None:
            yield from self._recorded
            return
        try:
            for event in self._live:
                yield self._record(event)
        except Exception as e:
            self._fail(e)
            raise
        self._end()

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.close()

    def close(self) -> None:
        if self._live is not None:
            self._live.close()


class _AsyncStream(_StreamBase):
    """Async :class:`_Stream`."""

    def __aiter__(self) -> Any:
        if self._it is None:
            self._it = self._events_gen()
        return self._it

    async def __anext__(self) -> Any:
        return await self.__aiter__().__anext__()

    async def _events_gen(self) -> Any:
        if self._recorded is not None:
            for event in self._recorded:
                yield event
            return
        try:
            async for event in self._live:
                yield self._record(event)
        except Exception as e:
            self._fail(e)
            raise
        self._end()

    async def __aenter__(self) -> _AsyncStream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._live is not None:
            await self._live.close()

    async def close(self) -> None:
        if self._live is not None:
            await self._live.close()


def wrap(client: Any) -> Any:
    """Make ``client``'s LLM calls durable steps inside runs (``openai.OpenAI``/``AsyncOpenAI``,
    ``anthropic.Anthropic``/``AsyncAnthropic``); see :mod:`engrain._agent.wrap`."""
    root = type(client).__module__.split(".")[0]
    if root == "openai":
        import openai

        if isinstance(client, (openai.OpenAI, openai.AsyncOpenAI)):
            return Wrapped(client, "", _Spec("openai", _OPENAI, isinstance(client, openai.AsyncOpenAI)))
    if root == "anthropic":
        import anthropic

        if isinstance(client, (anthropic.Anthropic, anthropic.AsyncAnthropic)):
            return Wrapped(client, "", _Spec("anthropic", _ANTHROPIC, isinstance(client, anthropic.AsyncAnthropic)))
    raise ConfigError(
        f"engrain.wrap: cannot wrap {type(client).__module__}.{type(client).__qualname__}; "
        "pass an openai.OpenAI, openai.AsyncOpenAI, anthropic.Anthropic or anthropic.AsyncAnthropic"
    )
