"""The FastAPI application: state, auth, body limit, error mapping, static UI.

One :class:`ServerState` per app holds the journal and, opened on first use, the
cache store and memory over the same database, so several server processes on
one PostgreSQL store share everything through the database alone.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._errors import (
    AgentMismatchError,
    ConfigError,
    ConflictError,
    EngrainError,
    JSONTooDeepError,
    LeaseHeldError,
    NotJSONError,
    NotWaitingForInputError,
    RunFinishedError,
    RunNotFoundError,
    StorageError,
    StoreCorruptError,
    TextNotStorableError,
    TraceError,
)
from .._events import MAX_DEPTH
from .._journal import open_journal
from .._version import __version__
from .state import ERROR_RESPONSES, ApiError, ServerState, run_finished

#: Seconds a 503 (the store unavailable) asks a client to wait before retrying.
RETRY_AFTER = 1
#: Largest request body accepted (bytes); bigger ones get 413.
MAX_BODY = 2 * 1024 * 1024
UI_DIR = Path(__file__).with_name("ui")


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` only accepts connections from this machine."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})


def host_name(host: str) -> str:
    """The name in a ``Host``/``Origin`` authority, without port or IPv6 brackets, lower-cased."""
    return split_authority(host)[0]


def split_authority(host: str) -> tuple[str, int | None]:
    """``name[:port]`` as (lower-cased name without IPv6 brackets, port or None); a bad port is -1 (matches none)."""
    host = host.strip().lower()
    port = ""
    if host.startswith("["):
        host, _, rest = host[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif host.count(":") == 1:
        host, _, port = host.partition(":")
    if not port:
        return host.rstrip("."), None
    return host.rstrip("."), int(port) if port.isdigit() and len(port) <= 5 else -1


#: The port a URL of each scheme means when it names none (a ``Host`` without a port, ``http://x``).
DEFAULT_PORTS = {"http": 80, "https": 443}


def split_origin(origin: str) -> tuple[str, str, int] | None:
    """``scheme://name[:port]`` as (scheme, name, port), the default port filled in; None if not such an origin."""
    scheme, sep, authority = origin.strip().lower().partition("://")
    if not sep or scheme not in DEFAULT_PORTS or not authority or any(c in authority for c in "/?#@\\"):
        return None  # "null" (sandboxed iframes, data: and file: pages), or not an origin a browser sends
    name, port = split_authority(authority)
    if not name or port == -1:
        return None
    return scheme, name, DEFAULT_PORTS[scheme] if port is None else port


class HostGuard:
    """Refuse requests whose ``Host`` is not this machine (DNS rebinding) or whose ``Origin`` is another origin.

    Active only on a loopback server without a token: a web page whose domain
    re-resolves to 127.0.0.1 reaches such a server with its own name in ``Host``
    (421), and a page of another origin that posts to it sends its ``Origin`` (403).
    The origin is compared whole (scheme, name and port), because another app on this
    machine (any localhost port) is another site to the browser: a ``POST`` without a
    body or with a form's ``text/plain`` one is sent cross-origin without a preflight.
    An ``Origin`` passes when it has this server's scheme and the ``Host``'s port, and
    names the ``Host``'s name, a loopback name or an ``--allow-host`` name (one
    server, reached by another of its names), or when ``--allow-host`` lists it with
    its port (``name:port`` or ``scheme://name:port``: a front end served elsewhere
    that the operator trusts). Requests without an ``Origin`` (curl, httpx, the CLI)
    pass: browsers send one with every cross-origin request.
    A token needs no such guard, since browsers never attach it by themselves.
    """

    def __init__(self, app: ASGIApp, allow: frozenset[str] = frozenset()):
        self.app = app
        self.any = "*" in allow
        names: set[str] = set()
        origins: set[tuple[str | None, str, int]] = set()
        for entry in allow:
            scheme, sep, authority = entry.strip().lower().partition("://")
            if not sep:
                scheme, authority = "", entry
            name, port = split_authority(authority.rstrip("/"))
            names.add(name)
            if port is not None or scheme:
                # An entry with a port or a scheme names an origin: it may call from there.
                origins.add((scheme or None, name, port if port is not None else DEFAULT_PORTS.get(scheme, -1)))
        self.allow = frozenset(names)
        self.origins = frozenset(origins)

    def allowed(self, host: str) -> bool:
        """Whether ``host`` (``name[:port]``) is a loopback name/address or allowed by ``--allow-host``."""
        name = host_name(host)
        return self.any or name in self.allow or is_loopback(name)

    def origin_allowed(self, origin: str, host: str, scheme: str) -> bool:
        """Whether a page of ``origin`` may call this server, reached at ``host`` over ``scheme``."""
        if self.any:
            return True
        parts = split_origin(origin)
        if parts is None:
            return False
        o_scheme, o_name, o_port = parts
        if (o_scheme, o_name, o_port) in self.origins or (None, o_name, o_port) in self.origins:
            return True
        own = "https" if scheme in ("https", "wss") else "http"
        h_name, h_port = split_authority(host)
        if o_scheme != own or o_port != (DEFAULT_PORTS[own] if h_port is None else h_port):
            return False  # another port of this machine is another app, not us
        # Same scheme and port: this server under the Host's name or another of its names.
        return o_name == h_name or self.allowed(o_name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = origin = None
        for name, value in scope.get("headers", []):
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
        hint = "start the server with --allow-host NAME to accept another name, or set a token"
        if host is None or not self.allowed(host):
            resp = _error(421, "HostNotAllowed", f"Host header {host!r} is not a loopback name or address "
                          f"(localhost, 127.0.0.1, ::1): refused to block DNS rebinding; {hint}")
        elif origin is not None and not self.origin_allowed(origin, host, scope.get("scheme", "http")):
            resp = _error(403, "OriginNotAllowed",
                          f"Origin {origin!r} is not this server's origin (scheme, host and port): cross-origin "
                          f"request refused; start the server with --allow-host NAME:PORT to accept a page "
                          f"served there, or set a token")
        else:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await resp(scope, receive, send)


#: The web UI's Content-Security-Policy, the same as its ``<meta>`` tag (a test compares them): only the
#: server's own scripts, styles and connections.
UI_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
          "object-src 'none'; base-uri 'none'; form-action 'self'")
