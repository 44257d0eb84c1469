"""PostgreSQL journal (psycopg 3): one store shared by many workers.

Optimistic concurrency rides on the ``runs`` row: an append updates it only
where ``next_seq`` still equals the writer's ``expected_seq``, and PostgreSQL's
row lock makes a second concurrent writer re-check and fail. Recovery claims
use ``FOR UPDATE SKIP LOCKED`` so workers never receive the same run. Lease
times use the database clock so workers on machines with skewed clocks agree.
A one-event append (every step) goes through :mod:`.postgres_wire`; with
``wait=False`` its result is read by the journal's next call (``_settle``). A
connection the server dropped is replaced by the next call (:mod:`.pglink`).
"""

from __future__ import annotations

import contextlib
import struct
import time
from collections.abc import Iterator, Sequence
from typing import Any

from .._errors import (
    ConfigError,
    ConflictError,
    LeaseLostError,
    RunFinishedError,
    RunNotFoundError,
    StorageError,
    StoreNotFoundError,
)
from .._events import Event, NewEvent, Row, RunInfo, events_of
from ._common import (
    _STATUS_KINDS,
    FINISHED,
    Agents,
    agents_filter,
    check_lease,
    check_lookup_id,
    page,
    prepare,
    prepare_row,
    run_filters,
    trust_sql,
    window,
)
from ._common import redact_url as _redact
from .base import Journal
from .pglink import RevivingLock, connect, dropped, reconnect
from .postgres_schema import migrate
from .postgres_sql import APPEND_SQL, DB_NOW, QUEUE_ADD, QUEUE_DROP, RUN_COLS, STEP, TAKE
from .postgres_wire import Wire, float8, int4, int8, keep_sent_statements, text_params

_MAX_LATE = 1000  # failures of appends sent without waiting that no later append claimed yet

def _no_such_id(run_id: str) -> bool:
    """Check a run id given to look a run up by (a typed error for no string); True if it holds a NUL, which no
    run's does and which the driver refuses to send (SQLite simply finds no such run)."""
    check_lookup_id(run_id)
    return "\x00" in run_id


def _run_info(row: tuple) -> RunInfo:
    return RunInfo(row[0], row[1], row[2], list(row[3]), row[4], row[5], row[6], row[7], row[8], row[9], row[10])


