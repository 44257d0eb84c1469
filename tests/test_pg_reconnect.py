"""A PostgreSQL connection the server dropped is replaced by the next call (``engrain._journal.pglink``).

The server ends a backend (``pg_terminate_backend``: what a restart does to every
client), and says so on the socket before closing it: the next call of the same
object sees that and goes to a new connection, in the journal, the queue tables that
share its connection, memory (with and without pgvector) and the behavior cache, and
no call fails. A loss the socket does not show (the ``unseen`` fixture: as a network
partition would be) fails the call that meets the dead connection with a
StorageError naming the store; the call after it connects anew. Against the real
test server.
"""

from __future__ import annotations

import select
import uuid

import numpy as np
import psycopg
import pytest

import engrain as eg
from engrain._cache.store import CacheStore, Entry
from engrain._journal import parse_url
from engrain._journal import pglink
from engrain._journal.pglink import RevivingLock
from engrain._workers.store import QueueStore
from test_memory import PGVECTOR_URL, drop_pgvector_schema, pgvector_schema_url


def _drop(url: str, db: psycopg.Connection) -> None:
    """End ``db``'s backend from another connection, as a server restart would, and wait for its
    farewell to reach ``db``'s socket (the backend exits on its own time)."""
    with psycopg.connect(parse_url(url)[1], autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (db.info.backend_pid,)).fetchone()[0]
    poller = select.poll()
    poller.register(db.fileno(), select.POLLIN)
    assert poller.poll(10_000), "the ended backend's socket never became readable"


@pytest.fixture
def unseen(monkeypatch):
    """Drops the socket does not show (a network partition, a host gone without a word): only the
    call that meets the dead connection learns of it."""
    monkeypatch.setattr(pglink, "_readable", lambda fd: False)


def test_journal_connects_anew_after_the_server_dropped_it(pg_url, unseen):
    j = eg.open(pg_url)
    queues = QueueStore(j)
    queues.declare("q", concurrency=2)
    first = j._db
    _drop(pg_url, first)
    with pytest.raises(eg.StorageError) as err:
        j.get_run("nothing")
    assert "engrain:engrain@" not in str(err.value) and "resume it" in str(err.value)
    assert j.get_run("nothing") is None  # the next call has a new connection
    assert j._db is not first and first.closed and not j._db.closed
    # The queue tables read the journal's connection as it is now, not the one they were made with.
    assert [q.name for q in queues.queues()] == ["q"]
    # One-event appends (the prepared wire statements) work on the new connection.
    j.append("r", [eg.NewEvent("run.started", "", {"task": "t"})], 0)
    j.append_one("r", "step.completed", "s", {"result": 1}, 1)
    assert [e.kind for e in j.read("r")] == ["run.started", "step.completed"]
    j.close()


def test_append_in_flight_when_the_connection_drops_fails_that_run_s_next_append(pg_url):
    """An append sent without waiting whose result was never read may or may not have landed: the run's
    next append raises, and the journal goes on working for every run. (The socket is readable with the
    append's result anyway, so the farewell behind it is not read before the call.)"""
    j = eg.open(pg_url)
    j.append("r", [eg.NewEvent("run.started", "", {"task": "t"})], 0)
    j.append_one("r", "step.completed", "a", {"result": 1}, 1, durable=False, wait=False)
    _drop(pg_url, j._db)
    with pytest.raises(eg.StorageError):
        j.append_one("r", "step.completed", "b", {"result": 2}, 2)
    names = [e.name for e in j.read("r")]
    assert names in (["", "a"], [""])  # whether "a" landed is the server's to say, never "b"
    j.append("other", [eg.NewEvent("run.started", "", {"task": "t"})], 0)
    assert j.get_run("other").status == "running"
    j.close()


def test_a_server_still_down_keeps_failing_then_heals(pg_url, unseen, monkeypatch):
    j = eg.open(pg_url)
    _drop(pg_url, j._db)
    with pytest.raises(eg.StorageError):
        j.get_run("x")  # meets the dead connection

    def refuse(*a, **k):
        raise psycopg.OperationalError("connection refused (server restarting)")

    with monkeypatch.context() as m:
        m.setattr(psycopg, "connect", refuse)
        for _ in range(2):  # each call tries again, and says so
            with pytest.raises(eg.StorageError, match="server restarting"):
                j.get_run("x")
    assert j.get_run("x") is None
    j.close()


