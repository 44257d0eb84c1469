"""HTTP server (engrain serve): every route family, auth, limits, errors, SSE, and engrain.Client."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from fastapi.testclient import TestClient

import engrain as eg
from engrain._server import create_app

#: A loopback server without a token refuses TestClient's default Host (testserver) as DNS rebinding.
LOCAL = "http://127.0.0.1:8765"


@pytest.fixture
def app_url(store_url):
    return store_url


@pytest.fixture
def client(store_url, tmp_path):
    app = create_app(store_url, routines_dir=tmp_path / "routines")
    with TestClient(app, base_url=LOCAL) as c:
        yield c


@pytest.fixture
def sqlite_client(tmp_path):
    app = create_app(f"sqlite:///{tmp_path / 'e.db'}", routines_dir=tmp_path / "routines")
    with TestClient(app, base_url=LOCAL) as c:
        yield c


def make_tool_run(url: str, task: str = "add things", tags: list[str] | None = None) -> eg.RunResult:
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg)
    def add(a: int, b: int) -> int:
        time.sleep(0.002)
        return a + b

    @eg.tool(registry=reg)
    def boom(x: int) -> int:
        raise ValueError(f"bad x {x}")

    def agent(task: str, n: int = 1) -> int:
        total = add(n, 2)
        try:
            boom(total)
        except ValueError:
            pass
        return add(total, 10)

    j = eg.open(url)
    try:
        return eg.run(agent, task, inputs={"n": 3}, tags=tags or ["demo"], journal=j)
    finally:
        j.close()


def asking_run(url: str, task: str = "needs a name", run_id: str | None = None) -> eg.RunResult:
    def agent(task: str) -> str:
        got = eg.ask("What name?", [{"name": "name", "type": "text"}])
        return f"hello {got['name']}"

    j = eg.open(url)
    try:
        return eg.run(agent, task, run_id=run_id, journal=j)
    finally:
        j.close()


# -- runs ----------------------------------------------------------------------------


def test_health_and_openapi(client):
    h = client.get("/api/health").json()
    assert h["ok"] is True and h["auth"] is False and h["backend"] in ("sqlite", "postgres")
    spec = client.get("/openapi.json").json()
    for path in ("/api/runs", "/api/runs/{run_id}", "/api/runs/{run_id}/stream", "/api/cache/stats",
                 "/api/memory/recall", "/api/routines", "/api/routines/compile"):
        assert path in spec["paths"], path


def test_runs_list_get_events_and_steps(client, store_url):
    res = make_tool_run(store_url)
    assert res and res.output == 15
    other = make_tool_run(store_url, task="other task", tags=["x"])
    rows = client.get("/api/runs").json()
    assert {r["run_id"] for r in rows} == {res.run_id, other.run_id}
    assert [r["run_id"] for r in client.get("/api/runs", params={"tag": "x"}).json()] == [other.run_id]
    assert client.get("/api/runs", params={"status": "failed"}).json() == []
    assert len(client.get("/api/runs", params={"limit": 1}).json()) == 1
    detail = client.get(f"/api/runs/{res.run_id}").json()
    assert detail["run"]["status"] == "ok" and detail["output"] == 15 and detail["prompt"] is None
    steps = detail["steps"]
    assert [s["name"] for s in steps] == ["add", "boom", "add"]
    assert steps[0]["args"] == {"a": 3, "b": 2} and steps[0]["result"] == 5 and steps[0]["state"] == "completed"
    assert steps[1]["state"] == "failed" and steps[1]["error"]["type"] == "ValueError"
    assert all(s["duration_ms"] is not None and s["duration_ms"] >= 0 and s["attempts"] == 1 for s in steps)
    assert steps[0]["duration_ms"] >= 1.0 and steps[0]["replayed"] is False
    events = client.get(f"/api/runs/{res.run_id}/events").json()
    assert [e["seq"] for e in events] == list(range(len(events))) and events[-1]["kind"] == "run.completed"
    tail = client.get(f"/api/runs/{res.run_id}/events", params={"after": len(events) - 2}).json()
    assert [e["seq"] for e in tail] == [len(events) - 1]


def test_run_errors_are_clear_4xx(client):
    r = client.get("/api/runs/nope")
    assert r.status_code == 404 and r.json()["error"] == "RunNotFoundError" and "nope" in r.json()["detail"]
    assert client.get("/api/runs/nope/events").status_code == 404
    assert client.get("/api/runs/nope/stream").status_code == 404
    r = client.get("/api/runs", params={"status": "bogus"})
    assert r.status_code == 422 and r.json()["error"] == "ValidationError" and "status" in r.json()["detail"]
    assert client.get("/api/runs", params={"limit": 0}).status_code == 422
    r = client.post("/api/runs", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert client.post("/api/runs/nope/answers", json={"answers": {}}).status_code == 404
    r = client.post("/api/runs", json={"routine": "../etc", "inputs": {}})  # the document's name pattern
    assert r.status_code == 422 and "body.routine" in r.json()["detail"]
    r = client.post("/api/runs", json={"routine": "missing", "inputs": {}})
    assert r.status_code in (404, 501)


def test_answer_records_input_and_rejects_a_second_answer(client, store_url):
    res = asking_run(store_url)
    assert res.status == "needs_input"
    detail = client.get(f"/api/runs/{res.run_id}").json()
    assert detail["run"]["status"] == "needs_input" and detail["prompt"]["prompt"] == "What name?"
    assert detail["steps"][0]["state"] == "waiting"
    assert client.get("/api/runs", params={"status": "needs_input"}).json()[0]["run_id"] == res.run_id
    r = client.post(f"/api/runs/{res.run_id}/answers", json={"answers": {"name": "Ada"}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["resumed"] is False and body["status"] == "running"
    r2 = client.post(f"/api/runs/{res.run_id}/answers", json={"answers": {"name": "Bob"}})
    assert r2.status_code == 409 and r2.json()["error"] == "NotWaitingForInput"
    # The agent's own process resumes it and gets the answer recorded over HTTP.
    done = asking_run(store_url, run_id=res.run_id)
    assert done.status == "ok" and done.output == "hello Ada"
    steps = client.get(f"/api/runs/{res.run_id}").json()["steps"]
    assert steps[0]["state"] == "answered" and steps[0]["result"] == {"name": "Ada"}


def test_append_with_optimistic_concurrency(client):
    new = {"events": [{"kind": "run.started", "data": {"task": "appended", "inputs": {}, "tags": []}}], "expected_seq": 0}
    r = client.post("/api/runs/r1/events", json=new)
    assert r.status_code == 200 and r.json()[0]["seq"] == 0
    r = client.post("/api/runs/r1/events", json=new)
    assert r.status_code == 409 and r.json()["error"] == "ConflictError"
    step = {"kind": "step.started", "name": "t", "data": {"call_id": 0, "type": "tool", "name": "t", "args": {}}}
    assert client.post("/api/runs/r1/events", json={"events": [step], "expected_seq": 1}).status_code == 200
    r = client.post("/api/runs/r1/events", json={"events": [{"kind": "no.such"}], "expected_seq": 2})
    assert r.status_code == 422 and "kind" in r.json()["detail"]
    bad = b'{"events": [{"kind": "step.completed", "data": {"x": NaN}}], "expected_seq": 2}'
    r = client.post("/api/runs/r1/events", content=bad, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"] == "NotJSONError"
    r = client.post("/api/runs/r2/events", json={"events": [step], "expected_seq": 0})
    assert r.status_code == 422
    assert client.post("/api/runs/r3/events", json={"events": [step], "expected_seq": 4}).status_code == 404
    assert client.get("/api/runs/r1").json()["run"]["events"] == 2


def test_sse_stream_receives_events_appended_while_streaming(client, store_url):
    j = eg.open(store_url)
    j.append("live", [eg.NewEvent("run.started", "", {"task": "live", "inputs": {}, "tags": []})], 0)

    def writer() -> None:
        time.sleep(0.3)
        for i in range(3):
            j.append("live", [eg.NewEvent("step.started", "t", {"call_id": i, "type": "tool", "args": {"i": i}})], 1 + 2 * i)
            j.append("live", [eg.NewEvent("step.completed", "t", {"call_id": i, "result": i})], 2 + 2 * i)
            time.sleep(0.05)
        j.append("live", [eg.NewEvent("run.completed", "", {"output": "done"})], 7)

    t = threading.Thread(target=writer)
    t.start()
    try:
        with client.stream("GET", "/api/runs/live/stream") as resp:
            assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
            text = "".join(resp.iter_text())
    finally:
        t.join(10)
        j.close()
    frames = [f for f in text.split("\n\n") if f.startswith("id:")]
    kinds = [f.split("\n")[1].removeprefix("event: ") for f in frames]
    assert kinds == ["run.started"] + ["step.started", "step.completed"] * 3 + ["run.completed"]
    data = [json.loads(f.split("\n")[2].removeprefix("data: ")) for f in frames]
    assert [d["seq"] for d in data] == list(range(8)) and data[-1]["data"]["output"] == "done"
    # A finished run streams only what is after `after`, then ends.
    with client.stream("GET", "/api/runs/live/stream", params={"after": 5}) as resp:
        tail = "".join(resp.iter_text())
    assert [ln for ln in tail.split("\n") if ln.startswith("id:")] == ["id: 6", "id: 7"]


# -- security and limits ---------------------------------------------------------------


def test_non_loopback_host_requires_a_token(tmp_path, monkeypatch):
    monkeypatch.delenv("ENGRAIN_TOKEN", raising=False)
    url = f"sqlite:///{tmp_path / 'e.db'}"
    with pytest.raises(eg.ConfigError, match="token"):
        create_app(url, host="0.0.0.0")
    with pytest.raises(eg.ConfigError):
        create_app(url, host="192.168.1.10")
    create_app(url, host="::1")
    create_app(url, host="localhost")
    create_app(url, token="s3cret", host="0.0.0.0")
    monkeypatch.setenv("ENGRAIN_TOKEN", "from-env")
    assert create_app(url, host="0.0.0.0").state.engrain.token == "from-env"


def test_bearer_token_guards_every_api_route(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    with TestClient(create_app(url, token="s3cret", host="0.0.0.0")) as c:
        for method, path in [("GET", "/api/health"), ("GET", "/api/runs"), ("GET", "/api/runs/x"),
                             ("GET", "/api/cache/stats"), ("POST", "/api/memory/recall"), ("GET", "/api/routines")]:
            r = c.request(method, path)
            assert r.status_code == 401 and r.json()["error"] == "Unauthorized", path
            assert c.request(method, path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = {"Authorization": "Bearer s3cret"}
        assert c.get("/api/health", headers=ok).json()["auth"] is True
        assert c.get("/api/runs", headers=ok).status_code == 200
        eg.open(url).append("s", [eg.NewEvent("run.completed", "", {"output": 1})], 0)
        assert c.get("/api/runs/s/stream", params={"token": "s3cret"}).status_code == 200
        assert c.get("/api/runs/s/stream", params={"token": "nope"}).status_code == 401
        assert c.get("/api/runs", params={"token": "s3cret"}).status_code == 401  # query token only for SSE
        assert c.get("/openapi.json").status_code == 200


def test_body_size_limit_gives_413(sqlite_client):
    big = b'{"data": "' + b"x" * (3 * 1024 * 1024) + b'"}'
    r = sqlite_client.post("/api/memory/remember", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "PayloadTooLarge"

    def chunks():
        yield b'{"data": "'
        for _ in range(40):
            yield b"y" * 65536
        yield b'"}'

    r = sqlite_client.post("/api/memory/remember", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_unknown_route_is_json_404(sqlite_client):
    r = sqlite_client.get("/api/nope")
    assert r.status_code == 404 and r.json()["error"] == "NotFound"


# -- cache -------------------------------------------------------------------------------


def test_cache_entries_stats_evict(client, store_url):
    from tests.test_cache import World, make_engine

    world = World()
    engine, calls = make_engine(store_url, world)
    assert not engine("fill the form: Ada")
    world.screen = "login"
    hit = engine("fill the form: Ada")
    assert hit and calls["agent"] == 1
    engine.store.flush()
    entries = client.get("/api/cache/entries").json()
    assert len(entries) == 1 and entries[0]["task"].startswith("fill the form") and len(entries[0]["steps"]) == 3
    st = client.get("/api/cache/stats").json()
    assert st["hits"] == 1 and st["misses"] == 1 and st["entries"] == 1
    assert st["hit_rate"] == 0.5 and st["agent_calls_saved"] == 1
    steps = client.get(f"/api/runs/{hit.run_id}").json()["steps"]
    tools = [s for s in steps if s["type"] == "tool"]
    assert [s["name"] for s in tools] == ["type_text", "type_text", "click"] and all(s["replayed"] for s in tools)
    eid = entries[0]["id"]
    assert client.delete(f"/api/cache/entries/{eid}").json() == {"evicted": eid}
    r = client.delete(f"/api/cache/entries/{eid}")
    assert r.status_code == 404 and r.json()["error"] == "CacheEntryNotFoundError"
    assert client.get("/api/cache/entries").json() == []


# -- memory ------------------------------------------------------------------------------


def test_memory_routes(sqlite_client):
    c = sqlite_client
    ids = [c.post("/api/memory/remember", json={"data": text, "skill": "ops", "metadata": {"n": i}}).json()["id"]
           for i, text in enumerate(["Deploys happen on Tuesdays after the standup",
                                     "Deploys are frozen during the last week of December",
                                     "The office coffee machine is on floor 3"])]
    assert len(set(ids)) == 3
    hits = c.post("/api/memory/recall", json={"query": "when do we deploy?", "skill": "ops", "top_k": 2}).json()
    assert len(hits) == 2 and "Deploy" in hits[0]["content"] and hits[0]["tier"] == "record"
    assert c.get("/api/memory/stats").json()["records"] == 3
    summary = c.post("/api/memory/consolidate", json={}).json()
    assert summary["errors"] == [] and summary["formed"] >= 1
    arts = c.get("/api/memory/articles").json()
    assert arts and all(s["id"] in ids for a in arts for s in a["sources"])
    assert c.get("/api/memory/articles", params={"skill": "nope"}).json() == []
    out = c.post("/api/memory/export").json()
    assert out["count"] == len(arts) == len(out["documents"]) and out["export_dir"]
    # Bad input: typed 4xx, never 500.
    r = c.post("/api/memory/remember", json={"data": "   "})  # blank text: the document says so too
    assert r.status_code == 422 and r.json()["error"] == "ValidationError" and "body.data" in r.json()["detail"]
    assert c.post("/api/memory/recall", json={"query": ""}).status_code == 422
    assert c.post("/api/memory/recall", json={"query": "x", "top_k": 0}).status_code == 422
    assert c.post("/api/memory/consolidate", json={"num_records": -1}).status_code == 422
    assert c.post("/api/memory/remember", json={"data": "x", "ttl": -5}).status_code == 422


# -- routines ----------------------------------------------------------------------------


def test_routine_names_never_escape_the_root(sqlite_client, tmp_path):
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "routine.yaml").write_text("name: secret\n")
    for bad in ("..", "..%2Fsecret", ".hidden", "a b", "x" * 80):
        r = sqlite_client.get(f"/api/routines/{bad}")
        assert r.status_code in (404, 422), bad  # 422: the path parameter's pattern
        assert "secret" not in r.text or r.json()["error"] in ("ValidationError", "NotFound")
    assert sqlite_client.get("/api/routines/nothere").status_code == 404
    r = sqlite_client.post("/api/routines/compile", json={"name": "../up", "trace": {}})
    assert r.status_code == 422 and r.json()["error"] == "ValidationError" and "body.name" in r.json()["detail"]
    assert sqlite_client.get("/api/routines").json() == []


# -- engrain.Client against a real uvicorn ---------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def live(tmp_path):
    import uvicorn

    url = f"sqlite:///{tmp_path / 'live.db'}"
    app = create_app(url, token="tok", routines_dir=tmp_path / "routines")
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    try:
        yield f"http://127.0.0.1:{port}", url
    finally:
        server.should_exit = True
        th.join(10)


def test_client_methods_and_typed_errors(live):
    base, url = live
    with pytest.raises(eg.RemoteError) as ei:
        eg.Client(base).runs()
    assert ei.value.status == 401
    c = eg.Client(base, token="tok")
    res = asking_run(url)
    runs = c.runs(status="needs_input")
    assert [r.run_id for r in runs] == [res.run_id] and isinstance(runs[0], eg.RunInfo)
    assert c.get_run(res.run_id).status == "needs_input" and c.get_run("nope") is None
    assert [e.kind for e in c.events(res.run_id)] == ["run.started", "input.requested"]
    out = c.answer(res.run_id, {"name": "Ada"})
    assert isinstance(out, eg.RunResult) and out.status == "running"
    with pytest.raises(eg.RemoteError) as again:  # answered already: no append race, so no ConflictError
        c.answer(res.run_id, {"name": "again"})
    assert again.value.error == "NotWaitingForInput" and not isinstance(again.value, eg.ConflictError)
    with pytest.raises(eg.RunNotFoundError):
        c.events("nope")
    # stream: live events arrive while the agent's process finishes the run.
    got: list[str] = []

    def consume() -> None:
        for e in c.stream(res.run_id):
            got.append(e.kind)

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.3)
    assert asking_run(url, run_id=res.run_id).output == "hello Ada"
    t.join(10)
    assert not t.is_alive() and got[-1] == "run.completed" and got[:2] == ["run.started", "input.requested"]
    # low-level append with conflicts
    c.append("a1", [{"kind": "run.started", "data": {"task": "t"}}], 0)
    with pytest.raises(eg.ConflictError):
        c.append("a1", [{"kind": "run.started", "data": {"task": "t"}}], 0)
    # memory and cache through the client
    rid = c.remember("Deploys happen on Tuesdays", skill="ops")
    assert c.recall("when do we deploy?", skill="ops")[0]["id"] == rid
    assert c.stats()["records"] == 1
    assert c.consolidate()["errors"] == []
    exp = c.export()
    assert exp["count"] == 1 and c.import_(exp, skill_map="ops2")["imported"] == 1
    assert c.update(rid, "Deploys happen on Thursdays")["tier"] == "record"
    assert c.recall("when do we deploy?", where={"team": "none"}) == []
    assert c.forget(skill="ops2") == {"records": 1, "articles": 1, "rewritten": 0}
    assert c.cache_entries() == [] and c.cache_stats()["hit_rate"] == 0.0 and c.evict("nope") is False
    with pytest.raises(eg.RemoteError) as ei:
        c.validate_routine(".hidden")
    assert ei.value.status == 422 and "path.name" in str(ei.value)
    c.close()


GREET = """\
name: greet
description: Look up a user and greet them after approval
inputs:
  type: object
  properties:
    user: {type: string}
  required: [user]
