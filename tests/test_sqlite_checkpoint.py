"""The SQLite journal checkpoints its WAL on a thread of its own, not inside a step's commit."""

from __future__ import annotations

import sqlite3
import time

from engrain import NewEvent
from engrain._journal import sqlite_checkpoint
from engrain._journal.sqlite import SQLiteJournal


def _steps(j: SQLiteJournal, run_id: str, n: int) -> None:
    j.append(run_id, [NewEvent("run.started", "", {"task": "t"})], 0)
    for i in range(n):
        j.append_one(run_id, "step.completed", "inc", {"call_id": i, "result": i + 1}, i + 1, json_checked=True)


def _rows_in_main_file(path) -> int:
    # immutable=1 reads the database file alone, ignoring the WAL: what checkpoints have copied there.
    con = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return con.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    finally:
        con.close()


def _rows_after_the_thread_checkpoints(j: SQLiteJournal, path) -> int:
    """:func:`_rows_in_main_file`, read again after one more pass of the thread when the file read torn: a PASSIVE
    checkpoint may stop inside a transaction's frames, which only a reader ignoring the WAL (immutable) can see."""
    for _ in range(5):
        try:
            return _rows_in_main_file(path)
        except sqlite3.DatabaseError:
            done = j._checkpointer.checkpoints
            j._checkpointer._wake.set()
            deadline = time.monotonic() + 5
            while j._checkpointer.checkpoints == done and time.monotonic() < deadline:
                time.sleep(0.01)
    return _rows_in_main_file(path)


def test_the_thread_copies_committed_pages_into_the_database_file(tmp_path):
    path = tmp_path / "j.db"
    j = SQLiteJournal(path)
    try:
        assert j._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == sqlite_checkpoint.BACKSTOP_PAGES
        _steps(j, "r", 2 * sqlite_checkpoint.EVERY_COMMITS + 10)
        deadline = time.monotonic() + 10
        while j._checkpointer.checkpoints < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert j._checkpointer.checkpoints >= 2
        # The writer's own autocheckpoint (4000 pages) was never reached, so these rows got
        # into the database file through the thread's checkpoints.
        assert _rows_after_the_thread_checkpoints(j, path) >= sqlite_checkpoint.EVERY_COMMITS
        assert len(j.read("r")) == 2 * sqlite_checkpoint.EVERY_COMMITS + 11
    finally:
        j.close()
    assert not j._checkpointer._thread.is_alive()
    # Closing the last connection checkpointed the rest: every row is in the file.
    assert _rows_in_main_file(path) == 2 * sqlite_checkpoint.EVERY_COMMITS + 11


def test_the_wal_stays_bounded_and_nothing_is_lost_across_reopen(tmp_path):
    path = tmp_path / "j.db"
    j = SQLiteJournal(path)
    n = 3 * sqlite_checkpoint.EVERY_COMMITS
    try:
        _steps(j, "a", n)
        wal = path.with_name("j.db-wal")
        # A step's commit writes a page or a few: the WAL never grows far past the backstop.
        assert wal.stat().st_size <= 2 * sqlite_checkpoint.BACKSTOP_PAGES * (j._db.execute("PRAGMA page_size").fetchone()[0] + 24)
    finally:
        j.close()
    again = SQLiteJournal(path)
    try:
        events = again.read("a")
        assert [e.seq for e in events] == list(range(n + 1))
        assert events[-1].data == {"call_id": n - 1, "result": n}
    finally:
        again.close()


def test_a_journal_that_only_reads_starts_no_thread(tmp_path):
    path = tmp_path / "j.db"
    with SQLiteJournal(path) as j:
        _steps(j, "r", 3)
    with SQLiteJournal(path) as reader:
        assert len(reader.read("r")) == 4 and reader.runs()
        assert reader._checkpointer._thread is None


def test_a_full_durability_store_checkpoints_in_sqlites_own_commit(tmp_path):
    # Its commits fsync the WAL; a checkpoint's fsyncs on another thread would queue with them.
    with SQLiteJournal(tmp_path / "j.db", durability="full") as j:
        assert j._checkpointer is None
        assert j._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000
        _steps(j, "r", 5)
        assert len(j.read("r")) == 6


def test_an_in_memory_store_has_no_checkpointer():
    with SQLiteJournal(":memory:") as j:
        _steps(j, "r", sqlite_checkpoint.EVERY_COMMITS + 1)
        assert j._checkpointer is None and len(j.read("r")) == sqlite_checkpoint.EVERY_COMMITS + 2


def test_fast_encoding_of_checked_data_reads_back_equal(tmp_path):
    # json_checked=True lets msgspec write the row; it spells some floats differently but they read back equal.
    values = [1e16, 1e-7, 0.1, -0.0, 2**70, "é\u2028\x00", None, [1.5e300, {"k": [True, False]}]]
    with SQLiteJournal(tmp_path / "j.db") as j:
        j.append("r", [NewEvent("run.started", "", {"task": "t"})], 0)
        for i, v in enumerate(values):
            j.append_one("r", "step.completed", "v", {"call_id": i, "result": v}, i + 1, json_checked=True)
        got = [e.data["result"] for e in j.read("r")[1:]]
    assert got == values and str(got[3]) == "-0.0"


def test_what_the_fast_encoder_refuses_the_stdlib_encodes():
    from engrain._events import dumps, dumps_checked

    assert dumps_checked("\ud800") == dumps("\ud800")  # msgspec refuses a lone surrogate
    assert dumps_checked({"a": [1, "x"]}) == dumps({"a": [1, "x"]}) == '{"a":[1,"x"]}'
