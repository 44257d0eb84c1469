"""Trust in skill memory: forget reaches every article citing a record, expired knowledge stays expired through
recall, export and import, and hostile input to update and import_ is refused whole (SQLite, real embedder)."""

from __future__ import annotations

import json
import math
import time

import pytest
from fastapi.testclient import TestClient

from engrain import MemoryInputError
from engrain._memory import Memory
from engrain._memory.synth import ExtractiveSynthesizer
from engrain._server.app import create_app

SECRET = "The door code to the server room is 4471"


@pytest.fixture
def mk(tmp_path, embedder):
    made = []

    def make(name: str = "m") -> Memory:
        m = Memory(f"sqlite:///{tmp_path / name}.db", embedder=embedder, synthesizer=ExtractiveSynthesizer())
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


def _deep(n: int) -> dict:
    out: dict = {}
    cur = out
    for _ in range(n):
        cur["a"] = {}
        cur = cur["a"]
    return out


def _leaks(m: Memory, word: str) -> list[str]:
    """Where ``word`` can still be read: recall, the stored articles, an export."""
    found = [f"recall {h.tier}" for h in m.recall("server room door code", top_k=10) if word in h.content]
    found += [f"article {a.id}" for a in m.store.articles() if word in a.content]
    found += [f"export {d['id']}" for d in m.export()["documents"] if word in json.dumps(d)]
    return found


# -- M1: a record cited by several articles ----------------------------------------------------------------------


def test_forget_a_record_removes_every_article_citing_it(mk):
    a, b = mk("a"), mk("b")
    for m in (a, b):
        m.remember(SECRET, skill="ops")
        m.consolidate()
    a.import_(b.export())  # B's article states the fact A already holds: it cites A's record
    (rid,) = [r[0] for r in a.store._x("SELECT id FROM engrain_mem_records").fetchall()]
    assert sum(rid in art.sources for art in a.store.articles()) == 2
    out = a.forget(rid)
    assert out["records"] == 1 and out["articles"] == 2
    assert _leaks(a, "4471") == []


def test_forgetting_an_article_rewrites_the_others_citing_its_records(mk):
    m = mk()
    m.import_({"documents": [
        {"id": "A", "skill": "s", "title": "door", "content": "Server room door code is 4471.",
         "sources": [{"content": SECRET}]},
        {"id": "B", "skill": "s", "title": "codes", "content": "Codes: server room 4471, rack 7 key 12.",
         "sources": [{"content": SECRET}, {"content": "The key of rack 7 is number 12"}]},
    ]})
    first = next(x for x in m.store.articles() if x.title == "door")
    out = m.forget(first.id)
    assert out == {"records": 1, "articles": 1, "rewritten": 1}
    (left,) = m.store.articles()
    assert "4471" not in left.content and "rack 7" in left.content
    assert _leaks(m, "4471") == []


def test_updating_a_shared_record_rewrites_every_citing_article(mk):
    m = mk()
    m.import_({"documents": [
        {"id": "A", "skill": "s", "content": "Door code 4471.", "sources": [{"content": SECRET}]},
        {"id": "B", "skill": "s", "content": "Codes: 4471.", "sources": [{"content": SECRET}]},
    ]})
    (rid,) = [r[0] for r in m.store._x("SELECT id FROM engrain_mem_records").fetchall()]
    assert m.update(rid, "The door code to the server room is 9902")["rewritten"] == 2
    assert all("9902" in x.content and "4471" not in x.content for x in m.store.articles())


# -- M2: expiry through recall, export and import ----------------------------------------------------------------


