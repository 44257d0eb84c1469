"""OpenTelemetry export of durable runs (the ``engrain[otel]`` extra).

:func:`instrument` registers an observer (:mod:`.observe`) that makes one span
per run (``invoke_agent``), parented under the span current where
:func:`engrain.run` was called, so a run joins its caller's trace (or starts
its own), and one child span per step: ``execute_tool NAME`` for tools and
UDFs, ``chat MODEL`` for LLM steps, with the GenAI semantic-convention
attributes (``gen_ai.operation.name``, ``gen_ai.tool.name``,
``gen_ai.tool.call.id``, ``gen_ai.request.model``, ``gen_ai.response.model``,
``gen_ai.usage.input_tokens``/``output_tokens`` where the call's arguments or
result carry them). A step's span has its real start and end times (taken
from the journal's view of the step); replayed steps get a zero-length span
marked ``engrain.step.replayed``.
"""

from __future__ import annotations

import threading
from typing import Any

from .._errors import ConfigError
from . import observe

_NS = 1_000_000_000


def _usage(result: Any) -> dict[str, Any]:
    """Model and token counts from an LLM step's result, in the shapes the OpenAI and Anthropic SDKs use."""
    out: dict[str, Any] = {}
    if not isinstance(result, dict):
        return out
    if isinstance(result.get("model"), str):
        out["gen_ai.response.model"] = result["model"]
    usage = result.get("usage")
    if isinstance(usage, dict):
        for src, dst in (("prompt_tokens", "gen_ai.usage.input_tokens"), ("input_tokens", "gen_ai.usage.input_tokens"),
                         ("completion_tokens", "gen_ai.usage.output_tokens"),
                         ("output_tokens", "gen_ai.usage.output_tokens")):
            if isinstance(usage.get(src), int) and not isinstance(usage.get(src), bool):
                out[dst] = usage[src]
    return out


class OtelObserver:
    """Turns runs and steps into spans on ``tracer``."""

    def __init__(self, tracer: Any):
        from opentelemetry import context, trace

        self._trace = trace
        self._context = context
        self.tracer = tracer
        self._runs: dict[int, Any] = {}  # id(RunContext) -> run span
        self._lock = threading.Lock()

    def run_started(self, ctx: Any, task: str) -> None:
        span = self.tracer.start_span(
            "invoke_agent",
            attributes={"gen_ai.operation.name": "invoke_agent", "engrain.run_id": ctx.run_id, "engrain.task": task[:1000]},
        )  # parent: the caller's current span, if any
        with self._lock:
            self._runs[id(ctx)] = span

    def step_ended(self, ctx: Any, step: observe.StepView) -> None:
        with self._lock:
            run_span = self._runs.get(id(ctx))
        parent = self._trace.set_span_in_context(run_span) if run_span is not None else None
        attrs: dict[str, Any] = {
            "engrain.run_id": ctx.run_id, "engrain.step": step.call_id, "engrain.step.type": step.type,
            "engrain.step.attempt": step.attempt, "engrain.step.replayed": step.replayed,
        }
        if step.type == "llm":
            model = step.args.get("model") if isinstance(step.args.get("model"), str) else None
            attrs["gen_ai.operation.name"] = "chat"
            if model:
                attrs["gen_ai.request.model"] = model
            attrs.update(_usage(step.result))
            name = f"chat {model or step.name}"
        else:
            attrs.update({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": step.name,
                          "gen_ai.tool.call.id": step.key})
            name = f"execute_tool {step.name}"
        span = self.tracer.start_span(name, context=parent, start_time=int(step.started * _NS), attributes=attrs)
        if step.error_type:
            span.set_attribute("error.type", step.error_type)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, step.message or ""))
        span.end(end_time=int(max(step.ended, step.started) * _NS))

    def run_ended(self, ctx: Any, status: str, error: str | None) -> None:
        with self._lock:
            span = self._runs.pop(id(ctx), None)
        if span is None:
            return
        span.set_attribute("engrain.status", status)
        if status == "failed":
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, error or ""))
        span.end()


def instrument(tracer_provider: Any = None) -> OtelObserver:
    """Export every durable run of this process as OpenTelemetry spans; returns the observer (see :func:`uninstrument`).

    ``tracer_provider`` defaults to the global one. Needs ``pip install 'engrain[otel]'``.
    """
    try:
        from opentelemetry import trace
    except ImportError as e:
        raise ConfigError("OpenTelemetry export needs the otel extra: pip install 'engrain[otel]'") from e
    provider = tracer_provider or trace.get_tracer_provider()
    from .._version import __version__

    observer = OtelObserver(provider.get_tracer("engrain", __version__))
    observe.add(observer)
    return observer


def uninstrument(observer: OtelObserver) -> None:
    """Stop exporting through ``observer``."""
    observe.remove(observer)


def instrument_from_env() -> tuple[OtelObserver, Any]:
    """Export this process's runs the way OpenTelemetry's environment says (``engrain worker --otel``).

    A global SDK ``TracerProvider`` already set (e.g. under ``opentelemetry-instrument``)
    is used as is. Otherwise one is made from ``OTEL_TRACES_EXPORTER``: ``otlp``
    (the default; needs ``opentelemetry-exporter-otlp``, configured by the usual
    ``OTEL_EXPORTER_OTLP_*`` variables) or ``console`` (one JSON span per line on
    stderr). Returns the observer and the provider to flush at exit (``None`` when
    it was not ours).
    """
    import os
    import sys

    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
    except ImportError as e:
        raise ConfigError("--otel needs the otel extra: pip install 'engrain[otel]'") from e
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return instrument(current), None
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")[0].strip().lower() or "otlp"
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "engrain-worker")})
    provider = TracerProvider(resource=resource)
    if kind == "console":
        exporter = ConsoleSpanExporter(out=sys.stderr, formatter=lambda span: span.to_json(indent=None) + "\n")
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif kind == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            try:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # type: ignore[no-redef]
            except ImportError as e:
                raise ConfigError(
                    "OTEL_TRACES_EXPORTER=otlp needs pip install opentelemetry-exporter-otlp"
                    " (or set OTEL_TRACES_EXPORTER=console)"
                ) from e
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        raise ConfigError(f"OTEL_TRACES_EXPORTER must be otlp or console for engrain, got {kind!r}")
    return instrument(provider), provider
