"""Behavior cache (engrain.Engine) on both backends: hits, checks, tags, params, divergence, persistence."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import engrain as eg
from engrain import Check, Engine


class World:
    """A tiny environment: a screen whose state the checks read, and a log of real effects."""

    def __init__(self) -> None:
        self.screen = "login"
        self.effects: list[tuple] = []


def same(a, b) -> bool:
    return a == b


def make_engine(url: str, world: World, **kw) -> tuple[Engine, dict]:
    engine = Engine(eg.open(url), **kw)
    calls = {"agent": 0}

    @engine.function(pre_check=Check(lambda field, text: world.screen, same))
    def type_text(field: str, text: str) -> str:
        world.effects.append(("type", field, text))
        return f"typed {text}"

    @engine.function(pre_check=Check(lambda button: world.screen, same))
    def click(button: str) -> str:
        world.effects.append(("click", button))
        if button == "submit":
            world.screen = "done"
        return f"clicked {button}"

    def agent(task: str) -> str:
        calls["agent"] += 1
        name = task.rsplit(": ", 1)[-1]
        type_text("first_name", name)
        type_text("email", f"{name.lower()}@example.com")
        return click("submit")

    engine.set_agent(agent).finalize()
    return engine, calls


def test_miss_then_hit_with_identical_side_effects(store_url):
    world = World()
    engine, calls = make_engine(store_url, world)
    first = engine("fill the form: Ada")
    assert not first and first.status == "ok" and first.agent_called and first.stored
    effects_miss = list(world.effects)
    world.effects.clear()
    world.screen = "login"
    second = engine("fill the form: Ada")
    assert second and second.output == first.output == "clicked submit"
    assert calls["agent"] == 1 and not second.agent_called
    assert world.effects == effects_miss
    assert [s["source"] for s in second.steps] == ["replayed"] * 3
    kinds = [e.kind for e in engine.journal.read(second.run_id)]
    assert "replay.started" in kinds and kinds[-1] == "run.completed"
    stats = engine.stats()
    assert stats["hits"] == 1 and stats["misses"] == 1 and stats["entries"] == 1


def test_a_step_mode_call_creates_its_run_without_reading_it_back(store_url, monkeypatch):
    # A run id the engine makes is new, so nothing is read for it; a given one is still read and resumed.
    world = World()
    engine, calls = make_engine(store_url, world)
    engine("fill the form: Ada")
    read: list[str] = []
    real = engine.journal.read_raw
    monkeypatch.setattr(engine.journal, "read_raw", lambda run_id, *a, **k: read.append(run_id) or real(run_id, *a, **k))
    world.screen = "login"
    hit = engine("fill the form: Ada")
    assert hit and hit.run_id not in read
    again = engine("fill the form: Ada", run_id=hit.run_id)
    assert hit.run_id in read and again.output == hit.output and calls["agent"] == 1


def test_different_task_and_tags_never_share_a_trajectory(store_url):
    world = World()
    engine, calls = make_engine(store_url, world)
    assert not engine("fill the form: Ada", tags=["signup"])
    world.screen = "login"
    assert not engine("fill the form: Bob", tags=["signup"])  # another task
    world.screen = "login"
    assert not engine("fill the form: Ada", tags=["newsletter"])  # same task, other tags
    world.screen = "login"
    assert engine("fill the form: Ada", tags=["signup"])
    assert calls["agent"] == 3


def test_pre_check_selects_among_trajectories(store_url):
    world = World()
    engine = Engine(eg.open(store_url))
    log: list[str] = []

    @engine.function(pre_check=Check(lambda: world.screen, same))
    def open_menu() -> str:
        log.append(f"menu@{world.screen}")
        return world.screen

    @engine.function()
    def choose(item: str) -> str:
        log.append(item)
        return item

    def agent(task: str) -> str:
        open_menu()
        return choose("light" if world.screen == "day" else "dark")

    engine.set_agent(agent).finalize()
    world.screen = "day"
    engine("pick a theme")
    world.screen = "night"
    engine("pick a theme")
    log.clear()
    world.screen = "day"
    out = engine("pick a theme")
    assert out and out.output == "light" and log == ["menu@day", "light"]
    world.screen = "night"
    out = engine("pick a theme")
    assert out and out.output == "dark"
    world.screen = "dusk"
    out = engine("pick a theme")
    assert not out and "pre-checks failed for all 2" in out.reason


def test_params_substitute_across_task_strings(store_url):
    engine = Engine(eg.open(store_url))
    typed: list[str] = []

    @engine.function()
    def type_text(text: str) -> str:
        typed.append(text)
        return text

    def agent(task: str) -> str:
        name = task.rsplit(": ", 1)[-1]
        type_text(name)
        type_text(f"Hello {name}!")
        return f"greeted {name}"

    engine.set_agent(agent).finalize()
    assert not engine("fill the form with name: John", params={"name": "John"})
    typed.clear()
    out = engine("fill the form with name: Jane", params={"name": "Jane"})
    assert out, out.reason
    assert typed == ["Jane", "Hello Jane!"]
    assert out.output == "greeted Jane"


def test_time_expiry_example_from_muscle_mem(store_url):
    """muscle-mem's README example, with a shorter expiry to keep the test fast."""

    @dataclasses.dataclass
    class T:
        name: str
        time: float

    engine = Engine(eg.open(store_url))
    said: list[str] = []

    def capture(name: str) -> T:
        return T(name=name, time=time.time())

    def compare(current: T, candidate: T) -> bool:
        return current.time - candidate.time <= 0.5

    @engine.function(pre_check=Check(capture, compare))
    def hello(name: str) -> None:
        said.append(name)

    def agent(name: str) -> None:
        for i in range(9):
            hello(name + " + " + str(i))

    engine.set_agent(agent).finalize()
    assert not engine("erik")
    assert engine("erik")
    time.sleep(0.8)
    assert not engine("erik")
    assert len(said) == 27


