"""The ASGI middlewares that refuse a request before any route reads it.

- :class:`HostGuard`: on a loopback server without a token, a client off this machine (403),
  a ``Host`` that is not this machine (DNS rebinding: 421) or an ``Origin`` of another site (403).
- :class:`BodyLimit`: a request body over the limit (413), chunked uploads included.
- :class:`BearerAuth`: ``/api`` (HTTP or websocket) without the server's token (401).

Each answers with :func:`.errors.error_response`, the body every error has.
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Any
from urllib.parse import parse_qs

from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .contract import route_path, routed_path
from .errors import error_response

#: Largest request body accepted (bytes); bigger ones get 413.
MAX_BODY = 2 * 1024 * 1024


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` only accepts connections from this machine."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})


def off_machine_peer(client: tuple[str, int] | list[Any] | None) -> str | None:
    """The peer's address when the connection comes from another machine, else None.

    A peer that is no IP address (a Unix socket's None, the test client's name) is local.
    An IPv4 loopback peer of a dual-stack socket shows as ``::ffff:127.0.0.1``.
    """
    if not client:
        return None
    try:
        ip = ipaddress.ip_address(str(client[0]))
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return None if (mapped or ip).is_loopback else str(client[0])


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
    """Refuse requests from another machine, whose ``Host`` is not this machine (DNS rebinding) or whose
    ``Origin`` is another origin.

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

    Before all that, the connection must come from this machine (a loopback peer; 403
    otherwise): ``create_app`` waives the token because it is told the server is bound to
    loopback, and an app served elsewhere (``uvicorn --factory --host 0.0.0.0``, a name
    that resolves off loopback) would otherwise be open to any client that sends
    ``Host: localhost``, which only browsers cannot forge.
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
        peer = off_machine_peer(scope.get("client"))
        host = origin = None
        for name, value in scope.get("headers", []):
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
        hint = "start the server with --allow-host NAME to accept another name, or set a token"
        if peer is not None:
            resp = error_response(403, "ClientNotAllowed",
                                  f"client {peer} is not on this machine: a server without a token answers only "
                                  f"loopback clients; start it with a token to serve others")
        elif host is None or not self.allowed(host):
            resp = error_response(421, "HostNotAllowed", f"Host header {host!r} is not a loopback name or address "
                                  f"(localhost, 127.0.0.1, ::1): refused to block DNS rebinding; {hint}")
        elif origin is not None and not self.origin_allowed(origin, host, scope.get("scheme", "http")):
            resp = error_response(403, "OriginNotAllowed",
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
        resp = error_response(413, "PayloadTooLarge", f"request body is larger than {self.limit} bytes")
        await resp(scope, receive, send)


class BearerAuth:
    """Require the server's token on every ``/api`` route (HTTP and websocket) when a token is set.

    The token comes in ``Authorization: Bearer <token>``. ``query_token_routes`` are the path
    templates of the routes an EventSource opens (``/api/runs/{run_id:segment}/stream``): it
    cannot set headers, so a ``GET`` of one of those may carry ``?token=`` instead. Nowhere else:
    a URL's token ends up in logs and histories. Which route a request is for is decided as the
    router decides it, on :func:`.contract.route_path` of :func:`.contract.routed_path`: after a
    root path, and with an id's ``%2F`` kept, so a run id ``x/stream`` (``/api/runs/x%2Fstream``,
    the run's page) is not its stream.
    """

    def __init__(self, app: ASGIApp, token: str | None, query_token_routes: tuple[str, ...] = ()):
        self.app = app
        self.token = token.encode() if token else None
        # The routes' own regexes ({run_id:segment}: one segment), not a test of how the path ends.
        self.query_token_routes = tuple(compile_path(p)[0] for p in query_token_routes)

    def takes_query_token(self, scope: Scope) -> bool:
        """Whether the request is a ``GET`` of a route that may carry its token as ``?token=``."""
        if scope["type"] != "http" or scope["method"] != "GET":
            return False
        path = route_path({**scope, "path": routed_path(scope.get("raw_path"), scope["path"])})
        return any(regex.match(path) for regex in self.query_token_routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is None or scope["type"] not in ("http", "websocket") or not route_path(scope).startswith("/api"):
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                given = value[7:].strip()
        if not given and self.takes_query_token(scope):
            qs = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            given = (qs.get("token") or [""])[0].encode()
        if hmac.compare_digest(given, self.token):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            resp = error_response(401, "Unauthorized", "missing or wrong bearer token (Authorization: Bearer <token>)")
            resp.headers["WWW-Authenticate"] = "Bearer"
            await resp(scope, receive, send)