def test_expired_knowledge_is_not_recalled_exported_or_revived(mk):
    m = mk()
    texts = ["The wifi password for the guest network is hunter2", "Guest wifi password: hunter2 (rotate monthly)",
             "Guest network wifi uses password hunter2"]
    for t in texts:
        m.remember(t, skill="net", ttl=1.0)
    keep = m.remember("The office wifi is called corp-5g", skill="net2", ttl=3600)
    m.consolidate()
    assert any(h.tier == "article" for h in m.recall("guest wifi password", skill="net"))
    time.sleep(1.3)
    assert [h for h in m.recall("guest wifi password", skill="net")] == []  # before any consolidation
    ex = m.export()
    assert "hunter2" not in json.dumps(ex["documents"])
    # Built from an export taken while they lived, an import keeps their lifetime (here: already passed).
    m2 = mk("m2")
    n = mk("n")
    for t in texts:
        m2.remember(t, skill="net", ttl=1.0)
    m2.consolidate()
    early = m2.export()
    assert all("expires" in s and s["expires"] is not None for d in early["documents"] for s in d["sources"])
    time.sleep(1.3)
    n.import_(early)
    assert n.recall("guest wifi password") == [] and n.stats()["records"] == 0
    # A live record's expiry round-trips.
    exp = m.store.records([keep])[keep].expires
    n.import_(m.export())
    (rec,) = n.store.records([r[0] for r in n.store._x("SELECT id FROM engrain_mem_records").fetchall()]).values()
    assert rec.expires == pytest.approx(exp)


def test_consolidation_rewrites_an_imported_article_citing_an_expired_record_homed_elsewhere(mk):
    """The record's home article is rewritten when it expires, and so is an imported one that only cites it."""
    a, b = mk("a"), mk("b")
    a.remember(SECRET, skill="ops", ttl=1.0)
    a.remember("The key of rack 7 is number 12", skill="ops")
    a.consolidate()
    b.remember(SECRET, skill="ops")
    b.remember("Badge readers on floor 2 were replaced", skill="ops")
    b.consolidate()
    a.import_(b.export())  # B's article cites A's record (same text), homed in A's own article
    (rid,) = [r[0] for r in a.store._x("SELECT id FROM engrain_mem_records WHERE content = ?", (SECRET,)).fetchall()]
    assert sum(rid in art.sources for art in a.store.articles()) == 2
    time.sleep(1.3)
    a.consolidate()
    assert not any(rid in art.sources for art in a.store.articles())  # no article keeps the expired record
    assert all("4471" not in art.content for art in a.store.articles())


def test_an_export_marks_an_expired_source_expired_without_its_text(mk):
    m = mk()
    m.remember("Rack 7 holds the build server", skill="dc")
    m.remember("The build server in rack 7 was set up by Erin", skill="dc", ttl=1.0)
    m.consolidate()
    time.sleep(1.3)
    (doc,) = m.export()["documents"]
    expired = [s for s in doc["sources"] if s.get("expired")]
    assert len(expired) == 1 and set(expired[0]) == {"id", "expired"}
    assert [s["content"] for s in doc["sources"] if not s.get("expired")] == ["Rack 7 holds the build server"]


# -- M3: Memory.update on an article ------------------------------------------------------------------------------


@pytest.fixture
def with_article(mk):
    m = mk()
    for t in ["Alice deploys on Fridays from the ops laptop", "Alice always deploys on Friday afternoons",
              "Deploys by Alice happen Fridays"]:
        m.remember(t, skill="ops")
    m.consolidate()
    (art,) = m.store.articles()
    return m, art


@pytest.mark.parametrize("kw, field", [
    ({"data": "x \ud800 y"}, "data"),
    ({"data": 5}, "data"),
    ({"data": "   "}, "data"),
    ({"data": "ok", "metadata": {"s": {1, 2}}}, "metadata"),
    ({"data": "ok", "metadata": {"n": math.nan}}, "metadata"),
    ({"data": "ok", "metadata": _deep(5000)}, "metadata"),
    ({"data": "ok", "metadata": {"k": "\udfff"}}, "metadata"),
    ({"data": "ok", "metadata": ["x"]}, "metadata"),
    ({"data": "ok", "label": "\ud800"}, "label"),
    ({"data": "ok", "label": "  "}, "label"),
    ({"data": "ok", "label": "x" * 10_001}, "label"),
])
def test_an_article_update_is_checked_as_remember_is(with_article, kw, field):
    m, art = with_article
    with pytest.raises(MemoryInputError, match=field):
        m.update(art.id, **kw)
    (after,) = m.store.articles()
    assert (after.version, after.content, after.metadata) == (art.version, art.content, art.metadata)
    assert m.export()["count"] == 1