@pytest.mark.parametrize("durability", ["step", "run", "off"])
def test_divergence_hands_off_and_nothing_runs_twice(store_url, durability):
    world = World()
    engine = Engine(eg.open(store_url), durability=durability)
    runs: dict[str, int] = {}
    seen: list = []

    def step_tool(n: int):
        @engine.function(pre_check=Check(lambda: world.screen, same), name=f"step{n}")
        def t() -> int:
            runs[f"step{n}"] = runs.get(f"step{n}", 0) + 1
            if n == 2:
                world.screen = "popup" if world.effects else "page"
            return n

        return t

    tools = [step_tool(n) for n in range(5)]

    def agent(task: str, continuation=None) -> int:
        seen.append(continuation)
        if continuation is not None:
            world.screen = "page"  # the agent dismisses the popup, then does the whole task again
        return sum(t() for t in tools)

    engine.set_agent(agent).finalize()
    world.screen = "page"
    assert not engine("five steps")
    runs.clear()
    world.screen = "page"
    world.effects.append("popup will show")  # step2 now opens a popup: step3's pre-check fails
    out = engine("five steps")
    assert not out and out.agent_called and out.status == "ok" and out.output == 10
    assert runs == {f"step{n}": 1 for n in range(5)}  # steps 0-2 by the replay, 3-4 by the agent
    cont = seen[-1]
    assert cont.diverged_at == 3 and [d.name for d in cont.steps] == ["step0", "step1", "step2"]
    assert [s["source"] for s in out.steps] == ["replayed"] * 3 + ["continued"] * 3 + ["agent"] * 2
    kinds = [e.kind for e in engine.journal.read(out.run_id)]
    assert durability == "off" and kinds == [] or "replay.diverged" in kinds and "check.failed" in kinds


def test_repeated_divergence_evicts_the_entry(store_url):
    world = World()
    engine = Engine(eg.open(store_url), evict_after=2)

    @engine.function(post_check=Check(lambda: world.screen, same))
    def act() -> str:
        return "acted"

    def agent(task: str, continuation=None) -> str:
        if continuation is not None:
            raise RuntimeError("this agent cannot recover")  # so no new entry replaces the old one
        return act()

    engine.set_agent(agent).finalize()
    engine("act once")
    first_entry = engine.entries()[0].id
    world.screen = "changed"  # the post-check sees another screen than recorded: every replay diverges
    for _ in range(2):
        out = engine("act once")
        assert not out and out.reason.startswith("diverged: post-check of step 0")
        assert out.status == "failed"
    assert first_entry not in [e.id for e in engine.entries()]
    assert engine.stats()["evicted"] == 1


