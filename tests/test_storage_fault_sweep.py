"""A systematic storage-fault sweep: the k-th store write of a durable run fails, for every k.

Per scenario (plain and retried tool steps with a clock read, an at-most-once tool, a durable
sleep, a human question and its answer, a worker claiming, parking and claiming again a queued run,
a fork, recover() claiming an orphan, gc in a process that goes on running agents), an undisturbed
pass counts the writes the whole scenario makes; then, for every k from 1 to that count, a fresh run
has its k-th write fail, the store is opened again and the run is driven to its end. Checked each time:

(a) the faulted attempt raises :class:`engrain.StorageError` or finishes (a worker or recover()
    reports the StorageError and carries on), and the store never holds a status the fault caused
    ("failed", or "ok" with another output);
(b) the resumed run ends "ok" with the undisturbed run's output;
(c) no step whose outcome was journaled before the resume executes again (tools log their calls
    outside the store), an at-most-once tool's effect happens exactly once, and a fork never
    executes the steps it copied;
(d) the journal folds cleanly: dense seqs, one start and one end, one outcome per call id, the
    steps of the undisturbed run all finished.

The faults are the drivers' own errors. SQLite: the journal's connection (a ``sqlite3.Connection``
subclass) raises ``disk I/O error`` instead of executing the statement, leaving a transaction open
(mode ``statement``, as after SQLITE_BUSY) or rolling it back first (mode ``rollback``, as SQLite
may on an I/O error or a full disk). PostgreSQL: the backend is terminated (``pg_terminate_backend``
from another connection) just before the statement is sent (mode ``before``), or just after it ran
and committed, so the client gets ``OperationalError`` for a write that landed (mode ``lost-reply``).
A write is an INSERT, UPDATE or DELETE (PostgreSQL's one-event appends on the journal's own wire
path included), or the COMMIT of a transaction that wrote.
"""

from __future__ import annotations

import collections
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

import engrain as eg
from engrain._durable.context import steps_of
from engrain._journal import postgres_wire
from engrain._workers.worker import Worker

_WRITE = re.compile(r"\b(INSERT|UPDATE|DELETE|REPLACE)\b", re.IGNORECASE)
_KINDS = {"run.started", "run.completed", "run.failed", "step.started", "step.completed", "step.failed",
          "input.requested", "input.received"}
_LOST = "server closed the connection unexpectedly (the reply was lost)"


class Faults:
    """Counts the store's writes while armed and makes the ``fail_at``-th one fail."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # worker threads write too
        self.armed = False
        self.count = 0
        self.fail_at: int | None = None
        self.mode = ""
        self.fired: str | None = None  # which write failed
        self.admin: Any = None  # PostgreSQL: the connection that terminates backends

    def arm(self, fail_at: int | None, mode: str = "") -> None:
        with self.lock:
            self.armed, self.count, self.fail_at, self.mode, self.fired = True, 0, fail_at, mode, None

    def disarm(self) -> None:
        with self.lock:
            self.armed = False

    def hit(self, what: str) -> bool:
        """Count one write; True when it is the one to fail."""
        with self.lock:
            if not self.armed:
                return False
            self.count += 1
            if self.count == self.fail_at:
                self.fired = what
            return self.count == self.fail_at

    def terminate(self, conn: Any) -> None:
        # With a timeout, pg_terminate_backend returns once the backend is gone, not when signalled.
        self.admin.execute("SELECT pg_terminate_backend(%s, 5000)", (conn.info.backend_pid,))


FAULTS = Faults()


def _what(sql: str, params: Any) -> str:
    """A fault point's name: the event kind the statement writes, else its first words."""
    for p in params if isinstance(params, (list, tuple)) else ():
        p = p[0] if isinstance(p, list) and p else p  # a batch's kinds column
        p = p.decode(errors="replace") if isinstance(p, bytes) else p
        if isinstance(p, str) and p in _KINDS:
            return p
    return " ".join(sql.split()[:3])


def _verb(sql: str) -> str:
    return sql.lstrip()[:8].upper()


