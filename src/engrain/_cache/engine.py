"""Behavior cache: replay what worked for a task, fall back to the agent when it won't.

:class:`Engine` wraps an agent callable (the surface of muscle-mem). Each
``engine(task)`` is one durable run. The engine looks up trajectories stored
for the task's canonical key and tags, keeps those whose first pre-check
passes in the current environment, and replays the best one step by step
through the journal, checking each tool's pre- and post-check. A failed
check stops the replay, journals ``replay.diverged`` and hands the agent a
:class:`Continuation` with the steps already done; a tool call of the agent
that repeats one of those steps returns its result without running again.
A run that ends well with at least one tool call is stored as a new entry.
"""

from __future__ import annotations

import atexit
import dataclasses
import inspect
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._durable.batched import arun_batched, run_batched
from .._durable.context import current, default_journal, new_run_id
from .._durable.execution import run_async_as, run_sync
from .._durable.steps import same_json
from .._durable.tools import (
    ToolRegistry,
    _binder,
    default_name,
    tool,
    validate_tool_name,
)
from .._errors import CacheError
from .._journal import Journal, open_journal
from . import semantic
from .binding import bind, entry_key, json_type, shape_key
from .checks import Check, encode_snapshot
from .metrics import Metrics
from .plan import PlannedStep, ToolSpec
from .replay import Continuation, Session, StepDone, current_session
from .store import CacheStore, Entry, canonical_task, key, task_key
from .tools import recording_tool
from .values import call_inputs, find_feeds

__all__ = ["Check", "Continuation", "Engine", "Outcome", "StepDone"]

#: The agent name a step-mode call's run records: the name ``agent_name`` gives the closure
#: ``Engine.__call__`` runs, spelled once so that no call derives it again (and no refactoring
#: of that closure renames the agent of runs in flight, which their resumption must match).
_STEP_AGENT = f"{__name__}:Engine.__call__.<locals>.agent"
#: The same for an async agent's calls (the name ``run_async`` gave them before it was spelled here).
_ASYNC_AGENT = f"{__name__}:Engine._acall.<locals>.agent"
#: The key tag an engine's ``namespace`` adds (never a caller's tag).
_NAMESPACE_TAG = "engrain.namespace="
#: The run tag of a call whose task is a JSON value: the run records the task's text, which a string
#: task may share, and a resume of the run (its recorded tags are checked) must be a call of the same kind.
_JSON_TASK_TAG = "engrain.cache.json-task"


