"""``engrain.Agent``: a durable LLM agent with tools, sessions, memory and the behavior cache."""

from __future__ import annotations

import atexit
import hashlib
import json
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .. import _events as ev
from .._durable.context import RunResult, current, default_journal
from .._durable.execution import Same, run_sync
from .._durable.tools import ToolRegistry, validate_tool_name
from .._durable.tools import tools as _default_tools
from .._errors import AgentMismatchError, ConfigError, ConflictError, EngrainError, LeaseHeldError
from .._events import API_AGENT_TAG
from .._journal import Journal
from . import sessions
from .loop import EVICT_AFTER, converse
from .providers import Provider, make_provider, parse_model
from .toolspec import AgentTool, from_function, from_registry
from .volatile import result_check

#: The ``run.started`` field holding :meth:`Agent.definition`, which a resume must give again.
DEFINITION = "agent_def"

_stores: dict[str, Any] = {}
_memories: dict[str, Any] = {}
_shared_lock = threading.Lock()


@atexit.register
def _close_shared() -> None:
    """Close the memories and cache stores agents of this process shared (per store URL), at exit: their
    batched cache counters are written and their connections end cleanly instead of being dropped."""
    with _shared_lock:
        shared = [*_memories.values(), *_stores.values()]
        _memories.clear()
        _stores.clear()
    for x in shared:
        try:
            x.close()
        except Exception:  # noqa: BLE001 - at exit, a store already gone has nothing left to lose
            pass