def test_check_scores_use_the_threshold_and_reject_other_types():
    assert Check(lambda: 0, lambda a, b: 0.7, threshold=0.6).passes(1, 1)
    assert not Check(lambda: 0, lambda a, b: 0.2).passes(1, 1)  # a float is never truthy by itself
    with pytest.raises(eg.CacheError, match="score"):
        Check(lambda: 0, lambda a, b: 1.5).passes(1, 1)
    with pytest.raises(eg.CacheError, match="return a bool"):
        Check(lambda: 0, lambda a, b: "yes").passes(1, 1)


def test_finalize_names_what_is_missing(store_url):
    engine = Engine(eg.open(store_url))
    with pytest.raises(eg.CacheError, match="at least one tool.*an agent"):
        engine.finalize()

    class Browser:
        @engine.method()
        def click(self, selector: str) -> str:
            return selector

    engine.set_agent(lambda task: None)
    with pytest.raises(eg.CacheError, match=r"context object for the method tools \['Browser.click'\]"):
        engine.finalize()


def test_methods_get_self_from_set_context(store_url):
    engine = Engine(eg.open(store_url))

    class Browser:
        def __init__(self) -> None:
            self.clicked: list[str] = []

        @engine.method()
        def click(self, selector: str) -> str:
            self.clicked.append(selector)
            return selector

    browser = Browser()
    engine.set_agent(lambda task: browser.click("#go")).set_context(browser).finalize()
    assert not engine("go")
    assert engine("go")
    assert browser.clicked == ["#go", "#go"]
    assert Browser().click("#x") == "#x"  # transparent outside the engine


def test_failed_and_empty_runs_are_not_stored(store_url):
    engine = Engine(eg.open(store_url))

    @engine.function()
    def work() -> int:
        return 1

    def agent(task: str) -> int:
        if task == "fail":
            work()
            raise RuntimeError("boom")
        return 0

    engine.set_agent(agent).finalize()
    out = engine("fail")
    assert out.status == "failed" and "boom" in out.reason
    assert engine("nothing to do").stored is None
    assert engine.stats()["entries"] == 0


def test_tool_called_from_another_thread_does_not_leak(store_url):
    engine = Engine(eg.open(store_url))

    @engine.function()
    def main_step() -> str:
        return "main"

    @engine.function()
    def side_step() -> str:
        return "side"

    def agent(task: str) -> str:
        t = threading.Thread(target=side_step)
        t.start()
        t.join()
        return main_step()

    engine.set_agent(agent).finalize()
    out = engine("threads")
    # The side step is in no call's trajectory, so an entry of main_step alone would replay without it.
    assert out.status == "ok" and out.stored is None and "not stored" in out.reason
    assert engine.entries() == []


def test_concurrent_engine_calls(store_url):
    engine = Engine(eg.open(store_url))
    counter = {"n": 0}
    lock = threading.Lock()

    @engine.function()
    def step(task: str) -> str:
        with lock:
            counter["n"] += 1
        return task.upper()

    engine.set_agent(lambda task: step(task)).finalize()
    results: list = []

    def worker(i: int) -> None:
        for _ in range(3):
            results.append(engine(f"task {i % 4}"))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 24 and all(r.status == "ok" for r in results)
    assert all(r.output == f"TASK {r.output[-1]}" for r in results)
    assert sum(1 for r in results if r.hit) >= 24 - 8  # at most one miss per thread per task


@pytest.mark.parametrize("durability", ["step", "run", "off"])
def test_async_agent_and_tools(store_url, durability):
    engine = Engine(eg.open(store_url), durability=durability)
    done: list[str] = []

    @engine.function()
    async def fetch(url: str) -> str:
        await asyncio.sleep(0)
        done.append(url)
        return f"<{url}>"

    async def agent(task: str) -> str:
        return await fetch("https://example.com/" + task)

    engine.set_agent(agent).finalize()
    first = asyncio.run(engine("a"))
    second = asyncio.run(engine("a"))
    assert not first and second and second.output == "<https://example.com/a>"
    assert done == ["https://example.com/a"] * 2