def _sqlite_gate(conn: Any, sql: str, params: Any) -> None:
    """Before a statement on the SQLite connection: count it if it writes, fail it if it is the one."""
    verb = _verb(sql)
    if verb.startswith(("COMMIT", "END")):
        dirty, conn.dirty, what = getattr(conn, "dirty", False), False, "COMMIT"
    elif verb.startswith(("BEGIN", "ROLLBACK")):
        conn.dirty = False
        return
    elif _WRITE.match(sql.lstrip()):
        dirty = conn.dirty = True
        what = _what(sql, params)
    else:
        return
    if dirty and FAULTS.hit(what):
        if FAULTS.mode == "rollback" and conn.in_transaction:
            sqlite3.Connection.execute(conn, "ROLLBACK")
        e = sqlite3.OperationalError("disk I/O error")
        e.sqlite_errorcode = 10  # SQLITE_IOERR
        raise e


class _Cursor(sqlite3.Cursor):
    def execute(self, sql, parameters=(), /):  # type: ignore[override]
        _sqlite_gate(self.connection, sql, parameters)
        return super().execute(sql, parameters)

    def executemany(self, sql, seq, /):  # type: ignore[override]
        seq = list(seq)
        if seq:
            _sqlite_gate(self.connection, sql, seq[0])
        return super().executemany(sql, seq)


class _Connection(sqlite3.Connection):
    """Its statements pass :func:`_sqlite_gate` (the C ``execute`` would not call an overridden ``cursor``)."""

    def cursor(self, factory=_Cursor):  # type: ignore[override]
        return super().cursor(factory)

    def execute(self, sql, parameters=(), /):  # type: ignore[override]
        return self.cursor().execute(sql, parameters)

    def executemany(self, sql, seq, /):  # type: ignore[override]
        return self.cursor().executemany(sql, seq)


def _pg_write(conn: Any, what: str, call: Callable[[], Any]) -> Any:
    """Run the PostgreSQL write ``call`` on ``conn``, or fail it as the mode says."""
    if not FAULTS.hit(what):
        return call()
    if FAULTS.mode == "before":
        FAULTS.terminate(conn)
        return call()  # meets the terminated backend
    call()
    FAULTS.terminate(conn)
    raise psycopg.OperationalError(_LOST)


class _PgCursor(psycopg.Cursor):
    def execute(self, query, params=None, **kw):  # type: ignore[override]
        sql = query if isinstance(query, str) else str(query)
        if _verb(sql).startswith("SELECT") or not _WRITE.search(sql):
            return super().execute(query, params, **kw)
        self.connection.engrain_dirty = True
        return _pg_write(self.connection, _what(sql, params), lambda: super(_PgCursor, self).execute(query, params, **kw))


def _pg_instrument(conn: Any) -> Any:
    """``conn`` with its cursors' writes and its transaction blocks' COMMITs going through :data:`FAULTS`."""
    conn.cursor_factory = _PgCursor
    plain = conn._exec_command  # psycopg sends a transaction block's BEGIN, COMMIT and ROLLBACK with it

    def exec_command(command: Any, *args: Any, **kw: Any) -> Any:
        verb = _verb(command.decode() if isinstance(command, bytes) else str(command))
        dirty = getattr(conn, "engrain_dirty", False)
        if verb.startswith(("BEGIN", "ROLLBACK", "COMMIT")):
            conn.engrain_dirty = False
        if not (verb.startswith("COMMIT") and dirty and FAULTS.hit("COMMIT")):
            return (yield from plain(command, *args, **kw))
        if FAULTS.mode == "before":
            FAULTS.terminate(conn)
            return (yield from plain(command, *args, **kw))
        yield from plain(command, *args, **kw)
        FAULTS.terminate(conn)
        raise psycopg.OperationalError(_LOST)

    conn._exec_command = exec_command
    return conn


@pytest.fixture
def faults(store_url, monkeypatch):
    """Every journal opened from now on passes its writes through :data:`FAULTS` (disarmed until armed)."""
    connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **kw: connect(*a, **{"factory": _Connection, **kw}))
    monkeypatch.setattr(psycopg, "connect", lambda *a, **kw: _pg_instrument(psycopg.Connection.connect(*a, **kw)))
    send = postgres_wire.Wire.send
    monkeypatch.setattr(postgres_wire.Wire, "send", lambda self, sql, params, *a, **kw: _pg_write(
        self._conn, _what(sql, params), lambda: send(self, sql, params, *a, **kw)))
    if store_url.startswith("postgresql"):
        FAULTS.admin = psycopg.Connection.connect(store_url, autocommit=True)
    FAULTS.disarm()
    yield FAULTS
    FAULTS.disarm()
    if FAULTS.admin is not None:
        FAULTS.admin.close()
        FAULTS.admin = None


