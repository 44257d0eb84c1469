"""Nesting limits at every input boundary: journal, API bodies, traces, routine files (issue 12 #10)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

import engrain as eg
from engrain._events import MAX_DEPTH
from engrain._server import create_app

LOCAL = "http://127.0.0.1:8765"


def nest(depth: int, leaf: object = 1) -> object:
    v = leaf
    for _ in range(depth):
        v = {"a": v}
    return v


@pytest.fixture
def client(store_url, tmp_path):
    with TestClient(create_app(store_url, routines_dir=tmp_path / "routines"), base_url=LOCAL) as c:
        yield c


def test_journal_refuses_deep_data_and_accepts_the_limit(journal):
    journal.append("r", [eg.NewEvent("run.started", "", {"task": "t"})], 0)
    with pytest.raises(eg.JSONTooDeepError, match=f"nested deeper than {MAX_DEPTH}") as e:
        journal.append("r", [eg.NewEvent("step.completed", "t", {"call_id": 0, "result": nest(500)})], 1)
    assert isinstance(e.value, eg.NotJSONError) and "event 0" in str(e.value) and "['result']" in str(e.value)
    journal.append("r", [eg.NewEvent("step.completed", "t", {"call_id": 0, "result": nest(MAX_DEPTH - 2)})], 1)
    assert len(journal.read("r")) == 2


def test_journal_refuses_the_shortest_too_deep_value(journal):
    # Only texts longer than 2 * MAX_DEPTH are searched for depth: the shortest too-deep value
    # (bare lists, MAX_DEPTH + 1 containers with the event's dict) is still one of them.
    def lists(n: int) -> object:
        v: object = 0
        for _ in range(n):
            v = [v]
        return v

    journal.append("r", [eg.NewEvent("run.started", "", {"task": "t"})], 0)
    with pytest.raises(eg.JSONTooDeepError):
        journal.append_one("r", "step.completed", "t", {"r": lists(MAX_DEPTH)}, 1)
    with pytest.raises(eg.JSONTooDeepError):
        journal.append("r", [eg.NewEvent("step.completed", "t", {"r": lists(MAX_DEPTH)})], 1)
    journal.append_one("r", "step.completed", "t", {"r": lists(MAX_DEPTH - 1)}, 1)  # at the limit
    assert [e.data for e in journal.read("r")][1] == {"r": lists(MAX_DEPTH - 1)}


def test_deep_tool_result_fails_the_step_not_the_store(tmp_path):
    j = eg.open(f"sqlite:///{tmp_path / 'd.db'}")
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg)
    def deep() -> dict:
        return nest(300)

    res = eg.run(lambda task: deep(), "deep", journal=j)
    assert res.status == "failed" and "nested deeper" in res.error
    assert j.read(res.run_id)[-1].kind == "run.failed"


def test_api_event_nested_500_deep_is_422_and_the_run_stays_readable(client):
    start = {"kind": "run.started", "data": {"task": "t"}}
    assert client.post("/api/runs/r/events", json={"events": [start], "expected_seq": 0}).status_code == 200
    deep = {"kind": "step.completed", "name": "t", "data": {"call_id": 0, "result": nest(500)}}
    r = client.post("/api/runs/r/events", json={"events": [deep], "expected_seq": 1})
    assert r.status_code == 422 and "nested deeper than" in r.json()["detail"]
    assert "body.events[0].data.result" in r.json()["detail"]
    assert client.get("/api/runs/r").status_code == 200


@pytest.mark.parametrize("path,body", [
    ("/api/runs", {"routine": "x", "inputs": nest(200)}),
    ("/api/runs/r/answers", {"answers": nest(200)}),
    ("/api/routines/x/run", {"inputs": nest(200)}),
    ("/api/routines/compile", {"name": "deep", "trace": {"events": [{"kind": "run.started", "data": nest(400)}]}}),
    ("/api/memory/remember", {"data": nest(200)}),
])
def test_api_bodies_nested_too_deep_are_422_naming_the_field(client, path, body):
    r = client.post(path, json=body)
    assert r.status_code == 422, r.text
    field = next(k for k in body if isinstance(body[k], dict) and k != "name")
    assert r.json()["error"] == "ValidationError" and f"body.{field}" in r.json()["detail"]


def test_api_body_too_deep_to_parse_is_4xx(client):
    raw = "[" * 100_000 + "]" * 100_000
    r = client.post("/api/runs", content=raw, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500


def test_compile_trace_nested_400_deep_is_a_trace_error(tmp_path):
    trace = {"format": "engrain.trace/1", "events": [{"kind": "run.started", "data": {"inputs": nest(400)}}]}
    with pytest.raises(eg.TraceError, match="nested deeper"):
        eg.compile_trace(trace, tmp_path / "pkg")
    f = tmp_path / "t.json"
    f.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(eg.TraceError):
        eg.compile_trace(f, tmp_path / "pkg")


@pytest.mark.parametrize("depth", [400, 5000])
def test_routine_file_nested_too_deep_is_an_issue(tmp_path, depth, yaml_parser):
    pkg = tmp_path / "deep"
    pkg.mkdir()
    value = "[" * depth + "]" * depth
    (pkg / "routine.yaml").write_text(f"name: deep\ninputs: {{type: object}}\nsteps:\n- id: a\n  type: return\n  value: {value}\n")
    issues = eg.validate_routine(pkg)
    # The same words whether libyaml (with its own nesting limit) or the pure-Python parser read it.
    assert len(issues) == 1 and issues[0].message == f"nested deeper than {MAX_DEPTH} levels", issues
    with pytest.raises(eg.RoutineError, match="nested deeper"):
        eg.load_routine(pkg)


def test_check_json_names_path_for_depth():
    from engrain._events import check_json

    with pytest.raises(eg.JSONTooDeepError) as e:
        check_json({"x": [nest(MAX_DEPTH)]}, "tool 'f'", "result")
    assert e.value.where == "tool 'f'" and e.value.path.startswith("result['x'][0]")
    check_json(nest(MAX_DEPTH), "tool 'f'", "result")  # exactly at the limit: fine
    json.dumps(nest(MAX_DEPTH))
