"""Durable runs: replay, retry with idempotency keys, nondeterminism, clock, JSON checks, input."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time

import pytest

import engrain as eg
from engrain import NewEvent


@pytest.fixture
def calls():
    return []


def make_tools(calls, registry):
    @eg.tool(registry=registry)
    def add(a: int, b: int = 10) -> int:
        calls.append(("add", a, b, eg.idempotency_key()))
        return a + b

    @eg.tool(registry=registry, name="boom")
    def boom(x):
        calls.append(("boom", x))
        raise ValueError(f"bad {x}")

    return add, boom


def test_steps_replay_without_reexecution(journal, calls):
    add, _ = make_tools(calls, eg.ToolRegistry())

    def agent(task, x):
        return add(add(x), 1)

    first = eg.run(agent, "sum", run_id="r1", inputs={"x": 1}, journal=journal)
    assert first and first.output == 12 and first.executed == 2 and first.replayed == 0
    assert [c[:3] for c in calls] == [("add", 1, 10), ("add", 11, 1)]
    assert [c[3] for c in calls] == ["r1:0", "r1:1"]
    # The finished run returns its recorded output; the agent is not called at all.
    again = eg.run(agent, "sum", run_id="r1", inputs={"x": 1}, journal=journal)
    assert again.output == 12 and again.executed == 0 and len(calls) == 2
    events = journal.read("r1")
    # One event per step: its completion, carrying type, arguments and start time.
    assert [e.kind for e in events] == ["run.started"] + ["step.completed"] * 2 + ["run.completed"]
    assert events[1].data["args"] == {"a": 1, "b": 10}  # defaults recorded by name
    assert events[1].data["type"] == "tool" and events[1].data["started"] <= events[1].ts


def test_resume_after_crash_mid_run(journal, calls):
    """A run whose process died after step 0 completed and step 1 started: step 0 replays, step 1 retries."""
    add, _ = make_tools(calls, eg.ToolRegistry())
    journal.append(
        "r2",
        [
            NewEvent("run.started", "", {"task": "sum", "inputs": {"x": 5}, "tags": []}),
            NewEvent("step.started", "add", {"call_id": 0, "type": "tool", "args": {"a": 5, "b": 10}, "attempt": 1}),
            NewEvent("step.completed", "add", {"call_id": 0, "result": 15}),
            NewEvent("step.started", "add", {"call_id": 1, "type": "tool", "args": {"a": 15, "b": 1}, "attempt": 1}),
        ],
        0,
    )
    result = eg.run(lambda task, x: add(add(x), 1), "sum", run_id="r2", inputs={"x": 5}, journal=journal)
    assert result.output == 16 and result.replayed == 1 and result.executed == 1
    assert calls == [("add", 15, 1, "r2:1")]  # same idempotency key as the crashed attempt
    retry = journal.read("r2")[4]
    assert retry.kind == "step.completed" and retry.data["attempt"] == 2 and retry.data["args"] == {"a": 15, "b": 1}


def test_results_the_fast_decoder_refuses_replay_exactly(journal):
    """Integers past 64 bits replay as the same ints, not floats, through the batch decoder a resume uses."""
    calls = []
    registry = eg.ToolRegistry()

    @eg.tool(registry=registry)
    def value(kind: str):
        calls.append(kind)
        return {"big": 2**70 + 1, "neg": -(10**30), "float": 1e300, "text": "naïve ✓"}[kind]

    def agent(task):
        return [value("big"), value("neg"), value("float"), value("text")]

    journal.append("dec", [NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": []})], 0)
    for i, kind in enumerate(["big", "neg", "float"]):
        data = {"call_id": i, "result": value.__wrapped__(kind), "type": "tool", "args": {"kind": kind}}
        journal.append("dec", [NewEvent("step.completed", "value", data)], i + 1)
    calls.clear()
    first = eg.run(agent, "t", run_id="dec", journal=journal)
    assert first.output == [2**70 + 1, -(10**30), 1e300, "naïve ✓"]
    assert type(first.output[0]) is int and first.replayed == 3 and calls == ["text"]
    # Resuming reads every recorded result back through the batch decoder.
    assert [e.data.get("result") for e in journal.read("dec")[1:4]] == [2**70 + 1, -(10**30), 1e300]


def test_nondeterminism_names_both_steps(journal, calls):
    add, boom = make_tools(calls, eg.ToolRegistry())
    journal.append("r3", [NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": []})], 0)
    journal.append("r3", [NewEvent("step.started", "add", {"call_id": 0, "type": "tool", "args": {}, "attempt": 1})], 1)
    journal.append("r3", [NewEvent("step.completed", "add", {"call_id": 0, "result": 1})], 2)
    result = eg.run(lambda task: boom(1), "t", run_id="r3", journal=journal)
    assert result.status == "failed" and result.error.startswith("NondeterminismError: ")
    assert "'add'" in result.error and "'boom'" in result.error
    assert journal.get_run("r3").status == "failed"  # terminal: resuming cannot make the code agree again
    assert journal.read("r3")[-1].data["error_type"] == "NondeterminismError"
    assert calls == []


def test_clock_is_replayed(journal):
    seen = []
    crash = {"on": True}

    def agent(task):
        t = eg.now()
        seen.append(t)
        if crash["on"]:
            raise KeyboardInterrupt  # the process "dies" after the clock step was journaled
        return t.isoformat()

    with pytest.raises(KeyboardInterrupt):
        eg.run(agent, "clock", run_id="c", journal=journal)
    crash["on"] = False
    result = eg.run(agent, "clock", run_id="c", journal=journal)
    assert seen[0] == seen[1] and result.output == seen[0].isoformat()
    assert seen[0].tzinfo is dt.timezone.utc and result.replayed == 1
    assert isinstance(eg.now(), dt.datetime)  # outside a run: the real clock


def test_non_json_argument_and_result_are_named(journal):
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg)
    def takes(when):
        return 1

    @eg.tool(registry=reg)
    def gives():
        return {"ok": {1, 2}}

    r = eg.run(lambda task: takes(dt.datetime.now()), "t", journal=journal)
    assert r.status == "failed"
    assert "tool 'takes'" in r.error and "argument 'when'" in r.error and "datetime" in r.error
    r = eg.run(lambda task: gives(), "t2", journal=journal)
    assert r.status == "failed" and "step 'gives'" in r.error and "result['ok']" in r.error and "set" in r.error
    failed = [e for e in journal.read(r.run_id) if e.kind == "step.failed"]
    assert failed and failed[0].data["error_type"] == "NotJSONError"


def test_nested_non_json_argument_is_named_with_its_path(journal):
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg)
    def takes(cfg):
        return 1

    r = eg.run(lambda task: takes({"a": [1, (2, 3)]}), "t", journal=journal)
    assert r.status == "failed"
    assert "tool 'takes'" in r.error and "argument 'cfg'['a'][1]" in r.error and "tuple" in r.error
    assert [e.kind for e in journal.read(r.run_id)] == ["run.started", "run.failed"]  # nothing journaled for it


def test_tool_arguments_are_bound_like_a_plain_call(journal):
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg)
    def f(a, b=2, *, c=3):
        return [a, b, c]

    r = eg.run(lambda task: [f(1), f(1, 5), f(a=1, c=9), f(1, b=4)], "bind", journal=journal)
    assert r.output == [[1, 2, 3], [1, 5, 3], [1, 2, 9], [1, 4, 3]]
    recorded = [e.data["args"] for e in journal.read(r.run_id) if e.kind == "step.completed"]
    assert recorded == [{"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 5, "c": 3}, {"a": 1, "b": 2, "c": 9}, {"a": 1, "b": 4, "c": 3}]
    # What a plain call rejects, a journaled call rejects too, before any step is written:
    # c is keyword-only, a given twice, d unknown, a missing.
    for bad in (lambda: f(1, 2, 3), lambda: f(1, a=2), lambda: f(1, d=4), lambda: f()):
        with pytest.raises(TypeError):
            bad()
        r = eg.run(lambda task, bad=bad: bad(), "bad", journal=journal)
        assert r.status == "failed" and r.error.startswith("TypeError")
        assert [e.kind for e in journal.read(r.run_id)] == ["run.started", "run.failed"]


def test_tool_failure_is_recorded_and_replayed(journal, calls):
    _, boom = make_tools(calls, eg.ToolRegistry())
    attempts = {"n": 0}

    def agent(task):
        attempts["n"] += 1
        try:
            boom(1)
        except ValueError as e:
            if attempts["n"] == 1:
                raise KeyboardInterrupt from e  # crash after the failure was journaled
            return f"handled: {e}"

    with pytest.raises(KeyboardInterrupt):
        eg.run(agent, "t", run_id="f", journal=journal)
    result = eg.run(agent, "t", run_id="f", journal=journal)
    assert result.output == "handled: bad 1"
    assert calls == [("boom", 1)]  # the failing call ran once; its ValueError was re-raised from the journal


def test_agent_exception_fails_the_run(journal):
    def agent(task):
        raise RuntimeError("nope")

    r = eg.run(agent, "t", run_id="x", journal=journal)
    assert not r and r.status == "failed" and r.error == "RuntimeError: nope"
    assert journal.get_run("x").status == "failed"
    with pytest.raises(eg.RunFailedError, match="nope"):
        r.unwrap()
    # a failed run is terminal: running it again returns the recorded failure
    assert eg.run(agent, "t", run_id="x", journal=journal).error == "RuntimeError: nope"


def test_task_mismatch_on_resume(journal):
    eg.run(lambda task: 1, "first", run_id="m", journal=journal)
    with pytest.raises(eg.EngrainError, match="started with task 'first'"):
        eg.run(lambda task: 1, "second", run_id="m", journal=journal)


def test_methods_and_transparency_outside_runs(journal):
    reg = eg.ToolRegistry()

    class Browser:
        def __init__(self):
            self.clicks = 0

        @eg.tool(registry=reg)
        def click(self, selector: str) -> str:
            self.clicks += 1
            return f"clicked {selector}"

    b = Browser()
    assert b.click("#a") == "clicked #a"  # outside a run: a plain call
    assert "Browser.click" in reg
    r = eg.run(lambda task: b.click("#go"), "t", run_id="meth", journal=journal)
    assert r.output == "clicked #go" and b.clicks == 2
    assert journal.read("meth")[1].data["args"] == {"selector": "#go"}  # self is not recorded


def test_async_agent_and_tools(journal):
    calls = []
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg)
    async def fetch(url: str) -> str:
        calls.append(url)
        await asyncio.sleep(0)
        return url.upper()

    async def agent(task, urls):
        return [await fetch(u) for u in urls]

    r = eg.run(agent, "fetch", run_id="as", inputs={"urls": ["a", "b"]}, journal=journal)
    assert r.output == ["A", "B"] and calls == ["a", "b"]
    r2 = asyncio.run(eg.run_async(agent, "fetch", run_id="as", inputs={"urls": ["a", "b"]}, journal=journal))
    assert r2.output == ["A", "B"] and calls == ["a", "b"]


def test_ask_pauses_and_answer_resumes(journal, calls):
    add, _ = make_tools(calls, eg.ToolRegistry())

    def agent(task):
        base = add(1)
        reply = eg.ask("How much to add?", [{"name": "n", "type": "number"}])
        return add(base, reply["n"])

    r = eg.run(agent, "ask", run_id="q", journal=journal)
    assert r.status == "needs_input" and r.prompt["prompt"] == "How much to add?"
    assert journal.get_run("q").status == "needs_input"
    again = eg.run(agent, "ask", run_id="q", journal=journal)  # still waiting, nothing re-executed
    assert again.status == "needs_input" and len(calls) == 1
    eg.answer("q", {"n": 5}, journal=journal)
    done = eg.run(agent, "ask", run_id="q", journal=journal)
    assert done.output == 16 and [c[:3] for c in calls] == [("add", 1, 10), ("add", 11, 5)]
    with pytest.raises(eg.EngrainError, match="not waiting"):
        eg.answer("q", {"n": 1}, journal=journal)
    with pytest.raises(eg.RunNotFoundError):
        eg.answer("nope", {}, journal=journal)


def test_tools_from_threads_with_copied_context(journal):
    """Steps may run on worker threads when the run's context is carried there."""
    import contextvars
    from concurrent.futures import ThreadPoolExecutor

    reg = eg.ToolRegistry()
    lock = threading.Lock()
    seen = []

    @eg.tool(registry=reg)
    def work(i: int) -> int:
        with lock:
            seen.append(i)
        return i * i

    def agent(task):
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(contextvars.copy_context().run, work, i) for i in range(8)]
            return sorted(f.result() for f in futures)

    r = eg.run(agent, "threads", run_id="th", journal=journal)
    assert r.output == [i * i for i in range(8)] and sorted(seen) == list(range(8))
    events = journal.read("th")
    assert [e.seq for e in events] == list(range(len(events)))
    assert sum(e.kind == "step.completed" for e in events) == 8


