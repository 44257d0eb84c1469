"""The floors under ``journal.py``'s per-step figures: one durable commit of a step's row, with no engrain code.

Each floor writes what a default step journals (its ``step.completed`` row,
built before the clock starts) in one autocommit INSERT per step, the cheapest
honest way to commit one row on that store: SQLite through the standard
``sqlite3`` module with engrain's schema and pragmas, PostgreSQL through libpq
itself (psycopg's ``pgconn``: a statement prepared once, then one
``exec_prepared`` round trip per step, no Python adaptation of parameters).
``journal.py`` alternates their repetitions with engrain's, so both see the
same machine load, and states each per-step target against them.
"""

from __future__ import annotations

import json
import pathlib
import sqlite3
import time
import uuid

import engrain as eg


#: Steps that take a WAL past SQLite's 1000-page checkpoint once (a step's commit writes one page or two),
#: so that later commits overwrite it in place: engrain's journal is warmed the same way.
WARM_STEPS = 1000


def _rows(rid: str, n: int, ts: float) -> list[tuple]:
    """A run's ``run.started`` row and its ``n`` ``step.completed`` rows, as the journal stores them."""
    started = (rid, 0, ts, "run.started", "", json.dumps({"task": "bench", "inputs": {"n": n}}))
    return [started] + [
        (
            rid, i + 1, ts, "step.completed", "inc",
            f'{{"call_id":{i},"result":{i + 1},"type":"tool","args":{{"x":{i}}},"started":{ts}}}',
        )
        for i in range(n)
    ]