# -- tools and agents ---------------------------------------------------------------------------------

#: (run id, call id, tool, result) of every tool call, kept outside the store.
EFFECTS: list[tuple[str, int, str, Any]] = []
_tools = eg.ToolRegistry()


def _effect(name: str, result: Any) -> Any:
    rid, _, n = eg.idempotency_key().rpartition(":")
    EFFECTS.append((rid, int(n), name, result))
    return result


@eg.tool(registry=_tools)
def fetch(x: int) -> int:
    return _effect("fetch", x * 2)


@eg.tool(registry=_tools, retries=1, backoff=0.0)
def flaky(x: int) -> int:
    rid, _, n = eg.idempotency_key().rpartition(":")
    first = not any(e[0] == rid and e[1] == int(n) for e in EFFECTS)
    _effect("flaky", None if first else x + 100)
    if first:
        raise RuntimeError("the first attempt fails")  # journaled as a step.failed with retry_in
    return x + 100


@eg.tool(registry=_tools, at_most_once=True)
def pay(amount: int) -> str:
    return _effect("pay", f"paid {amount}")


def plain_agent(task: str) -> Any:
    a, b = fetch(1), fetch(2)
    eg.now()
    return [a, b, flaky(a + b)]


def once_agent(task: str) -> Any:
    return [fetch(1), pay(5), fetch(3)]


def sleep_agent(task: str) -> Any:
    a = fetch(1)
    eg.sleep(0.02)
    return [a, fetch(2)]


def human_agent(task: str) -> Any:
    a = fetch(1)
    ans = eg.ask("approve?", [{"name": "ok", "type": "boolean"}])
    return [a, ans, fetch(2) if ans.get("ok") else 0]


def queued_agent(task: str, n: int) -> Any:
    a = fetch(n)
    eg.sleep(0.25)  # past the worker's park_after: parked, then claimed again
    return [a, fetch(n + 1)]


def four_agent(task: str) -> Any:
    return [fetch(k) for k in range(4)]


_DIES = threading.Event()  # set while the run's first process executes it


def orphan_agent(task: str) -> Any:
    a = fetch(1)
    if _DIES.is_set():
        raise SystemExit("the process dies")  # the run stays resumable, leased by nobody: an orphan
    return [a, fetch(2)]


# -- drivers: from any state of the scenario to the run's end ------------------------------------------


def _answer_for(rid: str, prompt: dict[str, Any]) -> dict[str, Any]:
    """An operator's answer: to "did this step happen?" from the effects, else the approval."""
    if not prompt.get("at_most_once"):
        return {"ok": True}
    done = [e[3] for e in EFFECTS if e[0] == rid and e[1] == prompt["call_id"]]
    return {"result": done[-1]} if done else {"retry": True}


def _run_to_end(j: Any, rid: str, agent: Callable[..., Any]) -> tuple[str, Any]:
    for _ in range(6):
        res = eg.run(agent, "sweep", run_id=rid, journal=j, agent_name=agent.__name__)
        if res.status != "needs_input":
            return res.status, res.output
        eg.answer(rid, _answer_for(rid, res.prompt), journal=j)
    raise AssertionError(f"run {rid} kept asking")


def _ended(j: Any, rid: str) -> tuple[str, Any] | None:
    info = j.get_run(rid)
    if info is None or info.status not in ("ok", "failed"):
        return None
    return info.status, j.read(rid)[-1].data.get("output")


def _drive_worker(j: Any, rid: str, errors: list[str]) -> tuple[str, Any]:
    queue = "q-" + rid
    if j.get_run(rid) is None:
        eg.enqueue("queued_agent", "sweep", queue=queue, run_id=rid, inputs={"n": 1}, journal=j)
    for _ in range(5):
        w = Worker(j, {"queued_agent": queued_agent}, [queue], poll=0.02, ttl=1.0, park_after=0.1, grace=5.0)
        errors.extend(w.run(until_idle=True).errors)  # a worker records what it met, and goes on
        if ended := _ended(j, rid):
            return ended
    raise AssertionError(f"the workers left run {rid} {j.get_run(rid).status}")


