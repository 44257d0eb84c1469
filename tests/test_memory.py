"""Skill memory on every backend with the real embedding model (all-MiniLM-L6-v2 int8 ONNX).

Backends: SQLite, PostgreSQL without pgvector (``$ENGRAIN_TEST_PG_URL``, numpy
vector search) and PostgreSQL with pgvector (``$ENGRAIN_TEST_PGVECTOR_URL``,
``scripts/pgvector.sh``; vector search in SQL). Without that URL the pgvector
runs skip, naming the variable; ``scripts/test.sh`` always sets it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import numpy as np
import pytest

import engrain as eg
from engrain._memory import Memory
from engrain._memory.synth import ExtractiveSynthesizer
from tests.conftest import BACKENDS, drop_pg_schema, pg_schema_url

ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")

FACTS = [
    ("Production deploys happen every Tuesday afternoon.", "ops"),
    ("The staging database is rebuilt every night at 2am UTC.", "ops"),
    ("Alice prefers short answers with bullet points.", "chat"),
    ("The office coffee machine is on the third floor next to the lifts.", "chat"),
    ("Invoices must be approved by the finance lead before payment.", "finance"),
]


PGVECTOR_URL = os.environ.get("ENGRAIN_TEST_PGVECTOR_URL")


def pgvector_schema_url(schema: str) -> str:
    """A URL on the pgvector test server whose search_path is a new ``schema``."""
    import psycopg

    assert PGVECTOR_URL
    with psycopg.connect(PGVECTOR_URL, autocommit=True) as c:
        c.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PGVECTOR_URL else "?"
    return f"{PGVECTOR_URL}{sep}options={quote(f'-csearch_path={schema}', safe='')}"


def drop_pgvector_schema(schema: str) -> None:
    import psycopg

    assert PGVECTOR_URL
    with psycopg.connect(PGVECTOR_URL, autocommit=True) as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=[*BACKENDS, "pgvector"])
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """A fresh, empty store on each backend, here also PostgreSQL with pgvector."""
    schema = "t_" + uuid.uuid4().hex[:12]
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'engrain.db'}"
    elif request.param == "postgres":
        yield pg_schema_url(schema)
        drop_pg_schema(schema)
    else:
        if not PGVECTOR_URL:
            pytest.skip("ENGRAIN_TEST_PGVECTOR_URL is not set (scripts/pgvector.sh starts a server with pgvector)")
        yield pgvector_schema_url(schema)
        drop_pgvector_schema(schema)


@pytest.fixture
def mem(store_url, embedder):
    m = Memory(store_url, embedder=embedder, synthesizer=ExtractiveSynthesizer())
    if PGVECTOR_URL and store_url.startswith(PGVECTOR_URL):
        # On the pgvector server recall must search in SQL, not fall back to numpy.
        assert m.store.pgvector and m.stats()["vector_search"] == "pgvector"
    elif store_url.startswith("sqlite"):
        assert not m.store.pgvector and m.stats()["vector_search"] == "numpy exact"
    yield m
    m.close()


def test_a_huge_text_is_embedded_from_its_head_in_bounded_cpu(embedder):
    """The model reads 256 tokens: a 5 MB text embeds as its head does, without tokenizing the rest (which cost
    9 s of CPU for a 5 MB recall query), alone and in a batch."""
    import time

    head = "Production deploys happen every Tuesday afternoon. " * 40  # ~320 tokens: past what the model reads
    tail = "and then some more words about nothing in particular " * 100_000
    t0 = time.thread_time()
    alone = embedder.embed([head + tail])[0]
    batch = embedder.embed([head + tail, "short", head + tail[:50_000]])
    took = time.thread_time() - t0
    want = embedder.embed([head])[0]
    assert float(alone @ want) > 0.9999 and float(batch[0] @ want) > 0.9999 and float(batch[2] @ want) > 0.9999
    assert took < 2.0, f"{took:.2f} s of CPU"


def test_real_model_paraphrase_geometry(embedder):
    v = embedder.embed(["How do I reset my password?", "I forgot my login secret, how can I change it?",
                        "The train to Paris leaves at noon."])
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    assert v[0] @ v[1] > 0.5 > v[0] @ v[2]


def test_paraphrase_recall(mem):
    ids = {text: mem.remember(text, skill=skill) for text, skill in FACTS}
    hits = mem.recall("which day of the week do we ship releases to prod?")
    assert hits[0].id == ids[FACTS[0][0]]
    assert hits[0].tier == "record" and hits[0].skill == "ops"
    assert hits[0].score > hits[1].score
    hits = mem.recall("where can I get a coffee in the building", top_k=1)
    assert [h.id for h in hits] == [ids[FACTS[3][0]]]
    assert hits[0].provenance["created"] <= time.time()


def test_dedupe_and_stats(mem):
    a = mem.remember("Deploy freeze starts on December 20.", skill="ops")
    assert mem.remember("Deploy freeze starts on December 20.", skill="ops") == a
    b = mem.remember("Deploy freeze starts on December 20.", skill="finance")
    assert b != a
    st = mem.stats()
    assert (st["records"], st["buffer"], st["articles"]) == (2, 2, 0)


def test_full_text_finds_exact_identifiers(mem):
    mem.remember("Error code XJ-4471 means the license server is unreachable.", skill="support")
    for i in range(8):
        mem.remember(f"Support ticket number {i} was closed after a password reset.", skill="support")
    hits = mem.recall("XJ-4471", skill="support", top_k=3)
    assert "XJ-4471" in hits[0].content


def test_skill_scoping(mem):
    mem.remember("The deadline for the report is Friday.", skill="alpha")
    mem.remember("The deadline for the report is Monday.", skill="beta")
    hits = mem.recall("when is the report due?", skill="alpha")
    assert hits and {h.skill for h in hits} == {"alpha"}
    assert {h.skill for h in mem.recall("when is the report due?")} == {"alpha", "beta"}
    assert mem.consolidate().formed == 2
    alpha = [h for h in mem.recall("report deadline", skill="alpha") if h.tier == "article"][0]
    # Fresh signal for beta after a cross-skill recall never rewrites alpha's article.
    mem.recall("report deadline")
    mem.remember("The report deadline moved to next Wednesday.", skill="beta")
    s = mem.consolidate()
    assert not s.errors
    after = mem.store.articles(skill="alpha")
    assert len(after) == 1 and after[0].content == alpha.content and after[0].version == 1
    beta = mem.store.articles(skill="beta")
    assert len(beta) == 1 and "Wednesday" in beta[0].content and beta[0].version == 2


def test_ttl_expiry(mem):
    keep = mem.remember("The wifi network is called engrain-guest.", skill="it")
    gone = mem.remember("Today's temporary door code is 4312.", skill="it", ttl=0.4)
    assert {h.id for h in mem.recall("door code", skill="it")} >= {gone}
    time.sleep(0.5)
    ids = {h.id for h in mem.recall("door code", skill="it")}
    assert gone not in ids and keep in ids
    assert mem.stats()["records"] == 1
    s = mem.consolidate()
    assert s.dropped >= 1 and s.formed == 1
    assert all(gone not in a.sources for a in mem.store.articles())
    with pytest.raises(eg.MemoryInputError, match="ttl"):
        mem.remember("x", ttl=-1)


def test_default_ttl(store_url, embedder):
    m = Memory(store_url, embedder=embedder, synthesizer=ExtractiveSynthesizer(), ttl=0.3)
    try:
        m.remember("Short-lived note about lunch.")
        m.remember("Long-lived note about the roadmap.", ttl=3600)
        time.sleep(0.4)
        assert [h.content for h in m.recall("note")] == ["Long-lived note about the roadmap."]
    finally:
        m.close()


def test_reconsolidation_rewrites_recalled_article(mem):
    mem.remember("Production deploys happen every Tuesday afternoon.", skill="ops", metadata={"source": "runbook"})
    mem.remember("Only the release manager may start a production deploy.", skill="ops", metadata={"source": "wiki"})
    first = mem.consolidate()
    assert first.formed >= 1 and first.reconsolidated == 0
    hit = [h for h in mem.recall("when are production deploys?", skill="ops") if h.tier == "article"][0]
    assert hit.provenance["version"] == 1
    new = mem.remember("Since March 2026 production deploys moved from Tuesday to Thursday.", skill="ops",
                       metadata={"source": "cto"})
    s = mem.consolidate()
    assert s.reconsolidated == 1 and s.formed == 0, s
    art = mem.store.articles(ids=[hit.id])[0]
    assert art.content != hit.content and "Thursday" in art.content and "source: cto" in art.content
    assert art.version == 2 and new in art.sources and art.metadata["recalls"] == 1
    assert mem.store.records([new])[new].article_id == art.id
    # The synthesizer says it is offline, and dates stay in the text.
    assert "offline" in s.synthesizer and time.strftime("%Y-", time.gmtime()) in art.content


def test_no_fresh_signal_leaves_article_text(mem):
    mem.remember("The on-call rotation changes every Monday at 9am.", skill="ops")
    mem.consolidate()
    before = mem.store.articles(skill="ops")[0]
    mem.recall("when does on-call rotate?", skill="ops")
    s = mem.consolidate()
    after = mem.store.articles(skill="ops")[0]
    assert s.reconsolidated == 0 and after.content == before.content and after.metadata["recalls"] == 1


def test_exactly_once_across_repeated_consolidations(mem):
    ids = [mem.remember(text, skill=skill) for text, skill in FACTS]
    for i in range(5):
        mem.remember(f"Meeting room {i} has a broken projector cable.", skill="facilities")
    total = mem.stats()["buffer"]
    flushed = 0
    for method in ("FIFO", "LIFO", "FIFO", "LIFO", "FIFO", "LIFO"):
        s = mem.consolidate(num_records=2, method=method)
        assert not s.errors
        flushed += s.flushed
    assert flushed == total and mem.stats()["buffer"] == 0
    again = mem.consolidate()
    assert (again.flushed, again.formed, again.updated, again.reconsolidated) == (0, 0, 0, 0)
    owners: dict[str, str] = {}
    for a in mem.store.articles():
        for rid in a.sources:
            assert rid not in owners, "a record was folded into two articles"
            owners[rid] = a.id
    assert set(ids) <= set(owners)
    assert mem.stats()["cursor"] >= total


def test_two_consolidators_never_share_rows(store_url, embedder):
    a = Memory(store_url, embedder=embedder, synthesizer=ExtractiveSynthesizer())
    b = Memory(store_url, embedder=embedder, synthesizer=ExtractiveSynthesizer())
    try:
        a.remember_many([{"data": f"Fact number {i} about the {w} project.", "skill": "proj"}
                         for i, w in enumerate(["apollo", "gemini", "mercury", "artemis", "skylab", "voyager"])])
        results = []
        threads = [threading.Thread(target=lambda m=m: results.append(m.consolidate(num_records=3))) for m in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sum(r.flushed for r in results) == 6 and all(not r.errors for r in results)
        sources = [s for art in a.store.articles() for s in art.sources]
        assert len(sources) == len(set(sources)) == 6
    finally:
        a.close()
        b.close()


class _Broken:
    name = "broken"

    def synthesize(self, skill, records, previous):
        raise RuntimeError("synthesis service down")


def test_errors_are_reported_and_rows_kept(store_url, embedder):
    m = Memory(store_url, embedder=embedder, synthesizer=_Broken())
    try:
        m.remember("A fact that cannot be synthesized yet.", skill="s")
        s = m.consolidate()
        assert s.errors and "synthesis service down" in s.errors[0] and s.kept == 1 and s.flushed == 0
        m.synthesizer = ExtractiveSynthesizer()
        s = m.consolidate()
        assert not s.errors and s.formed == 1 and s.kept == 0
    finally:
        m.close()


def test_export(mem, tmp_path):
    mem.remember("Backups are kept for 35 days.", skill="ops", metadata={"source": "policy"})
    mem.consolidate()
    res = mem.export()
    out = __import__("pathlib").Path(res["export_dir"])
    assert out.parent.name == "export" and res["count"] == 1 and res["documents"][0]["skill"] == "ops"
    files = list(out.glob("*.json"))
    assert len(files) == 1
    doc = json.loads(files[0].read_text())
    assert doc["skill"] == "ops" and doc["sources"][0]["metadata"] == {"source": "policy"}


def test_bad_input_is_typed(mem):
    with pytest.raises(eg.MemoryInputError, match="data is empty"):
        mem.remember("   ")
    with pytest.raises(eg.MemoryInputError, match="data"):
        mem.remember({"x": object()})
    with pytest.raises(eg.MemoryInputError, match="query"):
        mem.recall("")
    with pytest.raises(eg.MemoryInputError, match="top_k"):
        mem.recall("x", top_k=0)
    with pytest.raises(eg.MemoryInputError, match="method"):
        mem.consolidate(method="RANDOM")
    with pytest.raises(eg.MemoryInputError, match="num_records"):
        mem.consolidate(num_records=-3)
    deep: dict = {}
    at = deep
    for _ in range(5000):  # json.dumps would stop with a RecursionError
        at["a"] = at = {}
    looped: dict = {}
    looped["self"] = looped
    for call, where in [(lambda: mem.remember(deep), "remember: data.a.a"),
                        (lambda: mem.remember("x", metadata=deep), "remember: metadata.a.a"),
                        (lambda: mem.remember_many([{"data": looped}]), "remember: data.self.self")]:
        with pytest.raises(eg.MemoryInputError, match=f"^{re.escape(where)}.*nested deeper than 100 levels"):
            call()
    for call, message in [
        (lambda: mem.remember("bad \ud800 text"), "data is not Unicode text: a lone surrogate .* at character 4"),
        (lambda: mem.remember({"a": "\udfff"}), "data is not Unicode text"),
        (lambda: mem.remember("ok", metadata={"a": "\ud800"}), "metadata is not Unicode text"),
        (lambda: mem.remember("ok", skill="\ud800"), "skill is not Unicode text"),
        (lambda: mem.recall("where \ud800?"), "query is not Unicode text"),
        (lambda: mem.recall("x", where={"a": "\ud800"}), r"recall: where\['a'\] is not Unicode text"),
        (lambda: mem.find({"a": 10**30}), r"find: where\['a'\] is an integer past 64 bits"),
        (lambda: mem.remember("ok", skill="s" * 10_001), "skill is 10,001 characters long; at most 10,000"),
        (lambda: mem.recall("x", label="l" * 10_001), "label is 10,001 characters long"),
        (lambda: mem.remember("ok", ttl=float("inf")), "ttl must be a positive number of seconds up to 1e\\+15"),
        (lambda: mem.remember("ok", ttl=10**5000), "not an integer of 16610 bits"),
    ]:
        with pytest.raises(eg.MemoryInputError, match=message):
            call()
    assert mem.stats()["records"] == 0
    rid = mem.remember("Badges are printed at the front desk.")
    with pytest.raises(eg.MemoryInputError, match=r"^update: metadata\.a.*nested deeper"):
        mem.update(rid, "Badges are printed at the back desk.", metadata=deep)
    with pytest.raises(eg.MemoryInputError, match="^update: hint must be a number"):
        mem.update(rid, "Badges are printed at the back desk.", hint=7)
    mem.forget(rid)
    mem.remember("Badges are renewed every January.", skill="office")
    assert mem.recall("when are badges renewed", top_k=10**20)[0].content.startswith("Badges")
    assert mem.consolidate(num_records=10**20).formed == 1  # beyond SQL's 64-bit LIMIT: every row


def test_json_data_and_label_boost(mem):
    rid = mem.remember({"customer": "ACME", "plan": "enterprise"}, label="billing")
    other = mem.remember({"customer": "ACME", "plan": "enterprise", "seats": 40}, label="sales")
    hits = mem.recall("ACME plan", label="billing", top_k=2)
    assert hits[0].id == rid and other in {h.id for h in hits}


def test_ann_index_matches_exact(tmp_path, embedder):
    url = f"sqlite:///{tmp_path / 'ann.db'}"
    exact = Memory(url, embedder=embedder, synthesizer=ExtractiveSynthesizer())
    ann = Memory(url, embedder=embedder, synthesizer=ExtractiveSynthesizer(), ann_threshold=100)
    try:
        exact.remember_many([f"Sensor {i} in hall {i % 7} reported {i * 3} degrees." for i in range(150)])
        target = exact.remember("The cooling pump in the basement failed on Sunday.")
        q = "basement pump broke down"
        assert exact.recall(q, top_k=1)[0].id == ann.recall(q, top_k=1)[0].id == target
        assert ann.stats()["vector_search"] == "usearch"
    finally:
        exact.close()
        ann.close()


def test_default_instance_and_cli(tmp_path):
    rid = eg.memory.remember("The team lunch is on Fridays.", skill="team")
    assert eg.memory.recall("when is lunch?", skill="team")[0].id == rid
    url = os.environ["ENGRAIN_URL"]
    run = lambda *a: subprocess.run([ENGRAIN, "memory", *a, "--url", url], capture_output=True, text=True, timeout=120)
    r = run("remember", "Standup is at 9:30 every weekday.", "--skill", "team", "--meta", "source=handbook")
    assert r.returncode == 0, r.stderr
    r = run("recall", "what time is the daily standup", "--skill", "team", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["metadata"] == {"source": "handbook"}
    r = run("consolidate", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["formed"] >= 1
    r = run("stats", "--json")
    assert json.loads(r.stdout)["articles"] >= 1
    r = run("export")
    assert r.returncode == 0 and list(__import__("pathlib").Path(r.stdout.strip()).glob("*.json"))
    r = run("export", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["count"] >= 1
    r = run("consolidate", "--method", "SIDEWAYS")
    assert r.returncode == 2 and "method" in r.stderr


def test_commit_refuses_an_article_changed_meanwhile(mem):
    mem.remember("The release train leaves every second Wednesday.", skill="ops")
    mem.consolidate()
    art = mem.store.articles(skill="ops")[0]
    stale = {art.id: art.version - 1}  # as if another consolidator rewrote it after we read it
    with pytest.raises(eg.EngrainError, match="changed while this consolidation ran"):
        mem.store.commit("t", [], [art], [], {}, stale)
    assert mem.store.articles(skill="ops")[0].version == art.version


def test_llm_synthesizer_prompt_keeps_dates_and_sources(store_url, embedder, monkeypatch):
    from engrain._memory import synth

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert isinstance(synth.default_synthesizer(), synth.ExtractiveSynthesizer)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "not-used")
    assert synth.default_synthesizer().name.startswith("llm (anthropic:")
    llm = synth.LLMSynthesizer("openai", model="scripted")
    seen: list[tuple[str, str]] = []
    replies = iter(['{"title": "Deploys", "content": "Deploys are on Tuesdays (runbook)."}', "sorry, no JSON"])

    def scripted(system: str, user: str) -> str:  # a scripted stand-in for the API call, not a real LLM
        seen.append((system, user))
        return next(replies)

    llm._complete = scripted  # type: ignore[method-assign]
    m = Memory(store_url, embedder=embedder, synthesizer=llm)
    try:
        m.remember("Deploys happen on Tuesdays.", skill="ops", metadata={"source": "runbook"})
        s = m.consolidate()
        assert s.formed == 1 and s.synthesizer == "llm (openai:scripted)"
        system, user = seen[0]
        assert "date" in system and "attribute" in system and "[source: runbook]" in user
        assert time.strftime("[%Y-", time.gmtime()) in user
        assert m.store.articles()[0].content == "Deploys are on Tuesdays (runbook)."
        m.remember("Hotfixes may ship any day.", skill="ops")
        s = m.consolidate()
        assert s.errors and "no JSON" in s.errors[0] and s.kept == 1
    finally:
        m.close()


def test_expired_sources_leave_articles(mem):
    keep = mem.remember("Visitors sign in at the front desk on the ground floor.", skill="office")
    temp = mem.remember("This week visitors sign in at the side entrance instead of the front desk.", skill="office",
                        ttl=0.6)
    solo = mem.remember("The parking permit for the guest spot expires soon.", skill="parking", ttl=0.6)
    s = mem.consolidate()
    assert s.formed >= 2
    art = next(a for a in mem.store.articles(skill="office") if keep in a.sources)
    assert temp in art.sources and "side entrance" in art.content
    time.sleep(0.7)
    s = mem.consolidate()
    assert s.expired == 2 and s.removed == 1 and s.updated >= 1, s
    after = mem.store.articles(ids=[art.id])[0]
    assert after.sources == [keep] and "side entrance" not in after.content
    assert mem.store.articles(skill="parking") == [] and mem.store.records([solo, temp]) == {}
    assert mem.stats()["records"] == 1


def test_unscoped_memory_reconsolidates_only_its_own_articles(mem):
    mem.remember("The printer on floor two needs toner every month.")
    mem.remember("The printer on floor two needs toner every month.", skill="office")
    mem.consolidate()
    office = mem.store.articles(skill="office")[0]
    hits = mem.recall("printer toner", skill="")
    assert hits and all(h.skill is None for h in hits)
    mem.remember("Since June the floor two printer gets toner every two weeks.")
    s = mem.consolidate()
    assert s.reconsolidated == 1 and not s.errors
    assert mem.store.articles(skill="office")[0].content == office.content
    assert "two weeks" in mem.store.articles(skill="")[0].content


def test_store_refuses_a_different_embedder(store_url, embedder):
    Memory(store_url, embedder=embedder).close()

    class Other:
        name, dim = "other-model", 8

        def embed(self, texts):
            return np.ones((len(texts), 8), dtype=np.float32) / np.sqrt(8)

    with pytest.raises(eg.ConfigError, match="other-model"):
        Memory(store_url, embedder=Other())


def test_postgres_full_text_table_is_backfilled(store_url, embedder):
    """A store from before engrain_mem_text gets its full-text rows on open; idf ranking finds the rare word."""
    if store_url.startswith("sqlite"):
        pytest.skip("PostgreSQL's full-text side table")
    m = Memory(store_url, embedder=embedder, synthesizer=ExtractiveSynthesizer())
    rid = m.remember("The Zephyrine pump in hall 4 leaks oil.", skill="plant")
    m.remember("The pump in hall 2 was serviced.", skill="plant")
    m.store._db.execute("DELETE FROM engrain_mem_text")  # what an older store looks like
    m.close()
    with Memory(store_url, embedder=embedder, synthesizer=ExtractiveSynthesizer()) as m:
        hits = m.store.text_search("zephyrine pump", "plant", time.time(), 10)
        assert [h[1] for h in hits][0] == rid and len(hits) == 2 and hits[0][2] > hits[1][2]
        assert m.store._frequencies(["pump", "zephyrine"], 1000) == [("pump", 2), ("zephyrine", 1)]


def test_first_opens_at_once_bind_one_embedder_and_one_store_identity(tmp_path):
    """Several processes opening a new store at the same moment: none fails, and the store gets one
    embedder record and one identity (PostgreSQL: an advisory lock; SQLite: BEGIN IMMEDIATE)."""
    from engrain._memory.store import open_store

    urls = [f"sqlite:///{tmp_path / 'm.db'}"]
    pg = os.environ.get("ENGRAIN_TEST_PG_URL")
    if pg:
        import psycopg

        schema = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(pg, autocommit=True) as c:
            c.execute(f"CREATE SCHEMA {schema}")
        urls.append(f"{pg}?options=-csearch_path%3D{schema}")
    for url in urls:
        stores = [open_store(url) for _ in range(6)]  # the tables exist; nothing is bound yet
        barrier, errors = threading.Barrier(len(stores), timeout=60), []

        def bind(store) -> None:
            try:
                barrier.wait()
                store.bind_embedder("all-MiniLM-L6-v2-onnx-int8", 384)
            except Exception as e:  # noqa: BLE001 - collected for the assertion
                errors.append(e)

        threads = [threading.Thread(target=bind, args=(st,)) for st in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert errors == [], errors
        assert len({st.identity() for st in stores}) == 1
        assert stores[0]._x("SELECT count(*) FROM engrain_mem_state WHERE name LIKE ?", ("store:%",)).fetchone()[0] == 1
        for st in stores:
            st.close()
