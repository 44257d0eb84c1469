"""Tools: functions whose calls are journaled steps of a durable run.

``@engrain.tool`` wraps a function or method, sync or async. Outside a run the
wrapper calls straight through; inside :func:`engrain.run` each call is a step
(see :mod:`engrain._durable`). Every decorated tool is also registered by name
in a :class:`ToolRegistry` (``engrain.tools`` by default), which is how routines
and the server find tools by name.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, overload

from .._errors import ConfigError, EngrainError
from .context import _current
from .steps import ARGS_CHECKED, DEFAULT_POLICY, StepPolicy

F = TypeVar("F", bound=Callable[..., Any])

STEP_TYPES = ("tool", "llm", "udf")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")


class ToolRegistry:
    """Tools by name. Thread-safe; a later :meth:`register` of a name replaces the earlier one
    (:meth:`load_dir` refuses to, unless told)."""

    def __init__(self) -> None:
        self._tools: dict[str, Callable[..., Any]] = {}
        self._lock = threading.Lock()

    def register(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Add ``fn`` under ``name`` and return it."""
        validate_tool_name(name)
        with self._lock:
            self._tools[name] = fn
        return fn

    def get(self, name: str) -> Callable[..., Any]:
        """The tool called ``name``; :class:`KeyError` naming the known tools if absent."""
        try:
            return self._tools[name]
        except KeyError:
            known = ", ".join(sorted(self._tools)) or "none"
            raise KeyError(f"no tool named {name!r} (registered: {known})") from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._tools)

    def load_dir(self, path: str | Any, *, replace: bool = False, **limits: Any) -> list[str]:
        """Register every ``*.wasm`` in ``path`` as a journaled tool named for its file stem.

        Each tool takes one JSON value (sent on the guest's stdin) and returns the
        JSON the guest prints; it runs in :mod:`engrain.sandbox` with ``limits``
        (see :class:`engrain.sandbox.Limits`). Returns the registered names.

        A file named like a tool already registered (a host function, or another
        file's tool) is refused with :class:`~engrain.ConfigError` naming both, and
        nothing of the folder is registered: a file dropped into a tools folder must
        not silently take over a trusted tool's calls. ``replace=True`` lets the
        folder's tools replace them; loading the same file again replaces its own tool.
        """
        import pathlib

        from .._sandbox import wasi as _sandbox

        root = pathlib.Path(path).resolve()
        loaded = ToolRegistry()  # the folder's tools, moved into this registry all at once
        files: dict[str, str] = {}
        for file in sorted(root.glob("*.wasm")):
            name = validate_tool_name(file.stem)
            real = file.resolve()
            if real.parent != root:  # a symlink pointing out of the folder is refused
                raise EngrainError(f"tool file {str(file)!r} resolves outside {str(root)!r}")
            wasm = _sandbox.WasmTool(real, name=name, limits=_sandbox.Limits(**limits))

            call = _wasm_caller(wasm)
            call.__name__ = call.__qualname__ = name
            files[name] = call.__engrain_wasm__ = str(real)  # type: ignore[attr-defined]  # kept by the wrapper
            tool(call, name=name, registry=loaded)
        with self._lock:
            for name, file in files.items():
                old = self._tools.get(name)
                # The same file loaded again (other limits, say) replaces its own tool.
                if not replace and old is not None and getattr(old, "__engrain_wasm__", None) != file:
                    raise ConfigError(f"tool {name!r} is already registered ({_describe(old)}); {file} would replace "
                                      "it: rename the file, or pass replace=True to load_dir")
            self._tools.update(loaded._tools)
        return list(files)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._tools)

    def __getitem__(self, name: str) -> Callable[..., Any]:
        return self.get(name)

    def __repr__(self) -> str:
        return f"<ToolRegistry {self.names()}>"


