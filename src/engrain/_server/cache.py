"""``/api/cache``: behavior-cache entries, hit/miss statistics and eviction."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from .state import ApiError, state_of

router = APIRouter(tags=["cache"])


@router.get("/cache/entries")
def entries(
    request: Request,
    limit: int = Query(default=50, ge=1, le=1000),
    offset: int = Query(default=0, ge=0, le=10_000_000),
    task: str | None = Query(default=None, max_length=2000, description="Only entries whose task contains this."),
) -> list[dict[str, Any]]:
    """Cached trajectories, most recently used first."""
    return [e.to_dict() for e in state_of(request).cache_store().entries(limit=limit, offset=offset, task=task)]


def cache_stats(store: Any) -> dict[str, Any]:
    """The store's counters plus ``hit_rate``, ``agent_calls_saved`` (one agent run saved per hit) and
    ``savings``: the agents' LLM calls made and avoided, with the avoided calls' tokens and model time."""
    st: dict[str, Any] = dict(store.stats())
    looked = st.get("hits", 0) + st.get("misses", 0) + st.get("diverged", 0)
    st["hit_rate"] = round(st.get("hits", 0) / looked, 4) if looked else 0.0
    st["agent_calls_saved"] = st.get("hits", 0)
    st["savings"] = store.savings_total()
    return st


@router.get("/cache/stats")
def stats(request: Request) -> dict[str, Any]:
    """Lookups, hits, misses, divergences, entries, hit rate, agent calls saved and LLM savings."""
    return cache_stats(state_of(request).cache_store())


@router.get("/cache/savings")
def savings(
    request: Request,
    run_id: str | None = Query(default=None, max_length=200, description="Only this run's row."),
    limit: int = Query(default=50, ge=1, le=1000),
) -> list[dict[str, Any]]:
    """Per agent run, newest first: LLM calls made, calls replayed from the cache and (resumed runs)
    from the journal, and the input/output tokens and model seconds those replays avoided."""
    return state_of(request).cache_store().savings(limit=limit, run_id=run_id)


@router.get("/cache/savings/series")
def savings_series(
    request: Request,
    buckets: int = Query(default=24, ge=1, le=500),
    since: float | None = Query(default=None, ge=0, description="Unix time to start from (default: first run)."),
) -> dict[str, Any]:
    """LLM calls made and avoided per time bucket (for the cache page's chart)."""
    return state_of(request).cache_store().savings_series(buckets=buckets, since=since)


@router.delete("/cache/entries/{entry_id:segment}")
def evict(request: Request, entry_id: str) -> dict[str, Any]:
    """Delete one cache entry (404 if there is none with that id)."""
    if not state_of(request).cache_store().evict(entry_id):
        raise ApiError(404, "CacheEntryNotFoundError", f"no cache entry {entry_id!r}")
    return {"evicted": entry_id}

