"""``Memory(vector_search=...)``: where recall searches vectors, on real SQLite and PostgreSQL servers.

``"local"`` on PostgreSQL searches an in-process mirror (numpy, then a usearch
graph past ``ann_threshold``) of the same store, as SQLite does. It must rank as
pgvector does, share the store with processes that search with pgvector (writes
keep the ``vec`` column), and keep its graph in this machine's cache folder so a
new process loads it instead of rebuilding it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from engrain import ConfigError
from engrain._memory import Memory
from engrain._memory.synth import ExtractiveSynthesizer
from tests.conftest import drop_pg_schema, pg_schema_url
from tests.test_memory import FACTS, PGVECTOR_URL, drop_pgvector_schema, pgvector_schema_url
from tests.test_memory_pgvector import OTHERS, QUERIES

MORE = [f"Ticket {i}: the {w} service restarts after a failed health check." for i, w in enumerate(
    ["billing", "search", "login", "upload", "export", "mail", "report", "backup", "cache", "queue", "audit", "sync"])]


@pytest.fixture
def graphs(tmp_path, monkeypatch) -> Iterator[str]:
    """An empty cache folder of this test's own (``$ENGRAIN_CACHE_DIR``): the graphs folder lives under it."""
    monkeypatch.setenv("ENGRAIN_CACHE_DIR", str(tmp_path / "cache"))
    yield str(tmp_path / "cache" / "graphs")


def _open(url: str, embedder, **kw) -> Memory:
    return Memory(url, embedder=embedder, synthesizer=ExtractiveSynthesizer(), **kw)


def _ranked(hits: list) -> list[tuple[str, str]]:
    return [(h.tier, h.id) for h in hits]


def test_a_wrong_vector_search_is_a_typed_error_naming_the_choices(tmp_path, embedder):
    url = f"sqlite:///{tmp_path / 'm.db'}"
    with pytest.raises(ConfigError, match=r"'auto', 'pgvector', 'local'.*'gpu'"):
        _open(url, embedder, vector_search="gpu")
    with pytest.raises(ConfigError, match="vector extension.*sqlite store has none.*'auto' or 'local'"):
        _open(url, embedder, vector_search="pgvector")
    with _open(url, embedder, vector_search="local") as m:  # SQLite always searches in-process
        m.remember("Production deploys happen every Tuesday afternoon.", skill="ops")
        assert m.vector_search == "local" and m.recall("when do we deploy?")[0].skill == "ops"


def test_the_environment_chooses_when_the_caller_does_not(tmp_path, monkeypatch, embedder):
    url = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("ENGRAIN_VECTOR_SEARCH", "pgvector")
    with pytest.raises(ConfigError, match="vector extension"):
        _open(url, embedder)
    with _open(url, embedder, vector_search="auto") as m:  # the caller's choice wins
        assert m.vector_search == "local"
    monkeypatch.setenv("ENGRAIN_VECTOR_SEARCH", "fast")
    with pytest.raises(ConfigError, match=r"\$ENGRAIN_VECTOR_SEARCH must be one of .*'fast'"):
        _open(url, embedder)


def test_pgvector_is_refused_on_a_server_without_the_extension(embedder):
    schema = "t_" + uuid.uuid4().hex[:12]
    url = pg_schema_url(schema)
    try:
        with pytest.raises(ConfigError, match="vector extension.*postgres store has none"):
            _open(url, embedder, vector_search="pgvector")
        with _open(url, embedder) as m:  # auto: in-process, as before
            assert m.vector_search == "local" and m.stats()["vector_search"] == "numpy exact"
    finally:
        drop_pg_schema(schema)


def test_a_postgres_graph_is_kept_in_the_cache_folder_and_loaded_by_the_next_process(graphs, embedder):
    schema = "t_" + uuid.uuid4().hex[:12]
    url = pg_schema_url(schema)
    try:
        a = _open(url, embedder, ann_threshold=8)
        a.remember_many([{"data": t, "skill": s} for t, s in FACTS + OTHERS] + [{"data": t, "skill": "ops"} for t in MORE])
        want = {q: _ranked(a.recall(q, skill=s, top_k=4)) for q, s in QUERIES}
        assert a._records.builds == 1 and a.stats()["vector_search"] == "usearch"
        files = sorted(os.listdir(graphs))
        assert len(files) == 2 and files[0].startswith("pg-") and files[0].endswith(".record.usearch")
        # The name is a digest: neither the server's address nor the store's identity names a path.
        assert a.store.identity() not in files[0] and "127.0.0.1" not in files[0]
        assert os.stat(os.path.join(graphs, files[0])).st_mode & 0o077 == 0
        a.close()
        b = _open(url, embedder, ann_threshold=8)
        try:
            assert {q: _ranked(b.recall(q, skill=s, top_k=4)) for q, s in QUERIES} == want
            assert (b._records.loads, b._records.builds) == (1, 0)
            # A record written since is topped up, and found.
            rid = b.remember("The on-call phone is kept in the red drawer.", skill="ops")
            assert b.recall("where is the on-call phone?", skill="ops")[0].id == rid
        finally:
            b.close()
    finally:
        drop_pg_schema(schema)

