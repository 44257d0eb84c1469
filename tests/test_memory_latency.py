"""What recall skips to be fast changes no result (behaviour only; the timings are bench/memory.py's).

* candidate rows that cannot reach the top k are not read (``ranking._fetch_best``);
* the vector mirrors are not caught up while the store is unchanged (``Memory._refresh``);
* query vectors are kept per embedder object, and the full text runs on a worker beside the embedding (``query.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields

import numpy as np
import pytest

from engrain._memory import Memory
from engrain._memory import query as _query
from engrain._memory.query import QueryVectors, settle, start_beside
from engrain._memory.seqrows import MirrorRows
from engrain._memory.synth import ExtractiveSynthesizer

FACTS = [
    "Deploys to production happen every Tuesday after the change review.",
    "The staging database is reset every night at 02:00.",
    "Alice fixed the flaky login service in Berlin last Friday.",
    "Bob reported that the billing job in Tokyo was slow yesterday.",
    "The payment gateway in Lagos was migrated on 3 July, 2023.",
    "Carol reviewed the search index in Oslo this morning.",
    "The coffee machine on floor 3 is broken again.",
    "Dave rolled back the mobile app release in Austin on Monday.",
]


def _store(tmp_path, embedder, name: str = "m.db") -> Memory:
    mem = Memory(f"sqlite:///{tmp_path / name}", embedder=embedder, synthesizer=ExtractiveSynthesizer())
    rows = []
    for i in range(160):
        fact = FACTS[i % len(FACTS)]
        rows.append({"data": f"{fact} (note {i}, team {i % 4})", "skill": f"team{i % 4}",
                     "metadata": {"user": f"u{i % 5}"}, "label": "ops" if i % 6 == 0 else None,
                     "hint": (i % 10) / 10 if i % 3 else None})
    mem.remember_many(rows)
    topics = ["printer jams on A3 paper", "the wifi drops in the kitchen", "parking permits renew in March",
              "the plants on the balcony need water", "lunch is served at noon", "the elevator is slow"]
    mem.remember_many([{"data": f"Note {i}: {topics[i % 6]} (floor {i % 9}, desk {i})", "skill": f"team{i % 4}"}
                       for i in range(200)])  # unrelated rows: candidates far below the top
    asks = ["Why was the billing job in Tokyo slow?", "Who fixed the login service in Berlin?",
            "When was the payment gateway migrated? Was it in July?", "Is the search index in Oslo reviewed?"]
    mem.remember_many([{"data": q, "skill": f"team{i % 4}"} for i, q in enumerate(asks * 3)])  # discounted matches
    return mem


QUERIES = [
    ("when did Alice fix the login service?", {}),
    ("billing job problems", {"top_k": 10}),
    ("payment gateway migration", {"top_k": 1}),
    ("search index", {"skill": "team2"}),
    ("deploys", {"label": "ops"}),
    ("what broke on floor 3", {"where": {"user": "u3"}}),
    ("what happened on 3 July, 2023?", {}),
    ("mobile app release", {"neighbours": True, "top_k": 3}),
    ("staging database reset", {"top_k": 7, "hint": 0.9}),
]


def _full_read(monkeypatch) -> None:
    """Make recall read every candidate's row (the ranking before rows were skipped)."""
    from engrain._memory import ranking

    def every(mem, cands, qv, label, now, w_text, context, prior, keep, vectors, question=None, rows=None):  # noqa: ANN001, ANN202
        return (rows or mem.store).records([i for t, i in cands if t == "record"], vectors=vectors), {}  # no score kept

    monkeypatch.setattr(ranking, "_fetch_best", every)


def _frozen_clock(monkeypatch) -> None:
    """Recall reads one fixed time from here on: recency moves a score by ~1e-8 a second, enough to flip its sixth
    decimal between two runs of the same recalls, which these comparisons must not mistake for a change."""
    from engrain._memory import api

    fixed = time.time()

    class _Clock:
        def time(self) -> float:
            return fixed

        def __getattr__(self, name: str):  # noqa: ANN204
            return getattr(time, name)

    monkeypatch.setattr(api, "time", _Clock())


