"""``/api/memory``: remember, recall, consolidate, stats, articles with provenance, export."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import Field

from .state import Body, state_of

router = APIRouter(tags=["memory"])


class Remember(Body):
    """One deposit."""

    data: Any = Field(description="A string or any JSON value.")
    hint: str | None = Field(default=None, max_length=10_000)
    skill: str | None = Field(default=None, max_length=200)
    metadata: dict[str, Any] | None = None
    ttl: float | None = Field(default=None, gt=0, description="Lifetime in seconds (default: the memory's).")


class Recall(Body):
    """A search."""

    query: str = Field(min_length=1, max_length=10_000)
    skill: str | None = Field(default=None, max_length=200)
    top_k: int = Field(default=5, ge=1, le=100)
    hint: str | None = Field(default=None, max_length=10_000)


class Consolidate(Body):
    """How much of the buffer to consolidate."""

    num_records: Literal["all"] | int = Field(default="all", description="'all' or a positive count.")
    method: Literal["LIFO", "FIFO"] = "LIFO"


def _mem(request: Request) -> tuple[Any, Any]:
    state = state_of(request)
    return state.memory(), state.memory_lock


@router.post("/memory/remember")
def remember(request: Request, body: Remember) -> dict[str, Any]:
    """Store a record and deposit it in the buffer; returns its id."""
    mem, lock = _mem(request)
    with lock:
        rid = mem.remember(body.data, hint=body.hint, skill=body.skill, metadata=body.metadata, ttl=body.ttl)
    return {"id": rid}


@router.post("/memory/recall")
def recall(request: Request, body: Recall) -> list[dict[str, Any]]:
    """Records and articles most relevant to the query, best first."""
    mem, lock = _mem(request)
    with lock:
        hits = mem.recall(body.query, skill=body.skill, top_k=body.top_k, hint=body.hint)
    return [h.to_dict() for h in hits]


@router.post("/memory/consolidate")
def consolidate(request: Request, body: Consolidate | None = None) -> dict[str, Any]:
    """Process the buffer into articles."""
    body = body or Consolidate()
    mem, lock = _mem(request)
    with lock:
        return mem.consolidate(body.num_records, body.method).to_dict()


@router.get("/memory/stats")
def stats(request: Request) -> dict[str, Any]:
    """Counts per tier and consolidation counters."""
    mem, lock = _mem(request)
    with lock:
        return mem.stats()


def article_dicts(mem: Any, skill: str | None = None) -> list[dict[str, Any]]:
    """Articles with their source records (provenance)."""
    out = []
    for a in mem.store.articles(skill=skill):
        srcs = mem.store.records(a.sources)
        out.append({
            "id": a.id, "skill": a.skill, "title": a.title, "content": a.content, "version": a.version,
            "created": a.created, "updated": a.updated, "synthesizer": a.synthesizer, "metadata": a.metadata,
            "sources": [
                {"id": s, "content": srcs[s].content, "hint": srcs[s].hint, "created": srcs[s].created,
                 "metadata": srcs[s].metadata} if s in srcs else {"id": s, "expired": True}
                for s in a.sources
            ],
        })
    return out


@router.get("/memory/articles")
def articles(request: Request, skill: str | None = Query(default=None, max_length=200)) -> list[dict[str, Any]]:
    """Synthesized articles with provenance to their records."""
    mem, lock = _mem(request)
    with lock:
        return article_dicts(mem, skill)


@router.post("/memory/export")
def export(request: Request) -> dict[str, Any]:
    """Write one JSON file per article under the export dir; returns the folder."""
    mem, lock = _mem(request)
    with lock:
        path = mem.export()
    return {"path": str(path), "articles": sum(1 for _ in path.glob("*.json"))}
