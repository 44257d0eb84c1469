"""How a run waits (a retry's backoff, a durable sleep) so that a cancel stops it, and how it parks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import _events as ev
from .._errors import StorageError
from .unwind import _Cancelled, _Park

if TYPE_CHECKING:
    from .._journal import Journal

#: Longest stretch (seconds) a wait inside a run (a retry's backoff, a durable sleep) goes without
#: looking whether the run was cancelled: one summary-row read per stretch, and only while waiting.
CANCEL_POLL = 1.0


class Waiting:
    """:class:`~engrain._durable.context.RunContext`'s waits and parking (its journal, run id, fence and parker)."""

    journal: Journal
    run_id: str
    fence: int | None
    storage_error: StorageError | None
    _parker: Callable[[str, float, int | None], bool] | None

    def cancelled(self) -> bool:
        """Whether ``run.cancelled`` ended this run (read from its summary row).

        Appends notice a cancel for free (their ``seq`` is taken); a run that waits appends
        nothing, so a wait asks this before the run's next step or attempt begins.
        """
        try:
            info = self.journal.get_run(self.run_id)
        except StorageError as e:
            raise self._store_failed(e) from None
        return info is not None and info.status == ev.CANCELLED

    def _store_failed(self, e: StorageError) -> StorageError:
        """``e``, noted as the run's storage failure: the agent may catch it (a tool's retry wait or a sleep raised it),
        and the run must then stay resumable, not end as if the wait or the step were over."""
        if self.storage_error is None:
            self.storage_error = e
        return e

    def wait(self, seconds: float) -> None:
        """Block ``seconds`` before this run's next step or attempt (a retry's backoff), in stretches of at
        most :data:`CANCEL_POLL`; raise ``_Cancelled`` once the run is found cancelled, so nothing begins
        after a cancel. A run that does not wait pays nothing."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, CANCEL_POLL))
            if self.cancelled():
                raise _Cancelled()

    async def await_wait(self, seconds: float) -> None:
        """Async :meth:`wait`."""
        import asyncio  # lazily: see run()

        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(left, CANCEL_POLL))
            if self.cancelled():
                raise _Cancelled()

    def park(self, until: float) -> None:
        """Unwind the run as parked until ``until`` (a worker's long sleep): raise ``_Park``.

        The worker's parker puts the run back in its queue here, while this executor still holds
        the lease, fenced on it (owner and epoch): parked after the lease was dropped, the run could
        already be another worker's, which it would then take from under it (a step run twice).
        ``_Park.parked`` says whether it was parked (``False``: the lease was lost, or it was cancelled).
        """
        exc = _Park(until)
        try:
            exc.parked = self._parker(self.run_id, until, self.fence) if self._parker is not None else None  # type: ignore[attr-defined]
        except StorageError as e:
            raise self._store_failed(e) from None
        raise exc
