"""LLM agents created over the API (``engrain.Agent``), their runs and chat sessions.

Not to be confused with :mod:`.agents`, the *registered Python agents* an
operator names with ``--agents``. An LLM agent is data: a name, a model, its
instructions and the names of tools. Its tools are resolved from this server's
configured tools only (``--tools`` Python registry, ``--tools-dir`` WASM
folder): a client picks tools by name and never sends code, nor a model
``base_url`` (the server's environment decides where models are reached).

A definition is stored in the journal as a finished run ``agentdef:<name>``
tagged ``llm-agent-definition``, so every server on the same store knows it
and it survives restarts (a run an HTTP client created at that id is refused,
never read as a definition). Defining a name again with the same definition is a
no-op; with a different one it is a 409.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import Field

from .. import _events as ev
from .._errors import ConfigError, ConflictError
from .._events import NewEvent
from .state import ApiError, Body, state_of
from .streams import EventStream

router = APIRouter(tags=["llm-agents"])

DEF_TAG = "llm-agent-definition"
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$"
MAX_WORKERS = 8
DEFAULT_WAIT, MAX_WAIT = 5.0, 60.0
PACE_WAIT = 0.05  # seconds the agent's thread waits for one SSE event to be written (see chat)


class AgentDefinition(Body):
    """``POST /api/agents``: what an LLM agent is."""

    name: str = Field(pattern=NAME_PATTERN)
    model: str = Field(max_length=200, pattern=r"^(openai|anthropic|ollama):\S", description="openai:<model>, anthropic:<model> or ollama:<model>")
    instructions: str = Field("", max_length=20_000)
    tools: list[str] = Field(default_factory=list, max_length=64)
    memory: str | None = Field(None, min_length=1, max_length=100)
    cache: bool = False
    answers_ttl: float | None = Field(None, gt=0, le=366 * 86400,
                                      description="Seconds a cached answer given without tool calls stays valid "
                                                  "(default: such answers are not cached).")
    max_turns: int = Field(10, ge=1, le=100)
    learn: bool | Annotated[str, Field(min_length=1, max_length=100)] = Field(
        False, description="Learn routines from ok runs and offer them as tools: true, or a skill name.")


class ChatRequest(Body):
    session: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,100}$")
    message: str = Field(min_length=1, max_length=100_000)


class TaskRequest(Body):
    task: str = Field(max_length=100_000, pattern=r"\S")
    run_id: str | None = Field(None, min_length=1, max_length=200)
    wait: float = Field(DEFAULT_WAIT, ge=0, le=MAX_WAIT)


def def_run_id(name: str) -> str:
    return f"agentdef:{name}"


class LLMAgents:
    """The LLM agents of one server: definitions in the journal, ``engrain.Agent`` objects in memory."""

    def __init__(self, state: Any, tools: Any):
        self.state = state
        self.tools = tools  # a ToolRegistry of --tools plus --tools-dir
        self._agents: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="engrain-llm-agent")

    def _build(self, d: dict[str, Any]) -> Any:
        from .._agent.agent import Agent

        missing = [t for t in d.get("tools", []) if t not in self.tools]
        if missing:
            known = ", ".join(self.tools.names()) or "none"
            raise ApiError(422, "UnknownToolError",
                           f"agent {d['name']!r}: no tool named {', '.join(map(repr, missing))} on this server "
                           f"(configured with --tools / --tools-dir: {known})")
        # The server's own memory (its --embedder and --vector-search, one index mirror in the process), not one
        # the agent would open on the same store with the environment's settings.
        agent = Agent(d["name"], d["model"], d.get("instructions", ""), d.get("tools", []), memory=d.get("memory"),
                      cache=d.get("cache", False), answers_ttl=d.get("answers_ttl"), max_turns=d.get("max_turns", 10),
                      registry=self.tools, journal=self.state.journal, learn=d.get("learn", False),
                      memory_store=self.state.memory() if d.get("memory") else None)
        agent._api = True  # its instructions are a client's: it never continues an in-process agent's runs
        return agent

    def create(self, d: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Define an agent; returns (its description, whether it is new)."""
        agent = self._build(d)
        j = self.state.journal
        data = {"task": f"define LLM agent {d['name']}", "inputs": d, "tags": [DEF_TAG]}
        try:
            j.append(def_run_id(d["name"]), [NewEvent(ev.RUN_STARTED, "", data),
                                             NewEvent(ev.RUN_COMPLETED, "", {"output": d})], 0)
            created = True
        except ConflictError:
            if self._definition(d["name"]) != d:
                raise ApiError(409, "AgentExistsError",
                               f"an LLM agent named {d['name']!r} exists with another definition") from None
            created = False
        with self._lock:
            self._agents.setdefault(d["name"], agent)
        return describe(d), created

    def _definition(self, name: str) -> dict[str, Any] | None:
        from .._durable.identity import CLIENT_RUN, is_client_run

        events = self.state.journal.read(def_run_id(name), -1)[:1]
        if not events:
            return None
        if is_client_run(events[0].data):
            # A client may create a run of any id: a forged definition would skip every check of POST /api/agents.
            raise ApiError(409, "AgentMismatchError", f"run {def_run_id(name)!r} {CLIENT_RUN}; it is no LLM agent's"
                                                      " definition: choose another name")
        return events[0].data.get("inputs")

    def get(self, name: str) -> Any:
        with self._lock:
            agent = self._agents.get(name)
        if agent is not None:
            return agent
        d = self._definition(name)
        if d is None:
            raise ApiError(404, "AgentNotFoundError", f"no LLM agent named {name!r} (create it with POST /api/agents)")
        agent = self._build(d)
        with self._lock:
            return self._agents.setdefault(name, agent)

    def all(self) -> list[dict[str, Any]]:
        out = []
        for info in self.state.journal.runs(tag=DEF_TAG, limit=1000):
            if ev.CLIENT_TAG in info.tags:
                continue
            d = self._definition(info.run_id.split(":", 1)[1])
            if d is not None:
                out.append(describe(d))
        return sorted(out, key=lambda a: a["name"])

    def run(self, name: str, task: str, run_id: str | None, wait: float) -> dict[str, Any]:
        from .._durable.context import new_run_id

        agent = self.get(name)
        rid = run_id or new_run_id()
        if run_id is not None:
            first = self.state.journal.read(rid, -1)[:1]
            tags = first[0].data.get("tags") if first else None
            if first and (first[0].data.get("task") != task or not isinstance(tags, list)
                          or f"llm-agent:{name}" not in tags):
                raise ApiError(409, "RunMismatchError", f"run {rid!r} exists and is not a run of agent {name!r} "
                               "on this task; leave run_id out to start a new run")
        fut: Future[Any] = self._pool.submit(agent.run, task, run_id=rid)
        try:
            return fut.result(timeout=wait).to_dict()
        except FutureTimeout:
            return {"run_id": rid, "status": "running", "output": None, "error": None, "prompt": None,
                    "replayed": 0, "executed": 0}

    def shutdown(self) -> None:
        """Stop taking runs; an app started again (its lifespan reopens the journal) gets a new pool
        and builds its agents again on the new journal, never on the closed one."""
        old, self._pool = self._pool, ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="engrain-llm-agent")
        old.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._agents.clear()


