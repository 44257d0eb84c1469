"""A run is resumed only by the code that started it, and never when an API client wrote it (issue 23, #1 and #2).

Two programs in real subprocesses share a store: script A (``a.py``) crashes
mid-run; script B (``b.py``, another file whose function is also ``agent`` and
whose tool is also ``charge``) tries ``eg.recover``, ``eg.run(run_id=...)`` and
``engrain worker``. None of them may claim A's run; A resumes it. A replayed
step called with other arguments than recorded ends the run with a
``NondeterminismError`` naming both calls. A run an HTTP client created, with
its own step results, is never executed by ``recover(unnamed=...)``, a worker
or ``eg.run``; and only a server started with ``--allow-fork`` forks an agent's
run over HTTP. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import engrain as eg
from engrain import NewEvent
from engrain._events import RUNNING
from engrain._server import create_app
from engrain._workers.worker import Worker

ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")
LOCAL = "http://127.0.0.1:8765"

# Script A: charges each amount; with "crash" the process dies inside charge(2), after charges 0 and 1
# were journaled. With "recover" it resumes its own runs. $AGENT_NAME names the agent (default: by path).
SCRIPT_A = """
import json, os, sys
import engrain as eg

url, mode = sys.argv[1], sys.argv[2]
journal = eg.open(url)

@eg.tool
def charge(amount: int) -> dict:
    with open(os.environ["EFFECTS"], "a") as f:
        f.write(f"A charge {amount}\\n")
    if mode == "crash" and amount == 2:
        os._exit(9)  # killed mid-step: no completion journaled, no lease released
    return {"charged": amount}

def agent(task: str, amounts: list) -> list:
    return [charge(a) for a in amounts]

name = os.environ.get("AGENT_NAME") or eg.agent_name(agent)
if mode == "crash":
    eg.run(agent, "pay", run_id=os.environ.get("RUN_ID", "pay-1"), inputs={"amounts": [0, 1, 2, 3]},
           journal=journal, agent_name=name)
else:
    print(json.dumps([r.to_dict() for r in eg.recover({name: agent}, journal=journal)]))
"""

# Script B: another program. Same function name, same tool name, other logic and other arguments.
SCRIPT_B = """
import json, os, sys
import engrain as eg

@eg.tool
def charge(amount: int) -> dict:
    with open(os.environ["EFFECTS"], "a") as f:
        f.write(f"B charge {amount}\\n")
    return {"refund": 0}

def agent(task: str, amounts: list) -> list:
    return [charge(a + 1) for a in amounts]

# For `engrain worker --agents b.py:AGENTS`: an operator who maps A's recorded name to B's code.
AGENTS = {os.environ.get("A_NAME", "a"): agent}

if __name__ == "__main__":
    url, mode = sys.argv[1], sys.argv[2]
    journal = eg.open(url)
    a_name = os.environ["A_NAME"]
    if mode == "recover":
        out = eg.recover(agent, journal=journal)
    elif mode == "recover-as-a":
        out = eg.recover({a_name: agent}, journal=journal)
    elif mode == "recover-as-a-upgrade":
        out = eg.recover({a_name: agent}, journal=journal, upgrade=True)
    elif mode == "recover-unnamed":
        out = eg.recover(agent, journal=journal, unnamed=agent)
    elif mode == "run":
        try:
            eg.run(agent, "pay", run_id="pay-1", inputs={"amounts": [0, 1, 2, 3]}, journal=journal)
        except eg.AgentMismatchError as e:
            print(json.dumps({"error": type(e).__name__, "message": str(e)}))
        sys.exit(0)
    print(json.dumps([r.to_dict() for r in out]))
"""


def _script(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(textwrap.dedent(text))
    return path


def _child_env(effects: Path, **extra: str) -> dict[str, str]:
    """The scripts' environment: where charges are written, a short lease, and this engrain importable."""
    return {**os.environ, "EFFECTS": str(effects), "ENGRAIN_LEASE_TTL": "0.5", **extra,
            "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(Path(eg.__file__).parents[1])) if p)}


def _recovered_alone(out: subprocess.CompletedProcess, run_id: str) -> None:
    """``out`` (a script's ``recover``) resumed ``run_id`` only: two charges replayed, two executed, ok."""
    assert out.returncode == 0, out.stderr
    (r,) = json.loads(out.stdout)
    assert r["run_id"] == run_id and r["status"] == "ok", r
    assert r["result"]["replayed"] == 2 and r["result"]["executed"] == 2


def _py(script: Path, url: str, mode: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), url, mode], env=env, capture_output=True, text=True,
                          timeout=120, cwd=script.parent)


