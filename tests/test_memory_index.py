"""The usearch graph of skill memory persists next to a SQLite store (a PostgreSQL store's: in the cache folder).

Each ``Memory`` here stands for a separate process: it has its own in-process
index and learns about the store only through the database and the graph files.
The threshold is lowered so 150 rows already use the graph.
"""

from __future__ import annotations

import json
import logging
import time
import uuid

import pytest

from engrain._memory import Memory
from engrain._memory.embed import MiniLMEmbedder
from engrain._memory.synth import ExtractiveSynthesizer
from tests.conftest import drop_pg_schema, pg_schema_url

QUERY = "basement pump broke down"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Graphs of PostgreSQL stores go to this test's own cache folder, not the user's."""
    monkeypatch.setenv("ENGRAIN_CACHE_DIR", str(tmp_path / "cache"))


def _open(url: str, embedder: MiniLMEmbedder, threshold: int = 100) -> Memory:
    return Memory(url, embedder=embedder, synthesizer=ExtractiveSynthesizer(), ann_threshold=threshold)


def _vector_hits(m: Memory) -> list[tuple[str, float]]:
    m._records.refresh(m.store.state())
    return m._records.search(m.embedder.embed([QUERY])[0], 20, None, time.time())


@pytest.fixture
def saved(tmp_path, embedder):
    """A store of 151 records whose graph the first process built and saved; yields (url, target id, hits)."""
    url = f"sqlite:///{tmp_path / 'mem.db'}"
    with _open(url, embedder) as m:
        m.remember_many([f"Sensor {i} in hall {i % 7} reported {i * 3} degrees." for i in range(150)])
        target = m.remember("The cooling pump in the basement failed on Sunday.")
        assert m.recall(QUERY, top_k=1)[0].id == target
        assert (m._records.builds, m._records.loads) == (1, 0)
        assert m.stats()["vector_search"] == "usearch"
        graph, meta = m._records.graph_path, m._records.meta_path
        hits = _vector_hits(m)
    assert graph is not None and graph.name == "mem.db.record.usearch" and graph.stat().st_size > 0
    assert meta is not None and json.loads(meta.read_text())["elements"] == 151
    return url, target, hits


def test_second_process_loads_the_graph(saved, embedder):
    url, target, hits = saved
    with _open(url, embedder) as m:
        graph = m._records.graph_path
        assert graph is not None
        before = graph.stat().st_mtime_ns
        assert m.recall(QUERY, top_k=1)[0].id == target
        assert (m._records.builds, m._records.loads) == (0, 1)
        assert _vector_hits(m) == hits  # the very same graph: identical neighbours and scores
        assert graph.stat().st_mtime_ns == before  # nothing to top up, so not rewritten


def test_stale_graph_is_topped_up_and_saved(saved, embedder):
    url, _, _ = saved
    with _open(url, embedder, threshold=10**9) as writer:  # another process that only writes
        new = writer.remember_many([f"Generator {i} in yard {i % 3} used {i} litres of diesel." for i in range(30)])
        exact = writer.recall("diesel used by generator 7 in yard 1", top_k=1)[0].id
    with _open(url, embedder) as m:
        assert m.recall("diesel used by generator 7 in yard 1", top_k=1)[0].id == exact
        assert (m._records.builds, m._records.loads) == (0, 1) and m._records._ann_n == 181
        assert m._records.meta_path is not None
        # 30 new rows are past the save slack (5%): the file now covers them too.
        assert json.loads(m._records.meta_path.read_text())["elements"] == 181
        hits = _vector_hits(m)
    assert exact in new
    with _open(url, embedder) as m:
        assert _vector_hits(m) == hits and (m._records.builds, m._records.loads) == (0, 1)


@pytest.mark.parametrize("damage", ["flip", "truncate", "sidecar", "other_rows"])
def test_bad_graph_is_rebuilt(saved, embedder, caplog, damage):
    url, target, _ = saved
    with _open(url, embedder, threshold=10**9) as probe:
        graph, meta = probe._records.graph_path, probe._records.meta_path
    assert graph is not None and meta is not None
    data = bytearray(graph.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
        graph.write_bytes(bytes(data))
    elif damage == "truncate":
        graph.write_bytes(bytes(data[: len(data) // 3]))
    elif damage == "sidecar":
        meta.write_text("{not json")
    else:  # a sidecar that claims other rows (e.g. a file copied from another database)
        doc = json.loads(meta.read_text())
        doc["store"] = "0" * 16
        meta.write_text(json.dumps(doc))
    with caplog.at_level(logging.INFO, logger="engrain.memory"), _open(url, embedder) as m:
        assert m.recall(QUERY, top_k=1)[0].id == target  # never an error for the user
        assert (m._records.builds, m._records.loads) == (1, 0)
    assert any(str(graph) in r.getMessage() and "rebuilding" in r.getMessage() for r in caplog.records)
    with _open(url, embedder) as m:  # the rebuilt graph replaced the bad file
        assert m.recall(QUERY, top_k=1)[0].id == target
        assert (m._records.builds, m._records.loads) == (0, 1)
    assert not [p for p in graph.parent.iterdir() if p.name.endswith(".tmp")]  # no temp files left behind


def test_postgres_keeps_its_graph_in_the_cache_folder(tmp_path, embedder):
    schema = "t_" + uuid.uuid4().hex[:12]
    try:
        with _open(pg_schema_url(schema), embedder) as m:
            assert m._records.graph_path is None and m._records.meta_path is None  # named once a graph is needed
            m.remember_many([f"Valve {i} on line {i % 5} was serviced." for i in range(120)])
            assert m.recall("valve 42 service", top_k=1)[0].content == "Valve 42 on line 2 was serviced."
            assert m._records.builds == 1
            assert m._records.graph_path.parent == tmp_path / "cache" / "graphs" and m._records.graph_path.exists()
    finally:
        drop_pg_schema(schema)


def test_expired_rows_keep_the_saved_graph(tmp_path, embedder):
    """A TTL purge deletes rows without a rebuild, in this process or the next (which loads the saved graph)."""
    url = f"sqlite:///{tmp_path / 'mem.db'}"
    with _open(url, embedder) as m:
        m.remember_many([f"Sensor {i} in hall {i % 7} reported {i * 3} degrees." for i in range(150)])
        short = m.remember_many([{"data": f"Temporary pass {i} opens door {i}.", "ttl": 0.5} for i in range(10)])
        target = m.remember("The cooling pump in the basement failed on Sunday.")
        assert m.recall(QUERY, top_k=1)[0].id == target and m._records.builds == 1
        gen = m.store.state().get("records_gen", 0)
        time.sleep(0.6)
        s = m.consolidate()
        assert s.expired == 10 and m.store.state().get("records_gen", 0) == gen
        assert m.store.state()["records_del"] == 1
        hits = m.recall("temporary pass for a door", top_k=5)
        assert not {h.id for h in hits} & set(short) and m._records.builds == 1  # no rebuild here
        assert m._records._covered() and len(m._records) == 151
        kept = _vector_hits(m)
    with _open(url, embedder) as m:  # next process: the saved graph still serves, the 10 rows marked deleted
        assert _vector_hits(m) == kept and (m._records.builds, m._records.loads) == (0, 1)
        assert kept[0][0] == target
        assert not {h.id for h in m.recall("temporary pass for a door", top_k=20)} & set(short)


def test_a_first_recall_that_loads_the_graph_before_the_model_does_not_crash(tmp_path, embedder):
    """A fresh process whose first recall loads the saved graph (usearch) before it embeds the query (onnxruntime):
    onnxruntime imported after usearch's compiled module used to kill the process."""
    import subprocess
    import sys
    from pathlib import Path

    url = f"sqlite:///{tmp_path / 'mem.db'}"
    with _open(url, embedder) as m:
        m.remember_many([f"Sensor {i} in hall {i % 7} reported {i * 3} degrees." for i in range(150)])
        target = m.remember("The cooling pump in the basement failed on Sunday.")
        m.recall(QUERY)  # builds and saves the graph
    child = (
        "import sys\n"
        "from engrain._memory import Memory\n"
        "from engrain._memory.synth import ExtractiveSynthesizer\n"
        f"m = Memory({url!r}, synthesizer=ExtractiveSynthesizer(), ann_threshold=100)\n"
        "assert 'onnxruntime' not in sys.modules and 'usearch' not in sys.modules\n"
        f"print(m.recall({QUERY!r}, top_k=1)[0].id)\n"
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "PYTHONPATH": src})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == target