class Agent:
    """A durable LLM agent: ``run(task)`` for a task, ``chat(message, session=)`` for a conversation.

    ``model`` is ``"openai:<model>"``, ``"anthropic:<model>"`` or
    ``"ollama:<model>"``; ``base_url`` points ``openai:`` at any compatible
    server. For tests, ``model`` may be a model object from
    :mod:`engrain.testing` (``TestModel()``, ``FunctionModel(fn)``), called in
    process. ``tools`` are Python functions (their signature and docstring
    become the schema the model sees) or names of registered tools, such as
    the names :meth:`engrain.tools.load_dir` returns for WASM tools. Every
    model call and tool call is a journaled step: resuming a run with the same
    ``run_id`` replays them instead of paying or executing them again.
    ``memory="skill"`` recalls that skill's memory into the system message and
    remembers each outcome; ``cache=True`` replays a repeated task's
    trajectory without model calls while its tools return what they returned.
    ``learn=True`` (or a skill name; ``True`` means the agent's name) learns a
    routine from each run that ends ok and offers the skill's confirmed
    routines to the model as tools (see :mod:`engrain._agent.learn`);
    ``last_learned`` says what the last run taught. ``memory_store`` is the :class:`engrain.Memory` to use (default: one on
    the run's store); ``client`` an SDK client you configured yourself.

    A run (and a chat turn) records the agent's definition (:meth:`definition`:
    model, instructions, tools), and only an agent of that definition resumes
    it: the recorded model replies were chosen under it, so an agent told other
    instructions, given another model or other tools gets
    :class:`~engrain.AgentMismatchError` and the run is left as it is. The
    order the tools are given in is not part of it. An ``@engrain.tool``'s
    ``at_most_once`` and ``retries`` apply to the agent's calls of it as to a
    durable run's.

    The cache keys on the agent (name, model, instructions, tools), the
    session's earlier messages, recalled memory and the task text with
    whitespace folded. A replay goes on while each tool returns what it
    returned then, up to the differences its ``volatile``/``same_result``
    allows (``volatile={"send_email": ["sent_at"]}``, ``same_result={"search":
    fn}`` here, or on ``@engrain.tool``; default: generated ids and stamps
    of the call the model never used again, see ``engrain._agent.volatile``).
    An answer given without tool calls is cached only with ``answers_ttl``
    (seconds it stays valid). With an ``embedder``, a task within
    ``similar_threshold`` (cosine) of cached ones never replays: the nearest
    (up to three) trajectories are proposed as plans the model may take in
    one reply, edit or ignore (see ``engrain._agent.cache``).
    """

    def __init__(
        self,
        name: str,
        model: str | Provider,
        instructions: str = "",
        tools: Iterable[Callable[..., Any] | str] = (),
        *,
        memory: str | None = None,
        cache: bool = False,
        max_turns: int = 10,
        base_url: str | None = None,
        api_key: str | None = None,
        client: Any = None,
        registry: ToolRegistry | None = None,
        journal: Journal | None = None,
        stream: bool = True,
        parallel_tools: int = 8,
        memory_store: Any = None,
        answers_ttl: float | None = None,
        embedder: Any = None,
        similar_threshold: float = 0.75,
        volatile: dict[str, list[str]] | None = None,
        same_result: dict[str, Callable[[Any, Any], bool]] | None = None,
        learn: bool | str = False,
    ):
        validate_tool_name(name)
        if len(name) > 64:  # it is part of run ids (chat:<agent>:<session>:<n>), which have a length limit
            raise ConfigError(f"agent name {name[:20]!r}...: at most 64 characters")
        given: Provider | None = None
        if isinstance(model, Provider):  # a model object (engrain.testing): its name keys caches and records
            if base_url is not None or api_key is not None or client is not None:
                raise ConfigError(f"agent {name!r}: a model object is called in process; it takes no "
                                  "base_url, api_key or client (serve() it to reach it over HTTP)")
            given, model = model, f"{model.name}:{model.model}"
        else:
            parse_model(model)
        if not isinstance(instructions, str):
            raise ConfigError(f"agent {name!r}: instructions must be a string")
        if not isinstance(max_turns, int) or not 1 <= max_turns <= 1000:
            raise ConfigError(f"agent {name!r}: max_turns must be an integer from 1 to 1000, got {max_turns!r}")
        if memory is not None and (not isinstance(memory, str) or not memory):
            raise ConfigError(f"agent {name!r}: memory must be a skill name")
        if not isinstance(learn, (bool, str)) or learn == "":
            raise ConfigError(f"agent {name!r}: learn must be True, False or a skill name")
        #: The skill learned routines are kept under (None: the agent does not learn).
        self.learn: str | None = (name if learn is True else learn) or None
        self.last_learned: Any = None
        self.name, self.model, self.instructions = name, model, instructions
        self.memory, self.cache, self.max_turns = memory, bool(cache), max_turns
        self.base_url, self.stream, self.parallel_tools = base_url, stream, max(1, parallel_tools)
        if answers_ttl is not None and (isinstance(answers_ttl, bool) or not isinstance(answers_ttl, (int, float))
                                        or answers_ttl <= 0):
            raise ConfigError(f"agent {name!r}: answers_ttl must be a number of seconds > 0, got {answers_ttl!r}")
        if embedder is not None and not callable(getattr(embedder, "embed", None)):
            raise ConfigError(f"agent {name!r}: embedder must have an embed(list[str]) method")
        if not isinstance(similar_threshold, (int, float)) or not 0 < similar_threshold <= 1:
            raise ConfigError(f"agent {name!r}: similar_threshold must be in (0, 1], got {similar_threshold!r}")
        self.answers_ttl, self.embedder, self.similar_threshold = answers_ttl, embedder, float(similar_threshold)
        self.journal = journal
        self._api_key, self._client, self._memory_store = api_key, client, memory_store
        self._provider: Provider | None = given
        reg = registry if registry is not None else _default_tools
        self.tools: dict[str, AgentTool] = {}
        for t in tools:
            if isinstance(t, str):
                try:
                    fn = reg.get(t)
                except KeyError as e:
                    raise ConfigError(f"agent {name!r}: {e.args[0]}") from None
                spec = from_registry(t, fn)
            elif callable(t):
                spec = from_function(t)
            else:
                raise ConfigError(f"agent {name!r}: a tool must be a function or a registered tool's name, got {t!r}")
            validate_tool_name(spec.name)
            if spec.name in self.tools:
                raise ConfigError(f"agent {name!r}: two tools are named {spec.name!r}")
            self.tools[spec.name] = spec
        for option, given in (("volatile", volatile), ("same_result", same_result)):
            for tool_name, value in (given or {}).items():
                if tool_name not in self.tools:
                    raise ConfigError(f"agent {name!r}: {option}= names {tool_name!r}, which is not one of its tools")
                self.tools[tool_name].result_check = result_check(tool_name, **{option: value})

    def __repr__(self) -> str:
        return f"<Agent {self.name} {self.model} tools={list(self.tools)}>"

    @property
    def provider(self) -> Provider:
        """The model's provider; its SDK client is created on first use."""
        if self._provider is None:
            self._provider = make_provider(self.model, base_url=self.base_url, api_key=self._api_key, client=self._client)
        return self._provider

    def describe(self) -> dict[str, Any]:
        """A JSON view: name, model, instructions, tools, memory, cache, answers_ttl, max_turns."""
        return {"name": self.name, "model": self.model, "instructions": self.instructions,
                "tools": [t.spec() for t in self.tools.values()], "memory": self.memory, "cache": self.cache,
                "answers_ttl": self.answers_ttl, "max_turns": self.max_turns, "learn": self.learn}

    def definition(self) -> str:
        """A digest of what the model's replies depend on: the model, the instructions and the tools
        (each one's name and argument schema; not their order, nor their descriptions).

        A run records it and a resume must give it again (see :meth:`run`). The tools are sorted by
        name: a definition listing the same tools in another order shows them to the model in that
        order, but every call a recorded reply makes means the same thing, so it resumes the run.
        """
        tools = sorted([t.name, t.declared()] for t in self.tools.values())
        text = json.dumps({"model": self.model, "instructions": self.instructions, "tools": tools},
                          sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()

    def _opening(self, j: Journal, run_id: str | None, task: str | None = None) -> Same:
        """The ``same=`` of the run this agent opens, after refusing an existing run of another origin.

        A new run records the definition; :func:`run_sync` refuses a run recorded with another one
        (:class:`AgentMismatchError`) and resumes one recorded without it (by an engrain from before
        it was recorded: nothing to compare), reading ``run.started`` once for all its checks.

        ``task``: the message of the chat turn ``run_id``; a turn found holding another message was
        taken by another process since the session was read (:class:`ConflictError`: the message
        takes the next turn).
        """
        info = None if run_id is None else j.get_run(run_id)
        if info is not None:
            sessions.check_origin(info.run_id, info.tags, self.name, self._api)
            if task is not None and info.task != task and ev.CLIENT_TAG not in info.tags:
                raise ConflictError(info.run_id, 0, info.next_seq)
        return Same({DEFINITION: self.definition()}, AgentMismatchError, unrecorded="resume", reason=(
            f"was started by the agent {self.name!r} with another definition (model, instructions or tools):"
            " the model replies it recorded were chosen under that one, so this agent does not continue it;"
            " resume it with the definition it was started with, or cancel it (engrain.cancel) to leave it"))

    # -- runs ------------------------------------------------------------------

    def run(self, task: str, *, run_id: str | None = None, journal: Journal | None = None,
            tags: list[str] | None = None, on_event: Callable[[dict[str, Any]], None] | None = None) -> RunResult:
        """Do ``task`` as a durable run; its output is the final answer's text.

        After a crash, call again with the same ``run_id``: recorded model
        replies and tool results are replayed, by an agent of the same
        :meth:`definition` only (another raises :class:`~engrain.AgentMismatchError`).
        A run that ran out of ``max_turns`` fails with a ``TurnLimitError``.
        """
        if not isinstance(task, str) or not task.strip():
            raise ConfigError(f"agent {self.name!r}: the task must be a non-empty string")
        emit = on_event or (lambda e: None)

        def agent_fn(t: str) -> str:
            ctx = current()
            assert ctx is not None
            return converse(self, ctx, [], t, emit)["text"]

        agent_fn.__name__ = self.name
        j = journal or self._journal()
        same = self._opening(j, run_id)
        # Named after this agent, so another agent's run is never continued by this one (see eg.agent_name),
        # and recording its definition, so neither is a run it was started with another definition of.
        res = run_sync(agent_fn, task, run_id, None, [*self._tags(), *(tags or [])], j, f"llm-agent:{self.name}",
                       None, same=same)
        self._learn_after(j, res, emit)
        return res

    def learn_from(self, run_id: str, *, journal: Journal | None = None) -> Any:
        """Learn a routine from this agent's finished run ``run_id``; returns a ``LearnReport``.

        Runs of ``learn=`` agents are learned from as they end; this is for
        earlier runs, or a run whose learning a crash cut short.
        """
        if not self.learn:
            raise ConfigError(f"agent {self.name!r} does not learn: create it with learn=True or a skill name")
        from .learn import learn_from_run

        return learn_from_run(self, journal or self._journal(), run_id)

    def _learn_after(self, j: Journal, res: RunResult, emit: Callable[[dict[str, Any]], None]) -> None:
        if not self.learn or not res:
            return
        from .learn import LearnReport, learn_from_run

        try:
            report = learn_from_run(self, j, res.run_id)
        except Exception as e:  # noqa: BLE001 - the run is done and ok; learning from it is extra
            report = LearnReport(res.run_id, "skipped", f"learning failed: {type(e).__name__}: {e}")
        self.last_learned = report
        emit({"type": "learned", **report.to_dict()})

    def chat(self, message: str, *, session: str, journal: Journal | None = None) -> Iterator[dict[str, Any]]:
        """Send ``message`` in ``session`` and iterate over the turn's events as they happen.

        Events are dicts with a ``type``: ``text`` (``delta``), ``tool_call``
        (``id``, ``name``, ``arguments``), ``tool_result`` (``id``, ``name``,
        ``content``, ``error``), ``cache``, ``error`` (``error``) and last
        ``done`` (``text``, ``status``, ``run_id``, ``session``, ``turn``). The
        turn is a durable run appended to the session; a turn a crash left
        unfinished is resumed first (its recorded steps are replayed).
        """
        q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.start_chat(message, session=session, on_event=q.put, journal=journal)
        while True:
            item = q.get()
            if item is None:
                return
            yield item

    def start_chat(self, message: str, *, session: str, on_event: Callable[[dict[str, Any] | None], None],
                   journal: Journal | None = None) -> threading.Thread:
        """:meth:`chat` without the iterator: the turn runs in a thread that calls ``on_event(e)``
        for each event and ``on_event(None)`` at the end (for servers bridging to their event loop)."""
        if not isinstance(message, str) or not message.strip():
            raise ConfigError(f"agent {self.name!r}: the message must be a non-empty string")
        sessions.check_session(session)
        j = journal or self._journal()
        t = threading.Thread(target=self._chat_worker, args=(j, session, message, on_event), daemon=True,
                             name=f"engrain-chat-{self.name}")
        t.start()
        return t

    def _turn(self, j: Journal, session: str, n: int, message: str, history: list[dict[str, Any]],
              emit: Callable[[dict[str, Any]], None]) -> RunResult:
        def turn_fn(t: str) -> dict[str, Any]:
            ctx = current()
            assert ctx is not None
            return converse(self, ctx, history, t, emit)

        turn_fn.__name__ = self.name
        rid = sessions.turn_id(self.name, session, n)
        same = self._opening(j, rid, message)
        try:
            res = run_sync(turn_fn, message, rid, None, [*self._tags(), sessions.session_tag(session)], j,
                           f"llm-agent:{self.name}", None, same=same)
        except EngrainError as e:
            if isinstance(e, (ConflictError, LeaseHeldError, AgentMismatchError)):
                raise
            # Another process created this turn with its message since _opening looked: the run refuses
            # this message as another task, and the message takes the turn after that one.
            info = j.get_run(rid)
            if info is not None and info.task != message and ev.CLIENT_TAG not in info.tags:
                raise ConflictError(rid, 0, info.next_seq) from e
            raise
        self._learn_after(j, res, emit)
        return res

    def _send(self, j: Journal, session: str, message: str, put: Callable[[Any], None]) -> tuple[int, RunResult]:
        """Play ``message`` as the session's next turn; returns the turn's number and result.

        The caller holds the session in this process (:func:`sessions.serial`). Another process may
        write it too: a turn number it took first, or a turn it is still running, is waited for (up to
        :data:`sessions.BUSY_WAIT` seconds) and the message becomes the turn after it.
        """
        deadline = time.monotonic() + sessions.BUSY_WAIT
        pause = 0.05
        finished: set[int] = set()  # earlier turns this call saw end
        while True:
            state = sessions.load(j, self.name, session, self._api)
            try:
                if state.unfinished is not None and state.unfinished[1] != message:
                    # an earlier message whose turn a crash cut short: finish it first, quietly
                    n, earlier = state.unfinished
                    if n in finished:  # never twice: the session would read it unfinished forever
                        raise EngrainError(f"session {session!r}: turn {n} ({sessions.turn_id(self.name, session, n)})"
                                           " ended, yet the session reads it as unfinished; cancel it (engrain.cancel)")
                    res = self._turn(j, session, n, earlier, state.messages, lambda e: None)
                    if res.status == "needs_input":
                        raise EngrainError(
                            f"session {session!r}: turn {n} ({res.run_id}) waits for an answer to"
                            f" {(res.prompt or {}).get('prompt', 'its question')!r}; answer it (engrain.answer)"
                            " or cancel it (engrain.cancel) before the session goes on")
                    finished.add(n)
                    continue  # read the session again: this message follows that turn
                n = state.next_turn
                return n, self._turn(j, session, n, message, state.messages, put)
            except (ConflictError, LeaseHeldError):
                # Another process took this turn's number or is running the turn: once it is done,
                # the message is the turn after it. Only a turn that outlasts the wait is an error.
                if time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 1.0)

    def _chat_worker(self, j: Journal, session: str, message: str, put: Callable[[Any], None]) -> None:
        try:
            # One message of a session at a time: both of two sent at once land, each as its own turn.
            with sessions.serial(j.url, self.name, session, self._api):
                n, res = self._send(j, session, message, put)
            if not res:
                put({"type": "error", "error": res.error or res.status})
            out = res.output if isinstance(res.output, dict) else {}
            put({"type": "done", "text": out.get("text", ""), "status": res.status, "run_id": res.run_id,
                 "session": session, "turn": n})
        except Exception as e:  # reported in the stream: the consumer is in another thread
            put({"type": "error", "error": f"{type(e).__name__}: {e}"})
            put({"type": "done", "text": "", "status": "failed", "run_id": None, "session": session, "turn": None})
        except BaseException as e:  # interrupted: the turn's run stays unfinished, resumed by the next chat
            put({"type": "error", "error": f"interrupted ({type(e).__name__}); the turn resumes with the next message"})
            put({"type": "done", "text": "", "status": "running", "run_id": None, "session": session, "turn": None})
        finally:
            put(None)

    def history(self, session: str, *, journal: Journal | None = None) -> list[dict[str, Any]]:
        """The session's messages in order, each with its original ``ts`` (finished turns only)."""
        return list(sessions.load(journal or self._journal(), self.name, session, self._api).messages)

    def _journal(self) -> Journal:
        return self.journal or default_journal()

    #: True for an agent an API client defined (set by the server): see ``sessions.check_origin``.
    _api = False

    def _tags(self) -> list[str]:
        return [f"llm-agent:{self.name}", API_AGENT_TAG] if self._api else [f"llm-agent:{self.name}"]

    # -- memory and cache (called inside journaled steps) ----------------------

    def _memory_for(self, journal: Journal) -> Any:
        if self._memory_store is not None:
            return self._memory_store
        with _shared_lock:
            m = _memories.get(journal.url)
            if m is None:
                from .._memory import Memory

                m = _memories[journal.url] = Memory(journal.url)
            return m

    def _recall(self, journal: Journal, query: str) -> list[str]:
        return [r.content for r in self._memory_for(journal).recall(query, skill=self.memory, top_k=5)]

    def _remember(self, journal: Journal, text: str) -> str:
        return self._memory_for(journal).remember(text, skill=self.memory, label=self.name)

    def _store(self, journal: Journal) -> Any:
        with _shared_lock:
            s = _stores.get(journal.url)
            if s is None:
                from .._cache.store import CacheStore

                s = _stores[journal.url] = CacheStore(journal)
            return s

    def _cache_hit(self, journal: Journal, entry_id: str) -> None:
        store = self._store(journal)
        store.record_hit(entry_id)

    def _cache_diverged(self, journal: Journal, entry_id: str) -> None:
        store = self._store(journal)
        store.bump("diverged")
        store.record_divergence(entry_id, EVICT_AFTER)