@contextmanager
def _counting(mem: Memory, sink: list[int]) -> Iterator[None]:
    """Count the record ids each read of rows asks for: the store's, and scoring's by seq (:mod:`.seqrows`)."""
    real, by_seq = mem.store.records, MirrorRows.records

    def store_read(ids, vectors=True):  # noqa: ANN001, ANN202
        ids = list(ids)
        sink.append(len(ids))
        return real(ids, vectors)

    def seq_read(self, ids, vectors=True, folded_of=()):  # noqa: ANN001, ANN202
        ids = list(ids)
        sink.append(len(ids))
        return by_seq(self, ids, vectors, folded_of)

    mem.store.records, MirrorRows.records = store_read, seq_read
    try:
        yield
    finally:
        mem.store.records, MirrorRows.records = real, by_seq


def _recalls(mem: Memory) -> list:
    return [[r.to_dict() for r in mem.recall(q, **kw)] for q, kw in QUERIES]


def test_unread_candidates_change_no_result(tmp_path, embedder, monkeypatch):
    """Same records, order, scores and provenance as reading every candidate, with articles and folded records."""
    mem = _store(tmp_path, embedder)
    try:
        plain = _recalls(mem)
        summary = mem.consolidate(num_records=100)
        _frozen_clock(monkeypatch)  # after the consolidation, which reads the real clock for its leases
        assert summary.formed > 0 and not summary.errors
        folded = mem.store._x("SELECT count(*) FROM engrain_mem_records WHERE article_id IS NOT NULL").fetchone()[0]
        assert folded > 0
        with_articles = _recalls(mem)
        assert any(r["tier"] == "article" for hits in with_articles for r in hits)
        assert any("via" in r["provenance"] for hits in with_articles for r in hits)
        reads: list[int] = []
        with _counting(mem, reads):
            again = _recalls(mem)
        _full_read(monkeypatch)
        full_reads: list[int] = []
        with _counting(mem, full_reads):
            assert _recalls(mem) == again == with_articles
        assert sum(reads) < sum(full_reads)  # the point of it: fewer rows read for the same results
        monkeypatch.undo()
        with Memory(f"sqlite:///{tmp_path / 'fresh.db'}", embedder=embedder,
                    synthesizer=ExtractiveSynthesizer()) as other:  # no articles: the narrow folded query is skipped
            other.remember_many(FACTS)
            got = [[r.to_dict() for r in other.recall(q, top_k=2)] for q, _ in QUERIES]
            _full_read(monkeypatch)
            assert got == [[r.to_dict() for r in other.recall(q, top_k=2)] for q, _ in QUERIES]
        assert plain  # recalls before consolidation ran too
    finally:
        mem.close()


def test_folded_records_are_named_by_the_store(tmp_path, embedder):
    mem = _store(tmp_path, embedder)
    try:
        ids = [r.id for r in mem.find({"user": "u1"})]
        assert mem.store.folded_records(ids) == set()
        mem.consolidate(num_records=160, method="FIFO")
        folded = mem.store.folded_records(ids + ["rec_missing"])
        assert folded and folded <= set(ids)
        assert all(mem.store.records([i])[i].article_id for i in folded)
    finally:
        mem.close()