def test_closing_a_dropped_journal_opens_no_new_connection(pg_url, unseen, monkeypatch):
    j = eg.open(pg_url)
    _drop(pg_url, j._db)
    with pytest.raises(eg.StorageError):
        j.get_run("x")
    with monkeypatch.context() as m:
        m.setattr(psycopg, "connect", lambda *a, **k: pytest.fail("close() connected"))
        j.close()
        # A closed journal stays closed: no new connection, and an error no wait would mend (not a StorageError).
        with pytest.raises(eg.EngrainError, match="was closed") as err:
            j.get_run("x")
        assert not isinstance(err.value, eg.StorageError)
    assert j._db.closed


def test_a_transaction_is_never_moved_to_a_new_connection():
    """The connection is replaced on the lock's outermost entry only: inside a call (and its transaction),
    a nested entry sees the same connection even when it broke."""
    calls: list[int] = []
    lock = RevivingLock()
    lock.revive = lambda: calls.append(1)
    with lock:
        with lock:
            with lock:
                pass
    assert calls == [1]
    with lock:
        pass
    assert calls == [1, 1]

    def fail() -> None:
        raise eg.StorageError("db", "down")

    lock.revive = fail
    with pytest.raises(eg.StorageError):
        with lock:
            pytest.fail("entered")
    lock.revive = None
    with lock:  # the failed entry released the lock and its depth
        pass


def _memory_round(url: str) -> None:
    m = eg.Memory(url)
    try:
        m.remember("the invoice for ACME is due on Friday", skill="ops")
        m.remember("deploys happen on Tuesdays after standup", skill="ops")
        first = m.store._db
        _drop(url, first)
        with pytest.raises(eg.StorageError) as err:
            m.recall("when is the ACME invoice due", skill="ops")
        assert "retry once the store works again" in str(err.value) and "engrain:engrain@" not in str(err.value)
        hits = m.recall("when is the ACME invoice due", skill="ops")
        assert hits and "ACME" in hits[0].content
        assert m.store._db is not first
        m.remember("the office closes at six", skill="ops", metadata={"kind": "hours"})
        _drop(url, m.store._db)
        with pytest.raises(eg.StorageError):
            m.remember("lost with the connection?", skill="ops")
        assert m.stats()["records"] in (3, 4)  # that remember's transaction committed whole or not at all
        found = m.find({"kind": "hours"}, skill="ops")
        assert [r.content for r in found] == ["the office closes at six"]
    finally:
        m.close()


def test_memory_connects_anew_after_the_server_dropped_it(pg_url, unseen):
    _memory_round(pg_url)


@pytest.mark.skipif(not PGVECTOR_URL, reason="needs $ENGRAIN_TEST_PGVECTOR_URL (scripts/pgvector.sh)")
def test_memory_on_pgvector_connects_anew_with_its_vector_settings(unseen):
    schema = "t_" + uuid.uuid4().hex[:12]
    url = pgvector_schema_url(schema)
    try:
        with eg.Memory(url) as m:
            assert m.vector_search == "pgvector"
        _memory_round(url)
        with eg.Memory(url) as m:  # the new connection sends vectors and searches HNSW as the first did
            _drop(url, m.store._db)
            with pytest.raises(eg.StorageError):
                m.stats()
            assert m.recall("invoice", skill="ops")
            assert m.store._db.execute("SHOW hnsw.ef_search").fetchone()[0] != ""
    finally:
        drop_pgvector_schema(schema)


