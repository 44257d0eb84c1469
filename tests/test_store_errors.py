"""When the store, not the agent, fails (issue 12 items 4, 11, 14): a full disk, an I/O error or a
lost connection is a StorageError and the run stays resumable; a corrupt file is a
StoreCorruptError; a mistyped URL never creates an empty store for a read-only command."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys

import psycopg
import pytest

import engrain as eg
from engrain._events import NewEvent

ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")
BIG = "x" * 300_000  # a step result bigger than what is left on the "disk"


def _cli(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ENGRAIN_URL"}
    return subprocess.run([ENGRAIN, *args], capture_output=True, text=True, timeout=60, cwd=cwd, env=env)


def _agent(calls: list[str]):
    @eg.tool(registry=eg.ToolRegistry())
    def small(n: int) -> int:
        calls.append("small")
        return n + 1

    @eg.tool(registry=eg.ToolRegistry())
    def big() -> str:
        calls.append("big")
        return BIG

    def agent(task: str) -> int:
        return small(1) + len(big())

    return agent


def _kinds(url: str, run_id: str) -> list[str]:
    j = eg.open(url)
    try:
        return [e.kind for e in j.read(run_id)]
    finally:
        j.close()


# -- item 4: storage errors -------------------------------------------------------


def test_disk_full_is_a_storage_error_and_the_run_resumes(tmp_path):
    """Deterministic: SQLite's own page limit makes the big step.completed fail with SQLITE_FULL."""
    url = f"sqlite:///{tmp_path / 'full.db'}"
    j = eg.open(url)
    j.append("warm", [NewEvent("run.started", "", {"task": "t"})], 0)
    pages = j._db.execute("PRAGMA page_count").fetchone()[0]
    j._db.execute(f"PRAGMA max_page_count = {pages + 4}")
    calls: list[str] = []
    agent = _agent(calls)
    with pytest.raises(eg.StorageError, match="disk is full") as err:
        eg.run(agent, "fill", run_id="r", journal=j)
    assert isinstance(err.value.cause, sqlite3.OperationalError) and str(tmp_path) in str(err.value)
    # Nothing says failed: the small run.failed would have fit, but it is not the agent's failure.
    assert j.get_run("r").status == "running"
    assert "run.failed" not in _kinds(url, "r")
    # Steps journal only their outcome: small's is there, big's (the write that failed) is not.
    assert _kinds(url, "r") == ["run.started", "step.completed"]
    j.close()
    # Space again (a fresh connection has no page limit): the run resumes and finishes.
    j2 = eg.open(url)
    res = eg.run(agent, "fill", run_id="r", journal=j2)
    assert res.status == "ok" and res.output == 2 + len(BIG)
    assert calls == ["small", "big", "big"]  # small replayed from the journal, big called again
    j2.close()


def test_agent_that_swallows_the_storage_error_still_does_not_fail_the_run(tmp_path):
    url = f"sqlite:///{tmp_path / 'full.db'}"
    j = eg.open(url)
    j.append("warm", [NewEvent("run.started", "", {"task": "t"})], 0)
    pages = j._db.execute("PRAGMA page_count").fetchone()[0]
    j._db.execute(f"PRAGMA max_page_count = {pages + 4}")
    inner = _agent([])

    def careless(task: str) -> int:
        try:
            return inner(task)
        except Exception as e:  # noqa: BLE001 - the point: an agent that hides the store's failure
            raise RuntimeError("tool trouble") from e

    with pytest.raises(eg.StorageError):
        eg.run(careless, "fill", run_id="c", journal=j)
    assert j.get_run("c").status == "running" and "run.failed" not in _kinds(url, "c")

    def hides(task: str) -> int:
        try:
            return inner(task)
        except Exception:  # noqa: BLE001
            return -1

    with pytest.raises(eg.StorageError):
        eg.run(hides, "fill", run_id="h", journal=j)
    assert j.get_run("h").status == "running" and "run.completed" not in _kinds(url, "h")
    j.close()