def test_mirrors_catch_up_after_every_kind_of_write(tmp_path, embedder):
    """Recalls skip the catch-up while nothing changed, and never miss a write by this or another connection."""
    a = _store(tmp_path, embedder)
    b = Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=embedder, synthesizer=ExtractiveSynthesizer())
    try:
        a.recall("deploys")
        states: list[int] = []
        real = a.store.state
        a.store.state = lambda: (states.append(1), real())[1]
        for _ in range(3):
            a.recall("deploys")  # its own recall events do not count as changes
        assert states == []
        rid = b.remember("The quantum flux capacitor lives in rack 42.", skill="team0")
        assert a.recall("quantum flux capacitor rack", top_k=1)[0].id == rid  # another connection's write
        assert len(states) == 1
        mine = a.remember("Zebra crossings are painted white and black.", skill="team1")
        assert a.recall("zebra crossing paint", top_k=1)[0].id == mine  # this connection's write
        b.forget(rid)
        assert rid not in [h.id for h in a.recall("quantum flux capacitor rack", top_k=3)]  # a delete elsewhere
        a.update(mine, "Zebras are striped horses of the savanna.")
        assert a.recall("striped savanna animals", top_k=1)[0].id == mine  # a rewrite here (re-embedded)
    finally:
        a.close()
        b.close()


class _Named:
    def __init__(self, name: str):
        self.name, self.dim = name, 3

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.ones((len(texts), 3), dtype=np.float32)


def test_query_vectors_never_cross_embedders():
    cache = QueryVectors(size=2)
    one, same_name = _Named("e"), _Named("e")
    v = cache.put(one, "q", np.array([1.0, 0.0], dtype=np.float32))
    assert cache.get(one, "q") is v and not v.flags.writeable  # shared by later recalls: read-only
    assert cache.get(same_name, "q") is None  # another object, even of the same name
    cache.put(same_name, "q", np.zeros(2, dtype=np.float32))
    assert cache.get(one, "q") is None
    cache.put(one, "a", np.zeros(2, dtype=np.float32))
    cache.get(same_name, "q")  # most recent now
    cache.put(one, "b", np.zeros(2, dtype=np.float32))
    assert len(cache) == 2 and cache.get(one, "a") is None and cache.get(same_name, "q") is not None
    cache.clear()
    assert len(cache) == 0


def test_reembed_never_serves_the_old_embedders_query_vector(tmp_path, embedder):
    mem = Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=embedder, synthesizer=ExtractiveSynthesizer())
    try:
        mem.remember_many(FACTS)
        mem.recall("when do we deploy?")
        old = mem._qcache.get(embedder, "when do we deploy?")
        assert old is not None
        other = _Named("other")
        other.dim = 384

        def embed(texts: list[str]) -> np.ndarray:
            out = np.zeros((len(texts), 384), dtype=np.float32)
            out[:, 0] = 1.0
            return out

        other.embed = embed  # type: ignore[method-assign]
        mem.reembed(other)
        got = mem.recall("when do we deploy?")
        assert got and mem._qcache.get(other, "when do we deploy?")[0] == 1.0  # its own vector, not the old one
    finally:
        mem.close()


def test_side_work_runs_on_a_worker_and_reports_errors():
    seen: list[str] = []
    fut = start_beside(lambda: (seen.append(threading.current_thread().name), "side")[1])
    assert fut.result() == "side" and seen[0].startswith("engrain-recall")
    with pytest.raises(ValueError, match="full text failed"):
        start_beside(lambda: (_ for _ in ()).throw(ValueError("full text failed"))).result()
    done = threading.Event()

    def slow() -> None:
        done.wait(0.2)
        seen.append("side finished")

    settle(start_beside(slow))  # the caller failed: it still waits for its side work, never leaves it running
    assert seen[-1] == "side finished"
    settle(start_beside(lambda: 1 / 0))  # and swallows the side's own error (the caller's is the one raised)
    assert _query._busy == 0


def test_side_work_runs_here_when_the_workers_are_busy():
    release = threading.Event()
    held = [start_beside(lambda: release.wait(5)) for _ in range(_query._WORKERS)]
    try:
        here = start_beside(threading.current_thread)
        assert here.done() and here.result() is threading.current_thread()  # not queued behind the others
        with pytest.raises(KeyError):
            start_beside(lambda: {}["x"]).result()
    finally:
        release.set()
        for f in held:
            assert f.result() is True
    assert _query._busy == 0


