"""Answers to a run that has ended are refused as ``RunFinishedError`` on every surface, as data.

* The HTTP API names the error as the local one (409 ``RunFinishedError``) and puts the run and
  how it ended in the body (``run_id``, ``run_status``); ``NotWaitingForInput`` stays for a run
  still going that asks nothing. An end another writer appends between the route's read and the
  answer is refused the same way.
* ``eg.Client`` reads that body, never the wording of ``detail``; an older server's
  ``NotWaitingForInput`` with the local error's text is still understood.
* MCP's ``answer_routine`` names it as the HTTP API does.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import httpx
import pytest
from fastapi.testclient import TestClient
from mcp.server.mcpserver.exceptions import ToolError

import engrain as eg
from engrain import _events as ev
from engrain._server import create_app

sys.path.insert(0, str(Path(__file__).parent))
from servers import serve  # noqa: E402

LOCAL = "http://127.0.0.1:8765"


def _asks(task: str) -> str:
    return eg.ask("ok?")


def _cancelled_while_asking(journal, run_id: str) -> None:
    assert eg.run(_asks, "t", run_id=run_id, journal=journal).status == "needs_input"
    assert eg.cancel(run_id, journal=journal) is True


# -- the server -------------------------------------------------------------------------------


def test_the_server_names_a_finished_run_and_says_how_it_ended(store_url, tmp_path):
    j = eg.open(store_url)
    try:
        _cancelled_while_asking(j, "c1")
        assert eg.run(_asks, "t", run_id="w1", journal=j).status == "needs_input"
        with TestClient(create_app(store_url, routines_dir=tmp_path / "r"), base_url=LOCAL) as c:
            ended = c.post("/api/runs/c1/answers", json={"answers": {"x": 1}})
            assert c.post("/api/runs/w1/answers", json={"answers": {"x": 1}}).status_code == 200
            going = c.post("/api/runs/w1/answers", json={"answers": {"x": 2}})  # answered: running, asks nothing
        assert ended.status_code == 409
        body = ended.json()
        assert body["error"] == "RunFinishedError" and body["run_id"] == "c1" and body["run_status"] == "cancelled"
        assert "ended cancelled" in body["detail"]
        assert going.status_code == 409 and going.json()["error"] == "NotWaitingForInput"
        assert "run_status" not in going.json()
    finally:
        j.close()


def test_an_end_appended_after_the_routes_read_is_a_run_finished_error_too(store_url, tmp_path, monkeypatch):
    j = eg.open(store_url)
    try:
        _cancelled_while_asking(j, "c2")
        app = create_app(store_url, routines_dir=tmp_path / "r")
        with TestClient(app, base_url=LOCAL) as c:
            journal = app.state.engrain.journal
            read, reads = journal.read, []

            def read_before_the_cancel(run_id, *a, **kw):  # the route's read: the cancel not appended yet
                got = read(run_id, *a, **kw)
                reads.append(run_id)
                return [e for e in got if e.kind != ev.RUN_CANCELLED] if len(reads) == 1 else got

            monkeypatch.setattr(journal, "read", read_before_the_cancel)
            r = c.post("/api/runs/c2/answers", json={"answers": {"x": 1}})
        assert len(reads) >= 2, reads  # the answer itself read the run again and found it ended
        assert r.status_code == 409, r.text
        assert r.json()["error"] == "RunFinishedError" and r.json()["run_status"] == "cancelled"
        assert j.get_run("c2").status == "cancelled" and ev.INPUT_RECEIVED not in [e.kind for e in j.read("c2")]
    finally:
        j.close()


def test_the_openapi_error_body_declares_the_run_finished_fields(tmp_path):
    with TestClient(create_app(f"sqlite:///{tmp_path / 'd.db'}", routines_dir=tmp_path / "r"), base_url=LOCAL) as c:
        props = c.get("/openapi.json").json()["components"]["schemas"]["ErrorBody"]["properties"]
    assert {"error", "detail", "fields", "run_id", "run_status"} <= set(props)


# -- the client -------------------------------------------------------------------------------


def _client_answered(status: int, body: dict) -> eg.Client:
    return eg.Client(LOCAL, transport=httpx.MockTransport(lambda req: httpx.Response(status, json=body)))


def test_the_client_reads_how_the_run_ended_from_the_body_not_the_detail():
    body = {"error": "RunFinishedError", "detail": "worded any way at all", "run_id": "r", "run_status": "failed"}
    with pytest.raises(eg.RunFinishedError) as e:
        _client_answered(409, body).answer("r", {"x": 1})
    err = e.value
    assert isinstance(err, eg.RemoteError) and not isinstance(err, eg.ConflictError)
    assert err.status == 409 and err.error == "RunFinishedError" and err.run_status == "failed" and err.run_id == "r"


def test_the_client_still_understands_an_older_servers_not_waiting_for_input():
    detail = str(eg.RunFinishedError("r", "cancelled"))  # what servers before the structured body sent
    with pytest.raises(eg.RunFinishedError) as e:
        _client_answered(409, {"error": "NotWaitingForInput", "detail": detail}).answer("r", {"x": 1})
    assert e.value.run_status == "cancelled" and e.value.error == "NotWaitingForInput"
    with pytest.raises(eg.RemoteError) as e2:  # a run merely not waiting: no RunFinishedError
        _client_answered(409, {"error": "NotWaitingForInput", "detail": "run 'r' is not waiting for input"}).answer(
            "r", {"x": 1})
    assert not isinstance(e2.value, eg.RunFinishedError)


def test_the_client_against_a_real_server(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    j = eg.open(url)
    try:
        _cancelled_while_asking(j, "c3")
        with serve(url, tmp_path, token=None) as base, eg.Client(base) as c:
            with pytest.raises(eg.RunFinishedError) as e:
                c.answer("c3", {"x": 1})
        assert e.value.error == "RunFinishedError" and e.value.run_status == "cancelled" and e.value.status == 409
    finally:
        j.close()


# -- MCP --------------------------------------------------------------------------------------


def test_mcp_names_an_answer_to_a_finished_run_as_the_http_api_does(tmp_path):
    from engrain._mcp import build_server

    url = f"sqlite:///{tmp_path / 'm.db'}"
    j = eg.open(url)
    try:
        _cancelled_while_asking(j, "c4")  # its question is still pending: only the end says it takes no answers
        server = build_server(url, str(tmp_path / "routines"))
        with pytest.raises(ToolError) as e:
            anyio.run(server.call_tool, "answer_routine", {"run_id": "c4", "answers": {"x": 1}})
        text = str(e.value)
        assert "RunFinishedError: run 'c4' is not waiting for input: it has ended cancelled" in text
        assert "NotWaitingForInput" not in text and "NotARoutineRun" not in text
    finally:
        j.close()
