"""``/api/runs``: list, inspect, stream, start, answer and append to runs."""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from .. import _events as ev
from .._errors import ConflictError, RunNotFoundError
from .._events import Event, NewEvent, check_json
from .._durable.steps import replayed_steps
from .agents import DEFAULT_WAIT, MAX_WAIT, agent_of
from .run_kinds import listed, log_view, runs_page
from .run_limits import DEFAULT_PAGE, MAX_PAGE
from .contract import one_of
from .answering import check_answerable, pending_prompt
from .state import ApiError, Body, state_of
from .streams import EventStream

router = APIRouter(tags=["runs"])

# The run statuses (see engrain._events.STATUSES) plus the old name "completed",
# still accepted for "ok"; FastAPI answers 422 listing these for anything else.
Status = Literal["ok", "failed", "needs_input", "running", "queued", "cancelled", "completed"]
TERMINAL = (ev.RUN_COMPLETED, ev.RUN_FAILED, ev.RUN_CANCELLED)
#: Statuses after which a stream waits for nothing more.
FINISHED = (ev.OK, ev.FAILED, ev.CANCELLED)
#: The largest seq a store holds (a signed 64-bit integer): ``after`` beyond it is a 422, not a driver error.
MAX_SEQ = 2**63 - 1
#: Seconds of silence after which a stream sends a comment line (which also finds dead clients).
KEEPALIVE = 15.0


#: A run id a client names: not blank, no surrounding spaces.
RUN_ID_PATTERN = r"^\S(.*\S)?$"


class StartRun(Body):
    """Start a run of a routine under the server's routines dir, or of a registered agent (exactly one)."""

    model_config = ConfigDict(json_schema_extra=one_of({"routine": {"type": "string"}},
                                                       {"agent": {"type": "string"}, "task": {"type": "string"}}))

    routine: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                                description="Routine name (a folder under the routines dir).")
    agent: str | None = Field(default=None, max_length=200, description="Registered agent name (instead of routine).")
    task: str | None = Field(default=None, max_length=20_000, description="The agent's task (required with agent).")
    inputs: dict[str, Any] | None = Field(default=None, description=(
        "The routine's inputs, or the agent's keyword arguments (omitted: none for a new run, the recorded ones "
        "when run_id names a run to continue; given, they must be the recorded ones)."))
    run_id: str | None = Field(default=None, max_length=200, pattern=RUN_ID_PATTERN,
                               description="Run id to use (default: a new one).")
    wait: float = Field(default=DEFAULT_WAIT, ge=0, le=MAX_WAIT,
                        description="Agent runs: seconds to wait for the end or a prompt before answering status running.")


class Answers(Body):
    """Answers to the prompt a ``needs_input`` run waits for."""

    answers: dict[str, Any] = Field(description="Field name -> answer.")
    wait: float = Field(default=DEFAULT_WAIT, ge=0, le=MAX_WAIT,
                        description="Agent runs: seconds to wait for the resumed run before answering status running.")


class AppendEvent(Body):
    kind: Literal[tuple(sorted(ev.KINDS))] = Field(description="Event kind, e.g. step.started (see DESIGN.md).")  # type: ignore[valid-type]
    name: str = Field(default="", max_length=500)
    data: dict[str, Any] = Field(default_factory=dict)


_LATER_KINDS = sorted(ev.KINDS - {ev.RUN_STARTED})


class Append(Body):
    """Low-level append with optimistic concurrency.

    ``expected_seq`` 0 creates the run: its first event is ``run.started``, which no later event may be.
    """

    # anyOf, not oneOf: the branches exclude each other by expected_seq, and generators read anyOf better.
    model_config = ConfigDict(json_schema_extra={"anyOf": [
        {"properties": {"expected_seq": {"const": 0},
                        "events": {"prefixItems": [{"properties": {"kind": {"const": ev.RUN_STARTED}}}],
                                   "items": {"properties": {"kind": {"enum": _LATER_KINDS}}}}}},
        {"properties": {"expected_seq": {"minimum": 1},
                        "events": {"items": {"properties": {"kind": {"enum": _LATER_KINDS}}}}}},
    ]})

    events: list[AppendEvent] = Field(min_length=1, max_length=1000)
    expected_seq: int = Field(ge=0, le=MAX_SEQ, description="The run's next seq as the caller knows it (0 creates the run).")