class Floor:
    """Raw sqlite3 writing a step's completion: what SQLite itself costs for the design.

    engrain's schema (with its triggers) and pragmas, one autocommit INSERT per
    step. ``checkpoints=True``: SQLite's own, inside the commit that passes 1000
    WAL pages, as any plain SQLite program (and engrain's ``full`` journal) pays.
    ``False``: none on the clock; the WAL is checkpointed between repetitions with
    RESTART, which keeps its length, so every timed commit overwrites WAL blocks
    in place as it does in a program whose WAL SQLite reuses. (TRUNCATE there made
    every fsync'd commit also grow the file, and an fsync of a file whose size
    changed commits the filesystem's metadata too: ~2x the cost of a commit.)
    """

    INSERT = "INSERT INTO events (run_id, seq, ts, kind, name, data) VALUES (?, ?, ?, ?, ?, ?)"

    cpu_us = 0.0  # this thread's CPU per step in the last repetition

    def __init__(self, path: pathlib.Path, durability: str, checkpoints: bool = True, encode: bool = False):
        self.checkpoints = checkpoints
        self.encode = encode
        eg.open(f"sqlite:///{path}").close()  # engrain's current schema (its migrations), then raw sqlite3 only
        self.db = sqlite3.connect(str(path), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={'FULL' if durability == 'full' else 'NORMAL'}")
        if not checkpoints:
            self.db.execute("PRAGMA wal_autocheckpoint=0")

    def warm(self, n: int) -> None:
        """Untimed steps until the WAL is as long as the timed repetitions make it.

        Until a WAL first reaches its checkpoint, each commit appends to the file, and
        an fsync of a file whose size changed also commits the filesystem's metadata.
        """
        self.rep(n if not self.checkpoints else max(n, WARM_STEPS))

    def rep(self, n: int) -> float:
        """µs/step of one run of ``n`` steps (wall; ``cpu_us``: this thread's CPU per step in it)."""
        db, insert = self.db, self.INSERT
        started, *steps = _rows(uuid.uuid4().hex, n, time.time())
        db.execute(insert, started)
        if self.encode:
            return self._rep_encoded(started[0], started[2], n)
        c0, t0 = time.thread_time(), time.perf_counter()
        for completed in steps:
            db.execute(insert, completed)
        took = (time.perf_counter() - t0) / n * 1e6
        self.cpu_us = (time.thread_time() - c0) / n * 1e6
        if not self.checkpoints:
            db.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
        return took

    def _rep_encoded(self, rid: str, ts: float, n: int) -> float:
        """:meth:`rep` building each step's record and its JSON in the loop, as any program must (the
        result is known only once the step ran), instead of before the clock starts: the same commits,
        plus the least Python a step can run between two of them."""
        db, insert, dumps = self.db, self.INSERT, json.JSONEncoder(separators=(",", ":")).encode
        c0, t0 = time.thread_time(), time.perf_counter()
        for i in range(n):
            data = {"call_id": i, "result": i + 1, "type": "tool", "args": {"x": i}, "started": ts}
            db.execute(insert, (rid, i + 1, ts, "step.completed", "inc", dumps(data)))
        took = (time.perf_counter() - t0) / n * 1e6
        self.cpu_us = (time.thread_time() - c0) / n * 1e6
        if not self.checkpoints:
            db.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
        return took

    def close(self) -> None:
        self.db.close()


class PgFloor:
    """libpq committing a step's row on the PostgreSQL server engrain's figure uses, with no engrain code.

    engrain's ``engrain_events`` table in the bench's own schema, one prepared
    ``INSERT`` executed in autocommit per step: one round trip, one commit.
    ``full``: ``synchronous_commit = on`` (each commit waits for its WAL flush);
    ``normal``: ``off``, as engrain's ``normal`` sets it.

    ``gated=True`` executes engrain's own fenced step statement instead (the runs row's
    check and ``next_seq`` update, then the INSERT), so the server's share of a step is in
    the floor; ``encode=True`` also builds each step's record, its JSON and its parameters
    in the loop, as :class:`Floor` does. Neither is a target's base: they split engrain's
    cost over the floor into the server's, the least Python's, and the rest.
    """

    INSERT = b"INSERT INTO engrain_events (run_id, seq, ts, kind, name, data) VALUES ($1, $2, $3, $4, $5, $6)"
    #: The statement engrain's PostgreSQL journal appends a fenced step with (``_step_sql`` in its postgres.py).
    GATED = (b"WITH gate AS (UPDATE engrain_runs SET next_seq = $2 + 1 WHERE run_id = $1 AND next_seq = $2"
             b" AND status <> 'ok' AND status <> 'failed' AND status <> 'cancelled'"
             b" AND lease_epoch = $7 RETURNING 1) INSERT INTO engrain_events (run_id, seq, ts, kind, name, data)"
             b" SELECT $1, $2, $3::float8, $4::text, $5::text, $6::text FROM gate")

    cpu_us = 0.0  # this thread's CPU per step in the last repetition

    def __init__(self, url: str, durability: str, gated: bool = False, encode: bool = False):
        import psycopg
        from psycopg import pq

        eg.open(url).close()  # engrain's tables in this schema, then libpq only
        self.gated, self.encode = gated, encode
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(f"SET synchronous_commit = {'on' if durability == 'full' else 'off'}")
        self.pg = self.conn.pgconn
        self.ok = pq.ExecStatus.COMMAND_OK
        res = self.pg.prepare(b"floor_insert", self.GATED if gated else self.INSERT)
        if res.status != self.ok:
            raise RuntimeError(f"PostgreSQL floor: cannot prepare its INSERT: {res.error_message!r}")

    def warm(self, n: int) -> None:
        self.rep(n)

    def rep(self, n: int) -> float:
        """µs/step of one run of ``n`` steps (wall; ``cpu_us``: this thread's CPU per step in it)."""
        rid = uuid.uuid4().hex
        rows = _rows(rid, n, time.time())
        steps = [[str(v).encode() if type(v) is not float else repr(v).encode() for v in r] for r in rows[1:]]
        # The run's start is not timed: its event, and for the gated statement the runs row a durable
        # run's start leaves (next_seq 1, leased at epoch 1), whose epoch each step passes as its fence.
        self.conn.execute("INSERT INTO engrain_events (run_id, seq, ts, kind, name, data) VALUES (%s, %s, %s, %s, %s, %s)",
                          rows[0])
        if self.gated:
            self.conn.execute("INSERT INTO engrain_runs (run_id, status, created, updated, next_seq, lease_epoch)"
                              " VALUES (%s, 'running', 0, 0, 1, 1)", (rid,))
            for row in steps:
                row.append(b"1")
        if self.encode:
            return self._rep_encoded(rid, rows[0][2], n)
        exec_prepared, name, ok = self.pg.exec_prepared, b"floor_insert", self.ok
        c0, t0 = time.thread_time(), time.perf_counter()
        for row in steps:
            res = exec_prepared(name, row)
            if res.status != ok or res.command_tuples != 1:
                raise RuntimeError(f"PostgreSQL floor: INSERT failed: {res.error_message!r}")
        took = (time.perf_counter() - t0) / n * 1e6
        self.cpu_us = (time.thread_time() - c0) / n * 1e6
        return took

    def _rep_encoded(self, rid: str, ts: float, n: int) -> float:
        """:meth:`rep` building each step's record, its JSON and its parameters in the loop (see :class:`Floor`)."""
        exec_prepared, name, ok = self.pg.exec_prepared, b"floor_insert", self.ok
        dumps, key, fence = json.JSONEncoder(separators=(",", ":")).encode, rid.encode(), self.gated
        c0, t0 = time.thread_time(), time.perf_counter()
        for i in range(n):
            data = {"call_id": i, "result": i + 1, "type": "tool", "args": {"x": i}, "started": ts}
            row = [key, str(i + 1).encode(), repr(ts).encode(), b"step.completed", b"inc", dumps(data).encode()]
            if fence:
                row.append(b"1")
            res = exec_prepared(name, row)
            if res.status != ok or res.command_tuples != 1:
                raise RuntimeError(f"PostgreSQL floor: INSERT failed: {res.error_message!r}")
        took = (time.perf_counter() - t0) / n * 1e6
        self.cpu_us = (time.thread_time() - c0) / n * 1e6
        return took

    def close(self) -> None:
        self.conn.close()
