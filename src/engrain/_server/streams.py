"""Server-sent event streams: admitted under caps, fed by one journal poller, never slowed by a reader.

Every SSE stream (a run's events, an LLM chat turn) takes a slot: at most
``max_streams`` per server and ``max_client_streams`` per client address, 429
with ``Retry-After`` past either (see :class:`StreamSlots`). A run's stream does
not poll the journal itself: :class:`StreamHub` polls the watched runs in one query per
tick, in one thread-pool job, and hands new events to every stream of that run.
So the journal's load grows with the number of watched runs, not of streams, and
the thread pool the other routes share is never filled by streams. A reader that
stops reading holds its own queue only: past ``MAX_QUEUED`` events the queue is
dropped and the stream reads from the journal again when its reader catches up.
(Its socket's write buffer is bounded by the connection guard, see
:mod:`.connections`, which closes a connection whose writes stay paused.)
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse

from .state import ApiError

#: Stream caps: per server and per client address.
MAX_STREAMS, MAX_CLIENT_STREAMS = 200, 20
#: How often the hub polls watched runs (seconds): fast after a change, slower when idle.
POLL_MIN, POLL_MAX = 0.05, 0.5
#: Events a stream may hold unsent before it falls back to reading the journal itself.
MAX_QUEUED = 256


class StreamSlots:
    """Counts open streams per server and per client; :meth:`take` refuses past the caps with 429."""

    def __init__(self, max_streams: int = MAX_STREAMS, max_client_streams: int = MAX_CLIENT_STREAMS):
        self.max_streams = max_streams
        self.max_client_streams = max_client_streams
        self.open = 0
        self._by_client: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def take(self, client: str) -> None:
        """Take a slot for ``client`` (its address) or raise a 429 :class:`ApiError` naming the cap."""
        with self._lock:
            if self.open >= self.max_streams:
                raise _too_many(f"this server already serves {self.open} streams (the most it serves at once)")
            if self._by_client[client] >= self.max_client_streams:
                raise _too_many(f"client {client} already has {self._by_client[client]} open streams "
                                f"(at most {self.max_client_streams} per client): close one first")
            self.open += 1
            self._by_client[client] += 1

    def give_back(self, client: str) -> None:
        """Return ``client``'s slot taken with :meth:`take`."""
        with self._lock:
            self.open -= 1
            self._by_client[client] -= 1
            if self._by_client[client] <= 0:
                del self._by_client[client]


def _too_many(detail: str) -> ApiError:
    return ApiError(429, "TooManyStreams", detail, headers={"Retry-After": "5"})


def client_of(request: Any) -> str:
    """The address a request came from (what per-client caps count)."""
    return request.client.host if request.client else "unknown"


class Subscriber:
    """One stream's view of a watched run: events the hub handed over, and the run's last known status."""

    def __init__(self) -> None:
        self.queue: collections.deque[Any] = collections.deque()
        self.overflowed = False
        #: The run's status when the hub last saw it change (None: not yet).
        self.status: str | None = None
        #: The run no longer exists (deleted while watched).
        self.gone = False
        self.changed = asyncio.Event()

    def push(self, events: list[Any], status: str | None) -> None:
        if events and not self.overflowed:
            if len(self.queue) + len(events) > MAX_QUEUED:
                # The reader is this far behind: keep nothing, let it read the journal when it comes back.
                self.queue.clear()
                self.overflowed = True
            else:
                self.queue.extend(events)
        if status is None:
            self.gone = True
        self.status = status
        self.changed.set()

    async def wait(self, timeout: float) -> None:
        """Until the hub hands over something, or ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self.changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        self.changed.clear()

    def take(self) -> list[Any] | None:
        """The events handed over since the last call; None if some were dropped (read the journal)."""
        if self.overflowed:
            self.overflowed = False
            self.queue.clear()
            return None
        out = list(self.queue)
        self.queue.clear()
        return out


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class EventStream(StreamingResponse):
    """A ``text/event-stream`` response holding one of the server's stream slots for its whole life.

    The slot is taken when the response is built (429 past a cap) and given back
    when it ends, however it ends. ``body(sub)`` makes the events; ``watch()``,
    if given, is entered around it and its value is ``sub`` (a hub subscription).
    """

    def __init__(self, request: Any, body: Callable[[Any], AsyncIterator[str]],
                 watch: Callable[[], AbstractContextManager[Any]] | None = None):
        self._slots: StreamSlots = request.app.state.engrain.slots
        self._client = client_of(request)
        self._slots.take(self._client)
        self._body = body
        self._watch = watch or nullcontext
        super().__init__(iter(()), media_type="text/event-stream", headers=SSE_HEADERS)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            with self._watch() as sub:
                self.body_iterator = gen = self._body(sub)
                try:
                    await super().__call__(scope, receive, send)
                finally:
                    await gen.aclose()  # type: ignore[attr-defined]
        finally:
            self._slots.give_back(self._client)


class StreamHub:
    """Polls the runs that streams watch, one journal read per changed run, and fans events out."""

    def __init__(self, journal_of: Callable[[], Any]):
        self.journal_of = journal_of
        #: run id -> [last seq the hub has seen, subscribers]
        self._runs: dict[str, list[Any]] = {}
        self._task: asyncio.Task[None] | None = None

    @contextmanager
    def watch(self, run_id: str, seen: int) -> Iterator[Subscriber]:
        """Subscribe to ``run_id`` from the event after ``seen`` (what the subscriber has already read or will)."""
        sub = Subscriber()
        # A run already watched keeps its position: what the hub handed out before
        # this subscriber came, the subscriber reads from the journal itself.
        entry = self._runs.setdefault(run_id, [seen, set()])
        entry[1].add(sub)
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._poll_loop())
        try:
            yield sub
        finally:
            entry[1].discard(sub)
            if not entry[1] and self._runs.get(run_id) is entry:
                del self._runs[run_id]

    def _poll(self, watched: list[tuple[str, int]]) -> list[tuple[str, list[Any], str | None]]:
        """In a worker thread: new events and status of each watched run that changed."""
        out = []
        journal = self.journal_of()
        infos = journal.get_runs([run_id for run_id, _ in watched])
        for run_id, seen in watched:
            info = infos.get(run_id)
            if info is None:
                out.append((run_id, [], None))
            elif info.next_seq - 1 > seen:
                out.append((run_id, journal.read(run_id, seen), info.status))
        return out

    async def _poll_loop(self) -> None:
        delay = POLL_MIN
        while self._runs:
            watched = [(run_id, entry[0]) for run_id, entry in self._runs.items()]
            try:
                changes = await run_in_threadpool(self._poll, watched)
            except Exception:  # noqa: BLE001 - a store hiccup: streams keep waiting, the next tick retries
                changes = []
                delay = POLL_MAX
            for run_id, events, status in changes:
                entry = self._runs.get(run_id)
                if entry is None:
                    continue
                if events:
                    entry[0] = max(entry[0], events[-1].seq)
                for sub in list(entry[1]):
                    sub.push(events, status)
            delay = POLL_MIN if changes else min(delay * 2, POLL_MAX)
            await asyncio.sleep(delay)