@pytest.fixture
def programs(tmp_path, store_url):
    """A's run ``pay-1`` crashed after two charges (its lease expired), and the two scripts."""
    effects = tmp_path / "effects.log"
    env = _child_env(effects)
    for folder in ("prog_a", "prog_b"):
        (tmp_path / folder).mkdir()
    a = _script(tmp_path / "prog_a", "a.py", SCRIPT_A)
    b = _script(tmp_path / "prog_b", "b.py", SCRIPT_B)
    crashed = _py(a, store_url, "crash", env)
    assert crashed.returncode == 9, crashed.stderr
    time.sleep(0.6)  # A's lease (0.5 s) expires, as a dead process's does
    j = eg.open(store_url)
    info = j.get_run("pay-1")
    assert info.status == RUNNING and info.agent == f"{a.resolve()}:agent"
    env["A_NAME"] = info.agent
    before = [e.to_dict() for e in j.read("pay-1")]
    yield {"a": a, "b": b, "env": env, "url": store_url, "journal": j, "effects": effects, "before": before,
           "lease": (info.lease_owner, info.lease_until, info.lease_epoch)}
    j.close()


def _untouched(p) -> None:
    j = p["journal"]
    info = j.get_run("pay-1")
    # Not claimed: still the dead process's expired lease, at its epoch.
    assert info.status == RUNNING and (info.lease_owner, info.lease_until, info.lease_epoch) == p["lease"]
    assert [e.to_dict() for e in j.read("pay-1")] == p["before"]
    assert "B charge" not in p["effects"].read_text()


def _a_finishes_its_run(p, run_id: str = "pay-1", **env: str) -> None:
    out = _py(p["a"], p["url"], "recover", {**p["env"], **env})
    assert out.returncode == 0, out.stderr
    (r,) = [r for r in json.loads(out.stdout) if r["run_id"] == run_id]
    assert r["status"] == "ok" and r["result"]["replayed"] == 2 and r["result"]["executed"] == 2
    assert r["result"]["output"] == [{"charged": n} for n in range(4)]
    crashes = [0, 1, 2] * (1 + (run_id != "pay-1"))  # each crashed run charged 0, 1 and died in 2
    assert p["effects"].read_text().splitlines() == [f"A charge {n}" for n in (*crashes, 2, 3)]


def test_another_script_with_the_same_names_never_recovers_the_run(programs):
    p = programs
    out = _py(p["b"], p["url"], "recover", p["env"])
    assert out.returncode == 0, out.stderr
    (r,) = json.loads(out.stdout)
    assert r["run_id"] == "pay-1" and r["status"] == "unmatched" and r["agent"] == p["env"]["A_NAME"]
    assert f"no agent named {p['env']['A_NAME']!r}" in r["error"]
    # Nor by naming A's agent for its own code: the code fingerprint differs.
    out = _py(p["b"], p["url"], "recover-as-a", p["env"])
    (r,) = json.loads(out.stdout)
    assert r["status"] == "unmatched" and "another version of agent" in r["error"] and "upgrade=True" in r["error"]
    # Nor with unnamed=: the run names its agent.
    out = _py(p["b"], p["url"], "recover-unnamed", p["env"])
    assert [r["status"] for r in json.loads(out.stdout)] == ["unmatched"]
    _untouched(p)
    _a_finishes_its_run(p)


def test_another_script_cannot_continue_the_run_by_its_id(programs):
    p = programs
    out = _py(p["b"], p["url"], "run", p["env"])
    assert out.returncode == 0, out.stderr
    err = json.loads(out.stdout)
    assert err["error"] == "AgentMismatchError"
    assert f"was started by agent {p['env']['A_NAME']!r}, not {str(p['b'].resolve()) + ':agent'!r}" in err["message"]
    _untouched(p)
    _a_finishes_its_run(p)


