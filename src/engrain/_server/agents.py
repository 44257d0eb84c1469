"""Registered Python agents: the server starts and resumes their durable runs.

``engrain serve --agents module:attr`` (or ``create_app(agents=...)``) names a
dict ``name -> agent callable``. ``POST /api/runs`` with ``{"agent": name}``
runs ``engrain.run(agent, task, inputs=...)`` on the server's journal in a
worker thread, and an answer to one of its prompts resumes it there: the agent
starts again from the top and every journaled step returns its recorded result.

A run started here is tagged ``agent`` and ``agent:<name>`` and records the
agent's code fingerprint (see ``engrain._durable.identity``), so a server with
the same name registered and the same code can resume it (another version only
with ``upgrade``). Which code runs is decided only by this server's registry;
the journal merely selects a name from it, so a client that writes events by
hand can run nothing it could not start with ``POST /runs``.

The request waits up to ``wait`` seconds for the run to finish or ask for
input; after that it answers ``status: "running"`` and the thread carries on.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from fastapi import APIRouter, Request

from .._errors import ConfigError
from .._events import CLIENT_TAG, Event
from .state import ApiError, state_of

router = APIRouter(tags=["agents"])
log = logging.getLogger("engrain.server")

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
AGENT_TAG = "agent"
#: Default and largest ``wait`` of a request that starts or resumes an agent run (seconds).
DEFAULT_WAIT, MAX_WAIT = 5.0, 60.0
#: Agent runs executing at once per server; more wait for a free slot (their runs show ``running``).
MAX_WORKERS = 8
#: How long a resume waits for the same run's previous execution to unwind after it asked for input.
_BUSY_GRACE = 1.0


def load_agents(spec: Any) -> dict[str, Callable[..., Any]]:
    """The agent registry from ``None``, a ``"module:attr"`` / ``"file.py:attr"`` string, or a mapping.

    Strings are resolved exactly as ``--tools`` is for ``engrain run``;
    :class:`~engrain.ConfigError` names the option and the bad entry.
    """
    if spec is None:
        return {}
    where = f"--agents {spec!r}" if isinstance(spec, str) else "agents"
    if isinstance(spec, str):
        from .._errors import RoutineInputError
        from .._routines.runner import resolve_tools

        try:
            spec = resolve_tools(spec)
        except RoutineInputError as e:
            why = str(e).removeprefix(f"{e.where}: {e.field}: ").replace("the registry", "the agents")
            raise ConfigError(f"{where}: {why}") from None
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a dict of name -> agent callable, got {type(spec).__name__}")
    agents: dict[str, Callable[..., Any]] = {}
    for name, fn in spec.items():
        if not isinstance(name, str) or not NAME.match(name):
            raise ConfigError(f"{where}: agent name {name!r} must match {NAME.pattern}")
        if not callable(fn):
            raise ConfigError(f"{where}: agent {name!r} is not callable ({type(fn).__name__})")
        agents[name] = fn
    return agents


def agent_of(events: list[Event]) -> str | None:
    """The agent name a run was started with by a server, or None."""
    if not events or events[0].kind != "run.started":
        return None
    tags = events[0].data.get("tags") or []
    if not isinstance(tags, list) or AGENT_TAG not in tags or CLIENT_TAG in tags:
        return None
    for t in tags:
        if isinstance(t, str) and t.startswith(AGENT_TAG + ":"):
            return t[len(AGENT_TAG) + 1:]
    return None


def _pending(run_id: str) -> dict[str, Any]:
    return {"run_id": run_id, "status": "running", "output": None, "error": None, "prompt": None,
            "replayed": 0, "executed": 0}


class AgentRunner:
    """Runs agents in worker threads, at most one execution per run id in this process.

    Leases cannot provide that guarantee here: their owner id is per process, so
    two threads of one server would both hold a run's lease.
    """

    def __init__(self, state: Any, agents: dict[str, Callable[..., Any]], workers: int = MAX_WORKERS,
                 upgrade: bool = False):
        self.state = state
        self.agents = agents
        self.upgrade = upgrade  # resume runs another version of an agent's code started (a deploy)
        self._slots = threading.BoundedSemaphore(workers)
        self._lock = threading.Lock()
        self._active: dict[str, Future[Any]] = {}

    def get(self, name: str) -> Callable[..., Any]:
        """The agent called ``name``; 404 ``AgentNotFoundError`` naming the registered ones."""
        fn = self.agents.get(name)
        if fn is None:
            known = ", ".join(sorted(self.agents)) or "none (start the server with --agents module:attr)"
            raise ApiError(404, "AgentNotFoundError", f"no agent named {name!r} on this server (registered: {known})")
        return fn

    def start(self, name: str, task: str, inputs: dict[str, Any] | None, run_id: str | None, wait: float) -> dict[str, Any]:
        """Start (or continue, for an unfinished ``run_id``) a run of agent ``name``."""
        from .._durable.context import new_run_id
        from .._durable.execution import _start
        from .._durable.identity import fingerprint

        agent = self.get(name)
        if run_id is not None and (not run_id.strip() or run_id != run_id.strip()):
            raise ApiError(400, "BadRunId", "run_id must not be blank or have surrounding spaces")
        run_id = run_id or new_run_id()
        fut = self._reserve(run_id)
        try:
            existing = self.state.journal.read(run_id, -1)[:1]
            if existing and agent_of(existing) != name:
                owner = agent_of(existing)
                started_by = f"agent {owner!r}" if owner else "something other than a server agent"
                raise ApiError(409, "AgentMismatchError", f"run {run_id!r} was started by {started_by}, not agent {name!r}")
            # Create the run before answering, so the returned id is visible at once, and
            # refuse a task or inputs mismatch here rather than in the thread.
            # The registered name is the run's agent name, so recover({name: fn}) resumes it.
            _, done = _start(self.state.journal, run_id, task, inputs, [AGENT_TAG, f"{AGENT_TAG}:{name}"], agent=name,
                             code=fingerprint(agent), upgrade=self.upgrade)
            if done is not None:
                self._release(run_id)
                return done.to_dict()
        except BaseException:
            self._release(run_id)
            raise
        return self._execute(fut, agent, name, task, inputs, run_id, wait)

    def resume(self, name: str, run_id: str, events: list[Event], record: Callable[[], None], wait: float) -> dict[str, Any]:
        """Call ``record`` (which stores the answers), then run agent ``name`` again on ``run_id``."""
        from .._durable.identity import fingerprint, refusal

        agent = self.get(name)
        why = refusal(events[0].data, name, fingerprint(agent), upgrade=self.upgrade)
        if why is not None:  # before the answer is recorded: the run keeps waiting for one its agent can use
            raise ApiError(409, "AgentMismatchError", f"run {run_id!r} {why}")
        fut = self._reserve(run_id)
        try:
            record()
        except BaseException:
            self._release(run_id)
            raise
        started = events[0].data
        return self._execute(fut, agent, name, started.get("task", ""), dict(started.get("inputs") or {}), run_id, wait)

    def _reserve(self, run_id: str) -> Future[Any]:
        # A run that just asked for input is still unwinding for a moment: give it that moment.
        with self._lock:
            prev = self._active.get(run_id)
        if prev is not None:
            try:
                prev.exception(timeout=_BUSY_GRACE)
            except FutureTimeout:
                pass
        with self._lock:
            if run_id in self._active:
                raise ApiError(409, "RunBusyError", f"run {run_id!r} is already executing on this server")
            fut: Future[Any] = Future()
            self._active[run_id] = fut
            return fut

    def _release(self, run_id: str) -> None:
        with self._lock:
            fut = self._active.pop(run_id, None)
        if fut is not None and not fut.done():
            fut.cancel()

    def _execute(self, fut: Future[Any], agent: Callable[..., Any], name: str, task: str, inputs: dict[str, Any] | None,
                 run_id: str, wait: float) -> dict[str, Any]:
        journal = self.state.journal

        def work() -> None:
            from .._durable.execution import run

            with self._slots:
                fut.set_running_or_notify_cancel()
                outcome: Any
                try:
                    outcome = run(agent, task, run_id=run_id, inputs=inputs, journal=journal, agent_name=name,
                                  upgrade=self.upgrade).to_dict()
                except Exception as e:  # noqa: BLE001 - reported to the waiting request, or logged
                    outcome = e
                except BaseException as e:  # noqa: BLE001 - SystemExit in an agent must not stop the server
                    outcome = RuntimeError(f"agent raised {type(e).__name__}: {e} (the run stays resumable)")
                # Free the run id before anyone can see the result, so an immediate answer is not "busy".
                with self._lock:
                    self._active.pop(run_id, None)
                if isinstance(outcome, BaseException):
                    log.warning("agent run %s raised %s: %s", run_id, type(outcome).__name__, outcome)
                    fut.set_exception(outcome)
                else:
                    fut.set_result(outcome)

        threading.Thread(target=work, name=f"engrain-agent-{run_id}", daemon=True).start()
        try:
            return fut.result(timeout=wait)
        except FutureTimeout:
            return _pending(run_id)

    def shutdown(self, grace: float = 5.0) -> None:
        """Wait up to ``grace`` seconds for executing runs; the rest stay resumable in the journal."""
        from concurrent.futures import wait

        with self._lock:
            futures = list(self._active.values())
        if futures:
            wait(futures, timeout=grace)


@router.get("/agents")
def list_agents(request: Request) -> list[dict[str, Any]]:
    """Agents this server runs: registered Python agents (``kind: python``) and LLM agents (``kind: llm``)."""
    state = state_of(request)
    agents = state.agents.agents
    out = []
    for name in sorted(agents):
        doc = (getattr(agents[name], "__doc__", None) or "").strip()
        out.append({"name": name, "kind": "python", "description": doc.splitlines()[0] if doc else ""})
    return out + state.llm_agents.all()