def _step_id(d: dict[str, Any]) -> int | None:
    """The event's ``call_id`` if it can name a step (an int, not a bool), else None.

    A client writes its own runs' events, so a ``call_id`` may be any JSON value: one that is not a
    step number (an object or a list is not even hashable) is ignored, never a 500 on the run's page.
    """
    cid = d.get("call_id")
    return cid if isinstance(cid, int) and not isinstance(cid, bool) else None


def fold_steps(events: list[Event]) -> list[dict[str, Any]]:
    """Per-step records with timings, attempts and whether a cached trajectory replayed them."""
    steps: dict[int, dict[str, Any]] = {}
    replaying = False
    for e in events:
        d = e.data
        cid = _step_id(d)
        if e.kind == ev.REPLAY_STARTED:
            replaying = True
        elif e.kind == ev.REPLAY_DIVERGED:
            replaying = False
        elif e.kind == ev.REPLAY_COMPLETED:  # a cache hit journaled at its end: its steps in one event
            first = d.get("replayed_from", 0)
            for rcid, (name, type_, args, result, begun) in replayed_steps(d):
                t0 = begun if isinstance(begun, (int, float)) else e.ts
                steps[rcid] = {
                    "call_id": rcid, "name": name, "type": type_, "args": args, "state": "completed", "result": result,
                    "error": None, "started": t0, "ended": e.ts, "duration_ms": round((e.ts - t0) * 1000, 3),
                    "attempts": 1, "replayed": isinstance(first, int) and rcid >= first,
                }
        elif cid is None:
            continue  # a step event that names no step: nothing to fold it into
        elif e.kind == ev.STEP_STARTED:
            rec = steps.get(cid)
            if rec is None:
                steps[cid] = {
                    "call_id": cid, "name": e.name, "type": d.get("type", "tool"), "args": d.get("args") or {},
                    "state": "started", "result": None, "error": None, "started": e.ts, "ended": None,
                    "duration_ms": None, "attempts": 1, "replayed": replaying,
                }
            else:
                rec["attempts"] += 1
                rec["started"] = e.ts
        elif e.kind == ev.INPUT_REQUESTED and d.get("at_most_once") and cid in steps:
            steps[cid]["state"] = "waiting"  # "did this step happen?"
        elif e.kind == ev.INPUT_REQUESTED:
            steps[cid] = {
                "call_id": cid, "name": e.name or "engrain.ask", "type": "input",
                "args": {"prompt": d.get("prompt"), "fields": d.get("fields")}, "state": "waiting", "result": None,
                "error": None, "started": e.ts, "ended": None, "duration_ms": None, "attempts": 1, "replayed": False,
            }
        elif e.kind in (ev.STEP_COMPLETED, ev.STEP_FAILED, ev.INPUT_RECEIVED):
            rec = steps.get(cid)
            if e.kind != ev.INPUT_RECEIVED and "args" in d:
                # A completion-only step (the default): the outcome carries type, arguments and start time.
                t0 = d.get("started") if isinstance(d.get("started"), (int, float)) else e.ts
                if rec is None:
                    rec = steps[cid] = {
                        "call_id": cid, "name": e.name, "type": d.get("type", "tool"), "args": d.get("args") or {},
                        "state": "started", "result": None, "error": None, "started": t0, "ended": None,
                        "duration_ms": None, "attempts": 1, "replayed": replaying,
                    }
                else:
                    rec["started"] = t0
                if isinstance(d.get("attempt"), int):
                    rec["attempts"] = d["attempt"]
            if rec is None:
                continue
            rec["ended"] = e.ts
            rec["duration_ms"] = round((e.ts - rec["started"]) * 1000, 3)
            if e.kind == ev.STEP_COMPLETED:
                rec["state"], rec["result"] = "completed", d.get("result")
            elif e.kind == ev.STEP_FAILED:
                rec["state"] = "retrying" if "retry_in" in d else "failed"
                rec["error"] = {"type": d.get("error_type", ""), "message": d.get("message", "")}
            else:
                rec["state"], rec["result"] = "answered", d.get("answers")
    return [steps[k] for k in sorted(steps)]