def test_graphs_unused_for_two_weeks_leave_the_cache_when_another_is_saved(graphs, embedder):
    """A dropped store's graph (~800 MB at 1M rows) does not stay in the cache forever: saving a graph removes
    the cached ones unused for ``GRAPH_CACHE_DAYS``; loading one marks it used. Other files are never touched."""
    import time

    from engrain._memory.graphfile import GRAPH_CACHE_DAYS

    os.makedirs(graphs)
    old = time.time() - (GRAPH_CACHE_DAYS + 1) * 86400
    stale = ["pg-" + "a" * 32 + ".record.usearch", "pg-" + "a" * 32 + ".record.usearch.json",
             "pg-" + "b" * 32 + ".article.usearch.x1_y.tmp"]
    kept = ["pg-" + "c" * 32 + ".record.usearch", "notes.txt", "pg-short.record.usearch"]  # young, or not a graph
    for name in stale + kept:
        with open(os.path.join(graphs, name), "wb") as f:
            f.write(b"x")
        if name != kept[0]:
            os.utime(os.path.join(graphs, name), (old, old))
    schema = "t_" + uuid.uuid4().hex[:12]
    url = pg_schema_url(schema)
    try:
        with _open(url, embedder, ann_threshold=8) as a:
            a.remember_many([{"data": t, "skill": s} for t, s in FACTS + OTHERS])
            assert a.recall("when do we deploy?") and a._records.builds == 1
            mine = a._records.graph_path
        left = set(os.listdir(graphs))
        assert not left & set(stale) and set(kept) <= left and mine.name in left
        os.utime(mine, (old, old))  # as if unused for weeks, then opened by the next process: used again
        with _open(url, embedder, ann_threshold=8) as b:
            assert b.recall("when do we deploy?") and b._records.loads == 1
        assert os.stat(mine).st_mtime > old + 86400
    finally:
        drop_pg_schema(schema)



@pytest.mark.parametrize("spoil", ["group-writable", "symlink"])
def test_a_cached_graph_that_is_not_a_private_file_is_rebuilt(spoil, tmp_path, graphs, embedder):
    """The cache folder's files are checked as the other caches' are: a regular file of this user that nobody else
    can write, not a link to somewhere else."""
    import shutil

    schema = "t_" + uuid.uuid4().hex[:12]
    url = pg_schema_url(schema)
    try:
        with _open(url, embedder, ann_threshold=8) as a:
            a.remember_many([{"data": t, "skill": "ops"} for t in MORE])
            a.recall("the login service restarts", skill="ops")
            graph = a._records.graph_path
        if spoil == "group-writable":
            os.chmod(graph, 0o660)
        else:
            elsewhere = tmp_path / "elsewhere.usearch"
            shutil.move(graph, elsewhere)
            os.symlink(elsewhere, graph)
        with _open(url, embedder, ann_threshold=8) as b:
            assert b.recall("the login service restarts", skill="ops")
            assert (b._records.loads, b._records.builds) == (0, 1)
    finally:
        drop_pg_schema(schema)


def test_another_store_never_takes_a_cached_graph(graphs, embedder):
    schemas = ["t_" + uuid.uuid4().hex[:12] for _ in range(2)]
    try:
        mems = [_open(pg_schema_url(s), embedder, ann_threshold=8) for s in schemas]
        for i, m in enumerate(mems):
            rows = FACTS + OTHERS if i == 0 else OTHERS
            m.remember_many([{"data": t, "skill": s} for t, s in rows] + [{"data": t, "skill": "ops"} for t in MORE])
            m.recall("who signs off on paying a bill?")
        assert [m._records.builds for m in mems] == [1, 1]
        assert len({m._records.graph_path for m in mems}) == 2
        for m in mems:
            m.close()
    finally:
        for s in schemas:
            drop_pg_schema(s)