def _drive_fork(j: Any, rid: str, errors: list[str]) -> tuple[str, Any]:
    if j.get_run(rid) is None:
        eg.fork("source", 2, run_id=rid, journal=j)
    return _run_to_end(j, rid, four_agent)


def _orphan(j: Any, rid: str) -> None:
    _DIES.set()
    try:
        eg.run(orphan_agent, "sweep", run_id=rid, journal=j, agent_name="orphan_agent")
    except SystemExit:
        pass
    finally:
        _DIES.clear()


def _drive_recover(j: Any, rid: str, errors: list[str]) -> tuple[str, Any]:
    for _ in range(10):
        if ended := _ended(j, rid):
            return ended
        # A claim whose reply was lost leased the run all the same: claimed again once that lease expires.
        mine = [r for r in eg.recover({"orphan_agent": orphan_agent}, journal=j, ttl=0.5) if r.run_id == rid]
        if mine and mine[0].status != "error":
            return mine[0].status, mine[0].output
        errors.extend(r.error for r in mine)  # recover() reports a run it could not resume, and goes on
        if not mine:
            time.sleep(0.2)
    raise AssertionError(f"recover() left run {rid}: {errors}")


def _drive_gc(j: Any, rid: str, errors: list[str]) -> tuple[str, Any]:
    if j.get_run(rid) is None:
        # A long-lived process (a server) collects old runs now and then, and goes on running agents
        # on the same journal when that fails.
        _run_to_end(j, rid + "-old", four_agent)
        try:
            eg.gc(0, journal=j)
        except eg.StorageError as e:
            errors.append(f"gc: StorageError: {e}")
    return _run_to_end(j, rid, plain_agent)


@dataclass
class Scenario:
    drive: Callable[[Any, str, list[str]], tuple[str, Any]]
    #: Called with no fault armed before each pass: the state the swept part starts from.
    prepare: Callable[[Any, str], None] | None = None
    at_most_once: tuple[str, ...] = ()
    copied: int = 0  # steps a fork copied: never executed by the forked run
    cleanup: bool = False  # gc the finished runs after each pass, so each pass's gc finds the same ones
    fault_points: list[str] = field(default_factory=list)


def _plain(agent: Callable[..., Any], **kw: Any) -> Scenario:
    return Scenario(lambda j, rid, errors: _run_to_end(j, rid, agent), **kw)


SCENARIOS = {
    "plain": _plain(plain_agent),
    "at_most_once": _plain(once_agent, at_most_once=("pay",)),
    "sleep": _plain(sleep_agent),
    "human": _plain(human_agent),
    "worker": Scenario(_drive_worker),
    "fork": Scenario(_drive_fork, copied=2),
    "recover": Scenario(_drive_recover, prepare=_orphan),
    "gc": Scenario(_drive_gc, cleanup=True),
}


# -- the sweep -------------------------------------------------------------------------------------------


def _attempt(sc: Scenario, j: Any, rid: str) -> tuple[tuple[str, Any] | None, eg.StorageError | None, list[str]]:
    errors: list[str] = []
    try:
        return sc.drive(j, rid, errors), None, errors
    except eg.StorageError as e:
        return None, e, errors


def _check_journal(j: Any, rid: str, baseline: dict[int, str]) -> None:
    events = j.read(rid)
    assert [e.seq for e in events] == list(range(len(events))), "seqs are not dense"
    kinds = [e.kind for e in events]
    assert kinds[0] == "run.started" and kinds.count("run.started") == 1, kinds
    assert kinds[-1] == "run.completed" and kinds.count("run.completed") == 1 and "run.failed" not in kinds, kinds
    outcomes = [e.data["call_id"] for e in events
                if e.kind == "step.completed" or (e.kind == "step.failed" and "retry_in" not in e.data)]
    assert len(outcomes) == len(set(outcomes)), f"a call id has two outcomes: {outcomes}"
    steps = steps_of(events)
    assert {c: s.name for c, s in steps.items()} == baseline
    assert all(s.state in ("completed", "answered") for s in steps.values()), {c: s.state for c, s in steps.items()}