def test_failed_batch_reports_its_cause_not_a_rollback_error(tmp_path):
    """_write used to ROLLBACK after SQLite had already rolled back: 'cannot rollback - no transaction is active'."""
    j = eg.open(f"sqlite:///{tmp_path / 'b.db'}")
    j.append("r", [NewEvent("run.started", "", {"task": "t"})], 0)
    pages = j._db.execute("PRAGMA page_count").fetchone()[0]
    j._db.execute(f"PRAGMA max_page_count = {pages + 2}")
    batch = [NewEvent("step.started", "s", {"call_id": i, "args": {"pad": "y" * 5000}}) for i in range(50)]
    with pytest.raises(eg.StorageError, match="database or disk is full") as err:
        j.append("r", batch, 1)
    assert "cannot rollback" not in str(err.value)
    assert not j._db.in_transaction and j.get_run("r").next_seq == 1  # all or nothing
    j._db.execute("PRAGMA max_page_count = 1073741823")
    assert len(j.append("r", batch, 1)) == 50
    j.close()


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A real 2 MiB tmpfs (needs root and mount rights)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot mount a tmpfs here (not root, or no mount rights in this container): {e}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_real_full_disk_leaves_every_run_resumable(tiny_tmpfs):
    url = f"sqlite:///{tiny_tmpfs / 'engrain.db'}"
    j = eg.open(url)
    outcomes = []
    for k in range(16):
        try:
            outcomes.append(eg.run(_agent([]), "fill", run_id=f"run{k}", journal=j).status)
        except eg.StorageError as e:
            assert "cannot rollback" not in str(e) and isinstance(e.cause, sqlite3.Error)
            outcomes.append("storage")
    assert "storage" in outcomes, outcomes  # 2 MiB cannot hold 16 results of 300 KB
    assert "failed" not in outcomes
    statuses = {r.run_id: r.status for r in j.runs(limit=100)}
    j.close()
    assert "failed" not in statuses.values()
    # More room: every run that hit the full disk resumes and finishes.
    subprocess.run(["mount", "-o", "remount,size=64m", str(tiny_tmpfs)], check=True)
    j = eg.open(url)
    for k in range(16):
        assert eg.run(_agent([]), "fill", run_id=f"run{k}", journal=j).status == "ok"
    assert {r.status for r in j.runs(limit=100)} == {"ok"}
    j.close()


def test_memory_on_a_full_disk_is_a_storage_error_and_loses_nothing(tiny_tmpfs):
    """Memory's SQLite errors are typed as the journal's are: a full disk is a StorageError naming the
    file, the failed remember leaves nothing half-written, and memory works again once there is room."""
    path = tiny_tmpfs / "engrain.db"
    m = eg.Memory(f"sqlite:///{path}")
    kept = []
    with pytest.raises(eg.StorageError) as err:
        for i in range(5000):
            m.remember(f"note {i}: " + "the quarterly report lists every invoice " * 40, skill="s")
            kept.append(i)
    assert str(path) in str(err.value) and "retry once the store works again" in str(err.value)
    assert isinstance(err.value.cause, sqlite3.Error)
    assert m.stats()["records"] == len(kept) > 0
    subprocess.run(["mount", "-o", "remount,size=64m", str(tiny_tmpfs)], check=True)
    m.remember("the last note, after the disk grew", skill="s")
    assert m.stats()["records"] == len(kept) + 1
    assert m.recall("the last note after the disk grew", skill="s")[0].content == "the last note, after the disk grew"
    m.close()


def test_lost_postgres_connection_is_a_storage_error(pg_url, monkeypatch):
    """PostgreSQL's storage failure: our connection is lost mid-run, in a way the socket does not show
    before the next call (a network partition; a restart's farewell is seen: test_pg_reconnect.py)."""
    from engrain._journal import pglink

    monkeypatch.setattr(pglink, "_readable", lambda fd: False)
    store_url = pg_url
    j = eg.open(store_url)
    backend_pid = j._db.info.backend_pid
    calls: list[str] = []

    @eg.tool(registry=eg.ToolRegistry())
    def cut() -> int:
        calls.append("cut")
        with psycopg.connect(eg._journal.parse_url(store_url)[1], autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend_pid,))
        return 1

    def agent(task: str) -> int:
        return cut() + 1

    with pytest.raises(eg.StorageError) as err:
        eg.run(agent, "cut", run_id="pg", journal=j)
    assert isinstance(err.value.cause, psycopg.OperationalError)
    assert "engrain:engrain@" not in str(err.value)  # the password is not in the message
    j2 = eg.open(store_url)
    assert j2.get_run("pg").status == "running" and "run.failed" not in [e.kind for e in j2.read("pg")]
    j2.close()
    # The same journal connects anew on its next call: this process resumes the run without reopening.
    backend_pid = -1  # the step runs again (its result was never recorded); now it cuts nothing
    assert eg.run(agent, "cut", run_id="pg", journal=j).status == "ok"
    assert calls == ["cut", "cut"]
    j.close()


class _CuttingProxy:
    """A TCP proxy to the PostgreSQL server that, once ``cut`` is set, swallows what the client sends
    next and closes its connection without a reply: a server that went away mid-statement."""

    def __init__(self, host: str, port: int):
        import socket
        import threading

        self.cut = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._target = (host, port)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src, dst, from_client: bool) -> None:
        try:
            while data := src.recv(65536):
                if from_client and self.cut.is_set():
                    break  # the request is swallowed: no reply will ever come
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.close()
            except OSError:
                pass

    def close(self) -> None:
        self._listener.close()


