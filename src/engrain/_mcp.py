"""engrain as an MCP server over stdio (``engrain mcp``), built on the official ``mcp`` SDK.

Tools: ``remember``, ``recall``, ``consolidate`` (skill memory), ``list_routines``,
``run_routine`` and ``answer_routine`` (routine packages under the routines dir:
run one, and answer a run that stopped at a prompt so it continues) and
``list_runs`` (the journal). They share the HTTP server's state and helpers, so both surfaces
behave the same on the same store.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from ._journal import open_journal
from ._text import plain_doc
from ._version import __version__

F = TypeVar("F", bound=Callable[..., Any])


def _clear_errors(fn: F) -> F:
    """Bad input reaches the model as the typed error's message, not as a generic crash."""
    from ._errors import EngrainError
    from ._server.state import ApiError

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (EngrainError, ApiError, ValueError) as e:
            raise ToolError(f"{type(e).__name__ if not isinstance(e, ApiError) else e.error}: {e}") from e

    return wrapper  # type: ignore[return-value]


def build_server(url: str | None = None, routines_dir: str | None = None, tools: Any = None) -> MCPServer:
    """An MCP server over the store at ``url`` (default: the default store).

    ``tools`` is the registry routine runs call (or ``"module:registry"``; default ``engrain.tools``).
    """
    from ._server import routines as _routines
    from ._server.state import ApiError, ServerState

    if isinstance(tools, str):
        from ._routines.runner import resolve_tools

        tools = resolve_tools(tools)
    state = ServerState(open_journal(url), None, Path(routines_dir or "routines").resolve(), tools)
    server = MCPServer(
        name="engrain",
        version=__version__,
        instructions="Skill memory (remember/recall/consolidate), routines and the run journal of engrain.",
    )
    _tool = server.tool

    def tool() -> Callable[[F], F]:
        """``server.tool()`` with the docstring, without reST markup, as the tool's description."""
        return lambda fn: _tool(description=plain_doc(fn.__doc__))(fn)  # type: ignore[return-value]

    @tool()
    @_clear_errors
    def remember(data: str, skill: str | None = None, hint: float | None = None,
                 metadata: dict[str, Any] | None = None, label: str | None = None) -> dict[str, Any]:
        """Store a piece of knowledge in skill memory (hint: importance 0..1); returns the record id."""
        with state.memory_lock:
            return {"id": state.memory().remember(data, hint=hint, label=label, skill=skill, metadata=metadata)}

    @tool()
    @_clear_errors
    def recall(query: str, skill: str | None = None, top_k: int = 5) -> list[dict[str, Any]]:
        """Records and articles most relevant to ``query``, best first."""
        with state.memory_lock:
            return [h.to_dict() for h in state.memory().recall(query, skill=skill, top_k=top_k)]

    @tool()
    @_clear_errors
    def consolidate(num_records: int | None = None) -> dict[str, Any]:
        """Distil the memory buffer into articles (all of it unless ``num_records`` is given)."""
        with state.memory_lock:
            return state.memory().consolidate("all" if num_records is None else num_records).to_dict()

    @tool()
    @_clear_errors
    def list_routines() -> list[dict[str, Any]]:
        """Routine packages available to run: name, description, input schema, step count."""
        return _routines.routine_infos(state.routines_dir)

    @tool()
    @_clear_errors
    def run_routine(name: str, inputs: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run a routine; returns its result (status ok, failed or needs_input with the prompt)."""
        return _routines.run_routine(state, name, dict(inputs or {}), None)

    @tool()
    @_clear_errors
    def answer_routine(run_id: str, answers: dict[str, Any]) -> dict[str, Any]:
        """Answer a routine run that waits for input (status needs_input) and continue it.

        answers: {field: value} for the prompt the run waits at, or {step_id: {field: value}}
        for that prompt and later ones. Returns the run's new result (ok, failed or needs_input).
        """
        from ._errors import RunNotFoundError
        from ._server.runs import pending_prompt

        events = state.journal.read(run_id)
        if not events:
            raise RunNotFoundError(run_id)
        if pending_prompt(events) is None:
            raise ApiError(409, "NotWaitingForInput", f"run {run_id!r} is not waiting for input")
        if _routines.routine_run_folder(state, events) is None:
            raise ApiError(400, "NotARoutineRun", f"run {run_id!r} is not a run of a routine in this server's routines dir")
        return _routines.resume(state, run_id, answers)

    @tool()
    @_clear_errors
    def list_runs(status: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        """Recent runs (optionally only those in ``status``: ok, failed, needs_input, running, queued, cancelled)."""
        return [r.to_dict() for r in state.journal.runs(status=status, limit=max(1, min(limit, 500)))]

    return server
