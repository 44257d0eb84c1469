"""What a web page of another origin can make the local server do: nothing.

A loopback server without a token trusts no page but its own: an ``Origin`` is compared
whole (scheme, name and port), because a page on another localhost port is another site
to the browser, and a ``POST`` without a body (or a form's ``text/plain`` one) reaches us
cross-origin without a preflight. Promoting a learned routine needs an explicit body. Every
response forbids framing (clickjacking the UI's buttons), and no page of the server loads
third-party scripts (FastAPI's ``/docs`` and ``/redoc``).
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from servers import serve
from test_learn import Bank, _pay_run

import engrain as eg
from engrain._server import create_app
from engrain._server.app import UI_DIR

LOCAL = "http://127.0.0.1:8765"
OTHER_PORT = "http://localhost:3999"  # another app on this machine: the prober's page
HEADERS = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def _app(tmp_path: Path, **kw):
    return create_app(f"sqlite:///{tmp_path / 'e.db'}", routines_dir=tmp_path / "routines", **kw)


def _waiting_client_run(c: TestClient, run_id: str) -> None:
    events = [{"kind": "run.started", "name": "", "data": {"task": "victim"}},
              {"kind": "input.requested", "name": "ask", "data": {"call_id": 0, "prompt": "?"}}]
    r = c.post(f"/api/runs/{run_id}/events", json={"expected_seq": 0, "events": events})
    assert r.status_code == 200, r.text


# -- bug 1: cross-origin writes from another localhost port ------------------------------------


def test_a_page_on_another_localhost_port_cannot_write(tmp_path):
    with TestClient(_app(tmp_path), base_url=LOCAL) as c:
        _waiting_client_run(c, "victim")
        # What the prober's page sent: simple requests (no body, or an empty text/plain form).
        for origin in (OTHER_PORT, "http://127.0.0.1:3999", "http://[::1]:3999", "http://localhost",
                       "https://127.0.0.1:8765", "http://127.0.0.1:8765.evil.example", "http://127.0.0.1:99999"):
            r = c.post("/api/runs/victim/cancel", headers={"origin": origin})
            assert r.status_code == 403 and r.json()["error"] == "OriginNotAllowed", origin
            r = c.post("/api/memory/consolidate", headers={"origin": origin, "content-type": "text/plain"}, content=b"")
            assert r.status_code == 403, origin
        assert c.get("/api/runs/victim").json()["run"]["status"] != "cancelled"
        # The server's own origin, under any of its loopback names, and clients that send none.
        for origin in (LOCAL, "http://localhost:8765", "http://[::1]:8765", "HTTP://LOCALHOST:8765"):
            assert c.get("/api/health", headers={"origin": origin}).status_code == 200, origin
        assert c.get("/api/health").status_code == 200
        assert c.post("/api/runs/victim/cancel", headers={"origin": LOCAL}).status_code != 403


def test_a_live_server_refuses_another_localhost_port(tmp_path):
    """Through uvicorn as ``engrain serve`` runs it (its scope, its Host header)."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    with serve(url, tmp_path, token=None) as base:
        port = base.rsplit(":", 1)[1]
        r = httpx.post(f"{base}/api/memory/consolidate", headers={"origin": f"http://localhost:{int(port) + 1}"})
        assert r.status_code == 403 and r.json()["error"] == "OriginNotAllowed"
        assert httpx.post(f"{base}/api/memory/consolidate", headers={"origin": f"http://localhost:{port}"},
                          json={}).status_code != 403
        assert httpx.get(f"{base}/api/health", headers={"origin": base}).status_code == 200


def test_allow_host_names_keep_their_port_and_a_port_entry_admits_that_origin(tmp_path):
    app = _app(tmp_path, allow_hosts=["myapp.test", "localhost:5173"])
    with TestClient(app, base_url="http://myapp.test:8765") as c:
        assert c.get("/api/health", headers={"origin": "http://myapp.test:8765"}).status_code == 200
        assert c.get("/api/health", headers={"origin": "http://localhost:8765"}).status_code == 200
        assert c.post("/api/memory/consolidate", headers={"origin": "http://myapp.test:3999"}).status_code == 403
        # Listed with its port: a front end the operator serves there may call.
        assert c.get("/api/health", headers={"origin": "http://localhost:5173"}).status_code == 200
        assert c.get("/api/health", headers={"origin": "http://localhost:5174"}).status_code == 403
    with TestClient(_app(tmp_path, allow_hosts=["*"]), base_url=LOCAL) as c:
        assert c.get("/api/health", headers={"origin": OTHER_PORT}).status_code == 200  # '*': the guard is off


