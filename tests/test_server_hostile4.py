"""Who gets past the server's token and its loopback guard: only who should.

* ``?token=`` (EventSource cannot set headers) was accepted wherever the decoded path ended in
  ``/stream``; a run id ``x/stream`` made ``GET /api/runs/x%2Fstream`` (the run's page) and
  ``DELETE /api/learned/x%2Fstream`` take the token from the URL, which ends up in logs. Only a
  ``GET`` of the stream route, matched as the router matches it, takes it now.
* Behind a root path (``uvicorn --root-path /x``, or the app mounted under a prefix) the ASGI path
  is ``/x/api/...``: the token check looked for ``/api`` at the start and served every route
  without it.
* A websocket to ``/api`` passed the token check untouched (no route is one today; the check must
  not depend on that).
* A loopback server without a token trusted its ``host`` argument: served on another address
  (``uvicorn --factory --host 0.0.0.0``), any client sending ``Host: localhost`` had the whole API.
  Such a server now answers loopback peers only.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from servers import free_port, serve
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from engrain._server import create_app

LOCAL = "http://127.0.0.1:8765"
TOKEN = "s3cret-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
ODD_ID = "x%2Fstream"  # the run id "x/stream", one path segment


def _app(tmp_path: Path, **kw):
    return create_app(f"sqlite:///{tmp_path / 'e.db'}", routines_dir=tmp_path / "routines", **kw)


def _finished_run(c, run_id: str, headers=None) -> None:
    events = [{"kind": "run.started", "name": "", "data": {"task": "t"}},
              {"kind": "run.completed", "name": "", "data": {"output": 1}}]
    r = c.post(f"/api/runs/{run_id}/events", json={"expected_seq": 0, "events": events}, headers=headers)
    assert r.status_code == 200, r.text


def _opens_stream(c, path: str) -> None:
    with c.stream("GET", path) as r:
        assert r.status_code == 200, (path, r.status_code, r.read())
        assert r.headers["content-type"].startswith("text/event-stream")


# -- ?token= only on the stream route ------------------------------------------------------------------


@pytest.mark.parametrize("method, path", [
    ("GET", f"/api/runs/{ODD_ID}"),
    ("GET", f"/api/learned/{ODD_ID}"),
    ("PUT", f"/api/learned/{ODD_ID}"),
    ("DELETE", f"/api/learned/{ODD_ID}"),
    ("DELETE", f"/api/cache/entries/{ODD_ID}"),
    ("GET", f"/api/routines/{ODD_ID}"),
    ("GET", f"/api/agents/a/sessions/{ODD_ID}"),
    ("GET", f"/api/runs/{ODD_ID}/stream/"),
    ("HEAD", f"/api/runs/{ODD_ID}/stream"),
    ("POST", f"/api/runs/{ODD_ID}/stream"),
])
def test_a_token_in_the_url_is_refused_where_the_id_ends_in_stream(tmp_path, method, path):
    with TestClient(_app(tmp_path, token=TOKEN), base_url=LOCAL, follow_redirects=False) as c:
        _finished_run(c, ODD_ID, AUTH)
        r = c.request(method, f"{path}?token={TOKEN}")
        assert r.status_code == 401, (method, path, r.status_code, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        assert c.request(method, path, headers=AUTH).status_code != 401  # the header still does


def test_a_token_in_the_url_still_opens_a_stream(tmp_path):
    with TestClient(_app(tmp_path, token=TOKEN), base_url=LOCAL) as c:
        _finished_run(c, ODD_ID, AUTH)
        _finished_run(c, "plain", AUTH)
        _opens_stream(c, f"/api/runs/plain/stream?token={TOKEN}")
        _opens_stream(c, f"/api/runs/{ODD_ID}/stream?token={TOKEN}")
        assert c.get("/api/runs/plain/stream?token=wrong").status_code == 401


def test_over_http_the_run_page_refuses_the_url_token_and_the_stream_takes_it(tmp_path):
    with serve(f"sqlite:///{tmp_path / 'e.db'}", tmp_path, token=TOKEN) as base, \
            httpx.Client(base_url=base, timeout=10) as c:
        _finished_run(c, ODD_ID, AUTH)
        r = c.get(f"/api/runs/{ODD_ID}", params={"token": TOKEN})
        assert r.status_code == 401, r.text
        assert c.get(f"/api/runs/{ODD_ID}", headers=AUTH).json()["run"]["run_id"] == "x/stream"
        _opens_stream(c, f"/api/runs/{ODD_ID}/stream?token={TOKEN}")


# -- behind a root path --------------------------------------------------------------------------------


@contextmanager
def _uvicorn(app, **config) -> Iterator[str]:
    """``app`` served by uvicorn in a thread on a free loopback port (or ``config``'s host); yields its base URL."""
    import uvicorn

    host = config.pop("host", "127.0.0.1")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def test_behind_a_root_path_every_api_route_needs_the_token(tmp_path):
    with _uvicorn(_app(tmp_path, token=TOKEN), root_path="/engrain") as base, \
            httpx.Client(base_url=base, timeout=10) as c:
        r = c.get("/api/health")
        assert r.status_code == 401, r.text
        assert c.get("/api/runs").status_code == 401
        assert c.get("/api/health", headers=AUTH).json()["auth"] is True
        _finished_run(c, ODD_ID, AUTH)
        assert c.get(f"/api/runs/{ODD_ID}?token={TOKEN}").status_code == 401
        _opens_stream(c, f"/api/runs/{ODD_ID}/stream?token={TOKEN}")
        # The literal path's wrong method is still the 405 naming POST, not the item "consolidate".
        r = c.get("/api/memory/consolidate", headers=AUTH)
        assert r.status_code == 405 and r.headers["allow"] == "POST", r.text


def test_a_mounted_app_needs_the_token(tmp_path):
    with TestClient(_app(tmp_path, token=TOKEN), base_url=LOCAL, root_path="/engrain") as c:
        assert c.get("/engrain/api/health").status_code == 401
        assert c.get("/engrain/api/health", headers=AUTH).status_code == 200


# -- websockets ----------------------------------------------------------------------------------------


def _with_echo_socket(app):
    async def echo(ws: WebSocket) -> None:
        await ws.accept()
        await ws.send_text("in")
        await ws.close()

    # Ahead of the UI's static mount at "/", which matches websockets too.
    app.router.routes.insert(0, WebSocketRoute("/api/echo", echo))
    return app


def test_a_websocket_to_the_api_needs_the_token(tmp_path):
    with TestClient(_with_echo_socket(_app(tmp_path, token=TOKEN)), base_url=LOCAL) as c:
        with pytest.raises(WebSocketDisconnect) as e, c.websocket_connect("/api/echo") as ws:
            ws.receive_text()
        assert e.value.code == 1008
        with pytest.raises(WebSocketDisconnect), c.websocket_connect(f"/api/echo?token={TOKEN}") as ws:
            ws.receive_text()
        with c.websocket_connect("/api/echo", headers=AUTH) as ws:
            assert ws.receive_text() == "in"


# -- a tokenless server answers this machine only ------------------------------------------------------


@pytest.mark.parametrize("peer, allowed", [
    (("192.0.2.7", 40000), False),
    (("2001:db8::7", 40000), False),
    (("::ffff:192.0.2.7", 40000), False),
    (("127.0.0.1", 40000), True),
    (("127.3.4.5", 40000), True),
    (("::1", 40000), True),
    (("::ffff:127.0.0.1", 40000), True),  # an IPv4 loopback client of a dual-stack socket
    (("testclient", 50000), True),  # no address: not a network peer
])
def test_a_tokenless_server_answers_loopback_clients_only(tmp_path, peer, allowed):
    app = _with_echo_socket(_app(tmp_path))
    with TestClient(app, base_url=LOCAL, client=peer) as c:
        r = c.get("/api/health", headers={"host": "127.0.0.1:8765"})
        ui = c.get("/", headers={"host": "localhost:8765"})
        if allowed:
            assert r.status_code == 200 and ui.status_code == 200, r.text
            with c.websocket_connect("/api/echo", headers={"host": "127.0.0.1:8765"}) as ws:
                assert ws.receive_text() == "in"
            return
        assert r.status_code == 403 and r.json()["error"] == "ClientNotAllowed", r.text
        assert peer[0] in r.json()["detail"]
        assert ui.status_code == 403
        with pytest.raises(WebSocketDisconnect) as e, \
                c.websocket_connect("/api/echo", headers={"host": "127.0.0.1:8765"}) as ws:
            ws.receive_text()
        assert e.value.code == 1008


def test_a_token_lets_other_machines_in(tmp_path):
    with TestClient(_app(tmp_path, token=TOKEN, host="0.0.0.0"), base_url=LOCAL, client=("192.0.2.7", 1)) as c:
        assert c.get("/api/health", headers=AUTH).status_code == 200


def _own_address() -> str | None:
    """An IPv4 address of this machine that is not loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        except OSError:
            return None
        addr = s.getsockname()[0]
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


def test_a_tokenless_app_served_on_every_address_refuses_other_machines(tmp_path):
    addr = _own_address()
    if addr is None:
        pytest.skip("this machine has no address off loopback")
    # create_app believes it is on loopback (its default host); uvicorn serves it everywhere.
    with _uvicorn(_app(tmp_path), host="0.0.0.0") as base:
        port = base.rsplit(":", 1)[1]
        r = httpx.get(f"http://{addr}:{port}/api/runs", headers={"host": f"localhost:{port}"}, timeout=10)
        assert r.status_code == 403 and r.json()["error"] == "ClientNotAllowed", r.text
        assert httpx.get(f"{base}/api/runs", timeout=10).status_code == 200
