"""The PostgreSQL journal's one-event append, on libpq directly.

Every step of a durable run appends one event, so this path sets the cost of a
step. Through psycopg's ``execute`` it cost ~50 µs of Python per statement, and
the server parses and plans the append's statement again each time until
psycopg's fifth use prepares it. Here each statement is prepared once per
connection under a name of its own, its parameters travel as text, and sending
is split from reading the result: an append can go out now and have its result
read by the journal's next call (``Journal.append(wait=False)``).

At most one statement is in flight (no pipeline): every other use of the
connection reads that result first. So a client killed after the send has no
reply it did not read other than one the server sends after committing: its
socket closes with an orderly FIN behind the bytes already queued, and the
server reads, executes and commits the statement as if the client had waited
(``tests/test_crash.py`` SIGKILLs a client right after such a send). A server
configured with ``client_connection_check_interval`` would instead cancel a
statement still waiting (on a row lock) when its client is gone: the journal
turns it off for its own session (:func:`keep_sent_statements`).

Waiting for a result is a loop of its own over libpq's non-blocking calls and
``poll`` on the socket, not psycopg's generators driven by ``Connection.wait``:
a third of the instructions (~6k against ~15k a statement), which matters most
after an fsync'd commit, when they run on cold caches. ``poll`` returns on a
signal, so Ctrl-C interrupts a wait as it does psycopg's, and the statement is
then cancelled as psycopg cancels its own (:meth:`Wire._interrupted`).
A step's statement takes its sequence number, time and fence in binary
(:data:`STEP_TYPES`): packing a double costs a tenth of printing its shortest text.
"""

from __future__ import annotations

import select
import struct
from collections.abc import Sequence
from typing import Any

_FATAL = 7  # psycopg.pq.ExecStatus.FATAL_ERROR
_MISSING_STATEMENT = "26000"  # invalid_sql_statement_name: our prepared statement is gone (DEALLOCATE ALL)
_POLL_MS = 1000  # a wait's poll wakes up this often even without a signal (it re-checks the socket, nothing else)

#: A step's parameters (run_id, seq, ts, kind, name, data, fence) by type OID: text, int4, float8 and int8.
STEP_TYPES = (25, 23, 701, 25, 25, 25, 20)
#: Their formats: seq, ts and the fence travel in binary (network byte order), the texts as text.
STEP_FORMATS = (0, 1, 1, 0, 0, 0, 1)
int4 = struct.Struct("!i").pack
int8 = struct.Struct("!q").pack
float8 = struct.Struct("!d").pack


def numbered(sql: str) -> str:
    """``sql`` with psycopg's ``%s`` placeholders numbered ``$1, $2, ...`` as the protocol wants them."""
    parts = sql.split("%s")
    return "".join(p + (f"${i + 1}" if i < len(parts) - 1 else "") for i, p in enumerate(parts))


def text_params(values: tuple) -> list[bytes | None]:
    """Parameters in PostgreSQL's text format (the statement's casts give their types)."""
    out: list[bytes | None] = []
    for v in values:
        if v is None:
            out.append(None)
        elif type(v) is str:
            out.append(v.encode())
        elif type(v) is float:
            out.append(repr(v).encode())  # shortest text that reads back as the same double
        else:
            out.append(str(int(v)).encode())
    return out


def keep_sent_statements(conn: Any) -> None:
    """Make the session finish a statement whose client is gone (``client_connection_check_interval`` off).

    It is PostgreSQL's default, but a server or role may set it, and then a sent
    append waiting on a lock would be cancelled once its client died.
    """
    import psycopg

    try:
        conn.execute("SET client_connection_check_interval = 0")
    except psycopg.errors.UndefinedObject:  # before PostgreSQL 14: no such check to turn off
        pass


