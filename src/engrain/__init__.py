"""engrain: memory for AI agents.

Durable runs, compiled routines, a behavior cache and skill memory on one event
journal. The public API is what ``__all__`` lists; modules starting with ``_``
are internal.

    import engrain as eg

    @eg.tool
    def fetch(url: str) -> str: ...

    result = eg.run(agent, "summarize the report", inputs={"url": "..."})
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._version import __version__

if TYPE_CHECKING:
    from ._durable.context import (
        RunResult,
        current,
        default_journal,
        idempotency_key,
        new_run_id,
    )
    from ._durable.execution import run, run_async
    from ._durable.human import answer, ask, now
    from ._durable.operate import cancel, fork, gc
    from ._durable.identity import agent_name
    from ._durable.patching import patched
    from ._durable.recovery import Recovered, recover
    from ._durable.sleep import sleep, sleep_until
    from ._durable.tools import ToolRegistry, llm, tool, tools
    from ._durable.udf import udf
    from ._errors import (
        AgentMismatchError,
        ConfigError,
        ConflictError,
        EngrainError,
        JSONTooDeepError,
        LeaseHeldError,
        LeaseLostError,
        NondeterminismError,
        NotDurableError,
        NotJournaledError,
        NotJSONError,
        NotWaitingForInputError,
        RetriesExhaustedError,
        RunFailedError,
        RunFinishedError,
        RunIdError,
        RunNotFoundError,
        ServerUnreachableError,
        StepFailedError,
        StorageError,
        StoreCorruptError,
        StoreNotFoundError,
        StoreUnreachableError,
        StoreURLError,
        StoreVersionError,
        TextNotStorableError,
        UnknownStatusError,
    )
    from ._events import Event, NewEvent, RunInfo
    from ._workers.queues import enqueue, queue, queues
    from ._journal import Journal, default_url
    from ._journal import open_journal as open
    from . import _sandbox as sandbox
    from . import testing
    from ._agent.agent import Agent
    from ._agent.learn import LearnedRoutines
    from ._agent.wrap import wrap
    from ._cache.checks import Check
    from ._cache.engine import Engine, Outcome
    from ._cache.replay import Continuation
    from ._client import Client
    from ._durable.otel import instrument as instrument_otel
    from ._durable.otel import uninstrument as uninstrument_otel
    from ._errors import (
        CacheError,
        EmbeddingError,
        MemoryInputError,
        RemoteError,
        RoutineError,
        RoutineInputError,
        RoutineStepError,
        SandboxError,
        SandboxLimitError,
        SynthesisError,
        TraceError,
        UnknownInputError,
    )
    from ._memory import ConsolidationSummary, Memory, SearchResult, memory
    from ._routines.compiler import compile_trace
    from ._routines.loader import load_routine, validate_routine
    from ._routines.runner import resume_routine, run_routine

# Every public name loads on first use: ``import engrain`` runs before any
# ``engrain._x`` import (the CLI's included), so it must cost almost nothing, and
# heavy parts (numpy/onnxruntime, wasmtime, fastapi, ...) load only when used. The
# TYPE_CHECKING imports above give type checkers the same names. To export a name,
# ADD one line here: public name -> (module, attribute); an attribute of None
# exports the module.
_LAZY: dict[str, tuple[str, str | None]] = {
    "RunResult": ("._durable.context", "RunResult"),
    "current": ("._durable.context", "current"),
    "default_journal": ("._durable.context", "default_journal"),
    "idempotency_key": ("._durable.context", "idempotency_key"),
    "new_run_id": ("._durable.context", "new_run_id"),
    "run": ("._durable.execution", "run"),
    "run_async": ("._durable.execution", "run_async"),
    "answer": ("._durable.human", "answer"),
    "ask": ("._durable.human", "ask"),
    "now": ("._durable.human", "now"),
    "cancel": ("._durable.operate", "cancel"),
    "fork": ("._durable.operate", "fork"),
    "gc": ("._durable.operate", "gc"),
    "agent_name": ("._durable.identity", "agent_name"),
    "patched": ("._durable.patching", "patched"),
    "Recovered": ("._durable.recovery", "Recovered"),
    "recover": ("._durable.recovery", "recover"),
    "sleep": ("._durable.sleep", "sleep"),
    "sleep_until": ("._durable.sleep", "sleep_until"),
    "ToolRegistry": ("._durable.tools", "ToolRegistry"),
    "llm": ("._durable.tools", "llm"),
    "tool": ("._durable.tools", "tool"),
    "tools": ("._durable.tools", "tools"),
    "udf": ("._durable.udf", "udf"),
    "AgentMismatchError": ("._errors", "AgentMismatchError"),
    "ConfigError": ("._errors", "ConfigError"),
    "ConflictError": ("._errors", "ConflictError"),
    "EngrainError": ("._errors", "EngrainError"),
    "JSONTooDeepError": ("._errors", "JSONTooDeepError"),
    "LeaseHeldError": ("._errors", "LeaseHeldError"),
    "LeaseLostError": ("._errors", "LeaseLostError"),
    "NondeterminismError": ("._errors", "NondeterminismError"),
    "NotDurableError": ("._errors", "NotDurableError"),
    "NotJournaledError": ("._errors", "NotJournaledError"),
    "NotJSONError": ("._errors", "NotJSONError"),
    "NotWaitingForInputError": ("._errors", "NotWaitingForInputError"),
    "RetriesExhaustedError": ("._errors", "RetriesExhaustedError"),
    "RunFailedError": ("._errors", "RunFailedError"),
    "RunFinishedError": ("._errors", "RunFinishedError"),
    "RunIdError": ("._errors", "RunIdError"),
    "RunNotFoundError": ("._errors", "RunNotFoundError"),
    "StepFailedError": ("._errors", "StepFailedError"),
    "StorageError": ("._errors", "StorageError"),
    "StoreCorruptError": ("._errors", "StoreCorruptError"),
    "StoreNotFoundError": ("._errors", "StoreNotFoundError"),
    "StoreUnreachableError": ("._errors", "StoreUnreachableError"),
    "StoreURLError": ("._errors", "StoreURLError"),
    "StoreVersionError": ("._errors", "StoreVersionError"),
    "TextNotStorableError": ("._errors", "TextNotStorableError"),
    "UnknownStatusError": ("._errors", "UnknownStatusError"),
    "Event": ("._events", "Event"),
    "NewEvent": ("._events", "NewEvent"),
    "RunInfo": ("._events", "RunInfo"),
    "enqueue": ("._workers.queues", "enqueue"),
    "queue": ("._workers.queues", "queue"),
    "queues": ("._workers.queues", "queues"),
    "Journal": ("._journal", "Journal"),
    "default_url": ("._journal", "default_url"),
    "open": ("._journal", "open_journal"),
    "compile_trace": ("._routines.compiler", "compile_trace"),
    "run_routine": ("._routines.runner", "run_routine"),
    "resume_routine": ("._routines.runner", "resume_routine"),
    "validate_routine": ("._routines.loader", "validate_routine"),
    "load_routine": ("._routines.loader", "load_routine"),
    "RoutineError": ("._errors", "RoutineError"),
    "RoutineInputError": ("._errors", "RoutineInputError"),
    "RoutineStepError": ("._errors", "RoutineStepError"),
    "UnknownInputError": ("._errors", "UnknownInputError"),
    "TraceError": ("._errors", "TraceError"),
    "sandbox": ("._sandbox", None),
    "testing": (".testing", None),
    "Engine": ("._cache.engine", "Engine"),
    "Check": ("._cache.checks", "Check"),
    "Outcome": ("._cache.engine", "Outcome"),
    "Continuation": ("._cache.replay", "Continuation"),
    "CacheError": ("._errors", "CacheError"),
    "SandboxError": ("._errors", "SandboxError"),
    "SandboxLimitError": ("._errors", "SandboxLimitError"),
    "Memory": ("._memory", "Memory"),
    "memory": ("._memory", "memory"),
    "SearchResult": ("._memory", "SearchResult"),
    "ConsolidationSummary": ("._memory", "ConsolidationSummary"),
    "EmbeddingError": ("._errors", "EmbeddingError"),
    "MemoryInputError": ("._errors", "MemoryInputError"),
    "SynthesisError": ("._errors", "SynthesisError"),
    "Agent": ("._agent.agent", "Agent"),
    "LearnedRoutines": ("._agent.learn", "LearnedRoutines"),
    "wrap": ("._agent.wrap", "wrap"),
    "Client": ("._client", "Client"),
    "instrument_otel": ("._durable.otel", "instrument"),
    "uninstrument_otel": ("._durable.otel", "uninstrument"),
    "RemoteError": ("._errors", "RemoteError"),
    "ServerUnreachableError": ("._errors", "ServerUnreachableError"),
}


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'engrain' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(target[0], __name__)
    value = module if target[1] is None else getattr(module, target[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "Agent",
    "LearnedRoutines",
    "wrap",
    "instrument_otel",
    "uninstrument_otel",
    "compile_trace",
    "run_routine",
    "resume_routine",
    "validate_routine",
    "load_routine",
    "RoutineError",
    "RoutineInputError",
    "RoutineStepError",
    "UnknownInputError",
    "Client",
    "RemoteError",
    "ServerUnreachableError",
    "ConsolidationSummary",
    "EmbeddingError",
    "Memory",
    "MemoryInputError",
    "SearchResult",
    "SynthesisError",
    "TraceError",
    "memory",
    "CacheError",
    "Check",
    "Continuation",
    "Engine",
    "Outcome",
    "SandboxError",
    "SandboxLimitError",
    "sandbox",
    "testing",
    "AgentMismatchError",
    "ConfigError",
    "ConflictError",
    "EngrainError",
    "Event",
    "Journal",
    "LeaseHeldError",
    "LeaseLostError",
    "NewEvent",
    "NondeterminismError",
    "JSONTooDeepError",
    "NotDurableError",
    "NotJournaledError",
    "NotJSONError",
    "NotWaitingForInputError",
    "RetriesExhaustedError",
    "RunFailedError",
    "RunInfo",
    "RunFinishedError",
    "RunIdError",
    "RunNotFoundError",
    "RunResult",
    "Recovered",
    "StepFailedError",
    "StorageError",
    "StoreCorruptError",
    "StoreNotFoundError",
    "StoreUnreachableError",
    "StoreURLError",
    "StoreVersionError",
    "TextNotStorableError",
    "ToolRegistry",
    "UnknownStatusError",
    "__version__",
    "agent_name",
    "answer",
    "ask",
    "cancel",
    "fork",
    "gc",
    "current",
    "default_journal",
    "default_url",
    "enqueue",
    "idempotency_key",
    "llm",
    "new_run_id",
    "now",
    "open",
    "patched",
    "queue",
    "queues",
    "recover",
    "run",
    "run_async",
    "sleep",
    "sleep_until",
    "tool",
    "tools",
    "udf",
]
