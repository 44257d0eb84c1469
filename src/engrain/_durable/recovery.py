"""Recovery: claim runs whose executor died and resume them.

It sits above both the runner (:mod:`.context`) and the leases (:mod:`.lease`),
because it uses the one to resume what the other says is orphaned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._journal import Journal
from .context import RunResult, default_journal, run
from .lease import DEFAULT_TTL, owner_id


def recover(
    agent: Callable[..., Any],
    *,
    journal: Journal | None = None,
    limit: int = 10,
    ttl: float = DEFAULT_TTL,
) -> list[RunResult]:
    """Claim up to ``limit`` unfinished runs whose executor died and resume each with ``agent``.

    Safe to call from many workers at once: each run is claimed by one of them.
    Returns the results of the resumed runs.
    """
    j = journal or default_journal()
    results = []
    for info in j.claim_runs(owner_id(), ttl, limit):
        started = j.read(info.run_id, after=-1)[:1]
        inputs = started[0].data.get("inputs", {}) if started else {}
        results.append(run(agent, info.task, run_id=info.run_id, inputs=inputs, journal=j))
    return results
