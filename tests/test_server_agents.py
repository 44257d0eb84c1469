"""Agent runs started and resumed by a real ``engrain serve --agents``, and its DNS-rebinding guard."""

from __future__ import annotations

import subprocess
import textwrap
import uuid

import httpx
import pytest
from fastapi.testclient import TestClient

import engrain as eg
from engrain._server import create_app
from tests.conftest import drop_pg_schema, pg_schema_url
from tests.servers import engrain_exe, serve

TOKEN = "agents-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

# Scripted demo agents (no LLM: every decision is fixed). Their tools append to a ledger
# file, so the test can count real side effects across the server process's resumes.
AGENTS_PY = textwrap.dedent('''
    """Scripted demo agents for the server tests."""
    import pathlib
    import time

    import engrain as eg

    reg = eg.ToolRegistry()


    @eg.tool(registry=reg)
    def charge(ledger: str, amount: int) -> dict:
        with open(ledger, "a") as f:
            f.write(f"charge {amount}\\n")
        return {"charged": amount}


    @eg.tool(registry=reg)
    def ship(ledger: str, item: str) -> str:
        with open(ledger, "a") as f:
            f.write(f"ship {item}\\n")
        return f"shipped {item}"


    @eg.tool(registry=reg)
    def wait_for(gate: str) -> str:
        deadline = time.monotonic() + 60
        while not pathlib.Path(gate).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(gate)
            time.sleep(0.02)
        return pathlib.Path(gate).read_text()


    def order(task: str, ledger: str, amount: int, item: str) -> dict:
        """Charge, ask for approval, then ship."""
        paid = charge(ledger, amount)
        ok = eg.ask(f"Ship {item} for {amount}?", [{"name": "approved", "type": "boolean"}])
        if not ok["approved"]:
            return {"shipped": None, **paid}
        return {"shipped": ship(ledger, item), **paid}


    def slow(task: str, gate: str) -> str:
        """Wait until the gate file exists."""
        return "gate says " + wait_for(gate)


    def broken(task: str) -> None:
        raise ValueError("this agent always fails")


    async def shout(task: str) -> str:
        return task.upper()


    AGENTS = {"order": order, "slow": slow, "broken": broken, "shout": shout}
''')


@pytest.fixture(scope="module")
def agents_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("agents") / "shop_agents.py"
    path.write_text(AGENTS_PY)
    return path


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def shop(request, tmp_path_factory, agents_file):
    """A server with the demo agents on each backend: (base URL, store URL, work dir)."""
    tmp = tmp_path_factory.mktemp(f"shop-{request.param}")
    schema = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp / 'e.db'}"
    else:
        schema = "t_" + uuid.uuid4().hex[:12]
        url = pg_schema_url(schema)
    try:
        with serve(url, tmp, token=TOKEN, agents=f"{agents_file}:AGENTS") as base:
            yield base, url, tmp
    finally:
        if schema:
            drop_pg_schema(schema)


def _ledger(tmp, name: str) -> str:
    return str(tmp / f"ledger-{name}-{uuid.uuid4().hex[:6]}.txt")


def _lines(path: str) -> list[str]:
    with open(path) as f:
        return f.read().splitlines()


def test_agent_run_pauses_resumes_and_never_repeats_a_step(shop):
    base, _, tmp = shop
    ledger = _ledger(tmp, "order")
    inputs = {"ledger": ledger, "amount": 30, "item": "box"}
    with httpx.Client(base_url=base, headers=AUTH, timeout=30) as http:
        r = http.post("/api/runs", json={"agent": "order", "task": "ship a box", "inputs": inputs})
        assert r.status_code == 200, r.text
        res = r.json()
        rid = res["run_id"]
        assert res["status"] == "needs_input" and res["prompt"]["prompt"] == "Ship box for 30?"
        assert res["executed"] == 1 and _lines(ledger) == ["charge 30"]
        detail = http.get(f"/api/runs/{rid}").json()
        assert detail["run"]["status"] == "needs_input" and "agent:order" in detail["run"]["tags"]
        # Answering resumes the agent on the server: charge replays from the journal, ship runs once.
        done = http.post(f"/api/runs/{rid}/answers", json={"answers": {"approved": True}}).json()
        assert done["resumed"] is True and done["status"] == "ok", done
        assert done["output"] == {"shipped": "shipped box", "charged": 30}
        assert done["replayed"] == 2 and done["executed"] == 1  # charge + the answer; ship
        assert _lines(ledger) == ["charge 30", "ship box"]
        steps = http.get(f"/api/runs/{rid}").json()["steps"]
        assert [(s["name"], s["state"], s["attempts"]) for s in steps] == [
            ("charge", "completed", 1), ("engrain.ask", "answered", 1), ("ship", "completed", 1)]
        r = http.post(f"/api/runs/{rid}/answers", json={"answers": {"approved": True}})
        assert r.status_code == 409 and r.json()["error"] == "RunFinishedError" and r.json()["run_status"] == "ok"
        # Starting a finished run again returns its recorded outcome and calls nothing.
        again = http.post("/api/runs", json={"agent": "order", "task": "ship a box", "inputs": inputs, "run_id": rid}).json()
        assert again["status"] == "ok" and again["output"] == done["output"] and again["executed"] == 0
    assert _lines(ledger) == ["charge 30", "ship box"]