def test_entries_persist_across_processes(store_url, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(
        """
        import json, sys
        import engrain as eg
        engine = eg.Engine(eg.open(sys.argv[1]))
        calls = []

        @engine.function()
        def greet(name: str) -> str:
            return "hi " + name

        def agent(task):
            calls.append(task)
            return greet("Ada")

        engine.set_agent(agent).finalize()
        out = engine("greet Ada")
        print(json.dumps({"hit": bool(out), "agent_calls": len(calls), "output": out.output}))
        """
    ))
    env = dict(os.environ)
    outs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, str(script), store_url], capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0, p.stderr
        outs.append(p.stdout.strip().splitlines()[-1])
    assert outs[0] == '{"hit": false, "agent_calls": 1, "output": "hi Ada"}'
    assert outs[1] == '{"hit": true, "agent_calls": 0, "output": "hi Ada"}'


@pytest.mark.parametrize("durability", ["step", "run"])
def test_replay_switches_to_a_trajectory_that_fits_mid_way(store_url, durability):
    """Two trajectories share their first step; a failed pre-check at step 1 switches, no agent call."""
    world = World()
    engine = Engine(eg.open(store_url), durability=durability)
    log: list[str] = []

    @engine.function(pre_check=Check(lambda: "start", same))
    def open_app() -> str:
        log.append("open")
        return "opened"

    @engine.function(pre_check=Check(lambda action: world.screen, same))
    def act(action: str) -> str:
        log.append(action)
        return action

    def agent(task: str, continuation=None) -> str:
        if not continuation:
            open_app()
        return act("close popup" if world.screen == "popup" else "work")

    engine.set_agent(agent).finalize()
    world.screen = "main"
    engine("do it")  # miss: records open_app, act(work) under screen=main
    assert engine("do it") and engine("do it")  # now the best-ranked entry
    world.screen = "popup"
    out = engine("do it")  # diverges at step 1, hands off: records open_app, act(close popup)
    assert not out and out.reason.startswith("diverged")
    log.clear()
    out = engine("do it")  # best entry diverges at step 1 again; the other one fits: switch
    assert out and out.output == "close popup" and "switching" in out.reason
    assert log == ["open", "close popup"] and not out.agent_called


def _events_of(engine: Engine, run_id: str) -> list[tuple]:
    """A run's events without what differs between two runs of the same call (ids, times, counts)."""
    out = []
    for e in engine.journal.read(run_id):
        data = dict(e.data)
        data.pop("started", None)  # a completion-only step's start time
        if e.name == "engrain.cache.lookup" and e.kind == "step.completed":
            data["result"] = {k: v for k, v in data["result"].items() if k != "reason"}
        out.append((e.seq, e.kind, e.name, data))
    return out


def _steps_of(engine: Engine, run_id: str) -> list[tuple]:
    """A run's steps as the journal's fold and the API's see them, without what differs between two runs."""
    from engrain._durable.steps import steps_of
    from engrain._server.runs import fold_steps

    events = engine.journal.read(run_id)
    out = []
    for rec, view in zip(steps_of(events).values(), fold_steps(events), strict=True):
        result = rec.result
        if rec.name == "engrain.cache.lookup":
            result = {k: v for k, v in result.items() if k != "reason"}
        assert (view["call_id"], view["name"], view["args"], view["state"]) == (rec.call_id, rec.name, rec.args, rec.state)
        out.append((rec.call_id, rec.name, rec.type, rec.args, rec.state, result, view["replayed"]))
    return out