def _hook_text(mem: Memory, before=None, after=None) -> None:  # noqa: ANN001
    """Run ``before``/``after`` around each of ``mem``'s full-text searches."""
    real = mem.store.text_search

    def hooked(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        if before:
            before()
        out = real(*a, **kw)
        if after:
            after()
        return out

    mem.store.text_search = hooked  # type: ignore[method-assign]


def test_recall_runs_full_text_beside_the_local_embedding(tmp_path, embedder, monkeypatch):
    mem = Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=embedder, synthesizer=ExtractiveSynthesizer())
    try:
        mem.remember_many(FACTS)
        where: list[str] = []
        _hook_text(mem, before=lambda: where.append(threading.current_thread().name))
        got = [r.id for r in mem.recall("who fixed the login service?")]
        assert where and where[0].startswith("engrain-recall")
        filtered: list[str] = []
        real_ids = mem.store.filtered_ids
        monkeypatch.setattr(mem.store, "filtered_ids", lambda *a: (filtered.append(threading.current_thread().name),
                                                                   real_ids(*a))[1])
        assert mem.recall("who fixed the login service?", where={"team": "x"}) == []  # no record has it
        assert filtered and filtered[0].startswith("engrain-recall")  # the filter's ids: beside the embedding
        monkeypatch.setattr(_query, "_busy", _query._WORKERS)  # workers busy: the same recall, on this thread
        mem._qcache.clear()
        assert [r.id for r in mem.recall("who fixed the login service?")] == got
        assert where[-1] == threading.current_thread().name
    finally:
        mem.close()


def test_a_failed_embedding_waits_for_its_full_text(tmp_path, embedder):
    mem = Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=embedder, synthesizer=ExtractiveSynthesizer())
    try:
        mem.remember_many(FACTS)
        finished: list[bool] = []
        _hook_text(mem, before=lambda: threading.Event().wait(0.2), after=lambda: finished.append(True))

        class Broken:
            name, dim = embedder.name, embedder.dim

            def embed(self, texts):  # noqa: ANN001, ANN202
                raise RuntimeError("model failed")

        mem.embedder = Broken()  # type: ignore[assignment]
        with pytest.raises(RuntimeError, match="model failed"):
            mem.recall("who fixed the login service?")
        assert finished == [True]  # the side work ended before the error was raised
    finally:
        mem.close()


@contextmanager
def pg_memory(embedder) -> Iterator[Memory]:  # noqa: ANN001
    """A pgvector store (a schema of its own) of 120 records in 4 skills, 80 folded into articles; skips without
    ``$ENGRAIN_TEST_PGVECTOR_URL``."""
    import uuid

    from tests.test_memory import PGVECTOR_URL, drop_pgvector_schema, pgvector_schema_url

    if not PGVECTOR_URL:
        pytest.skip("set ENGRAIN_TEST_PGVECTOR_URL to a PostgreSQL server with pgvector")
    schema = "t_" + uuid.uuid4().hex[:12]
    mem = Memory(pgvector_schema_url(schema), embedder=embedder, synthesizer=ExtractiveSynthesizer())
    try:
        assert mem.store.pgvector
        mem.remember_many([{"data": f"{FACTS[i % len(FACTS)]} (note {i})", "skill": f"team{i % 4}",
                            "metadata": {"user": f"u{i % 5}"}, "label": "ops" if i % 6 == 0 else None}
                           for i in range(120)])
        assert not mem.consolidate(num_records=80, method="FIFO").errors
        yield mem
    finally:
        mem.close()
        drop_pgvector_schema(schema)


def test_unread_candidates_change_no_result_on_pgvector(embedder, monkeypatch):
    """On pgvector (no in-process mirror: the narrow folded-records query always runs) the results are the same."""
    with pg_memory(embedder) as mem:
        _frozen_clock(monkeypatch)
        got = _recalls(mem)
        _full_read(monkeypatch)
        assert _recalls(mem) == got


