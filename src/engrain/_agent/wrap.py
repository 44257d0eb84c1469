"""``engrain.wrap(client)``: durable LLM calls for users' own OpenAI/Anthropic clients.

Inside a durable run, ``chat.completions.create``, ``responses.create`` and
``messages.create`` become journaled LLM steps: the response (or, when
``stream=True``, every streamed event) is recorded, and on resume the recorded
objects are rebuilt with the SDK's own types instead of calling the API again.

The SDKs' helpers built on one such request are journaled too:
``chat.completions.parse``, ``responses.parse`` and ``messages.parse``
(structured output) and the ``.stream()`` managers (``chat.completions.stream``,
``responses.stream``, ``messages.stream``). The SDK's own helper runs against a
stand-in resource whose one HTTP request is journaled: the step records the
plain response (or its events) before the helper parses it, and on resume the
helper parses the recorded one again, so the user gets the SDK's own
``ParsedChatCompletion``/``ParsedResponse``/``ParsedMessage`` or stream object
with the caller's ``response_format``/``text_format``/``output_format`` applied.
A replayed stream has no HTTP response: its ``response`` has no headers
(see :mod:`.wrap_streams` for what the streams offer).

Every other way to reach the API inside a run would be paid again on each
resume without the journal knowing, so it raises :class:`NotJournaledError`,
which names the attribute and what to call instead: ``with_raw_response`` and
``with_streaming_response`` (their raw HTTP response is not recorded), the
other resources (``models``, ``embeddings``, ``beta`` ...) and the client's own
``get``/``post``/... methods. Inside a step (an ``@eg.tool`` function, whose
result is journaled) and outside runs, the wrapper passes through
(``with_options``/``copy`` return a wrapped client).

A streamed call's step completes when the stream is read to its last event (a
loop may stop there); a stream cut short before it (a crash, or the caller
stopping early) is called again on resume.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any

from .._durable.context import RunContext, StepRecord, _Pending, current, idempotency_key
from .._errors import ConfigError, NotJournaledError
from .._events import is_json
from .wrap_errors import recorded, replayed
from .wrap_streams import AsyncStream, Stream, dump, last_event

# endpoint path -> (response type, stream event type), as "module:attribute" of the SDK
_OPENAI = {
    "chat.completions.create": ("openai.types.chat:ChatCompletion", "openai.types.chat:ChatCompletionChunk"),
    "responses.create": ("openai.types.responses:Response", "openai.types.responses:ResponseStreamEvent"),
}
_ANTHROPIC = {
    "messages.create": ("anthropic.types:Message", "anthropic.types:RawMessageStreamEvent"),
}
# helper path -> the endpoint whose request it sends (the helper's recorded events have that endpoint's type)
_OPENAI_HELPERS = {
    "chat.completions.parse": "chat.completions.create",
    "chat.completions.stream": "chat.completions.create",
    "responses.parse": "responses.create",
    "responses.stream": "responses.create",
}
_ANTHROPIC_HELPERS = {"messages.parse": "messages.create", "messages.stream": "messages.create"}

# Attributes whose calls send a request the journal cannot record (their result is the raw HTTP response).
_RAW = ("with_raw_response", "with_streaming_response")
# The client's own HTTP methods (``client.post("/chat/completions", ...)``): unjournaled requests too.
_HTTP = frozenset({"get", "post", "put", "patch", "delete", "request", "get_api_list"})
# Resources whose methods compute locally (verifying a webhook's signature) and send no request.
_LOCAL = frozenset({"webhooks"})
# The request methods an SDK resource has besides ``_post``: a helper that uses one is not journaled.
_OTHER_REQUESTS = ("_get", "_put", "_patch", "_delete", "_get_api_list")


def _type(ref: str) -> Any:
    mod, attr = ref.split(":")
    return getattr(importlib.import_module(mod), attr)


def _request(kw: dict[str, Any]) -> dict[str, Any]:
    """The JSON part of the call's keyword arguments, recorded as the step's arguments."""
    return {k: v for k, v in kw.items() if is_json(v)}


class _Spec:
    def __init__(self, sdk: str, endpoints: dict[str, tuple[str, str]], helpers: dict[str, str], is_async: bool):
        self.sdk, self.endpoints, self.helpers, self.is_async = sdk, endpoints, helpers, is_async
        self.prefixes = {p[: i] for p in [*endpoints, *helpers] for i in range(len(p)) if p[i] == "."}

    def build(self, ref: str, data: Any) -> Any:
        return self.construct(_type(ref), data)

    def construct(self, type_: Any, data: Any) -> Any:
        construct = importlib.import_module(f"{self.sdk}._models").construct_type
        return construct(type_=type_, value=data)

    def is_resource(self, obj: Any) -> bool:
        """Whether ``obj`` is one of the SDK's API resources (or its raw/streaming-response view)."""
        if type(obj).__module__.startswith(f"{self.sdk}.resources."):
            return True
        try:
            res = importlib.import_module(f"{self.sdk}._resource")
        except ImportError:
            return False
        bases = tuple(c for c in (getattr(res, "SyncAPIResource", None), getattr(res, "AsyncAPIResource", None)) if c)
        return bool(bases) and isinstance(obj, bases)

    def instead(self, path: str) -> str:
        """What to call instead of the unjournaled ``path``."""
        parts = path.split(".")
        plain = ".".join(p for p in parts if p not in _RAW)
        if plain != path and (plain in self.endpoints or plain in self.helpers):
            return (f"call {self.sdk}.{plain}(...) instead (its result is journaled; the raw HTTP response is not), "
                    "or call it outside the run")
        return ("call it outside the run, or inside a step (an @eg.tool function, whose JSON result is journaled); "
                f"engrain.wrap journals {', '.join(sorted([*self.endpoints, *self.helpers]))}")