@router.get("/runs")
def list_runs(
    request: Request,
    status: Status | None = None,
    tag: str | None = Query(default=None, max_length=200),
    task: str | None = Query(default=None, max_length=2000),
    limit: int = Query(default=50, ge=1, le=1000),
    offset: int = Query(default=0, ge=0, le=10_000_000),
    internal: bool = Query(default=True, description="Include internal runs (LLM agent definitions, cache calls); "
                                                     "false leaves them out of the page and its offset."),
) -> list[dict[str, Any]]:
    """Runs matching every filter, most recently updated first, each with its ``kind``
    (``run``, ``internal``, or an adapter's log: ``thread`` for LangGraph, ``session``)."""
    wanted = None if status is None else ev.check_status(status)
    return runs_page(state_of(request).journal, status=wanted, tag=tag, task=task, limit=limit, offset=offset,
                     internal=internal)


def _require(request: Request, run_id: str) -> Any:
    info = state_of(request).journal.get_run(run_id)
    if info is None:
        raise RunNotFoundError(run_id)
    return info


#: ``GET /api/runs/{id}``: the run's last events sent after the first ``events_limit`` ones when it has more.
TAIL = 100


@router.get("/runs/{run_id:segment}")
def get_run(request: Request, run_id: str,
            events_limit: int = Query(default=DEFAULT_PAGE, ge=1, le=MAX_PAGE,
                                      description="Most of the run's first events in ``events``; a longer run also "
                                                  "sends its last ones in ``events_tail`` (read the gap with "
                                                  "GET .../events?after=)."),
            steps_limit: int = Query(default=DEFAULT_PAGE, ge=1, le=MAX_PAGE,
                                     description="Most step records in ``steps`` (the first, by call id).")) -> dict[str, Any]:
    """A run's summary, events, per-step records, pending prompt and outcome; ``log`` describes an
    adapter's log (a LangGraph thread: its checkpoints, the last first), else null.

    The view is bounded (a run may hold 100,000 events): ``events`` holds the first ``events_limit``
    events and ``events_tail`` the last ones after them (empty when ``events`` holds them all),
    ``events_total`` their count; ``steps`` the first ``steps_limit`` steps, ``steps_total`` their count.
    """
    info = _require(request, run_id)
    events = state_of(request).journal.read(run_id)
    last = events[-1] if events else None
    steps = fold_steps(events)  # folded over every event: a step's record needs its whole history
    head = events[:events_limit]
    tail = events[max(events_limit, len(events) - TAIL):]
    return {
        "run": listed(info),
        "log": log_view(info, events),
        "events": [e.to_dict() for e in head],
        "events_tail": [e.to_dict() for e in tail],
        "events_total": len(events),
        "steps": steps[:steps_limit],
        "steps_total": len(steps),
        "prompt": pending_prompt(events) if info.status == ev.NEEDS_INPUT else None,
        "output": last.data.get("output") if last is not None and last.kind == ev.RUN_COMPLETED else None,
        "error": last.data.get("error") if last is not None and last.kind == ev.RUN_FAILED else None,
    }


@router.get("/runs/{run_id:segment}/events")
def get_events(request: Request, run_id: str, after: int = Query(default=-1, ge=-1, le=MAX_SEQ),
               limit: int = Query(default=DEFAULT_PAGE, ge=1, le=MAX_PAGE,
                                  description="Most events returned; a full page means more may follow: "
                                              "ask again with after = the last seq.")) -> list[dict[str, Any]]:
    """The first ``limit`` events of the run with ``seq > after`` (a page; read the next with ``after``)."""
    _require(request, run_id)
    return [e.to_dict() for e in state_of(request).journal.read(run_id, after, limit)]


