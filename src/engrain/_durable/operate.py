"""Operating runs as journal operations: cancel, fork (time travel) and retention (gc).

* :func:`cancel` appends ``run.cancelled``. A run executing elsewhere finds out
  at its next append (its expected ``seq`` is taken), i.e. at its next step
  boundary, and stops; a cancelled run is finished, so it is never claimed or
  resumed again.
* :func:`fork` starts a new run whose journal is a copy of the source run's
  first N steps: resumed with the same agent, it returns their recorded
  results and executes from step N. A fork of a queued run is queued on the
  source's queue, so that queue's limits apply to it.
* :func:`gc` deletes finished runs older than a cut-off, one short transaction
  per run, so writers are never blocked for long; it never touches a running,
  queued or waiting run.
"""

from __future__ import annotations

import datetime as _dt
import re
import time
from dataclasses import dataclass, field
from typing import Any

from .. import _events as ev
from .._errors import ConfigError, ConflictError, EngrainError, RunNotFoundError
from .._events import NewEvent
from .._journal import Journal
from .._journal._common import check_run_id
from .._journal.failures import sqlite_rollback, storage_errors
from .._progress import task
from .context import default_journal, new_run_id
from .steps import replayed_steps, steps_of

#: Statuses gc may delete: finished runs only (``ok`` is the store's name for completed once it switches).
FINISHED_STATUSES = (ev.COMPLETED, "ok", ev.FAILED, ev.CANCELLED)
_FINISH = (ev.RUN_COMPLETED, ev.RUN_FAILED, ev.RUN_CANCELLED)


def cancel(run_id: str, *, reason: str = "", journal: Journal | None = None) -> bool:
    """Cancel ``run_id``: it stops at its next step boundary, ends ``cancelled`` and is never resumed.

    Returns ``True`` when this call cancelled it, ``False`` when it had already
    finished (completed, failed or cancelled). :class:`~engrain.RunNotFoundError`
    for an unknown run.
    """
    j = journal or default_journal()
    if not isinstance(reason, str) or len(reason) > 2000:
        raise ConfigError("cancel reason must be a string of at most 2000 characters")
    for _ in range(1000):  # a live run keeps appending: try again at its new end
        events = j.read(run_id)
        if not events:
            raise RunNotFoundError(run_id)
        if any(e.kind in _FINISH for e in events):
            return False
        try:
            j.append(run_id, [NewEvent(ev.RUN_CANCELLED, "", {"reason": reason})], len(events))
            return True
        except ConflictError:
            time.sleep(0.001)
    raise EngrainError(f"could not cancel run {run_id!r}: it kept appending; try again")


def fork(source_run_id: str, at_step: int, *, run_id: str | None = None, journal: Journal | None = None) -> str:
    """A new run that reuses the recorded results of steps ``0..at_step-1`` of ``source_run_id``.

    Returns the new run's id. Resume it with the same agent (``engrain.run(agent,
    task, run_id=new_id, inputs=...)``, or a worker's recovery): the first
    ``at_step`` steps replay from the copy and execution continues at step
    ``at_step``, e.g. with a fixed tool. The source run is not changed. A fork
    of a run that was enqueued (``engrain.enqueue``) is ``queued`` on the
    source's queue (same agent and priority), for the workers serving it.
    """
    j = journal or default_journal()
    if not isinstance(at_step, int) or isinstance(at_step, bool) or at_step < 0:
        raise ConfigError(f"at_step must be an integer >= 0, got {at_step!r}")
    events = j.read(source_run_id)
    if not events:
        raise RunNotFoundError(source_run_id)
    steps = steps_of(events)  # a client run's events that do not fold: an error naming the event
    if at_step > len(steps):
        raise ConfigError(f"run {source_run_id!r} has {len(steps)} steps; cannot fork at step {at_step}")
    for n in range(at_step):
        if n not in steps or steps[n].state not in ("completed", "failed", "answered"):
            state = steps[n].state if n in steps else "missing"
            raise ConfigError(f"run {source_run_id!r}: step {n} is {state}, not finished; fork at step {n} or earlier")
    if run_id is not None:
        check_run_id(run_id)  # "" is a bad id, not a request for a fresh one
    new_id = new_run_id() if run_id is None else run_id
    started = dict(events[0].data)
    started["forked_from"] = {"run_id": source_run_id, "at_step": at_step}
    copied = [NewEvent(ev.RUN_STARTED, "", started)]
    for e in events[1:]:
        cid = e.data.get("call_id")
        if isinstance(cid, int) and cid < at_step:  # step, check and input events of the kept steps
            copied.append(NewEvent(e.kind, e.name, e.data))
        elif e.kind == ev.REPLAY_COMPLETED:  # a cache hit's steps, in one event: the kept ones as completions
            copied += [NewEvent(ev.STEP_COMPLETED, name, {"call_id": cid, "result": result, "type": type_,
                                                          "args": args, "started": started})
                       for cid, (name, type_, args, result, started) in replayed_steps(e.data) if cid < at_step]
    if j.get_run(new_id) is not None:
        raise ConfigError(f"run {new_id!r} already exists; choose another id for the fork")
    queued = _queue_row(j, source_run_id)
    if queued:
        # Whole, and with its queue row, in one transaction: a fork cut short by a crash would be a run
        # outside its queue, which recovery executes without the queue's limits.
        j.append_queued(new_id, copied, *queued)
        return new_id
    for k in range(0, len(copied), 1000):
        j.append(new_id, copied[k : k + 1000], k)
    return new_id


