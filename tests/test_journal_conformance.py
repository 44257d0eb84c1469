"""One conformance suite for every journal backend (SQLite and a real PostgreSQL server)."""

from __future__ import annotations

import threading
import time

import pytest

import engrain
from engrain import ConflictError, NewEvent, RunNotFoundError
from engrain._events import KINDS


def started(task: str = "t", tags: list[str] | None = None) -> NewEvent:
    return NewEvent("run.started", "", {"task": task, "inputs": {}, "tags": tags or []})


def step(i: int) -> NewEvent:
    return NewEvent("step.started", "tool", {"call_id": i, "type": "tool", "args": {"i": i}, "attempt": 1})


def test_append_then_read_in_order(journal):
    stored = journal.append("r", [started(), step(0)], 0)
    assert [e.seq for e in stored] == [0, 1]
    journal.append("r", [NewEvent("step.completed", "tool", {"call_id": 0, "result": {"a": [1, 2.5, None, "x"]}})], 2)
    events = journal.read("r")
    assert [e.seq for e in events] == [0, 1, 2]
    assert [e.kind for e in events] == ["run.started", "step.started", "step.completed"]
    assert events[2].data == {"call_id": 0, "result": {"a": [1, 2.5, None, "x"]}}
    assert events[0].ts <= events[2].ts
    assert [e.seq for e in journal.read("r", after=0)] == [1, 2]
    assert journal.read("r", after=2) == []
    assert journal.read("missing") == []


def test_data_round_trips_unicode_and_key_order(journal):
    data = {"z": "ünïcødé ✓", "a": {"nested": [True, False, None]}, "m": 10**15, "f": -0.125}
    journal.append("u", [NewEvent("run.started", "", {"task": "t", "inputs": data, "tags": []})], 0)
    got = journal.read("u")[0].data["inputs"]
    assert got == data
    assert list(got) == ["z", "a", "m", "f"]


def test_conflict_on_stale_expected_seq(journal):
    journal.append("r", [started()], 0)
    with pytest.raises(ConflictError) as info:
        journal.append("r", [step(0)], 0)
    assert info.value.expected_seq == 0 and info.value.actual_seq == 1
    with pytest.raises(ConflictError) as info:
        journal.append("r", [step(0)], 5)  # a gap is a conflict too: seq stays dense
    assert info.value.actual_seq == 1
    with pytest.raises(ConflictError):
        journal.append("new", [step(0)], 3)
    # the failed appends wrote nothing
    assert [e.seq for e in journal.read("r")] == [0]
    assert journal.get_run("new") is None


def test_append_is_atomic_on_bad_event(journal):
    journal.append("r", [started()], 0)
    with pytest.raises(engrain.NotJSONError):
        journal.append("r", [step(0), NewEvent("step.completed", "x", {"call_id": 0, "result": object()})], 1)
    with pytest.raises(ValueError, match="unknown kind"):
        journal.append("r", [step(0), NewEvent("bogus", "", {})], 1)
    assert len(journal.read("r")) == 1
    assert journal.get_run("r").next_seq == 1


def test_unflushed_appends_are_stored_and_checked(store_url):
    """durable=False (a durable run's step.started) skips only the flush: same rows, same conflicts."""
    j = engrain.open(f"{store_url}{'&' if '?' in store_url else '?'}durability=full")
    try:
        j.append("nf", [started()], 0, durable=False)  # creates the run
        j.append("nf", [step(0)], 1, durable=False)
        j.append("nf", [step(1), step(2)], 2, durable=False)
        with pytest.raises(ConflictError):
            j.append("nf", [step(3)], 2, durable=False)
        j.append("nf", [NewEvent("run.completed", "", {"output": 1})], 4)
        assert [e.seq for e in j.read("nf")] == [0, 1, 2, 3, 4]
        assert j.get_run("nf").status == "ok"
        # The skipped flush was local to those commits: the connection syncs every commit again.
        if j.backend == "postgres":
            assert j._db.execute("SHOW synchronous_commit").fetchone()[0] == "on"
        else:
            assert j._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    finally:
        j.close()


