"""Trust comes from configuration and the routine, never from journal data a client can write (issue 12 #7, #9)."""

from __future__ import annotations

import pathlib

import pytest
from fastapi.testclient import TestClient

import engrain as eg
from engrain._server import create_app

LOCAL = "http://127.0.0.1:8765"

UNTRUSTED = """
name: untrusted
trusted: false
inputs: {type: object}
steps:
- id: q
  type: prompt.user
  prompt: "go?"
  fields: [{name: ok, type: text}]
- id: touch
  type: udf.call
  function: touch
  args: {path: "MARKER"}
- id: out
  type: return
  value: "{{ touch }}"
"""

# Writes a file on the host when it runs natively; in the sandbox no directory is visible.
UDFS = "def touch(path):\n    open(path, 'w').write('native')\n    return 'native'\n"


def make_routine(root: pathlib.Path, marker: pathlib.Path) -> pathlib.Path:
    folder = root / "untrusted"
    folder.mkdir(parents=True)
    (folder / "routine.yaml").write_text(UNTRUSTED.replace("MARKER", str(marker)))
    (folder / "udfs.py").write_text(UDFS)
    return folder


def forged_start(folder: pathlib.Path, **extra) -> list[dict]:
    """The events of a routine run paused at its prompt, as a client would forge them, sandbox off."""
    started = {"task": "routine untrusted", "tags": ["routine"],
               "inputs": {"routine": str(folder), "inputs": {}, "sandbox": False, "tools": None, **extra}}
    asked = {"call_id": 0, "prompt": "go?", "fields": [{"name": "ok", "type": "text"}]}
    return [{"kind": "run.started", "data": started}, {"kind": "input.requested", "name": "q", "data": asked}]


@pytest.fixture
def server(tmp_path, store_url):
    app = create_app(store_url, routines_dir=tmp_path / "routines")
    with TestClient(app, base_url=LOCAL) as c:
        yield c


def test_api_refuses_forged_routine_run_and_sandbox_stays_on(server, tmp_path):
    marker = tmp_path / "pwned"
    folder = make_routine(tmp_path / "routines", marker)
    r = server.post("/api/runs/forged/events", json={"events": forged_start(folder), "expected_seq": 0})
    assert r.status_code == 403 and r.json()["error"] == "RuntimeOnlyError"
    assert "routine" in r.json()["detail"] and "POST /api/runs" in r.json()["detail"]
    for tags in (["agent", "agent:pay"], ["client"]):
        bad = [{"kind": "run.started", "data": {"task": "t", "tags": tags}}]
        assert server.post("/api/runs/x/events", json={"events": bad, "expected_seq": 0}).status_code == 403
    assert server.get("/api/runs/forged").status_code == 404
    r = server.post("/api/runs/forged/answers", json={"answers": {"ok": "y"}})
    assert r.status_code == 404 and not marker.exists()


def test_api_refuses_appends_to_runtime_runs(server, tmp_path):
    marker = tmp_path / "pwned"
    make_routine(tmp_path / "routines", marker)
    paused = server.post("/api/runs", json={"routine": "untrusted"}).json()
    assert paused["status"] == "needs_input"
    fake = {"kind": "step.completed", "name": "touch", "data": {"call_id": 1, "result": "forged"}}
    r = server.post(f"/api/runs/{paused['run_id']}/events", json={"events": [fake], "expected_seq": 2})
    assert r.status_code == 403 and r.json()["error"] == "RuntimeOnlyError"
    # A run written by engrain.run in-process is the runtime's too.
    j = eg.open(server.app.state.engrain.journal.url)
    res = eg.run(lambda task: task.upper(), "local", journal=j)
    r = server.post(f"/api/runs/{res.run_id}/events", json={"events": [fake], "expected_seq": 2})
    assert r.status_code == 403