def test_a_worker_with_other_code_under_the_runs_name_never_claims_it(programs):
    """Workers serve named agents: A's run "pay-2" is agent "pay", and B's worker serves its own code as "pay"."""
    p = programs
    env = {**p["env"], "RUN_ID": "pay-2", "AGENT_NAME": "pay"}
    assert _py(p["a"], p["url"], "crash", env).returncode == 9
    time.sleep(0.6)
    p["before"] = [e.to_dict() for e in p["journal"].read("pay-2")]
    out = subprocess.run([ENGRAIN, "worker", "--agents", f"{p['b']}:AGENTS", "--until-idle", "--url", p["url"]],
                         env={**p["env"], "A_NAME": "pay"}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)
    assert stats["finished"] == {} and stats["errors"] == []
    (line,) = stats["unmatched"]  # pay-1 is another agent's: not this worker's business
    assert line.startswith("pay-2: was started by another version of agent 'pay'") and "upgrade=True" in line
    info = p["journal"].get_run("pay-2")
    assert info.status == RUNNING and info.lease_epoch == 1 and [e.to_dict() for e in p["journal"].read("pay-2")] == p["before"]
    assert "B charge" not in p["effects"].read_text()
    _a_finishes_its_run(p, "pay-2", AGENT_NAME="pay")


def test_forcing_other_code_on_the_run_stops_at_the_first_changed_arguments(programs):
    """upgrade=True lets B's code resume A's run, but B's charge(1) is not A's recorded charge(0)."""
    p = programs
    out = _py(p["b"], p["url"], "recover-as-a-upgrade", p["env"])
    assert out.returncode == 0, out.stderr
    (r,) = json.loads(out.stdout)
    assert r["status"] == "failed" and r["error"].startswith("NondeterminismError: ")
    assert "recorded 'charge(amount=0)' but the agent called 'charge(amount=1)'" in r["error"]
    assert "B charge" not in p["effects"].read_text()  # nothing of B's ran, no recorded result handed to it
    last = p["journal"].read("pay-1")[-1]
    assert last.kind == "run.failed" and last.data["error_type"] == "NondeterminismError"


def test_a_script_deployed_behind_a_symlink_resumes_its_runs_after_the_link_moves(tmp_path, store_url):
    """A release layout (``current -> releases/v1``, then ``current -> releases/v2``): the script is run
    as ``current/a.py`` both times, so it is the same program; its name does not follow the link."""
    effects = tmp_path / "effects.log"
    env = _child_env(effects, RUN_ID="pay-9")
    for release in ("v1", "v2"):
        (tmp_path / "releases" / release).mkdir(parents=True)
        _script(tmp_path / "releases" / release, "a.py", SCRIPT_A)
    current = tmp_path / "current"
    current.symlink_to(tmp_path / "releases" / "v1", target_is_directory=True)
    assert _py(current / "a.py", store_url, "crash", env).returncode == 9
    time.sleep(0.6)
    j = eg.open(store_url)
    try:
        assert j.get_run("pay-9").agent == f"{current / 'a.py'}:agent"
        link = tmp_path / "current.new"
        link.symlink_to(tmp_path / "releases" / "v2", target_is_directory=True)
        os.replace(link, current)  # the deploy: the link moves at once
        _recovered_alone(_py(current / "a.py", store_url, "recover", env), "pay-9")
    finally:
        j.close()


# A notebook kernel: each cell is compiled under a file of the kernel's own temporary folder
# (ipykernel: <tmp>/ipykernel_<pid>/<hash of the cell>.py) and run in a __main__ with no __file__.
NOTEBOOK = """
import os, sys
sys.argv = ["kernel", *sys.argv[1:]]
cell = open(os.environ["CELL"]).read()
exec(compile(cell, os.path.join(os.environ["KERNEL_DIR"], "3405691582.py"), "exec"), globals())
"""


def test_a_notebooks_agent_resumes_its_run_after_a_kernel_restart(tmp_path, store_url):
    """The kernel's temporary file is no program's name: a restarted kernel (another folder) running the
    same cell is the same agent (its code fingerprint still tells another cell's agent apart)."""
    effects = tmp_path / "effects.log"
    cell = tmp_path / "cell.py"
    cell.write_text(textwrap.dedent(SCRIPT_A))
    env = _child_env(effects, RUN_ID="nb-1", CELL=str(cell))

    def kernel(pid: int, mode: str) -> subprocess.CompletedProcess:
        folder = tmp_path / f"ipykernel_{pid}"
        folder.mkdir(exist_ok=True)
        return subprocess.run([sys.executable, "-", store_url, mode], input=NOTEBOOK, env={**env, "KERNEL_DIR": str(folder)},
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)

    assert kernel(101, "crash").returncode == 9
    time.sleep(0.6)
    j = eg.open(store_url)
    try:
        assert j.get_run("nb-1").agent == "__main__:agent"
        _recovered_alone(kernel(202, "recover"), "nb-1")
    finally:
        j.close()