def _refused_now_or_next(journal, exc_type, seq: int, **kw) -> None:
    """An append sent without waiting that the store refuses: SQLite raises at once, PostgreSQL
    at the writer's next append (one seq further), which writes nothing although its seq is free."""
    try:
        journal.append("w", [step(seq)], seq, durable=False, wait=False, **kw)
    except exc_type:
        return
    with pytest.raises(exc_type) as info:
        journal.append("w", [step(seq + 1)], seq + 1, durable=False, **kw)
    if exc_type is ConflictError:
        assert info.value.expected_seq == seq  # it names the append that was refused


def test_an_append_sent_without_waiting_is_seen_and_its_refusal_raised(journal):
    journal.append("w", [started()], 0, lease=("w1", 0.05))
    stored = journal.append("w", [step(0)], 1, durable=False, wait=False)
    assert [e.seq for e in stored] == [1]
    assert [e.seq for e in journal.read("w")] == [0, 1] and journal.get_run("w").next_seq == 2  # every call sees it
    _refused_now_or_next(journal, ConflictError, 1)  # seq 1 is taken
    assert [e.seq for e in journal.read("w")] == [0, 1]
    journal.append("w", [step(2)], 2, durable=False, wait=False)  # the refusal was raised once
    # A refusal nobody claims stays with its writer: other runs, and an append of this run
    # that is not that writer's next one (a new executor's), go through.
    try:
        journal.append("w", [step(1)], 1, durable=False, wait=False)  # refused; its writer appends no more
    except ConflictError:
        pass
    journal.append("other", [started()], 0)
    journal.append("w", [step(3)], 3)
    assert [e.seq for e in journal.read("w")] == [0, 1, 2, 3]
    # a lease taken over: the stale executor's append is refused, and so is its next one
    time.sleep(0.1)
    assert journal.take_lease("w", "w2", 30) == 2
    _refused_now_or_next(journal, engrain.LeaseLostError, 4, fence=1)
    assert [e.seq for e in journal.read("w")] == [0, 1, 2, 3]
    journal.append("w", [step(4)], 4, durable=False, wait=False, fence=2)
    journal.append("w", [NewEvent("run.completed", "", {"output": 1})], 5, fence=2)
    assert journal.get_run("w").status == "ok" and len(journal.read("w")) == 6
    with pytest.raises(ValueError, match="durable=False"):
        journal.append("w", [step(6)], 6, wait=False)