def test_client_runs_are_appendable_and_never_resumed(server, tmp_path):
    marker = tmp_path / "pwned"
    folder = make_routine(tmp_path / "routines", marker)
    own = [{"kind": "run.started", "data": {"task": "mine", "inputs": {"routine": str(folder)}, "tags": ["x"]}}]
    stored = server.post("/api/runs/mine/events", json={"events": own, "expected_seq": 0}).json()
    assert stored[0]["data"]["tags"] == ["x", "client"]
    asked = {"kind": "input.requested", "name": "q", "data": {"call_id": 0, "prompt": "go?", "fields": []}}
    assert server.post("/api/runs/mine/events", json={"events": [asked], "expected_seq": 1}).status_code == 200
    again = {"kind": "run.started", "data": {"task": "again"}}
    r = server.post("/api/runs/mine/events", json={"events": [again], "expected_seq": 2})
    assert r.status_code == 422 and "seq 0" in r.json()["detail"]
    r = server.post("/api/runs/mine/answers", json={"answers": {"ok": "y"}})
    assert r.status_code == 200 and r.json()["resumed"] is False and not marker.exists()


def test_resume_ignores_recorded_sandbox_off(tmp_path, store_url):
    """A journal saying sandbox=false (written by anyone with store access) cannot unsandbox an untrusted UDF."""
    marker = tmp_path / "pwned"
    folder = make_routine(tmp_path / "routines", marker)
    j = eg.open(store_url)
    events = forged_start(folder)
    j.append("forged", [eg.NewEvent(e["kind"], e.get("name", ""), e["data"]) for e in events], 0)
    # upgrade=True: the forged start records no file digests; the test is that sandbox=false is not obeyed
    res = eg.resume_routine("forged", {"ok": "y"}, tools=eg.ToolRegistry(), journal=j, upgrade=True)
    assert res.status == "failed" and "touch" in res.error
    assert not marker.exists()
    started = j.read("forged")[0].data
    assert started["inputs"]["sandbox"] is False  # the record stays; it was just not obeyed


def test_resume_never_imports_a_tools_module_named_in_the_journal(tmp_path, store_url):
    marker = tmp_path / "imported"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('x')\nreg = {{}}\n")
    folder = make_routine(tmp_path / "routines", tmp_path / "pwned")
    j = eg.open(store_url)
    events = forged_start(folder, tools=f"{evil}:reg")
    j.append("forged", [eg.NewEvent(e["kind"], e.get("name", ""), e["data"]) for e in events], 0)
    with pytest.raises(eg.RoutineInputError, match="--tools .*evil.py:reg; pass the same registry"):
        eg.resume_routine("forged", {"ok": "y"}, journal=j)
    assert not marker.exists()


@pytest.mark.parametrize("origin", ["null", "NULL", " null"])
def test_origin_null_is_foreign(tmp_path, origin):
    app = create_app(f"sqlite:///{tmp_path / 'e.db'}", routines_dir=tmp_path / "routines")
    with TestClient(app, base_url=LOCAL) as c:
        r = c.post("/api/memory/consolidate", json={}, headers={"origin": origin})
        assert r.status_code == 403 and r.json()["error"] == "OriginNotAllowed"
        assert c.get("/api/health").status_code == 200  # no Origin: a non-browser client
        assert c.get("/api/health", headers={"origin": LOCAL}).status_code == 200


def test_a_routine_run_cannot_continue_a_client_run(server, tmp_path):
    """A client run with forged step results is not replayed as a routine run's history."""
    make_routine(tmp_path / "routines", tmp_path / "pwned")
    own = [{"kind": "run.started", "data": {"task": "routine untrusted", "inputs": {}}}]
    assert server.post("/api/runs/mine/events", json={"events": own, "expected_seq": 0}).status_code == 200
    r = server.post("/api/runs", json={"routine": "untrusted", "run_id": "mine"})
    assert r.status_code == 409 and r.json()["error"] == "RunMismatchError"
    # Its own run id continues as before.
    first = server.post("/api/runs", json={"routine": "untrusted", "run_id": "r1"}).json()
    again = server.post("/api/runs", json={"routine": "untrusted", "run_id": "r1"}).json()
    assert first["status"] == again["status"] == "needs_input"
