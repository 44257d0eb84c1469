"""The security headers every HTTP response carries: the UI's Content-Security-Policy, no framing, no sniffing.

:class:`SecurityHeaders` adds them to what the app answers (API, UI, errors, SSE); the
app's handler of unexpected exceptions adds them itself, since Starlette answers those
outside the middlewares.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