# -- the arguments of a replayed step -------------------------------------------------------------

_state = {"amount": 0, "crash": False, "calls": []}
_tools = eg.ToolRegistry()


@eg.tool(registry=_tools)
def charge(amount: int) -> str:
    _state["calls"].append(("charge", amount))
    return f"charged {amount}"


@eg.tool(registry=_tools, at_most_once=True)
def transfer(amount: int, to: str) -> str:
    _state["calls"].append(("transfer", amount))
    return f"sent {amount} to {to}"


@eg.tool(registry=_tools)
def refund(amount: int, reason: str = "returned") -> str:
    _state["calls"].append(("refund", amount))
    return f"refunded {amount}"


@eg.tool(registry=_tools)
def stamp(items: list) -> int:
    items.append("stamped")  # changes its argument after the call began (recorded after the call)
    return len(items)


class Till:
    @eg.tool(registry=_tools, name="till.ring")
    def ring(self, amount: int) -> str:
        _state["calls"].append(("ring", amount))
        return f"rang {amount}"


def payer(task: str) -> str:
    n = _state["amount"]
    calls = {"charge": lambda: charge(n), "charge-kw": lambda: charge(amount=n), "transfer": lambda: transfer(n, "acct"),
             "ring": lambda: Till().ring(n), "refund": lambda: refund(n)}
    done = calls[task]()
    if _state["crash"]:
        raise KeyboardInterrupt
    return done


def stamper(task: str) -> int:
    n = stamp(["a"])
    if _state["crash"]:
        raise KeyboardInterrupt
    return n


@pytest.mark.parametrize("task", ["charge", "charge-kw", "transfer", "ring", "refund"])
def test_a_replayed_step_with_other_arguments_ends_the_run_naming_both(journal, task):
    _state.update(amount=0, crash=True, calls=[])
    with pytest.raises(KeyboardInterrupt):
        eg.run(payer, task, run_id="r", journal=journal)
    _state.update(amount=1, crash=False, calls=[])  # the same code now computes another argument
    res = eg.run(payer, task, run_id="r", journal=journal)
    assert res.status == "failed" and res.error_type == "NondeterminismError" and _state["calls"] == []
    tail = {"transfer": ", to='acct'", "refund": ", reason='returned'"}.get(task, "")
    step = {"charge-kw": "charge", "ring": "till.ring"}.get(task, task)
    recorded, called = res.error.split("recorded ", 1)[1].split(" but the agent called ")
    assert f"{step}(amount=0{tail})" in recorded and f"{step}(amount=1{tail})" in called
    # The same call replays, on the fast path or the slow one.
    _state.update(amount=0, crash=True, calls=[])
    with pytest.raises(KeyboardInterrupt):
        eg.run(payer, task, run_id="same", journal=journal)
    _state.update(crash=False, calls=[])
    again = eg.run(payer, task, run_id="same", journal=journal)
    assert again.status == "ok" and again.replayed == 1 and _state["calls"] == []
    assert journal.get_run("r").status == "failed"


def test_the_same_arguments_replay_and_a_step_that_changed_its_argument_still_does(journal):
    _state.update(amount=5, crash=True, calls=[])
    with pytest.raises(KeyboardInterrupt):
        eg.run(payer, "charge", run_id="same", journal=journal)
    with pytest.raises(KeyboardInterrupt):
        eg.run(stamper, "t", run_id="stamp", journal=journal)
    recorded = journal.read("stamp")[1].data
    assert recorded["args"] == {"items": ["a", "stamped"]} and len(recorded["ad"]) == 16
    _state.update(crash=False, calls=[])
    res = eg.run(payer, "charge", run_id="same", journal=journal)
    assert res.output == "charged 5" and res.replayed == 1 and _state["calls"] == []
    # Recorded after the call, its arguments differ from the new call's; the digest taken before the call matches.
    assert eg.run(stamper, "t", run_id="stamp", journal=journal).output == 2