#: A run's SSE stream, the one route an EventSource opens: it may carry the token as ``?token=``.
STREAM_PATH = "/runs/{run_id:segment}/stream"


def _sse(e: Event) -> str:
    return f"id: {e.seq}\nevent: {e.kind}\ndata: {json.dumps(e.to_dict(), ensure_ascii=False)}\n\n"


@router.get(STREAM_PATH, response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}}, "description": "Server-sent events"},
                       429: {"description": "Too many open streams (per server or per client); see Retry-After"}})
async def stream(request: Request, run_id: str, after: int = Query(default=-1, ge=-1, le=MAX_SEQ),
                 token: str | None = Query(default=None, description="Bearer token, for EventSource clients.")) -> StreamingResponse:
    """Server-sent events: the run's events with ``seq > after``, then new ones as they are appended.

    The stream ends after the run's last event (completed, failed or cancelled).
    """
    state = state_of(request)
    info = await run_in_threadpool(state.journal.get_run, run_id)
    if info is None:
        raise RunNotFoundError(run_id)

    async def events(sub: Any) -> Any:
        last, status, idle_since = after, info.status, time.monotonic()
        # What the journal holds now, a page at a time (a long run is never read whole); the hub hands
        # over what comes after its snapshot (seq ordered, maybe again).
        batch: list[Event] | None = await run_in_threadpool(state.journal.read, run_id, last, MAX_PAGE)
        while True:
            for e in batch or ():
                if e.seq <= last:
                    continue
                yield _sse(e)
                last = e.seq
                if e.kind in TERMINAL:
                    return
            if batch is not None and len(batch) == MAX_PAGE:  # more of the journal to catch up on
                if await request.is_disconnected():
                    return
                batch = await run_in_threadpool(state.journal.read, run_id, last, MAX_PAGE)
                continue
            if batch:
                idle_since = time.monotonic()
            elif sub.gone or status in FINISHED:
                return  # finished (or deleted) with nothing more after `after`: nothing more will come
            elif time.monotonic() - idle_since > KEEPALIVE:
                idle_since = time.monotonic()
                yield ": keepalive\n\n"
            if await request.is_disconnected():
                return
            await sub.wait(KEEPALIVE)
            status = sub.status or status
            batch = sub.take()
            if batch is None:  # this reader fell too far behind for the hub to keep its events
                batch = await run_in_threadpool(state.journal.read, run_id, last, MAX_PAGE)

    return EventStream(request, events, lambda: state.hub.watch(run_id, info.next_seq - 1))


#: Tags only the runtime writes: they make the server resume a run as a routine or an agent, or mark
#: what the runtime made for itself (a cache call, an LLM agent's definition or API-defined agent's run, an
#: adapter's log): a client run wearing one would pose as it (hidden as internal, shown as a thread).
RUNTIME_TAGS = frozenset({"routine", "agent", ev.CLIENT_TAG, ev.API_AGENT_TAG, "engrain.cache",
                          "llm-agent-definition", "langgraph", "openai-agents"})
#: Tag prefixes only the runtime writes (``agent:<name>``).
RUNTIME_TAG_PREFIXES = ("agent:",)
#: Run ids the runtime keeps its own state at: an LLM agent's definition, an ``eg.Agent`` chat turn, a
#: LangGraph thread, an OpenAI Agents session. Their readers refuse a client run found there, so a client
#: creating one would only squat the name (``POST /api/agents`` answering 409 for ever): refused here.
RUNTIME_ID_PREFIXES = ("agentdef:", "chat:", "langgraph:", "openai-agents:")
#: Event data keys holding a step number (an object or a list there can name no step).
_STEP_KEYS = ("call_id",)


def _runtime_only(detail: str) -> ApiError:
    return ApiError(403, "RuntimeOnlyError", detail + " (see docs/api.md, 'Client runs')")


