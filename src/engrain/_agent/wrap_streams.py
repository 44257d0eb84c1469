"""The streams ``engrain.wrap`` returns for ``stream=True`` calls and the SDKs' ``.stream()`` helpers.

A first run's stream is the SDK's own, read through: each event is recorded as it
is read and the step completes with them all. A replayed stream yields the
recorded events, rebuilt with the SDK's types. Either way user code gets what
the SDK's ``Stream``/``AsyncStream`` offers and code reads from it: iteration
(``for``, ``next``, ``async for``), ``with``/``async with``, ``close()`` (and the
async ``aclose()``) and ``response`` (on replay, one with no headers and status
200: the SDK raises for any other status before it returns a stream). They are
not subclasses of the SDK's classes, whose constructors want a live HTTP response.

The step completes at the stream's last event, not only at its end: a chunk
that finishes every choice (Chat Completions), ``response.completed`` (or
``.incomplete``/``.failed``/``error``, Responses), ``message_stop`` (Messages).
The events after it (a usage chunk) are read at once, before that event is
handed over, so a loop that stops there (``if event.type == "message_stop":
break``) has its step journaled and is not paid again on resume. A stream left
before its last event completes nothing, and is called again on resume.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from .._durable.context import RunContext
from .wrap_errors import recorded

# Responses API events after which nothing of the reply is left to come.
_RESPONSES_END = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})


def dump(obj: Any) -> Any:
    """An SDK object as the JSON the journal records."""
    return obj.model_dump(mode="json") if hasattr(obj, "model_dump") else obj


def last_event(endpoint: str, request: dict[str, Any]) -> Callable[[Any], bool]:
    """A check, for the stream of ``endpoint`` asked with ``request``, that is True from its last event on."""
    if endpoint == "chat.completions.create":
        n = request.get("n")
        wanted = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
        finished: set[Any] = set()

        def chat(event: Any) -> bool:
            for choice in getattr(event, "choices", None) or ():
                if getattr(choice, "finish_reason", None):
                    finished.add(getattr(choice, "index", 0))
            return len(finished) >= wanted

        return chat
    if endpoint == "responses.create":
        return lambda event: getattr(event, "type", None) in _RESPONSES_END
    if endpoint == "messages.create":
        return lambda event: getattr(event, "type", None) == "message_stop"
    return lambda event: False


class _ReplayedResponse:
    """The HTTP response of a replayed stream, which has none: no headers, nothing to close."""

    headers: Any = types.MappingProxyType({})
    status_code = 200
    is_success = True
    is_closed = True

    def close(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


class _StreamBase:
    def __init__(self, live: Any, recorded: list[Any] | None, ctx: RunContext, step: Any,
                 last: Callable[[Any], bool] | None = None):
        self._live, self._recorded, self._ctx, self._step = live, recorded, ctx, step
        self._last = last or (lambda event: False)
        self._events: list[Any] = []
        self._done = False
        self._it: Any = None
        self.replayed = recorded is not None

    def _record(self, event: Any) -> Any:
        self._events.append(dump(event))
        return event

    def _end(self) -> None:
        if not self._done and self._live is not None:
            self._done = True
            self._ctx._complete(self._step, {"events": self._events})

    def _fail(self, e: Exception) -> None:
        if not self._done and self._live is not None:
            self._done = True
            self._ctx._fail(self._step, e, **recorded(e, self._step.name.split(".")[0]))

    def __getattr__(self, name: str) -> Any:  # .response and the rest of the SDK's stream
        if self._live is None:
            if name == "response":  # the SDK's stream helpers read it when they wrap a stream
                return _ReplayedResponse()
            raise AttributeError(name)
        return getattr(self._live, name)


class Stream(_StreamBase):
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
            live = iter(self._live)
            for event in live:
                self._record(event)
                if self._last(event):
                    tail = [self._record(e) for e in live]
                    self._end()
                    yield event
                    yield from tail
                    return
                yield event
        except Exception as e:
            self._fail(e)
            raise
        self._end()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._live is not None:
            self._live.close()


class AsyncStream(_StreamBase):
    """Async :class:`Stream`."""

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
            live = self._live.__aiter__()
            async for event in live:
                self._record(event)
                if self._last(event):
                    tail = [self._record(e) async for e in live]
                    self._end()
                    yield event
                    for e in tail:
                        yield e
                    return
                yield event
        except Exception as e:
            self._fail(e)
            raise
        self._end()

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self._live is not None:
            await self._live.close()

    async def aclose(self) -> None:
        """``close()``, by the name openai's ``AsyncStream`` also gives it."""
        await self.close()