#: Headers on every response. ``frame-ancestors`` works only as a header (browsers ignore it in a
#: ``<meta>``), and no page of another site may frame the UI and lure clicks onto its buttons
#: (cancel, promote, delete): X-Frame-Options says the same for browsers without CSP 2.
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", f"{UI_CSP}; frame-ancestors 'none'".encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),  # a JSON body is never sniffed into HTML or script
    (b"referrer-policy", b"no-referrer"),  # the SSE ?token= never leaves in a Referer
)


class SecurityHeaders:
    """Add :data:`SECURITY_HEADERS` to every HTTP response (API, UI, errors, SSE) that has not set them."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(n, v) for n, v in SECURITY_HEADERS if n not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_secured)


def _error(status: int, error: str, detail: Any, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail, **extra}, status_code=status)


# Typed errors -> HTTP status. Order matters: the first matching class wins.
_STATUS: list[tuple[type[BaseException], int]] = [
    (RunNotFoundError, 404),
    (ConflictError, 409),
    (LeaseHeldError, 409),
    (AgentMismatchError, 409),
    (NotJSONError, 422),
    (TextNotStorableError, 422),  # a NUL in a task, a name or a tag: the request's value, not the server
    (TraceError, 422),
    (ConfigError, 400),
    # The store, not the request, failed: retry later (the journal, memory and cache connect anew).
    (StorageError, 503),
    (StoreCorruptError, 500),
]


def status_of(exc: BaseException) -> int:
    """The HTTP status for an engrain error (400 for any other bad input)."""
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    name = type(exc).__name__
    if name.endswith(("InputError", "ValidationError", "SchemaError")) or name == "RoutineError":
        return 422
    if name.endswith("NotFoundError"):
        return 404
    return 400


_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},:]', re.S)


def _too_deep_at(raw: bytes, limit: int) -> str | None:
    """Where the JSON text ``raw`` first nests deeper than ``limit``, in ``check_depth``'s words (``body.a[0]``).

    A scan of strings and brackets only, without recursion: it answers for text no parser can read.
    None when ``raw`` is not that deep (or not UTF-8 JSON this scan can follow).
    """
    open_: list[tuple[str, list[int] | None]] = []  # per open container: its path, a list's index
    last = key = ""
    for m in _JSON_TOKEN.finditer(raw):
        t = m.group()
        if t in (b"{", b"["):
            if not open_:
                at = "body"
            elif open_[-1][1] is not None:
                at = f"{open_[-1][0]}[{open_[-1][1][0]}]"
            else:
                at = f"{open_[-1][0]}.{key}" if key.isidentifier() else f"{open_[-1][0]}[{key!r}]"
            if len(open_) + 1 > limit:
                return at
            open_.append((at, [0] if t == b"[" else None))
        elif t in (b"}", b"]"):
            if not open_:
                return None
            open_.pop()
        elif t == b",":
            if open_ and open_[-1][1] is not None:
                open_[-1][1][0] += 1
        elif t == b":":
            key = last
        else:
            try:
                last = json.loads(t)
            except ValueError:
                last = t[1:-1].decode("utf-8", "replace")
    return None


def allowed_methods(app: Any, scope: Scope) -> list[str]:
    """Every method some route of ``app`` serves at the request's path, sorted."""
    from starlette.routing import Match, Mount

    # Probed method by method: included routers only say whether they match as a whole.
    return [m for m in ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")
            if any(r.matches({**scope, "method": m})[0] == Match.FULL for r in app.router.routes
                   if not isinstance(r, Mount))]  # the UI's static mount matches every path