def test_client_starts_waits_and_answers(shop):
    base, _, tmp = shop
    with eg.Client(base, token=TOKEN) as c:
        listed = {a["name"]: a["description"] for a in c.agents()}
        assert listed == {"order": "Charge, ask for approval, then ship.", "slow": "Wait until the gate file exists.",
                          "broken": "", "shout": ""}
        assert c.health()["features"]["agents"] is True
        ledger = _ledger(tmp, "client")
        res = c.start_agent("order", "ship a lamp", {"ledger": ledger, "amount": 5, "item": "lamp"}, run_id=f"lamp-{uuid.uuid4().hex[:6]}")
        assert isinstance(res, eg.RunResult) and res.status == "needs_input" and res.run_id.startswith("lamp-")
        out = c.answer(res.run_id, {"approved": False})
        assert out.status == "ok" and out.output == {"shipped": None, "charged": 5}
        assert _lines(ledger) == ["charge 5"]
        assert c.start_agent("shout", "hello").output == "HELLO"  # async agents run too
        failed = c.start_agent("broken", "try")
        assert failed.status == "failed" and "ValueError: this agent always fails" in failed.error
        assert c.wait_run(failed.run_id).status == "failed"
        with pytest.raises(eg.RemoteError) as ei:
            c.start_agent("nope", "x")
        assert ei.value.status == 404 and ei.value.error == "AgentNotFoundError" and "order" in str(ei.value.detail)


def test_long_agent_returns_running_then_finishes_in_the_background(shop):
    base, _, tmp = shop
    gate = tmp / f"gate-{uuid.uuid4().hex[:6]}"
    with eg.Client(base, token=TOKEN) as c:
        res = c.start_agent("slow", "wait for the gate", {"gate": str(gate)}, wait=0.2)
        assert res.status == "running"
        assert c.get_run(res.run_id).status == "running"  # the run exists as soon as the request returns
        # The same run cannot be started twice while it executes, nor answered.
        with pytest.raises(eg.ConflictError) as ei:
            c.start_agent("slow", "wait for the gate", {"gate": str(gate)}, run_id=res.run_id, wait=0)
        assert ei.value.error == "RunBusyError"
        with pytest.raises(eg.RemoteError) as busy:  # executing: not waiting for input
            c.answer(res.run_id, {"x": 1})
        assert busy.value.status == 409
        gate.write_text("open")
        done = c.wait_run(res.run_id, timeout=30)
        assert done.status == "ok" and done.output == "gate says open"


def test_bad_agent_requests_are_clear_4xx(shop):
    base, url, tmp = shop
    with httpx.Client(base_url=base, headers=AUTH, timeout=30) as http:
        r = http.post("/api/runs", json={"agent": "nope", "task": "x"})
        assert r.status_code == 404 and r.json()["error"] == "AgentNotFoundError" and "nope" in r.json()["detail"]
        r = http.post("/api/runs", json={"agent": "order"})
        assert r.status_code == 422 and "task" in r.json()["detail"]
        assert http.post("/api/runs", json={"agent": "order", "routine": "x", "task": "t"}).status_code == 422
        assert http.post("/api/runs", json={"task": "t"}).status_code == 422
        assert http.post("/api/runs", json={"agent": "shout", "task": "t", "wait": 99999}).status_code == 422
        assert http.post("/api/runs", json={"agent": "shout", "task": "t", "run_id": "  "}).status_code == 422
        # Inputs the agent does not take fail the run (recorded), not the server.
        r = http.post("/api/runs", json={"agent": "shout", "task": "t", "inputs": {"extra": 1}})
        assert r.status_code == 200 and r.json()["status"] == "failed" and "extra" in r.json()["error"]
        # A run id belongs to the agent that started it, with its task.
        rid = http.post("/api/runs", json={"agent": "shout", "task": "first"}).json()["run_id"]
        r = http.post("/api/runs", json={"agent": "broken", "task": "first", "run_id": rid})
        assert r.status_code == 409 and r.json()["error"] == "AgentMismatchError" and "shout" in r.json()["detail"]
        r = http.post("/api/runs", json={"agent": "shout", "task": "second", "run_id": rid})
        assert r.status_code == 400 and "first" in r.json()["detail"]

    # A run of an agent this server does not have keeps today's behaviour: answers recorded only.
    def ghost(task: str) -> str:
        return eg.ask("Name?", [{"name": "name"}])["name"]

    j = eg.open(url)
    try:
        paused = eg.run(ghost, "ghost task", tags=["agent", "agent:ghost"], journal=j)
    finally:
        j.close()
    assert paused.status == "needs_input"
    with eg.Client(base, token=TOKEN) as c:
        out = c.answer(paused.run_id, {"name": "Ada"})
        assert out.status == "running"
        assert c.show(paused.run_id)["steps"][0]["state"] == "answered"
    raw = httpx.post(f"{base}/api/runs/{paused.run_id}/answers", headers=AUTH, json={"answers": {}})
    assert raw.status_code == 409


