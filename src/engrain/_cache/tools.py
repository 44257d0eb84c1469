"""An engine's tools as the agent calls them: each call recorded for the trajectory an entry is made of.

``@engine.function`` and ``@engine.method`` wrap a tool with :func:`recording_tool`.
Inside an ``engine(task)`` call, a call of the tool is a journaled step of
that call's run, its pre- and post-check snapshots taken around it, and it is
appended to the call's trajectory; after a diverged replay, a call that repeats
a done step gets that step's result instead of running again
(:meth:`~.replay.Session.reuse`). Outside every call the tool is the plain
journaled ``@engrain.tool`` it was.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .checks import encode_snapshot
from .plan import ToolSpec
from .replay import Session, current_session
from .values import args_as_called, as_called

__all__ = ["recording_tool"]


def _pre(spec: ToolSpec, args: tuple, kwargs: dict) -> dict[str, Any] | None:
    # Captured and encoded before the call, so a snapshot that is not JSON fails before any effect.
    return encode_snapshot(spec.pre.capture(*args, **kwargs), spec.pre_where) if spec.pre else None


def _recorded(s: Session, spec: ToolSpec, args: tuple, kwargs: dict, args_d: dict, pre: Any, result: Any) -> Any:
    post = encode_snapshot(spec.post.capture(*args, **kwargs), spec.post_where) if spec.post else None
    # The result as the tool returned it: the agent may change it before it returns it as its output.
    kept = as_called(result)
    s.trajectory.append({"name": spec.name, "args": args_d, "result": kept, "pre": pre, "post": post})
    s.steps.append({"name": spec.name, "args": args_d, "result": kept, "source": "agent"})
    return result


def recording_tool(spec: ToolSpec, journaled: Callable[..., Any], untracked: Callable[[], None]) -> Callable[..., Any]:
    """The tool ``spec.fn`` as the engine's agent calls it (``journaled``: the plain tool, used outside every
    engine call, where ``untracked()`` marks the calls in progress as maybe incomplete)."""
    fn = spec.fn
    if spec.is_async:

        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            s = current_session.get()
            if s is None:
                untracked()
                return await journaled(*args, **kwargs)
            args_d = spec.bind(args, kwargs)
            reused = s.reuse(spec, args_d)
            if reused is not None:
                return reused.result
            pre = _pre(spec, args, kwargs)
            args_d = args_as_called(args_d)
            result = await s.ctx.acall(spec.name, "tool", args_d, lambda: fn(*args, **kwargs))
            return _recorded(s, spec, args, kwargs, args_d, pre, result)

        return awrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        s = current_session.get()
        if s is None:
            untracked()
            return journaled(*args, **kwargs)
        args_d = spec.bind(args, kwargs)
        reused = s.reuse(spec, args_d)
        if reused is not None:
            return reused.result
        pre = _pre(spec, args, kwargs)
        args_d = args_as_called(args_d)
        result = s.ctx.call(spec.name, "tool", args_d, lambda: fn(*args, **kwargs))
        return _recorded(s, spec, args, kwargs, args_d, pre, result)

    return wrapper