def _describe(fn: Callable[..., Any]) -> str:
    """What a registered tool is, for an error message: its WASM file, or its Python function."""
    wasm = getattr(fn, "__engrain_wasm__", None)
    if wasm is not None:
        return f"WASM tool {wasm}"
    inner = getattr(fn, "__wrapped__", fn)
    where = getattr(inner, "__module__", None) or "?"
    return f"Python function {where}.{getattr(inner, '__qualname__', repr(inner))}"


def _wasm_caller(wasm: Any) -> Callable[..., Any]:
    def call(args: Any = None) -> Any:
        return wasm.call(args)

    return call


#: The default registry that ``@engrain.tool`` registers into.
tools = ToolRegistry()


def validate_tool_name(name: str) -> str:
    """Return ``name`` if it is a valid tool name, else raise :class:`EngrainError`.

    Names are identifiers with ``.`` and ``-`` allowed (``files.read``), at most
    128 characters: never a path, so a name cannot point outside a tools folder.
    """
    if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name:
        raise EngrainError(
            f"invalid tool name {name!r}: use letters, digits, '_', '.' or '-', starting with a letter or '_'"
        )
    return name


def default_name(fn: Callable[..., Any]) -> str:
    """``module-free qualified name``: ``fetch`` for a function, ``Browser.click`` for a method."""
    return fn.__qualname__.rsplit("<locals>.", 1)[-1]


def _arity(fn: Callable[..., Any]) -> tuple[bool, int]:
    """(first parameter is ``self``/``cls``, which the journal does not record; the number of
    positional values that give every parameter, or -1 when no positional call does)."""
    import inspect  # lazily: as _binder

    code = getattr(fn, "__code__", None)
    if code is None or code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS) or code.co_kwonlyargcount:
        return False, -1
    return bool(code.co_argcount and code.co_varnames[0] in ("self", "cls")), code.co_argcount


def _binder(fn: Callable[..., Any]) -> Callable[[tuple, dict], dict[str, Any]]:
    """A function turning call arguments into the ``{name: value}`` dict the journal records."""
    import inspect  # lazily: ~10 ms of start-up that CLI commands without tools never need

    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    skip = params[0].name if params and params[0].name in ("self", "cls") else None
    simple = all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params)
    names = tuple(p.name for p in params)
    positional = sum(1 for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    star = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)

    def bind(args: tuple, kwargs: dict) -> dict[str, Any]:
        # On every journaled call, and Signature.bind costs several µs: plain
        # signatures (no *args/**kwargs/positional-only) take a fast path, and
        # anything unusual falls back to Signature.bind for its exact TypeError.
        if simple and not kwargs and len(args) == positional and positional == len(names):
            out = dict(zip(names, args))  # every argument given positionally: the common call
        elif simple and len(args) <= positional and not any(n in kwargs for n in names[: len(args)]):
            out = dict(zip(names, args))
            used = 0
            for name in names[len(args) :]:
                if name in kwargs:
                    out[name] = kwargs[name]
                    used += 1
                elif name in defaults:
                    out[name] = defaults[name]
                else:
                    sig.bind(*args, **kwargs)  # raises the usual TypeError for the missing argument
            if used != len(kwargs):
                sig.bind(*args, **kwargs)  # unexpected keyword: same TypeError as a plain call
        else:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            out = dict(bound.arguments)
            if star is not None:  # Python hands *args over as a tuple; JSON (the record) holds it as a list,
                out[star] = list(out[star])  # which a replay (the cache, a routine) spreads back into the call
        if skip is not None:
            out.pop(skip, None)
        return out

    # The common call's result without calling bind: the recorded names zipped with the call's
    # values when every parameter is given positionally (len(names) of them, the first one skipped).
    bind.plain = (names[1:], len(names), 1) if skip else (names, len(names), 0)  # type: ignore[attr-defined]
    if not (simple and positional == len(names)):
        bind.plain = None  # type: ignore[attr-defined]
    return bind


