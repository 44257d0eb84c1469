"""``engrain serve`` (HTTP API + web UI) and ``engrain mcp`` (MCP server over stdio)."""

from __future__ import annotations

import errno
from typing import Annotated, Any

import typer

from .common import OBJECT_SPEC, UpgradeOption, UrlOption, command, errors_as_exit, fail, refuse_empty

TokenOption = Annotated[
    str | None,
    typer.Option("--token", envvar="ENGRAIN_TOKEN", help="Bearer token required on /api (required off loopback)."),
]
ToolsOption = Annotated[
    str | None, typer.Option("--tools", help=f"Tool registry routine runs call, {OBJECT_SPEC} (default engrain.tools).")
]
AgentsOption = Annotated[
    str | None,
    typer.Option("--agents", help="Agents POST /api/runs may start and answers resume: a dict name -> callable, "
                 f"{OBJECT_SPEC}."),
]
ToolsDirOption = Annotated[
    str | None, typer.Option("--tools-dir", help="Folder of WASM tools (*.wasm) LLM agents may use, by file name.")
]
AllowHostOption = Annotated[
    list[str] | None,
    typer.Option("--allow-host", help="Extra Host name accepted on loopback without a token (repeatable; '*' any; NAME:PORT also admits pages of that origin)."),
]
RoutinesOption = Annotated[
    str | None, typer.Option("--routines", help="Folder holding one folder per routine (default ./routines).")
]


@command
def serve(
    host: Annotated[str, typer.Option(help="Address to bind; non-loopback needs a token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free port).")] = 8765,
    url: UrlOption = None,
    token: TokenOption = None,
    routines: RoutinesOption = None,
    tools: ToolsOption = None,
    agents: AgentsOption = None,
    allow_host: AllowHostOption = None,
    tools_dir: ToolsDirOption = None,
    max_connections: Annotated[int, typer.Option(min=1, help="Most open connections; past it a new one gets 503.")] = 1000,
    max_streams: Annotated[int, typer.Option(min=1, help="Most open SSE streams; past it 429.")] = 200,
    max_client_streams: Annotated[int, typer.Option(min=1, help="Most open SSE streams per client address; past it 429.")] = 20,
    header_timeout: Annotated[float, typer.Option(min=0.1, help="Seconds a client has to send a request's headers (408 after).")] = 10.0,
    body_timeout: Annotated[float, typer.Option(min=0.1, help="Seconds a client has to send a request's body once its headers are in (408 after).")] = 30.0,
    write_timeout: Annotated[float, typer.Option(min=0.1, help="Seconds a response may wait on a client that stopped reading before the connection is dropped.")] = 30.0,
    allow_fork: Annotated[
        bool, typer.Option("--allow-fork", help="Let API clients fork runs the runtime executes (re-executes their later steps).")
    ] = False,
    upgrade: UpgradeOption = False,
    max_run_events: Annotated[int, typer.Option(min=1, help="Most events a run written by an API client may hold; past it 413.")] = 100_000,
    max_run_bytes: Annotated[int, typer.Option(min=1, help="Most bytes of event data a run written by an API client may hold; past it 413.")] = 64 * 1024 * 1024,
    embedder: Annotated[str | None, typer.Option(
        "--embedder", envvar="ENGRAIN_EMBEDDER",
        help="Memory's embedder: 'openai:<model>', 'ollama:<model>', 'sentence-transformers:<name>', "
             "'minilm-fp32', 'minilm-int8' (default: the store's, else the shipped model).")] = None,
    vector_search: Annotated[str | None, typer.Option(
        "--vector-search", envvar="ENGRAIN_VECTOR_SEARCH",
        help="Where memory searches vectors: 'auto' (pgvector where the server has it, else in-process), "
             "'pgvector', or 'local' (in-process on PostgreSQL too: faster recall, the vectors in this process).")] = None,
) -> None:
    """Serve the HTTP API (/api, /openapi.json) and the web UI (/) over the store."""
    for flag, value, instead in (("--routines", routines, "./routines"), ("--tools", tools, "engrain.tools"),
                                 ("--tools-dir", tools_dir, "no WASM tools"), ("--agents", agents, "no agents")):
        refuse_empty(flag, value, instead)
    with errors_as_exit():
        import uvicorn  # lazily: fastapi/uvicorn weigh on every CLI start

        from .._server import create_app
        from .._server.connections import server_config

        app = create_app(url, token, routines, host=host, tools=tools, agents=agents, allow_hosts=allow_host or (),
                         tools_dir=tools_dir, max_streams=max_streams, max_client_streams=max_client_streams,
                         allow_fork=allow_fork, upgrade_agents=upgrade, embedder=embedder, vector_search=vector_search,
                         max_run_events=max_run_events, max_run_bytes=max_run_bytes)
    socks = _bind(host, port)
    shown = f"[{host}]" if ":" in host else host
    bound = socks[0].getsockname()[1]
    from .._journal import redact_url

    typer.echo(f"engrain serving on http://{shown}:{bound}  (store {redact_url(app.state.engrain.journal.url)})", err=True)
    # Open SSE streams would otherwise hold a Ctrl-C shutdown until their clients leave.
    config = server_config(app, header_timeout=header_timeout, max_connections=max_connections, write_timeout=write_timeout,
                           body_timeout=body_timeout, log_level="warning", timeout_graceful_shutdown=3)
    uvicorn.Server(config).run(sockets=socks)


def _bind(host: str, port: int) -> list[Any]:
    """Listening sockets on every address of ``host`` (``localhost``: IPv4 and IPv6), bound before
    anything is announced; a failure is one line and exit 1, never a "serving on" first."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise fail(f"cannot serve on {host}:{port}: unknown host ({e})") from None
    socks: list[socket.socket] = []
    seen = set()
    try:
        for family, kind, proto, _, addr in infos:
            if addr[:2] in seen:
                continue
            seen.add(addr[:2])
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            # Port 0 picks a free port once; the other addresses of the name take the same one.
            sock.bind((addr[0], port or (socks[0].getsockname()[1] if len(socks) > 1 else 0), *addr[2:]))
            sock.listen(2048)
            sock.set_inheritable(True)
    except OSError as e:
        for sock in socks:
            sock.close()
        hint = " (another process is listening there; pick another --port)" if e.errno == errno.EADDRINUSE else ""
        raise fail(f"cannot serve on {host}:{port}: {e.strerror or e}{hint}") from None
    return socks


@command
def mcp(
    url: UrlOption = None,
    routines: RoutinesOption = None,
    tools: ToolsOption = None,
) -> None:
    """Run the MCP server over stdio (tools: remember, recall, consolidate, list/run routines, list runs)."""
    from .._progress import set_reporter

    set_reporter(None)  # stdio is the protocol's: nothing else may draw on the terminal
    refuse_empty("--routines", routines, "./routines")
    refuse_empty("--tools", tools, "engrain.tools")
    with errors_as_exit():
        from .._mcp import build_server

        server = build_server(url, routines, tools)
    import anyio

    from .._mcp import serve_stdio

    anyio.run(serve_stdio, server)
