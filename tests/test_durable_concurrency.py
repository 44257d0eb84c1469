"""Concurrent steps of a durable run (threads, asyncio.gather) on resume.

A resumed run's threads never deadlock on the run's lock, and every recorded
result goes back to the call that recorded it (same type, name and arguments),
whatever order concurrent branches begin their calls in on the resume. On a
SQLite journal, with real threads and a real event loop; each scenario runs in
a thread joined with a timeout, so a hang fails the test instead of the suite.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

import engrain as eg

_reg = eg.ToolRegistry()
_calls: list[str] = []
_gate: dict[str, threading.Event] = {}


@eg.tool(registry=_reg)
def work(kind: str) -> str:
    """A step the test's events steer: ``kind.in`` is set as it begins, ``kind.wait`` awaited, ``kind.die``
    kills it mid-call (a BaseException journals nothing, as a killed process)."""
    _calls.append(kind)
    if f"{kind}.in" in _gate:
        _gate[f"{kind}.in"].set()
    if f"{kind}.wait" in _gate:
        _gate[f"{kind}.wait"].wait(10)
    if f"{kind}.die" in _gate:
        raise SystemExit("killed mid-step")
    return f"done {kind}"


@eg.llm(registry=_reg)
async def chat(prompt: str) -> str:
    _calls.append(prompt)
    await asyncio.sleep(0.2 if prompt.startswith("A") else 0.01)  # B's model answers faster
    return f"answer to [{prompt}]"


@eg.tool(registry=_reg)
async def fetch(url: str) -> str:
    _calls.append(url)
    await asyncio.sleep(0.2 if "slow" in url else 0.01)
    return f"<page of {url}>"


@eg.tool(registry=_reg, name="store")
async def store_page(page: str) -> str:
    return f"stored {page}"


@pytest.fixture
def journal(tmp_path):
    j = eg.open(f"sqlite:///{tmp_path / 'runs.db'}")
    _calls.clear()
    _gate.clear()
    yield j
    j.close()


def _within(seconds: float, fn):
    """``fn()``'s value, run in a thread: a hang fails the test after ``seconds`` instead of blocking it."""
    out: dict = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"hung for {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


def _threads(*jobs):
    ts = [threading.Thread(target=contextvars.copy_context().run, args=(job,)) for job in jobs]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)


def test_a_thread_reaching_a_recorded_step_on_the_new_step_path_does_not_deadlock(journal):
    """The path the second of two racing threads takes: the tool's new-step path, at a step the journal holds."""
    state = {"first": True}

    def agent(task):
        if state["first"]:
            work("fast")
            raise KeyboardInterrupt  # the process dies after step 0 was journaled
        return eg.current()._call_new("work", "tool", {"kind": "fast"}, work, ("fast",), {})

    with pytest.raises(KeyboardInterrupt):
        eg.run(agent, "t", run_id="r", journal=journal)
    state["first"] = False
    res = _within(10, lambda: eg.run(agent, "t", run_id="r", journal=journal))
    assert res.status == "ok" and res.output == "done fast" and res.replayed == 1 and _calls == ["fast"]


def _gates(*names: str) -> None:
    _gate.clear()
    _gate.update({n: threading.Event() for n in names})


def _thread_agent(*branches: list[tuple[str | None, str]]):
    """An agent running each branch in a thread: a branch's items are (event to await first, kind of work);
    after each call the thread sets ``<kind>.done``. A crash (``crash`` gate) ends the run as a killed process."""
    def agent(task):
        out: dict = {}

        def branch(items):
            for wait, kind in items:
                if wait is not None:
                    _gate[wait].wait(10)
                try:
                    out[kind] = work(kind)
                except SystemExit:
                    return
                finally:
                    if f"{kind}.done" in _gate:
                        _gate[f"{kind}.done"].set()

        _threads(*[lambda items=items: branch(items) for items in branches])
        if "crash" in _gate:
            raise KeyboardInterrupt
        return out

    return agent


def test_resumed_threads_take_their_own_steps_whatever_order_they_call_in(journal):
    # First execution: slow takes step 0 and dies mid-call once fast's step 1 is journaled.
    _gates("crash", "slow.in", "slow.wait", "slow.die", "fast.done")
    _gate["slow.wait"] = _gate["fast.done"]
    agent = _thread_agent([(None, "slow")], [("slow.in", "fast")])
    with pytest.raises(KeyboardInterrupt):
        _within(20, lambda: eg.run(agent, "t", run_id="thr", journal=journal))
    done = [(e.data["call_id"], e.data["args"]) for e in journal.read("thr") if e.kind == "step.completed"]
    assert done == [(1, {"kind": "fast"})]
    # Resume: fast calls first now. Its recorded step is handed back; slow runs again as step 0.
    _gates("fast.done")
    _calls.clear()
    agent = _thread_agent([("fast.done", "slow")], [(None, "fast")])
    res = _within(20, lambda: eg.run(agent, "t", run_id="thr", journal=journal))
    assert res.status == "ok", res.error
    assert res.output == {"slow": "done slow", "fast": "done fast"} and _calls == ["slow"]
    assert sorted(e.data["call_id"] for e in journal.read("thr") if e.kind == "step.completed") == [0, 1]


