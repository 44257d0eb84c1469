"""``/api/runs/{id}/fork`` and ``/api/queues``: time travel and the queues/workers view."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from .runs import _require
from .._errors import EngrainError
from .state import ApiError, Body, state_of

router = APIRouter(tags=["runs"])


class Fork(Body):
    """Fork a run at a step."""

    at_step: int = Field(ge=0, le=10_000_000, description="Reuse steps 0..at_step-1, execute from at_step.")
    run_id: str | None = Field(default=None, min_length=1, max_length=200, description="Id of the new run.")


@router.post("/runs/{run_id:segment}/fork")
def fork_run(request: Request, run_id: str, body: Fork) -> dict[str, Any]:
    """A new run reusing the recorded results of the first ``at_step`` steps; resume it with its agent.

    A fork of a run the runtime executes (an agent's, a routine's, ``engrain.run``'s) is
    resumed by its agent, which executes the steps from ``at_step`` again: only a server
    started with ``--allow-fork`` lets API clients do that (403 ``ForkNotAllowedError``
    otherwise; ``engrain fork`` and ``engrain.fork`` are the operator's way). A client's own
    run forks freely: the fork is the client's too, never executed.
    """
    from .._durable.identity import is_client_run
    from .._durable.operate import fork

    state = state_of(request)
    _require(request, run_id)
    if not state.allow_fork:
        head = state.journal.read(run_id, -1)[:1]
        if not (head and is_client_run(head[0].data)):
            raise ApiError(403, "ForkNotAllowedError",
                           f"run {run_id!r} is executed by engrain's runtime: forking it over HTTP re-executes its"
                           " later steps, which this server does not allow (start it with --allow-fork, or fork"
                           " with `engrain fork` / engrain.fork)")
    try:
        new = fork(run_id, body.at_step, run_id=body.run_id, journal=state.journal)
    except EngrainError as e:
        if type(e) is not EngrainError:
            raise
        # The request is well formed; the run's state (its steps, an existing new id) refuses it.
        raise ApiError(409, "ForkConflictError", str(e)) from None
    return {"run_id": new, "source": run_id, "at_step": body.at_step}


@router.get("/queues", tags=["queues"])
def list_queues(request: Request) -> dict[str, Any]:
    """Queues (limits, queued and running counts) and workers (live lease holders and their runs).

    Only leases not yet expired count: a worker that died (its leases expired, its runs waiting for
    another worker) is not listed as a live holder.
    """
    from .._workers.queues import queues

    journal = state_of(request).journal
    workers: dict[str, list[str]] = {}
    now = time.time()
    for r in journal.runs(status="running", limit=1000):
        # A lease past its time is a holder that stopped renewing (died, or stalled): not a live worker.
        if r.lease_owner and r.lease_until is not None and r.lease_until > now:
            workers.setdefault(r.lease_owner, []).append(r.run_id)
    return {
        "queues": [q.to_dict() for q in queues(journal=journal)],
        "workers": [{"owner": o, "runs": sorted(ids)} for o, ids in sorted(workers.items())],
    }