def test_cache_store_connects_anew_after_the_server_dropped_it(pg_url, unseen):
    j = eg.open(pg_url)
    store = CacheStore(j)
    e = Entry(id="e1", task_key="k", tags_key="t", task="say hi", tags=[], steps=[], output={"value": "hi"},
              run_id="r1", created=1.0, last_used=1.0)
    store.put(e)
    _drop(pg_url, store._db)
    with pytest.raises(eg.StorageError):
        store.candidates("k")
    assert [c.id for c in store.candidates("k")] == ["e1"]
    assert store.get("e1") is not None
    store.record_hit("e1")  # batched, written by close
    store.close()
    again = CacheStore(j)
    assert again.get("e1").successes == 2
    again.close()
    j.close()


def test_closing_a_dropped_cache_store_opens_no_new_connection(pg_url, unseen, monkeypatch):
    """Its batched counters are advisory: lost with the connection, and the store still closes."""
    j = eg.open(pg_url)
    store = CacheStore(j)
    store.bump("lookups")
    _drop(pg_url, store._db)
    with monkeypatch.context() as m:
        m.setattr(psycopg, "connect", lambda *a, **k: pytest.fail("close() connected"))
        store.close()
    assert store._db.closed
    with pytest.raises(eg.EngrainError, match="was closed"):
        store.candidates("k")
    j.close()


def test_queue_tables_read_the_journal_s_append_in_flight_first(pg_url):
    """A worker claims on the journal's connection while an agent's append sent without waiting is unread:
    the queue tables settle it first instead of failing with "another command is already in progress"."""
    j = eg.open(pg_url)
    queues = QueueStore(j)
    j.append("r", [eg.NewEvent("run.started", "", {"task": "t"})], 0)
    j.append_one("r", "step.completed", "a", {"result": 1}, 1, durable=False, wait=False)
    assert queues.queues() == []
    assert [e.name for e in j.read("r")] == ["", "a"]
    j.close()


def test_vectors_travel_on_the_new_connection(pg_url, unseen):
    """Memory on PostgreSQL without pgvector: the in-process mirror catches up through the new connection."""
    m = eg.Memory(pg_url, vector_search="local")
    try:
        m.remember("alpha beta gamma", skill="s")
        _drop(pg_url, m.store._db)
        with pytest.raises(eg.StorageError):
            m.recall("alpha", skill="s")
        m.remember("delta epsilon", skill="s")
        got = m.recall("delta epsilon", skill="s")
        assert got[0].content == "delta epsilon"
        assert np.isfinite(got[0].score)
    finally:
        m.close()