def _queue_sql(j: Journal, fn: Any) -> Any:
    """``fn(q)`` in one transaction on ``j``'s own connection, as ``_workers.store.QueueStore`` runs its own.

    The queue tables are the store schema's (journal migration 6); a fork, below ``_workers`` in the
    layers, reads and writes the one queue row it needs here. ``None`` for a journal with no SQL connection.
    """
    if getattr(j, "backend", None) not in ("sqlite", "postgres") or not hasattr(j, "_db"):
        return None
    pg = j.backend == "postgres"

    @storage_errors
    def tx(journal: Journal) -> Any:
        settled = getattr(journal, "_settled", None)  # PostgreSQL: no append left in flight on the connection
        with settled() if settled is not None else journal._lock:  # type: ignore[attr-defined]
            db = journal._db  # type: ignore[attr-defined]

            def q(sql: str, args: tuple[Any, ...] = ()) -> Any:
                return db.execute(sql.replace("?", "%s") if pg else sql, args)

            if pg:
                with db.transaction():
                    return fn(q)
            db.execute("BEGIN IMMEDIATE")
            try:
                out = fn(q)
                db.execute("COMMIT")
                return out
            except BaseException:
                sqlite_rollback(db)  # a failed COMMIT may have rolled back: its error is the one to raise
                raise

    return tx(j)


def _queue_row(j: Journal, run_id: str) -> tuple[str, str, int] | None:
    """``(queue, agent, priority)`` of ``run_id`` if it was enqueued, else ``None``."""
    row = _queue_sql(j, lambda q: q("SELECT queue, agent, priority FROM engrain_queue WHERE run_id = ?",
                                    (run_id,)).fetchone())
    return (row[0], row[1], int(row[2])) if row else None


def parse_age(value: float | int | str | _dt.timedelta) -> float:
    """Seconds from ``30d``, ``12h``, ``15m``, ``45s``, a number of seconds or a timedelta."""
    if isinstance(value, _dt.timedelta):
        secs = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        secs = float(value)
    elif isinstance(value, str) and (m := re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", value)):
        secs = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]
    else:
        raise ConfigError(f"older_than must be like 30d, 12h, 15m, 45s or a number of seconds, got {value!r}")
    if not 0 <= secs < 1e10:
        raise ConfigError(f"older_than must be between 0 and 1e10 seconds, got {value!r}")
    return secs


@dataclass(slots=True)
class GcReport:
    """What :func:`gc` deleted (or, with ``dry_run``, would delete)."""

    runs: list[str] = field(default_factory=list)
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict."""
        return {"deleted": len(self.runs), "run_ids": list(self.runs), "dry_run": self.dry_run}


def gc(
    older_than: float | int | str | _dt.timedelta,
    *,
    status: str | list[str] | tuple[str, ...] | None = None,
    dry_run: bool = False,
    batch: int = 200,
    journal: Journal | None = None,
) -> GcReport:
    """Delete finished runs (and their events) not updated for ``older_than``; never running or queued ones.

    ``status`` narrows to some finished statuses (``ok``/``completed``,
    ``failed``, ``cancelled``); anything else is refused. Each run is deleted in
    its own short transaction, ``batch`` ids listed at a time, so concurrent
    writers wait at most one run's delete.
    """
    j = journal or default_journal()
    cutoff = time.time() - parse_age(older_than)
    if status is not None and not isinstance(status, (str, list, tuple)):
        raise ConfigError(f"gc status must be a status or a list of them, got {type(status).__name__}")
    wanted = FINISHED_STATUSES if status is None else ((status,) if isinstance(status, str) else tuple(status))
    bad = [s for s in wanted if s not in FINISHED_STATUSES]
    if bad:
        raise ConfigError(f"gc deletes finished runs only: status {bad[0]!r} is not one of {sorted(set(FINISHED_STATUSES))}")
    if "ok" in wanted or ev.COMPLETED in wanted:
        wanted = tuple({*wanted, "ok", ev.COMPLETED})
    if not isinstance(batch, int) or not 1 <= batch <= 10_000:
        raise ConfigError(f"batch must be from 1 to 10000, got {batch!r}")
    report = GcReport(dry_run=dry_run)
    # Most recently updated first: skip the pages newer than the cut-off, then every row is a candidate.
    offset = 0
    with task("finding old runs" if dry_run else "deleting old runs") as advance:
        while True:
            page = j.runs(status=list(wanted), limit=batch, offset=offset)
            if not page:
                break
            old = [r.run_id for r in page if r.updated < cutoff]
            report.runs.extend(old)
            advance(len(old))
            if dry_run or not old:
                offset += len(page)
                continue
            for rid in old:
                info = j.get_run(rid)
                if info is not None and info.status in wanted and info.updated < cutoff:  # re-checked: not resumed
                    j.delete_run(rid)
            offset += len(page) - len(old)
    return report
