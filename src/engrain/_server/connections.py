"""Connection limits uvicorn lacks: header and body deadlines, a header size cap, a connection cap, stalled writers.

uvicorn times out idle keep-alive connections (``timeout_keep_alive``) but not a
connection that never finishes its request head: 3,000 such sockets were all
held after a minute. And ``limit_concurrency`` answers 503 only once a request's
headers are complete, so it cannot refuse those either. :func:`server_config`
therefore serves with a subclass of the HTTP protocol uvicorn would pick
(httptools, else h11) that adds, per connection:

- a deadline for the request head (``header_timeout``), from the connection's
  opening and again after each response; past it the connection gets 408 and is closed;
- a deadline for the request body (``body_timeout``), from the end of its head:
  a body that stops, or trickles a byte at a time, would hold its connection
  (and one of ``max_connections``) forever; past it 408 and closed;
- a cap on the head's size (``MAX_HEAD_BYTES``; 431 past it), so a fast sender
  cannot fill memory before the deadline (h11 has its own, set to the same);
- a cap on open connections (``max_connections``): past it a new connection gets
  503 and is closed at once, before anything is parsed;
- an abort of a connection whose writes stay paused (its reader stopped reading)
  for ``write_timeout`` seconds: closing would wait for a buffer that never drains.

Proxy headers (``X-Forwarded-For``, ``Forwarded``) are not read: uvicorn would
trust them from loopback, letting a client on the server's host choose the
address the per-client stream cap counts (see :mod:`.streams`).
"""

from __future__ import annotations

import asyncio
from typing import Any

#: Defaults: seconds to send a request head, most open connections, seconds a write may stay blocked,
#: seconds an idle keep-alive connection stays open.
HEADER_TIMEOUT, MAX_CONNECTIONS, WRITE_TIMEOUT, KEEP_ALIVE = 10.0, 1000, 30.0, 5
#: Seconds to send a request body once its head is in (a 2 MB body at ~70 kB/s).
BODY_TIMEOUT = 30.0
#: Most bytes of one request head (request line and headers).
MAX_HEAD_BYTES = 64 * 1024


def _reply(status: str, text: str) -> bytes:
    body = f'{{"error": "{status.split(" ", 1)[1].replace(" ", "")}", "detail": "{text}"}}'.encode()
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode() + body


class _Guard:
    """Mixed into uvicorn's HTTP protocol class; the limits come from class attributes set by :func:`guarded_protocol`."""

    header_timeout: float = HEADER_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    max_connections: int = MAX_CONNECTIONS
    write_timeout: float = WRITE_TIMEOUT
    _head_timer: asyncio.TimerHandle | None = None
    _body_timer: asyncio.TimerHandle | None = None
    _write_timer: asyncio.TimerHandle | None = None
    _head_bytes = 0

    def _awaiting_head(self) -> bool:
        cycle = self.cycle  # type: ignore[attr-defined]
        return cycle is None or cycle.response_complete

    def _arm_head_deadline(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_bytes = 0
        self._head_timer = asyncio.get_running_loop().call_later(self.header_timeout, self._head_deadline)

    def _head_deadline(self) -> None:
        self._head_timer = None
        transport = self.transport  # type: ignore[attr-defined]
        if self._awaiting_head() and not transport.is_closing():
            transport.write(_reply("408 Request Timeout", f"request head not received within {self.header_timeout:g} s"))
            transport.close()

    def _body_deadline(self, cycle: Any) -> None:
        self._body_timer = None
        transport = self.transport  # type: ignore[attr-defined]
        if cycle is not self.cycle or not cycle.more_body or cycle.response_complete or transport.is_closing():  # type: ignore[attr-defined]
            return  # the body arrived (or the app answered without it)
        if not cycle.response_started:
            transport.write(_reply("408 Request Timeout", f"request body not received within {self.body_timeout:g} s"))
        transport.close()

    def _drop(self, status: str, text: str) -> None:
        transport = self.transport  # type: ignore[attr-defined]
        transport.write(_reply(status, text))
        transport.close()

    def connection_made(self, transport: Any) -> None:
        full = len(self.connections) >= self.max_connections  # type: ignore[attr-defined]
        super().connection_made(transport)  # type: ignore[misc]
        if full:
            self._drop("503 Service Unavailable", f"the server holds {self.max_connections} connections, its most")
            return
        self._arm_head_deadline()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        # Counted after parsing: a chunk that completes the head may carry body bytes too.
        if self.transport.is_closing():  # type: ignore[attr-defined]
            return
        if self._awaiting_head():
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._drop("431 Request Header Fields Too Large", f"request head larger than {MAX_HEAD_BYTES} bytes")
        elif self._body_timer is None and self.cycle.more_body:  # type: ignore[attr-defined]
            # The head is in and its body is not: the body's own deadline starts now.
            self._body_timer = asyncio.get_running_loop().call_later(self.body_timeout, self._body_deadline,
                                                                     self.cycle)  # type: ignore[attr-defined]

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        if not self.transport.is_closing():  # type: ignore[attr-defined]
            self._arm_head_deadline()  # the next request's head has the same deadline

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self._write_timer is None:
            self._write_timer = asyncio.get_running_loop().call_later(self.write_timeout, self._write_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_stalled(self) -> None:
        self._write_timer = None
        self.transport.abort()  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._head_timer, self._body_timer, self._write_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = self._write_timer = None
        super().connection_lost(exc)  # type: ignore[misc]


def guarded_protocol(header_timeout: float = HEADER_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
                     write_timeout: float = WRITE_TIMEOUT, body_timeout: float = BODY_TIMEOUT) -> type:
    """The HTTP protocol class uvicorn would pick (httptools if installed, else h11) with :class:`_Guard`'s limits."""
    try:
        import httptools  # noqa: F401
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base  # type: ignore[assignment]
    attrs = {"header_timeout": header_timeout, "max_connections": max_connections, "write_timeout": write_timeout,
             "body_timeout": body_timeout}
    return type(f"Guarded{base.__name__}", (_Guard, base), attrs)


def server_config(app: Any, *, header_timeout: float = HEADER_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
                  write_timeout: float = WRITE_TIMEOUT, keep_alive: int = KEEP_ALIVE,
                  body_timeout: float = BODY_TIMEOUT, **kwargs: Any) -> Any:
    """A ``uvicorn.Config`` for ``app`` with the limits above; ``kwargs`` go to ``uvicorn.Config``."""
    import uvicorn

    kwargs.setdefault("proxy_headers", False)  # the peer's address is the client's: no header may rename it
    return uvicorn.Config(
        app,
        http=guarded_protocol(header_timeout, max_connections, write_timeout, body_timeout),
        timeout_keep_alive=keep_alive,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        **kwargs,
    )
