"""A run an API client writes has a budget, and its events are read a page at a time.

A client could grow one run without end through ``POST /api/runs/{id}/events``,
and every full read of it (``GET /api/runs/{id}``, its events, a stream
replaying it) would then hold all of it. Past the server's ``--max-run-events``
or ``--max-run-bytes`` an append is refused whole (413 ``RunTooLargeError``
naming the run and the limit); ``GET .../events`` is paged (``after``,
``limit`` up to 10,000) and a stream replays the journal page by page. Runs the
runtime writes are not counted. Over a real ``engrain serve`` and the ASGI app,
on SQLite and PostgreSQL.
"""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient
from servers import serve

import engrain as eg
from engrain._server import create_app

LOCAL = "http://127.0.0.1:8765"


def _batch(n: int, first: bool = False, pad: int = 0) -> list[dict]:
    out = [{"kind": "log.entry", "name": "n", "data": {"k": k, "pad": "x" * pad}} for k in range(n)]
    if first:
        out[0] = {"kind": "run.started", "data": {"task": "t", "pad": "x" * pad}}
    return out


def _append(post, run_id: str, events: list[dict], seq: int):
    return post(f"/api/runs/{run_id}/events", json={"events": events, "expected_seq": seq})


def test_a_client_run_stops_at_the_servers_event_limit(store_url, tmp_path):
    with serve(store_url, tmp_path, token=None, extra=("--max-run-events", "25")) as base:
        c = httpx.Client(base_url=base, timeout=30)
        assert _append(c.post, "big", _batch(10, first=True), 0).status_code == 200
        assert _append(c.post, "big", _batch(10), 10).status_code == 200
        r = _append(c.post, "big", _batch(10), 20)
        assert r.status_code == 413 and r.json()["error"] == "RunTooLargeError", r.text
        detail = r.json()["detail"]
        assert "run 'big'" in detail and "30 events" in detail and "limit of 25 events" in detail
        assert "--max-run-events" in detail
        assert len(c.get("/api/runs/big/events").json()) == 20  # nothing of the refused append was stored
        assert _append(c.post, "big", _batch(5), 20).status_code == 200  # up to the limit exactly
        assert _append(c.post, "big", _batch(1), 25).status_code == 413
        assert len(c.get("/api/runs/big").json()["events"]) == 25
        # Another run has a budget of its own.
        assert _append(c.post, "small", _batch(3, first=True), 0).status_code == 200


def test_the_byte_budget_counts_what_the_run_held_before_this_server_started(store_url, tmp_path):
    url = store_url
    with TestClient(create_app(url, routines_dir=tmp_path / "r", max_run_bytes=20_000), base_url=LOCAL) as c:
        assert _append(c.post, "b", _batch(1, first=True, pad=6000), 0).status_code == 200
        assert _append(c.post, "b", _batch(1, pad=6000), 1).status_code == 200
        r = _append(c.post, "b", _batch(2, pad=6000), 2)
        assert r.status_code == 413 and "limit of 20000 bytes" in r.json()["detail"], r.text
        alone = _append(c.post, "c", _batch(1, first=True, pad=30_000), 0)
        assert alone.status_code == 413 and "this append alone" in alone.json()["detail"]
    # A new server (nothing remembered) reads what the run holds once, and refuses the same append.
    with TestClient(create_app(url, routines_dir=tmp_path / "r", max_run_bytes=20_000), base_url=LOCAL) as c:
        r = _append(c.post, "b", _batch(2, pad=6000), 2)
        assert r.status_code == 413 and "it holds 12" in r.json()["detail"], r.text
        # A stale expected_seq is a conflict as ever, not a reason to read the run.
        assert _append(c.post, "b", _batch(1, pad=10), 1).status_code == 409
        assert _append(c.post, "b", _batch(1, pad=10), 2).status_code == 200
        assert len(c.get("/api/runs/b/events").json()) == 3


def test_runs_the_runtime_writes_are_not_counted(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    journal = eg.open(url)

    @eg.tool
    def step(i: int) -> int:
        return i

    def agent(task: str) -> int:
        return sum(step(i) for i in range(40))

    assert eg.run(agent, "t", run_id="rt", journal=journal).output == sum(range(40))
    with TestClient(create_app(url, routines_dir=tmp_path / "r", max_run_events=10), base_url=LOCAL) as c:
        got = c.get("/api/runs/rt").json()
        assert len(got["events"]) == 42 and got["output"] == sum(range(40))


def test_events_are_read_a_page_at_a_time(journal, tmp_path):
    n = 2500
    events = [eg.NewEvent("run.started", "", {"task": "t"})] + [eg.NewEvent("log.entry", "n", {"k": k}) for k in range(n)]
    for start in range(0, len(events), 1000):
        journal.append("long", events[start:start + 1000], start)
    with TestClient(create_app(journal.url, routines_dir=tmp_path / "r"), base_url=LOCAL) as c:
        first = c.get("/api/runs/long/events").json()
        assert [e["seq"] for e in first] == list(range(1000))  # the default page
        page = c.get("/api/runs/long/events", params={"after": 999, "limit": 10}).json()
        assert [e["seq"] for e in page] == list(range(1000, 1010))
        assert len(c.get("/api/runs/long/events", params={"limit": 10_000}).json()) == n + 1
        r = c.get("/api/runs/long/events", params={"limit": 10_001})
        assert r.status_code == 422
        assert c.get("/api/runs/long/events", params={"limit": 0}).status_code == 422
    with serve(journal.url, tmp_path, token=None) as base:
        got = eg.Client(base).events("long")  # every page, in order
        assert [e.seq for e in got] == list(range(n + 1))
        assert [e.seq for e in eg.Client(base).events("long", after=2490)] == list(range(2491, n + 1))


def test_a_stream_replays_a_long_run_page_by_page(tmp_path, monkeypatch):
    from engrain._server import runs

    monkeypatch.setattr(runs, "MAX_PAGE", 7)
    url = f"sqlite:///{tmp_path / 'e.db'}"
    j = eg.open(url)
    j.append("s", [eg.NewEvent("run.started", "", {"task": "t"})] + [eg.NewEvent("log.entry", "n", {"k": k})
                                                                       for k in range(29)], 0)
    j.append("s", [eg.NewEvent("run.completed", "", {"output": 1})], 30)
    with TestClient(create_app(url, routines_dir=tmp_path / "r"), base_url=LOCAL) as c:
        journal = c.app.state.engrain.journal
        limits: list = []
        real = journal.read

        def spy(run_id, after=-1, limit=None):
            limits.append(limit)
            return real(run_id, after, limit)

        monkeypatch.setattr(journal, "read", spy)
        text = c.get("/api/runs/s/stream").text
    ids = [int(line.split(": ", 1)[1]) for line in text.splitlines() if line.startswith("id: ")]
    assert ids == list(range(31))
    assert limits and set(limits) == {7} and len(limits) >= 5  # never the whole run at once


def test_the_limits_are_options_of_serve_and_create_app(tmp_path):
    from typer.testing import CliRunner

    from engrain._cli import app

    out = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output
    assert "--max-run-events" in out and "--max-run-bytes" in out
    with pytest.raises(eg.ConfigError, match="max_run_events must be a positive integer"):
        create_app(f"sqlite:///{tmp_path / 'e.db'}", max_run_events=0)
