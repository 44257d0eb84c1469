"""Durable sleep (with a controllable clock) and patch-style versioning, on both backends."""

from __future__ import annotations

import datetime as dt

import pytest

import engrain as eg
from engrain._durable import sleep as sleep_mod


class FakeClock(sleep_mod.Clock):
    """A clock the test moves; ``sleep`` records the wait and, when armed, "kills the process" instead."""

    def __init__(self, start: float = 1_800_000_000.0):
        self.t = start
        self.slept: list[float] = []
        self.kill = False

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if self.kill:
            raise KeyboardInterrupt  # the process dies mid-sleep: the run stays resumable
        self.t += seconds


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(sleep_mod, "clock", c)
    return c


def test_killed_during_a_one_hour_sleep_sleeps_what_is_left(journal, clock):
    reg = eg.ToolRegistry()
    after: list[str] = []

    @eg.tool(registry=reg)
    def remind(who: str) -> str:
        after.append(who)
        return f"reminded {who}"

    def agent(task):
        eg.sleep(3600)
        return remind("ada")

    clock.kill = True
    with pytest.raises(KeyboardInterrupt):
        eg.run(agent, "remind", run_id="s1", journal=journal)
    assert clock.slept == [3600] and after == []
    step = [e for e in journal.read("s1") if e.kind == "step.completed"][0]
    assert step.name == "engrain.sleep" and step.data["result"] == {"until": 1_800_000_000.0 + 3600}
    # Restarted 59 minutes later: one minute left.
    clock.kill = False
    clock.t += 59 * 60
    res = eg.run(agent, "remind", run_id="s1", journal=journal)
    assert res and res.output == "reminded ada" and after == ["ada"]
    assert clock.slept == [3600, pytest.approx(60)]
    # Restarted after the wake-up time: no wait at all.
    clock.slept.clear()
    assert eg.run(agent, "remind", run_id="s1", journal=journal).output == "reminded ada" and clock.slept == []


def test_sleep_until_and_bad_input(journal, clock):
    when = dt.datetime.fromtimestamp(clock.t + 90, tz=dt.timezone.utc)

    def agent(task):
        eg.sleep_until(when)
        return "up"

    assert eg.run(agent, "t", run_id="s2", journal=journal).output == "up"
    assert clock.slept == [pytest.approx(90)]
    rec = [e for e in journal.read("s2") if e.name == "engrain.sleep"][0]
    assert rec.data["args"] == {"until": when.isoformat()} and rec.data["type"] == "sleep"
    with pytest.raises(eg.EngrainError, match="timezone-aware"):
        eg.sleep_until(dt.datetime(2030, 1, 1))
    for bad in (-1, float("nan"), "10", True):
        with pytest.raises(eg.EngrainError, match="seconds"):
            eg.sleep(bad)
    eg.sleep(5)  # outside a run: a plain sleep on the clock
    assert clock.slept[-1] == 5


def _v1(task):
    a = _tools["fetch"]("a")
    return _tools["notify"](_tools["old_parse"](a))


def _v2(task):
    a = _tools["fetch"]("a")
    if eg.patched("better-parser"):
        return _tools["notify"](_tools["new_parse"](a))
    return _tools["notify"](_tools["old_parse"](a))


def _v3(task):  # the old branch removed too early
    a = _tools["fetch"]("a")
    eg.patched("better-parser")
    return _tools["notify"](_tools["new_parse"](a))


_tools: dict = {}


@pytest.fixture
def tools():
    reg = eg.ToolRegistry()
    calls: list[str] = []

    @eg.tool(registry=reg)
    def fetch(x: str) -> str:
        calls.append("fetch")
        return x

    @eg.tool(registry=reg)
    def old_parse(x: str) -> str:
        calls.append("old_parse")
        return f"old {x}"

    @eg.tool(registry=reg)
    def new_parse(x: str) -> str:
        calls.append("new_parse")
        return f"new {x}"

    @eg.tool(registry=reg)
    def notify(x: str) -> str:
        calls.append("notify")
        return x

    _tools.update(fetch=fetch, old_parse=old_parse, new_parse=new_parse, notify=notify)
    return calls


def _crash_before_notify(journal, agent, run_id):
    """Record a run that got past the patched position, then 'died' (notify raises KeyboardInterrupt)."""
    real = _tools["notify"]

    def die(x):
        raise KeyboardInterrupt

    _tools["notify"] = die
    try:
        with pytest.raises(KeyboardInterrupt):
            eg.run(agent, "t", run_id=run_id, journal=journal, agent_name=NAME)
    finally:
        _tools["notify"] = real


#: The one program that _v1, _v2 and _v3 are versions of (each a deploy of it).
NAME = "notifier"


def _deployed(agent, run_id, journal):
    """Resume ``run_id`` with ``agent``, a new version of the program: opted in with upgrade=True."""
    return eg.run(agent, "t", run_id=run_id, journal=journal, agent_name=NAME, upgrade=True)


def test_patched_new_runs_take_the_new_branch_old_runs_replay_the_old(journal, tools):
    # A run of the old code, in flight when the new code is deployed.
    _crash_before_notify(journal, _v1, "old-run")
    tools.clear()
    # Another version of the code resumes a run only when told to (a deploy).
    with pytest.raises(eg.AgentMismatchError, match="another version of agent 'notifier'.*upgrade=True"):
        eg.run(_v2, "t", run_id="old-run", journal=journal, agent_name=NAME)
    assert tools == [] and journal.get_run("old-run").status == "running"
    old = _deployed(_v2, "old-run", journal)
    assert old.output == "old a" and tools == ["notify"]  # old_parse replayed, the old branch kept
    assert not any(e.name == "engrain.patched" for e in journal.read("old-run"))
    # A new run takes the new branch and records the marker; resumed, it stays on it.
    tools.clear()
    new = eg.run(_v2, "t", run_id="new-run", journal=journal, agent_name=NAME)
    assert new.output == "new a" and tools == ["fetch", "new_parse", "notify"]
    marker = [e for e in journal.read("new-run") if e.name == "engrain.patched"]
    assert len(marker) == 1 and marker[0].data["args"] == {"name": "better-parser"}
    _crash_before_notify(journal, _v2, "new-run-2")
    tools.clear()
    assert eg.run(_v2, "t", run_id="new-run-2", journal=journal, agent_name=NAME).output == "new a"
    assert tools == ["notify"]
    assert eg.patched("anything") is True  # outside a run


def test_run_that_cannot_replay_names_the_patch(journal, tools):
    # A run that cannot replay ends failed (terminal: resuming cannot fix it), its error naming the patch.
    _crash_before_notify(journal, _v1, "stuck")
    stuck = _deployed(_v3, "stuck", journal)
    assert stuck.status == "failed" and stuck.error_type == "NondeterminismError"
    assert "before patch 'better-parser'" in stuck.error
    # A marker recorded where the code no longer asks names the patch as the recorded step.
    _crash_before_notify(journal, _v2, "marked")
    marked = _deployed(_v1, "marked", journal)
    assert marked.status == "failed" and "patch 'better-parser'" in marked.error
    with pytest.raises(eg.EngrainError, match="patch name"):
        eg.patched("bad name!")