def test_postgres_gone_mid_step_append_is_a_storage_error(pg_url):
    """The server goes away after a step's append was sent, before any reply: a StorageError, the
    run is not marked failed, and it resumes to the end."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(pg_url)
    proxy = _CuttingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    via = urlunsplit(parts._replace(netloc=f"{parts.username}:{parts.password}@127.0.0.1:{proxy.port}"))
    j = eg.open(via)

    @eg.tool(registry=eg.ToolRegistry())
    def work() -> int:
        proxy.cut.set()  # this step's append is the next thing sent
        return 1

    def agent(task: str) -> int:
        return work() + 1

    try:
        with pytest.raises(eg.StorageError) as err:
            eg.run(agent, "cut", run_id="gone", journal=j)
        assert isinstance(err.value.cause, psycopg.OperationalError)
    finally:
        proxy.close()
        try:
            j.close()
        except Exception:  # noqa: BLE001 - the connection is gone
            pass
    j2 = eg.open(pg_url)
    assert j2.get_run("gone").status == "running"
    assert [e.kind for e in j2.read("gone")] == ["run.started"]
    assert eg.run(agent, "cut", run_id="gone", journal=j2).status == "ok"
    j2.close()


# -- item 11: corrupt store ------------------------------------------------------


def test_corrupt_sqlite_store_is_named_and_cli_prints_one_line(tmp_path):
    path = tmp_path / "bad.db"
    path.write_bytes(b"this is not a database, it is a text file\n" * 200)
    with pytest.raises(eg.StoreCorruptError, match="bad.db") as err:
        eg.open(f"sqlite:///{path}")
    assert "restore it from a backup" in str(err.value) and err.value.path == str(path)
    for cmd in (["runs"], ["show", "x"], ["export", "x"]):
        out = _cli(*cmd, "--url", f"sqlite:///{path}")
        assert out.returncode == 1 and out.stdout == "", (cmd, out)
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
        assert "bad.db is corrupt" in out.stderr


def test_damaged_pages_are_a_corrupt_store_error(tmp_path):
    path = tmp_path / "damaged.db"
    j = eg.open(f"sqlite:///{path}")
    for k in range(200):
        j.append(f"r{k}", [NewEvent("run.started", "", {"task": "t" * 200})], 0)
    j.close()
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    raw = bytearray(path.read_bytes())
    page = 4096
    raw[2 * page : len(raw) - page] = b"\xff" * (len(raw) - 3 * page)  # keep the header page, trash the rest
    path.write_bytes(bytes(raw))
    with pytest.raises(eg.StoreCorruptError, match="damaged.db"):
        j = eg.open(f"sqlite:///{path}")
        j.runs(limit=500)
        [j.read(f"r{k}") for k in range(200)]


# -- item 14: store URLs -------------------------------------------------------------


@pytest.mark.parametrize("url", ["sqlite:/tmp/x.db", "sqlite://host/x.db", "sqlite:x.db", "sqlite://"])
def test_malformed_sqlite_urls_show_the_expected_forms(url):
    with pytest.raises(eg.ConfigError, match=r"sqlite:///relative/path\.db.*sqlite:////absolute/path\.db"):
        eg.open(url)


def test_slash_rule_relative_and_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rel = eg.open("sqlite:///data/rel.db")
    ab = eg.open(f"sqlite:///{tmp_path}/abs/x.db")  # sqlite: + // + /abs path = four slashes
    rel.close()
    ab.close()
    assert (tmp_path / "data" / "rel.db").is_file() and (tmp_path / "abs" / "x.db").is_file()


def test_read_only_commands_refuse_a_missing_store(tmp_path):
    missing = tmp_path / "nonexistent" / "dir" / "x.db"
    for cmd in (["runs"], ["show", "r"], ["export", "r"]):
        out = _cli(*cmd, "--url", f"sqlite:///{missing}", cwd=str(tmp_path))
        assert out.returncode == 2, (cmd, out)  # bad input: no store there
        assert out.stderr.count("\n") == 1 and "no store at" in out.stderr and str(missing) in out.stderr
    assert not missing.parent.parent.exists()  # nothing was created
    bad = _cli("runs", "--url", "sqlite:/tmp/x.db", cwd=str(tmp_path))
    assert bad.returncode == 2 and "sqlite:////absolute/path.db" in bad.stderr  # bad input (StoreURLError) and bad.stderr.count("\n") == 1
    assert not (tmp_path / "tmp").exists()
    with pytest.raises(eg.StoreNotFoundError):
        eg.open(f"sqlite:///{missing}", create=False)
    assert not missing.exists()


def test_read_only_commands_still_read_an_existing_store(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    eg.run(lambda task: 1, "one", run_id="one", journal=eg.open(url))
    out = _cli("runs", "--url", url)
    assert out.returncode == 0 and "one" in out.stdout


def test_missing_postgres_schema_is_refused_for_reading(pg_url):
    with pytest.raises(eg.StoreNotFoundError, match="no engrain tables") as err:
        eg.open(pg_url, create=False)
    assert "engrain:engrain@" not in str(err.value)
    eg.open(pg_url).close()
    eg.open(pg_url, create=False).close()
