"""Answers to a run still going that asks for nothing are refused as ``NotWaitingForInputError`` everywhere.

Locally ``eg.answer`` raises it; the HTTP API answers 409 ``NotWaitingForInput`` (also when an answer
lands between the route's read and its write); ``eg.Client`` raises it as well, beside ``RemoteError``.
It is no ``RunFinishedError``: the run is alive and may ask later.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

import engrain as eg
from engrain import _events as ev
from engrain._server import create_app

sys.path.insert(0, str(Path(__file__).parent))
from servers import serve  # noqa: E402

LOCAL = "http://127.0.0.1:8765"


def _asks(task: str) -> str:
    return eg.ask("ok?")


def _answered_once(journal, run_id: str) -> int:
    """A run that asked and was answered, not yet resumed: going, asking nothing. Its event count."""
    assert eg.run(_asks, "t", run_id=run_id, journal=journal).status == "needs_input"
    eg.answer(run_id, {"x": 1}, journal=journal)
    return len(journal.read(run_id))


def test_answering_twice_locally_is_a_typed_refusal_that_writes_nothing(store_url):
    j = eg.open(store_url)
    try:
        n = _answered_once(j, "w1")
        with pytest.raises(eg.NotWaitingForInputError) as e:
            eg.answer("w1", {"x": 2}, journal=j)
        assert isinstance(e.value, eg.EngrainError) and not isinstance(e.value, eg.RunFinishedError)
        assert e.value.run_id == "w1" and "is not waiting for input" in str(e.value)
        assert len(j.read("w1")) == n
    finally:
        j.close()


def test_an_answer_recorded_after_the_routes_read_is_409_not_waiting(store_url, tmp_path, monkeypatch):
    j = eg.open(store_url)
    try:
        n = _answered_once(j, "w2")
        app = create_app(store_url, routines_dir=tmp_path / "r")
        with TestClient(app, base_url=LOCAL) as c:
            journal = app.state.engrain.journal
            read, reads = journal.read, []

            def read_before_the_answer(run_id, *a, **kw):  # the route's read: the first answer not there yet
                got = read(run_id, *a, **kw)
                reads.append(run_id)
                return [e for e in got if e.kind != ev.INPUT_RECEIVED] if len(reads) == 1 else got

            monkeypatch.setattr(journal, "read", read_before_the_answer)
            r = c.post("/api/runs/w2/answers", json={"answers": {"x": 2}})
        assert len(reads) >= 2, reads
        assert r.status_code == 409, r.text
        assert r.json()["error"] == "NotWaitingForInput" and "run_status" not in r.json()
        assert len(j.read("w2")) == n
    finally:
        j.close()


def test_the_client_raises_the_local_error_for_the_servers_not_waiting():
    def answered(req: httpx.Request) -> httpx.Response:
        return httpx.Response(409, json={"error": "NotWaitingForInput", "detail": "run 'r' is not waiting for input"})

    with eg.Client(LOCAL, transport=httpx.MockTransport(answered)) as c, pytest.raises(
            eg.NotWaitingForInputError) as e:
        c.answer("r", {"x": 1})
    err = e.value
    assert isinstance(err, eg.RemoteError) and not isinstance(err, (eg.RunFinishedError, eg.ConflictError))
    assert err.status == 409 and err.error == "NotWaitingForInput" and err.run_id == "r"


def test_the_same_name_means_nothing_special_on_a_request_about_no_run():
    def answered(req: httpx.Request) -> httpx.Response:
        return httpx.Response(409, json={"error": "NotWaitingForInput", "detail": "odd"})

    with eg.Client(LOCAL, transport=httpx.MockTransport(answered)) as c, pytest.raises(eg.RemoteError) as e:
        c.stats()
    assert not isinstance(e.value, eg.NotWaitingForInputError)


def test_the_client_against_a_real_server(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    j = eg.open(url)
    try:
        n = _answered_once(j, "w3")
        with serve(url, tmp_path, token=None) as base, eg.Client(base) as c:
            with pytest.raises(eg.NotWaitingForInputError) as e:
                c.answer("w3", {"x": 2})
        assert e.value.status == 409 and e.value.run_id == "w3"
        assert len(j.read("w3")) == n
    finally:
        j.close()
