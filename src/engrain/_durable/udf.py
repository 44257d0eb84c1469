"""``@engrain.udf``: pure functions journaled like tools, recorded with their source.

A UDF call is a durable step of type ``udf``. The first call of a function in a
run also records the function's source in its ``step.completed`` event
(``data["udf"]``, see :mod:`.udf_source` for what is captured and when capture
is refused); later calls in the same run carry only its ``sha256``. The
compiler writes a recorded function into the routine's ``udfs.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .context import _current
from .tools import ToolRegistry, default_name, tools, validate_tool_name


def udf(
    fn: Callable[..., Any] | None = None, *, name: str | None = None, registry: ToolRegistry | None = None
) -> Any:
    """Make ``fn`` a UDF: a pure function whose calls are journaled steps of type ``udf``.

    Use as ``@engrain.udf`` or ``@engrain.udf(name=...)``. Outside a run it is a
    plain call. Inside one, each call is a step like a tool's, and the
    function's source is recorded so ``compile`` writes the real function into
    the routine's ``udfs.py``. Registered in ``registry`` (default
    ``engrain.tools``) like a tool.
    """

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        import inspect  # lazily, like tools._binder: import engrain stays fast

        from .tools import _binder

        if inspect.iscoroutinefunction(f):
            raise TypeError(f"@engrain.udf: {default_name(f)} is async; a UDF is a plain function")
        step_name = validate_tool_name(name or default_name(f))
        bind = _binder(f)
        captured: list[dict[str, Any]] = []  # filled on the first journaled call, so decoration stays cheap

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx = _current.get()
            if ctx is None:
                return f(*args, **kwargs)
            if not captured:
                from .udf_source import capture

                captured.append(capture(f))
            info = captured[0]
            sha = info.get("sha256")
            if sha is not None and sha in ctx.udf_sources:
                meta = {"udf": {"name": info["name"], "sha256": sha}}
            else:
                meta = {"udf": info}
            result = ctx.call(step_name, "udf", bind(args, kwargs), lambda: f(*args, **kwargs), meta=meta)
            if sha is not None:
                ctx.udf_sources.add(sha)
            return result

        wrapper.__engrain_step__ = {"name": step_name, "type": "udf"}  # type: ignore[attr-defined]
        (registry if registry is not None else tools).register(step_name, wrapper)
        return wrapper

    return decorate(fn) if fn is not None else decorate
