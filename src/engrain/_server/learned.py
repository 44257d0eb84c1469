"""``/api/learned``: review the routines agents learned: list, show, edit, promote, delete."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import ConfigDict, Field

from .contract import one_of
from .state import Body, state_of

router = APIRouter(tags=["learned routines"])

_STORES: dict[int, Any] = {}


class Edit(Body):
    """A human's version of the routine: ``routine.yaml`` as text, or its data (exactly one)."""

    model_config = ConfigDict(json_schema_extra=one_of({"yaml": {"type": "string"}}, {"routine": {"type": "object"}}))
    yaml: str | None = Field(default=None, max_length=256 * 1024, description="The routine.yaml text.")
    routine: dict[str, Any] | None = Field(default=None, description="The routine.yaml data as JSON.")


class Promote(Body):
    """Review state to set: always stated, so no request grants trust by default."""

    # Required, no default: a POST without a body (which a page of another site can send without a
    # preflight) must not promote a routine to trusted.
    trusted: bool = Field(description="true: reviewed; false: take it back (no agent offers it, nor runs "
                                      "an offer made before, until it is promoted again).")


def _store(request: Request) -> tuple[Any, Any]:
    state = state_of(request)
    mem = state.memory()
    s = _STORES.get(id(mem))
    if s is None or s.memory is not mem:
        from .._agent.learn import LearnedRoutines

        with state.memory_lock:
            s = _STORES[id(mem)] = LearnedRoutines(mem)
    return s, state.memory_lock


@router.get("/learned")
def list_learned(request: Request, skill: str | None = Query(default=None, max_length=200),
                 status: Literal["candidate", "confirmed", "not_compilable"] | None = Query(default=None)
                 ) -> list[dict[str, Any]]:
    """Learned routines (of a skill, with a status), newest first."""
    store, lock = _store(request)
    with lock:
        return [r.to_dict() for r in store.list(skill, status)]


@router.get("/learned/{ref:segment}")
def show_learned(request: Request, ref: str, skill: str | None = Query(default=None, max_length=200)) -> dict[str, Any]:
    """One learned routine with its routine.yaml data, the explanation of each argument and its evidence runs."""
    store, lock = _store(request)
    with lock:
        return store.get(ref, skill).to_dict(full=True)


@router.put("/learned/{ref:segment}")
def edit_learned(request: Request, ref: str, body: Edit, skill: str | None = Query(default=None, max_length=200)) -> dict[str, Any]:
    """Replace the routine with a human's version (checked; 422 lists every problem)."""
    from .._errors import MemoryInputError

    if (body.yaml is None) == (body.routine is None):
        raise MemoryInputError("give exactly one of 'yaml' (text) or 'routine' (data)")
    store, lock = _store(request)
    with lock:
        return store.edit(ref, body.yaml if body.yaml is not None else body.routine, skill).to_dict()


@router.post("/learned/{ref:segment}/promote")
def promote_learned(request: Request, ref: str, body: Promote,
                    skill: str | None = Query(default=None, max_length=200)) -> dict[str, Any]:
    """Mark the routine reviewed (``trusted: true``), or take that back (``false``); no body: 422."""
    store, lock = _store(request)
    with lock:
        return store.promote(ref, body.trusted, skill).to_dict()


@router.delete("/learned/{ref:segment}")
def delete_learned(request: Request, ref: str, skill: str | None = Query(default=None, max_length=200)) -> dict[str, Any]:
    """Delete a learned routine."""
    store, lock = _store(request)
    with lock:
        r = store.delete(ref, skill)
    return {"deleted": r.id, "name": r.name}
