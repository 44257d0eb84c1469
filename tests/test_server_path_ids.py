"""Ids holding ``/`` (or ``%``, or only dots) are one path segment of the HTTP API, on a real server.

A LangGraph thread ``user/42`` makes the run id ``langgraph:user/42``; such a run used to be
unreachable over HTTP (404 for its page, its answers, its cancel), because the server routed on
the decoded path. It now routes on the raw path (``contract.EncodedSlashes``), ``eg.Client`` and the
web UI send each id as one segment, and every templated route reads its ids decoded.
Starlette's ``TestClient`` decodes a path twice, so these tests use a real ``engrain serve``. (An id made
only of dots is reachable through ``eg.Client``, not from a browser, whose URL parser resolves ``%2E%2E``.)
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

import engrain as eg
from engrain._server.contract import routed_path
from tests.servers import serve

IDS = ["user/42", "langgraph:a/b/c", "p/q/answers", "a%2Fb", "50%", "%41", "..", ".", "é/✓", "x y", "a?b#c"]
CHROMIUM = os.environ.get("ENGRAIN_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def _asks(task: str) -> str:
    return eg.ask("name?")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp: Path = tmp_path_factory.mktemp("path-ids")
    url = f"sqlite:///{tmp / 's.db'}"
    j = eg.open(url)
    try:
        for rid in IDS:
            assert eg.run(_asks, f"task of {rid}", run_id=rid, journal=j).status == "needs_input"
        j.append("user/42/stream", [eg.NewEvent("run.started", "", {"task": "a decoy"})], 0)
    finally:
        j.close()
    with serve(url, tmp, token=None, allow_fork=True) as base:
        yield {"base": base, "url": url}


def test_every_run_route_reaches_a_run_whose_id_holds_a_slash(server):
    with eg.Client(server["base"]) as c:
        for rid in IDS:
            assert c.get_run(rid).run_id == rid, rid
            assert c.show(rid)["run"]["task"] == f"task of {rid}", rid
            assert [e.kind for e in c.events(rid)][:1] == ["run.started"], rid
        assert c.answer("p/q/answers", {"x": 1}).status == "running"
        assert c.cancel("user/42") is True and c.get_run("user/42").status == "cancelled"
        forked = c.fork("langgraph:a/b/c", 0, run_id="fork/of/abc")
        assert forked == "fork/of/abc" and c.show(forked)["run"]["run_id"] == "fork/of/abc"
        assert c.get_run("user/42/stream").task == "a decoy"  # a run, not user/42's stream
        assert c.get_run("user") is None and c.get_run("user/43") is None


def test_the_stream_of_such_a_run(server):
    url = f"{server['base']}/api/runs/{'langgraph:a%2Fb%2Fc'}/stream"
    with httpx.stream("GET", url, timeout=10) as r:  # a live stream: read until its first event
        assert r.status_code == 200
        first = next(line for line in r.iter_lines() if line.startswith("data:"))
    assert "run.started" in first and "langgraph:a/b/c" in first


def test_a_path_split_at_its_slashes_still_names_no_run(server):
    r = httpx.get(f"{server['base']}/api/runs/user/42")  # not encoded: two segments, no route
    assert r.status_code == 404 and r.json()["error"] == "NotFound"
    r = httpx.get(f"{server['base']}/api/runs/nobody%2Fhere")
    assert r.status_code == 404 and r.json()["error"] == "RunNotFoundError"


def test_the_web_ui_opens_such_a_run(server):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (scripts/test.sh does)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True, timeout=30_000)
        try:
            pg = b.new_page()
            errors: list[str] = []
            pg.on("pageerror", lambda e: errors.append(str(e)))
            pg.goto(f"{server['base']}/#/runs")
            pg.locator("a.mono", has_text="langgraph:a/b/c").first.click()
            expect(pg.locator("h1 .mono")).to_have_text("langgraph:a/b/c")
            expect(pg.locator("#run-view")).to_contain_text("task of langgraph:a/b/c")
            pg.goto(f"{server['base']}/#/runs/a%252Fb")  # the id "a%2Fb" itself
            expect(pg.locator("h1 .mono")).to_have_text("a%2Fb")
            expect(pg.locator("#run-view")).to_contain_text("task of a%2Fb")
            assert not errors, errors
        finally:
            b.close()


@pytest.mark.parametrize(("raw", "decoded", "routed"), [
    (b"/api/runs/a%2Fb", "/api/runs/a/b", "/api/runs/a%2Fb"),
    (b"/api/runs/a%2fb/answers", "/api/runs/a/b/answers", "/api/runs/a%2Fb/answers"),
    (b"/api/runs/a%252Fb", "/api/runs/a%2Fb", "/api/runs/a%252Fb"),
    (b"/api/runs/%C3%A9%20x", "/api/runs/\u00e9 x", "/api/runs/\u00e9 x"),
    (b"/api/runs/50%", "/api/runs/50%", "/api/runs/50%"),
    # No raw path, or one that disagrees (a proxy rewrote it): the decoded path, with "%" kept literal.
    (None, "/api/runs/a/b", "/api/runs/a/b"),
    (None, "/api/runs/50%", "/api/runs/50%25"),
    (b"/other/a%2Fb", "/api/runs/a%b", "/api/runs/a%25b"),
    (b"/api/\xff", "/api/x", "/api/x"),
])
def test_the_routed_path_keeps_only_what_splits_or_names_an_id(raw, decoded, routed):
    assert routed_path(raw, decoded) == routed