def test_a_cache_folder_others_can_write_is_not_used(tmp_path, monkeypatch, embedder):
    cache = tmp_path / "shared"
    (cache / "graphs").mkdir(parents=True)
    os.chmod(cache / "graphs", 0o777)
    monkeypatch.setenv("ENGRAIN_CACHE_DIR", str(cache))
    schema = "t_" + uuid.uuid4().hex[:12]
    try:
        with _open(pg_schema_url(schema), embedder, ann_threshold=8) as m:
            m.remember_many([{"data": t, "skill": "ops"} for t in MORE])
            assert m.recall("the login service restarts", skill="ops")
            assert m._records.builds == 1 and m._records.graph_path is None
        assert os.listdir(cache / "graphs") == []
    finally:
        drop_pg_schema(schema)


@pytest.mark.skipif(not PGVECTOR_URL, reason="ENGRAIN_TEST_PGVECTOR_URL is not set (scripts/pgvector.sh)")
def test_local_and_pgvector_processes_share_one_store_and_rank_alike(embedder):
    schema = "t_" + uuid.uuid4().hex[:12]
    url = pgvector_schema_url(schema)
    try:
        pg = _open(url, embedder, vector_search="pgvector")
        local = _open(url, embedder, vector_search="local")
        try:
            assert pg.vector_search == "pgvector" and local.vector_search == "local"
            # Each writes half; each finds the other's records (the local side keeps the vec column filled).
            mine = local.remember_many([{"data": t, "skill": s} for t, s in FACTS])
            pg.remember_many([{"data": t, "skill": s} for t, s in OTHERS])
            qv = embedder.embed([FACTS[0][0]])[0]
            assert pg.store.pg_vector_search("record", qv, None, 0.0, 1)[0][0] == mine[0]
            for q, skill in QUERIES:
                a, b = pg.recall(q, skill=skill, top_k=4), local.recall(q, skill=skill, top_k=4)
                assert _ranked(a) == _ranked(b)
                assert np.allclose([h.score for h in a], [h.score for h in b], atol=1e-4)
            local.consolidate()
            for q, skill in QUERIES:
                assert _ranked(pg.recall(q, skill=skill)) == _ranked(local.recall(q, skill=skill))
        finally:
            pg.close()
            local.close()
    finally:
        drop_pgvector_schema(schema)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_mirror_loads_a_chunk_at_a_time_and_misses_no_row(backend, tmp_path, monkeypatch, embedder):
    from engrain._memory import index, items

    chunk = 4  # the bench's 1M stores load in chunks of 50k; a few rows show the same loop
    monkeypatch.setattr(index, "VECTOR_CHUNK", chunk)
    for tier, sql in items.VECTORS_SQL.items():
        monkeypatch.setitem(items.VECTORS_SQL, tier, sql.replace(f"LIMIT {items.VECTOR_CHUNK}", f"LIMIT {chunk}"))
    schema = "t_" + uuid.uuid4().hex[:12]
    url = f"sqlite:///{tmp_path / 'm.db'}" if backend == "sqlite" else pg_schema_url(schema)
    try:
        texts = [t for t, _ in FACTS + OTHERS] + MORE
        with _open(url, embedder) as w:
            ids = w.remember_many([{"data": t, "skill": "all"} for t in texts])
        with _open(url, embedder) as m:  # a new process: its mirror loads every row, chunk by chunk
            for i in (0, chunk, len(texts) - 1):
                assert m.recall(texts[i], skill="all", top_k=1)[0].id == ids[i]
            assert len(m._records) == len(texts)
            more = m.remember_many([{"data": f"Room {i} is booked for the offsite.", "skill": "all"} for i in range(9)])
            assert m.recall("Room 8 is booked for the offsite.", skill="all", top_k=1)[0].id == more[-1]
            assert len(m._records) == len(texts) + 9
    finally:
        if backend == "postgres":
            drop_pg_schema(schema)


def test_the_server_searches_where_it_was_told(tmp_path, graphs, embedder):
    """``create_app(vector_search=...)`` (``engrain serve --vector-search``): the HTTP API's memory searches there,
    and a wrong value stops the server before it serves."""
    from fastapi.testclient import TestClient

    from engrain._server import create_app

    with pytest.raises(ConfigError, match="vector_search must be one of"):
        create_app(f"sqlite:///{tmp_path / 'bad.db'}", routines_dir=tmp_path / "routines", vector_search="remote")
    schema = "t_" + uuid.uuid4().hex[:12]
    url = pgvector_schema_url(schema) if PGVECTOR_URL else pg_schema_url(schema)
    try:
        app = create_app(url, routines_dir=tmp_path / "routines", vector_search="local")
        with TestClient(app, base_url="http://127.0.0.1") as c:
            for text, skill in FACTS:
                assert c.post("/api/memory/remember", json={"data": text, "skill": skill}).status_code == 200
            hits = c.post("/api/memory/recall", json={"query": "when do we deploy?", "top_k": 1}).json()
            assert "Tuesday" in hits[0]["content"]
            assert c.get("/api/memory/stats").json()["vector_search"] == "numpy exact"
    finally:
        (drop_pgvector_schema if PGVECTOR_URL else drop_pg_schema)(schema)