class Wrapped:
    """A proxy for an SDK client (or one of its resources) that journals LLM calls inside runs."""

    __slots__ = ("_target", "_path", "_spec")

    def __init__(self, target: Any, path: str, spec: _Spec):
        self._target, self._path, self._spec = target, path, spec

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        full = f"{self._path}.{name}" if self._path else name
        spec = self._spec
        if full in spec.endpoints:
            return _method(attr, full, spec)
        if full in spec.helpers:
            return _helper(self._target, name, attr, full, spec)
        if full in spec.prefixes:
            return Wrapped(attr, full, spec)
        if full in ("with_options", "copy"):  # a configured copy of the client stays wrapped
            return lambda *a, **kw: Wrapped(attr(*a, **kw), "", spec)
        if name.startswith("_") or _LOCAL.intersection(full.split(".")):
            return attr
        # Anything else that reaches the API is guarded: a resource (or its raw-response view) stays
        # wrapped so that its methods are, and a method refuses inside a run (see NotJournaledError).
        if name in _RAW or spec.is_resource(attr):
            return Wrapped(attr, full, spec)
        if callable(attr) and not isinstance(attr, type) and (self._path or name in _HTTP):
            return _refused_in_runs(attr, full, spec)
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
                rec = replayed(ctx, step, spec.sdk)
                if kw.get("stream"):
                    return AsyncStream(None, [spec.build(event_t, e) for e in rec["events"]], ctx, step)
                return spec.build(whole_t, rec["response"])
            try:
                out = await fn(*args, **kw)
            except Exception as e:
                ctx._fail(step, e, **recorded(e, spec.sdk))
                raise
            if kw.get("stream"):
                return AsyncStream(out, None, ctx, step, last_event(path, kw))
            finish(ctx, step, {"response": dump(out)})
            return out

        return acreate

    def create(*args: Any, **kw: Any) -> Any:
        ctx = current()
        if ctx is None:
            return fn(*args, **kw)
        step = _begin(ctx, name, kw)
        if isinstance(step, StepRecord):
            rec = replayed(ctx, step, spec.sdk)
            if kw.get("stream"):
                return Stream(None, [spec.build(event_t, e) for e in rec["events"]], ctx, step)
            return spec.build(whole_t, rec["response"])
        try:
            out = fn(*args, **kw)
        except Exception as e:
            ctx._fail(step, e, **recorded(e, spec.sdk))
            raise
        if kw.get("stream"):
            return Stream(out, None, ctx, step, last_event(path, kw))
        finish(ctx, step, {"response": dump(out)})
        return out

    return create


def _refused_in_runs(fn: Any, path: str, spec: _Spec) -> Any:
    """``fn``, which sends a request the journal does not record: refused in a run's own code.

    Inside a step (``idempotency_key()`` set) the step's result is what the journal records, and
    outside runs there is no journal: both pass through.
    """

    def check() -> None:
        if current() is not None and idempotency_key() is None:
            raise NotJournaledError(f"{spec.sdk}.{path}", spec.instead(path))

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def acall(*args: Any, **kw: Any) -> Any:
            check()
            return await fn(*args, **kw)

        return acall

    @functools.wraps(fn)
    def call(*args: Any, **kw: Any) -> Any:
        check()
        return fn(*args, **kw)

    return call


class _Answered:
    """A resource as one of the SDK's helpers sees it: the helper's request goes through ``post``.

    The SDK's ``parse``/``stream`` helpers build their request and hand it to the resource's
    ``_post`` (directly, or through its ``create``), with a ``post_parser`` turning the plain
    response into the parsed one. Run against this stand-in (the resource's own methods bound to
    it), the request is journaled by ``post`` and everything else is the SDK's own code.
    """

    __slots__ = ("_eg_target", "_post", "_eg_path", "_eg_spec")

    def __init__(self, target: Any, post: Any, path: str, spec: _Spec):
        self._eg_target, self._post, self._eg_path, self._eg_spec = target, post, path, spec

    def __getattr__(self, name: str) -> Any:
        if name in _OTHER_REQUESTS:  # e.g. responses.stream(response_id=...) retrieves a stored response
            spec = self._eg_spec
            raise NotJournaledError(f"{spec.sdk}.{self._eg_path} (which sends a {name[1:]} request here)",
                                    spec.instead(self._eg_path))
        fn = getattr(type(self._eg_target), name, None)
        if inspect.isfunction(fn):  # create, parse ...: the SDK's method, sending its request through _post
            return fn.__get__(self)
        return getattr(self._eg_target, name)


