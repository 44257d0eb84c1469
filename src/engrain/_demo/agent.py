"""``engrain demo`` part 5: the agent engine.

An ``engrain.Agent`` with two tools refunds an order. Offline, its model is a
*scripted model*: a local server speaking the OpenAI wire format that answers
from a fixed script (no LLM), reached through the real ``openai`` SDK. With
``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY`` or ``OPENAI_BASE_URL`` set, the same
tour runs on that real model (``ENGRAIN_DEMO_MODEL`` picks the model).

The tour interrupts the run after its first tool call, as a crash would, and
resumes it: recorded model replies and tool results are replayed, nothing is
paid or executed twice. Then the behavior cache answers the same task with
zero model calls, and a chat session survives a restart with each message's
original time.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from typing import Any

from .._journal import Journal

TASK = "Refund order 42: it arrived damaged."


def _scripted_reply(api: str, body: dict[str, Any]) -> Any:
    """The scripted model's 'thinking': fixed replies chosen from the conversation so far."""
    from .._agent.scripted import say, tool_call

    msgs = body.get("messages", [])
    last = msgs[-1] if msgs else {}
    if last.get("role") == "tool":
        if "refunded" in last.get("content", ""):
            return say("Refunded 19.50 EUR for order 42, which arrived damaged.")
        return tool_call("refund", order_id=42, amount=19.5)
    text = str(last.get("content", ""))
    if "Refund order 42" in text:
        return tool_call("lookup_order", order_id=42)
    code = re.search(r"secret code is (\d+)", text)
    if code:
        return say(f"Noted: the secret code is {code.group(1)}.")
    if "secret code" in text:
        for m in msgs:
            found = re.match(r"\[([^\]]+)\] .*secret code is (\d+)", str(m.get("content", "")))
            if m.get("role") == "user" and found:
                return say(f"The secret code is {found.group(2)}; you told me at {found.group(1)}.")
    return say("I can look up and refund orders.")


def _real_model() -> tuple[str, str] | None:
    """(model, how it is reached) when the environment names a real model, else None."""
    chosen = os.environ.get("ENGRAIN_DEMO_MODEL")
    if os.environ.get("OPENAI_BASE_URL"):
        return chosen or "openai:llama3.1", f"OpenAI-compatible server {os.environ['OPENAI_BASE_URL']}"
    if os.environ.get("OPENAI_API_KEY"):
        return chosen or "openai:gpt-4.1-mini", "OpenAI (OPENAI_API_KEY)"
    if os.environ.get("ANTHROPIC_API_KEY"):
        return chosen or "anthropic:claude-haiku-4-5", "Anthropic (ANTHROPIC_API_KEY)"
    return None


def _llm_calls(journal: Journal, run_id: str) -> int:
    """Model calls a run paid for and recorded: every outcome of an ``agent.llm`` step.

    Steps journal only their outcome, so a call a crash cut short is not here; the
    scripted model's own count (printed below) includes it.
    """
    return sum(1 for e in journal.read(run_id)
               if e.kind in ("step.completed", "step.failed") and e.name == "agent.llm")


class _Interrupt(KeyboardInterrupt):
    """Stops the run the way a crash would: a BaseException, so the run stays resumable."""