def test_a_token_server_on_all_interfaces_reached_by_an_allowed_name_still_works(tmp_path):
    app = _app(tmp_path, token="t", host="0.0.0.0", allow_hosts=["box.lan"])
    with TestClient(app, base_url="http://box.lan:8765") as c:
        ok = {"Authorization": "Bearer t", "origin": "http://box.lan:8765"}
        assert c.get("/api/health", headers=ok).status_code == 200
        assert c.post("/api/memory/remember", json={"data": "x"}, headers=ok).status_code == 200
        assert c.get("/", headers={"origin": "http://box.lan:8765"}).status_code == 200
        assert c.get("/api/health", headers={"origin": "http://box.lan:8765"}).status_code == 401


def test_promote_needs_an_explicit_body(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    journal = eg.open(url)
    bank = Bank()
    _pay_run(journal, bank, "bills/may.txt")
    rid = _pay_run(journal, bank, "bills/jun.txt").last_learned.routine_id
    with TestClient(create_app(url, routines_dir=tmp_path / "routines"), base_url=LOCAL) as c:
        for kw in ({}, {"json": {}}, {"content": b"", "headers": {"content-type": "text/plain"}}):
            r = c.post(f"/api/learned/{rid}/promote", **kw)
            assert r.status_code == 422 and r.json()["error"] == "ValidationError", kw
        assert c.get(f"/api/learned/{rid}").json()["trusted"] is False
        assert c.post(f"/api/learned/{rid}/promote", json={"trusted": True}).json()["trusted"] is True
    journal.close()


# -- bug 2: framing -----------------------------------------------------------------------------


def _meta_csp() -> str:
    """The policy the UI's ``<meta>`` tag states."""
    html = (UI_DIR / "index.html").read_text()
    meta = re.search(r'http-equiv="Content-Security-Policy"\s+content="([^"]*)"', html)
    assert meta is not None
    return meta.group(1)


def _assert_secured(resp: httpx.Response, what: str) -> None:
    for name, value in HEADERS.items():
        assert resp.headers.get(name) == value, (what, name, resp.headers.get(name))
    # The page's own policy plus frame-ancestors, which browsers ignore in a <meta>: header and meta agree.
    assert resp.headers.get("content-security-policy") == f"{_meta_csp()}; frame-ancestors 'none'", what


def test_every_response_forbids_framing(tmp_path):
    app = _app(tmp_path)

    def boom() -> None:
        raise RuntimeError("boom")

    app.router.routes.insert(0, APIRoute("/api/boom", boom))  # ahead of the UI's catch-all mount
    with TestClient(app, base_url=LOCAL, raise_server_exceptions=False) as c:
        _waiting_client_run(c, "done")
        assert c.post("/api/runs/done/events", json={"expected_seq": 2, "events": [
            {"kind": "run.completed", "name": "", "data": {"output": 1}}]}).status_code == 200
        _assert_secured(c.get("/"), "ui")
        _assert_secured(c.get("/app.js"), "ui script")
        _assert_secured(c.get("/api/health"), "api")
        _assert_secured(c.get("/api/runs/nope"), "404")
        _assert_secured(c.post("/api/runs/done/events", json={"events": 3}), "422")
        _assert_secured(c.post("/api/health", headers={"origin": OTHER_PORT}), "403 of the guard")
        _assert_secured(c.get("/api/health", headers={"host": "evil.example"}), "421 of the guard")
        r = c.get("/api/boom")
        assert r.status_code == 500
        _assert_secured(r, "500")
        with c.stream("GET", "/api/runs/done/stream") as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            _assert_secured(r, "sse")
    with TestClient(_app(tmp_path, token="t"), base_url=LOCAL) as c:
        _assert_secured(c.get("/api/health"), "401")


def test_the_ui_meta_policy_is_the_header_policy():
    """``headers.UI_CSP`` (the header's policy) is the one the page states in its ``<meta>``."""
    from engrain._server import headers

    assert getattr(headers, "UI_CSP", None) == _meta_csp()


# -- bug 3: third-party scripts on the server's origin --------------------------------------------


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/docs/oauth2-redirect"])
def test_no_page_loads_scripts_from_a_cdn(tmp_path, path):
    with TestClient(_app(tmp_path), base_url=LOCAL) as c:
        r = c.get(path)
        assert r.status_code == 404 and "cdn.jsdelivr" not in r.text
        assert c.get("/openapi.json").status_code == 200  # the document stays
        for name in ("index.html", "app.js", "core.js"):
            assert "cdn." not in c.get(f"/{name}").text