class PostgresJournal(Journal):
    """Journal in a PostgreSQL database (tables ``engrain_events`` and ``engrain_runs``)."""

    backend = "postgres"

    def __init__(self, url: str, durability: str = "full", *, create: bool = True):
        try:
            import psycopg
        except ImportError as e:  # pragma: no cover - psycopg is a dependency
            raise ConfigError("the postgres journal needs psycopg 3: pip install 'psycopg[binary]'") from e
        if durability not in ("normal", "full"):
            raise ConfigError(f"durability must be 'normal' or 'full', got {durability!r}")
        self.url = url
        self.durability = durability
        self._psycopg = psycopg
        self._db = connect(url)
        self._lock = RevivingLock()
        self._wire = Wire(self._db)
        # The append sent without waiting (append(wait=False)) whose result is unread:
        # (run_id, expected_seq, fence, kind). Its failure waits in _late for that run's next append.
        self._inflight: tuple[str, int, int | None, str] | None = None
        self._late: dict[str, tuple[int, Exception]] = {}
        try:
            with self._lock:
                self._setup(self._db)
                if not create and self._db.execute("SELECT to_regclass('engrain_runs')").fetchone()[0] is None:
                    raise StoreNotFoundError(_redact(url), "that database (and search_path) has no engrain tables")
                # Concurrent CREATE ... IF NOT EXISTS can still race on the catalog;
                # the migration's advisory lock makes schema changes safe across workers.
                migrate(self._db, _redact(url))
        except BaseException:
            self._db.close()
            raise
        self._lock.revive = self._revive

    def _setup(self, db: Any) -> None:
        # normal: commits return before the WAL is flushed (a server crash may
        # lose the last few ms, never corrupt); full: the server default.
        if self.durability == "normal":
            db.execute("SET synchronous_commit = off")
        keep_sent_statements(db)

    def _revive(self) -> None:
        """Replace a connection the server dropped (see :mod:`.pglink`), on the lock's outermost entry.

        An append sent without waiting on the lost connection may or may not have
        landed: reading its result fails, and that failure waits for the run's next
        append, as any late failure does. With such an append in flight, the socket
        is readable anyway (its result), so only a call that met the loss tells."""
        if not dropped(self._db, idle=self._inflight is None and not self._wire.busy):
            return
        self._settle()
        self._db = reconnect(self.url, self._db, self._setup)
        self._wire = Wire(self._db)

    def _storage(self, e: Exception) -> Exception:
        """A lost connection or a server that cannot write is the store's failure: :class:`StorageError`."""
        if isinstance(e, self._psycopg.OperationalError):
            return StorageError(_redact(self.url), e)
        return e

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
        if not wait and durable:
            raise ValueError("append(wait=False) needs durable=False: a flush is confirmed only by waiting for it")
        ts = self._now()
        lease = check_lease(lease, expected_seq)
        batch = prepare(run_id, events, expected_seq, ts, json_checked)
        rows = batch.rows
        stored = [Event(r[0], r[1], r[2], r[3], r[4], ev.data) for r, ev in zip(rows, events)]
        flush = durable or self.durability != "full"
        one = len(rows) == 1
        if one and expected_seq and batch.status is None:
            self._append_step(rows[0], flush, fence, wait)
            return stored
        finish = batch.status in FINISHED
        if expected_seq == 0:
            status, task, tags = batch.status or "running", batch.task or "", batch.tags or "[]"
            owner, ttl = (None, None) if lease is None or finish else lease
            head: tuple = (run_id, status, task, tags, ts, ts, batch.next_seq, owner, ttl, 0 if owner is None else 1,
                           batch.agent)
            fence = None
        else:
            updated = ts if batch.status else None
            head = (batch.next_seq, updated, batch.status, batch.task, batch.tags, run_id, expected_seq)
            if fence is not None:
                head = (*head, fence)
        sql = APPEND_SQL[expected_seq == 0, one, flush, finish, fence is not None]
        if one:
            self._send_one(sql, text_params((*head, *rows[0])), run_id, expected_seq, fence, wait, rows[0][3])
            return stored
        try:
            with self._lock:
                self._settle()
                self._raise_late(run_id, expected_seq)
                if self._db.execute(sql, (*head, *(list(c) for c in zip(*rows)))).rowcount != len(rows):
                    raise self._conflict(run_id, expected_seq, fence, rows[0][3])
        except self._psycopg.Error as e:
            raise self._storage(e) from e
        return stored

    def append_queued(self, run_id: str, events: Sequence[NewEvent], queue: str, agent: str, priority: int) -> None:
        ts = self._now()
        batch = prepare(run_id, events, 0, ts)
        if batch.status in FINISHED:
            raise ValueError(f"run {run_id!r}: a queued run's events must leave it to execute, not finish it")
        rows = batch.rows
        # Created ``queued`` (no lease) by the statement that creates any run, beside its queue row.
        head = (run_id, "queued", batch.task or "", batch.tags or "[]", ts, ts, batch.next_seq, None, None, 0, batch.agent)
        try:
            with self._settled(), self._db.transaction():
                db = self._db
                if db.execute(APPEND_SQL[True, False, True, False, False],
                              (*head, *(list(c) for c in zip(*rows)))).rowcount != len(rows):
                    raise self._conflict(run_id, 0, None, rows[0][3])
                db.execute(QUEUE_DROP, (run_id,))  # a row left by a deleted run of this id
                db.execute(QUEUE_ADD, (run_id, queue, agent, priority))
        except self._psycopg.Error as e:
            raise self._storage(e) from e

    def append_one(
        self, run_id: str, kind: str, name: str, data: dict, expected_seq: int, *, durable: bool = True,
        fence: int | None = None, json_checked: bool = False, wait: bool = True, lease: tuple[str, float] | None = None,
    ) -> None:
        if expected_seq == 0 or kind in _STATUS_KINDS or lease is not None:
            # Creates the run or changes its status: append's statement.
            super().append_one(run_id, kind, name, data, expected_seq, durable=durable, fence=fence,
                               json_checked=json_checked, wait=wait, lease=lease)
            return
        # Every step of a durable run comes here: no NewEvent in, no Event or Batch on the way.
        if not wait and durable:
            raise ValueError("append(wait=False) needs durable=False: a flush is confirmed only by waiting for it")
        row = prepare_row(run_id, kind, name, data, expected_seq, time.time(), json_checked)
        self._append_step(row, durable or self.durability != "full", fence, wait)

    def _append_step(self, row: tuple[str, int, float, str, str, str], flush: bool, fence: int | None,
                     wait: bool) -> None:
        """Append a step's validated ``row`` (one event that changes no status, on an existing run): every
        step of a durable run. Its sequence number, time and fence travel in binary."""
        run_id, seq, ts, kind, name, text = row
        sql, types, formats = STEP[flush, fence is not None]
        try:
            params = [run_id.encode(), int4(seq), float8(ts), kind.encode(), name.encode(), text.encode()]
            if fence is not None:
                params.append(int8(fence))
        except struct.error:  # past int4 or int8 (or a fence that is no int): as text, for the server to refuse or read
            params = text_params(row if fence is None else (*row, int(fence)))
            formats = None
        self._send_one(sql, params, run_id, seq, fence, wait, kind, formats, types)

    def _send_one(self, sql: str, params: list[bytes | None], run_id: str, expected_seq: int, fence: int | None,
                  wait: bool, kind: str, formats: tuple[int, ...] | None = None,
                  types: tuple[int, ...] | None = None) -> None:
        """Run a one-event append's statement: one round trip, one commit (``wait=False``: see :meth:`append`).

        ``kind``: the event's, named if the run has ended. ``formats``: the parameters' (default all text),
        ``types``: theirs if the statement does not say.
        """
        try:
            with self._lock:
                if self._inflight is not None:
                    self._settle()
                if self._late:
                    self._raise_late(run_id, expected_seq)
                written = self._wire.send(sql, params, formats, types, wait)
                if not wait:
                    self._inflight = (run_id, expected_seq, fence, kind)
                elif written != 1:
                    raise self._conflict(run_id, expected_seq, fence, kind)
        except self._psycopg.Error as e:
            raise self._storage(e) from e

    def _raise_late(self, run_id: str, expected_seq: int) -> None:
        """Raise the failure of this writer's previous append, sent without waiting: this one must not land after it."""
        late = self._late.pop(run_id, None) if self._late else None
        if late is not None and late[0] + 1 == expected_seq:
            raise late[1]

    def _settle(self) -> None:
        """Read the result of the append sent without waiting (under the lock), before anything else uses the connection.

        Its failure is kept for the run's next append, which raises it instead
        of writing: that writer's append, with ``expected_seq`` one past it.
        """
        if self._inflight is None:
            return
        run_id, seq, fence, kind = self._inflight
        self._inflight = None
        try:
            failure = None if self._wire.result() == 1 else self._conflict(run_id, seq, fence, kind)
        except self._psycopg.Error as e:
            failure = self._storage(e)
        if failure is not None:
            if len(self._late) >= _MAX_LATE:
                self._late.clear()
            self._late[run_id] = (seq, failure)

    @contextlib.contextmanager
    def _settled(self) -> Iterator[None]:
        """The lock, held, with no append in flight (for a transaction of several statements)."""
        with self._lock:
            self._settle()
            yield

    def _conflict(self, run_id: str, expected_seq: int, fence: int | None, kind: str) -> Exception:
        """Why an append at ``expected_seq`` wrote nothing: its lease lost, its seq taken, or the run ended."""
        row = self._db.execute(
            "SELECT next_seq, lease_epoch, lease_owner, status FROM engrain_runs WHERE run_id = %s", (run_id,)
        ).fetchone()
        if row is not None and fence is not None and row[1] != fence:
            return LeaseLostError(run_id, row[2], fence)
        if row is not None and row[0] == expected_seq and row[3] in FINISHED:  # the seq was free: the end refused it
            return RunFinishedError(run_id, row[3], kind)
        return ConflictError(run_id, expected_seq, 0 if row is None else row[0])

    def take_lease(self, run_id: str, owner: str, ttl: float) -> int | None:
        if _no_such_id(run_id):
            raise RunNotFoundError(run_id)
        try:
            with self._lock:
                self._settle()
                row = self._db.execute(
                    f"UPDATE engrain_runs SET {TAKE} WHERE run_id = %s"
                    f" AND (lease_owner IS NULL OR lease_owner = %s OR lease_until < {DB_NOW}) RETURNING lease_epoch",
                    (owner, owner, ttl, run_id, owner),
                ).fetchone()
        except self._psycopg.Error as e:
            raise self._storage(e) from e
        if row is not None:
            return row[0]
        if self.get_run(run_id) is None:
            raise RunNotFoundError(run_id)
        return None

    def renew_lease(self, run_id: str, owner: str, ttl: float, epoch: int) -> bool:
        if _no_such_id(run_id):
            return False
        try:
            with self._lock:
                self._settle()
                row = self._db.execute(
                    f"UPDATE engrain_runs SET lease_until = {DB_NOW} + %s"
                    " WHERE run_id = %s AND lease_owner = %s AND lease_epoch = %s RETURNING 1",
                    (ttl, run_id, owner, epoch),
                ).fetchone()
        except self._psycopg.Error as e:
            raise self._storage(e) from e
        return row is not None

    def release_lease(self, run_id: str, owner: str, epoch: int | None = None) -> None:
        at = "" if epoch is None else " AND lease_epoch = %s"
        if _no_such_id(run_id):
            return
        try:
            with self._lock:
                self._settle()
                self._db.execute(
                    "UPDATE engrain_runs SET lease_owner = NULL, lease_until = NULL"
                    f" WHERE run_id = %s AND lease_owner = %s{at}",
                    (run_id, owner) if epoch is None else (run_id, owner, epoch),
                )
        except self._psycopg.Error as e:
            raise self._storage(e) from e

    def claim_runs(
        self, owner: str, ttl: float, limit: int = 10, *, agents: Agents | None = None
    ) -> list[RunInfo]:
        code, not_client = trust_sql(True, "engrain_runs")
        which, names = (not_client, []) if agents is None else agents_filter(agents, "agent", "%s", code)
        if agents is not None:
            which = f"{which} AND {not_client}"
        try:
            with self._lock:
                self._settle()
                rows = self._db.execute(
                    f"UPDATE engrain_runs SET {TAKE}"
                    " WHERE run_id IN (SELECT run_id FROM engrain_runs WHERE status = 'running'"
                    f" AND (lease_until IS NULL OR lease_until < {DB_NOW}) AND {which}"
                    # a queued run is left to the workers, which apply its queue's limits
                    " AND NOT EXISTS (SELECT 1 FROM engrain_queue q WHERE q.run_id = engrain_runs.run_id)"
                    " ORDER BY updated LIMIT %s FOR UPDATE SKIP LOCKED)"
                    f" RETURNING {RUN_COLS}",
                    (owner, owner, ttl, *names, limit),
                ).fetchall()
        except self._psycopg.Error as e:
            raise self._storage(e) from e
        return sorted((_run_info(r) for r in rows), key=lambda r: r.updated)

    def delete_run(self, run_id: str) -> None:
        if _no_such_id(run_id):
            return
        try:
            with self._settled(), self._db.transaction():
                self._db.execute("DELETE FROM engrain_events WHERE run_id = %s", (run_id,))
                self._db.execute("DELETE FROM engrain_queue WHERE run_id = %s", (run_id,))  # a queued run's row (v6)
                self._db.execute("DELETE FROM engrain_runs WHERE run_id = %s", (run_id,))
        except self._psycopg.Error as e:
            raise self._storage(e) from e

    def read(self, run_id: str, after: int = -1, limit: int | None = None) -> list[Event]:
        return events_of(run_id, self.read_raw(run_id, after, limit))

    def read_raw(self, run_id: str, after: int = -1, limit: int | None = None) -> list[Row]:
        after, limit = window(run_id, after, limit)  # a lone surrogate: the caller's bad input, not the driver's error
        if _no_such_id(run_id):
            return []
        try:
            with self._lock:
                self._settle()
                # Binary results: seq and ts arrive as machine numbers, not text to parse (~20% of a
                # 10k-event read); run_id is the caller's.
                sql = "SELECT seq, ts, kind, name, data FROM engrain_events WHERE run_id = %s AND seq > %s ORDER BY seq"
                if limit is not None:
                    return self._db.cursor(binary=True).execute(sql + " LIMIT %s", (run_id, after, max(0, limit))).fetchall()
                return self._db.cursor(binary=True).execute(sql, (run_id, after)).fetchall()
        except self._psycopg.Error as e:
            raise self._storage(e) from e

    def get_run(self, run_id: str) -> RunInfo | None:
        if _no_such_id(run_id):
            return None
        try:
            with self._lock:
                self._settle()
                row = self._db.execute(f"SELECT {RUN_COLS} FROM engrain_runs WHERE run_id = %s", (run_id,)).fetchone()
        except self._psycopg.Error as e:
            raise self._storage(e) from e
        return None if row is None else _run_info(row)

    def get_runs(self, run_ids: Sequence[str]) -> dict[str, RunInfo]:
        run_ids = list(run_ids)
        run_ids = [i for i in run_ids if not _no_such_id(i)]
        try:
            with self._lock:
                self._settle()
                rows = self._db.execute(f"SELECT {RUN_COLS} FROM engrain_runs WHERE run_id = ANY(%s)", (list(run_ids),)).fetchall()
        except self._psycopg.Error as e:
            raise self._storage(e) from e
        return {info.run_id: info for info in map(_run_info, rows)}

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
        # starts_with, not a range: under the database's collation a range of text is no prefix
        where, args = run_filters(status, task, tag, since, placeholder="%s", tag_clause="tags ? %s",
                                  prefix=prefix, prefix_clause="starts_with(run_id, %s)")
        sql = f"SELECT {RUN_COLS} FROM engrain_runs{where} ORDER BY updated DESC, run_id LIMIT %s OFFSET %s"
        try:
            with self._lock:
                self._settle()
                rows = self._db.execute(sql, (*args, *page(limit, offset))).fetchall()
        except self._psycopg.Error as e:
            raise self._storage(e) from e
        return [_run_info(r) for r in rows]

    def close(self) -> None:
        self._lock.revive = None  # closing a dropped connection needs no new one
        with self._lock:
            try:
                self._settle()  # an append sent without waiting is committed by the server anyway
            finally:
                self._db.close()
                self._lock.closed(f"the journal on {_redact(self.url)}")
