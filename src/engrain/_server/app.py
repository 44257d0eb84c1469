"""The FastAPI application: :func:`create_app` builds it over one store.

One :class:`ServerState` per app holds the journal and, opened on first use, the
cache store and memory over the same database, so several server processes on
one PostgreSQL store share everything through the database alone. The app's
middlewares are in :mod:`.middleware` (host guard, body limit, token) and
:mod:`.headers` (security headers); its error mapping in :mod:`.errors`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from .._errors import ConfigError
from .._journal import open_journal
from .._version import __version__
from .errors import install_error_handlers
from .headers import SecurityHeaders
from .middleware import MAX_BODY, BearerAuth, BodyLimit, HostGuard, is_loopback
from .state import ERROR_RESPONSES, ServerState


UI_DIR = Path(__file__).with_name("ui")


def create_app(
    url: str | None = None,
    token: str | None = None,
    routines_dir: str | os.PathLike[str] | None = None,
    *,
    host: str = "127.0.0.1",
    tools: Any = None,
    agents: Any = None,
    allow_hosts: list[str] | tuple[str, ...] = (),
    ui_dir: str | os.PathLike[str] | None = None,
    tools_dir: str | os.PathLike[str] | None = None,
    max_streams: int | None = None,
    max_client_streams: int | None = None,
    allow_fork: bool = False,
    upgrade_agents: bool = False,
    embedder: str | None = None,
    vector_search: str | None = None,
    max_run_events: int | None = None,
    max_run_bytes: int | None = None,
) -> FastAPI:
    """The engrain HTTP API (and web UI) over the store at ``url``.

    ``token`` defaults to ``$ENGRAIN_TOKEN``; it is required when ``host`` is not
    a loopback address (:class:`~engrain.ConfigError` otherwise). ``routines_dir``
    (default ``./routines``) holds one folder per routine; ``tools`` is the
    registry (or ``"module:registry"``) routine runs call, default ``engrain.tools``.
    ``agents`` is a dict name -> agent callable (or ``"module:attr"`` naming one)
    that ``POST /api/runs`` may start and an answer resumes. LLM agents created
    with ``POST /api/agents`` pick their tools by name from ``tools`` and the
    WASM tools of ``tools_dir``. ``upgrade_agents``: an answer may resume a run
    that another version of its agent's code started (a deploy).
    ``allow_fork``: ``POST /api/runs/{id}/fork`` may fork runs the runtime
    executes (agents, routines, ``engrain.run``), which queues their later steps
    for execution again; without it only an API client's own runs fork over
    HTTP, and ``engrain fork`` / :func:`engrain.fork` stay the operator's way.

    On loopback without a token, requests whose ``Host`` is not a loopback
    name/address get 421 (DNS rebinding) and an ``Origin`` of another origin (scheme,
    host or port: another localhost port too) gets 403; ``allow_hosts`` adds names
    (``"*"``: any), and a ``"name:port"`` entry lets pages of that origin call.
    The web UI's static files are served at ``/`` from ``ui_dir`` (default: the
    package's ``_server/ui`` folder) when it exists. At most ``max_streams`` SSE
    streams are open at once, ``max_client_streams`` per client address (429
    past either; defaults in :mod:`engrain._server.streams`). ``embedder`` is memory's
    model string (``"openai:text-embedding-3-small"``, ...; default: the one the
    store was filled with, else ``$ENGRAIN_EMBEDDER``, else the shipped model);
    ``vector_search`` where memory searches vectors (``Memory``'s: ``"auto"``,
    ``"pgvector"``, ``"local"``; None: ``$ENGRAIN_VECTOR_SEARCH``, else auto).
    A run an API client writes holds at most ``max_run_events`` events and
    ``max_run_bytes`` bytes of event data (413 past either; defaults in
    :mod:`engrain._server.run_limits`).
    """
    token = token if token is not None else (os.environ.get("ENGRAIN_TOKEN") or None)
    if not is_loopback(host) and not token:
        raise ConfigError(
            f"refusing to serve on non-loopback host {host!r} without a token: "
            "set ENGRAIN_TOKEN or pass --token"
        )
    if isinstance(tools, str):
        from .._routines.runner import resolve_tools

        tools = resolve_tools(tools)
    elif tools is None:
        from .._durable.tools import tools as default_tools

        tools = default_tools
    from .agents import AgentRunner, load_agents

    registry = load_agents(agents)
    state = ServerState(open_journal(url), token, Path(routines_dir or "routines").resolve(), tools)
    state.agents = AgentRunner(state, registry, upgrade=upgrade_agents)
    from .streams import MAX_CLIENT_STREAMS, MAX_STREAMS, StreamHub, StreamSlots

    state.slots = StreamSlots(max_streams or MAX_STREAMS, max_client_streams or MAX_CLIENT_STREAMS)
    state.hub = StreamHub(lambda: state.journal)
    state.allow_fork = bool(allow_fork)
    from .run_limits import MAX_RUN_BYTES, MAX_RUN_EVENTS, RunBudget

    for what, given in (("max_run_events", max_run_events), ("max_run_bytes", max_run_bytes)):
        if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 1):
            raise ConfigError(f"{what} must be a positive integer, not {given!r}")
    state.run_budget = RunBudget(max_run_events or MAX_RUN_EVENTS, max_run_bytes or MAX_RUN_BYTES)
    state.embedder = embedder
    from .._memory.pgvector import check_vector_search

    state.vector_search = check_vector_search(vector_search)  # refused at start-up, not at the first recall
    if state.vector_search == "pgvector":
        from .._memory.pgvector import vector_search_of
        from .._memory.store import open_store

        probe = open_store(state.journal.url)
        try:
            vector_search_of(probe, "pgvector")  # a store without the extension: the ConfigError, now
        finally:
            probe.close()
    from .llm_agents import LLMAgents, build_tools

    state.llm_agents = LLMAgents(state, build_tools(tools, str(tools_dir) if tools_dir else None))

    from contextlib import asynccontextmanager

    from starlette.concurrency import run_in_threadpool

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        state.reopen()
        yield
        # Agent runs still executing after the grace period stay resumable in the journal.
        await run_in_threadpool(state.agents.shutdown)
        state.llm_agents.shutdown()
        state.close()

    app = FastAPI(
        title="engrain",
        version=__version__,
        description="Durable runs, routines, a behavior cache and skill memory over one journal.",
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
        # No Swagger UI or ReDoc pages: FastAPI's load unpinned scripts from a CDN (no SRI) into this
        # origin, where they could drive the API. The document stays at /openapi.json.
        docs_url=None,
        redoc_url=None,
    )
    app.state.engrain = state

    install_error_handlers(app, postgres=state.journal.backend == "postgres")

    from . import agents as agents_routes
    from . import cache, learned, llm_agents, memory, operate, routines, runs

    for module in (runs, operate, routines, agents_routes, llm_agents, cache, memory, learned):
        app.include_router(module.router, prefix="/api")

    @app.get("/api/health", tags=["health"])
    def health() -> dict[str, Any]:
        """Liveness and what this server offers."""
        return {
            "ok": True,
            "version": __version__,
            "backend": state.journal.backend,
            "auth": state.token is not None,
            "streams": state.streams,
            "features": {"routines": routines.available(), "memory": True, "cache": True,
                         "agents": bool(state.agents.agents)},
        }

    ui = Path(ui_dir) if ui_dir is not None else UI_DIR
    if ui.is_dir():
        from fastapi.staticfiles import StaticFiles

        app.mount("/", StaticFiles(directory=str(ui), html=True), name="ui")

    from .contract import EncodedSlashes, LiteralPaths, install_openapi

    install_openapi(app, list(state.llm_agents.tools.names()))
    # The last added runs first: the security headers wrap the host guard, which wraps the size limit,
    # which wraps auth, which wraps the wrong-method answer of literal paths, which wraps the routes.
    app.add_middleware(EncodedSlashes)  # innermost: the guards around it read the path as it was sent
    app.add_middleware(LiteralPaths, fastapi_app=app)
    app.add_middleware(BearerAuth, token=token, query_token_routes=("/api" + runs.STREAM_PATH,))
    app.add_middleware(BodyLimit, limit=MAX_BODY)
    if is_loopback(host) and not token:
        app.add_middleware(HostGuard, allow=frozenset(allow_hosts))
    app.add_middleware(SecurityHeaders)  # outermost: the guard's 421/403 get the headers too
    return app
