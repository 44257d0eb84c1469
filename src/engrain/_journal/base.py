"""The journal interface every backend implements.

Small on purpose: append with optimistic concurrency, read, list runs, and
leases for recovery across workers. Everything else (durable runs, compiler,
cache, memory) is written against this interface, and one conformance suite
(``tests/test_journal_conformance.py``) runs against every backend.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Sequence
from typing import Any

from .._events import Event, NewEvent, Row, RunInfo, dumps
from ._common import Agents


class Journal(abc.ABC):
    """An append-only store of run events.

    Implementations are thread-safe: one instance may be shared by the threads
    of a process. Several processes (or machines, for PostgreSQL) may open the
    same store; concurrent writers of one run are serialized by ``expected_seq``.
    """

    #: The URL this journal was opened with (``sqlite:///...`` or ``postgresql://...``).
    url: str
    #: Backend name: ``"sqlite"`` or ``"postgres"``.
    backend: str

    @abc.abstractmethod
    def append(
        self,
        run_id: str,
        events: Sequence[NewEvent],
        expected_seq: int,
        *,
        durable: bool = True,
        lease: tuple[str, float] | None = None,
        fence: int | None = None,
        wait: bool = True,
        json_checked: bool = False,
    ) -> list[Event]:
        """Append ``events`` to ``run_id`` atomically, starting at ``expected_seq``.

        All events are written or none. Raises :class:`~engrain.ConflictError`
        when the run's next sequence number is not ``expected_seq`` (another
        writer got there first, or the caller's view is stale). A run is
        created by appending at ``expected_seq=0``. Returns the stored events.
        Nothing is appended after the run's finishing event (``run.completed``,
        ``run.failed``, ``run.cancelled``): :class:`~engrain.RunFinishedError`,
        checked after ``expected_seq``, in the same transaction; a batch whose
        last event is the finish is fine.

        ``durable=False`` lets a ``durability="full"`` backend skip the flush to
        disk for this append: the events still survive a process crash, and the
        next durable append flushes them too. Durable runs use it for
        ``step.started``, so a step costs one flush, not two.

        ``lease=(owner, ttl)`` creates the run already leased to ``owner`` for
        ``ttl`` seconds, in the same transaction (only with ``expected_seq=0``,
        else :class:`ValueError`): a durable run starts without a separate
        :meth:`acquire_lease`, and no claimer can take the run in between.

        Appending ``run.completed`` or ``run.failed`` drops the run's lease in
        the same transaction, whoever holds it: a finished run is never
        executed again, so its executor need not release the lease itself.

        ``fence=epoch`` (the value :meth:`take_lease` returned, or 1 for a run
        created with ``lease=``) makes the append succeed only while the run's
        lease epoch is still ``epoch``, checked in the same transaction: once
        another executor took the lease over, a stale executor's append (even
        one already in flight when its process died) raises
        :class:`~engrain.LeaseLostError` and writes nothing.

        ``wait=False`` (only with ``durable=False``, else :class:`ValueError`)
        may return once the append is on its way, before the store answers
        (PostgreSQL: the statement is sent, its result read by the next call;
        SQLite commits at once). The store executes and commits it even if this
        process dies right after. Its failure (a conflict, a lost lease, a lost
        connection) is raised by the next append to the same run at
        ``expected_seq`` one past it, which then writes nothing; every other
        call sees the append's events. The agent loop sends a tool's result
        this way before its next model call: the server commits it while the
        model works, and the model step's append reads the answer.
        ``json_checked=True``: the caller found every event's data strictly JSON (``is_json``), as
        for :meth:`append_one`, so a backend may encode it with a faster, laxer encoder.
        """

    def append_one(
        self,
        run_id: str,
        kind: str,
        name: str,
        data: dict[str, Any],
        expected_seq: int,
        *,
        durable: bool = True,
        fence: int | None = None,
        json_checked: bool = False,
        wait: bool = True,
        lease: tuple[str, float] | None = None,
    ) -> None:
        """Append one event given by its fields, as :meth:`append` does with one :class:`NewEvent`, returning nothing.

        Each step of a durable run is one such append (and so is its ``run.started``, created
        with ``lease`` as for :meth:`append`); a backend overrides this to
        skip building the event objects that the run never reads back.
        ``json_checked=True`` says the caller already found ``data`` strictly JSON
        (``is_json``), so a backend may encode it with a faster, laxer encoder. ``wait``: as for :meth:`append`.
        """
        self.append(run_id, (NewEvent(kind, name, data),), expected_seq, durable=durable, lease=lease, fence=fence,
                    wait=wait, json_checked=json_checked)

    @abc.abstractmethod
    def append_queued(self, run_id: str, events: Sequence[NewEvent], queue: str, agent: str, priority: int) -> None:
        """Create run ``run_id`` from ``events`` already on queue ``queue``, in one transaction.

        The run is ``queued`` with no lease, and its row in ``engrain_queue`` names ``agent`` and
        ``priority`` and is available now (a row left by a deleted run of this id is replaced).
        A crash or a storage error leaves either no run or the queued run: never a run outside
        its queue, which recovery would execute without the queue's limits. ``events`` start
        with ``run.started`` and must not finish the run. A run that exists already makes it a
        :class:`~engrain.ConflictError` that writes nothing.
        """

    @abc.abstractmethod
    def read(self, run_id: str, after: int = -1, limit: int | None = None) -> list[Event]:
        """Events of ``run_id`` with ``seq > after``, in order (the first ``limit`` of them). Empty if the run is unknown."""

    def read_raw(self, run_id: str, after: int = -1, limit: int | None = None) -> list[Row]:
        """What :meth:`read` returns, as rows whose data is still JSON text, for a caller that decodes only what it needs.

        Resuming a long run decodes its completions straight into step records
        (``_durable.steps``); a backend overrides this to skip building events.
        """
        return [(e.seq, e.ts, e.kind, e.name, dumps(e.data)) for e in self.read(run_id, after, limit)]

    @abc.abstractmethod
    def get_run(self, run_id: str) -> RunInfo | None:
        """The summary row of ``run_id``, or ``None`` if no such run exists."""

    def get_runs(self, run_ids: Sequence[str]) -> dict[str, RunInfo]:
        """The summary rows of those of ``run_ids`` that exist, by run id (backends answer in one query)."""
        out = {}
        for run_id in run_ids:
            info = self.get_run(run_id)
            if info is not None:
                out[run_id] = info
        return out

    @abc.abstractmethod
    def runs(
        self,
        *,
        status: str | Sequence[str] | None = None,
        task: str | None = None,
        tag: str | None = None,
        since: float | None = None,
        limit: int = 100,
        offset: int = 0,
        prefix: str | None = None,
    ) -> list[RunInfo]:
        """Runs matching every given filter, most recently updated first.

        ``status`` takes the names in ``engrain._events.STATUSES`` (``"completed"``
        is accepted for ``"ok"``); another value raises
        :class:`~engrain.UnknownStatusError` listing the valid ones. ``prefix``: only
        run ids that start with it (SQLite reads them from the primary key's range).
        """

    @abc.abstractmethod
    def take_lease(self, run_id: str, owner: str, ttl: float) -> int | None:
        """Take or renew the lease of ``run_id`` for ``owner`` until ``now + ttl``; return its epoch.

        Succeeds when the lease is free, expired, or already ``owner``'s, and
        returns the lease epoch, which grows by one each time the lease changes
        hands (a renewal keeps it): pass it as ``append(fence=...)``. Returns
        ``None`` when another owner holds a live lease. Raises
        :class:`~engrain.RunNotFoundError` for an unknown run.
        """

    def acquire_lease(self, run_id: str, owner: str, ttl: float) -> bool:
        """:meth:`take_lease` without the epoch: ``True`` when ``owner`` now holds the lease."""
        return self.take_lease(run_id, owner, ttl) is not None

    def renew_lease(self, run_id: str, owner: str, ttl: float, epoch: int) -> bool:
        """Extend ``owner``'s lease on ``run_id`` to ``now + ttl`` if it still holds it at ``epoch``.

        Unlike :meth:`take_lease`, never takes a lease that was released or
        changed hands since ``epoch`` (even one free again): an executor fenced
        off at ``epoch`` would otherwise hold the lease its run's next executor
        needs. ``False`` when the lease is lost; a lapsed lease nobody took is
        still the owner's and is extended. A backend overrides this with one
        conditional update; this fallback, for journals that do not, re-reads.
        """
        info = self.get_run(run_id)
        if info is None or info.lease_owner != owner or info.lease_epoch != epoch:
            return False
        got = self.take_lease(run_id, owner, ttl)
        if got is not None and got != epoch:  # lost between the read and the take: give back what was taken
            self.release_lease(run_id, owner, got)
            return False
        return got is not None

    @abc.abstractmethod
    def release_lease(self, run_id: str, owner: str, epoch: int | None = None) -> None:
        """Drop ``owner``'s lease on ``run_id``; a no-op if ``owner`` does not hold it (at ``epoch``, if given)."""

    @abc.abstractmethod
    def claim_runs(
        self, owner: str, ttl: float, limit: int = 10, *, agents: Agents | None = None
    ) -> list[RunInfo]:
        """Lease up to ``limit`` unfinished (``running``) runs whose lease is free or expired.

        Each returned :class:`RunInfo` carries the new ``lease_epoch``.

        Concurrent claimers never receive the same run: this is how a fleet of
        workers splits the recovery of runs whose process died. With ``agents``,
        only runs whose recorded agent name (``RunInfo.agent``) is in it are
        claimed, ``None`` standing for runs that record none; given as a mapping
        of name to code fingerprint, a name's runs must also record that
        ``agent_code`` (or none; ``None`` for any). Runs an API client created
        (tagged ``client``) are never claimed, nor are runs on a queue (they are the
        workers', which apply the queue's limits). Others are not touched.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections. The journal cannot be used afterwards."""

    # -- conveniences shared by every backend ---------------------------------

    def next_seq(self, run_id: str) -> int:
        """The sequence number the next append to ``run_id`` must use (0 for a new run)."""
        info = self.get_run(run_id)
        return 0 if info is None else info.next_seq

    def delete_run(self, run_id: str) -> None:  # pragma: no cover - optional
        """Remove a run and its events. Backends that support it override this."""
        raise NotImplementedError(f"{type(self).__name__} cannot delete runs")

    @staticmethod
    def _now() -> float:
        return time.time()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        from ._common import redact_url

        return f"<{type(self).__name__} {redact_url(self.url)}>"