def test_a_program_that_imported_usearch_first_gets_a_clear_error_not_a_crash(tmp_path):
    """onnxruntime loaded after usearch's compiled module kills the process; when the caller imported usearch
    before engrain could import onnxruntime, the local model refuses with a typed error that says why and what
    to do, and the process lives on (a store without the local model keeps working)."""
    import subprocess
    import sys
    from pathlib import Path

    child = (
        "import usearch.index\n"
        "from engrain._errors import EmbeddingError\n"
        "from engrain._memory.embed import default_embedder\n"
        "try:\n"
        "    default_embedder().embed(['hello'])\n"
        "except EmbeddingError as e:\n"
        "    print('refused:', e)\n"
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "PYTHONPATH": src})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("refused:") and "usearch" in r.stdout and "before usearch" in r.stdout


def _bookkeeping_is_exact(ix) -> None:  # noqa: ANN001
    """The mirror's kept lookups (seq -> position for graph hits, each row's place in its skill, id -> position)
    equal what a search from scratch finds, for every row and for seqs it does not hold."""
    import bisect

    import numpy as np

    n = ix._n
    seqs = ix._seqs[:n]
    assert ix._pos == {rid: p for p, rid in enumerate(ix._ids[:n].tolist())}
    for p in range(n):
        rows = ix._by_skill.of(int(ix._skill_codes[p])).tolist()
        assert int(ix._ords[p]) == bisect.bisect_left(rows, p)
    absent = np.setdiff1d(np.arange(0, int(seqs[-1]) + 50), seqs)  # deleted, never written, or past the end
    ask = np.concatenate([seqs, absent, np.array([-1, 10**12], dtype=np.int64)])
    want = np.searchsorted(seqs, ask)
    inside = want < n
    inside[inside] = seqs[want[inside]] == ask[inside]
    assert ix._positions(ask).tolist() == np.where(inside, want, -1).tolist()