def _client_events(journal: Any, run_id: str, body: Append) -> list[NewEvent]:
    """The events to store, once the client may write them: only into a run it created itself.

    Routine and agent runs are resumed by the server from their journal, so a forged
    ``run.started`` or step result there would choose what the server runs: a client
    creates its own runs (tagged ``client``, which the runtime never resumes) and
    appends only to those.
    """
    events = [NewEvent(e.kind, e.name, e.data) for e in body.events]
    for i, e in enumerate(events):
        if e.kind == ev.RUN_STARTED and body.expected_seq + i > 0:
            raise ApiError(422, "ValidationError", f"events[{i}].kind: run.started may only be the run's first event (seq 0)")
        for key in _STEP_KEYS:
            # Scalars that name no step (a string, null) stay a client's to write and every reader skips
            # them; an object or a list is refused: no reader could ever take it for a step number.
            if isinstance(e.data.get(key), (dict, list)):
                raise ApiError(422, "ValidationError", f"events[{i}].data.{key} must be an integer step number, "
                                                       f"not {type(e.data[key]).__name__}")
    if body.expected_seq == 0:
        if events[0].kind != ev.RUN_STARTED:
            raise ApiError(422, "ValidationError", "events[0].kind must be run.started when creating a run (expected_seq 0)")
        prefix = next((p for p in RUNTIME_ID_PREFIXES if run_id.startswith(p)), None)
        if prefix is not None:
            raise _runtime_only(f"run id {run_id!r}: ids starting {prefix!r} are kept by engrain's runtime "
                                "(LLM agent definitions, chat turns, adapter logs), not created by a client")
        tags = events[0].data.get("tags", [])
        # A NUL in a tag: PostgreSQL's runs table cannot hold it (a 500 there), nor a filter ever match it.
        if not isinstance(tags, list) or not all(isinstance(t, str) and "\x00" not in t for t in tags):
            raise ApiError(422, "ValidationError", "events[0].data.tags must be a list of strings "
                                                   "without NUL characters")
        reserved = sorted({t for t in tags if t in RUNTIME_TAGS or t.startswith(RUNTIME_TAG_PREFIXES)})
        if reserved:
            raise _runtime_only(f"events[0].data.tags: {', '.join(reserved)} may only be written by engrain's runtime; "
                                "start routine and agent runs with POST /api/runs")
        for key in ("agent", "agent_code"):
            if key in events[0].data:
                # recover() hands a run to the agent (and code) its run.started names: a client must not pick it.
                raise _runtime_only(f"events[0].data.{key} may only be written by engrain's runtime; "
                                    "start agent runs with POST /api/runs")
        events[0] = NewEvent(ev.RUN_STARTED, events[0].name, {**events[0].data, "tags": [*tags, ev.CLIENT_TAG]})
        return events
    head = journal.read(run_id, -1)[:1]
    if not head:
        raise RunNotFoundError(run_id)
    tags = head[0].data.get("tags") if head[0].kind == ev.RUN_STARTED else None
    if not isinstance(tags, list) or ev.CLIENT_TAG not in tags:
        raise _runtime_only(f"run {run_id!r} is written by engrain's runtime, not by a client: "
                            "a client may append only to runs it created with this endpoint")
    return events