def test_an_article_update_with_a_label_sets_its_title(with_article):
    m, art = with_article
    m.update(art.id, "Alice deploys on Fridays.", label="Release days")
    (after,) = m.store.articles()
    assert after.title == "Release days" and after.content == "Alice deploys on Fridays."
    hit = m.recall("deploys", label="Release days")[0]
    assert hit.id == art.id and hit.provenance["title"] == "Release days"


def test_a_failed_export_leaves_no_folder(with_article):
    m, art = with_article
    # A value stored before the checks existed (written past them here) cannot go into a UTF-8 file.
    m.store._x("UPDATE engrain_mem_articles SET metadata = ? WHERE id = ?", (json.dumps({"k": "\udfff"}), art.id))
    m.store._db.commit()
    with pytest.raises(Exception, match=art.id):
        m.export()
    root = m.export_dir()
    assert not root.exists() or list(root.iterdir()) == []


# -- M4: hostile import documents ---------------------------------------------------------------------------------


def _doc(**kw):
    d = {"format": "engrain.memory.article/1", "id": "art_x", "skill": "s", "title": "T",
         "content": "imported fact about zebras", "version": 1,
         "sources": [{"id": "r1", "content": "zebras have stripes", "created": 1.0}]}
    d.update(kw)
    return d


@pytest.mark.parametrize("bad, field", [
    ({"metadata": {"s": {1}}}, "metadata"),
    ({"metadata": _deep(3000)}, "metadata"),
    ({"metadata": {"n": math.nan}}, "metadata"),
    ({"metadata": "abc"}, "metadata"),
    ({"content": "bad \ud800"}, "content"),
    ({"title": "bad \ud800"}, "title"),
    ({"id": "\ud800"}, "id"),
    ({"sources": [{"content": "zebras \udfff"}]}, r"sources\[0\]"),
    ({"tags": {1, 2}}, "metadata"),
])
def test_a_hostile_document_is_refused_naming_it_and_nothing_is_imported(mk, bad, field):
    m = mk()
    good = _doc(id="fine", content="quokkas smile a lot", sources=[{"content": "quokkas smile"}])
    with pytest.raises(MemoryInputError, match=rf"documents\[1\].*{field}"):
        m.import_({"documents": [good, _doc(**bad)]})
    assert m.store.articles() == [] and m.stats()["records"] == 0


def test_imported_times_are_finite_and_the_export_is_json(mk):
    m = mk()
    m.import_({"documents": [_doc(id="a", created=math.inf, importance=1e400, version=2**80,
                                  sources=[{"content": "wombats dig", "created": math.inf}])]})
    (art,) = m.store.articles()
    assert math.isfinite(art.created) and art.importance is None
    json.loads(json.dumps(m.export()["documents"], allow_nan=False))


# -- M8: an etchmem export ----------------------------------------------------------------------------------------


def test_an_etchmem_export_keeps_its_created_at_and_tags(mk, tmp_path):
    folder = tmp_path / "etch"
    folder.mkdir()
    (folder / "abc.json").write_text(json.dumps({
        "id": "abc123", "content": "Refunds over 500 EUR need a finance manager's approval.",
        "source_hashes": ["h1", "h2"], "skill": "billing", "tags": ["refunds"], "metadata": {"k": "v"},
        "created_at": 1700000000.0}))
    m = mk()
    m.import_(folder)
    (art,) = m.store.articles()
    assert art.created == 1700000000.0 and art.metadata["imported"]["from_created"] == 1700000000.0
    assert art.metadata["tags"] == ["refunds"] and art.metadata["k"] == "v"


