"""engrain under LangGraph: the checkpointer on both backends, LangGraph's own conformance suite, crash/resume."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Annotated, TypedDict

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage  # noqa: E402
from langgraph.checkpoint.conformance import checkpointer_test, validate  # noqa: E402
from langgraph.graph import START, StateGraph  # noqa: E402
from langgraph.graph.message import add_messages  # noqa: E402

import engrain as eg  # noqa: E402
from engrain.integrations.langgraph import EngrainCheckpointer, thread_run_id  # noqa: E402

HERE = pathlib.Path(__file__).parent
ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")


def test_langgraph_conformance_suite(store_url):
    """LangGraph's checkpointer conformance suite (langgraph-checkpoint-conformance), every capability."""

    @checkpointer_test(name="EngrainCheckpointer")
    async def saver():
        yield EngrainCheckpointer(store_url)

    report = asyncio.run(validate(saver))
    counts = {cap: (r.tests_passed, r.tests_failed) for cap, r in report.results.items()}
    assert report.passed_all_base(), counts
    assert report.passed_all() and report.conformance_level() == "FULL", counts
    # Every capability, base and extended, is implemented and ran its tests.
    assert set(counts) >= {"put", "put_writes", "get_tuple", "list", "delete_thread", "copy_thread", "prune",
                           "delete_for_runs"}
    assert sum(p for p, _ in counts.values()) >= 80 and sum(f for _, f in counts.values()) == 0


class Counter(TypedDict):
    log: Annotated[list[AnyMessage], add_messages]
    n: int


def _counting_graph(saver):
    def bump(state: Counter) -> dict:
        return {"n": state.get("n", 0) + 1, "log": [AIMessage(f"n={state.get('n', 0) + 1}")]}

    b = StateGraph(Counter)
    b.add_node("bump", bump)
    b.add_edge(START, "bump")
    return b.compile(checkpointer=saver)


def test_thread_state_survives_a_new_checkpointer_and_shows_as_a_run(store_url):
    graph = _counting_graph(EngrainCheckpointer(store_url))
    cfg = {"configurable": {"thread_id": "t1"}}
    graph.invoke({"log": [HumanMessage("go")], "n": 0}, cfg)
    graph.invoke({"log": [HumanMessage("again")]}, cfg)
    # A second process (here: a second checkpointer on the same store) sees the same thread.
    again = _counting_graph(EngrainCheckpointer(store_url))
    state = again.get_state(cfg)
    assert state.values["n"] == 2 and [m.content for m in state.values["log"]] == ["go", "n=1", "again", "n=2"]
    history = list(again.get_state_history(cfg))
    assert len(history) >= 4 and history[0].values["n"] == 2
    # The thread is an engrain run, tagged, with one log entry per checkpoint or write.
    j = eg.open(store_url)
    info = j.get_run(thread_run_id("t1"))
    assert info is not None and "langgraph" in info.tags and info.task == "LangGraph thread t1"
    assert [r.run_id for r in j.runs(tag="langgraph")] == ["langgraph:t1"]
    kinds = {e.kind for e in j.read("langgraph:t1")}
    assert kinds == {"run.started", "log.entry"}
    started = j.read("langgraph:t1")[0]
    assert started.data["agent"] == "langgraph"
    j.close()


def test_async_graph_uses_the_async_methods(store_url):
    graph = _counting_graph(EngrainCheckpointer(store_url))
    cfg = {"configurable": {"thread_id": "a1"}}

    async def go():
        await graph.ainvoke({"log": [HumanMessage("x")], "n": 5}, cfg)
        return await graph.aget_state(cfg)

    state = asyncio.run(go())
    assert state.values["n"] == 6


def test_killed_graph_resumes_from_the_engrain_checkpoint_without_rerunning_the_tool(store_url, tmp_path):
    """SIGKILL during the model turn after the tool node: a new process resumes; the tool ran once."""
    effects = tmp_path / "effects.txt"
    agent = [sys.executable, str(HERE / "lg_agent.py"), store_url, str(effects)]
    crashed = subprocess.run([*agent, "crash"], capture_output=True, text=True, timeout=120)
    assert crashed.returncode == -9, crashed.stderr
    assert effects.read_text().splitlines() == ["model turn 1", "charge 42", "model turn 2"]
    resumed = subprocess.run([*agent, "resume"], capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "Charged 42 and done."
    lines = effects.read_text().splitlines()
    # The tool's effect happened once; only the killed model turn ran again.
    assert lines.count("charge 42") == 1
    assert lines == ["model turn 1", "charge 42", "model turn 2", "model turn 2"]
    # engrain show prints the thread as a readable timeline of checkpoints.
    show = subprocess.run([ENGRAIN, "show", "langgraph:order-42", "--url", store_url],
                          capture_output=True, text=True, timeout=60)
    assert show.returncode == 0, show.stderr
    assert "checkpoint" in show.stdout and "writes" in show.stdout
    listed = subprocess.run([ENGRAIN, "runs", "--tag", "langgraph", "--json",
                             "--url", store_url], capture_output=True, text=True, timeout=60)
    assert [r["run_id"] for r in json.loads(listed.stdout)] == ["langgraph:order-42"]


def test_the_example_runs_crashes_and_resumes(tmp_path):
    url = f"sqlite:///{tmp_path / 'ex.db'}"
    example = [sys.executable, str(HERE.parent / "examples/langgraph_agent/agent.py"), "--url", url]
    crashed = subprocess.run([*example, "--crash"], capture_output=True, text=True, timeout=120)
    assert crashed.returncode == -9 and "refunding order 42" in crashed.stdout, crashed.stderr
    resumed = subprocess.run([*example, "--resume"], capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert "refunding" not in resumed.stdout and "Done: refunded 19.99 on order 42." in resumed.stdout
