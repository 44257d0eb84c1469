"""muscle-mem code runs on engrain with only the import changed.

Part 1 is muscle-mem's own test suite (tests/test_caching.py of
pig-dot-dev/muscle-mem) with ``import muscle_mem as mm`` changed to
``import engrain.muscle_mem as mm`` and nothing else. Part 2 runs the examples
of muscle-mem's README the same way. Part 3 covers the differences the issue
listed, on :class:`engrain.Engine` itself (options, not defaults).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import time

import numpy as np
import pytest

import engrain as eg
import engrain.muscle_mem as mm
from engrain import CacheError, Check, Engine

# -- part 1: muscle-mem's tests/test_caching.py, import changed ----------------------------------------------


class TestEngineCaching:
    @pytest.fixture
    def setup(self):
        """Create and return all test components: env, agent, and engine."""

        # Create and configure engine
        engine = mm.Engine()

        # Create environment
        class Env:
            def __init__(self):
                self.val = 0

            def capture(self, n: int) -> int:
                return self.val

            @staticmethod
            def compare(current: int, candidate: int) -> bool:
                return current == candidate

            @engine.method(pre_check=mm.Check(capture=capture, compare=compare))
            def increment(self, n: int = 1):
                self.val += n
                return self.val

        env = Env()

        # Create agent
        class Agent:
            def __init__(self, env):
                self.env = env

            def __call__(self, task: str):
                """Where task is 'add n'"""
                n = int(task.split(" ")[1])
                for _ in range(n):
                    # simulates multi-step tool calling
                    arg_from_agent = 1  # simulate some parameter decided by the agent, used for testing parameterization
                    self.env.increment(arg_from_agent)

        agent = Agent(env)

        # Setup engine
        engine.set_context(env)
        engine.set_agent(agent)
        engine.finalize()

        # Return all components as a tuple
        return env, agent, engine

    def test_calling_agent_directly(self, setup):
        """Test agent works when called directly"""
        env, agent, _ = setup

        expect = 0
        for i in range(10):
            assert env.val == expect
            cmd = f"add {i}"
            agent(cmd)
            expect += i
            assert env.val == expect

    def test_single_step(self, setup):
        """Test basic cache miss and hit scenarios."""
        env, _, engine = setup

        engine.metrics.enable()

        # Initial cache miss 0->1
        assert env.val == 0
        assert not engine("add 1")
        assert env.val == 1

        env.val = 0
        assert engine("add 1")
        assert env.val == 1
        #
        # Many cache hits 0->1
        for _ in range(1000):
            env.val = 0
            assert engine("add 1")
            assert env.val == 1

        # Initial cache miss 1->2
        env.val = 1
        assert not engine("add 1")
        assert env.val == 2

        # Many cache hits 1->2
        for _ in range(1000):
            env.val = 1
            assert engine("add 1")  # cache hit 1->2
            assert env.val == 2

        # Return to 0->1
        # Cache stil hits
        for _ in range(1000):
            env.val = 0
            assert engine("add 1")
            assert env.val == 1

        engine.metrics.report()

    def test_multi_step(self, setup):
        env, _, engine = setup

        # warm cache 0->2
        env.val = 0
        assert not engine("add 2")
        assert env.val == 2

        # cache hit 0->2
        env.val = 0
        assert engine("add 2")
        assert env.val == 2

    def test_tags(self, setup):
        env, _, engine = setup

        env.val = 0
        assert not engine("add 1", tags=["tag1"])
        assert env.val == 1

        env.val = 0
        assert engine("add 1", tags=["tag1"])
        assert env.val == 1

        # different tag should miss
        env.val = 0
        assert not engine("add 1", tags=["tag2"])
        assert env.val == 1

        env.val = 0
        assert engine("add 1", tags=["tag2"])
        assert env.val == 1

    def test_parameterization(self, setup):
        env, _, engine = setup

        env.val = 0
        assert not engine("add 1", params={"n": 1}, tags=["add"])
        assert env.val == 1

        env.val = 0
        assert engine("add 2", params={"n": 2}, tags=["add"])
        assert env.val == 2  # cache hit, but dynamic param was used


def test_metrics_report_has_muscle_mems_shape(capsys):
    engine = mm.Engine()
    env = {"v": 0}

    @engine.function(pre_check=mm.Check(lambda n: env["v"], lambda a, b: a == b))
    def bump(n: int) -> None:
        env["v"] += n

    engine.set_agent(lambda task: bump(2)).finalize()
    engine.metrics.enable()
    engine("go")
    env["v"] = 0
    assert engine("go")
    engine.report_metrics()
    report = capsys.readouterr().out
    assert '"query"' in report and '"precheck"' in report
    data = engine.metrics.metrics
    assert data["query"]["count"] == 2 and data["filter"]["capture"]["count"] == 1
    engine.reset_metrics()
    assert engine.metrics.metrics["query"]["count"] == 0


# -- part 2: muscle-mem's README examples, import changed ------------------------------------------------------


def test_readme_engine_function_and_params():
    from engrain.muscle_mem import Engine

    engine = Engine()
    typed: list[str] = []

    @engine.function()
    def type(text: str):
        typed.append(text)

    def your_agent(task: str):
        type(task.rsplit(": ", 1)[1])

    engine.set_agent(your_agent).finalize()

    # first run stores invocation of type("John"), with dynamic arg `text` mapped to top level param `name`
    engine("fill the form with name: John", params={"name": "John"})

    # second run is a cache hit, using Jane instead of John
    assert engine("fill the form with name: Jane", params={"name": "Jane"})
    assert typed == ["John", "Jane"]


def test_readme_methods_with_set_context():
    from engrain.muscle_mem import Engine

    engine = Engine()
    said: list[str] = []

    class SomeClient:
        @engine.method()
        def hello(self, name: str):
            said.append(f"hello {name}!")

    client = SomeClient()

    client.hello("world")  # outside the engine: runs as is

    def your_agent(task: str):
        client.hello("world")

    engine = engine.set_agent(your_agent).set_context(client).finalize()
    assert not engine("say hello world!")
    assert engine("say hello world!")
    assert said == ["hello world!"] * 3


def test_readme_putting_it_all_together():
    from dataclasses import dataclass

    from engrain.muscle_mem import Check, Engine

    engine = Engine()

    # our "environment" features, stored in DB
    @dataclass
    class T:
        name: str
        time: float

    # our capture implementation, taking params and returning T
    def capture(name: str) -> T:
        now = time.time()
        return T(name=name, time=now)

    # our compare implementation, taking current and candidate T
    def compare(current: T, candidate: T) -> bool:
        # cache is valid if happened within the last 1 second
        diff = current.time - candidate.time
        passed = diff <= 1
        return passed

    # decorate our tool with a precheck
    @engine.function(pre_check=Check(capture, compare))
    def hello(name: str):
        time.sleep(0.1)
        print(f"hello {name}")

    # pretend this is your agent
    def agent(name: str):
        for i in range(9):
            hello(name + " + " + str(i))

    engine.set_agent(agent).finalize()

    with contextlib.redirect_stdout(io.StringIO()):
        # Run once
        cache_hit = engine("erik")
        assert not cache_hit

        # Run again
        cache_hit = engine("erik")
        assert cache_hit

        # Break cache with a sleep, then run again
        time.sleep(3)
        cache_hit = engine("erik")
        assert not cache_hit


def test_agent_results_that_are_not_json_are_dropped_like_muscle_mem_does():
    engine = mm.Engine()

    @engine.function()
    def act(x: int) -> int:
        return x

    class Response:  # what an SDK returns: muscle-mem never looks at it
        pass

    engine.set_agent(lambda task: act(1) and Response()).finalize()
    out = engine("go")
    assert not out and out.status == "ok" and out.output is None
    assert engine("go")


def test_finalize_errors_are_value_errors():
    engine = mm.Engine()
    with pytest.raises(ValueError, match="at least one tool"):
        engine.finalize()

    @engine.function()
    def f(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="agent"):
        engine.finalize()
    engine.set_agent(lambda t: f(1)).finalize()
    with pytest.raises(ValueError, match="finalized"):
        engine.set_agent(lambda t: None)
    assert issubclass(CacheError, ValueError) and issubclass(CacheError, eg.EngrainError)


# -- part 3: the differences, as options of engrain.Engine ----------------------------------------------------


def _counter_engine(**kw) -> tuple[Engine, dict]:
    engine = Engine(**kw)
    env = {"v": 0, "agent": 0}

    @engine.function(pre_check=Check(lambda n: env["v"], lambda a, b: a == b))
    def bump(n: int) -> int:
        env["v"] += n
        return env["v"]

    def agent(task, *args, **kwargs):
        env["agent"] += 1
        env["last"] = (task, args, kwargs)
        bump(2)

    engine.set_agent(agent).finalize()
    return engine, env


def test_extra_arguments_go_to_the_agent_and_a_list_task_works():
    engine, env = _counter_engine(url=":memory:")
    messages = [{"role": "user", "content": "bump by two"}]
    out = engine(messages, "extra", screenshot=b"\x89PNG", tags=["t"])
    assert not out and env["last"] == (messages, ("extra",), {"screenshot": b"\x89PNG"})
    env["v"] = 0
    assert engine([{"role": "user", "content": "bump by two"}], "other", tags=["t"])
    assert env["agent"] == 1
    assert not engine([{"role": "user", "content": "bump by three"}], tags=["t"])  # another task text: another key
    engine.close()


def test_memory_url_starts_empty_and_namespaces_stay_apart(tmp_path):
    one, env1 = _counter_engine(url=":memory:")
    two, env2 = _counter_engine(url=":memory:")
    assert not one("task") and not two("task")  # separate stores: each misses once
    env1["v"] = 0
    assert one("task")
    path = one.journal.path
    one.close()
    assert not path.exists()  # the private store is gone with its engine

    shared = f"sqlite:///{tmp_path / 'shared.db'}"
    a, env_a = _counter_engine(url=shared, namespace="a")
    b, env_b = _counter_engine(url=shared, namespace="b")
    plain, env_p = _counter_engine(url=shared)
    assert not a("task") and not b("task") and not plain("task")
    env_a["v"] = env_b["v"] = env_p["v"] = 0
    assert a("task") and b("task") and plain("task")
    a2, env_a2 = _counter_engine(url=shared, namespace="a")  # persistence stays the default
    assert a2("task") and env_a2["agent"] == 0
    with pytest.raises(CacheError, match="either a journal or a url"):
        Engine(eg.open(shared), url=shared)


def test_runs_without_tool_calls_are_cached_with_store_empty():
    engine = Engine(url=":memory:", store_empty=True)
    calls = []

    @engine.function()
    def noop() -> None:
        pass

    engine.set_agent(lambda task: calls.append(task) or f"answer to {task}").finalize()
    first = engine("what is 2+2")
    assert not first and first.stored and first.output == "answer to what is 2+2"
    second = engine("what is 2+2")
    assert second and second.output == "answer to what is 2+2" and calls == ["what is 2+2"]
    default = Engine(url=":memory:")
    default.function(name="noop")(lambda: None)
    default.set_agent(lambda task: "x").finalize()
    assert not default("q").stored and not default("q")  # engrain's default: not stored


@dataclasses.dataclass
class Stamp:
    name: str
    time: float


def _stamped(**kw) -> tuple[Engine, dict]:
    engine = Engine(url=":memory:", **kw)
    clock = {"now": 1000.0}

    @engine.function(pre_check=Check(lambda name: Stamp(name, clock["now"]), lambda cur, old: cur.time - old.time <= 1))
    def hello(name: str) -> str:
        return f"hello {name}"

    engine.set_agent(lambda task: hello(task)).finalize()
    return engine, clock


def test_refresh_snapshots_slides_time_windows():
    sliding, clock = _stamped(refresh_snapshots=True)
    assert not sliding("erik")
    for _ in range(5):
        clock["now"] += 0.9  # each hit is within 1 s of the previous one, 4.5 s after the recording
        assert sliding("erik")
    clock["now"] += 2
    assert not sliding("erik")

    expiring, clock = _stamped()
    assert not expiring("erik")
    clock["now"] += 0.9
    assert expiring("erik")
    clock["now"] += 0.9
    assert not expiring("erik")  # engrain's default: the window counts from the recording


def test_numpy_bytes_and_codec_snapshots():
    engine = Engine(url=":memory:")
    screen = {"img": np.zeros((4, 4, 3), dtype=np.uint8), "raw": b"\x00\x01"}

    @engine.function(pre_check=Check(lambda x, y: screen["img"][y : y + 2, x : x + 2], lambda a, b: bool(np.array_equal(a, b))))
    def click(x: int, y: int) -> str:
        return f"clicked {x},{y}"

    @engine.function(pre_check=Check(lambda: {"raw": screen["raw"], "shape": (4, 4)}, lambda a, b: a == b))
    def read() -> str:
        return "read"

    engine.set_agent(lambda task: [click(1, 1), read()]).finalize()
    assert not engine("click the button")
    assert engine("click the button")
    screen["img"] = screen["img"].copy()
    screen["img"][1, 1] = 255
    assert not engine("click the button").hit  # the region changed: the stored array no longer matches

    class Tensor:
        def __init__(self, values: list[float]):
            self.values = values

    Check.register_codec(Tensor, lambda t: t.values, Tensor, name="test.Tensor")
    emb = Engine(url=":memory:")

    @emb.function(pre_check=Check(lambda x: Tensor([float(x), 1.0]), lambda a, b: a.values == b.values))
    def tap(x: int) -> int:
        return x

    emb.set_agent(lambda task: tap(3)).finalize()
    assert not emb("tap") and emb("tap")

    class Opaque:
        pass

    bad = Engine(url=":memory:")

    @bad.function(pre_check=Check(lambda: Opaque(), lambda a, b: True))
    def poke() -> None:
        pass

    bad.set_agent(lambda task: poke()).finalize()
    with pytest.raises(CacheError, match=r"Opaque at snapshot cannot be stored.*Check.register_codec\(Opaque"):
        bad("poke")


def test_tools_with_keywords_and_positional_only_replay_the_same_call():
    engine = Engine(url=":memory:")
    calls = []

    @engine.function(pre_check=Check(lambda first, **opts: [first, opts], lambda a, b: a == b))
    def send(first: str, **opts: int) -> str:
        calls.append((first, opts))
        return "sent"

    @engine.function()
    def pos_only(a: int, /, b: int) -> int:
        calls.append((a, b))
        return a + b

    engine.set_agent(lambda task: [send("a", retries=2), pos_only(1, b=2)]).finalize()
    assert not engine("send it")
    assert engine("send it")
    assert calls[2:] == calls[:2] == [("a", {"retries": 2}), (1, 2)]
