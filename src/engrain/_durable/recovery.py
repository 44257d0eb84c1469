"""Recovery: claim runs whose executor died and resume each with the agent that started it.

It sits above both the runner (:mod:`.context`) and the leases (:mod:`.lease`),
because it uses the one to resume what the other says is orphaned.

A run records who started it in ``run.started`` (see :mod:`.identity`): the
agent's name and a fingerprint of its code. :func:`recover` claims only the
runs of the agents it is given whose recorded code is theirs (any code with
``upgrade=True``), never a run an API client created, filtered in the claim
itself, so no other run is leased, let alone called with the wrong function.
It lists the orphaned runs it leaves, with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import _events as ev
from .._errors import ConfigError
from .._journal import Journal
from .context import RunResult, default_journal
from .execution import run
from .identity import CLIENT_RUN, fingerprint, legacy_hint, refusal
from .lease import DEFAULT_TTL, owner_id
from .outcome import agent_name, check_agent_name

#: Statuses of a :class:`Recovered` beyond a :class:`RunResult`'s.
UNMATCHED = "unmatched"
ERROR = "error"
#: Most orphaned runs of other agents that one recover() call lists (reading, never claiming).
_SCAN = 500


@dataclass(slots=True)
class Recovered:
    """What :func:`recover` did with one orphaned run.

    ``status`` is the resumed run's (``"ok"``, ``"failed"``, ``"needs_input"``), or
    ``"unmatched"``: no agent given may resume it (``error`` says why: no agent of
    its name, another version of the agent's code, an API client's run); the run
    was left untouched (not claimed); or ``"error"``: resuming it raised ``error`` before the run could
    end (another executor took it, the store failed); it stays resumable.
    ``agent`` is the agent name the run recorded (``None`` for a run recorded
    without one). ``result`` is the :class:`RunResult` of a resumed run.

    Truthy, with ``output``, ``replayed`` and ``executed``, like a :class:`RunResult`.
    """

    run_id: str
    agent: str | None
    status: str
    error: str | None = None
    result: RunResult | None = None

    @property
    def output(self) -> Any:
        """The resumed run's output (``None`` unless ``status == "ok"``)."""
        return None if self.result is None else self.result.output

    @property
    def replayed(self) -> int:
        """Steps the resumed run answered from the journal."""
        return 0 if self.result is None else self.result.replayed

    @property
    def executed(self) -> int:
        """Steps the resumed run called now."""
        return 0 if self.result is None else self.result.executed

    def __bool__(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON-ready dict."""
        return {
            "run_id": self.run_id,
            "agent": self.agent,
            "status": self.status,
            "error": self.error,
            "result": None if self.result is None else self.result.to_dict(),
        }


def _agents_by_name(agents: Callable[..., Any] | Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    if isinstance(agents, Mapping):
        by_name = {}
        for name, fn in agents.items():
            check_agent_name(name)
            if not callable(fn):
                raise ConfigError(f"recover(): the agent for {name!r} is a {type(fn).__name__}, not a callable")
            by_name[name] = fn
        return by_name
    if not callable(agents):
        raise ConfigError(f"recover() takes an agent or a dict of agent name -> agent, not a {type(agents).__name__}")
    return {agent_name(agents): agents}


def recover(
    agents: Callable[..., Any] | Mapping[str, Callable[..., Any]],
    *,
    journal: Journal | None = None,
    limit: int = 10,
    ttl: float = DEFAULT_TTL,
    unnamed: Callable[..., Any] | None = None,
    upgrade: bool = False,
) -> list[Recovered]:
    """Claim up to ``limit`` unfinished runs whose executor died and resume each with its own agent.

    ``agents`` is one agent (it resumes the runs recorded with its name, see
    :func:`~engrain.agent_name`) or a dict of recorded agent name to agent,
    e.g. ``{"pay": pay, "email": email}`` for runs started with
    ``run(..., agent_name="pay")``. A run is resumed only when it also records
    the given agent's code fingerprint: a run started by another version of
    the code (a deploy) is listed ``unmatched`` unless ``upgrade=True`` says
    this code replays it (changed steps behind :func:`~engrain.patched`).
    Runs recorded before agent names were journaled name no agent: they are
    resumed only with ``unnamed=agent``. A run an HTTP API client created is
    never resumed, whatever is given.

    Safe to call from many workers at once: each run is claimed by one of them.
    Never raises for one bad run: returns one :class:`Recovered` per run, the
    resumed ones first, then (status ``"unmatched"``, not claimed, ``error``
    saying why) up to ``limit`` orphaned runs that no given agent may resume.
    """
    by_name = _agents_by_name(agents)
    if unnamed is not None and not callable(unnamed):
        raise ConfigError(f"recover(unnamed=...) must be a callable, not a {type(unnamed).__name__}")
    j = journal or default_journal()
    owner = owner_id()
    codes: dict[str | None, str | None] = {n: None if upgrade else fingerprint(fn) for n, fn in by_name.items()}
    if unnamed is not None:
        codes[None] = None
    out = []
    for info in j.claim_runs(owner, ttl, limit, agents=codes):
        agent = by_name.get(info.agent) if info.agent is not None else unnamed
        out.append(_resume(j, info, agent, owner, upgrade))  # type: ignore[arg-type]  # the claim matched it
    out += unmatched(j, codes, limit)
    return out


def _resume(j: Journal, info: ev.RunInfo, agent: Callable[..., Any], owner: str, upgrade: bool) -> Recovered:
    try:
        started = j.read(info.run_id, after=-1)[:1]
        if not started:  # deleted since the claim (cancelled, then gc): run() would start it anew
            return Recovered(info.run_id, info.agent, ERROR, "the run was deleted after it was claimed")
        inputs = started[0].data.get("inputs", {})
        # Under its recorded name, so a dict's names (agent_name= runs) match; runs naming none keep none.
        res = run(agent, info.task, run_id=info.run_id, inputs=inputs, journal=j, agent_name=info.agent,
                  upgrade=upgrade)
    except Exception as e:  # noqa: BLE001 - one run's trouble must not stop the batch; it is reported
        try:
            j.release_lease(info.run_id, owner)  # let another worker try it now, not after the ttl
        except Exception:  # noqa: BLE001 - the lease expires by itself
            pass
        return Recovered(info.run_id, info.agent, ERROR, f"{type(e).__name__}: {e}")
    return Recovered(info.run_id, info.agent, res.status, res.error, res)


def unmatched(j: Journal, codes: dict[str | None, str | None], limit: int, *, named_only: bool = False) -> list[Recovered]:
    """Orphaned runs (``running``, lease free or expired) that the agents ``codes`` describes may not resume; read only.

    ``codes`` maps the agent names given (``None``: runs recording none) to their code
    fingerprint (``None``: any version). ``named_only``: list only runs of those names
    (a worker's view), not every other orphan.
    """
    now = time.time()  # PostgreSQL leases use the database clock: a listing may be off by the skew
    out: list[Recovered] = []
    reads = [limit]  # a run of a given name is read to compare its code: at most ``limit`` such reads
    for info in j.runs(status=ev.RUNNING, limit=_SCAN):
        if info.lease_until is not None and info.lease_until >= now:
            continue
        why = _why_not(j, info, codes, named_only, reads)
        if why is not None:
            out.append(Recovered(info.run_id, info.agent, UNMATCHED, why))
            if len(out) >= limit:
                break
    return out


def _why_not(j: Journal, info: ev.RunInfo, codes: dict[str | None, str | None], named_only: bool,
             reads: list[int]) -> str | None:
    if info.agent not in codes:
        if named_only:
            return None
        if ev.CLIENT_TAG in info.tags:
            return CLIENT_RUN
        if info.agent is None:
            return "the run records no agent (pass unnamed=)"
        return f"no agent named {info.agent!r} was given{legacy_hint(info.agent)}"
    if codes[info.agent] is None and ev.CLIENT_TAG not in info.tags:
        return None  # claimable: left for the next call (the limit was reached)
    if reads[0] <= 0:
        return None  # not looked at this time; the claim's SQL never takes it if its code differs
    reads[0] -= 1
    head = j.read(info.run_id, after=-1)[:1]
    return refusal(head[0].data if head else {}, info.agent, codes[info.agent])