@pytest.mark.parametrize("durability", ["run", "off"])
def test_batched_modes_journal_a_hit_like_a_durable_run(store_url, durability):
    """durability="run" journals a hit as three events (run.started, one replay.completed carrying
    every step, run.completed) whose steps fold exactly as a durable run's; "off" journals none."""
    world = World()
    steps_engine, _ = make_engine(store_url, world)
    fast, calls = make_engine(store_url, world, durability=durability)
    assert not steps_engine("fill the form: Ada", params={"name": "Ada"})
    outs = {}
    for name, engine in (("step", steps_engine), (durability, fast)):
        world.screen, world.effects = "login", []
        outs[name] = engine("fill the form: Ada", params={"name": "Ada"})
        assert outs[name] and outs[name].output == "clicked submit" and len(world.effects) == 3
    assert calls["agent"] == 0 and [s["args"] for s in outs["step"].steps] == [s["args"] for s in outs[durability].steps]
    expected = _events_of(steps_engine, outs["step"].run_id)
    assert [k for _, k, _, _ in expected].count("step.completed") == 4 and expected[-1][1] == "run.completed"
    got = _events_of(fast, outs[durability].run_id)
    if durability == "off":
        assert got == []
        return
    assert [k for _, k, _, _ in got] == ["run.started", "replay.completed", "run.completed"]
    assert got[0] == expected[0] and got[-1][1:] == expected[-1][1:]
    steps = _steps_of(steps_engine, outs["step"].run_id)
    assert [s[-1] for s in steps] == [False, True, True, True]  # the lookup, then three replayed tools
    assert _steps_of(fast, outs[durability].run_id) == steps


@pytest.mark.parametrize("durability", ["step", "run", "off"])
def test_replayed_tools_see_keys_and_non_json_results_fail(store_url, durability):
    """Every mode gives a replayed tool its idempotency key and fails a step whose result is not JSON."""
    engine = Engine(eg.open(store_url), durability=durability)
    keys: list = []
    mode = {"result": "ok"}

    @engine.function(pre_check=Check(lambda: 1, same))
    def effect() -> object:
        keys.append(eg.idempotency_key())
        return mode["result"]

    engine.set_agent(lambda task: effect()).finalize()
    assert not engine("do the effect")
    hit = engine("do the effect")
    assert hit and keys == [f"{engine_run}:1" for engine_run in (keys[0].split(":")[0], hit.run_id)]
    mode["result"] = {1, 2}  # a set would come back from the journal as a list
    bad = engine("do the effect")
    assert not bad and bad.status == "failed" and "effect" in bad.error and "NotJSONError" in bad.error


@pytest.mark.parametrize("durability", ["step", "off"])
def test_a_key_that_is_not_unicode_text_is_refused_by_name_in_every_mode(store_url, durability):
    """A task, tag or param holding a lone surrogate is a NotJSONError naming it before the agent runs: with
    durability="off" no journal refused it, and storing the key stopped with a bare UnicodeEncodeError."""
    engine = Engine(eg.open(store_url), durability=durability)
    calls = []

    @engine.function()
    def note(task: object) -> str:
        calls.append(task)
        return "noted"

    engine.set_agent(lambda task: note(task)).finalize()
    for kw, path in [({"task": "fill \ud800"}, "task"), ({"task": ["fill", {"who": "\ud800"}]}, r"task\[1\]\['who'\]"),
                     ({"task": "ok", "tags": ["\udfff"]}, r"tags\[0\]"),
                     ({"task": "ok", "params": {"who": "\ud800"}}, r"params\['who'\]")]:
        with pytest.raises(eg.NotJSONError, match=f"^engine call: {path} holds a lone surrogate"):
            engine(**kw)
    assert calls == []
    first, again = engine("fill the form"), engine("fill the form")  # a good key still stores, then replays
    assert (first.hit, first.agent_called, again.hit, again.agent_called) == (False, True, True, False)


def test_cache_cli_lists_counts_and_evicts(store_url):
    import json
    import shutil

    engine = Engine(eg.open(store_url))

    @engine.function()
    def ping(host: str) -> str:
        return "pong " + host

    engine.set_agent(lambda task: ping("db1")).finalize()
    engine("check db1")
    engine("check db1")
    engine.close()
    exe = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([exe, "cache", *args, "--url", store_url], capture_output=True, text=True, timeout=60)

    rows = json.loads(cli("entries", "--json").stdout)
    assert [r["task"] for r in rows] == ["check db1"] and rows[0]["successes"] == 2
    st = json.loads(cli("stats", "--json").stdout)
    assert st["hits"] == 1 and st["misses"] == 1 and st["entries"] == 1 and st["hit_rate"] == 0.5
    assert cli("evict", rows[0]["id"]).returncode == 0
    bad = cli("evict", rows[0]["id"])
    assert bad.returncode == 2 and "no cache entry" in bad.stderr
    assert json.loads(cli("entries", "--json").stdout) == []