# -- over HTTP ----------------------------------------------------------------------------------------------------


@pytest.fixture
def client(tmp_path):
    app = create_app(f"sqlite:///{tmp_path / 'e.db'}", routines_dir=tmp_path / "routines")
    with TestClient(app, base_url="http://127.0.0.1") as c:
        yield c


def test_http_import_keeps_every_exported_field(client, mk):
    a = mk("a")
    for t in ["Erin's build server is in rack 7", "Rack 7 holds Erin's build server",
              "Erin keeps the build box in rack 7"]:
        a.remember(t, skill="infra", hint=0.9)
    a.consolidate()
    (art,) = a.store.articles()
    a.update(art.id, art.content, hint=0.9, metadata={"team": "infra", "reviewed": True})
    (doc,) = a.export()["documents"]
    r = client.post("/api/memory/import", json={"documents": [doc]})
    assert r.status_code == 200, r.text
    (got,) = client.get("/api/memory/articles", params={"skill": "infra"}).json()
    assert got["created"] == doc["created"] and got["metadata"]["team"] == "infra"
    prov = got["metadata"]["imported"]
    assert (prov["from_version"], prov["from_created"], prov["from_synthesizer"]) == (
        doc["version"], doc["created"], doc["synthesizer"])
    hit = next(h for h in client.post("/api/memory/recall", json={"query": "where is Erin's build server",
                                                                 "skill": "infra"}).json() if h["tier"] == "article")
    assert hit["provenance"]["importance"] == 0.9
    etch = {"id": "e1", "content": "Refunds need approval.", "created_at": 1.7e9, "tags": ["refunds"]}
    assert client.post("/api/memory/import", json={"documents": [etch]}).status_code == 200
    (e,) = client.get("/api/memory/articles", params={"skill": ""}).json()
    assert e["created"] == 1.7e9 and e["metadata"]["tags"] == ["refunds"]


def test_http_article_update_refuses_a_lone_surrogate_and_the_store_stays_readable(client):
    for t in ["Dana waters the office plants on Mondays", "The office plants are watered by Dana every Monday"]:
        client.post("/api/memory/remember", json={"data": t, "skill": "office"})
    aid = client.post("/api/memory/consolidate", json={}).json()["articles"][0]
    r = client.post("/api/memory/update", headers={"content-type": "application/json"},
                    content='{"id": "%s", "data": "Dana waters plants Mondays", "metadata": {"k": "\\udfff"}}' % aid)
    assert r.status_code == 422 and r.json()["error"] == "MemoryInputError" and "metadata" in r.text
    assert client.get("/api/memory/articles").status_code == 200
    assert client.post("/api/memory/recall", json={"query": "who waters the plants"}).status_code == 200
    assert client.post("/api/memory/export").status_code == 200


@pytest.mark.parametrize("call", ["content", "metadata value", "metadata key", "skill", "label"])
def test_a_nul_character_is_a_typed_refusal_on_every_backend(store_url, call):
    """PostgreSQL's text and jsonb cannot hold U+0000 (a raw psycopg error before): refused everywhere, alike."""
    m = Memory(store_url)
    try:
        args = {"content": (("a\x00b",), {}), "metadata value": (("x",), {"metadata": {"k": "v\x00"}}),
                "metadata key": (("x",), {"metadata": {"k\x00": 1}}), "skill": (("x",), {"skill": "s\x00"}),
                "label": (("x",), {"label": "l\x00"})}[call]
        with pytest.raises(MemoryInputError, match="NUL character"):
            m.remember(*args[0], **args[1])
        assert m.stats()["records"] == 0
        assert m.recall("a\x00b") == []  # a query is only read: no refusal, nothing matched
    finally:
        m.close()