class BodyLimit:
    """Reject request bodies over ``limit`` bytes with 413, before the route reads them."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_big = int(value) > self.limit
                except ValueError:
                    too_big = False
                if too_big:
                    await self._reject(scope, receive, send)
                    return
        if scope["method"] in ("GET", "HEAD", "DELETE", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        # No usable Content-Length (chunked upload): read the body up to the limit
        # first, so an oversize body is refused before any route parses it.
        buffered: list[Message] = []
        seen = 0
        while True:
            message = await receive()
            buffered.append(message)
            if message["type"] != "http.request":
                break
            seen += len(message.get("body", b""))
            if seen > self.limit:
                await self._reject(scope, receive, send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        resp = _error(413, "PayloadTooLarge", f"request body is larger than {self.limit} bytes")
        await resp(scope, receive, send)


class BearerAuth:
    """Require ``Authorization: Bearer <token>`` on every ``/api`` route when a token is set."""

    def __init__(self, app: ASGIApp, token: str | None):
        self.app = app
        self.token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is None or scope["type"] != "http" or not scope["path"].startswith("/api"):
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                given = value[7:].strip()
        if not given and scope["path"].endswith("/stream"):
            # EventSource cannot set headers: the SSE route also takes ?token=.
            from urllib.parse import parse_qs

            qs = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            given = (qs.get("token") or [""])[0].encode()
        if not hmac.compare_digest(given, self.token):
            resp = _error(401, "Unauthorized", "missing or wrong bearer token (Authorization: Bearer <token>)")
            resp.headers["WWW-Authenticate"] = "Bearer"
            await resp(scope, receive, send)
            return
        await self.app(scope, receive, send)


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

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        resp = _error(exc.status, exc.error, exc.detail, **exc.extra)
        resp.headers.update(exc.headers)
        return resp

    @app.exception_handler(EngrainError)
    async def _engrain_error(request: Request, exc: EngrainError) -> JSONResponse:
        if isinstance(exc, RunFinishedError):  # whichever route it escaped from: one body clients read
            return await _api_error(request, run_finished(exc))
        if isinstance(exc, NotWaitingForInputError):  # the wire name predates the class: clients match it
            return _error(409, "NotWaitingForInput", str(exc))
        resp = _error(status_of(exc), type(exc).__name__, str(exc))
        if resp.status_code == 503:
            resp.headers["Retry-After"] = str(RETRY_AFTER)  # the next request connects anew
        return resp

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        fields = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err.get("loc", ()))
            fields.append({"field": loc, "message": err.get("msg", "")})
        text = "; ".join(f"{f['field']}: {f['message']}" for f in fields) or "invalid request"
        return _error(422, "ValidationError", text, fields=fields)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and isinstance(exc.__cause__, RecursionError):
            # FastAPI's json.loads ran out of stack (~1000 levels) before Body's depth check could run:
            # the same 422 as a body nested 101..999 deep, naming where it first goes past the limit.
            # The handler gets the route's own Request, so the body it read is still there.
            at = _too_deep_at(getattr(request, "_body", b""), MAX_DEPTH) or "body"
            msg = str(JSONTooDeepError("request body", at, MAX_DEPTH))
            return _error(422, "ValidationError", f"body: {msg}", fields=[{"field": "body", "message": msg}])
        names = {404: "NotFound", 405: "MethodNotAllowed", 401: "Unauthorized"}
        resp = _error(exc.status_code, names.get(exc.status_code, "HTTPError"), str(exc.detail))
        for name, value in (exc.headers or {}).items():  # WWW-Authenticate on a 401
            resp.headers[name] = value
        if exc.status_code == 405:
            # Starlette names the methods of the first route matching the path only; a path
            # served by several routes (GET and POST /api/runs) allows all of theirs.
            resp.headers["Allow"] = ", ".join(allowed_methods(request.app, request.scope))
        return resp

    if state.journal.backend == "postgres":
        from psycopg import DataError

        @app.exception_handler(DataError)
        async def _store_refused(_: Request, exc: DataError) -> JSONResponse:
            # SQLSTATE class 22: PostgreSQL refused a value the request carried (a NUL character, which its
            # text and JSON cannot hold, in a filter, an id or a tag): bad input, like SQLite's 404 or [] for it.
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return _error(422, "ValidationError", f"a value of the request cannot be stored or compared by "
                                                  f"PostgreSQL ({type(exc).__name__}: {first})")

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        resp = _error(500, "InternalError", f"{type(exc).__name__}: {exc}")
        # Starlette answers an unhandled exception outside the added middlewares (SecurityHeaders too).
        resp.headers.update({n.decode(): v.decode() for n, v in SECURITY_HEADERS})
        return resp

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
    app.add_middleware(BearerAuth, token=token)
    app.add_middleware(BodyLimit, limit=MAX_BODY)
    if is_loopback(host) and not token:
        app.add_middleware(HostGuard, allow=frozenset(allow_hosts))
    app.add_middleware(SecurityHeaders)  # outermost: the guard's 421/403 get the headers too
    return app
