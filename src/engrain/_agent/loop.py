"""One conversation inside a durable run: LLM call -> tool calls -> LLM call ... -> answer.

Every model call is a journaled step (``agent.llm``, type ``llm``) and every
tool call a journaled step named for the tool, so a resumed run replays both
and neither is paid for or executed twice. Tool calls the model asks for
together run in parallel: their steps are opened in the model's order before
any of them runs, so the step numbers are the same on every replay whatever
order the threads finish in. Unknown tools and bad arguments never reach a
tool: the error goes back to the model as the tool's result.

One disk flush per model call that asks for tools: that LLM step is flushed
before its tools run. The other steps of a turn (the clock read that stamps
the user's message, each tool's result, the final reply) reach the store
before anything uses them, so a killed process never redoes them, but are not
flushed on their own: the next durable append (the next LLM step,
``run.completed``), which always follows before the run ends, flushes them
too. Only a crash of the database server or the machine inside that window
can lose them; a lost tool result then reruns the tool with the same
idempotency key, as a tool cut off by a crash always does. The clock read and
the tool results before a model call are not even waited for
(``Journal.append(wait=False)``): PostgreSQL commits them while the model
works, and the model step's append raises a refusal (a cancel, a lost lease).

With the behavior cache on, a task seen before is played from its recorded
trajectory: the recorded model replies are reused, the tools run again, and
as long as every tool returns what it returned then, no model is called. The
first tool result that differs hands the conversation to the model from that
point, so a replay never answers from stale results.
"""

from __future__ import annotations

import contextvars
import datetime as _dt
import itertools
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .._durable.context import RunContext, StepRecord, _current, _step_key
from .._errors import NotJSONError, RetriesExhaustedError
from . import cache
from .providers import system_text, utc_iso
from .volatile import Replayer

# ``agent`` below is an engrain.Agent (not imported: agent.py imports this module)
Agent = Any

Emit = Callable[[dict[str, Any]], None]
MAX_RESULT = 64 * 1024  # characters of one tool result shown to the model
EVICT_AFTER = 3  # divergences in a row that evict a cached trajectory


class TurnLimitError(RuntimeError):
    """The model was still calling tools after ``max_turns`` model calls (the run fails)."""


class EmptyReplyError(RuntimeError):
    """The model sent a reply with neither text nor a tool call, twice (the run fails, never ``ok``)."""


_JSON_LITERALS = {True: "true", False: "false", None: "null"}


def _content(value: Any) -> str:
    t = type(value)
    if t is str:
        text = value
    elif t is int:  # json.dumps' own text for an int, without its encoder's set-up (a tool's usual result)
        text = int.__repr__(value)
    elif t is bool or value is None:
        text = _JSON_LITERALS[value]
    else:
        text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= MAX_RESULT else text[:MAX_RESULT] + f"... [truncated, {len(text)} characters]"


def _error(rec_type: str, message: str) -> str:
    return f"error: {rec_type}: {message}" if rec_type else f"error: {message}"


def _run_thunk(key: str, fn: Callable[[], Any]) -> Any:
    """Run a tool outside the run's context (its body is one step), with its idempotency key set."""

    def body() -> Any:
        _current.set(None)
        _step_key.set(key)
        return fn()

    return contextvars.Context().run(body)