@router.post("/runs/{run_id:segment}/events")
def append_events(request: Request, run_id: str, body: Append) -> list[dict[str, Any]]:
    """Append events at ``expected_seq`` to a client run (409 ``ConflictError`` if another writer got there first).

    A client may create a run (``run.started`` at seq 0, tagged ``client`` by the
    server) and append any kind to it; runs the runtime writes (routines, agents,
    ``engrain.run``) answer 403 ``RuntimeOnlyError``. A client run holds at most the
    server's ``--max-run-events`` events and ``--max-run-bytes`` of event data: an
    append past either is refused whole (413 ``RunTooLargeError``).
    """
    if not run_id.strip() or len(run_id) > 200:
        raise ApiError(400, "BadRunId", "run_id must be 1..200 characters and not blank")
    for i, e in enumerate(body.events):
        if e.kind not in ev.KINDS:
            raise ApiError(422, "ValidationError", f"events[{i}].kind {e.kind!r} is not one of {sorted(ev.KINDS)}")
        check_json(e.data, f"events[{i}]", "data")
        # The name, and run.started's task, are copied to text columns no store keeps a NUL in.
        for where, text in (("name", e.name), ("data.task", e.data.get("task") if e.kind == ev.RUN_STARTED else None)):
            if isinstance(text, str) and "\x00" in text:
                raise ApiError(422, "ValidationError", f"events[{i}].{where} holds a NUL character, which a store cannot keep")
    state = state_of(request)
    journal = state.journal
    events = _client_events(journal, run_id, body)
    size = state.run_budget.check(journal, run_id, body.expected_seq, events)  # 413 past the run's budget
    try:
        stored = journal.append(run_id, events, body.expected_seq)
        state.run_budget.appended(run_id, body.expected_seq + len(events), size)
    except ConflictError:
        # Only now pay for the lookup that tells "no such run" from "another writer won".
        if body.expected_seq > 0 and journal.get_run(run_id) is None:
            raise RunNotFoundError(run_id) from None
        raise
    return [e.to_dict() for e in stored]


@router.post("/runs")
def start_run(request: Request, body: StartRun) -> dict[str, Any]:
    """Start a run of ``body.routine`` (to its end or first prompt) or of the agent ``body.agent``.

    An agent run executes in a worker thread; the response waits up to
    ``body.wait`` seconds, then reports ``status: "running"`` with the run id.
    """
    state = state_of(request)
    if (body.routine is None) == (body.agent is None):
        raise ApiError(422, "ValidationError", "give exactly one of routine and agent")
    if body.agent is not None:
        if body.task is None:
            raise ApiError(422, "ValidationError", "task: required when starting an agent run")
        return state.agents.start(body.agent, body.task, body.inputs, body.run_id, body.wait)
    from . import routines

    return routines.run_routine(state, body.routine, body.inputs, body.run_id)  # type: ignore[arg-type]


@router.post("/runs/{run_id:segment}/answers")
def answer_run(request: Request, run_id: str, body: Answers) -> dict[str, Any]:
    """Record answers for a ``needs_input`` run; a routine or registered-agent run is also resumed.

    A resumed agent run is waited for up to ``body.wait`` seconds (then ``status: "running"``).
    """
    from .._durable.human import answer

    state = state_of(request)
    _require(request, run_id)
    events = state.journal.read(run_id)
    check_answerable(run_id, events)
    check_json(body.answers, f"answers to run {run_id!r}", "answers")
    from . import routines

    # A refusal after our read (the run answered or ended since) reaches the app's handlers, which
    # answer it as every route does: 409 NotWaitingForInput or RunFinishedError.
    agent = agent_of(events)
    if routines.routine_run_folder(state, events) is not None:
        return {**routines.resume(state, run_id, body.answers), "resumed": True}
    if agent is not None and agent in state.agents.agents:
        def record() -> None:
            answer(run_id, body.answers, journal=state.journal)

        return {**state.agents.resume(agent, run_id, events, record, body.wait), "resumed": True}
    answer(run_id, body.answers, journal=state.journal)
    info = state.journal.get_run(run_id)
    return {"run_id": run_id, "status": info.status if info else "running", "output": None, "error": None,
            "prompt": None, "replayed": 0, "executed": 0, "resumed": False}


class Cancel(Body):
    """Cancel a run."""

    reason: str = Field(default="", max_length=2000, description="Why, recorded with the cancellation.")


@router.post("/runs/{run_id:segment}/cancel")
def cancel_run(request: Request, run_id: str, body: Cancel | None = None) -> dict[str, Any]:
    """Cancel a run: it stops at its next step boundary, ends ``cancelled`` and is never resumed.

    ``cancelled`` is false when the run had already finished.
    """
    from .._durable.operate import cancel

    state = state_of(request)
    _require(request, run_id)
    done = cancel(run_id, reason=body.reason if body else "", journal=state.journal)
    info = state.journal.get_run(run_id)
    return {"run_id": run_id, "cancelled": done, "status": info.status if info else None}