def _spreader(fn: Callable[..., Any]) -> Callable[[dict[str, Any]], tuple[tuple[Any, ...], dict[str, Any]]] | None:
    """How a recorded call (:func:`_binder`'s ``{name: value}``) becomes ``fn``'s ``(*args, **kwargs)`` again, for
    a replay that calls the tool (the cache, a routine); ``None`` for a plain signature: the record is the keywords.

    ``*args`` is spread from its recorded list, ``**kwargs`` from its mapping; positional-only
    parameters, and before a ``*args`` any positional one, go by position. A key naming no
    parameter goes in as a keyword (a hand-written routine's ``**kwargs``), and after a missing
    positional parameter the rest go by keyword, where their position is no longer known.
    """
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params):
        return None
    if params and params[0].name in ("self", "cls"):  # never recorded (see _binder)
        params = params[1:]
    names = {p.name for p in params}
    spread = any(p.kind is p.VAR_POSITIONAL for p in params)

    def split(args: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        pos: list[Any] = []
        kw = {k: v for k, v in args.items() if k not in names}
        gap = False
        for p in params:
            if p.name not in args:
                gap = gap or p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                continue
            v = args[p.name]
            if p.kind is p.VAR_POSITIONAL and isinstance(v, list) and not gap:
                pos.extend(v)
            elif p.kind is p.VAR_KEYWORD and isinstance(v, dict):
                kw.update(v)
            elif not gap and (p.kind is p.POSITIONAL_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD and spread):
                pos.append(v)
            else:
                kw[p.name] = v
        return tuple(pos), kw

    return split


@overload
def tool(fn: F) -> F: ...
@overload
def tool(
    fn: None = None,
    *,
    name: str | None = None,
    type: str = "tool",
    registry: ToolRegistry | None = None,
    at_most_once: bool = False,
    retries: int = 0,
    backoff: float = 0.5,
    max_backoff: float = 30.0,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
    volatile: list[str] | tuple[str, ...] | None = None,
    same_result: Callable[[Any, Any], bool] | None = None,
) -> Callable[[F], F]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    type: str = "tool",
    registry: ToolRegistry | None = None,
    at_most_once: bool = False,
    retries: int = 0,
    backoff: float = 0.5,
    max_backoff: float = 30.0,
    retry_on: tuple[type[BaseException], ...] | type[BaseException] = (Exception,),
    volatile: list[str] | tuple[str, ...] | None = None,
    same_result: Callable[[Any, Any], bool] | None = None,
) -> Any:
    """Make ``fn`` a journaled step. Use as ``@tool`` or ``@tool(name=..., type="llm")``.

    ``type`` is ``"tool"``, ``"llm"`` or ``"udf"``; it is recorded with each call
    so the compiler and the UI can tell LLM calls from tool calls. Arguments and
    results must be JSON; a non-JSON value raises :class:`~engrain.NotJSONError`
    naming the tool and the argument.

    A step journals only its completion, so a call running at a crash runs
    again (with the same :func:`engrain.idempotency_key`). ``at_most_once=True``
    journals a durable start before the call instead: after a crash mid-call
    the run pauses ``needs_input`` asking whether the step happened (answer
    with :func:`engrain.answer`). Use it for payments and other effects that
    cannot be deduplicated.

    ``retries=N`` calls again up to N times when the call raises one of
    ``retry_on``, waiting ``backoff * 2**k`` seconds (capped at ``max_backoff``,
    with jitter); every failed attempt is journaled, and after the last one the
    step fails with :class:`~engrain.RetriesExhaustedError` naming each attempt.

    ``volatile`` (field names or dotted paths, ``*`` matching any) and
    ``same_result`` (``fn(recorded, fresh) -> bool`` on the two results as the
    model saw them, JSON-decoded) tell an
    :class:`engrain.Agent` with ``cache=True`` how this tool's result is
    compared when a cached trajectory is replayed (see ``engrain._agent.volatile``
    for the default); ``volatile=()`` compares everything.
    """
    if type not in STEP_TYPES:
        raise ConfigError(f"tool type must be one of {STEP_TYPES}, got {type!r}")
    # One class, or anything else that is not a tuple or list, is checked as a tuple of one (StepPolicy names it).
    retry_on = tuple(retry_on) if isinstance(retry_on, (tuple, list)) else (retry_on,)
    policy = StepPolicy(bool(at_most_once), retries, backoff, max_backoff, retry_on)
    if policy == DEFAULT_POLICY:
        policy = DEFAULT_POLICY

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        import inspect

        step_name = validate_tool_name(name or default_name(f))
        bind = _binder(f)
        # A replayed call with other arguments is another step. A call giving every parameter
        # positionally (the common one) is compared by its values with the recorded arguments'
        # (recorded in signature order, without self), binding nothing; others are bound first.
        checked = type in ARGS_CHECKED
        method, full = _arity(f)

        def replayed(ctx: Any, args: tuple, kwargs: dict) -> tuple[Any, dict[str, Any] | None]:
            """The step's record if the journal completed this call given otherwise than positionally (and its
            bound arguments, if bound)."""
            if not checked:
                return ctx.replay_next(step_name, None, type), None
            bound = bind(args, kwargs)
            return ctx.replay_next(step_name, bound, type), bound

        if inspect.iscoroutinefunction(f):

            @functools.wraps(f)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                ctx = _current.get()
                if ctx is None:
                    return await f(*args, **kwargs)
                if checked and not kwargs and len(args) == full:  # the common call, without a helper's call
                    rec, bound = ctx.replay_next(step_name, args[1:] if method else args, type), None
                else:
                    rec, bound = replayed(ctx, args, kwargs)
                if rec is not None:
                    return rec.result
                bound = bind(args, kwargs) if bound is None else bound
                return await ctx.acall(step_name, type, bound, lambda: f(*args, **kwargs), policy)

            wrapper: Callable[..., Any] = awrapper
        else:

            plain = bind.plain  # type: ignore[attr-defined]
            new_step = policy is DEFAULT_POLICY

            @functools.wraps(f)
            def swrapper(*args: Any, **kwargs: Any) -> Any:
                ctx = _current.get()
                if ctx is None:
                    return f(*args, **kwargs)
                if new_step and ctx.cursor > ctx._last:
                    # Past the journal's last step (every step of a first execution): nothing to replay, so
                    # straight to the context's new-step path, without a thunk (it takes the step number
                    # under the run's lock).
                    if plain is not None and not kwargs and len(args) == plain[1]:
                        bound = dict(zip(plain[0], args[1:] if plain[2] else args))
                    else:
                        bound = bind(args, kwargs)
                    return ctx._call_new(step_name, type, bound, f, args, kwargs)
                if checked and not kwargs and len(args) == full:  # the common call, without a helper's call
                    rec, bound = ctx.replay_next(step_name, args[1:] if method else args, type), None
                else:
                    rec, bound = replayed(ctx, args, kwargs)
                if rec is not None:  # a resumed run: no thunk
                    return rec.result
                bound = bind(args, kwargs) if bound is None else bound
                return ctx.call(step_name, type, bound, lambda: f(*args, **kwargs), policy)

            wrapper = swrapper
        wrapper.__engrain_step__ = {"name": step_name, "type": type, "policy": policy}  # type: ignore[attr-defined]
        if volatile is not None or same_result is not None:  # read by the agent's cache (engrain._agent.volatile)
            wrapper.__engrain_step__.update(volatile=volatile, same_result=same_result)  # type: ignore[attr-defined]
        (registry if registry is not None else tools).register(step_name, wrapper)
        return wrapper

    return decorate(fn) if fn is not None else decorate


def llm(fn: Callable[..., Any] | None = None, *, name: str | None = None, registry: ToolRegistry | None = None) -> Any:
    """``@tool(type="llm")``: journal an LLM call so a replay makes zero LLM calls."""
    return tool(fn, name=name, type="llm", registry=registry)