def describe(d: dict[str, Any]) -> dict[str, Any]:
    return {"name": d["name"], "kind": "llm", "model": d["model"], "instructions": d.get("instructions", ""),
            "tools": list(d.get("tools", [])), "memory": d.get("memory"), "cache": d.get("cache", False),
            "answers_ttl": d.get("answers_ttl"), "max_turns": d.get("max_turns", 10), "learn": d.get("learn", False),
            "description": (d.get("instructions", "").strip().splitlines() or [""])[0][:200]}


def build_tools(tools: Any, tools_dir: str | None) -> Any:
    """The registry LLM agents pick tools from: the ``--tools`` registry's tools plus ``--tools-dir``'s WASM."""
    from .._durable.tools import ToolRegistry

    reg = ToolRegistry()
    for name in list(tools or ()):
        reg.register(name, tools[name])
    if tools_dir:
        import pathlib

        if not pathlib.Path(tools_dir).is_dir():
            raise ConfigError(f"--tools-dir {tools_dir!r} is not a folder")
        reg.load_dir(tools_dir)
    return reg


def key_warning(model: str) -> str | None:
    """Why this server cannot call ``model`` yet (a missing API key), in words for a person."""
    from .._agent.providers import missing_key

    provider = model.split(":", 1)[0]
    env = missing_key(provider)
    if env is None:
        return None
    return (f"This server has no {env}: agents on {provider} models cannot answer until the server is "
            f"restarted with {env} set in its environment.")