def test_llm_steps_are_matched_by_name_only(journal):
    """An LLM call's arguments hold conversation state frameworks rebuild with fresh ids: not compared."""
    replies = []

    @eg.llm(registry=eg.ToolRegistry())
    def complete(prompt: str) -> str:
        replies.append(prompt)
        return "reply"

    def agent(task: str) -> str:
        out = complete(f"{task} at {_state['amount']}")
        if _state["crash"]:
            raise KeyboardInterrupt
        return out

    _state.update(amount=0, crash=True)
    with pytest.raises(KeyboardInterrupt):
        eg.run(agent, "t", run_id="llm", journal=journal)
    _state.update(amount=1, crash=False)
    assert eg.run(agent, "t", run_id="llm", journal=journal).output == "reply" and replies == ["t at 0"]


# -- the identity a run records ------------------------------------------------------------------

_FINGERPRINT = """
import sys
import engrain as eg
from engrain._durable.identity import fingerprint

@eg.tool
def charge(amount: int) -> int:
    return amount

def helper(kind):
    return kind in {"refund", "charge", "void", "hold"}  # a frozenset constant: its order follows the hash seed

def agent(task: str) -> int:
    # COMMENT
    return charge(1) if helper(task) else 0

print(eg.agent_name(agent), fingerprint(agent))
"""


def test_the_fingerprint_is_stable_across_restarts_and_changes_with_the_code(tmp_path):
    def run(text: str, seed: str, name: str = "prog.py") -> list[str]:
        path = tmp_path / name
        path.write_text(text)
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    name, first = run(_FINGERPRINT, "1")
    assert name == f"{(tmp_path / 'prog.py').resolve()}:agent"
    assert run(_FINGERPRINT, "2") == [name, first]  # a restart: another hash seed, same identity
    assert run(_FINGERPRINT.replace("# COMMENT", "# another comment\n    # and a line"), "3")[1] == first
    assert run(_FINGERPRINT.replace('"hold"}', '"hold", "x"}'), "1")[1] != first  # a helper changed
    assert run(_FINGERPRINT.replace("return amount", "return -amount"), "1")[1] != first  # a tool changed
    assert run(_FINGERPRINT.replace("charge(1)", "charge(2)"), "1")[1] != first  # the agent changed
    assert run(_FINGERPRINT, "1", "other.py")[0].endswith("other.py:agent")  # another file: another program


def test_a_run_records_its_name_and_code(journal):
    _state.update(amount=3, crash=False, calls=[])
    eg.run(payer, "charge", run_id="p", journal=journal)
    started = journal.read("p")[0].data
    from engrain._durable.identity import fingerprint

    assert started["agent"] == eg.agent_name(payer) == f"{__name__}:payer"
    assert started["agent_code"] == fingerprint(payer) and len(started["agent_code"]) == 16
    assert fingerprint(payer) != fingerprint(stamper)


# -- runs an HTTP client wrote -------------------------------------------------------------------

_effects: list[str] = []


@eg.tool(registry=_tools, name="wire")
def wire(amount: int, to: str) -> str:
    _effects.append(f"TRANSFER EXECUTED: {amount} to {to}")
    return "sent"


def banker(task: str, amount: int, to: str) -> str:
    return wire(amount, to)


def _client_run(c: TestClient, run_id: str = "evil") -> None:
    events = [
        {"kind": "run.started", "data": {"task": "pay", "inputs": {"amount": 99999, "to": "ATTACKER-IBAN"}}},
        {"kind": "step.completed", "name": "wire",
         "data": {"call_id": 0, "type": "tool", "args": {"amount": 1, "to": "x"}, "result": "forged"}},
    ]
    r = c.post(f"/api/runs/{run_id}/events", json={"events": events, "expected_seq": 0})
    assert r.status_code == 200, r.text


@pytest.fixture
def api(store_url, tmp_path):
    _effects.clear()
    with TestClient(create_app(store_url, routines_dir=tmp_path / "routines"), base_url=LOCAL) as c:
        yield c