def test_a_branch_new_step_never_takes_a_number_another_branch_recorded(journal):
    """a1 and b1 ran together and were journaled; a2 was in flight at the crash. On resume branch a runs
    ahead: a2 is a new step while b1's record still waits for branch b, which then gets its own result."""
    _gates("crash", "a1.in", "a1.wait", "b1.in", "b1.done", "a2.wait", "a2.die")
    _gate["a1.wait"], _gate["a2.wait"] = _gate["b1.in"], _gate["b1.done"]  # a1 spans b1's start
    first = _thread_agent([(None, "a1"), (None, "a2")], [("a1.in", "b1")])
    with pytest.raises(KeyboardInterrupt):
        _within(20, lambda: eg.run(first, "t", run_id="ahead", journal=journal))
    done = [(e.data["call_id"], e.data["args"]["kind"]) for e in journal.read("ahead") if e.kind == "step.completed"]
    assert sorted(done) == [(0, "a1"), (1, "b1")]
    _gates("a2.done")
    _calls.clear()
    resumed = _thread_agent([(None, "a1"), (None, "a2")], [("a2.done", "b1")])
    res = _within(20, lambda: eg.run(resumed, "t", run_id="ahead", journal=journal))
    assert res.status == "ok", res.error
    assert res.output == {"a1": "done a1", "a2": "done a2", "b1": "done b1"} and _calls == ["a2"]
    ids = [e.data["call_id"] for e in journal.read("ahead") if e.kind == "step.completed"]
    assert sorted(ids) == [0, 1, 2]  # a2 took a number no recorded step holds


def _gathered_llm_agent(task):
    async def sub(name):
        first = await chat(f"{name}: plan")
        return [name, first, await chat(f"{name}: act on {first}")]

    async def agent():
        results = await asyncio.gather(sub("A"), sub("B"))
        eg.ask("publish these?", [{"name": "ok", "type": "boolean"}])
        return results

    return asyncio.run(agent())


def test_gathered_llm_branches_get_their_own_recorded_results(journal):
    """B's model answers faster, so steps were numbered A1, B1, B2, A2; a resume (A first) takes its own."""
    assert eg.run(_gathered_llm_agent, "t", run_id="g", journal=journal).status == "needs_input"
    completions = [e.data for e in journal.read("g") if e.kind == "step.completed"]
    assert all(len(d["ad"]) == 16 for d in completions)  # LLM arguments are identified by a digest too
    eg.answer("g", {"ok": True}, journal=journal)
    _calls.clear()
    res = _within(20, lambda: eg.run(_gathered_llm_agent, "t", run_id="g", journal=journal))
    assert res.status == "ok", res.error
    for name, first, second in res.output:
        assert first == f"answer to [{name}: plan]"
        assert second == f"answer to [{name}: act on answer to [{name}: plan]]"
    assert _calls == [] and res.replayed == 5 and res.executed == 0


def _gathered_tool_agent(task):
    async def sub(url):
        return await store_page(await fetch(url))

    async def agent():
        results = await asyncio.gather(sub("https://slow.example"), sub("https://fast.example"))
        eg.ask("publish?", [{"name": "ok", "type": "boolean"}])
        return results

    return asyncio.run(agent())


def test_gathered_tool_branches_resume_without_a_spurious_nondeterminism_error(journal):
    assert eg.run(_gathered_tool_agent, "t", run_id="gt", journal=journal).status == "needs_input"
    eg.answer("gt", {"ok": True}, journal=journal)
    _calls.clear()
    res = _within(20, lambda: eg.run(_gathered_tool_agent, "t", run_id="gt", journal=journal))
    assert res.status == "ok", res.error
    assert res.output == ["stored <page of https://slow.example>", "stored <page of https://fast.example>"]
    assert _calls == [] and res.executed == 0


def test_a_sequential_llm_call_with_rebuilt_arguments_still_replays_in_order(journal):
    """Frameworks rebuild an LLM call's conversation with fresh timestamps: in sequence, order names the call."""
    stamp = {"n": 0}

    def agent(task):
        stamp["n"] += 1
        reply = asyncio.run(chat(f"hello at {stamp['n']}"))
        eg.ask("ok?", [{"name": "ok", "type": "boolean"}])
        return reply

    assert eg.run(agent, "t", run_id="seq", journal=journal).status == "needs_input"
    eg.answer("seq", {"ok": True}, journal=journal)
    _calls.clear()
    res = eg.run(agent, "t", run_id="seq", journal=journal)
    assert res.status == "ok" and res.output == "answer to [hello at 1]" and _calls == []