@dataclass(slots=True)
class Outcome:
    """The result of ``engine(task)``: truthy on a full replay (a cache hit).

    ``steps`` lists the tool calls of this call with their ``source``:
    ``replayed`` (from the cache), ``continued`` (an agent call answered from
    a step the replay had done) or ``agent``.
    """

    hit: bool
    output: Any
    run_id: str
    steps: list[dict[str, Any]]
    reason: str
    status: str = "ok"
    error: str | None = None
    entry_id: str | None = None
    agent_called: bool = False
    stored: str | None = None

    def __bool__(self) -> bool:
        return self.hit

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view."""
        return dataclasses.asdict(self)


class Engine:
    """Wrap an agent with a behavior cache (muscle-mem's surface, on engrain's journal).

    ``journal`` is the store (default: the process-wide default store);
    ``embedder`` (an object with ``embed(list[str])`` returning vectors) turns
    on semantic matching of task texts at ``semantic_threshold`` cosine
    similarity; an entry that diverges ``evict_after`` times in a row is
    evicted.

    ``durability`` says how engine calls are journaled: ``"step"`` (default)
    as durable runs, every step before and after it runs, so a crashed call
    resumes without running a finished step twice; ``"run"``, in one
    transaction when the call ends (fast; a crash loses the call in flight);
    ``"off"``, not at all.

    ``url`` opens a store of its own (``":memory:"``: a private one that starts
    empty and is removed on :meth:`close`); ``namespace`` keeps this engine's
    entries apart from other engines' in the same store. ``match="tags"`` keys
    trajectories by tags alone, as muscle-mem does (default: task text and
    tags). ``store_empty`` also caches runs that made no tool call;
    ``refresh_snapshots`` stores a hit's fresh snapshots, so time-window
    checks slide instead of expiring. :mod:`engrain.muscle_mem` turns the
    muscle-mem behaviours on.
    """

    def __init__(
        self,
        journal: Journal | None = None,
        *,
        embedder: Any = None,
        semantic_threshold: float = 0.9,
        evict_after: int = 3,
        max_candidates: int = 10,
        durability: str = "step",
        url: str | None = None,
        namespace: str | None = None,
        match: str = "task",
        store_empty: bool = False,
        refresh_snapshots: bool = False,
    ):
        if durability not in ("step", "run", "off"):
            raise CacheError(f"durability must be 'step', 'run' or 'off', got {durability!r}")
        if match not in ("task", "tags"):
            raise CacheError(f"match must be 'task' (task text and tags) or 'tags' (tags only), got {match!r}")
        if journal is not None and url is not None:
            raise CacheError("give Engine either a journal or a url, not both")
        if namespace is not None and (not isinstance(namespace, str) or not namespace or len(namespace) > 200):
            raise CacheError(f"namespace must be a non-empty string of at most 200 characters, got {namespace!r}")
        self.durability = durability
        self._scratch: str | None = None
        if url == ":memory:":
            # A private store that starts empty and is removed when the engine closes (or the process exits).
            self._scratch = tempfile.mkdtemp(prefix="engrain-cache-")
            atexit.register(shutil.rmtree, self._scratch, True)
            journal = open_journal(os.path.join(self._scratch, "cache.db"))
        elif url is not None:
            journal = open_journal(url)
        self._journal = journal
        self.namespace = namespace
        self.match = match
        self.store_empty = store_empty
        self.refresh_snapshots = refresh_snapshots
        self.metrics = Metrics()
        self._store: CacheStore | None = None
        self._store_lock = threading.Lock()
        self.tools = ToolRegistry()
        self._specs: dict[str, ToolSpec] = {}
        # Entries resolved against the tools above, by entry id (see _replay.plan).
        self._plans: dict[str, tuple[PlannedStep, ...]] = {}
        self._agent: Callable[..., Any] | None = None
        self._agent_async = False
        self._running: dict[int, Session] = {}  # calls in progress, by id (see _untracked)
        self._context: Any = None
        self._finalized = False
        self.embedder = embedder
        self.semantic_threshold = semantic_threshold
        self.evict_after = evict_after
        self.max_candidates = max_candidates

    # -- set-up ---------------------------------------------------------

    @property
    def journal(self) -> Journal:
        """The journal runs are written to."""
        if self._journal is None:
            self._journal = default_journal()
        return self._journal

    @property
    def store(self) -> CacheStore:
        """The entry store (opened on first use, in the journal's database)."""
        store = self._store
        if store is not None:  # on every hit, several times: no lock once open
            return store
        with self._store_lock:
            if self._store is None:
                self._store = CacheStore(self.journal, lookup_on_journal=True)
            return self._store

    def set_agent(self, agent: Callable[..., Any]) -> Engine:
        """The agent called on a miss or a divergence: ``agent(task)``, or ``agent(task, continuation=...)``."""
        self._check_mutable()
        if not callable(agent):
            raise CacheError(f"set_agent expects a callable, got {type(agent).__name__}")
        self._agent = agent
        self._agent_async = inspect.iscoroutinefunction(agent)
        return self

    def set_context(self, obj: Any) -> Engine:
        """The object re-injected as ``self`` when replaying ``@engine.method`` tools."""
        self._check_mutable()
        self._context = obj
        return self

    def finalize(self) -> Engine:
        """Check the engine is complete (tools, agent, context for methods) and freeze it."""
        missing = []
        if not self._specs:
            missing.append("at least one tool (decorate with @engine.function() or @engine.method())")
        if self._agent is None:
            missing.append("an agent (engine.set_agent(agent))")
        methods = sorted(n for n, s in self._specs.items() if s.is_method)
        if methods and self._context is None:
            missing.append(f"a context object for the method tools {methods} (engine.set_context(obj))")
        if missing:
            raise CacheError("the engine is missing " + "; ".join(missing))
        self._finalized = True
        return self

    def _check_mutable(self) -> None:
        if self._finalized:
            raise CacheError("the engine is finalized and cannot be changed")

    def function(self, pre_check: Check | None = None, post_check: Check | None = None, *, name: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorate a function tool the engine records and replays (transparent outside the engine)."""
        return self._decorator(pre_check, post_check, False, name)

    def method(self, pre_check: Check | None = None, post_check: Check | None = None, *, name: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorate a method tool; on replay ``self`` is the object given to :meth:`set_context`."""
        return self._decorator(pre_check, post_check, True, name)

    def _decorator(self, pre: Check | None, post: Check | None, is_method: bool, name: str | None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        self._check_mutable()
        for c in (pre, post):
            if c is not None and not isinstance(c, Check):
                raise CacheError(f"pre_check/post_check must be a Check, got {type(c).__name__}")

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            step_name = validate_tool_name(name or default_name(fn))
            if step_name in self._specs:
                raise CacheError(f"a tool named {step_name!r} is already registered on this engine")
            journaled = tool(fn, name=step_name, registry=self.tools)
            spec = ToolSpec(step_name, fn, is_method, pre, post, inspect.iscoroutinefunction(fn), _binder(fn))
            self._specs[step_name] = spec
            self._plans.clear()  # entries naming this tool resolve differently now
            return recording_tool(spec, journaled, self._untracked)

        return decorate

    # -- recording ------------------------------------------------------

    def _untracked(self) -> None:
        """A tool ran outside every call's context (a thread the agent started?): a call in progress may lack it."""
        for s in list(self._running.values()):
            s.untracked = True

    def _store_trajectory(self, s: Session, output: Any, run_id: str) -> str | None:
        """Store a successful run's tool calls as an entry (one without tool calls only with ``store_empty``)."""
        trajectory = s.recorded()
        if not trajectory and not self.store_empty:
            return None
        # Type-exact: a tool's 2 does not produce an output of 2.0 (a hit would return the tool's int).
        # None, a bool and "" say too little to be taken from a step (`in` would also drop 0 and 1: True == 1).
        generic = output is None or type(output) is bool or output == ""
        producers = [] if generic else [i for i, t in enumerate(trajectory) if same_json(t["result"], output)]
        values = [t["args"] for t in trajectory]
        if not producers:
            values.append(output)
        # Each param is bound in every argument that used its value, or pinned into the key (see binding.py).
        b = bind(values, s.params)
        steps = []
        for i, t in enumerate(trajectory):
            pre, post = (encode_snapshot(*v) if isinstance(v, tuple) else v for v in (t["pre"], t["post"]))
            steps.append({"name": t["name"], "args": b.values[i], "templated": b.templated[i], "pre": pre, "post": post})
        if producers:
            out_spec: dict[str, Any] = {"step": producers[-1]}
        else:
            out_spec = {"template": b.values[-1]} if b.templated[-1] else {"value": output}
        # What later arguments (or an output a hit returns as recorded) took from each result (values.py).
        tail = None if producers else b.values[-1]
        for st, fed in zip(steps, find_feeds([t["result"] for t in trajectory], b.values[: len(trajectory)], tail)):
            st.update({"feeds": fed} if fed else {})
        # A hit needs each bound param with the type it had: "{{ params.x }}" renders a new type as is,
        # while the agent may have formatted the value into text.
        out_spec["param_types"] = {n: json_type(s.params[n]) for n in b.bound}
        canon, shape = (canonical_task(s.task, {}), None) if not s.params else shape_key(s.task, s.tags, s.params, s.json_task)
        ekey = task_key(canon, s.tags, s.json_task) if shape is None else entry_key(shape, s.params, b.pinned)
        now = time.time()
        entry = Entry(
            id=new_run_id(), task_key=ekey, tags_key=key(s.tags), task=canon, tags=s.tags,
            steps=steps, output=out_spec, run_id=run_id, created=now, last_used=now,
        )
        if self.embedder is not None:
            entry.embedding = [float(x) for x in self._embed(canon)]
        self.store.put(entry, shape, b.pinned)
        return entry.id

    def _embed(self, text: str) -> Any:
        return semantic.unit(self.embedder, text)

    # -- lookup and replay --------------------------------------------------------

    def _semantic(self, canon: str, tags: list[str]) -> list[Entry]:
        entries = self.store.with_embeddings(key(tags))
        if not entries:
            return []
        return [e for e, _ in semantic.nearest(entries, self._embed(canon), self.semantic_threshold,
                                               self.max_candidates)]

    def _start_agent(self, s: Session, cont: Continuation | None) -> tuple[Callable[..., Any], dict[str, Any]]:
        s.agent_called = True
        self.store.bump("agent_calls")
        kwargs: dict[str, Any] = {}
        if cont is not None:
            try:
                if "continuation" in inspect.signature(self._agent).parameters:  # type: ignore[arg-type]
                    kwargs["continuation"] = cont
            except (TypeError, ValueError):
                pass
        return self._agent, kwargs  # type: ignore[return-value]

    def _drive(self, s: Session) -> Any:
        s.ctx = current()
        entry = s.begin()
        cont = None
        if entry is not None:
            hit, value = s.replay(entry)
            if hit:
                return value
            cont = value
        elif s.suggest:
            cont = s.suggestion()
        agent, kwargs = self._start_agent(s, cont)
        return agent(*s.agent_args, **s.agent_kwargs, **kwargs)

    async def _adrive(self, s: Session) -> Any:
        s.ctx = current()
        entry = s.begin()
        cont = None
        if entry is not None:
            hit, value = await s.areplay(entry)
            if hit:
                return value
            cont = value
        elif s.suggest:
            cont = s.suggestion()
        agent, kwargs = self._start_agent(s, cont)
        return await agent(*s.agent_args, **s.agent_kwargs, **kwargs)

    # -- calling -----------------------------------------------------------

    def __call__(
        self, task: Any, *args: Any, tags: list[str] | None = None, params: dict[str, Any] | None = None,
        run_id: str | None = None, **kwargs: Any,
    ) -> Any:
        """Perform ``task``: replay a cached trajectory, or call ``agent(task, *args, **kwargs)``. Returns an :class:`Outcome`.

        ``task`` is a string or any JSON value (a list of messages, say), keyed
        by its JSON text (and apart from a string task of that text);
        ``args``/``kwargs`` go to the agent as they are and are not part of
        the key. With an async agent this returns a coroutine to await.
        """
        if self._agent is None:
            raise CacheError("the engine has no agent: call engine.set_agent(agent) (and finalize())")
        text, tags_l, params_d = call_inputs(task, tags, params, _NAMESPACE_TAG)
        key_tags = [*tags_l, f"{_NAMESPACE_TAG}{self.namespace}"] if self.namespace else tags_l
        by_tags = self.match == "tags"
        s = Session(self, "" if by_tags else text, params_d, key_tags, agent_args=(task, *args), agent_kwargs=kwargs,
                    json_task=not by_tags and not isinstance(task, str))
        task = text
        run_tags = ["engrain.cache", _JSON_TASK_TAG, *tags_l] if s.json_task else ["engrain.cache", *tags_l]
        # The lookup is a journaled step replayed on resume: a resume with other params or tags would get
        # the entry chosen for the first ones, so the run records both and a resume must give them again.
        same = {"params": params_d, "tags": run_tags}
        if self._agent_async:
            return self._acall(s, task, run_id, run_tags, same)

        def agent(task: str) -> Any:
            token = current_session.set(s)
            self._running[id(s)] = s
            try:
                return self._drive(s)
            finally:
                self._running.pop(id(s), None)
                current_session.reset(token)

        if self.durability == "step":
            # A run id made here is new: run() then creates the run without first reading it back.
            # The closure is engrain's code, which records no fingerprint (see identity.fingerprint).
            res = run_sync(agent, task, run_id, None, run_tags, self.journal, _STEP_AGENT, None, False, same)
        else:
            res = run_batched(agent, task, run_id=run_id or new_run_id(), tags=run_tags, journal=self.journal, write=self.durability == "run",
                              same=same)
        return self._outcome(s, res)

    async def _acall(self, s: Session, task: str, run_id: str | None, run_tags: list[str], same: dict[str, Any]) -> Outcome:
        async def agent(task: str) -> Any:
            token = current_session.set(s)
            self._running[id(s)] = s
            try:
                return await self._adrive(s)
            finally:
                self._running.pop(id(s), None)
                current_session.reset(token)

        if self.durability == "step":
            res = await run_async_as(agent, task, run_id, None, run_tags, self.journal, _ASYNC_AGENT, None, False, same)
        else:
            res = await arun_batched(agent, task, run_id=run_id or new_run_id(), tags=run_tags, journal=self.journal,
                                     write=self.durability == "run", same=same)
        return self._outcome(s, res)

    def _outcome(self, s: Session, res: Any) -> Outcome:
        if res.status == "failed" and res.error_type == "CacheError":
            # The engine's own misuse (a snapshot it cannot store, a bad check): the run is journaled
            # failed, and the caller gets the error, as muscle-mem raises it.
            raise CacheError(res.message or str(res.error))
        if res.status == "ok" and not s.hit:
            if s.untracked:
                s.reason += "; not stored: a tool of this engine ran outside the call (in a thread?), so its trajectory may lack it"
            else:
                s.stored = self._store_trajectory(s, res.output, res.run_id)
        elif res.status == "ok" and self.refresh_snapshots and s.entry_id is not None:
            self._refresh(s)
        reason = s.reason if res.status == "ok" else f"{s.reason}; agent failed: {res.error}" if s.reason else str(res.error)
        return Outcome(
            hit=s.hit and res.status == "ok", output=res.output, run_id=res.run_id, steps=s.steps, reason=reason,
            status=res.status, error=res.error, entry_id=s.entry_id, agent_called=s.agent_called, stored=s.stored,
        )

    def _refresh(self, s: Session) -> None:
        """After a hit, store the snapshots just taken in place of the recorded ones (time windows slide)."""
        entry = self.store.cached(s.entry_id)  # type: ignore[arg-type]
        trajectory = s.recorded()
        if entry is None or len(entry.steps) != len(trajectory):
            return
        steps = []
        for i, (old, t) in enumerate(zip(entry.steps, trajectory)):
            pre = s.first_pre if i == 0 and s.first_pre is not None else t["pre"]
            pre, post = (encode_snapshot(*v) if isinstance(v, tuple) else v for v in (pre, t["post"]))
            steps.append({**old, "pre": pre, "post": post})
        if steps != entry.steps:
            self.store.refresh(entry.id, steps)
            self._plans.pop(entry.id, None)

    # -- inspection ------------------------------------------------------------

    def entries(self, limit: int = 100) -> list[Entry]:
        """Stored entries, most recently used first."""
        return self.store.entries(limit)

    def stats(self) -> dict[str, int]:
        """Lookups, hits, misses, divergences, agent calls, evictions, stored and current entries."""
        return self.store.stats()

    def evict(self, entry_id: str) -> bool:
        """Delete one entry."""
        return self.store.evict(entry_id)

    def close(self) -> None:
        """Close the entry store (the journal stays open, except the private one of ``url=":memory:"``)."""
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._scratch is not None and self._journal is not None:
            self._journal.close()
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._journal, self._scratch = None, None
