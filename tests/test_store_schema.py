"""The store's contract beyond appends (issue 12 items 6 and 12), on SQLite and PostgreSQL:
one run status vocabulary at every boundary, schema versions with forward migrations."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys

import psycopg
import pytest
from fastapi.testclient import TestClient

import engrain as eg
from engrain import _events as ev
from engrain._events import NewEvent
from engrain._journal import postgres_schema, sqlite_schema

ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")
LOCAL = "http://127.0.0.1:8765"
VALID = "ok, failed, needs_input, running, queued, cancelled"


def _cli(*args: str, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([ENGRAIN, *args, "--url", url], capture_output=True, text=True, timeout=60)


def _fine(task: str) -> str:
    return "done"


def _two_runs(url: str) -> None:
    j = eg.open(url)
    eg.run(_fine, "fine", run_id="good", journal=j)
    eg.run(lambda task: 1 / 0, "broken", run_id="bad", journal=j)
    j.close()


def _raw(url: str):
    """A driver connection to the store behind ``url`` (for shaping it like another version would)."""
    backend, target, _ = eg._journal.parse_url(url)
    if backend == "sqlite":
        return sqlite3.connect(target, isolation_level=None), "?", ""
    return psycopg.connect(target, autocommit=True), "%s", "engrain_"


# -- item 6: one status vocabulary ------------------------------------------------


def test_store_says_ok_like_run_result(store_url):
    _two_runs(store_url)
    j = eg.open(store_url)
    res = eg.run(_fine, "fine", run_id="good", journal=j)
    assert res.status == "ok" and j.get_run("good").status == res.status == ev.OK
    assert [r.run_id for r in j.runs(status="ok")] == ["good"]
    assert [r.run_id for r in j.runs(status="completed")] == ["good"]  # the old name is an alias
    assert {r.run_id for r in j.runs(status=["failed", "OK"])} == {"bad", "good"}
    for name in ("queued", "cancelled", "running", "needs_input"):
        assert j.runs(status=name) == []
    j.close()


def test_unknown_status_is_refused_with_the_valid_names(journal):
    for bad in ("bogus", "", "complete", 3):
        with pytest.raises(eg.UnknownStatusError, match=VALID) as err:
            journal.runs(status=bad)
        assert err.value.valid == list(ev.STATUSES) and isinstance(err.value, ValueError)
    with pytest.raises(eg.UnknownStatusError):
        journal.runs(status=["ok", "nope"])


def test_cli_status_filter_uses_ok_and_refuses_bogus(store_url):
    _two_runs(store_url)
    ok = _cli("runs", "--status", "ok", url=store_url)
    assert ok.returncode == 0, ok.stderr
    assert [line.split()[:2] for line in ok.stdout.splitlines()[1:]] == [["good", "ok"]]
    alias = _cli("runs", "--status", "completed", "--json", url=store_url)
    assert alias.returncode == 0 and '"status": "ok"' in alias.stdout
    bogus = _cli("runs", "--status", "bogus", url=store_url)
    assert bogus.returncode == 2 and bogus.stdout == ""
    assert bogus.stderr.count("\n") == 1 and "Traceback" not in bogus.stderr
    assert "unknown run status 'bogus'" in bogus.stderr and VALID in bogus.stderr


def test_api_and_client_status_filter(store_url, tmp_path):
    from engrain._server import create_app

    _two_runs(store_url)
    with TestClient(create_app(store_url, routines_dir=tmp_path / "routines"), base_url=LOCAL) as c:
        assert [r["run_id"] for r in c.get("/api/runs", params={"status": "ok"}).json()] == ["good"]
        assert [r["run_id"] for r in c.get("/api/runs", params={"status": "completed"}).json()] == ["good"]
        bad = c.get("/api/runs", params={"status": "bogus"})
        assert bad.status_code == 422
        for name in ("ok", "failed", "needs_input", "running", "queued", "cancelled"):
            assert name in bad.text
        detail = c.get("/api/runs/good").json()
        assert detail["run"]["status"] == "ok" and detail["output"] == "done"
    client = eg.Client("http://127.0.0.1:9")  # nothing listens: a refused status never leaves the process
    with pytest.raises(eg.UnknownStatusError, match=VALID):
        client.runs(status="bogus")


# -- item 12: schema versions and migrations --------------------------------------


def test_both_backends_share_one_migration_numbering():
    assert sqlite_schema.VERSION == postgres_schema.VERSION == len(sqlite_schema.MIGRATIONS) >= 3
    assert len(postgres_schema.MIGRATIONS) == len(sqlite_schema.MIGRATIONS)


def test_new_store_records_its_version(store_url):
    eg.open(store_url).close()
    con, ph, _ = _raw(store_url)
    row = con.execute("SELECT value FROM engrain_meta WHERE key = 'journal'").fetchone()
    assert row == (str(sqlite_schema.VERSION),)
    con.close()


def test_newer_store_is_refused_and_left_untouched(store_url):
    j = eg.open(store_url)
    j.append("r", [NewEvent("run.started", "", {"task": "t"})], 0)
    j.close()
    con, ph, prefix = _raw(store_url)
    newer = sqlite_schema.VERSION + 1
    con.execute(f"UPDATE engrain_meta SET value = {ph} WHERE key = 'journal'", (str(newer),))
    if prefix == "":
        con.execute("DROP TRIGGER events_run_status")  # a newer version's own trigger must not be replaced
    with pytest.raises(eg.StoreVersionError, match=f"schema version {newer}.*upgrade engrain") as err:
        eg.open(store_url)
    assert err.value.found == newer and err.value.known == sqlite_schema.VERSION
    assert isinstance(err.value, eg.ConfigError)
    assert con.execute("SELECT value FROM engrain_meta WHERE key = 'journal'").fetchone() == (str(newer),)
    if prefix == "":
        assert con.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'events_run_status'").fetchone() == (0,)
    con.close()


def test_extra_unknown_columns_do_not_break_the_journal(store_url):
    eg.open(store_url).close()
    con, _, prefix = _raw(store_url)
    con.execute(f"ALTER TABLE {prefix}events ADD COLUMN note TEXT")
    con.execute(f"ALTER TABLE {prefix}runs ADD COLUMN added_by_a_newer_version TEXT")
    con.close()
    j = eg.open(store_url)
    res = eg.run(lambda task: eg.now().year, "year", run_id="x", journal=j)
    assert res.status == "ok" and [e.kind for e in j.read("x")][-1] == "run.completed"
    assert j.get_run("x").status == "ok" and [r.run_id for r in j.runs(status="ok")] == ["x"]
    j.append("y", [NewEvent("run.started", "", {"task": "t"}), NewEvent("run.completed", "", {"output": 1})], 0)
    assert j.get_run("y").next_seq == 2
    j.close()


def test_unversioned_postgres_store_is_migrated(store_url):
    """A PostgreSQL store from before versions: no engrain_meta, no lease_epoch, finished runs 'completed'."""
    if not store_url.startswith("postgres"):
        pytest.skip("the SQLite case is test_journal_conformance::test_sqlite_migrates_an_unversioned_store_...")
    _, target, _ = eg._journal.parse_url(store_url)
    with psycopg.connect(target, autocommit=True) as con:
        postgres_schema._v1_tables(con)
        con.execute(
            "INSERT INTO engrain_runs (run_id, status, task, tags, created, updated, next_seq) VALUES"
            " ('old', 'completed', 't', '[]', 1, 2, 2), ('live', 'running', 't', '[]', 1, 2, 1)"
        )
        con.execute(
            "INSERT INTO engrain_events VALUES ('old', 0, 1, 'run.started', '', '{\"task\": \"t\"}'),"
            " ('old', 1, 2, 'run.completed', '', '{\"output\": 1}'), ('live', 0, 1, 'run.started', '', '{\"task\": \"t\"}')"
        )
    j = eg.open(store_url)
    assert j.get_run("old").status == "ok" and j.get_run("live").lease_epoch == 0
    assert [r.run_id for r in j.runs(status="ok")] == ["old"]
    j.close()



def test_a_version_5_store_gains_the_queue_tables(store_url):
    """Migration 6 adds the toolkit's queue tables to a store at version 5, keeping its runs."""
    con, ph, prefix = _raw(store_url)
    migrations = sqlite_schema.MIGRATIONS if prefix == "" else postgres_schema.MIGRATIONS
    con.execute("CREATE TABLE engrain_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    for step in migrations[:5]:
        step(con)
    con.execute(f"INSERT INTO engrain_meta (key, value) VALUES ('journal', {ph})", ("5",))
    con.execute(f"INSERT INTO {prefix}events VALUES ('old', 0, 1, 'run.started', '', '{{\"task\": \"t\"}}')")
    if prefix:  # PostgreSQL's append writes the runs row itself (no trigger)
        con.execute("INSERT INTO engrain_runs (run_id, status, task, tags, created, updated, next_seq)"
                    " VALUES ('old', 'running', 't', '[]', 1, 1, 1)")
    tables = "name FROM sqlite_master WHERE type = 'table'" if not prefix else "tablename FROM pg_tables WHERE schemaname = current_schema()"
    assert not {"engrain_queue", "engrain_queues"} & {r[0] for r in con.execute(f"SELECT {tables}").fetchall()}
    con.close()

    j = eg.open(store_url)
    try:
        con, _, _ = _raw(store_url)
        assert con.execute("SELECT value FROM engrain_meta WHERE key = 'journal'").fetchone() == (str(sqlite_schema.VERSION),)
        assert {"engrain_queue", "engrain_queues"} <= {r[0] for r in con.execute(f"SELECT {tables}").fetchall()}
        con.close()
        assert sqlite_schema.VERSION >= 6 and j.get_run("old").task == "t"
        eg.queue("emails", concurrency=2, journal=j)
        rid = eg.enqueue("agent", "job", queue="emails", journal=j)
        assert [(q.name, q.concurrency, q.queued) for q in eg.queues(journal=j)] == [("emails", 2, 1)]
        assert j.get_run(rid).status == "queued"
    finally:
        j.close()
