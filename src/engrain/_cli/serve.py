"""``engrain serve`` (HTTP API + web UI) and ``engrain mcp`` (MCP server over stdio)."""

from __future__ import annotations

import errno
from typing import Annotated, Any

import typer

from .common import UrlOption, command, errors_as_exit, fail

TokenOption = Annotated[
    str | None,
    typer.Option("--token", envvar="ENGRAIN_TOKEN", help="Bearer token required on /api (required off loopback)."),
]
ToolsOption = Annotated[
    str | None, typer.Option("--tools", help="Tool registry routine runs call, as module:attr (default engrain.tools).")
]
AgentsOption = Annotated[
    str | None,
    typer.Option("--agents", help="Agents POST /api/runs may start and answers resume: a dict name -> callable, "
                 "as module:attr or path/to/file.py:attr."),
]
AllowHostOption = Annotated[
    list[str] | None,
    typer.Option("--allow-host", help="Extra Host name accepted on loopback without a token (repeatable; '*' any)."),
]
RoutinesOption = Annotated[
    str | None, typer.Option("--routines", help="Folder holding one folder per routine (default ./routines).")
]


@command
def serve(
    host: Annotated[str, typer.Option(help="Address to bind; non-loopback needs a token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8765,
    url: UrlOption = None,
    token: TokenOption = None,
    routines: RoutinesOption = None,
    tools: ToolsOption = None,
    agents: AgentsOption = None,
    allow_host: AllowHostOption = None,
) -> None:
    """Serve the HTTP API (/api, /openapi.json) and the web UI (/) over the store."""
    with errors_as_exit():
        import uvicorn  # lazily: fastapi/uvicorn weigh on every CLI start

        from .._server import create_app

        app = create_app(url, token, routines, host=host, tools=tools, agents=agents, allow_hosts=allow_host or ())
    sock = _bind(host, port)
    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"engrain serving on http://{shown}:{sock.getsockname()[1]}  (store {app.state.engrain.journal.url})",
               err=True)
    # Open SSE streams would otherwise hold a Ctrl-C shutdown until their clients leave.
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3)
    uvicorn.Server(config).run(sockets=[sock])


def _bind(host: str, port: int) -> Any:
    """A listening socket on ``host:port``, bound before anything is announced (error: exit 1, one line)."""
    import socket

    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise fail(f"cannot serve on {host}:{port}: unknown host ({e})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        hint = " (another process is listening there; pick another --port)" if e.errno == errno.EADDRINUSE else ""
        raise fail(f"cannot serve on {host}:{port}: {e.strerror or e}{hint}") from None
    sock.set_inheritable(True)
    return sock


@command
def mcp(
    url: UrlOption = None,
    routines: RoutinesOption = None,
    tools: ToolsOption = None,
) -> None:
    """Run the MCP server over stdio (tools: remember, recall, consolidate, list/run routines, list runs)."""
    with errors_as_exit():
        from .._mcp import build_server

        server = build_server(url, routines, tools)
    server.run("stdio")