def test_a_run_mode_hit_is_one_append_that_reads_back_as_its_steps(store_url):
    """durability="run": a full replay is one append (one transaction) of three events; the run
    reads back as finished with every step counted, and `engrain show` lists each step."""
    from engrain._cli.runs import timeline

    world = World()
    engine, calls = make_engine(store_url, world, durability="run")
    assert not engine("fill the form: Ada", params={"name": "Ada"})
    appends: list[list[str]] = []
    real = engine.journal.append

    def counted(run_id, events, seq, **kw):
        appends.append([e.kind for e in events])
        return real(run_id, events, seq, **kw)

    engine.journal.append = counted
    world.screen, world.effects = "login", []
    out = engine("fill the form: Ada", params={"name": "Ada"})
    assert out and calls["agent"] == 1 and len(world.effects) == 3
    assert appends == [["run.started", "replay.completed", "run.completed"]]
    recorded = engine.journal.read(out.run_id)[0].data["agent"]  # only the engine's agent may read it back as a run
    again = eg.run(lambda task: None, "fill the form: Ada", run_id=out.run_id, journal=engine.journal,
                   agent_name=recorded)
    assert again.status == "ok" and again.replayed == 4 and again.output == "clicked submit"
    lines = timeline(engine.journal.read(out.run_id))
    assert sum(" step " in line for line in lines) == 4
    assert any("type_text" in line and "typed Ada" in line for line in lines)
    assert any("click" in line and "clicked submit" in line for line in lines)


def test_a_run_mode_hit_keeps_a_completion_s_other_keys():
    """A completion with keys beyond the plain five (a digest, a UDF's source) is still folded into the
    one replay.completed, its other keys kept beside its step."""
    from engrain._durable.batched import _compact
    from engrain._durable.steps import replayed_steps

    t = {"type": "tool", "args": {}, "started": 1.0}
    events = [
        eg.NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": []}),
        eg.NewEvent("step.completed", "engrain.cache.lookup", {"call_id": 0, "result": {"entry": "e"}, **t}),
        eg.NewEvent("replay.started", "e", {"entry": "e", "task": "t", "steps": 1}),
        eg.NewEvent("step.completed", "f", {"call_id": 1, "result": 2, **t, "digest": "abc", "udf": {"source": "s"}}),
        eg.NewEvent("run.completed", "", {"output": 2}),
    ]
    out = _compact(events)
    assert [e.kind for e in out] == ["run.started", "replay.completed", "run.completed"]
    items = out[1].data["completions"]
    assert items[1][5] == {"digest": "abc", "udf": {"source": "s"}} and len(items[0]) == 5
    assert [(cid, s[0], s[3]) for cid, s in replayed_steps(out[1].data)] == [(0, "engrain.cache.lookup", {"entry": "e"}), (1, "f", 2)]
    assert _compact(events[:2] + events[3:]) == events[:2] + events[3:]  # no replay.started: kept as it is


def test_a_step_mode_hit_journals_each_replayed_step_as_the_agent_did(store_url):
    """A replayed step (the hit's fast path) journals what the agent's call did: list arguments with
    their digest, a failure as step.failed ending the run failed, never as a hit."""
    engine = Engine(eg.open(store_url))
    mode = {"fail": False}

    @engine.function(pre_check=Check(lambda items: len(items), same))
    def total(items: list) -> int:
        if mode["fail"]:
            raise RuntimeError("the ledger is down")
        return sum(items)

    engine.set_agent(lambda task: total([1, 2, 3])).finalize()
    miss = engine("add up")
    hit = engine("add up")
    assert not miss and hit and hit.output == 6

    def tool_step(run_id):
        (e,) = [e for e in engine.journal.read(run_id) if e.kind in ("step.completed", "step.failed") and e.name == "total"]
        return e

    recorded, replayed = tool_step(miss.run_id), tool_step(hit.run_id)
    assert replayed.data["args"] == {"items": [1, 2, 3]} and replayed.data["ad"] == recorded.data["ad"]
    mode["fail"] = True
    failed = engine("add up")
    assert not failed and failed.status == "failed" and "the ledger is down" in failed.error
    step = tool_step(failed.run_id)
    assert step.kind == "step.failed" and engine.journal.read(failed.run_id)[-1].kind == "run.failed"