def _helper(target: Any, name: str, bound: Any, path: str, spec: _Spec) -> Any:
    """The SDK helper ``target.name`` (``parse``, ``stream``), journaling the one request it sends (see _Answered)."""
    step_name = f"{spec.sdk}.{path}"
    endpoint = spec.helpers[path]
    event_t = spec.endpoints[endpoint][1]
    func = getattr(type(target), name, None)

    def stand_in(ctx: RunContext, kw: dict[str, Any]) -> _Answered:
        if not inspect.isfunction(func):  # an SDK whose helper is not a plain method: nothing to run it on
            raise NotJournaledError(f"{step_name} (in this version of the {spec.sdk} SDK)", spec.instead(path))

        def options_of(k: dict[str, Any]) -> tuple[dict[str, Any], Any]:
            options = k.get("options")
            if options is None:
                options = {}
            if not isinstance(options, dict):  # not the RequestOptions dict this code knows how to read
                raise NotJournaledError(f"{step_name} (in this version of the {spec.sdk} SDK)", spec.instead(path))
            options = dict(options)
            # The plain response is what the step records: the helper's parser runs on it after
            # the request, and again on the recorded one when the run resumes.
            return options, options.pop("post_parser", None)

        def played(step: StepRecord, k: dict[str, Any], parser: Any, stream_t: Any) -> Any:
            rec = replayed(ctx, step, spec.sdk)
            if k.get("stream"):
                return stream_t(None, [spec.build(event_t, e) for e in rec["events"]], ctx, step)
            out = spec.construct(k["cast_to"], rec["response"])
            return parser(out) if parser is not None else out

        real = target._post  # the client's own request method, which the stand-in's _post journals
        if spec.is_async:

            async def apost(route: str, **k: Any) -> Any:
                options, parser = options_of(k)
                step = _begin(ctx, step_name, kw)
                if isinstance(step, StepRecord):
                    return played(step, k, parser, AsyncStream)
                try:
                    out = await real(route, **{**k, "options": options})
                except Exception as e:
                    ctx._fail(step, e, **recorded(e, spec.sdk))
                    raise
                if k.get("stream"):
                    return AsyncStream(out, None, ctx, step, last_event(endpoint, kw))
                ctx._complete(step, {"response": dump(out)})
                return parser(out) if parser is not None else out

            return _Answered(target, apost, path, spec)

        def post(route: str, **k: Any) -> Any:
            options, parser = options_of(k)
            step = _begin(ctx, step_name, kw)
            if isinstance(step, StepRecord):
                return played(step, k, parser, Stream)
            try:
                out = real(route, **{**k, "options": options})
            except Exception as e:
                ctx._fail(step, e, **recorded(e, spec.sdk))
                raise
            if k.get("stream"):
                return Stream(out, None, ctx, step, last_event(endpoint, kw))
            # Recorded before the parser runs: a parser's error (a reply cut off by max_tokens, content
            # that does not fit the response_format) is then raised again, from the same reply, on resume.
            ctx._complete(step, {"response": dump(out)})
            return parser(out) if parser is not None else out

        return _Answered(target, post, path, spec)

    @functools.wraps(bound)
    def call(*args: Any, **kw: Any) -> Any:
        ctx = current()
        if ctx is None:
            return bound(*args, **kw)
        return func(stand_in(ctx, kw), *args, **kw)

    return call


def wrap(client: Any) -> Any:
    """Make ``client``'s LLM calls durable steps inside runs (``openai.OpenAI``/``AsyncOpenAI``,
    ``anthropic.Anthropic``/``AsyncAnthropic``); see :mod:`engrain._agent.wrap`."""
    root = type(client).__module__.split(".")[0]
    if root == "openai":
        import openai

        if isinstance(client, (openai.OpenAI, openai.AsyncOpenAI)):
            spec = _Spec("openai", _OPENAI, _OPENAI_HELPERS, isinstance(client, openai.AsyncOpenAI))
            return Wrapped(client, "", spec)
    if root == "anthropic":
        import anthropic

        if isinstance(client, (anthropic.Anthropic, anthropic.AsyncAnthropic)):
            return Wrapped(client, "", _Spec("anthropic", _ANTHROPIC, _ANTHROPIC_HELPERS,
                                             isinstance(client, anthropic.AsyncAnthropic)))
    raise ConfigError(
        f"engrain.wrap: cannot wrap {type(client).__module__}.{type(client).__qualname__}; "
        "pass an openai.OpenAI, openai.AsyncOpenAI, anthropic.Anthropic or anthropic.AsyncAnthropic"
    )
