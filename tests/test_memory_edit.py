"""forget, update, metadata filters and transfer between agents (import_), through the API, the CLI and HTTP."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from engrain import MemoryInputError
from engrain._memory import Memory
from engrain._memory.synth import ExtractiveSynthesizer
from tests.test_memory import ENGRAIN, mem, store_url  # noqa: F401  (fixtures: every backend incl. pgvector)
from tests.test_memory_etchmem import EIFFEL


def test_forget_a_record_rewrites_its_article(mem):
    ids = [mem.remember(t) for t in EIFFEL]
    mem.consolidate()
    (art,) = mem.store.articles()
    out = mem.forget(ids[2])
    assert out == {"records": 1, "articles": 0, "rewritten": 1}
    (after,) = mem.store.articles()
    assert "visitors" not in after.content and after.version == art.version + 1 and ids[2] not in after.sources
    assert all("visitors" not in h.content for h in mem.recall("Eiffel Tower visitors per year", top_k=5))
    # The last sources gone: the article goes too.
    mem.forget(ids[0])
    assert mem.forget(ids[1]) == {"records": 1, "articles": 1, "rewritten": 0}
    assert mem.store.articles() == [] and mem.stats()["records"] == 0
    with pytest.raises(MemoryInputError, match="no record or article"):
        mem.forget(ids[0])
    with pytest.raises(MemoryInputError, match="exactly one"):
        mem.forget()


def test_forget_an_article_and_a_skill(mem):
    for t in EIFFEL:
        mem.remember(t, skill="paris")
    keep = mem.remember("Standup is at 9:30.", skill="team")
    pending = mem.remember("Another Paris fact: the Louvre is closed on Tuesdays.", skill="paris")
    mem.consolidate(method="FIFO", num_records=3)
    (art,) = mem.store.articles(skill="paris")
    assert mem.forget(art.id) == {"records": 3, "articles": 1, "rewritten": 0}
    assert mem.stats()["records"] == 2
    out = mem.forget(skill="paris")
    assert out["records"] == 1 and out["articles"] == 0
    assert [h.id for h in mem.recall("Louvre opening days")] == [keep]
    s = mem.consolidate()  # the forgotten deposit left nothing to process
    assert not s.errors and s.formed == 1 and pending not in {x for a in mem.store.articles() for x in a.sources}


def test_update_record_and_article(mem):
    ids = [mem.remember(t, metadata={"source": "guide"}) for t in EIFFEL]
    mem.consolidate()
    out = mem.update(ids[0], "The Eiffel Tower is 330 metres tall since a new antenna was added in 2022.", hint=0.8)
    assert out["tier"] == "record" and out["rewritten"] == 1
    rec = mem.store.records([ids[0]])[ids[0]]
    assert "2022" in rec.content and rec.importance == 0.8 and rec.metadata == {"source": "guide"}
    hit = mem.recall("when was the antenna added to the Eiffel Tower?")[0]
    assert hit.tier == "article" and "2022" in hit.content
    with pytest.raises(MemoryInputError, match="already holds"):
        mem.update(ids[1], EIFFEL[2])
    (art,) = mem.store.articles()
    out = mem.update(art.id, "Eiffel Tower: 330 m, 1889, 7 million visitors a year.")
    (after,) = mem.store.articles()
    assert out["version"] == art.version + 1 and after.content.startswith("Eiffel Tower: 330 m")
    assert mem.recall("Eiffel Tower facts")[0].content == after.content
    with pytest.raises(MemoryInputError, match="non-empty text"):
        mem.update(art.id, {"x": 1})


def test_where_filters_records_and_articles(mem):
    ann = [mem.remember(t, metadata={"user": "ann", "n": i}) for i, t in enumerate([
        "I prefer aisle seats on flights.", "My flight to Oslo leaves at 7 am on Friday."])]
    bob = mem.remember("My flight to Rome leaves at 9 am on Monday.", metadata={"user": "bob", "vip": True})
    hits = mem.recall("when does my flight leave?", where={"user": "ann"})
    assert {h.id for h in hits} == set(ann)
    assert [h.id for h in mem.recall("flight", where={"user": "bob", "vip": True})] == [bob]
    assert mem.recall("flight", where={"user": "bob", "vip": 1}) == []  # types must match: 1 is not true
    assert [h.id for h in mem.recall("seat preference", where={"n": 0})] == [ann[0]]
    mem.consolidate()
    arts = mem.recall("flight departure time", where={"user": "ann"})
    assert arts and all(
        all(mem.store.records([s])[s].metadata["user"] == "ann" for s in (h.provenance.get("sources") or [h.id]))
        for h in arts)
    for bad in ([("user", "ann")], {"user": {"$in": ["ann"]}}, {"": 1}, {f"k{i}": 1 for i in range(17)}):
        with pytest.raises(MemoryInputError, match="where"):
            mem.recall("x", where=bad)


def test_import_is_idempotent_and_keeps_provenance(mem, tmp_path, embedder):
    ids = [mem.remember(t, skill="paris", metadata={"source": "guide"}) for t in EIFFEL]
    mem.consolidate()
    exported = mem.export()
    with Memory(f"sqlite:///{tmp_path / 'other.db'}", embedder=embedder, synthesizer=ExtractiveSynthesizer()) as o:
        o.remember("The Eiffel Tower is 330 metres tall including its antenna.", skill="travel")
        first = o.import_(exported["export_dir"], skill_map={"paris": "travel"})
        assert (first["imported"], first["records"]) == (1, 2)  # one of the three facts it already knew
        assert o.import_(exported, skill_map={"paris": "travel"}) == {**first, "imported": 0, "unchanged": 1, "records": 0}
        (art,) = o.store.articles(skill="travel")
        prov = art.metadata["imported"]
        assert prov["from_id"] == exported["documents"][0]["id"] and prov["from_skill"] == "paris"
        assert prov["source_ids"] == ids and len(art.sources) == 3
        metas = sorted(json.dumps(r.metadata) for r in o.store.records(art.sources).values())
        assert metas == ['{"source": "guide"}', '{"source": "guide"}', "{}"]  # two new, and its own record
        assert o.stats()["buffer"] == 0 and o.consolidate().formed == 0  # imported knowledge is consolidated
        hit = o.recall("how many people visit the Eiffel Tower?", skill="travel")[0]
        assert hit.tier == "article" and hit.id == art.id
        # A later export of the rewritten article updates the import.
        mem.remember("The Eiffel Tower was repainted for the 2024 Olympics.", skill="paris")
        mem.consolidate()
        assert o.import_(mem.export(), skill_map="travel")["updated"] == 1
        assert "2024" in o.store.articles(skill="travel")[0].content
        with pytest.raises(MemoryInputError, match="not a folder"):
            o.import_(str(tmp_path / "nope"))
        bad = tmp_path / "bad"
        bad.mkdir()
        (bad / "x.json").write_text('{"id": "a", "content": 3}')
        with pytest.raises(MemoryInputError, match="'content'"):
            o.import_(bad)


def test_import_reads_an_etchmem_export(mem, tmp_path):
    folder = tmp_path / "etch"
    folder.mkdir()
    (folder / "k1.json").write_text(json.dumps({
        "id": "k1", "content": "The Eiffel Tower is 330 m tall, opened in 1889 and draws 7 million visitors a year.",
        "source_hashes": ["h1", "h2"], "skill": None, "tags": ["paris"], "metadata": {}, "created_at": 1.7e9}))
    out = mem.import_(folder)
    assert out["imported"] == 1 and out["records"] == 1
    assert mem.recall("Eiffel Tower height")[0].tier == "article"


def test_cli_forget_update_import_where(tmp_path, embedder):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    run = lambda *a: subprocess.run([ENGRAIN, "memory", *a, "--url", url], capture_output=True, text=True,
                                    timeout=120, env={**os.environ, "ENGRAIN_HOME": str(tmp_path)})
    r = run("remember", "Ann's flight to Oslo leaves at 7 am.", "--meta", "user=ann", "--hint", "0.9", "--json")
    assert r.returncode == 0, r.stderr
    ann = json.loads(r.stdout)["id"]
    bob = run("remember", "Bob's flight to Rome leaves at 9 am.", "--meta", "user=bob").stdout.strip()
    r = run("recall", "when does the flight leave", "--where", "user=ann", "--json")
    assert [h["id"] for h in json.loads(r.stdout)] == [ann]
    r = run("update", bob, "Bob's flight to Rome leaves at 10 am.", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["tier"] == "record"
    assert "10 am" in json.loads(run("recall", "Rome flight", "--json").stdout)[0]["content"]
    r = run("forget", bob, "--json")
    assert json.loads(r.stdout)["records"] == 1
    r = run("remember", "x", "--hint", "2")
    assert r.returncode != 0 and "hint" in r.stderr and "Traceback" not in r.stderr
    assert run("consolidate").returncode == 0
    folder = run("export").stdout.strip()
    other = f"sqlite:///{tmp_path / 'other.db'}"
    imp = lambda *a: subprocess.run([ENGRAIN, "memory", "import", folder, *a, "--url", other, "--json"],
                                    capture_output=True, text=True, timeout=120)
    r = imp("--skill-map", "travel")
    assert r.returncode == 0 and json.loads(r.stdout)["imported"] == 1, r.stderr
    assert json.loads(imp("--skill-map", "travel").stdout)["unchanged"] == 1
    r = run("forget", "--skill", "nothing-here", "--json")
    assert json.loads(r.stdout) == {"records": 0, "articles": 0, "rewritten": 0}
    assert run("forget").returncode == 2


def test_api_forget_update_import_where(tmp_path, embedder):
    from fastapi.testclient import TestClient

    from engrain._server.app import create_app

    with TestClient(create_app(f"sqlite:///{tmp_path / 'api.db'}"), base_url="http://127.0.0.1") as c:
        rem = lambda **b: c.post("/api/memory/remember", json=b).json()["id"]
        ann = rem(data="Ann's flight to Oslo leaves at 7 am.", metadata={"user": "ann"}, hint=0.9)
        bob = rem(data="Bob's flight to Rome leaves at 9 am.", metadata={"user": "bob"}, label="travel")
        hits = c.post("/api/memory/recall", json={"query": "when does the flight leave", "where": {"user": "ann"}}).json()
        assert [h["id"] for h in hits] == [ann]
        r = c.post("/api/memory/remember", json={"data": "x", "hint": 3})
        assert r.status_code == 422
        r = c.post("/api/memory/update", json={"id": bob, "data": "Bob's flight to Rome leaves at 10 am."})
        assert r.status_code == 200 and r.json()["tier"] == "record"
        assert c.post("/api/memory/forget", json={"id": bob}).json()["records"] == 1
        r = c.post("/api/memory/forget", json={"id": "rec_nope"})
        assert r.status_code == 404 and r.json()["error"] == "MemoryItemNotFound"  # an unknown id is not bad input
        c.post("/api/memory/consolidate", json={})
        exp = c.post("/api/memory/export").json()
        assert exp["count"] == 1
        # Another agent's server takes the documents inline; a folder outside its export root is refused.
        with TestClient(create_app(f"sqlite:///{tmp_path / 'b' / 'api.db'}"), base_url="http://127.0.0.1") as d:
            r = d.post("/api/memory/import", json={"documents": exp["documents"], "skill_map": "travel"})
            assert r.status_code == 200 and r.json()["imported"] == 1
            assert d.post("/api/memory/import", json={"documents": exp["documents"], "skill_map": "travel"}
                          ).json()["unchanged"] == 1
            r = d.post("/api/memory/import", json={"export_dir": "../../.."})
            assert r.status_code == 403 and "inside" in r.json()["detail"]  # a folder outside the export root
        r = c.post("/api/memory/import", json={"export_dir": Path(exp["export_dir"]).name})
        assert r.status_code == 200 and r.json()["unchanged"] + r.json()["imported"] == 1