steps:
  - id: step1
    type: tool.call
    tool: lookup_user
    args: {user: "{{ inputs.user }}"}
  - id: ok
    type: prompt.user
    prompt: "Greet {{ step1.name }}?"
    fields:
      - {name: approved, type: boolean}
  - id: check
    type: assert
    expr: ok.approved
  - id: result
    type: return
    value: "hello {{ step1.name }}"
"""


@pytest.fixture
def routine_client(store_url, tmp_path):
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg)
    def lookup_user(user: str) -> dict:
        return {"name": user.title(), "id": len(user)}

    root = tmp_path / "routines"
    (root / "greet").mkdir(parents=True)
    (root / "greet" / "routine.yaml").write_text(GREET)
    (root / "broken").mkdir()
    (root / "broken" / "routine.yaml").write_text("name: broken\nsteps:\n  - id: a\n    type: nope\n")
    with TestClient(create_app(store_url, routines_dir=root, tools=reg), base_url=LOCAL) as c:
        yield c


def test_routines_list_get_validate_run_answer_compile(routine_client, store_url):
    c = routine_client
    listed = {r["name"]: r for r in c.get("/api/routines").json()}
    assert set(listed) == {"greet", "broken"} and listed["greet"]["steps"] == 4
    g = c.get("/api/routines/greet").json()
    assert g["yaml"] == GREET and g["routine"]["name"] == "greet" and g["issues"] == []
    assert c.post("/api/routines/greet/validate").json() == {"name": "greet", "ok": True, "issues": []}
    bad = c.post("/api/routines/broken/validate").json()
    assert bad["ok"] is False and any(i["field"] == "type" and i["step"] == "a" for i in bad["issues"])
    assert all(i["file"] == "routine.yaml" for i in bad["issues"])
    # Run to the prompt, then answer over HTTP: the server resumes the routine.
    res = c.post("/api/routines/greet/run", json={"inputs": {"user": "ada"}}).json()
    assert res["status"] == "needs_input" and res["prompt"]["prompt"] == "Greet Ada?"
    detail = c.get(f"/api/runs/{res['run_id']}").json()
    assert detail["prompt"]["fields"][0]["name"] == "approved"
    r = c.post(f"/api/runs/{res['run_id']}/answers", json={"answers": {"approved": "maybe"}})
    assert r.status_code == 422 and r.json()["error"] == "RoutineInputError" and "approved" in r.json()["detail"]
    done = c.post(f"/api/runs/{res['run_id']}/answers", json={"answers": {"approved": True}}).json()
    assert done["resumed"] is True and done["status"] == "ok" and done["output"] == "hello Ada"
    assert c.post(f"/api/runs/{res['run_id']}/answers", json={"answers": {"approved": True}}).status_code == 409
    steps = c.get(f"/api/runs/{res['run_id']}").json()["steps"]
    assert steps[0]["name"] == "lookup_user" and steps[0]["result"] == {"name": "Ada", "id": 3}
    # POST /api/runs starts the same routine.
    started = c.post("/api/runs", json={"routine": "greet", "inputs": {"user": "bob"}}).json()
    assert started["status"] == "needs_input"
    r = c.post("/api/runs", json={"routine": "greet", "inputs": {}})
    assert r.status_code == 422 and r.json()["error"] == "RoutineInputError"
    r = c.post("/api/routines/broken/run", json={"inputs": {}})
    assert r.status_code == 422 and r.json()["error"] == "RoutineError"
    # Compile the trace of an agent run into a new routine and run it with other inputs.
    from engrain._durable.trace import export_run

    def agent(task: str, user: str) -> str:
        return f"hello {c.app.state.engrain.tools.get('lookup_user')(user=user)['name']}"

    j = eg.open(store_url)
    ran = eg.run(agent, "greet someone", inputs={"user": "adaline"}, journal=j)
    assert ran.output == "hello Adaline"
    trace = export_run(j, ran.run_id)
    j.close()
    comp = c.post("/api/routines/compile", json={"name": "greet2", "trace": trace})
    assert comp.status_code == 200, comp.text
    assert comp.json()["issues"] == [] and "lookup_user" in comp.json()["yaml"]
    assert c.post("/api/routines/compile", json={"name": "greet2", "trace": trace}).status_code == 409
    assert c.post("/api/routines/compile", json={"name": "greet2", "trace": trace, "overwrite": True}).status_code == 200
    again = c.post("/api/routines/greet2/run", json={"inputs": {"user": "bobby"}}).json()
    assert again["status"] == "ok" and again["output"] == "hello Bobby", again
    for junk in ({"nope": 1}, {"app": "x", "events": "not a list"}, {"app": "x", "events": [None]}):
        r = c.post("/api/routines/compile", json={"name": "junk", "trace": junk})
        assert r.status_code in (400, 422), r.text
        assert not (c.app.state.engrain.routines_dir / "junk").exists()
    assert [p.name for p in c.app.state.engrain.routines_dir.iterdir() if p.name.startswith(".")] == []
    assert "greet2" in {r["name"] for r in c.get("/api/routines").json()}


def test_ui_static_files_are_served_at_root(tmp_path):
    ui = tmp_path / "ui"
    ui.mkdir()
    (ui / "index.html").write_text("<!doctype html><title>engrain</title><script src='app.js'></script>")
    (ui / "app.js").write_text("console.log('engrain');")
    with TestClient(create_app(f"sqlite:///{tmp_path / 'e.db'}", ui_dir=ui, token="t")) as c:
        r = c.get("/")
        assert r.status_code == 200 and "<title>engrain</title>" in r.text  # static UI needs no token
        assert c.get("/app.js").headers["content-type"].startswith(("text/javascript", "application/javascript"))
        assert c.get("/api/runs").status_code == 401
        r = c.get("/api/nope", headers={"Authorization": "Bearer t"})
        assert r.status_code == 404 and r.json()["error"] == "NotFound"
        assert c.get("/../../etc/passwd").status_code == 404


def test_stream_ends_when_the_client_disconnects(live):
    base, url = live
    j = eg.open(url)
    j.append("forever", [eg.NewEvent("run.started", "", {"task": "never ends", "inputs": {}, "tags": []})], 0)
    j.close()
    c = eg.Client(base, token="tok")
    it = c.stream("forever")
    assert next(it).kind == "run.started"
    assert c.health()["streams"] == 1
    it.close()  # the client goes away while the run is still running
    deadline = time.monotonic() + 10
    while c.health()["streams"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert c.health()["streams"] == 0
    c.close()


def test_a_client_run_cannot_name_the_agent_recovery_would_hand_it_to(client, store_url):
    """recover({"pay": pay}) resumes runs whose run.started names "pay": a client may not write that name."""
    forged = {"events": [{"kind": "run.started", "data": {"task": "t", "inputs": {"amount": 10**6}, "agent": "pay"}}],
              "expected_seq": 0}
    r = client.post("/api/runs/forged/events", json=forged)
    assert r.status_code == 403 and r.json()["error"] == "RuntimeOnlyError" and "agent" in r.json()["detail"]
    j = eg.open(store_url)
    try:
        assert j.get_run("forged") is None
        assert eg.recover({"pay": lambda task, amount: amount}, journal=j) == []
    finally:
        j.close()