def test_a_row_committed_after_a_higher_seq_is_still_found(graphs, embedder):
    """Two writers: A takes a seq and has not committed when B writes. B waits for A (rows commit in seq order), so
    a mirror that catches up past the highest seq it saw never skips A's row."""
    import threading
    import time

    schema = "t_" + uuid.uuid4().hex[:12]
    url = pg_schema_url(schema)
    mems = []
    try:
        a, b, local = (_open(url, embedder, **kw) for kw in ({}, {}, {"vector_search": "local"}))
        mems += [a, b, local]
        b.remember("Production deploys happen every Tuesday afternoon.", skill="s")
        local.recall("deploys", skill="s")
        with a.store.tx():  # writer A: its record's seq taken, not committed
            ra = a.remember_many([{"data": "Ada repairs the basement pump whenever it floods.", "skill": "s"}])[0]
            done: list[str] = []
            writer = threading.Thread(target=lambda: done.append(b.remember("The cafeteria serves lasagna on Fridays.",
                                                                            skill="s")))
            writer.start()
            time.sleep(0.5)
            assert not done  # B waits for A's commit
            assert [h.id for h in local.recall("lasagna", skill="s")] == [local.recall("deploys", skill="s")[0].id]
        writer.join(10)
        assert done
        hits = [h.id for h in local.recall("who fixes water problems downstairs?", skill="s", top_k=3)]
        assert ra in hits and done[0] in [h.id for h in local.recall("lasagna on Fridays", skill="s")]
        assert len(local._records) == 3
    finally:
        for m in mems:
            m.close()
        drop_pg_schema(schema)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_lifetime_extended_by_remembering_again_reaches_a_running_mirror(backend, tmp_path, embedder):
    import time

    schema = "t_" + uuid.uuid4().hex[:12]
    url = f"sqlite:///{tmp_path / 'm.db'}" if backend == "sqlite" else pg_schema_url(schema)
    try:
        with _open(url, embedder) as m:
            rid = m.remember("Today's temporary door code is 4312.", skill="it", ttl=0.6)
            assert m.recall("door code", skill="it")[0].id == rid  # the mirror holds it, with its expiry
            assert m.remember("Today's temporary door code is 4312.", skill="it") == rid  # kept for good now
            time.sleep(0.8)
            # No word shared with the record: only the vector half can find it, so its mirror's expiry decides.
            assert [h.id for h in m.recall("which number opens the entrance?", skill="it")] == [rid]
    finally:
        if backend == "postgres":
            drop_pg_schema(schema)


def test_two_threads_catching_up_at_once_leave_the_newest_vectors(graphs, embedder):
    """A catch-up reads the store and then applies what it read: another thread's catch-up waits for it, so an older
    read never lands on a newer mirror."""
    import threading

    schema = "t_" + uuid.uuid4().hex[:12]
    url = pg_schema_url(schema)
    try:
        with _open(url, embedder) as w, _open(url, embedder, vector_search="local") as m:
            rid = w.remember("Ada repairs the basement pump whenever it floods.", skill="s")
            read, gate = threading.Event(), threading.Event()
            real = m.store.pg_state_and_vectors

            def slow(after):  # thread A: stops between reading the store and applying it
                out = real(after)
                if threading.current_thread().name == "A":
                    read.set()
                    gate.wait(10)
                return out

            m.store.pg_state_and_vectors = slow
            first = threading.Thread(target=m._refresh, name="A")
            first.start()
            assert read.wait(10)
            w.update(rid, "The cafeteria serves lasagna on Fridays.")  # a new vector: a new generation
            second = threading.Thread(target=m._refresh, name="B")
            second.start()
            second.join(0.5)
            assert second.is_alive()  # B waits for A's catch-up to finish
            gate.set()
            first.join(10)
            second.join(10)
            want = embedder.embed(["The cafeteria serves lasagna on Fridays."])[0]
            assert np.allclose(m._records._mat[m._records._pos[rid]], want, atol=1e-3)
    finally:
        drop_pg_schema(schema)


def test_a_server_told_pgvector_on_a_store_without_it_does_not_start(tmp_path):
    from engrain._server import create_app

    with pytest.raises(ConfigError, match="vector extension"):
        create_app(f"sqlite:///{tmp_path / 's.db'}", routines_dir=tmp_path / "routines", vector_search="pgvector")