class Wire:
    """Sends prepared one-event appends on a psycopg connection and reads their results."""

    def __init__(self, conn: Any):
        import psycopg
        from psycopg import generators

        self._conn = conn
        self._pg = conn.pgconn
        self._gen = generators
        self._errors = psycopg.errors
        self._names: dict[str, bytes] = {}
        self._types: dict[str, Sequence[int]] = {}  # the parameter types a statement was prepared with, if given
        self._count = 0  # names are never reused, so a name always means the statement it was made for
        # A statement whose result is unread: (name, params, formats).
        self._sent: tuple[bytes, Sequence[bytes | None], Sequence[int] | None] | None = None
        self._poller = select.poll()  # the connection's socket never changes (the journal never resets it)
        self._poller.register(self._pg.socket, select.POLLIN)
        self._poll = self._poller.poll

    @property
    def busy(self) -> bool:
        """A statement was sent and its result is not read yet."""
        return self._sent is not None

    def send(self, sql: str, params: Sequence[bytes | None], formats: Sequence[int] | None = None,
             types: Sequence[int] | None = None, wait: bool = False) -> int | None:
        """Send ``sql`` (prepared under its name on first use, with ``types`` if given) with ``params`` (in
        ``formats``, default all text). ``wait``: read its result too and return the rows it wrote (see
        :meth:`result`); else its result is left unread."""
        name = self._names.get(sql)
        if name is None:
            name = self._prepare(sql, types)
        pg = self._pg
        pg.send_query_prepared(name, params, formats)
        self._sent = (name, params, formats)
        if pg.flush():
            self._flush()
        return self.result() if wait else None

    def _flush(self) -> None:
        """Wait until the rest of the statement sent fits in the socket's buffer."""
        try:
            self._conn.wait(self._gen.send(self._pg))
        except BaseException:
            self._sent = None  # the connection is broken: nothing to read back
            raise

    def result(self) -> int:
        """Read the result of the statement sent last: the rows it wrote (raises psycopg's error).

        Reads until the connection is idle again, as psycopg's ``fetch_many`` does, keeping the last result.
        """
        assert self._sent is not None
        name, params, formats = self._sent
        self._sent = None
        pg = self._pg
        res = None
        try:
            while True:
                while pg.is_busy():  # the answer is not in yet: wait for the socket (the first read would find nothing)
                    self._poll(_POLL_MS)  # a signal ends it: Ctrl-C raises KeyboardInterrupt here
                    pg.consume_input()  # raises psycopg's OperationalError on a broken connection
                last = pg.get_result()
                if last is None:
                    break
                res = last
        except (KeyboardInterrupt, SystemExit):
            self._interrupted()
            raise
        if res is None:  # pragma: no cover - libpq gives every statement a result
            raise self._errors.OperationalError("the server sent no result for an append")
        if res.status == _FATAL:
            err = self._errors.error_from_result(res, encoding=self._conn.info.encoding)
            if err.sqlstate != _MISSING_STATEMENT:
                raise err
            # Gone with a DEALLOCATE ALL (psycopg clears its own statements so after a
            # ROLLBACK or DROP): it did not run, so prepare it again and run it now.
            sql = next(s for s, n in self._names.items() if n == name)
            self._names.clear()
            return self.send(sql, params, formats, self._types.get(sql), True)  # type: ignore[return-value]
        return res.command_tuples or 0

    def _interrupted(self) -> None:
        """Cancel the statement a wait was interrupted in and read what is left, as psycopg's own wait does,
        so the connection can run the next statement; if that fails too, close it (its state is unknown)."""
        try:
            self._conn.cancel_safe(timeout=5.0)
            self._conn.wait(self._gen.fetch_many(self._pg), timeout=5.0)
        except BaseException:  # not cancelled in time, or interrupted again
            self._pg.finish()

    def _prepare(self, sql: str, types: Sequence[int] | None) -> bytes:
        self._count += 1
        name = f"engrain_append_{self._count}".encode()
        self._pg.send_prepare(name, numbered(sql).encode(), types)
        (res,) = self._conn.wait(self._gen.execute(self._pg))
        if res.status == _FATAL:
            raise self._errors.error_from_result(res, encoding=self._conn.info.encoding)
        self._names[sql] = name
        if types is not None:
            self._types[sql] = types
        return name