def test_agents_shared_memory_and_cache_close_cleanly_at_exit(pg_url, tmp_path):
    """An agent's memory and cache (shared per store by the agents of a process) are closed at exit:
    no connection is left for the interpreter to drop, with a warning, at shutdown."""
    import subprocess
    import sys

    script = tmp_path / "agent.py"
    script.write_text(
        "import engrain as eg\n"
        "from engrain.testing import FunctionModel\n"
        "j = eg.open(URL)\n"
        "a = eg.Agent('helper', FunctionModel(['noted']), 'Help.', [], journal=j, memory='notes', cache=True)\n"
        "assert a.run('remember the code 4411').output == 'noted'\n"
        "j.close()\n".replace("URL", repr(pg_url)))
    out = subprocess.run([sys.executable, "-X", "dev", "-W", "always::ResourceWarning", str(script)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "still open" not in out.stderr and "ResourceWarning" not in out.stderr, out.stderr
    with eg.Memory(pg_url) as m:
        assert any("4411" in r.content for r in m.recall("code", skill="notes"))


def test_server_answers_503_while_the_store_is_lost_then_serves_again(pg_url, unseen, tmp_path):
    """Over HTTP a lost store is the server's condition, not a bad request: 503 with the StorageError,
    and the next request is served on a new connection (journal and memory alike)."""
    from fastapi.testclient import TestClient

    from engrain._server import create_app

    app = create_app(pg_url, routines_dir=tmp_path / "routines")
    with TestClient(app, base_url="http://127.0.0.1") as c:
        assert c.post("/api/memory/remember", json={"data": "the VPN gateway is vpn2", "skill": "it"}).status_code == 200
        state = app.state.engrain
        for db in (state.journal._db, state.memory().store._db):
            _drop(pg_url, db)
        r = c.post("/api/memory/recall", json={"query": "which VPN gateway", "skill": "it"})
        assert r.status_code == 503 and r.json()["error"] == "StorageError", r.text
        assert r.headers["retry-after"] == "1"
        assert "engrain:engrain@" not in r.text
        r = c.post("/api/memory/recall", json={"query": "which VPN gateway", "skill": "it"})
        assert r.status_code == 200 and "vpn2" in r.text
        assert c.get("/api/runs").status_code in (200, 503)  # the journal's first call meets its dead connection
        assert c.get("/api/runs").status_code == 200


def test_a_worker_waits_out_a_lost_store_and_goes_on(pg_url, unseen):
    """A worker whose store went away keeps polling (waits doubling up to OUTAGE_WAIT) on a new connection
    instead of stopping, and runs what is queued once the database answers."""
    from engrain._workers.worker import Worker

    def agent(task: str) -> str:
        return task.upper()

    j = eg.open(pg_url)
    rid = eg.enqueue(agent, "ship it", queue="jobs", journal=j)
    _drop(pg_url, j._db)
    stats = Worker(j, {"agent": agent}, ["jobs"], poll=0.02).run(until_idle=True)
    assert stats.finished == {"ok": 1}, stats
    assert stats.errors and stats.errors[0].startswith("store unavailable: ") and "engrain:engrain@" not in stats.errors[0]
    assert j.get_run(rid).status == "ok"
    j.close()


def test_a_worker_run_until_idle_gives_up_on_a_store_that_stays_down(pg_url, monkeypatch):
    from engrain._workers import worker as worker_mod

    j = eg.open(pg_url)
    w = worker_mod.Worker(j, {"agent": lambda task: task}, ["jobs"], poll=0.001)
    tries = []

    def down(*a, **k):
        tries.append(1)
        raise eg.StorageError("db", "the server is down")

    monkeypatch.setattr(w.store, "claim", down)
    with pytest.raises(eg.StorageError, match="the server is down"):
        w.run(until_idle=True)
    assert len(tries) == worker_mod.IDLE_OUTAGE_TRIES + 1
    j.close()


@pytest.mark.parametrize("open_", [eg.open, eg.Memory], ids=["journal", "memory"])
def test_a_server_that_cannot_be_reached_at_open_is_a_config_error(open_):
    with pytest.raises(eg.ConfigError, match="cannot connect to PostgreSQL at") as err:
        open_("postgresql://engrain:hunter2@127.0.0.1:1/engrain")
    assert "hunter2" not in str(err.value)


def test_the_python_client_retries_a_read_the_store_could_not_serve(pg_url, unseen, tmp_path):
    """eg.Client tries a GET answered 503 again after its Retry-After: the server connected anew meanwhile."""
    from fastapi.testclient import TestClient

    from engrain._server import create_app

    import httpx

    app = create_app(pg_url, routines_dir=tmp_path / "routines")
    with TestClient(app, base_url="http://127.0.0.1") as tc:
        def forward(request: httpx.Request) -> httpx.Response:  # eg.Client's requests, served in process
            r = tc.request(request.method, str(request.url), headers=dict(request.headers), content=request.content)
            return httpx.Response(r.status_code, headers=dict(r.headers), content=r.content)

        transport = httpx.MockTransport(forward)
        client = eg.Client("http://127.0.0.1", transport=transport)
        assert client.runs() == []
        _drop(pg_url, app.state.engrain.journal._db)
        assert client.runs() == []  # 503 once, then served
        _drop(pg_url, app.state.engrain.journal._db)
        with pytest.raises(eg.RemoteError) as err:
            eg.Client("http://127.0.0.1", transport=transport, max_retries=0).runs()
        assert err.value.status == 503 and err.value.error == "StorageError"
    with pytest.raises(eg.ConfigError, match="max_retries"):
        eg.Client(max_retries=-1)


def test_a_drop_the_socket_shows_costs_no_call(pg_url, tmp_path):
    """A restart's farewell is on the socket before the next call: journal, queue tables, memory (with its
    in-process mirror too) and the cache go to a new connection, and nothing fails."""
    j = eg.open(pg_url)
    queues = QueueStore(j)
    queues.declare("q", concurrency=2)
    j.append("r", [eg.NewEvent("run.started", "", {"task": "t"})], 0)
    first = j._db
    _drop(pg_url, first)
    assert j.get_run("r").status == "running"
    assert j._db is not first and first.closed
    _drop(pg_url, j._db)
    j.append_one("r", "step.completed", "s", {"result": 1}, 1)  # a prepared wire statement, on the new connection
    _drop(pg_url, j._db)
    assert [q.name for q in queues.queues()] == ["q"]
    store = CacheStore(j)
    store.put(Entry(id="e1", task_key="k", tags_key="t", task="say hi", tags=[], steps=[], output={"value": "hi"},
                    run_id="r1", created=1.0, last_used=1.0))
    _drop(pg_url, store._db)
    assert [c.id for c in store.candidates("k")] == ["e1"]
    store.close()
    for search in ("auto", "local"):
        with eg.Memory(pg_url, vector_search=search) as m:
            m.remember(f"the {search} invoice for ACME is due on Friday", skill=f"ops-{search}")
            _drop(pg_url, m.store._db)
            assert f"{search} invoice" in m.recall("when is the ACME invoice due", skill=f"ops-{search}")[0].content
            _drop(pg_url, m.store._db)
            m.remember("the office closes at six", skill=f"ops-{search}")
            assert m.stats()["records"] >= 2
    j.close()


def test_a_run_whose_connection_the_server_ends_between_steps_goes_on(pg_url):
    """The server ends the run's connection while a tool runs (and says so): the tool's result is recorded
    on a new connection, the run finishes, and the tool ran once."""
    j = eg.open(pg_url)
    calls: list[int] = []

    @eg.tool(registry=eg.ToolRegistry())
    def cut() -> int:
        calls.append(1)
        _drop(pg_url, j._db)
        return 1

    def agent(task: str) -> int:
        return cut() + 1

    assert eg.run(agent, "cut", run_id="goes-on", journal=j).output == 2
    assert calls == [1]
    j.close()


def test_the_server_serves_through_a_drop_the_socket_shows(pg_url, tmp_path):
    from fastapi.testclient import TestClient

    from engrain._server import create_app

    app = create_app(pg_url, routines_dir=tmp_path / "routines")
    with TestClient(app, base_url="http://127.0.0.1") as c:
        assert c.post("/api/memory/remember", json={"data": "the VPN gateway is vpn2", "skill": "it"}).status_code == 200
        state = app.state.engrain
        for db in (state.journal._db, state.memory().store._db):
            _drop(pg_url, db)
        r = c.post("/api/memory/recall", json={"query": "which VPN gateway", "skill": "it"})
        assert r.status_code == 200 and "vpn2" in r.text
        assert c.get("/api/runs").status_code == 200


def test_a_worker_on_a_dropped_connection_the_socket_shows_reports_no_outage(pg_url):
    from engrain._workers.worker import Worker

    def agent(task: str) -> str:
        return task.upper()

    j = eg.open(pg_url)
    rid = eg.enqueue(agent, "ship it", queue="jobs", journal=j)
    _drop(pg_url, j._db)
    stats = Worker(j, {"agent": agent}, ["jobs"], poll=0.02).run(until_idle=True)
    assert stats.finished == {"ok": 1} and not stats.errors, stats
    assert j.get_run(rid).status == "ok"
    j.close()


def test_a_notice_on_an_idle_socket_is_not_a_drop(pg_url):
    """Something to read on an idle connection is checked, not taken for a drop: a notification
    (LISTEN/NOTIFY) leaves the connection in place."""
    j = eg.open(pg_url)
    first = j._db
    first.execute("LISTEN engrain_probe")
    with psycopg.connect(parse_url(pg_url)[1], autocommit=True) as other:
        other.execute("NOTIFY engrain_probe, 'hello'")
    poller = select.poll()
    poller.register(first.fileno(), select.POLLIN)
    assert poller.poll(10_000)
    assert j.get_run("nothing") is None
    assert j._db is first and not first.closed
    j.close()
