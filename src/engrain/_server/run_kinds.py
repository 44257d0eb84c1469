"""What a run in the store *is*, for listings: a user's run, an internal one, or a framework's log.

The journal keeps everything as runs, and some are not runs a person started: an LLM
agent's definition (``agentdef:<name>``), each behavior-cache call (tagged
``engrain.cache``), and the append-only logs framework adapters keep as runs (a LangGraph
thread, an OpenAI Agents session), which never finish and so would show as ``running``
forever. ``GET /api/runs`` labels each with a ``kind`` and can leave the internal ones out;
``GET /api/runs/{id}`` describes a log by its entries (a thread by its last checkpoint).

The tags are literals here (not imported from the adapters, which import their frameworks).
"""

from __future__ import annotations

from typing import Any

from .. import _events as ev

#: Tags of runs the runtime makes for itself: an LLM agent's definition, a cache call.
INTERNAL_TAGS = frozenset({"llm-agent-definition", "engrain.cache"})
#: Adapter logs: tag -> (run id prefix, kind shown).
LOG_KINDS = {"langgraph": ("langgraph:", "thread"), "openai-agents": ("openai-agents:", "session")}
#: How many rows one listing may scan to fill a page when internal runs are left out.
SCAN_LIMIT = 20_000


def kind_of(run_id: str, tags: list[str]) -> str:
    """``run``, ``internal``, or a log's kind (``thread``, ``session``).

    A run an HTTP client wrote (tagged ``client``) is always a ``run``: whatever other tags it
    carries, it is not the runtime's (hidden as internal) nor an adapter's log (read as its checkpoints).
    """
    if ev.CLIENT_TAG in tags:
        return "run"
    for tag, (prefix, kind) in LOG_KINDS.items():
        if tag in tags and run_id.startswith(prefix):
            return kind
    return "internal" if INTERNAL_TAGS.intersection(tags) else "run"


def listed(info: Any) -> dict[str, Any]:
    """A run's summary for listings, with its ``kind``."""
    return {**info.to_dict(), "kind": kind_of(info.run_id, info.tags)}


def runs_page(journal: Any, *, status: Any, tag: str | None, task: str | None, limit: int, offset: int,
              internal: bool) -> list[dict[str, Any]]:
    """One page of runs; without ``internal``, the page (and ``offset``) count user runs only."""
    if internal:
        return [listed(r) for r in journal.runs(status=status, tag=tag, task=task, limit=limit, offset=offset)]
    out: list[dict[str, Any]] = []
    skip, at, batch = offset, 0, max(limit, 200)
    while len(out) < limit and at < SCAN_LIMIT + offset:
        page = journal.runs(status=status, tag=tag, task=task, limit=batch, offset=at)
        for r in page:
            row = listed(r)
            if row["kind"] == "internal":
                continue
            if skip:
                skip -= 1
                continue
            out.append(row)
            if len(out) == limit:
                break
        if len(page) < batch:
            break
        at += batch
    return out


def _names(value: Any) -> list[str]:
    """A checkpoint's channels if they are a list of strings, else none (the UI joins them)."""
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else []


def log_view(info: Any, events: list[Any]) -> dict[str, Any] | None:
    """For an adapter's log: its kind, entry count, and last checkpoint (a thread) or last entry."""
    kind = kind_of(info.run_id, info.tags)
    if kind not in ("thread", "session"):
        return None
    entries = [e for e in events if e.kind == ev.LOG_ENTRY]
    checkpoints = [e for e in entries if e.name == "checkpoint"]
    view: dict[str, Any] = {"kind": kind, "id": info.run_id.split(":", 1)[1], "entries": len(entries),
                            "checkpoints": len(checkpoints), "last": None, "history": []}
    for e in checkpoints[-20:]:
        summary = e.data.get("summary") if isinstance(e.data.get("summary"), dict) else {}
        view["history"].append({"seq": e.seq, "ts": e.ts, "id": e.data.get("id"), "ns": e.data.get("ns", ""),
                                "step": summary.get("step"), "source": summary.get("source"),
                                "channels": _names(summary.get("channels"))})
    if view["history"]:
        view["last"] = view["history"][-1]
    elif entries:
        view["last"] = {"seq": entries[-1].seq, "ts": entries[-1].ts, "name": entries[-1].name}
    view["history"].reverse()
    return view
