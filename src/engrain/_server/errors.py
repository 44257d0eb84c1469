"""Errors as HTTP responses: the one ``{error, detail}`` body, engrain's typed errors' statuses, the app's handlers.

Every refusal, whether a middleware's (401, 413, 421, 403) or a route's, is built by
:func:`error_response`, so clients read one shape (``state.ErrorBody``).
:func:`install_error_handlers` maps what routes raise: :class:`~.state.ApiError`,
engrain's errors by :func:`status_of`, FastAPI's validation errors, Starlette's
404/405, a driver's refusal of a value, and anything else as a 500.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

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
from .headers import SECURITY_HEADERS
from .state import ApiError, run_finished

#: Seconds a 503 (the store unavailable) asks a client to wait before retrying.
RETRY_AFTER = 1


def error_response(status: int, error: str, detail: Any, **extra: Any) -> JSONResponse:
    """The error body every refusal has: ``error`` (a type name clients match), ``detail``, and ``extra`` members."""
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


def too_deep_at(raw: bytes, limit: int) -> str | None:
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


def install_error_handlers(app: FastAPI, *, postgres: bool) -> None:
    """Answer every exception a route raises with :func:`error_response` (``postgres``: the store is PostgreSQL)."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        resp = error_response(exc.status, exc.error, exc.detail, **exc.extra)
        resp.headers.update(exc.headers)
        return resp

    @app.exception_handler(EngrainError)
    async def _engrain_error(request: Request, exc: EngrainError) -> JSONResponse:
        if isinstance(exc, RunFinishedError):  # whichever route it escaped from: one body clients read
            return await _api_error(request, run_finished(exc))
        if isinstance(exc, NotWaitingForInputError):  # the wire name predates the class: clients match it
            return error_response(409, "NotWaitingForInput", str(exc))
        resp = error_response(status_of(exc), type(exc).__name__, str(exc))
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
        return error_response(422, "ValidationError", text, fields=fields)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and isinstance(exc.__cause__, RecursionError):
            # FastAPI's json.loads ran out of stack (~1000 levels) before Body's depth check could run:
            # the same 422 as a body nested 101..999 deep, naming where it first goes past the limit.
            # The handler gets the route's own Request, so the body it read is still there.
            at = too_deep_at(getattr(request, "_body", b""), MAX_DEPTH) or "body"
            msg = str(JSONTooDeepError("request body", at, MAX_DEPTH))
            return error_response(422, "ValidationError", f"body: {msg}", fields=[{"field": "body", "message": msg}])
        names = {404: "NotFound", 405: "MethodNotAllowed", 401: "Unauthorized"}
        resp = error_response(exc.status_code, names.get(exc.status_code, "HTTPError"), str(exc.detail))
        for name, value in (exc.headers or {}).items():  # WWW-Authenticate on a 401
            resp.headers[name] = value
        if exc.status_code == 405:
            # Starlette names the methods of the first route matching the path only; a path
            # served by several routes (GET and POST /api/runs) allows all of theirs.
            resp.headers["Allow"] = ", ".join(allowed_methods(request.app, request.scope))
        return resp

    if postgres:
        from psycopg import DataError

        @app.exception_handler(DataError)
        async def _store_refused(_: Request, exc: DataError) -> JSONResponse:
            # SQLSTATE class 22: PostgreSQL refused a value the request carried (a NUL character, which its
            # text and JSON cannot hold, in a filter, an id or a tag): bad input, like SQLite's 404 or [] for it.
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return error_response(422, "ValidationError", f"a value of the request cannot be stored or compared by "
                                                          f"PostgreSQL ({type(exc).__name__}: {first})")

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        resp = error_response(500, "InternalError", f"{type(exc).__name__}: {exc}")
        # Starlette answers an unhandled exception outside the added middlewares (SecurityHeaders too).
        resp.headers.update({n.decode(): v.decode() for n, v in SECURITY_HEADERS})
        return resp
