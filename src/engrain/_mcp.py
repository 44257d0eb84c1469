"""engrain as an MCP server over stdio (``engrain mcp``), built on the official ``mcp`` SDK.

Tools: ``remember``, ``recall``, ``consolidate`` (skill memory), ``list_routines``,
``run_routine`` and ``answer_routine`` (routine packages under the routines dir:
run one, and answer a run that stopped at a prompt so it continues) and
``list_runs`` (the journal). They share the HTTP server's state and helpers, so both surfaces
behave the same on the same store.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import anyio
import anyio.to_thread
import mcp_types
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
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
        from ._server.answering import check_answerable

        events = state.journal.read(run_id)
        if not events:
            raise RunNotFoundError(run_id)
        check_answerable(run_id, events)  # as the HTTP API refuses: RunFinishedError or NotWaitingForInput
        if _routines.routine_run_folder(state, events) is None:
            raise ApiError(400, "NotARoutineRun", f"run {run_id!r} is not a run of a routine in this server's routines dir")
        return _routines.resume(state, run_id, answers)

    @tool()
    @_clear_errors
    def list_runs(status: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        """Recent runs (optionally only those in ``status``: ok, failed, needs_input, running, queued, cancelled), at most 500."""
        if limit < 1:  # as the CLI's --limit: not silently one run
            raise ValueError(f"limit must be at least 1, not {limit}")
        return [r.to_dict() for r in state.journal.runs(status=status, limit=min(limit, 500))]

    return server


# As the HTTP API's body limit: a request line longer than this is answered, not buffered.
MAX_LINE = 2 * 1024 * 1024


class _AnsweringStdin:
    """stdin for the SDK's stdio transport, answering each line the SDK could not take.

    The SDK hands a line it cannot parse to the server as a bare exception, which answers
    nothing, so a client waiting on that request's id waits for ever. This reader checks each
    line first and answers a bad one itself: with the request's id when one can be read
    (``-32700`` parse error, ``-32600`` invalid request), else with ``id: null``, as JSON-RPC asks.
    A line over ``MAX_LINE`` bytes is skipped to its end and answered the same way.
    """

    def __init__(self, source: BinaryIO, limit: int = MAX_LINE) -> None:
        self._source = source
        self._limit = limit
        self._replies: Any = None
        self._ready = anyio.Event()

    def answer_on(self, write_stream: Any) -> None:
        self._replies = write_stream
        self._ready.set()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        while True:
            raw = await anyio.to_thread.run_sync(self._source.readline, self._limit + 1)
            if not raw:
                return
            if len(raw) > self._limit and not raw.endswith(b"\n"):
                while (rest := await anyio.to_thread.run_sync(self._source.readline, self._limit)) and not rest.endswith(b"\n"):
                    pass
                await self._answer(None, -32600, f"Invalid Request: a message is limited to {self._limit} bytes")
                continue
            line = raw.decode("utf-8", errors="replace")
            if not line.strip():
                continue
            try:
                mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            except Exception as e:  # pydantic's ValidationError: the SDK would drop it unanswered
                await self._answer(_request_id(line), *_verdict(e))
                continue
            yield line

    async def _answer(self, request_id: str | int | None, code: int, message: str) -> None:
        await self._ready.wait()
        error = mcp_types.JSONRPCError(
            jsonrpc="2.0", id=request_id, error=mcp_types.ErrorData(code=code, message=message)
        )
        await self._replies.send(SessionMessage(error))


def _request_id(line: str) -> str | int | None:
    """The id of a request that failed validation, when the line still reads as a JSON object."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return None
    rid = message.get("id") if isinstance(message, dict) else None
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        return None
    return rid if not isinstance(rid, str) or len(rid) <= 256 else None


def _verdict(error: Exception) -> tuple[int, str]:
    errors = getattr(error, "errors", lambda: [])()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return -32700, f"Parse error: {str(first.get('msg', error))[:200]}"
    return -32600, "Invalid Request: not a JSON-RPC 2.0 request, notification or response"


async def serve_stdio(server: MCPServer) -> None:
    """Serve ``server`` over this process's stdin and stdout, answering every request line."""
    low = getattr(server, "_lowlevel_server", None)  # the SDK's own run_stdio_async drives this
    if low is None:  # an SDK that moved it: serve as the SDK does, bad lines unanswered
        await server.run_stdio_async()
        return
    source, restore = _claim_stdin()
    try:
        stdin = _AnsweringStdin(source)
        async with stdio_server(stdin=stdin) as (read_stream, write_stream):  # type: ignore[arg-type]
            stdin.answer_on(write_stream)
            await low.run(read_stream, write_stream, low.create_initialization_options())
    finally:
        restore()


def _claim_stdin() -> tuple[BinaryIO, Callable[[], None]]:
    """The client's requests on a private copy of fd 0, with fd 0 itself on the null device.

    The SDK diverts fd 0 only when it reads stdin itself: with our reader, a tool or trusted
    UDF that reads stdin would take a client's request line (never answered) or block its
    own call for ever. Now it reads end of file.
    """
    import os

    try:
        private = os.dup(0)
    except OSError:
        return sys.stdin.buffer, lambda: None
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    except OSError:
        os.close(private)
        return sys.stdin.buffer, lambda: None

    def restore() -> None:
        os.dup2(private, 0)
        os.close(private)

    return os.fdopen(private, "rb", closefd=False), restore
