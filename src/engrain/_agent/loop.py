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
import json
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .._durable.context import RunContext, StepRecord, _current, _step_key
from .._errors import NotJSONError
from .providers import system_text, utc_iso

# ``agent`` below is an engrain.Agent (not imported: agent.py imports this module)
Agent = Any

Emit = Callable[[dict[str, Any]], None]
MAX_RESULT = 64 * 1024  # characters of one tool result shown to the model
EVICT_AFTER = 3  # divergences in a row that evict a cached trajectory


class TurnLimitError(RuntimeError):
    """The model was still calling tools after ``max_turns`` model calls (the run fails)."""


def _content(value: Any) -> str:
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
              wait: bool = True) -> list[dict[str, Any]]:
    """Answer one model reply's tool calls: one tool message per call, in the model's order.

    ``wait=False`` when a model call comes next: each result's append is sent
    without waiting for the store's answer (see ``Journal.append``), and the
    model step's append raises its failure.
    """
    out: list[dict[str, Any]] = []
    pending: list[tuple[int, Any, Any, dict[str, Any]]] = []
    for c in calls:
        emit({"type": "tool_call", "id": c["id"], "name": c["name"], "arguments": c["arguments"]})
        msg = {"role": "tool", "tool_call_id": c["id"], "name": c["name"], "content": "", "error": False, "ts": ts}
        out.append(msg)
        tool = agent.tools.get(c["name"])
        if tool is None:
            known = ", ".join(sorted(agent.tools)) or "none"
            msg.update(content=f"error: unknown tool {c['name']!r}; available tools: {known}", error=True)
            continue
        try:
            args = tool.check(c["arguments"])
        except ValueError as e:
            msg.update(content=f"error: bad arguments for tool {tool.name!r}: {e}", error=True)
            continue
        step = ctx._begin(tool.name, "tool", args)
        if isinstance(step, StepRecord):  # recorded: its result (or error) comes from the journal
            if step.state == "completed":
                msg["content"] = _content(step.result)
            else:
                msg.update(content=_error(step.error_type, step.message), error=True)
        else:
            pending.append((len(out) - 1, tool, step, args))

    def execute(item: tuple[int, Any, Any, dict[str, Any]]) -> None:
        i, tool, step, args = item
        try:
            result = _run_thunk(step.key, lambda: tool.invoke(args))
        except Exception as e:
            ctx._fail(step, e)
            out[i].update(content=_error(type(e).__name__, str(e)), error=True)
            return
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


def _canonical(task: str) -> str:
    return re.sub(r"\s+", " ", task).strip()


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
    plan, key = None, None
    if agent.cache:
        from .._cache.store import key as _key

        key = _key("engrain.agent", agent.name, agent.model, agent.instructions,
                   [t.spec() for t in agent.tools.values()], [(m["role"], m["content"]) for m in history],
                   _canonical(text), recalled)
        plan = ctx.call("agent.cache.lookup", "tool", {"key": key}, lambda: agent._cache_lookup(ctx.journal, key))
        emit({"type": "cache", "hit": plan is not None})
    log: list[dict[str, Any]] = []
    replaying = plan is not None
    specs = [t.spec() for t in agent.tools.values()]
    for turn in range(agent.max_turns):
        if replaying:
            reply = {**plan["turns"][turn]["reply"], "ts": user["ts"]}
            if reply["text"]:
                emit({"type": "text", "delta": reply["text"]})
        else:
            streamed = [False]

            def delta(piece: str) -> None:
                streamed[0] = True
                emit({"type": "text", "delta": piece})
                if on_delta is not None:
                    on_delta(piece)
                # Offer the GIL to the thread forwarding events: otherwise it waits while this one
                # parses the rest of a burst of chunks, and the first token reaches the user late.
                time.sleep(0)

            system = system_text(agent.instructions, extra)
            # A reply that calls tools is flushed before they run; a final one is the run's output,
            # flushed with run.completed (or the memory step) in the same disk flush, and not even
            # waited for when the journal's next append follows with nothing outside the journal
            # done in between (a refusal is then raised by that append).
            reply = ctx.call("agent.llm", "llm", {"model": agent.model, "turn": turn},
                             lambda: agent.provider.complete(system, msgs, specs, delta if agent.stream else None),
                             durable=_calls_tools, wait=bool(agent.cache or agent.memory))
            if reply["text"] and not streamed[0]:  # replayed from the journal, or not streamed
                emit({"type": "text", "delta": reply["text"]})
        msg = {"role": "assistant", "content": reply["text"], "tool_calls": reply["tool_calls"], "ts": reply["ts"]}
        msgs.append(msg)
        new.append(msg)
        if not reply["tool_calls"]:
            if plan is not None and replaying:
                agent._cache_hit(ctx.journal, plan["entry"])
            elif key is not None:
                log.append({"name": "agent.turn", "args": {}, "reply": reply, "results": []})
                agent._cache_store(ctx.journal, key, text, log, ctx.run_id)
            if agent.memory:
                ctx.call("agent.memory.remember", "tool", {"skill": agent.memory},
                         lambda: agent._remember(ctx.journal, f"Task: {text}\nAnswer: {reply['text']}"))
            return {"text": reply["text"], "messages": new}
        # Replaying a cached trajectory, the next turn runs tools with no append before them:
        # each result is waited for, so none runs after a refused append.
        results = run_tools(agent, ctx, reply["tool_calls"], reply["ts"], emit, wait=replaying)
        msgs.extend(results)
        new.extend(results)
        contents = [r["content"] for r in results]
        log.append({"name": "agent.turn", "args": {}, "reply": reply, "results": contents})
        if replaying and contents != plan["turns"][turn]["results"]:
            replaying = False  # a tool answered differently: the model takes over from here
            agent._cache_diverged(ctx.journal, plan["entry"])
            emit({"type": "cache", "diverged": turn})
    raise TurnLimitError(f"agent {agent.name!r}: no final answer after max_turns={agent.max_turns} model calls")
