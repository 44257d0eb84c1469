"""Smaller trust defects (issue 23 #5), each a typed error where there was a traceback or silence.

A store written by a newer engrain is refused by memory and the cache too; store
URL typos are errors that list the forms; the PostgreSQL password never shows;
damaged event pages are a corrupt store; a lone surrogate in a tool result is
refused and the step recorded failed, so it is never run again.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys

import psycopg
import pytest

import engrain as eg
from engrain._events import NewEvent
from engrain._journal import parse_url, redact_url, sqlite_schema
from servers import serve

ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")


def _raw(url: str):
    backend, target, _ = parse_url(url)
    if backend == "sqlite":
        return sqlite3.connect(target, isolation_level=None)
    return psycopg.connect(target, autocommit=True)


def _tables(con) -> set[str]:
    if isinstance(con, sqlite3.Connection):
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return {r[0] for r in con.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}


# -- a newer store ------------------------------------------------------------------


def test_memory_and_cache_refuse_a_store_newer_than_this_engrain(store_url):
    j = eg.open(store_url)  # opened before the store became newer: its cache store must still refuse
    con = _raw(store_url)
    newer = sqlite_schema.VERSION + 93
    ph = "?" if isinstance(con, sqlite3.Connection) else "%s"
    con.execute(f"UPDATE engrain_meta SET value = {ph} WHERE key = 'journal'", (str(newer),))
    before = _tables(con)
    with pytest.raises(eg.StoreVersionError, match=f"schema version {newer}.*upgrade engrain"):
        eg.Memory(store_url).remember("must not be written")
    from engrain._cache.store import CacheStore

    with pytest.raises(eg.StoreVersionError, match=f"schema version {newer}"):
        CacheStore(j)
    with pytest.raises(eg.StoreVersionError):
        eg.Engine(url=store_url)
    assert _tables(con) == before  # nothing added: no memory tables, no cache tables
    con.close()
    j.close()


def test_memory_still_opens_a_fresh_database_and_a_current_store(store_url):
    with eg.Memory(store_url) as m:  # no engrain tables yet: created
        m.remember("fine")
    eg.open(store_url).close()
    with eg.Memory(store_url) as m:  # the journal's own tables, at this version
        assert m.remember("fine") and len(m.recall("fine")) >= 1


# -- store URLs ---------------------------------------------------------------------


@pytest.mark.parametrize("url,why", [
    ("postgresql//user@host/db", "looks like a postgresql URL with a typo"),
    ("sqlite//data/x.db", "looks like a sqlite URL with a typo"),
    ("postgres:/x", "malformed (no // after the scheme)"),
    ("postgres:x", "malformed (no // after the scheme)"),
    ("mysql://host/db", "unknown scheme 'mysql'"),
    ("sqlite:///x.db?durabilty=full", "unknown query parameter(s) durabilty"),
    ("x.db?durabilty=full", "unknown query parameter(s) durabilty"),
    ("postgresql://u:hunter2@127.0.0.1/db?durabilty=full", "unknown query parameter(s) durabilty"),
])
def test_url_typos_are_config_errors_listing_the_forms(tmp_path, monkeypatch, url, why):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(eg.StoreURLError) as e:
        eg.open(url)
    assert isinstance(e.value, eg.ConfigError) and isinstance(e.value, ValueError)
    text = str(e.value)
    assert why in text and "sqlite:///relative/path.db" in text and "postgresql://user[:password]@host" in text
    assert "hunter2" not in text
    assert list(tmp_path.iterdir()) == []  # nothing created
    out = subprocess.run([ENGRAIN, "runs", "--url", url], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr and why in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_accepted_url_forms_still_open(tmp_path, pg_url):
    for url in (f"sqlite:///{tmp_path / 'a.db'}?durability=full", str(tmp_path / "b.db"),
                f"{pg_url}&durability=normal&connect_timeout=5&application_name=engrain-test"):
        eg.open(url).close()
    assert parse_url("postgres://u@h/db?sslmode=require")[0] == "postgres"


# -- the password -------------------------------------------------------------------


def test_password_is_masked_in_the_serve_banner_and_everywhere(pg_url, tmp_path):
    assert ":engrain@" in pg_url  # the test server's password is "engrain"
    with serve(pg_url, tmp_path, token=None, name="pg"):
        pass
    log = (tmp_path / "pg.log").read_text()
    assert "engrain serving on" in log and "engrain:***@" in log and ":engrain@" not in log, log
    j = eg.open(pg_url)
    assert ":engrain@" not in repr(j) and "***" in repr(j)
    j.close()
    bad = pg_url.replace("127.0.0.1:5432", "127.0.0.1:1")
    with pytest.raises(eg.ConfigError) as e:
        eg.open(bad)
    assert ":engrain@" not in str(e.value)
    assert redact_url("postgresql://u@h/db?password=hunter2&sslmode=require") == \
        "postgresql://u@h/db?password=***&sslmode=require"


# -- damaged pages --------------------------------------------------------------------


def test_flipped_bytes_in_event_pages_are_a_corrupt_store_in_one_line(tmp_path):
    path = tmp_path / "e.db"
    j = eg.open(f"sqlite:///{path}?durability=full")
    for i in range(20):
        j.append(f"r{i}", [NewEvent("run.started", "", {"task": "t"}),
                           NewEvent("log.entry", "x", {"text": f"marker-{i:02d} " + "hello world " * 20})], 0)
    j.close()
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    data = bytearray(path.read_bytes())
    at = data.find(b"marker-11")
    assert at > 0
    for k in range(1, 6):
        data[at + k * 37] = 0xFF  # not UTF-8
    path.write_bytes(bytes(data))
    j = eg.open(f"sqlite:///{path}")
    with pytest.raises(eg.StoreCorruptError, match="not UTF-8 text") as e:
        j.read("r11")
    assert "\n" not in str(e.value) and "\ufffd" not in str(e.value)
    assert j.read("r10")[1].data["text"].startswith("marker-10")  # the rest still reads
    j.close()
    out = subprocess.run([ENGRAIN, "show", "r11", "--url", f"sqlite:///{path}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr and "OperationalError" not in out.stderr
    assert re.search(r"corrupt .*not UTF-8 text", out.stderr) and len(out.stderr.strip().splitlines()) == 1


# -- a lone surrogate -----------------------------------------------------------------


def test_tool_result_with_a_lone_surrogate_fails_the_step_once(store_url):
    j = eg.open(store_url)
    calls: list[int] = []
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg)
    def charge(n: int) -> dict:
        calls.append(n)
        return {"receipt": "paid \ud800 ok"}

    def agent(task: str) -> dict:
        return charge(1)

    res = eg.run(agent, "pay", journal=j)
    assert res.status == "failed" and res.error_type == "NotJSONError", res
    assert "['result']['receipt'] holds a lone surrogate" in res.error
    events = j.read(res.run_id)
    assert [e.kind for e in events] == ["run.started", "step.failed", "run.failed"]
    assert events[1].name == "charge" and events[1].data["error_type"] == "NotJSONError"
    again = eg.run(agent, "pay", run_id=res.run_id, journal=j)
    assert again.status == "failed" and calls == [1]  # never run again blindly
    j.close()


def test_lone_surrogates_in_outputs_and_error_messages_still_end_the_run(store_url):
    j = eg.open(store_url)
    res = eg.run(lambda task: {"out": "\udcff"}, "out", journal=j)
    assert res.status == "failed" and res.error_type == "NotJSONError" and "['output']['out']" in res.error

    def raises(task: str) -> None:
        raise ValueError("bad byte \udcff in input")

    res = eg.run(raises, "err", journal=j)
    assert res.status == "failed" and res.error_type == "ValueError" and "\\udcff" in res.error
    assert j.get_run(res.run_id).status == "failed"
    with pytest.raises(eg.NotJSONError, match="lone surrogate"):
        j.append("x", [NewEvent("run.started", "", {"task": "t\ud800"})], 0)
    assert j.get_run("x") is None
    # A run id is refused by name before the store's driver sees it (it raised UnicodeEncodeError there).
    for rid, message in [("run \ud800", "run_id 'run \\\\ud800' is not Unicode text: a lone surrogate at character 4"),
                         ("r" * 201, "run_id is 201 characters long; at most 200 are allowed")]:
        with pytest.raises(ValueError, match=f"^{message}$"):
            eg.run(lambda task: 1, "t", run_id=rid, journal=j)
        with pytest.raises(ValueError, match=f"^{message}$"):
            j.append(rid, [NewEvent("run.started", "", {"task": "t"})], 0)
    j.close()


@pytest.mark.parametrize("content, message", [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"who": "caf\xe9"}', "not UTF-8"),
])
def test_a_json_file_too_deep_or_not_utf8_is_one_line_naming_it_and_exit_2(tmp_path, content, message):
    """``engrain run --input/--answers`` and ``engrain compile`` read JSON files: no traceback for either."""
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "routine.yaml").write_text("name: r\ninputs: {type: object}\nsteps:\n- id: a\n  type: return\n  value: 1\n")
    (folder / "input.json").write_text("{}")
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    url = f"sqlite:///{tmp_path / 'e.db'}"
    for args in (["run", str(folder), "--input", str(bad), "--url", url],
                 ["run", str(folder), "--answers", str(bad), "--url", url],
                 ["compile", str(bad), "-o", str(tmp_path / "out")]):
        out = subprocess.run([ENGRAIN, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert out.returncode == 2 and "Traceback" not in out.stderr, (args, out.stderr[-500:])
        assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr and str(bad) in out.stderr, out.stderr


def test_a_pathlib_path_opens_as_the_bare_file_path_and_a_number_says_what_it_is(tmp_path):
    j = eg.open(tmp_path / "runs.db")
    j.close()
    assert (tmp_path / "runs.db").is_file()
    with pytest.raises(eg.StoreURLError, match="a store URL is a string or a path, not int"):
        eg.open(5)
