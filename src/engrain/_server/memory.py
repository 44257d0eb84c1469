"""``/api/memory``: remember, recall, consolidate, stats, articles with provenance, export, import, forget, update."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import ConfigDict, Field

from .._memory.filters import MAX_KEY, MAX_KEYS, MAX_VALUE
from .._memory.transfer import MAX_DOCS, MAX_SOURCES, MAX_TEXT
from .contract import one_of
from .state import ApiError, Body, state_of

router = APIRouter(tags=["memory"])


#: Text memory stores: not blank. Any other JSON value is stored as its JSON text.
Text = Annotated[str, Field(pattern=r"\S", max_length=MAX_TEXT)]
Data = Text | dict[str, Any] | list[Any] | int | float | bool


class Remember(Body):
    """One deposit."""

    data: Data = Field(description="Text (not blank) or any other JSON value but null.")
    hint: float | None = Field(default=None, ge=0, le=1, description="Importance from 0 to 1 (etchmem's hint).")
    label: str | None = Field(default=None, max_length=10_000, description="Short topic label.")
    skill: str | None = Field(default=None, max_length=200)
    metadata: dict[str, Any] | None = None
    ttl: float | None = Field(default=None, gt=0, description="Lifetime in seconds (default: the memory's).")


class Recall(Body):
    """A search."""

    query: str = Field(min_length=1, max_length=10_000)
    skill: str | None = Field(default=None, max_length=200)
    top_k: int = Field(default=5, ge=1, le=100)
    hint: float | None = Field(default=None, ge=0, le=1, description="Importance prior kept in the recall event.")
    label: str | None = Field(default=None, max_length=10_000, description="Boost items with this label.")
    where: dict[Annotated[str, Field(min_length=1, max_length=MAX_KEY)],
                Annotated[str, Field(max_length=MAX_VALUE)] | int | Annotated[float, Field(allow_inf_nan=False)]
                | bool | None] | None = Field(
        default=None, max_length=MAX_KEYS, description="Only items whose metadata has these exact values.")


#: A time in seconds since the epoch: finite (an infinite one would be written into exports as non-JSON).
Time = Annotated[float, Field(allow_inf_nan=False)]


class Document(Body):
    """One article of an export (engrain's or etchmem's): every field ``export()`` writes, and etchmem's names.

    A field left out here would be dropped before the import sees it (the body is passed on as parsed).
    """

    format: str | None = Field(default=None, max_length=200)
    id: Text
    content: Text
    skill: str | None = Field(default=None, max_length=200)
    title: str | None = Field(default=None, max_length=MAX_TEXT)
    version: int | None = Field(default=None, ge=1, le=2**63 - 1)
    created: Time | None = None
    updated: Time | None = None
    synthesizer: str | None = Field(default=None, max_length=10_000)
    importance: float | None = Field(default=None, ge=0, le=1)
    metadata: dict[str, Any] | None = None
    sources: list[Any] | None = Field(default=None, max_length=MAX_SOURCES)
    created_at: Time | None = Field(default=None, description="etchmem's name for created.")
    tags: list[Any] | dict[str, Any] | None = Field(default=None, description="etchmem's tags (kept in metadata).")
    source_hashes: list[str] | None = Field(default=None, max_length=MAX_SOURCES, description="etchmem's sources.")


class Import(Body):
    """An export to load: a folder under the server's export dir, or the documents themselves (exactly one)."""

    model_config = ConfigDict(json_schema_extra=one_of({"export_dir": {"type": "string"}},
                                                       {"documents": {"type": "array"}}))

    export_dir: str | None = Field(default=None, min_length=1, max_length=4096)
    documents: list[Document] | None = Field(default=None, max_length=MAX_DOCS)
    skill_map: dict[str, str] | str | None = None


class Forget(Body):
    """What to forget: one id, or a whole skill (exactly one)."""

    model_config = ConfigDict(json_schema_extra=one_of({"id": {"type": "string"}}, {"skill": {"type": "string"}}))

    id: str | None = Field(default=None, min_length=1, max_length=200)
    skill: str | None = Field(default=None, max_length=200)