def test_run_cut_off_by_a_server_stop_resumes_on_the_next_server(tmp_path, agents_file):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    gate = tmp_path / "gate"
    spec = f"{agents_file}:AGENTS"
    with serve(url, tmp_path, token=TOKEN, agents=spec, name="first") as base, eg.Client(base, token=TOKEN) as c:
        rid = c.start_agent("slow", "outlive the server", {"gate": str(gate)}, wait=0.2).run_id
    # The first server is gone with the step still open; the run waits in the journal.
    j = eg.open(url)
    assert j.get_run(rid).status == "running"
    j.close()
    gate.write_text("reopened")
    with serve(url, tmp_path, token=TOKEN, agents=spec, name="second") as base, eg.Client(base, token=TOKEN) as c:
        with pytest.raises(eg.RemoteError, match="was started with inputs"):  # approved for those, not these
            c.start_agent("slow", "outlive the server", {"gate": str(tmp_path / "elsewhere")}, run_id=rid)
        done = c.start_agent("slow", "outlive the server", run_id=rid)  # no inputs: the recorded ones
        assert done.status == "ok" and done.output == "gate says reopened"
        steps = c.show(rid)["steps"]
        # The cut-off call left nothing (a step journals only its completion): it ran again, once more.
        assert [(s["name"], s["attempts"], s["state"]) for s in steps] == [("wait_for", 1, "completed")]


def test_agents_option_errors_are_clear(tmp_path, agents_file):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    with pytest.raises(eg.ConfigError, match="--agents 'no_such_module_xyz:AGENTS'"):
        create_app(url, agents="no_such_module_xyz:AGENTS")
    with pytest.raises(eg.ConfigError, match="dict of name -> agent callable, got ToolRegistry"):
        create_app(url, agents=f"{agents_file}:reg")
    with pytest.raises(eg.ConfigError, match="'bad name'"):
        create_app(url, agents={"bad name": print})
    with pytest.raises(eg.ConfigError, match="not callable"):
        create_app(url, agents={"x": 3})
    proc = subprocess.run([engrain_exe(), "serve", "--url", url, "--agents", "nomodule"], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--agents 'nomodule'" in proc.stderr and "module:registry" in proc.stderr


# -- DNS rebinding -------------------------------------------------------------------------


def test_loopback_server_without_token_refuses_foreign_hosts(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    with serve(url, tmp_path, token=None, allow_hosts=("myapp.test",)) as base:
        port = base.rsplit(":", 1)[1]

        def get(path: str = "/api/health", **headers: str) -> httpx.Response:
            return httpx.get(base + path, headers=headers, timeout=10)

        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost", f"LOCALHOST:{port}",
                     f"127.0.0.2:{port}", f"myapp.test:{port}", "MyApp.Test"):
            r = get(host=host)
            assert r.status_code == 200 and r.json()["auth"] is False, host
        for host in (f"evil.example:{port}", f"127.0.0.1.evil.example:{port}", f"localhost.evil.example:{port}", "0.0.0.0"):
            r = get(host=host)
            assert r.status_code == 421, host
            body = r.json()
            assert body["error"] == "HostNotAllowed" and host in body["detail"] and "--allow-host" in body["detail"]
        assert get("/api/runs", host=f"evil.example:{port}").status_code == 421
        assert get("/", host=f"evil.example:{port}").status_code == 421  # the UI too
        r = get(origin="http://evil.example")
        assert r.status_code == 403 and r.json()["error"] == "OriginNotAllowed"
        r = httpx.post(base + "/api/memory/remember", json={"data": "x"}, headers={"origin": "https://evil.example"})
        assert r.status_code == 403
        assert get(origin=f"http://localhost:{port}").status_code == 200
        assert get(origin=f"http://myapp.test:{port}").status_code == 200


def test_token_servers_keep_bearer_auth_without_a_host_check(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    ok = {"Authorization": "Bearer t"}
    for host in ("127.0.0.1", "0.0.0.0"):
        with TestClient(create_app(url, token="t", host=host)) as c:  # TestClient sends Host: testserver
            assert c.get("/api/health", headers=ok).status_code == 200
            assert c.get("/api/health", headers={**ok, "host": "evil.example"}).status_code == 200
            assert c.get("/api/health", headers={"host": "evil.example"}).status_code == 401
    with TestClient(create_app(url, allow_hosts=["*"])) as c:
        assert c.get("/api/health").status_code == 200
    with TestClient(create_app(url)) as c:
        assert c.get("/api/health").status_code == 421
