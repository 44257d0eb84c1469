"""The agent's behavior cache: what a lookup keys on, what is stored, plans for reworded tasks,
and what each run saved.

A task's key is everything the model's first reply depends on: the agent's
name, model, instructions and tool declarations, the session's earlier
messages, the skill memory recalled for it, and the task text with whitespace
folded. An exact match replays the recorded trajectory (see :mod:`.loop` and
:mod:`.volatile`). An answer given without any tool call has nothing to check
on replay, so it is stored only when the agent asks for it (``answers_ttl=``
seconds) and replayed only within that time.

With an ``embedder``, a task that misses is compared with the cached tasks of
the same context (everything above but the task text). The nearest one at
``similar_threshold`` or more is never replayed: its tool calls are shown to
the model as a proposed plan (:func:`plan_text`), which it may take whole in
one reply, edit, or ignore. Taken whole or edited, the calls run in the
plan's order, group by group (:func:`run_plan`), and a call whose recorded
arguments came from an earlier call's result is not run once that result
differs from the plan's: the model sees why and calls again.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from .volatile import Replayer, _parse

Agent = Any
PLANS = 3  # similar tasks proposed at most: the nearest by embedding is often a sibling (another entity)
MAX_PLAN = 16 * 1024  # characters of one plan's calls shown to the model; longer trajectories are not proposed
PLAN_OPEN, PLAN_CLOSE = "<plan>", "</plan>"
SKIPPED = ("error: not run: an earlier call of the plan returned something other than the plan's result, and "
           "this call's arguments came from that result in the plan; call it again with the right arguments if "
           "it is still needed")
_vectors: dict[str, Any] = {}
_vectors_lock = threading.Lock()


def canonical(task: str) -> str:
    """The task with whitespace folded: what the key holds."""
    return re.sub(r"\s+", " ", task).strip()


def keys(agent: Agent, history: list[dict[str, Any]], text: str, recalled: list[str]) -> tuple[str, str]:
    """``(task key, context key)``: the context key is the task key without the task text."""
    from .._cache.store import key as _key

    specs = [t.spec() for t in agent.tools.values()]
    past = [(m["role"], m["content"]) for m in history]
    task = _key("engrain.agent", agent.name, agent.model, agent.instructions, specs, past, canonical(text), recalled)
    ctx = _key("engrain.agent.context", agent.name, agent.model, agent.instructions, specs, past, recalled)
    return task, ctx


def _vector(agent: Agent, canon: str) -> Any:
    from .._cache import semantic

    with _vectors_lock:
        v = _vectors.get(canon)
    if v is None:
        v = semantic.unit(agent.embedder, canon)
        with _vectors_lock:
            if len(_vectors) >= 256:
                _vectors.clear()
            _vectors[canon] = v
    return v


def _answer_only(steps: list[dict[str, Any]]) -> bool:
    return all(not (s.get("reply") or {}).get("tool_calls") for s in steps)


def lookup(agent: Agent, journal: Any, key: str, ctx_key: str, task: str) -> dict[str, Any] | None:
    """The cached trajectory for ``key`` (``{"entry", "turns"}``), or the most similar tasks' as plans
    (``{"similar": [{"entry", "task", "turns", "score"}, ...]}``, at most :data:`PLANS`), or None."""
    store = agent._store(journal)
    store.bump("lookups")
    now = time.time()
    for e in store.candidates(key, limit=3):
        last = (e.steps[-1].get("reply") or {}) if e.steps else {}
        if not (last.get("text") or "").strip() and not last.get("tool_calls"):
            store.evict(e.id)  # an empty answer recorded before empty replies were refused: never replayed
            continue
        if _answer_only(e.steps):
            if agent.answers_ttl is None or now - e.created > agent.answers_ttl:
                store.evict(e.id)  # expired (or cached before answers needed answers_ttl=)
                continue
        return {"entry": e.id, "turns": e.steps}
    store.bump("misses")
    if agent.embedder is None:
        return None
    from .._cache import semantic

    pool = [e for e in store.with_embeddings(ctx_key) if not _answer_only(e.steps)
            and len(json.dumps(_groups({"turns": e.steps}))) <= MAX_PLAN]
    found = semantic.nearest(pool, _vector(agent, canonical(task)), agent.similar_threshold, PLANS) if pool else []
    if not found:
        return None
    store.bump("suggested")
    return {"similar": [{"entry": e.id, "task": e.task, "turns": e.steps, "score": round(s, 4)} for e, s in found]}


def store(agent: Agent, journal: Any, key: str, ctx_key: str, task: str, turns: list[dict[str, Any]],
          run_id: str) -> bool:
    """File a finished run's trajectory; an answer without tool calls only with ``answers_ttl``."""
    from .._cache.store import Entry

    if _answer_only(turns) and agent.answers_ttl is None:
        return False
    now = time.time()
    canon = canonical(task)
    vec = [float(x) for x in _vector(agent, canon)] if agent.embedder is not None else None
    tags = [f"llm-agent:{agent.name}"]
    agent._store(journal).put(Entry(
        id=os.urandom(8).hex(), task_key=key, tags_key=ctx_key, task=canon, tags=tags, steps=turns,
        output={"value": turns[-1]["reply"]["text"]}, run_id=run_id, created=now, last_used=now, embedding=vec,
    ))
    return True


