"""OpenTelemetry export: one trace per run, one span per step, GenAI attributes; the real SDK's in-memory exporter."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import engrain as eg


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observer = eg.instrument_otel(provider)
    yield exporter, provider
    eg.uninstrument_otel(observer)


def _agent():
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg)
    def search(q: str) -> list:
        return [q, q + "!"]

    @eg.llm(registry=reg)
    def complete(model: str, prompt: str) -> dict:
        # A scripted model: the shape the OpenAI SDK's response.model_dump() has.
        return {"model": model + "-2026", "text": prompt.upper(), "usage": {"prompt_tokens": 12, "completion_tokens": 3}}

    @eg.tool(registry=reg)
    def flaky() -> None:
        raise ValueError("nope")

    def agent(task):
        hits = search(task)
        try:
            flaky()
        except ValueError:
            pass
        return complete("gpt-test", hits[0])["text"]

    return agent


def test_one_trace_per_run_one_span_per_step(journal, spans):
    exporter, provider = spans
    tracer = provider.get_tracer("caller")
    with tracer.start_as_current_span("request") as caller:
        res = eg.run(_agent(), "find", run_id="o1", journal=journal)
    assert res.output == "FIND"
    got = {s.name: s for s in exporter.get_finished_spans()}
    assert set(got) == {"request", "invoke_agent", "execute_tool search", "execute_tool flaky", "chat gpt-test"}
    run = got["invoke_agent"]
    # Parented under the caller's span, in its trace; steps under the run.
    assert run.parent.span_id == caller.get_span_context().span_id
    assert {s.context.trace_id for s in got.values()} == {caller.get_span_context().trace_id}
    for name in ("execute_tool search", "execute_tool flaky", "chat gpt-test"):
        assert got[name].parent.span_id == run.context.span_id
        assert run.start_time <= got[name].start_time <= got[name].end_time <= run.end_time
    tool = got["execute_tool search"].attributes
    assert tool["gen_ai.operation.name"] == "execute_tool" and tool["gen_ai.tool.name"] == "search"
    assert tool["gen_ai.tool.call.id"] == "o1:0" and tool["engrain.step.replayed"] is False
    llm = got["chat gpt-test"].attributes
    assert llm["gen_ai.operation.name"] == "chat" and llm["gen_ai.request.model"] == "gpt-test"
    assert llm["gen_ai.response.model"] == "gpt-test-2026"
    assert llm["gen_ai.usage.input_tokens"] == 12 and llm["gen_ai.usage.output_tokens"] == 3
    failed = got["execute_tool flaky"]
    assert failed.status.status_code == StatusCode.ERROR and failed.attributes["error.type"] == "ValueError"
    assert run.attributes["engrain.run_id"] == "o1" and run.attributes["engrain.status"] == "ok"


def test_replayed_steps_and_a_run_without_caller(journal, spans):
    exporter, _ = spans
    agent = _agent()
    crash = {"on": True}

    def finder(task):
        out = agent(task)
        if crash["on"]:
            raise KeyboardInterrupt  # the process dies after the steps
        return out

    with pytest.raises(KeyboardInterrupt):
        eg.run(finder, "find", run_id="o2", journal=journal)
    exporter.clear()
    crash["on"] = False  # the same agent, restarted
    assert eg.run(finder, "find", run_id="o2", journal=journal)
    spans_ = exporter.get_finished_spans()
    run = [s for s in spans_ if s.name == "invoke_agent"][0]
    assert run.parent is None  # no caller span: the run is its own trace
    steps = [s for s in spans_ if s.name != "invoke_agent"]
    assert len(steps) == 3 and all(s.attributes["engrain.step.replayed"] for s in steps)
    assert all(s.context.trace_id == run.context.trace_id for s in steps)


def test_worker_cli_exports_spans_with_otel(store_url, tmp_path):
    """``engrain worker --otel``: each run one trace (no caller), its steps children of the run span."""
    import importlib.util
    import json
    import os
    import subprocess
    from pathlib import Path

    from tests.servers import engrain_exe

    here = Path(__file__).parent
    env = {**os.environ, "ENGRAIN_TEST_EFFECTS": str(tmp_path / "effects.log"), "OTEL_TRACES_EXPORTER": "console",
           "PYTHONPATH": str(here) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    j = eg.open(store_url)
    try:
        rid = eg.enqueue("steps", "traced", inputs={"steps": 2}, journal=j)
    finally:
        j.close()
    cmd = [engrain_exe(), "worker", "--agents", "worker_agents:AGENTS", "--until-idle", "--otel", "--url", store_url]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["finished"] == {"ok": 1}
    spans = [json.loads(line) for line in out.stderr.splitlines() if line.startswith("{")]
    (run,) = [s for s in spans if s["name"] == "invoke_agent"]
    assert run["attributes"]["engrain.run_id"] == rid and run["parent_id"] is None
    assert run["resource"]["attributes"]["service.name"] == "engrain-worker"
    steps = [s for s in spans if s["name"] == "execute_tool work"]
    assert len(steps) == 2
    for s in steps:
        assert s["parent_id"] == run["context"]["span_id"] and s["context"]["trace_id"] == run["context"]["trace_id"]
        assert s["attributes"]["gen_ai.tool.name"] == "work" and s["attributes"]["gen_ai.operation.name"] == "execute_tool"
    bad = subprocess.run(cmd, env={**env, "OTEL_TRACES_EXPORTER": "zipkin-ish"}, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "OTEL_TRACES_EXPORTER" in bad.stderr
    try:
        has_otlp = importlib.util.find_spec("opentelemetry.exporter.otlp") is not None
    except ModuleNotFoundError:
        has_otlp = False
    if not has_otlp:
        missing = subprocess.run(cmd, env={**env, "OTEL_TRACES_EXPORTER": "otlp"}, capture_output=True, text=True, timeout=60)
        assert missing.returncode == 2 and "opentelemetry-exporter-otlp" in missing.stderr and "Traceback" not in missing.stderr