@router.get("/agents/options")
def agent_options(request: Request) -> dict[str, Any]:
    """What an LLM agent created here can use: each provider (and the key it lacks, if any) and each tool."""
    from .._agent.providers import PROVIDERS, missing_key
    from .._agent.toolspec import from_registry

    tools = state_of(request).llm_agents.tools
    listed = []
    for name in tools.names():
        try:
            spec = from_registry(name, tools[name])
            listed.append({"name": name, "kind": "wasm" if spec.wasm else "python", "description": spec.description})
        except ConfigError as e:  # a registered tool an LLM agent cannot take: listed, with why
            listed.append({"name": name, "kind": "unusable", "description": str(e)})
    return {"providers": [{"name": p, "missing_key": missing_key(p),
                           "example": {"openai": "openai:gpt-4.1-mini", "anthropic": "anthropic:claude-sonnet-4-5",
                                       "ollama": "ollama:llama3.2"}[p]} for p in PROVIDERS],
            "tools": listed}


@router.post("/agents", status_code=201, response_model=dict[str, Any])
async def create_agent(body: AgentDefinition, request: Request) -> JSONResponse:
    """Create an LLM agent from a name, a model, instructions and tool names (201; 200-equivalent if identical).

    When the server lacks the model provider's API key the agent is created all the same (the key
    may come with a restart) and the response's ``warning`` says what is missing."""
    import asyncio

    # The journal write runs in the loop's executor (a plain thread hop, half of what a sync
    # route's costs), and the response skips FastAPI's re-encoding of a dict that is JSON already.
    agents = state_of(request).llm_agents
    d = body.model_dump()
    # Fields added after the first release are left out at their defaults, so a definition stored
    # before they existed and the same agent sent again compare equal.
    for field, default in (("answers_ttl", None), ("learn", False)):
        if d[field] == default:
            del d[field]
    out, _ = await asyncio.get_running_loop().run_in_executor(None, agents.create, d)
    warning = key_warning(body.model)
    return JSONResponse({**out, "warning": warning} if warning else out, status_code=201)


@router.post("/agents/{name:segment}/runs")
def run_agent(name: str, body: TaskRequest, request: Request) -> dict[str, Any]:
    """Start a durable run of the LLM agent on ``task``; waits up to ``wait`` seconds for its result."""
    return state_of(request).llm_agents.run(name, body.task, body.run_id, body.wait)


@router.post("/agents/{name:segment}/chat", response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {}}, "description": "Server-sent events"},
                        429: {"description": "Too many open streams (per server or per client); see Retry-After"}})
async def chat(name: str, body: ChatRequest, request: Request) -> StreamingResponse:
    """Send a message in a session: an SSE stream of ``text``, ``tool_call``, ``tool_result``, ..., ``done`` events."""
    import asyncio

    from starlette.concurrency import run_in_threadpool

    state = state_of(request)
    agent = await run_in_threadpool(state.llm_agents.get, name)
    loop = asyncio.get_running_loop()
    q: asyncio.Queue[tuple[dict[str, Any], threading.Event | None] | None] = asyncio.Queue()
    paced = [True]

    def put(e: dict[str, Any] | None) -> None:
        # Straight from the agent's thread onto the event loop: one hop per event, no thread pool.
        # Then the agent's thread waits until the loop has written the event: parsing the model's
        # next chunks meanwhile would hold the GIL the loop needs, and the first token would wait
        # for the whole burst (up to the 5 ms switch interval). A client that stops reading costs
        # one wait: after a timeout the turn runs on unpaced.
        sent = threading.Event() if e is not None and paced[0] else None
        try:
            loop.call_soon_threadsafe(q.put_nowait, None if e is None else (e, sent))
        except RuntimeError:  # the loop is gone (server stopped); the turn still finishes in the journal
            return
        if sent is not None and not sent.wait(PACE_WAIT):
            paced[0] = False

    async def stream(_: Any) -> Any:
        try:
            while (item := await q.get()) is not None:
                e, sent = item
                yield f"event: {e['type']}\ndata: {json.dumps(e)}\n\n"
                if sent is not None:  # resumed: the server has handed the event to the socket
                    sent.set()
        finally:
            paced[0] = False
            while not q.empty():  # the client left: release the agent's thread at once
                item = q.get_nowait()
                if item is not None and item[1] is not None:
                    item[1].set()

    resp = EventStream(request, stream)  # takes a stream slot first: a 429 starts no turn
    agent.start_chat(body.message, session=body.session, on_event=put)
    return resp


@router.get("/agents/{name:segment}/sessions/{session:segment}")
def history(name: str, session: str, request: Request) -> list[dict[str, Any]]:
    """The session's messages in order, each with its original ``ts``."""
    return state_of(request).llm_agents.get(name).history(session)