class Update(Body):
    """New content for a record or an article."""

    id: str = Field(min_length=1, max_length=200)
    data: Data = Field(description="Text (not blank) or any other JSON value but null (an article takes text only).")
    hint: float | None = Field(default=None, ge=0, le=1)
    label: str | None = Field(default=None, max_length=10_000, description="A record's label; an article's title.")
    metadata: dict[str, Any] | None = None


class Consolidate(Body):
    """How much of the buffer to consolidate."""

    num_records: Literal["all"] | Annotated[int, Field(ge=1, le=10**9)] = Field(default="all", description="'all' or a positive count.")
    method: Literal["LIFO", "FIFO"] = "LIFO"


def _mem(request: Request) -> tuple[Any, Any]:
    state = state_of(request)
    return state.memory(), state.memory_lock


@router.post("/memory/remember")
def remember(request: Request, body: Remember) -> dict[str, Any]:
    """Store a record and deposit it in the buffer; returns its id."""
    mem, lock = _mem(request)
    with lock:
        rid = mem.remember(body.data, hint=body.hint, label=body.label, skill=body.skill, metadata=body.metadata,
                           ttl=body.ttl)
    return {"id": rid}


@router.post("/memory/recall")
def recall(request: Request, body: Recall) -> list[dict[str, Any]]:
    """Records and articles most relevant to the query, best first."""
    mem, lock = _mem(request)
    with lock:
        hits = mem.recall(body.query, skill=body.skill, top_k=body.top_k, hint=body.hint, label=body.label,
                          where=body.where)
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
    """Articles with their source records (provenance); a source past its TTL is shown expired, without its
    text, as an export writes it."""
    out, now = [], time.time()
    for a in mem.store.articles(skill=skill):
        srcs = {k: r for k, r in mem.store.records(a.sources).items() if r.expires is None or r.expires > now}
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
    """Write one JSON file per article under the export dir: ``{export_dir, count, documents}``."""
    mem, lock = _mem(request)
    with lock:
        return mem.export()


@router.post("/memory/import")
def import_(request: Request, body: Import) -> dict[str, Any]:
    """Load an export: ``documents`` inline, or ``export_dir`` (a folder inside the server's export dir)."""
    from .._errors import MemoryInputError

    mem, lock = _mem(request)
    if (body.export_dir is None) == (body.documents is None):
        raise MemoryInputError("import: give exactly one of export_dir or documents")
    docs = None if body.documents is None else [d.model_dump(exclude_unset=True) for d in body.documents]
    source: Any = {"documents": docs, "export_dir": "(request body)"}
    if body.export_dir is not None:
        root = Path(mem.export_dir()).resolve()
        missing = ApiError(404, "ExportNotFound", f"import: no export folder {body.export_dir!r} under {root}")
        try:
            folder = (root / body.export_dir).resolve()
            if folder != root and root not in folder.parents:  # a request never reads outside the export root
                raise ApiError(403, "OutsideExportDir", f"import: export_dir must be a folder inside {root}")
            if not folder.is_dir():
                raise missing
        except (OSError, ValueError):  # a name too long, a NUL byte: no such folder either
            raise missing from None
        source = folder
    with lock:
        return mem.import_(source, skill_map=body.skill_map)


@router.post("/memory/forget")
def forget(request: Request, body: Forget) -> dict[str, int]:
    """Delete a record, an article (with its records) or a whole skill."""
    mem, lock = _mem(request)
    with lock:
        if body.id is not None:
            _require_item(mem, body.id)
        return mem.forget(body.id, skill=body.skill)


@router.post("/memory/update")
def update(request: Request, body: Update) -> dict[str, Any]:
    """Replace a record's content (its article is rewritten) or an article's text."""
    mem, lock = _mem(request)
    with lock:
        _require_item(mem, body.id)
        return mem.update(body.id, body.data, hint=body.hint, label=body.label, metadata=body.metadata)


def _require_item(mem: Any, id: str) -> None:
    """404 unless ``id`` is a record or an article (an unknown id is not bad input)."""
    if id not in mem.store.records([id]) and not mem.store.articles(ids=[id]):
        raise ApiError(404, "MemoryItemNotFound", f"no record or article with id {id!r}")