# -- proposed plans ----------------------------------------------------------------


def _tool_turns(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t for t in turns if t["reply"].get("tool_calls")]


def _groups(similar: dict[str, Any]) -> list[list[dict[str, Any]]]:
    return [[{"name": c["name"], "arguments": _args(c)} for c in t["reply"]["tool_calls"]]
            for t in _tool_turns(similar["turns"])]


def plan_text(similar: list[dict[str, Any]]) -> str:
    """The system message's section proposing similar tasks' tool calls to the model."""
    plans = "\n".join(f"{i}. for the task {json.dumps(s['task'])}: {PLAN_OPEN}{json.dumps(_groups(s))}{PLAN_CLOSE}"
                      for i, s in enumerate(similar, 1))
    return (
        "Similar tasks were done before. Their tool calls, in order (the calls of one group ran together):\n"
        f"{plans}\n"
        "If one of these plans does what the current task asks, reply with all of its tool calls at once, in "
        "its order, with the arguments changed where the current task differs: they run in the plan's order "
        "and you then see every result. If none fits, ignore them and work as usual."
    )


def _calls(similar: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for t in _tool_turns(similar["turns"]) for c in t["reply"]["tool_calls"]]


def plan_followed(similar: list[dict[str, Any]], calls: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The plan whose tool calls a reply makes, in order: the one taken unchanged, else the one with
    those calls whose arguments share the most values with the reply's (the plan it edited: its
    results are what the reply's copied values came from), the nearest on a tie; None when the
    reply follows no plan."""
    made = [(c["name"], c["arguments"]) for c in calls]
    same = [s for s in similar if len(_calls(s)) > 1 and [c["name"] for c in _calls(s)] == [n for n, _ in made]]
    exact = [s for s in same if [(c["name"], c["arguments"]) for c in _calls(s)] == made]
    if exact or not same:
        return (exact or [None])[0]
    mine = [_leaves(_args(c), []) for c in calls]
    return max(same, key=lambda s: sum(len(set(m) & set(_leaves(_args(c), []))) for m, c in zip(mine, _calls(s))))


def _args(call: dict[str, Any]) -> Any:
    return _parse(call["arguments"] or "{}")


def _leaves(value: Any, out: list[str]) -> list[str]:
    if isinstance(value, dict):
        for v in value.values():
            _leaves(v, out)
    elif isinstance(value, list):
        for v in value:
            _leaves(v, out)
    elif not isinstance(value, bool) and value is not None and len(str(value)) >= 2:
        out.append(str(value))
    return out


def _depends(call: dict[str, Any], results: list[str], task: str) -> bool:
    """Whether a call's arguments hold a value of earlier recorded results the task did not name:
    an argument found in a result, or a result's value (6 characters or more) inside an argument
    (an id in a link), in any case (a model copies an address in lower case)."""
    task, results = task.lower(), [r.lower() for r in results]
    args = [v.lower() for v in _leaves(_args(call), [])]
    if any(v not in task and any(v in r for r in results) for v in args):
        return True
    found = {v.lower() for r in results for v in _leaves(_parse(r), []) if len(v) >= 6}
    return any(v not in task and any(v in a for a in args) for v in found)



def run_plan(agent: Agent, similar: dict[str, Any], calls: list[dict[str, Any]], at: str,
             run_group: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
             skipped: Callable[[dict[str, Any]], dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                                        list[int]]:
    """Run a followed plan's calls group by group (``at``: the time of the reply that made them);
    returns the calls as they ran (minted ids carried in), their tool messages and the group sizes.

    A group runs when every earlier group returned the plan's results (with
    the same arguments), or when none of its recorded arguments came from an
    earlier recorded result; otherwise its calls are answered with
    :data:`SKIPPED`. Ids the earlier calls minted are carried into the later
    calls' arguments, as in a replay.
    """
    turns = _tool_turns(similar["turns"])
    replay = Replayer(turns, similar["task"], at=at)  # at: the plan reply's journaled time
    checks = {n: t.result_check for n, t in agent.tools.items()}
    out: list[dict[str, Any]] = []
    ran: list[dict[str, Any]] = []
    sizes: list[int] = []
    on_plan, pos = True, 0
    for g, turn in enumerate(turns):
        recorded = turn["reply"]["tool_calls"]
        mine = calls[pos:pos + len(recorded)]
        pos += len(recorded)
        sizes.append(len(mine))
        # the recorded calls, and the model's own: a value it copied from the plan's results is stale
        if not on_plan and any(_depends(c, [r for t in turns[:g] for r in t["results"]], similar["task"])
                               for c in (*recorded, *mine)):
            out.extend(skipped(c) for c in mine)
            ran.extend(mine)
            continue
        if on_plan and replay.subs:
            mine = [{**c, "arguments": replay._sub(c["arguments"])} for c in mine]
        ran.extend(mine)
        msgs = run_group(mine)
        out.extend(msgs)
        if on_plan:
            expected = replay.reply(g)["tool_calls"]
            on_plan = [c["arguments"] for c in mine] == [c["arguments"] for c in expected] and \
                replay.matches(g, [c["name"] for c in mine], [m["content"] for m in msgs], checks)
    return ran, out, sizes


# -- savings -----------------------------------------------------------------------


class Savings:
    """What one run paid (LLM calls made) and avoided (replayed from the cache or, on a resume,
    from the journal), with the recorded usage and model time of the avoided calls.

    A call a resume takes from the journal was paid once, by the attempt a crash cut short (which
    recorded no savings): it counts as made, and as not paid twice."""

    __slots__ = ("made", "cache", "resumed", "input", "output", "seconds")

    def __init__(self) -> None:
        self.made = self.cache = self.resumed = self.input = self.output = 0
        self.seconds = 0.0

    def avoided(self, reply: dict[str, Any], resumed: bool = False) -> None:
        """A model call not paid: ``reply`` came from the cache (or from the journal, ``resumed``)."""
        if reply.get("plan_group"):
            return  # a later group of a followed plan: its calls came with the first group's model call
        if resumed:
            self.resumed += 1
        else:
            self.cache += 1
        usage = reply.get("usage") or {}
        self.input += int(usage.get("input") or 0)
        self.output += int(usage.get("output") or 0)
        self.seconds += float(reply.get("seconds") or 0.0)

    def any(self) -> bool:
        return bool(self.cache or self.resumed)

    def row(self) -> dict[str, Any]:
        return {"calls_made": self.made + self.resumed, "cache_calls": self.cache, "resumed_calls": self.resumed,
                "input_tokens": self.input, "output_tokens": self.output, "model_seconds": round(self.seconds, 4)}

    def event(self) -> dict[str, Any]:
        return {"type": "cache", "saved": self.row()}
