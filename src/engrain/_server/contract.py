"""Where the server and its OpenAPI document must agree, beyond what FastAPI derives from the routes.

- A literal path beats a templated one, as OpenAPI says: ``GET /api/memory/consolidate``
  is a wrong method on the ``consolidate`` operation (405 naming ``POST``), not
  ``GET /api/memory/{id}`` of an item called "consolidate" (404), and an ``OPTIONS``
  there lists only ``POST``. :class:`LiteralPaths` answers those before routing.
- Rules a body model cannot state by itself (exactly one of two fields) are
  written into the document with :func:`one_of`, so a generated request the
  document calls valid is one the server accepts.
- What depends on the server's configuration (the tool names an LLM agent may
  use) is written into the document when it is built: :func:`install_openapi`.
- A path parameter is one segment, in which an id may hold ``/`` sent as ``%2F``
  (a LangGraph thread ``user/42`` makes a run id with one): :class:`EncodedSlashes`
  routes on the raw path, and every templated route reads its ids as ``{id:segment}``.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote

from starlette.convertors import Convertor, register_url_convertor
from starlette.types import ASGIApp, Receive, Scope, Send


def one_of(*branches: dict[str, Any]) -> dict[str, Any]:
    """``json_schema_extra`` for a body that must match exactly one of ``branches``.

    Each branch is ``{field: json schema}``: the fields it requires (non-null).
    The fields of the other branches must then be absent or null.
    """
    fields = {f for b in branches for f in b}
    out = []
    for b in branches:
        others = {f: {"type": "null"} for f in fields - set(b)}
        out.append({"required": sorted(b), "properties": {**b, **others}})
    return {"oneOf": out}


class LiteralPaths:
    """405 with ``Allow`` for a wrong method on a path the document declares literally (no ``{param}``)."""

    def __init__(self, app: ASGIApp, fastapi_app: Any):
        self.app = app
        self.fastapi_app = fastapi_app
        self._methods: dict[str, list[str]] | None = None

    def methods(self) -> dict[str, list[str]]:
        """Literal path -> the methods the document declares for it."""
        if self._methods is None:
            self._methods = {path: sorted(m.upper() for m in ops if m.upper() in _METHODS)
                             for path, ops in self.fastapi_app.openapi().get("paths", {}).items() if "{" not in path}
        return self._methods

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and route_path(scope).startswith("/api/"):
            allowed = self.methods().get(route_path(scope))
            # HEAD goes where GET does (Starlette answers it), though the document lists GET only.
            method = "GET" if scope["method"] == "HEAD" else scope["method"]
            if allowed is not None and method not in allowed:
                from fastapi.responses import JSONResponse

                resp = JSONResponse({"error": "MethodNotAllowed", "detail": "Method Not Allowed"}, status_code=405,
                                    headers={"Allow": ", ".join(allowed)})
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


_METHODS = {"GET", "PUT", "POST", "DELETE", "OPTIONS", "HEAD", "PATCH", "TRACE"}


def install_openapi(app: Any, tool_names: list[str]) -> None:
    """Let ``app`` build its document as usual, once, then state the server's own tool names in it."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = build()
            agent = doc.get("components", {}).get("schemas", {}).get("AgentDefinition")
            if agent is not None:
                tools = agent["properties"]["tools"]
                # Tools come from the server's registry: a name outside it is refused (422), so the
                # document lists the names; with none, an agent has no tools.
                tools["items"] = {"type": "string", "enum": sorted(tool_names)} if tool_names else {"type": "string"}
                if not tool_names:
                    tools["maxItems"] = 0
        return app.openapi_schema

    app.openapi = openapi


#: The two escapes a routed path keeps: a slash inside an id, and the percent sign that makes it unambiguous.
_KEPT = re.compile(r"%2[fF5]")


def routed_path(raw: bytes | None, decoded: str) -> str:
    """The path to route ``/api`` requests on: ``decoded`` with ``%2F`` and ``%25`` put back where ``raw`` had them.

    The ASGI server decodes the path before routing, so ``/runs/a%2Fb/answers`` would arrive as
    ``/runs/a/b/answers`` and match no route. Routing on this form keeps an id one segment;
    :class:`Segment` decodes it. When ``raw`` is missing or disagrees with ``decoded`` (a proxy
    that rewrote the path), only ``%`` is escaped: an encoded slash is then lost, as before.
    """
    if raw is not None:
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            text = None
        if text is not None:
            pieces = _KEPT.split(text)
            kept = [m.upper() for m in _KEPT.findall(text)]
            out = unquote(pieces[0]) + "".join(k + unquote(p) for k, p in zip(kept, pieces[1:]))
            if unquote(out) == decoded:
                return out
    return decoded.replace("%", "%25")


def route_path(scope: Scope) -> str:
    """The part of the request's path the router matches: after the root path, as Starlette's router reads it.

    Behind a proxy's prefix (``uvicorn --root-path /x``, or the app mounted under ``/x``) the ASGI
    path is ``/x/api/...`` and routes still match ``/api/...``: whatever decides by route (the token,
    a literal path) must read this, or ``/api`` routes are served without its check.
    """
    path, root = scope["path"], scope.get("root_path", "")
    if not root or not path.startswith(root):
        return path
    return path[len(root):] if path[len(root):len(root) + 1] in ("", "/") else path


class EncodedSlashes:
    """Route ``/api`` requests on :func:`routed_path`; the middlewares around it see the decoded path as sent."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and route_path(scope).startswith("/api/"):
            scope = {**scope, "path": routed_path(scope.get("raw_path"), scope["path"])}
        await self.app(scope, receive, send)


class Segment(Convertor[str]):
    """``{id:segment}``: one path segment of :func:`routed_path`'s form, decoded (``a%2Fb`` is the id ``a/b``)."""

    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return unquote(value)

    def to_string(self, value: str) -> str:
        return quote(value, safe="")


register_url_convertor("segment", Segment())
