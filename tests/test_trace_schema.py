"""Malformed traces are refused with a TraceError naming the event index and field (issue 12 #13)."""

from __future__ import annotations

import copy
import json
import pathlib

import pytest

import engrain as eg

ROOT = pathlib.Path(__file__).resolve().parents[1]
OURS = json.loads((ROOT / "tests" / "fixtures" / "csv_report" / "trace.json").read_text())
EM = {
    "version": "1",
    "app": {"name": "Greeter", "version": "2.0"},
    "mission": {"goal": "greet", "input_summary": {"name": "Ada"}},
    "events": [
        {"type": "tool_call", "seq": 0, "tool": "lookup", "args": {"name": "Ada"}, "result": {"id": 7}},
        {"type": "udf_call", "seq": 1, "function": "greet", "args": {"id": 7}, "result": "hi Ada"},
        {"type": "approval", "seq": 2, "prompt": "send?", "answer": True},
    ],
    "final_output": "hi Ada",
}


def ours(change):
    t = copy.deepcopy(OURS)
    change(t)
    return t


def em(change):
    t = copy.deepcopy(EM)
    change(t)
    return t


def _set(path, value):
    def change(t):
        node = t
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
    return change


def _del(path):
    def change(t):
        node = t
        for p in path[:-1]:
            node = node[p]
        del node[path[-1]]
    return change


def _nest(depth):
    v: object = 1
    for _ in range(depth):
        v = {"a": v}
    return v


# (trace, the field the error must name). Event 1 of our trace is fetch_csv's step.started.
CASES = {
    "events-string": (ours(_set(["events"], "not a list")), "events"),
    "emcore-events-string": (em(_set(["events"], "nope")), "events"),
    "null-event": (ours(_set(["events", 1], None)), "events[1]"),
    "emcore-null-event": (em(_set(["events", 0], None)), "events[0]"),
    "args-list": (ours(_set(["events", 1, "data", "args"], ["a", "b"])), "events[1].data.args"),
    "emcore-args-list": (em(_set(["events", 0, "args"], [1, 2])), "events[0].args"),
    "call-id-string": (ours(_set(["events", 1, "data", "call_id"], "0")), "events[1].data.call_id"),
    "call-id-missing": (ours(_del(["events", 1, "data", "call_id"])), "events[1].data.call_id"),
    "call-id-negative": (ours(_set(["events", 2, "data", "call_id"], -1)), "events[2].data.call_id"),
    "emcore-tool-dict": (em(_set(["events", 0, "tool"], {"x": 1})), "events[0].tool"),
    "emcore-tool-missing": (em(_del(["events", 0, "tool"])), "events[0].tool"),
    "step-name-dict": (ours(_set(["events", 1, "name"], {"x": 1})), "events[1].name"),
    "kind-unknown": (ours(_set(["events", 3, "kind"], "step.exploded")), "events[3].kind"),
    "data-list": (ours(_set(["events", 2, "data"], [1])), "events[2].data"),
    "fields-not-list": (ours(_set(["events", 5, "data", "fields"], "approved")), "events[5].data.fields"),
    "emcore-type-unknown": (em(_set(["events", 2, "type"], "shrug")), "events[2].type"),
    "emcore-mission-string": (em(_set(["mission"], "greet")), "mission"),
    "too-deep": (ours(_set(["events", 1, "data", "args"], _nest(400))), "events[1].data.args.a"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_trace_is_a_trace_error_naming_the_field(name, tmp_path):
    trace, field = CASES[name]
    with pytest.raises(eg.TraceError) as e:
        eg.compile_trace(trace, tmp_path / "pkg")
    assert e.value.field.startswith(field), (e.value.field, str(e.value))
    assert isinstance(e.value, eg.RoutineError) and isinstance(e.value, eg.EngrainError)
    assert not (tmp_path / "pkg").exists()  # nothing written
    # From a file the message names the file too.
    f = tmp_path / "t.json"
    f.write_text(json.dumps(trace))
    with pytest.raises(eg.TraceError, match=str(f)):
        eg.compile_trace(f, tmp_path / "pkg")


@pytest.mark.parametrize("bad", [[], "x", 5, None])
def test_trace_not_an_object(bad, tmp_path):
    f = tmp_path / "t.json"
    f.write_text(json.dumps(bad))
    with pytest.raises(eg.TraceError, match="must be a JSON object"):
        eg.compile_trace(f, tmp_path / "pkg")


def test_unknown_format(tmp_path):
    with pytest.raises(eg.TraceError, match="unknown trace format"):
        eg.compile_trace({"steps": []}, tmp_path / "pkg")


def test_valid_traces_still_compile(tmp_path):
    assert (eg.compile_trace(OURS, tmp_path / "a") / "routine.yaml").is_file()
    assert (eg.compile_trace(EM, tmp_path / "b") / "routine.yaml").is_file()


def test_cli_compile_malformed_trace_one_line(tmp_path):
    import subprocess
    import sys

    f = tmp_path / "t.json"
    f.write_text(json.dumps(CASES["call-id-missing"][0]))
    r = subprocess.run([str(pathlib.Path(sys.executable).with_name("engrain")), "compile", str(f), "-o", str(tmp_path / "pkg")],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "events[1].data.call_id" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_api_compile_of_a_malformed_trace_is_422_trace_error(tmp_path):
    from fastapi.testclient import TestClient

    from engrain._server import create_app

    app = create_app(f"sqlite:///{tmp_path / 'e.db'}", routines_dir=tmp_path / "routines")
    with TestClient(app, base_url="http://127.0.0.1") as c:
        r = c.post("/api/routines/compile", json={"name": "bad", "trace": CASES["args-list"][0]})
        assert r.status_code == 422 and r.json()["error"] == "TraceError"
        assert "events[1].data.args" in r.json()["detail"]
        assert not (tmp_path / "routines" / "bad").exists()