def agent_section(journal: Journal, workdir: Any, out: Callable[[str], None]) -> bool:
    """Part 5: a durable LLM agent: resume after a crash, a cache hit with 0 model calls, a session."""
    from .._agent import sessions
    from .._agent.agent import Agent
    from .._agent.scripted import ScriptedModel

    out("5. The agent engine: an LLM agent whose model calls and tool calls are journaled steps")
    t_start = time.perf_counter()
    import openai  # noqa: F401 - timed apart: the SDK's import is most of this part's time

    sdk = time.perf_counter() - t_start
    real = _real_model()
    scripted = None
    if real is None:
        scripted = ScriptedModel(_scripted_reply).start()
        model, base_url = "openai:scripted-model", scripted.openai_url
        out("   model: a scripted model (a local stub server speaking the OpenAI wire format, no LLM);")
        out("          set OPENAI_API_KEY, ANTHROPIC_API_KEY or OPENAI_BASE_URL to run this part on a real model")
    else:
        model, base_url = real[0], None
        out(f"   model: {model} via {real[1]}")
    effects: list[str] = []

    def lookup_order(order_id: int) -> dict:
        """Look up an order: its status, amount and delivery notes."""
        effects.append(f"lookup_order {order_id}")
        return {"order": order_id, "amount_eur": 19.5, "delivered": "damaged box"}

    def refund(order_id: int, amount: float) -> str:
        """Refund an amount in EUR for an order. A payment: it must never run twice."""
        effects.append(f"refund {order_id} {amount}")
        return f"refunded {amount} EUR for order {order_id}"

    ok = True
    try:
        agent = Agent("support-demo", model, "You are a support agent. Use the tools to look up and refund orders.",
                      [lookup_order, refund], base_url=base_url, journal=journal, max_turns=6)
        run_id = f"demo-agent-{os.urandom(3).hex()}"

        def crash_after_first_tool(e: dict[str, Any]) -> None:
            if e["type"] == "tool_result":
                raise _Interrupt

        try:
            agent.run(TASK, run_id=run_id, on_event=crash_after_first_tool)
            out("   (the model answered without calling a tool, so there was nothing to interrupt)")
        except _Interrupt:
            out(f"   run {run_id}: interrupted right after its first tool call, as a crash would "
                f"({_llm_calls(journal, run_id)} model call, tools run: {', '.join(effects)})")
        before = len(effects)
        calls_before = _llm_calls(journal, run_id)
        res = agent.run(TASK, run_id=run_id)
        out(f"   resumed with the same run id: {res.status} — {res.output!r}")
        out(f"   {res.replayed} steps replayed from the journal, {res.executed} executed now; "
            f"model calls {calls_before} before + {_llm_calls(journal, run_id) - calls_before} after the crash")
        twice = len(effects) - len(set(effects))
        out(f"   tool executions: {', '.join(effects)} (run twice: {twice})")
        ok = ok and bool(res) and twice == 0 and len(effects) >= before

        cached = Agent("support-cache", model, agent.instructions, [lookup_order, refund], base_url=base_url,
                       journal=journal, cache=True, max_turns=6)
        first = cached.run(TASK)
        hit = cached.run(TASK)
        n_first, n_hit = _llm_calls(journal, first.run_id), _llm_calls(journal, hit.run_id)
        out(f"   behavior cache: the same task again → {n_hit} model calls (first time: {n_first}); "
            f"answer {hit.output!r}")
        ok = ok and n_hit == 0 and hit.output == first.output

        session = f"demo-{os.urandom(3).hex()}"
        chat = Agent("assistant-demo", model, "You are a helpful assistant. Keep answers short.",
                     base_url=base_url, journal=journal)
        said = "".join(e.get("delta", "") for e in chat.chat("Remember that the secret code is 42.", session=session))
        out(f"   chat, session {session}: 'Remember that the secret code is 42.' → {said!r}")
        sessions._finished.clear()  # what a restarted process starts with: nothing but the journal
        again = Agent("assistant-demo", model, chat.instructions, base_url=base_url, journal=journal)
        events = list(again.chat("What is the secret code?", session=session))
        answer = "".join(e.get("delta", "") for e in events if e["type"] == "text")
        out(f"   after a restart, same session: 'What is the secret code?' → {answer!r}")
        for m in again.history(session):
            out(f"     [{m['ts']}] {m['role']:<9} {json.dumps(m['content'])[:70]}")
        ok = ok and events[-1]["status"] == "ok" and "42" in answer
        if scripted is not None:
            out(f"   the scripted model received {scripted.calls} requests in this part")
    except Exception as e:  # a real model or network can fail: report it, do not crash the tour
        out(f"   agent part failed: {type(e).__name__}: {e}")
        ok = False
    finally:
        if scripted is not None:
            scripted.stop()
    out(f"   part 5 took {time.perf_counter() - t_start:.2f} s (importing the openai SDK: {sdk:.2f} s)")
    return ok