def test_a_client_run_is_never_executed_by_recover_a_worker_or_run(api, store_url):
    _client_run(api)
    j = eg.open(store_url)
    try:
        before = [e.to_dict() for e in j.read("evil")]
        (r,) = eg.recover(banker, unnamed=banker, journal=j)
        assert r.run_id == "evil" and r.status == "unmatched" and "HTTP API client" in r.error
        (r,) = eg.recover({"pay": banker}, unnamed=banker, journal=j, upgrade=True)
        assert r.status == "unmatched"
        stats = Worker(j, {"banker": banker, "pay": banker}, ["default"], poll=0.02, upgrade=True).run(until_idle=True)
        assert stats.finished == {} and stats.errors == []
        for kw in ({}, {"agent_name": "pay"}, {"upgrade": True}):
            with pytest.raises(eg.AgentMismatchError, match="created by an HTTP API client"):
                eg.run(banker, "pay", run_id="evil", inputs={"amount": 99999, "to": "ATTACKER-IBAN"}, journal=j, **kw)
        # Nothing ran, nothing was claimed or written, and no claim ever takes it.
        assert _effects == []
        info = j.get_run("evil")
        assert info.status == RUNNING and info.lease_owner is None and info.lease_epoch == 0
        assert [e.to_dict() for e in j.read("evil")] == before
        assert j.claim_runs("w", ttl=60) == [] and j.claim_runs("w", ttl=60, agents=[None]) == []
    finally:
        j.close()


def test_a_client_cannot_mark_its_run_as_the_runtimes(api):
    for data in ({"agent": "pay"}, {"agent_code": "0123456789abcdef"}, {"tags": ["client"]}, {"tags": ["agent"]}):
        body = {"events": [{"kind": "run.started", "data": {"task": "t", **data}}], "expected_seq": 0}
        r = api.post("/api/runs/forged/events", json=body)
        assert r.status_code == 403 and r.json()["error"] == "RuntimeOnlyError", data
    assert api.get("/api/runs/forged").status_code == 404


def test_only_an_allow_fork_server_forks_an_agents_run_over_http(store_url, tmp_path):
    j = eg.open(store_url)
    try:
        _effects.clear()
        eg.run(banker, "pay", run_id="paid", inputs={"amount": 5, "to": "shop"}, journal=j)
        with TestClient(create_app(store_url, routines_dir=tmp_path / "r"), base_url=LOCAL) as c:
            r = c.post("/api/runs/paid/fork", json={"at_step": 0, "run_id": "again"})
            assert r.status_code == 403 and r.json()["error"] == "ForkNotAllowedError"
            assert "--allow-fork" in r.json()["detail"] and j.get_run("again") is None
            # A client's own run forks, and the fork stays the client's: never executed.
            _client_run(c)
            assert c.post("/api/runs/evil/fork", json={"at_step": 1, "run_id": "evil-2"}).status_code == 200
            assert "client" in j.get_run("evil-2").tags
            assert [r.status for r in eg.recover(banker, unnamed=banker, journal=j)] == ["unmatched", "unmatched"]
        with TestClient(create_app(store_url, routines_dir=tmp_path / "r", allow_fork=True), base_url=LOCAL) as c:
            r = c.post("/api/runs/paid/fork", json={"at_step": 0, "run_id": "again"})
            assert r.status_code == 200 and r.json()["run_id"] == "again"
        (r,) = [r for r in eg.recover(banker, journal=j) if r.run_id == "again"]
        assert r.status == "ok" and _effects == ["TRANSFER EXECUTED: 5 to shop"] * 2 and r.executed == 1
    finally:
        j.close()


def test_legacy_runs_without_a_name_resume_only_with_unnamed_and_runs_without_code_by_name(journal):
    """Runs recorded before names (no ``agent``) or before fingerprints (no ``agent_code``) stay resumable."""
    _effects.clear()
    journal.append("old", [NewEvent("run.started", "", {"task": "pay", "inputs": {"amount": 1, "to": "a"}, "tags": []})], 0)
    journal.append("named", [NewEvent("run.started", "", {"task": "pay", "inputs": {"amount": 2, "to": "b"}, "tags": [],
                                                          "agent": eg.agent_name(banker)})], 0)
    journal.append("script", [NewEvent("run.started", "", {"task": "pay", "inputs": {"amount": 3, "to": "c"}, "tags": [],
                                                           "agent": "__main__:agent"})], 0)
    got = {r.run_id: r for r in eg.recover(banker, journal=journal)}
    assert got["named"].status == "ok" and got["old"].status == "unmatched" and "unnamed=" in got["old"].error
    assert got["script"].status == "unmatched" and "recover({'__main__:agent': agent})" in got["script"].error
    got = {r.run_id: r for r in eg.recover({"__main__:agent": banker}, unnamed=banker, journal=journal)}
    assert got["old"].status == got["script"].status == "ok"
    assert sorted(_effects) == [f"TRANSFER EXECUTED: {n} to {t}" for n, t in ((1, "a"), (2, "b"), (3, "c"))]