def test_registry_names_and_validation():
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg, name="files.read")
    def read(path):
        return path

    assert reg.names() == ["files.read"] and reg["files.read"] is read
    with pytest.raises(KeyError, match="no tool named 'x'"):
        reg.get("x")
    for bad in ("../etc/passwd", "a/b", "", "1abc", "a..b"):
        with pytest.raises(eg.EngrainError, match="invalid tool name"):
            eg.tool(name=bad, registry=reg)(lambda: None)


def test_live_lease_blocks_a_second_executor(journal):
    journal.append("l", [NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": []})], 0)
    assert journal.acquire_lease("l", "otherhost:1:abcd", ttl=60)
    with pytest.raises(eg.LeaseHeldError, match="otherhost"):
        eg.run(lambda task: 1, "t", run_id="l", journal=journal)
    assert journal.get_run("l").status == "running"


def test_lease_of_a_dead_local_process_is_taken_over(journal):
    import socket
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    journal.append("d", [NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": []})], 0)
    assert journal.acquire_lease("d", f"{socket.gethostname()}:{pid}:dead", ttl=60)
    r = eg.run(lambda task: "resumed", "t", run_id="d", journal=journal)
    assert r.output == "resumed"
    assert journal.get_run("d").lease_owner is None  # released when the run ended


def test_lease_is_held_while_running_and_released_after(journal):
    owners = []

    def agent(task):
        owners.append(journal.get_run(eg.current().run_id).lease_owner)
        return 1

    eg.run(agent, "t", run_id="h", journal=journal)
    assert owners[0] and owners[0].split(":")[1].isdigit()
    assert journal.get_run("h").lease_owner is None


def _lease_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("engrain-lease")]


def test_runs_share_one_renewal_thread(journal):
    import engrain._durable.lease as lease_mod

    before = _lease_threads()
    for k in range(20):
        eg.run(lambda task: _lease_threads(), "t", run_id=f"s{k}", journal=journal)
    assert len(_lease_threads()) == 1 and len(before) <= 1
    assert lease_mod._renewer._leases == {}  # every run unregistered


def test_short_runs_do_not_wake_the_renewal_thread(journal, monkeypatch):
    # An idle renewal thread sleeps a default lease's renewal interval, not until woken: a run's
    # lease is due no sooner, so registering it wakes nothing (a thread switch per run otherwise).
    import engrain._durable.lease as lease_mod

    eg.run(lambda task: None, "t", run_id="w0", journal=journal)  # the thread exists
    time.sleep(0.05)  # and sleeps with no lease
    woken = []
    cond = lease_mod._renewer._cond
    real = cond.notify_all
    monkeypatch.setattr(cond, "notify_all", lambda: woken.append(1) or real())
    for k in range(30):
        assert eg.run(lambda task: task, "t", run_id=f"w{k + 1}", journal=journal).status == "ok"
    assert woken == [] and lease_mod._renewer._leases == {}


def test_a_completion_records_the_step_as_before(journal, calls):
    # A first attempt's completion carries its type, arguments and start; a retried one also its attempt
    # number; an at-most-once step's (whose durable start has the rest) only its result. The argument
    # digest ("ad") only where a list or dict could be changed by the call: scalars cannot.
    add, _ = make_tools(calls, eg.ToolRegistry())
    flaky_calls = []

    @eg.tool(retries=1, backoff=0, registry=eg.ToolRegistry())
    def flaky(x: int) -> int:
        flaky_calls.append(x)
        if len(flaky_calls) == 1:
            raise ValueError("once")
        return x

    @eg.tool(at_most_once=True, registry=eg.ToolRegistry())
    def pay(x: int) -> int:
        return x

    @eg.tool(registry=eg.ToolRegistry())
    def total(xs: list) -> int:
        xs.append(100)  # changes what it was given: the digest was taken before
        return sum(xs)

    r = eg.run(lambda task: add(1) + flaky(2) + pay(3) + total([1, 2]), "t", run_id="c1", journal=journal)
    assert r.output == 11 + 2 + 3 + 103
    done = [e.data for e in journal.read("c1") if e.kind == "step.completed"]
    assert list(done[0]) == ["call_id", "result", "type", "args", "started"]
    assert done[0]["args"] == {"a": 1, "b": 10} and done[0]["type"] == "tool" and done[0]["result"] == 11
    assert list(done[1]) == ["call_id", "result", "type", "args", "started", "attempt"] and done[1]["attempt"] == 2
    assert list(done[2]) == ["call_id", "result"] and done[2]["result"] == 3
    assert list(done[3]) == ["call_id", "result", "type", "args", "started", "ad"]
    from engrain._durable.steps import args_digest

    assert done[3]["args"] == {"xs": [1, 2, 100]} and done[3]["ad"] == args_digest({"xs": [1, 2]})


def test_a_long_run_keeps_its_lease_alive(journal):
    from engrain._durable.lease import Lease

    journal.append("long", [NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": []})], 0)
    with Lease(journal, "long", ttl=0.3) as lease:
        firsts = journal.get_run("long").lease_until
        for _ in range(8):  # 0.8 s: well past the ttl, so only renewals keep the lease
            time.sleep(0.1)
            assert not journal.acquire_lease("long", "otherhost:1:x", ttl=30)
        info = journal.get_run("long")
        assert info.lease_owner == lease.owner and info.lease_until > firsts + 0.3
    assert journal.get_run("long").lease_owner is None


def test_renewals_never_bring_back_a_dropped_lease(journal, monkeypatch):
    import engrain._durable.execution as durable
    from engrain._durable.lease import Lease

    monkeypatch.setattr(durable, "Lease", lambda j, run_id: Lease(j, run_id, ttl=0.03))  # renewed every 10 ms

    def agent(task, wait):
        time.sleep(0.12)
        if wait:
            eg.ask("ok?")
        return task

    assert eg.run(agent, "done", run_id="f1", inputs={"wait": False}, journal=journal).status == "ok"
    paused = eg.run(agent, "paused", run_id="f2", inputs={"wait": True}, journal=journal)
    assert paused.status == "needs_input"
    time.sleep(0.1)
    assert journal.get_run("f1").lease_owner is None  # dropped with run.completed
    assert journal.get_run("f2").lease_owner is None  # released explicitly
    assert journal.acquire_lease("f2", "otherhost:1:x", ttl=30)


def test_an_orphaned_runs_lease_expires_and_recover_takes_it(journal):
    journal.append("orph", [NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": []})], 0,
                   lease=("otherhost:1:gone", 0.1))
    late = lambda task: "late"  # noqa: E731
    assert eg.recover({}, unnamed=late, journal=journal) == []  # still leased
    with pytest.raises(eg.LeaseHeldError):
        eg.run(lambda task: "now", "t", run_id="orph", journal=journal)
    time.sleep(0.2)
    (r,) = eg.recover({}, unnamed=late, journal=journal)
    assert r.output == "late" and journal.get_run("orph").lease_owner is None


def test_a_forked_child_renews_its_own_leases(tmp_path):
    import os

    from engrain._durable.lease import Lease

    url = f"sqlite:///{tmp_path / 'fork.db'}"
    parent = eg.open(url)
    eg.run(lambda task: None, "t", run_id="p", journal=parent)  # the parent's renewal thread exists
    pid = os.fork()
    if pid == 0:  # the child: exits with 0 only if its lease outlived its ttl by renewal
        code = 1
        try:
            j = eg.open(url)
            j.append("c", [NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": []})], 0)
            with Lease(j, "c", ttl=0.2):
                time.sleep(0.5)
                code = 0 if not j.acquire_lease("c", "otherhost:1:x", ttl=30) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    parent.close()


def test_recover_resumes_orphaned_runs(journal, calls):
    add, _ = make_tools(calls, eg.ToolRegistry())
    for k in range(3):
        journal.append(
            f"o{k}",
            [
                NewEvent("run.started", "", {"task": "sum", "inputs": {"x": k}, "tags": [], "agent": "summer"}),
                NewEvent("step.started", "add", {"call_id": 0, "type": "tool", "args": {"a": k, "b": 10}, "attempt": 1}),
                NewEvent("step.completed", "add", {"call_id": 0, "result": k + 10}),
            ],
            0,
        )
    eg.run(lambda task, x: x, "other", run_id="finished", inputs={"x": 0}, journal=journal, agent_name="summer")
    results = eg.recover({"summer": lambda task, x: add(add(x), 1)}, journal=journal)
    assert sorted(r.output for r in results) == [11, 12, 13]
    assert all(r and r.replayed == 1 and r.executed == 1 and r.agent == "summer" for r in results)
    assert {r.run_id for r in results} == {"o0", "o1", "o2"}
    assert eg.recover({"summer": lambda task, x: x}, journal=journal) == []
