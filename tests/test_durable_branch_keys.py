"""A concurrent branch's step keeps its idempotency key across a crash, whatever order branches run in.

Branches (threads, asyncio tasks) begin their steps in another order on every
execution. A step cut off by a crash is called again on resume with the key it
was first given, so an external service that dedupes by key returns that very
call's effect, never another branch's: keys may not follow the order steps begin in.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

import engrain as eg
from tests.test_durable_concurrency import _within

_reg = eg.ToolRegistry()
_seen: list[tuple[str, str | None]] = []
_gate: dict[str, threading.Event] = {}
#: An external service that dedupes by idempotency key: a known key returns the first effect.
_effects: dict[str, str] = {}
_delay: dict[str, float] = {}


@eg.tool(registry=_reg)
def pay(who: str) -> str:
    key = eg.idempotency_key()
    _seen.append((who, key))
    effect = _effects.setdefault(key, f"paid {who}")
    if f"{who}.in" in _gate:
        _gate[f"{who}.in"].set()
    if f"{who}.wait" in _gate:
        _gate[f"{who}.wait"].wait(10)
    if f"{who}.die" in _gate:
        raise SystemExit("killed mid-step")  # journals nothing, as a killed process
    return effect


@eg.tool(registry=_reg)
async def apay(who: str) -> str:
    key = eg.idempotency_key()
    _seen.append((who, key))
    effect = _effects.setdefault(key, f"paid {who}")
    await asyncio.sleep(_delay[who[0]])  # not an argument: the call is the same whatever the timing
    if f"{who}.die" in _gate:
        raise SystemExit("killed mid-step")
    return effect


@pytest.fixture
def journal(tmp_path):
    j = eg.open(f"sqlite:///{tmp_path / 'runs.db'}")
    _seen.clear()
    _gate.clear()
    _effects.clear()
    yield j
    j.close()


def _gates(*names):
    _gate.clear()
    _gate.update({n: threading.Event() for n in names})


def _thread_agent(first: str, second: str):
    """Branches a and b pay in threads; ``second`` begins its step only once ``first`` has begun."""
    def agent(task):
        out: dict = {}

        def branch(who):
            if who == second:
                _gate[f"{first}.in"].wait(10)
            try:
                out[who] = pay(who)
            except SystemExit:
                pass

        ts = [threading.Thread(target=contextvars.copy_context().run, args=(branch, w)) for w in ("a", "b")]
        for t in ts:
            t.start()
        for t in ts:
            t.join(10)
        if "crash" in _gate:
            raise KeyboardInterrupt
        return out

    return agent


def test_a_thread_step_cut_off_by_a_crash_is_retried_with_its_own_key(journal):
    # First execution: a begins, then b; both are cut off mid-call (nothing journaled).
    _gates("crash", "a.in", "b.in", "a.wait", "a.die", "b.die")
    _gate["a.wait"] = _gate["b.in"]
    with pytest.raises(KeyboardInterrupt):
        _within(20, lambda: eg.run(_thread_agent("a", "b"), "t", run_id="pay", journal=journal))
    first = dict(_seen)
    assert set(first) == {"a", "b"} and first["a"] != first["b"]
    # Resume: b begins first now.
    _gates("a.in", "b.in")
    _seen.clear()
    res = _within(20, lambda: eg.run(_thread_agent("b", "a"), "t", run_id="pay", journal=journal))
    assert res.status == "ok", res.error
    assert dict(_seen) == first  # each step's key is the one it was first given
    assert res.output == {"a": "paid a", "b": "paid b"}  # never the other branch's effect


def _gather_agent(delays: dict[str, float], crash: bool):
    def agent(task):
        async def branch(who):
            await asyncio.sleep(_delay[who + "0"])  # when the branch makes its first call
            return [await apay(f"{who}1"), await apay(f"{who}2")]

        async def main():
            return await asyncio.gather(branch("a"), branch("b"))

        _delay.update(delays)
        out = asyncio.run(main())
        if crash:
            raise KeyboardInterrupt
        return out

    return agent


def test_gathered_branches_resumed_in_another_order_keep_their_keys(journal):
    # First execution: a's first step begins, then b's; both are cut off mid-call.
    _gates("a1.die", "b1.die")
    with pytest.raises(SystemExit):
        eg.run(_gather_agent({"a0": 0, "a": 0.05, "b0": 0.01, "b": 0.05}, crash=True), "t", run_id="g",
               journal=journal)
    first = dict(_seen)
    assert set(first) == {"a1", "b1"} and first["a1"] != first["b1"]
    _seen.clear()
    _gates()
    # Resume with b first: each first step is called again with the key it was first given.
    res = _within(20, lambda: eg.run(_gather_agent({"a0": 0.05, "a": 0.01, "b0": 0, "b": 0.01}, crash=False),
                                     "t", run_id="g", journal=journal))
    assert res.status == "ok", res.error
    assert res.output == [["paid a1", "paid a2"], ["paid b1", "paid b2"]]  # each its own effect
    again = dict(_seen)
    assert again["a1"] == first["a1"] and again["b1"] == first["b1"]
    assert len(set(again.values())) == 4


def test_a_buffered_runs_keys_never_repeat_across_step_policies(tmp_path):
    # A buffered (cache) run takes default-policy steps through the durable fast path and steps
    # with a policy through its own begin: both must take keys from one counter, else the third
    # step here was given the second's key.
    from engrain._durable.batched import run_batched

    keys: list[str | None] = []

    @eg.tool(name="plain", registry=eg.ToolRegistry())
    def plain(x: int) -> int:
        keys.append(eg.idempotency_key())
        return x

    @eg.tool(name="retried", registry=eg.ToolRegistry(), retries=2)
    def retried(x: int) -> int:
        keys.append(eg.idempotency_key())
        return x

    def agent(task: str) -> int:
        return plain(1) + retried(2) + plain(3) + retried(4)

    j = eg.open(f"sqlite:///{tmp_path / 'b.db'}")
    res = run_batched(agent, "t", run_id="buf", tags=[], journal=j)
    assert res.status == "ok" and res.output == 10
    assert keys == ["buf:0", "buf:1", "buf:2", "buf:3"]
    j.close()