def test_concurrent_writers_of_one_run_one_wins(store_url):
    """Two journals (two connections) race to append at the same seq: exactly one wins."""
    a, b = engrain.open(store_url), engrain.open(store_url)
    try:
        a.append("race", [started()], 0)
        results: list[str] = []
        barrier = threading.Barrier(2)

        def writer(j, name):
            barrier.wait()
            try:
                j.append("race", [NewEvent("step.started", name, {"call_id": 0})], 1)
                results.append("ok")
            except ConflictError:
                results.append("conflict")

        threads = [threading.Thread(target=writer, args=(j, n)) for j, n in ((a, "a"), (b, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == ["conflict", "ok"]
        assert [e.seq for e in a.read("race")] == [0, 1]
    finally:
        a.close()
        b.close()


def test_many_threads_appending_distinct_runs(journal):
    def work(k):
        journal.append(f"run{k}", [started(f"task{k}")], 0)
        for i in range(20):
            journal.append(f"run{k}", [step(i)], 1 + i)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(8):
        assert [e.seq for e in journal.read(f"run{k}")] == list(range(21))


def test_run_summary_tracks_status_task_tags(journal):
    journal.append("r", [started("fetch report", ["a", "b"])], 0)
    info = journal.get_run("r")
    assert (info.status, info.task, info.tags, info.next_seq) == ("running", "fetch report", ["a", "b"], 1)
    journal.append("r", [NewEvent("input.requested", "ask", {"call_id": 0, "prompt": "ok?"})], 1)
    assert journal.get_run("r").status == "needs_input"
    journal.append("r", [NewEvent("input.received", "ask", {"call_id": 0, "answers": {}})], 2)
    assert journal.get_run("r").status == "running"
    journal.append("r", [NewEvent("run.completed", "", {"output": 1})], 3)
    info = journal.get_run("r")
    assert info.status == "ok" and info.next_seq == 4 and info.updated >= info.created
    assert journal.get_run("missing") is None


def test_get_runs_answers_many_runs_at_once(journal):
    for i in range(600):  # past SQLite's chunk of bound parameters
        journal.append(f"r{i}", [started(f"t{i}", [])], 0)
    journal.append("r7", [NewEvent("run.completed", "", {"output": 1})], 1)
    got = journal.get_runs([f"r{i}" for i in range(600)] + ["missing", "r7"])
    assert set(got) == {f"r{i}" for i in range(600)}
    assert got["r7"] == journal.get_run("r7") and got["r7"].status == "ok" and got["r7"].next_seq == 2
    assert got["r599"].task == "t599" and journal.get_runs([]) == {}


def test_runs_filters(journal):
    journal.append("a", [started("alpha", ["x"])], 0)
    journal.append("b", [started("beta", ["y"])], 0)
    journal.append("c", [started("alpha", ["x", "y"]), NewEvent("run.failed", "", {"error": "boom"})], 0)
    time.sleep(0.01)
    journal.append("a", [NewEvent("run.completed", "", {"output": None})], 1)
    assert [r.run_id for r in journal.runs()][0] == "a"  # most recently updated first
    assert {r.run_id for r in journal.runs(status="failed")} == {"c"}
    assert {r.run_id for r in journal.runs(status=["ok", "failed"])} == {"a", "c"}
    assert {r.run_id for r in journal.runs(task="alpha")} == {"a", "c"}
    assert {r.run_id for r in journal.runs(tag="y")} == {"b", "c"}
    assert {r.run_id for r in journal.runs(tag="x", status="ok")} == {"a"}
    assert len(journal.runs(limit=2)) == 2
    assert len(journal.runs(limit=2, offset=2)) == 1
    assert journal.runs(since=time.time() + 60) == []


def test_runs_by_prefix_are_exactly_the_ids_that_start_with_it(journal):
    ids = ["chat:a:s:0", "chat:a:s:1", "chat:a:s:10", "chat:a:s", "chat:a:t:0", "Chat:a:s:2", "chat:a:s;",
           "g*[?]:1", "g*[?]:2", "gx[?]:3", "g*[?", "é:1", "é:2", "e:1"]
    for rid in ids:
        journal.append(rid, [started()], 0)
    for prefix in ("chat:a:s:", "chat:a:", "g*[?]:", "g*", "é:", "e", "zzz"):
        got = {r.run_id for r in journal.runs(prefix=prefix, limit=100)}
        assert got == {i for i in ids if i.startswith(prefix)}, prefix
    assert len(journal.runs(prefix="chat:a:s:", limit=2)) == 2
    assert {r.run_id for r in journal.runs(prefix="chat:a:s:1", status="running")} == {"chat:a:s:1", "chat:a:s:10"}


def test_leases(journal):
    journal.append("r", [started()], 0)
    assert journal.acquire_lease("r", "w1", ttl=30)
    assert not journal.acquire_lease("r", "w2", ttl=30)
    assert journal.acquire_lease("r", "w1", ttl=30)  # renewal by the holder
    assert journal.get_run("r").lease_owner == "w1"
    journal.release_lease("r", "w2")  # not the holder: no effect
    assert journal.get_run("r").lease_owner == "w1"
    journal.release_lease("r", "w1")
    assert journal.acquire_lease("r", "w2", ttl=0.05)
    time.sleep(0.15)
    assert journal.acquire_lease("r", "w3", ttl=30)  # expired lease is taken over
    with pytest.raises(RunNotFoundError):
        journal.acquire_lease("missing", "w1", ttl=1)


@pytest.mark.parametrize("fallback", [False, True], ids=["backend", "base-fallback"])
def test_lease_renewal_holds_only_at_the_epoch_taken(journal, fallback):
    from engrain._journal import Journal

    # The base class's renewal (for journals without their own) must keep the same promise.
    renew = (lambda *a: Journal.renew_lease(journal, *a)) if fallback else journal.renew_lease
    journal.append("r", [started()], 0, lease=("w1", 30))  # epoch 1
    until = journal.get_run("r").lease_until
    time.sleep(0.02)
    assert renew("r", "w1", 60, 1)
    assert journal.get_run("r").lease_until > until and journal.get_run("r").lease_epoch == 1
    assert not renew("r", "w2", 60, 1)  # not the holder
    assert not renew("r", "w1", 60, 2)  # not its epoch
    # Released, then free: a renewal does not take it back, unlike take_lease.
    journal.release_lease("r", "w1")
    assert not renew("r", "w1", 60, 1)
    assert journal.get_run("r").lease_owner is None
    # Taken over and released by another owner, then taken again by w1: only the new epoch renews.
    assert journal.take_lease("r", "w2", 30) == 2
    assert not renew("r", "w1", 60, 1) and journal.get_run("r").lease_owner == "w2"
    journal.release_lease("r", "w2")
    assert journal.take_lease("r", "w1", 30) == 3
    assert not renew("r", "w1", 60, 1) and renew("r", "w1", 60, 3)
    # A lapsed lease nobody took is still its owner's: renewed, and then live again.
    journal.append("x", [started()], 0, lease=("w1", 0.05))
    time.sleep(0.15)
    assert renew("x", "w1", 30, 1)
    assert not journal.acquire_lease("x", "w2", ttl=30)
    # A finish drops the lease: nothing left to renew.
    journal.append("x", [NewEvent("run.completed", "", {"output": 1})], 1)
    assert not renew("x", "w1", 30, 1) and journal.get_run("x").lease_owner is None
    assert not renew("missing", "w1", 30, 1)


def test_lease_release_at_an_epoch_spares_a_later_one(journal):
    journal.append("r", [started()], 0, lease=("w1", 30))
    journal.release_lease("r", "w1")
    assert journal.take_lease("r", "w1", 30) == 2  # the same owner's lease again, at a new epoch
    journal.release_lease("r", "w1", 1)  # the first one's release: not this lease
    assert journal.get_run("r").lease_owner == "w1"
    journal.release_lease("r", "w1", 2)
    assert journal.get_run("r").lease_owner is None


def test_append_creates_a_leased_run(journal):
    journal.append("r", [started()], 0, lease=("w1", 30))
    assert journal.get_run("r").lease_owner == "w1"
    assert not journal.acquire_lease("r", "w2", ttl=30)
    assert journal.claim_runs("w2", ttl=30) == []  # no window between creation and lease
    journal.append("e", [started(), step(0)], 0, lease=("w1", 0.05))
    time.sleep(0.15)
    assert [r.run_id for r in journal.claim_runs("w2", ttl=30)] == ["e"]  # the lease expires like any other
    with pytest.raises(ValueError, match="expected_seq=0"):
        journal.append("r", [step(0)], 1, lease=("w1", 30))
    for bad in (("", 30), ("w1", 0), ("w1", float("inf")), ("w1",), "w1"):
        with pytest.raises(ValueError, match="lease"):
            journal.append("bad", [started()], 0, lease=bad)
    assert journal.get_run("bad") is None


def test_finishing_a_run_drops_its_lease(journal):
    for kind, data in (("run.completed", {"output": 1}), ("run.failed", {"error": "x"})):
        rid = f"fin-{kind}"
        journal.append(rid, [started()], 0, lease=("w1", 30))
        journal.append(rid, [step(0)], 1)
        journal.append(rid, [NewEvent("input.requested", "ask", {"call_id": 1, "prompt": "?", "fields": []})], 2)
        journal.append(rid, [NewEvent("input.received", "ask", {"call_id": 1, "answers": {}})], 3)
        assert journal.get_run(rid).lease_owner == "w1"  # only a finish drops it
        journal.append(rid, [NewEvent(kind, "", data)], 4)
        info = journal.get_run(rid)
        assert info.lease_owner is None and info.lease_until is None
        assert info.status == {"run.completed": "ok", "run.failed": "failed"}[kind]
    # A whole run appended at once, finish included, is never left leased.
    journal.append("b", [started(), step(0), NewEvent("run.completed", "", {"output": 1})], 0, lease=("w1", 30))
    assert journal.get_run("b").lease_owner is None and journal.get_run("b").status == "ok"
    # In a batch, a finish drops a lease held by anyone.
    journal.append("c", [started()], 0)
    assert journal.acquire_lease("c", "w2", ttl=30)
    journal.append("c", [step(0), NewEvent("run.failed", "", {"error": "x"})], 1)
    assert journal.get_run("c").lease_owner is None


def test_claim_runs_splits_unfinished_runs_between_workers(journal):
    for k in range(6):
        journal.append(f"r{k}", [started()], 0)
    journal.append("r5", [NewEvent("run.completed", "", {"output": 1})], 1)
    journal.acquire_lease("r4", "someone", ttl=60)
    first = journal.claim_runs("w1", ttl=60, limit=2)
    second = journal.claim_runs("w2", ttl=60, limit=10)
    a, b = {r.run_id for r in first}, {r.run_id for r in second}
    assert len(a) == 2 and not a & b
    assert a | b == {"r0", "r1", "r2", "r3"}  # never the completed run, never a live lease
    assert all(r.lease_owner == "w2" for r in second)
    assert journal.claim_runs("w3", ttl=60) == []


def test_delete_run(journal):
    journal.append("r", [started()], 0)
    journal.delete_run("r")
    assert journal.get_run("r") is None and journal.read("r") == []
    journal.append("r", [started()], 0)  # the id can be reused


def test_large_batches_are_atomic(journal):
    events = [started()] + [step(i) for i in range(149)]  # several INSERT statements on SQLite
    journal.append("big", events, 0, lease=("w1", 30))
    journal.append("big", [step(i) for i in range(149, 279)], 150)
    with pytest.raises(ConflictError):
        journal.append("big", [step(i) for i in range(200)], 150)  # stale: nothing of it is written
    with pytest.raises(ValueError):
        journal.append("big", [step(i) for i in range(100)] + [NewEvent("nope", "", {})], 280)
    stored = journal.read("big")
    assert [e.seq for e in stored] == list(range(280))
    assert [e.data["call_id"] for e in stored[1:]] == list(range(279))
    info = journal.get_run("big")
    assert info.next_seq == 280 and info.lease_owner == "w1"


def test_sqlite_migrates_an_unversioned_store_under_concurrent_openers(tmp_path):
    """A store written before schema versions (old trigger saying 'completed', no engrain_meta) is
    migrated once, in order, while several openers race, and its finished runs read as 'ok'."""
    import sqlite3

    from engrain._journal.sqlite_schema import VERSION, _v1_tables

    path = tmp_path / "old.db"
    con = sqlite3.connect(path, isolation_level=None)
    _v1_tables(con)
    # The trigger as engrain wrote it before leases were dropped by a finish.
    con.execute("""CREATE TRIGGER events_run_status AFTER INSERT ON events
WHEN NEW.seq > 0 AND NEW.kind IN
    ('run.started', 'run.completed', 'run.failed', 'input.requested', 'input.received', 'replay.started')
BEGIN
    UPDATE runs SET updated = NEW.ts,
        status = CASE NEW.kind WHEN 'run.completed' THEN 'completed' WHEN 'run.failed' THEN 'failed'
            WHEN 'input.requested' THEN 'needs_input' ELSE 'running' END
    WHERE run_id = NEW.run_id;
END""")
    con.execute("INSERT INTO events VALUES ('old', 0, 1.0, 'run.started', '', '{\"task\": \"t\"}')")
    con.execute("INSERT INTO events VALUES ('old', 1, 2.0, 'run.completed', '', '{\"output\": 1}')")
    assert con.execute("SELECT status FROM runs").fetchall() == [("completed",)]
    errors: list[BaseException] = []
    go = threading.Barrier(6)

    def opener(k: int) -> None:
        try:
            go.wait()
            j = engrain.open(f"sqlite:///{path}")
            for n in range(8):
                j.append(f"o{k}.{n}", [started()], 0, lease=("w", 30))
                j.append(f"o{k}.{n}", [NewEvent("run.completed" if n % 2 else "run.failed", "", {"output": k})], 1)
            j.close()
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=opener, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert con.execute("SELECT value FROM engrain_meta WHERE key = 'journal'").fetchone() == (str(VERSION),)
    reader = engrain.open(f"sqlite:///{path}")
    assert reader.get_run("old").status == "ok"
    assert {r.status for r in reader.runs(limit=100)} == {"ok", "failed"}
    assert len(reader.runs(limit=100)) == 49
    assert all(r.lease_owner is None for r in reader.runs(status="ok"))
    reader.close()
    con.close()


def test_bad_arguments_are_clear(journal):
    with pytest.raises(ValueError, match="run_id"):
        journal.append("", [started()], 0)
    with pytest.raises(ValueError, match="at least one event"):
        journal.append("r", [], 0)
    with pytest.raises(ValueError, match="expected_seq"):
        journal.append("r", [started()], -1)


def test_batch_decoding_reads_what_the_fast_decoder_refuses():
    """Text msgspec refuses (NaN, 1e400, a lone surrogate escape) is read by the stdlib, as before."""
    from engrain._events import loads_many

    assert loads_many(['{"a":1}', '{"b":[2,3]}']) == [{"a": 1}, {"b": [2, 3]}]
    out = loads_many(['{"x":NaN}', '{"y":1e400}', '{"z":"\\ud800"}', '{"w":123456789012345678901234567890}'])
    assert out[0]["x"] != out[0]["x"] and out[1]["y"] == float("inf") and out[2]["z"] == "\ud800"
    assert out[3]["w"] == 123456789012345678901234567890


def test_postgres_appends_outlive_a_deallocate_all(pg_url):
    """The PostgreSQL journal prepares its append statements under its own names; a DEALLOCATE ALL
    on the connection (psycopg sends one after a ROLLBACK or a DROP) makes it prepare them again."""
    j = engrain.open(pg_url)
    try:
        j.append("d", [started()], 0)
        j.append("d", [step(0)], 1, durable=False, wait=False)
        j.read("d")  # settles the append sent without waiting
        j._db.execute("DEALLOCATE ALL")
        j.append("d", [step(1)], 2, durable=False, wait=False)  # its statement is gone: found when settled
        j.append("d", [step(2)], 3)
        j._db.execute("DEALLOCATE ALL")
        j.append("d", [NewEvent("run.completed", "", {"output": 1})], 4)
        assert [e.seq for e in j.read("d")] == [0, 1, 2, 3, 4] and j.get_run("d").status == "ok"
    finally:
        j.close()


# -- a finished run stays finished ----------------------------------------------------------------

_ENDINGS = (("run.completed", {"output": 1}, "ok"), ("run.failed", {"error": "x"}, "failed"),
            ("run.cancelled", {"reason": "stop"}, "cancelled"))


def _after_end_events() -> list[NewEvent]:
    """One event of every kind, each of which a stale or forged writer might try after a run's end."""
    data = {"call_id": 9, "answers": {}, "result": 1, "type": "tool", "args": {}, "attempt": 1}
    return [started() if k == "run.started" else NewEvent(k, "x", data) for k in sorted(KINDS)]


@pytest.mark.parametrize("ending", _ENDINGS, ids=[e[2] for e in _ENDINGS])
def test_a_finished_run_takes_no_more_events(journal, ending):
    """No kind may follow a run's finishing event, whoever writes it and however: one event, a batch, append_one,
    fenced or not; the refusal names the run, how it ended and the kind, and writes nothing."""
    kind, data, status = ending
    journal.append("f", [started()], 0, lease=("w1", 30))
    journal.append("f", [step(0)], 1, fence=1)
    journal.append("f", [NewEvent(kind, "", data)], 2, fence=1)
    before = journal.get_run("f")
    assert before.status == status and before.next_seq == 3 and before.lease_owner is None
    for ev in _after_end_events():
        for refused, write in (
            (ev.kind, lambda: journal.append("f", [ev], 3)),
            ("step.started", lambda: journal.append("f", [step(1), ev], 3)),  # the batch's first event is refused
            (ev.kind, lambda: journal.append("f", [ev], 3, fence=1)),  # the executor that finished it, still fenced
            (ev.kind, lambda: journal.append_one("f", ev.kind, ev.name, ev.data, 3)),
            (ev.kind, lambda: journal.append_one("f", ev.kind, ev.name, ev.data, 3, fence=1, json_checked=True)),
        ):
            with pytest.raises(engrain.RunFinishedError) as info:
                write()
            e = info.value
            assert (e.run_id, e.status, e.kind) == ("f", status, refused)
            assert "'f'" in str(e) and status in str(e) and kind in str(e) and refused in str(e)
            assert not isinstance(e, ConflictError)  # nothing to retry: code retrying conflicts would loop
    # A stale writer (an executor whose next seq a cancel took) still gets its ConflictError first: that
    # is how it learns of the cancel.
    for seq in (2, 0, 7):
        with pytest.raises(ConflictError) as conflict:
            journal.append("f", [step(1)], seq, fence=1)
        assert conflict.value.actual_seq == 3
        with pytest.raises(ConflictError):
            journal.append_one("f", "step.completed", "tool", {"call_id": 1, "result": 1}, seq, fence=1)
    after = journal.get_run("f")
    assert (after.status, after.next_seq, after.lease_owner) == (status, 3, None)
    assert [e.kind for e in journal.read("f")] == ["run.started", "step.started", kind]
    assert journal.claim_runs("w2", ttl=30) == []  # still not running: nothing to claim


def test_a_batch_that_goes_on_after_its_own_end_is_refused_whole(journal):
    end = NewEvent("run.completed", "", {"output": 1})
    with pytest.raises(engrain.RunFinishedError) as info:
        journal.append("b", [started(), step(0), end, step(1)], 0)
    assert (info.value.run_id, info.value.status, info.value.kind) == ("b", "ok", "step.started")
    assert journal.get_run("b") is None and journal.read("b") == []
    journal.append("b", [started()], 0)
    for batch in ([step(0), NewEvent("run.failed", "", {"error": "x"}), started()],
                  [NewEvent("run.cancelled", "", {}), NewEvent("run.cancelled", "", {})]):
        with pytest.raises(engrain.RunFinishedError):
            journal.append("b", batch, 1)
    assert [e.seq for e in journal.read("b")] == [0] and journal.get_run("b").status == "running"
    # A batch that ends the run with its last event is how a whole run is journaled at once.
    journal.append("b", [step(0), end], 1)
    assert journal.get_run("b").status == "ok"


def test_an_append_after_the_end_sent_without_waiting_is_refused(journal):
    """PostgreSQL reads a sent append's result later: its refusal is still the end's, raised by the writer's next append."""
    journal.append("w", [started()], 0)
    journal.append("w", [NewEvent("run.completed", "", {"output": 1})], 1)
    _refused_now_or_next(journal, engrain.RunFinishedError, 2)
    assert [e.seq for e in journal.read("w")] == [0, 1] and journal.get_run("w").status == "ok"


def test_a_writer_waiting_on_the_finishing_append_is_refused(store_url):
    """Two writers race at the seq after the end's: the loser of the race sees the finish and is refused."""
    a, b = engrain.open(store_url), engrain.open(store_url)
    try:
        a.append("race", [started()], 0)
        a.append("race", [NewEvent("run.failed", "", {"error": "x"})], 1)
        outcomes: list[BaseException | None] = []

        def write(j) -> None:
            try:
                j.append_one("race", "step.completed", "tool", {"call_id": 0, "result": 1}, 2)
                outcomes.append(None)
            except engrain.EngrainError as e:
                outcomes.append(e)

        threads = [threading.Thread(target=write, args=(j,)) for j in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [type(o) for o in outcomes] == [engrain.RunFinishedError] * 2
        assert len(a.read("race")) == 2 and b.get_run("race").status == "failed"
    finally:
        a.close()
        b.close()


def test_sqlite_store_of_the_previous_version_refuses_appends_after_the_end_once_opened(tmp_path):
    """The check ships as a migration: a store written before it is brought up to date when opened."""
    import sqlite3

    from engrain._journal import sqlite_schema

    path = tmp_path / "old.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("CREATE TABLE engrain_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    for migration in sqlite_schema.MIGRATIONS[:6]:
        migration(db)
    db.execute("INSERT INTO engrain_meta VALUES ('journal', '6')")
    db.execute("INSERT INTO events VALUES ('old', 0, 1.0, 'run.started', '', '{\"task\": \"t\"}')")
    db.execute("INSERT INTO events VALUES ('old', 1, 2.0, 'run.completed', '', '{\"output\": 1}')")
    db.close()
    j = engrain.open(f"sqlite:///{path}")
    try:
        assert j.get_run("old").status == "ok"
        with pytest.raises(engrain.RunFinishedError):
            j.append("old", [step(0)], 2)
        with pytest.raises(ConflictError):
            j.append("old", [step(0)], 1)
        assert len(j.read("old")) == 2
    finally:
        j.close()