def test_graph_hits_and_windows_use_kept_positions_through_writes_and_deletes(tmp_path, embedder):
    """The lookups that replace binary searches stay exact as rows are appended (to several skills), deleted by
    another process (the mirror reloads, the graph keeps its vectors) and appended again; recall finds the same
    rows as before and never a deleted one."""
    url = f"sqlite:///{tmp_path / 'mem.db'}"
    with _open(url, embedder) as m, _open(url, embedder) as other:
        ids = m.remember_many([{"data": f"Sensor {i} in hall {i % 7} reported {i * 3} degrees.",
                                "skill": f"s{i % 3}"} for i in range(150)])
        target = m.remember("The cooling pump in the basement failed on Sunday.", skill="s1")
        assert m.recall(QUERY, top_k=1)[0].id == target and m._records._covered()
        _bookkeeping_is_exact(m._records)
        gone = ids[10:40]
        for rid in gone:
            other.forget(rid)
        hits = m.recall("sensor in hall 3 reported degrees", top_k=20)
        assert not {h.id for h in hits} & set(gone) and m._records.builds == 1  # reloaded, graph kept
        _bookkeeping_is_exact(m._records)
        more = m.remember_many([{"data": f"Valve {i} on line {i % 5} was serviced.", "skill": f"s{i % 2}"}
                                for i in range(40)])
        assert m.recall("valve 17 on line 2 serviced", top_k=1)[0].id == more[17]
        _bookkeeping_is_exact(m._records)
        exact = m._records._exact(m.embedder.embed([QUERY])[0], 10, None, time.time())
        assert _vector_hits(m)[:1] == exact[:1] and exact[0][0] == target


def _mirror(ix) -> dict:  # noqa: ANN001
    n = ix._n
    names = {c: s for s, c in ix._skills.items()}
    return {"seqs": ix._seqs[:n].tolist(), "ids": ix._ids[:n].tolist(), "expires": ix._expires[:n].tolist(),
            "skills": [names[c] for c in ix._skill_codes[:n].tolist()], "codes": ix._skill_codes[:n].tolist(),
            "last": ix._last, "mat": ix._mat[:n].tobytes()}


