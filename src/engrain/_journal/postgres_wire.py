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
"""

from __future__ import annotations

from typing import Any

_FATAL = 7  # psycopg.pq.ExecStatus.FATAL_ERROR
_MISSING_STATEMENT = "26000"  # invalid_sql_statement_name: our prepared statement is gone (DEALLOCATE ALL)


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
        self._count = 0  # names are never reused, so a name always means the statement it was made for
        self._sent: tuple[bytes, list[bytes | None]] | None = None  # a statement whose result is unread

    @property
    def busy(self) -> bool:
        """A statement was sent and its result is not read yet."""
        return self._sent is not None

    def send(self, sql: str, params: list[bytes | None]) -> None:
        """Send ``sql`` (prepared under its name on first use) with ``params``; its result is left unread."""
        name = self._names.get(sql)
        if name is None:
            name = self._prepare(sql)
        self._pg.send_query_prepared(name, params)
        self._sent = (name, params)
        try:
            self._conn.wait(self._gen.send(self._pg))  # every byte handed to the kernel before returning
        except BaseException:
            self._sent = None  # the connection is broken: nothing to read back
            raise

    def result(self) -> int:
        """Read the result of the statement sent last: the rows it wrote (raises psycopg's error)."""
        assert self._sent is not None
        name, params = self._sent
        self._sent = None
        results = self._conn.wait(self._gen.fetch_many(self._pg))
        res = results[-1]
        if res.status == _FATAL:
            err = self._errors.error_from_result(res, encoding=self._conn.info.encoding)
            if err.sqlstate != _MISSING_STATEMENT:
                raise err
            # Gone with a DEALLOCATE ALL (psycopg clears its own statements so after a
            # ROLLBACK or DROP): it did not run, so prepare it again and run it now.
            sql = next(s for s, n in self._names.items() if n == name)
            self._names.clear()
            self.send(sql, params)
            return self.result()
        return res.command_tuples or 0

    def _prepare(self, sql: str) -> bytes:
        self._count += 1
        name = f"engrain_append_{self._count}".encode()
        self._pg.send_prepare(name, numbered(sql).encode())
        (res,) = self._conn.wait(self._gen.execute(self._pg))
        if res.status == _FATAL:
            raise self._errors.error_from_result(res, encoding=self._conn.info.encoding)
        self._names[sql] = name
        return name