def run_tools(agent: Agent, ctx: RunContext, calls: list[dict[str, Any]], ts: str, emit: Emit,
              wait: bool = True, tools: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Answer one model reply's tool calls: one tool message per call, in the model's order.

    ``wait=False`` when a model call comes next: each result's append is sent
    without waiting for the store's answer (see ``Journal.append``), and the
    model step's append raises its failure. ``tools`` are the run's tools when
    they are more than the agent's (learned routines offered to this run).
    """
    tools = agent.tools if tools is None else tools
    out: list[dict[str, Any]] = []
    pending: list[tuple[int, Any, Any, dict[str, Any]]] = []
    for c in calls:
        emit({"type": "tool_call", "id": c["id"], "name": c["name"], "arguments": c["arguments"]})
        msg = {"role": "tool", "tool_call_id": c["id"], "name": c["name"], "content": "", "error": False, "ts": ts}
        out.append(msg)
        tool = tools.get(c["name"])
        if tool is None:
            known = ", ".join(sorted(tools)) or "none"
            msg.update(content=f"error: unknown tool {c['name']!r}; available tools: {known}", error=True)
            continue
        try:
            args = tool.check(c["arguments"])
        except ValueError as e:
            msg.update(content=f"error: bad arguments for tool {tool.name!r}: {e}", error=True)
            continue
        # The tool's own policy: an at_most_once tool journals a durable start first, so a resume
        # after a crash mid-call asks whether it happened (the run pauses needs_input) instead of
        # calling it again; retries= re-calls it here as its @engrain.tool wrapper would.
        step = ctx._begin(tool.name, "tool", args, tool.policy)
        if isinstance(step, StepRecord):  # recorded: its result (or error) comes from the journal
            if step.state == "completed":
                msg["content"] = _content(step.result)
            else:
                msg.update(content=_error(step.error_type, step.message), error=True)
        else:
            pending.append((len(out) - 1, tool, step, args))

    def execute(item: tuple[int, Any, Any, dict[str, Any]]) -> None:
        i, tool, step, args = item
        policy = tool.policy
        while True:
            try:
                result = _run_thunk(step.key, lambda: tool.invoke(args))
            except Exception as e:
                try:
                    delay = ctx._failed(step, e, policy)  # journals the attempt (the step's failure, if last)
                except RetriesExhaustedError as final:  # the step's journaled outcome names every attempt
                    out[i].update(content=_error(final.error_type, final.message), error=True)
                    return
                if delay is None:
                    out[i].update(content=_error(type(e).__name__, str(e)), error=True)
                    return
                time.sleep(delay)
                ctx._next_attempt(step, policy, e)
                continue
            break
        try:
            # Not flushed on its own: the next model call's step (flushed before its reply is
            # used) or the run's end flushes it too, one disk flush per turn on a "full" store.
            ctx._complete(step, result, durable=False, wait=wait)
        except NotJSONError as e:  # journaled as the step's failure by _complete
            out[i].update(content=_error("NotJSONError", str(e)), error=True)
            return
        out[i]["content"] = _content(result)

    if len(pending) > 1:
        with ThreadPoolExecutor(min(len(pending), agent.parallel_tools), thread_name_prefix="engrain-tool") as pool:
            list(pool.map(execute, pending))
    elif pending:
        execute(pending[0])
    for m in out:
        emit({"type": "tool_result", "id": m["tool_call_id"], "name": m["name"], "content": m["content"],
              "error": m["error"]})
    return out


def _calls_tools(reply: dict[str, Any]) -> bool:
    return bool(reply["tool_calls"])


def _complete(agent: Agent, system: str, msgs: list[dict[str, Any]], specs: list[dict[str, Any]],
              delta: Callable[[str], None] | None, turn: int) -> dict[str, Any]:
    """One model call, timed (``seconds``: the model time a replay of it saves). A reply with
    neither text nor a tool call is asked for once more, then fails the step: an empty reply is
    never taken as the answer."""
    for attempt in (1, 2):
        t0 = time.perf_counter()
        reply = agent.provider.complete(system, msgs, specs, delta)
        reply["seconds"] = round(time.perf_counter() - t0, 4)
        if reply["tool_calls"] or (reply["text"] or "").strip():  # a tool call first: the usual turn's
            if attempt > 1:
                reply["empty_retries"] = attempt - 1  # paid for too (see cache.Savings)
            return reply
    raise EmptyReplyError(
        f"agent {agent.name!r}: model {agent.model!r} sent an empty reply (no text and no tool call) at turn "
        f"{turn}, twice in a row; check that the server speaks the provider's format (a streamed request "
        "must get an event stream or a whole JSON reply)")


def converse(agent: Agent, ctx: RunContext, history: list[dict[str, Any]], text: str, emit: Emit,
             on_delta: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Play one user message to a final answer; returns ``{"text", "messages"}`` (the new messages)."""
    # engrain.now()'s step, unflushed and not waited for: only the model sees it, and the
    # steps before the model call (recall, cache lookup, the model's own) append after it.
    iso = ctx.call("engrain.now", "clock", {}, lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(),
                   durable=False, wait=False)
    user = {"role": "user", "content": text, "ts": utc_iso(_dt.datetime.fromisoformat(iso))}
    msgs = [*history, user]
    new = [user]
    extra, recalled = "", []
    if agent.memory:
        recalled = ctx.call("agent.memory.recall", "tool", {"skill": agent.memory, "query": text},
                            lambda: agent._recall(ctx.journal, text))
        if recalled:
            extra = "What you remember from earlier work (skill memory):\n" + "\n".join(f"- {r}" for r in recalled)
    found, key, ctx_key, plan, similar = None, None, None, None, None
    if agent.cache:
        key, ctx_key = cache.keys(agent, history, text, recalled)
        found = ctx.call("agent.cache.lookup", "tool", {"key": key},
                         lambda: cache.lookup(agent, ctx.journal, key, ctx_key, text))
        if found is not None and "similar" in found:
            similar = found["similar"]
            extra = "\n\n".join(x for x in (extra, cache.plan_text(similar)) if x)
            emit({"type": "cache", "hit": False, "similar": [s["entry"] for s in similar]})
        else:
            plan = found
            emit({"type": "cache", "hit": plan is not None})
    log: list[dict[str, Any]] | None = [] if key is not None else None  # the trajectory to cache, if any
    replaying = plan is not None
    # the journaled clock, not now: a resumed replay compares the journaled results as the first attempt did
    replay = Replayer(plan["turns"], text, [m["content"] for m in history], user["ts"]) if plan is not None else None
    checks = {n: t.result_check for n, t in agent.tools.items()} if plan is not None else {}
    saved = cache.Savings()
    tools = agent.tools
    if agent.learn:  # a cached trajectory that called a learned routine finds it offered again
        from .learn import offer

        tools = {**agent.tools, **offer(agent, ctx, text)}
    specs = [t.spec() for t in tools.values()]
    # Turns replayed from the cache and a plan's groups call no model: max_turns counts model calls.
    for turn in itertools.count():
        if replaying:
            assert replay is not None
            reply = {**replay.reply(turn), "ts": user["ts"]}
            saved.avoided(reply)
            if reply["text"]:
                emit({"type": "text", "delta": reply["text"]})
        else:
            if saved.made + saved.resumed >= agent.max_turns:
                break
            streamed, ran = [False], [False]

            def delta(piece: str) -> None:
                streamed[0] = True
                emit({"type": "text", "delta": piece})
                if on_delta is not None:
                    on_delta(piece)
                # Offer the GIL to the thread forwarding events: otherwise it waits while this one
                # parses the rest of a burst of chunks, and the first token reaches the user late.
                time.sleep(0)

            def call_model(turn: int = turn) -> dict[str, Any]:
                ran[0] = True
                return _complete(agent, system, msgs, specs, delta if agent.stream else None, turn)

            system = system_text(agent.instructions, extra)
            # A reply that calls tools is flushed before they run; a final one is the run's output,
            # flushed with run.completed (or the memory step) in the same disk flush, and not even
            # waited for when the journal's next append follows with nothing outside the journal
            # done in between (a refusal is then raised by that append).
            try:
                reply = ctx.call("agent.llm", "llm", {"model": agent.model, "turn": turn}, call_model,
                                 durable=_calls_tools, wait=bool(agent.cache or agent.memory))
            except EmptyReplyError:
                saved.made += 2 if ran[0] else 0  # the run fails, but those calls were paid
                _record_savings(agent, ctx, saved)
                raise
            if ran[0]:
                saved.made += 1
            else:  # a resumed run: the recorded reply is not paid for twice
                saved.avoided(reply, resumed=True)
            saved.made += int(reply.get("empty_retries") or 0)
            if reply["text"] and not streamed[0]:  # replayed from the journal, or not streamed
                emit({"type": "text", "delta": reply["text"]})
        msg = {"role": "assistant", "content": reply["text"], "tool_calls": reply["tool_calls"], "ts": reply["ts"]}
        msgs.append(msg)
        new.append(msg)
        if not reply["tool_calls"]:
            if plan is not None and replaying:
                agent._cache_hit(ctx.journal, plan["entry"])
            elif key is not None and log is not None:
                log.append({"name": "agent.turn", "args": {}, "reply": reply, "results": []})
                cache.store(agent, ctx.journal, key, ctx_key, text, log, ctx.run_id)
            if _record_savings(agent, ctx, saved):
                emit(saved.event())
            if agent.memory:
                ctx.call("agent.memory.remember", "tool", {"skill": agent.memory},
                         lambda: agent._remember(ctx.journal, f"Task: {text}\nAnswer: {reply['text']}"))
            return {"text": reply["text"], "messages": new}
        # Replaying a cached trajectory, the next turn runs tools with no append before them:
        # each result is waited for, so none runs after a refused append.
        followed = cache.plan_followed(similar, reply["tool_calls"]) if turn == 0 and similar else None
        if followed is not None:
            ran_calls, results, sizes = cache.run_plan(
                agent, followed, reply["tool_calls"], reply["ts"],
                # each group's results are waited for: the next group runs with no append before it
                lambda calls: run_tools(agent, ctx, calls, reply["ts"], emit, wait=True, tools=tools),
                lambda c: _skipped(c, reply["ts"], emit))
            msg["tool_calls"] = ran_calls  # the model's next call sees the ids the plan's calls really used
            emit({"type": "cache", "plan": "followed", "similar": followed["entry"]})
            if log is not None:
                log = _plan_log(log, {**reply, "tool_calls": ran_calls}, results, sizes)
        else:
            results = run_tools(agent, ctx, reply["tool_calls"], reply["ts"], emit, wait=replaying, tools=tools)
            if log is not None:
                log.append({"name": "agent.turn", "args": {}, "reply": reply,
                            "results": [r["content"] for r in results]})
        msgs.extend(results)
        new.extend(results)
        if replaying and not replay.matches(turn, [c["name"] for c in reply["tool_calls"]],
                                            [r["content"] for r in results], checks):
            replaying = False  # a tool answered differently: the model takes over from here
            agent._cache_diverged(ctx.journal, plan["entry"])
            emit({"type": "cache", "diverged": turn})
    _record_savings(agent, ctx, saved)
    raise TurnLimitError(f"agent {agent.name!r}: no final answer after max_turns={agent.max_turns} model calls")


def _record_savings(agent: Agent, ctx: RunContext, saved: cache.Savings) -> bool:
    """Record the run's savings (also of a run that fails: its calls were paid); False if none to record."""
    if not (agent.cache or saved.any()):
        return False
    agent._store(ctx.journal).record_savings(ctx.run_id, agent.name, saved.row())
    return True


def _skipped(call: dict[str, Any], ts: str, emit: Emit) -> dict[str, Any]:
    emit({"type": "tool_call", "id": call["id"], "name": call["name"], "arguments": call["arguments"]})
    emit({"type": "tool_result", "id": call["id"], "name": call["name"], "content": cache.SKIPPED, "error": True})
    return {"role": "tool", "tool_call_id": call["id"], "name": call["name"], "content": cache.SKIPPED,
            "error": True, "ts": ts}


def _plan_log(log: list[dict[str, Any]], reply: dict[str, Any], results: list[dict[str, Any]],
              sizes: list[int]) -> list[dict[str, Any]] | None:
    """The trajectory of a followed plan, one turn per group as the calls ran (None if a call was
    skipped: replaying it would run what never ran)."""
    if any(r["content"] == cache.SKIPPED for r in results):
        return None
    pos = 0
    for k, n in enumerate(sizes):
        part = {**reply, "text": reply["text"] if k == 0 else "", "tool_calls": reply["tool_calls"][pos:pos + n]}
        if k:  # one model call made every group: a replay saves it once (see cache.Savings)
            part.update(usage={}, seconds=0.0, plan_group=k)
        log.append({"name": "agent.turn", "args": {}, "reply": part,
                    "results": [r["content"] for r in results[pos:pos + n]]})
        pos += n
    return log