def test_a_metadata_filter_reads_the_covering_index_not_the_rows(tmp_path, embedder):
    """recall/find ``where=`` on SQLite scans an index of (metadata, expires, skill, id), not the records' rows."""
    mem = Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=embedder, synthesizer=ExtractiveSynthesizer())
    try:
        mem.remember_many([{"data": f, "metadata": {"user": f"u{i % 3}"}} for i, f in enumerate(FACTS)])
        seen: list[str] = []
        mem.store._db.set_trace_callback(seen.append)
        found = {r.content for r in mem.find({"user": "u1"})}
        mem.store._db.set_trace_callback(None)
        assert found == {f for i, f in enumerate(FACTS) if i % 3 == 1}
        scan = next(s for s in seen if "json_extract" in s)
        plan = " ".join(str(r[-1]) for r in mem.store._db.execute("EXPLAIN QUERY PLAN " + scan))
        assert "COVERING INDEX engrain_mem_records_meta" in plan, plan
    finally:
        mem.close()


def test_a_forked_child_recalls_with_a_side_pool_of_its_own(tmp_path, embedder):
    """A process that recalled (so its side-work pool has threads) and then forks: the child's recall must not
    hand its full text to the parent's threads, which do not exist in the child, and wait for ever."""
    import os
    import sys

    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    mem = Memory(f"sqlite:///{tmp_path / 'f.db'}", embedder=embedder, synthesizer=ExtractiveSynthesizer())
    target = mem.remember("The cooling pump in the basement failed on Sunday.")
    mem.remember_many([f"Sensor {i} reported {i * 3} degrees." for i in range(50)])
    assert mem.recall("cooling pump failure", top_k=1)[0].id == target  # the parent's pool now has a thread
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only when its recall finished and found the record
        code = 1
        try:
            child = Memory(f"sqlite:///{tmp_path / 'f.db'}", embedder=embedder, synthesizer=ExtractiveSynthesizer())
            code = 0 if child.recall("cooling pump failure", top_k=1)[0].id == target else 3
        finally:
            sys.stdout.flush()
            os._exit(code)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's recall hung on the parent's side-work pool")
        time.sleep(0.05)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    mem.close()


def test_rows_read_by_seq_are_the_rows_read_by_id(tmp_path, embedder):
    """Scoring reads rows by the seqs the mirror knows (:mod:`engrain._memory.seqrows`): the same records as by id,
    with or without vectors, for ids the mirror has not seen yet (written elsewhere since it caught up), rows
    deleted elsewhere since (absent, as by id) and ids that never existed."""
    mem = _store(tmp_path, embedder)
    other = Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=embedder, synthesizer=ExtractiveSynthesizer())
    try:
        mem.recall("deploys")  # the mirror caught up
        rows = MirrorRows.of(mem.store, mem._records)
        assert rows is not None
        known = [r.id for r in mem.find({"user": "u2"})]
        late = other.remember("The freight elevator was inspected on Monday.", skill="team1")  # unseen by the mirror
        dropped = known[3]
        other.forget(dropped)  # deleted elsewhere; the mirror still maps it to its seq
        ask = known + [late, "rec_missing"]
        statements: list[str] = []
        mem.store._db.set_trace_callback(statements.append)
        try:
            for vectors in (True, False):
                got, want = rows.records(ask, vectors=vectors), mem.store.records(ask, vectors=vectors)
                assert got.keys() == want.keys() and late in got and dropped not in got and "rec_missing" not in got
                for i, r in got.items():  # a Record holds a numpy vector: the other fields compared, then it
                    plain = {f.name for f in fields(r)} - {"embedding"}
                    assert {f: getattr(r, f) for f in plain} == {f: getattr(want[i], f) for f in plain}
                    assert np.array_equal(r.embedding, want[i].embedding) and len(r.embedding) == (384 if vectors else 0)
        finally:
            mem.store._db.set_trace_callback(None)
        assert any("WHERE seq IN" in s for s in statements)  # the known ids by seq, the rest by id
        assert rows.articles(ids=[]) == []
    finally:
        mem.close()
        other.close()
    assert MirrorRows.of(type("PgStore", (), {"backend": "postgres"})(), None) is None