def test_a_deletion_drops_rows_without_reading_the_vectors_again(tmp_path, embedder):
    """After rows are deleted elsewhere (forget, a TTL purge with a changed expiry) the mirror equals a freshly
    loaded one, no vector is read again, and the graph keeps its vectors; a live row missing below the mirror's
    last seq (an out-of-order commit, as PostgreSQL can have) makes it read everything again."""
    url = f"sqlite:///{tmp_path / 'mem.db'}"
    with _open(url, embedder) as m, _open(url, embedder) as other:
        ids = m.remember_many([{"data": f"Sensor {i} in hall {i % 7} reported {i * 3} degrees.", "skill": f"s{i % 3}"}
                               for i in range(150)])
        m.recall(QUERY)
        other.forget(ids[5])
        other.forget(ids[77])
        other.store._x("UPDATE engrain_mem_records SET expires = ? WHERE id = ?", (time.time() + 3600, ids[9]))
        late = other.remember("The cooling pump in the basement failed on Sunday.", skill="s1")  # past the last seq
        statements: list[str] = []
        m.store._db.set_trace_callback(statements.append)
        assert m.recall(QUERY, top_k=1)[0].id == late
        m.store._db.set_trace_callback(None)
        assert not any("embedding FROM engrain_mem_records WHERE seq > 0" in s for s in statements)  # no full read of the vectors
        assert m._records.builds == 1 and len(m._records) == 149
        with _open(url, embedder) as fresh:
            fresh.recall(QUERY)
            assert _mirror(m._records) == _mirror(fresh._records)
        seq = int(m.store._x("SELECT seq FROM engrain_mem_records WHERE id = ?", (ids[20],)).fetchone()[0])
        row = m.store._x("SELECT * FROM engrain_mem_records WHERE seq = ?", (seq,)).fetchone()
        other.forget(ids[20])
        m.recall(QUERY)  # the mirror drops it
        other.store._x(f"INSERT INTO engrain_mem_records VALUES ({','.join('?' * len(row))})", row)  # back below
        other.forget(ids[30])
        statements.clear()
        m.store._db.set_trace_callback(statements.append)
        m.recall(QUERY)
        m.store._db.set_trace_callback(None)
        assert any("embedding FROM engrain_mem_records WHERE seq > 0" in s for s in statements)  # read everything again
        with _open(url, embedder) as fresh:
            fresh.recall(QUERY)
            assert _mirror(m._records) == _mirror(fresh._records) and ids[20] in m._records._pos


def test_a_deletion_on_postgres_drops_rows_from_its_mirror(embedder):
    """PostgreSQL without pgvector keeps the same in-process mirror: a forget elsewhere drops the row from it
    (live seqs read, vectors kept), equal to a freshly loaded mirror."""
    schema = "t_" + uuid.uuid4().hex[:12]
    try:
        url = pg_schema_url(schema)
        with _open(url, embedder) as m, _open(url, embedder) as other:
            if m.store.pgvector:
                pytest.skip("this server has pgvector: its store keeps no mirror")
            ids = m.remember_many([f"Valve {i} on line {i % 5} was serviced." for i in range(120)])
            assert m.recall("valve 42 service", top_k=1)[0].id == ids[42]
            other.forget(ids[42])
            assert ids[42] not in {h.id for h in m.recall("valve 42 service", top_k=5)}
            with _open(url, embedder) as fresh:
                fresh.recall("valve")
                assert _mirror(m._records) == _mirror(fresh._records) and len(m._records) == 119
    finally:
        drop_pg_schema(schema)


def test_the_mirror_holds_nothing_the_garbage_collector_walks_row_by_row(tmp_path, embedder):
    """A full garbage collection visits every element of a tracked list: with a million records, the mirror's ids
    and per-skill positions as lists made each one ~80 ms (paid by the host application, and by a recall caught
    in it). Every container the mirror keeps per row is an untracked array (or a dict of str -> int, which the
    collector leaves alone); after writes and a deletion, positions and ids still find the same rows."""
    import gc

    from engrain._memory.skillrows import SkillRows

    url = f"sqlite:///{tmp_path / 'mem.db'}"
    with _open(url, embedder) as m, _open(url, embedder) as other:
        ids = m.remember_many([{"data": f"Sensor {i} in hall {i % 7} reported {i * 3} degrees.", "skill": f"s{i % 3}"}
                               for i in range(300)])
        m.recall(QUERY, top_k=3)
        other.forget(ids[5])
        m.remember("The cooling pump in the basement failed on Sunday.", skill="s2")
        assert m.recall(QUERY, top_k=1, skill="s2")[0].content.startswith("The cooling pump")
        ix = m._records
        walked = {name: len(gc.get_referents(v)) for name, v in vars(ix).items() if gc.is_tracked(v)}
        assert all(n < 100 for n in walked.values()), walked  # no per-row container the collector walks
        assert not gc.is_tracked(ix._ids) and not gc.is_tracked(ix._pos)
        _bookkeeping_is_exact(ix)
        n = ix._n
        assert sorted(ix._ids[:n].tolist()) == sorted(set(ids) - {ids[5]} | {m.recall(QUERY, top_k=1)[0].id})

    rows = SkillRows()
    assert rows.add([2, 0, 2], 0).tolist() == [0, 0, 1] and rows.add([2], 3).tolist() == [2]
    assert rows.of(2).tolist() == [0, 2, 3] and rows.of(0).tolist() == [1] and rows.of(9).tolist() == []
    for p in range(4, 100):  # single appends grow the array by doubling; the positions stay in order
        rows.add([0], p)
    assert rows.of(0).tolist() == [1, *range(4, 100)] and len(rows) == 2