def _one(url: str, sc: Scenario, rid: str, mode: str, k: int, expected: Any, baseline: dict[int, str]) -> None:
    j = eg.open(url)
    if sc.prepare is not None:
        sc.prepare(j, rid)
    FAULTS.arm(k, mode)
    try:
        ended, err, errors = _attempt(sc, j, rid)
    finally:
        FAULTS.disarm()
    where = f"{rid}, the write failed at {FAULTS.fired}"
    assert FAULTS.fired is not None, f"{rid}: fewer writes than the undisturbed pass made ({FAULTS.count})"
    sc.fault_points.append(FAULTS.fired)
    # (a) a StorageError or the end; what a worker or recover() met is a StorageError too
    assert err is not None or ended == ("ok", expected), f"{where}: {ended}"
    assert all("StorageError" in e for e in errors), f"{where}: {errors}"
    try:
        j.close()
    except eg.EngrainError:
        pass
    j = eg.open(url)
    try:
        info = j.get_run(rid)
        assert info is None or info.status != "failed", f"{where}: the store's fault failed the run: {j.read(rid)[-1]}"
        assert info is None or info.status != "ok" or _ended(j, rid) == ("ok", expected), f"{where}: another output"
        done = {c for c, s in steps_of(j.read(rid)).items() if s.state in ("completed", "answered", "failed")}
        seen = len(EFFECTS)
        # (b) on the store opened again, the run ends as the undisturbed one did
        assert sc.drive(j, rid, []) == ("ok", expected), where
        # (c) nothing journaled runs again, at-most-once effects happen once, a fork's copied steps never
        again = [e for e in EFFECTS[seen:] if e[0] == rid and e[1] in done]
        assert not again, f"{where}: journaled steps executed again: {again}"
        for (cid, tool), n in collections.Counter((e[1], e[2]) for e in EFFECTS if e[0] == rid).items():
            assert tool not in sc.at_most_once or n == 1, f"{where}: {tool} ran {n} times"
            assert cid >= sc.copied, f"{where}: the fork executed copied step {cid}"
        # (d) the journal folds cleanly
        _check_journal(j, rid, baseline)
        if sc.cleanup:
            eg.gc(0, journal=j)
    finally:
        j.close()


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_write_of_a_run_may_fail(store_url, faults, name):
    sc = SCENARIOS[name]
    sc.fault_points.clear()
    EFFECTS.clear()
    modes = ("before", "lost-reply") if store_url.startswith("postgresql") else ("statement", "rollback")
    started = time.monotonic()
    j = eg.open(store_url)
    if name == "fork":
        assert eg.run(four_agent, "sweep", run_id="source", journal=j, agent_name="four_agent").status == "ok"
    if sc.prepare is not None:
        sc.prepare(j, "base")
    FAULTS.arm(None)
    ended, err, errors = _attempt(sc, j, "base")
    writes = FAULTS.count
    FAULTS.disarm()
    assert err is None and ended is not None and ended[0] == "ok" and not errors, (err, ended, errors)
    baseline = {c: s.name for c, s in steps_of(j.read("base")).items()}
    if sc.cleanup:
        eg.gc(0, journal=j)
    j.close()
    for mode in modes:
        for k in range(1, writes + 1):
            _one(store_url, sc, f"{name}-{mode}-{k}", mode, k, ended[1], baseline)
    points = dict(collections.Counter(sc.fault_points))
    print(f"\n{name} on {store_url.split(':')[0]}: {writes} writes x {modes} in {time.monotonic() - started:.1f}s:"
          f" {points}")
    assert writes > 0 and len(sc.fault_points) == writes * len(modes)


def test_a_recovery_claim_on_a_locked_sqlite_store_is_a_storage_error(tmp_path):
    """Another process holding the write lock past the timeout: claim_runs' BEGIN IMMEDIATE failed outside its
    error handling, so recover() raised a bare sqlite3 "database is locked" instead of a StorageError."""
    import sqlite3

    from engrain._journal.sqlite import SQLiteJournal

    path = tmp_path / "locked.db"
    j = SQLiteJournal(path, timeout=0.2)
    holder = sqlite3.connect(str(path), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(eg.StorageError):
            j.claim_runs("me", 30.0, 10)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert j.claim_runs("me", 30.0, 10) == []  # nothing left open on the journal's connection
    j.close()
