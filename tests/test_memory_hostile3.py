"""Skill memory against a hostile tester: a consolidation racing an update or a forget, a re-import over knowledge
consolidated since, metadata whose keys are not text, an expired record's text remembered again, a Memory's own
arguments, and malformed or linked import folders (SQLite, real embedder)."""

from __future__ import annotations

import json
import os
import time

import pytest

from engrain import MemoryInputError
from engrain._memory import Memory
from engrain._memory.synth import ExtractiveSynthesizer


class _Midway(ExtractiveSynthesizer):
    """Runs ``then`` once, while a consolidation is synthesizing (after it read its records, before it commits)."""

    then = None

    def synthesize(self, skill, records, previous):
        out = super().synthesize(skill, records, previous)
        if self.then is not None:
            then, self.then = self.then, None
            then()
        return out


@pytest.fixture
def mk(tmp_path, embedder):
    made = []

    def make(name: str = "m", **kw) -> Memory:
        m = Memory(f"sqlite:///{tmp_path / name}.db", embedder=embedder, synthesizer=_Midway(), **kw)
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


def _everywhere(m: Memory, query: str) -> str:
    """Every text recall, the stored articles and an export can show."""
    return json.dumps([h.content for h in m.recall(query, top_k=10)] + [a.content for a in m.store.articles()]
                      + m.export()["documents"])


def test_a_record_updated_while_a_consolidation_runs_never_comes_back_in_its_article(mk):
    m, other = mk(), mk()  # other: another process on the same store
    rid = m.remember("The door code to the server room is 4471", skill="ops")
    m.synthesizer.then = lambda: other.update(rid, "The server room now opens with a badge reader")
    s = m.consolidate()
    assert s.errors and "updated" in s.errors[0] and s.formed == 0
    assert "4471" not in _everywhere(m, "server room door code")
    s = m.consolidate()  # the rows went back: the next pass consolidates the new text
    assert not s.errors and s.formed == 1
    assert "badge reader" in m.store.articles()[0].content and "4471" not in _everywhere(m, "server room door code")


def test_a_record_forgotten_while_a_consolidation_runs_is_reported_as_forgotten(mk):
    m, other = mk(), mk()
    rid = m.remember("The key of rack 7 is number 12", skill="dc")
    m.synthesizer.then = lambda: other.forget(rid)
    s = m.consolidate()
    assert s.errors and "forgotten" in s.errors[0]
    assert m.store.articles() == [] and "number 12" not in _everywhere(m, "rack 7 key")


def test_reimporting_an_export_never_hides_a_fact_consolidated_into_the_article_since(mk):
    a, b = mk("a"), mk("b")
    a.remember("The Eiffel Tower is 330 metres tall", skill="paris")
    a.remember("The Eiffel Tower was completed in 1889", skill="paris")
    a.consolidate()
    ex = a.export()
    b.import_(ex)
    local = b.remember("The Eiffel Tower gets about seven million visitors per year", skill="paris")
    b.consolidate()
    (art,) = b.store.articles()
    assert local in art.sources  # folded into the imported article
    b.import_(ex)  # the same export again: the article's text goes back to the export's
    hits = b.recall("How many visitors does the Eiffel Tower get per year?", top_k=5)
    assert any("seven million" in h.content for h in hits)
    b.consolidate()
    (art,) = b.store.articles()
    assert local in art.sources and "seven million" in art.content
    assert "seven million" in json.dumps(b.export()["documents"])


@pytest.mark.parametrize("metadata", [{1: "a", "1": "b"}, {"x": {True: 1}}, {"x": [{None: 2}]}])
def test_metadata_keys_that_are_not_text_are_refused(mk, metadata):
    m = mk()
    with pytest.raises(MemoryInputError, match="metadata key"):
        m.remember("a fact with odd metadata", metadata=metadata)
    rid = m.remember("a fact with odd metadata")
    with pytest.raises(MemoryInputError, match="metadata key"):
        m.update(rid, "a fact with odd metadata, updated", metadata=metadata)
    assert m.store.records([rid])[rid].metadata == {}


@pytest.mark.parametrize("kw", [{"half_life": 0}, {"half_life": -1.0}, {"half_life": float("nan")},
                                {"half_life": None}, {"top_k": 0}, {"top_k": "5"}, {"top_k": True}])
def test_a_memory_refuses_arguments_recall_could_not_use(mk, kw):
    with pytest.raises(MemoryInputError, match=next(iter(kw))):
        mk(**kw)


def test_an_import_folder_is_read_without_following_links_out_of_it(mk, tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"id": "s1", "skill": "x", "content": "The vault code is 9911"}))
    folder = tmp_path / "export"
    folder.mkdir()
    os.symlink(secret, folder / "doc.json")
    m = mk()
    with pytest.raises(MemoryInputError, match="symbolic link"):
        m.import_(str(folder))
    assert m.store.articles() == [] and m.stats()["records"] == 0


def test_an_import_folder_holding_a_fifo_is_not_waited_on(mk, tmp_path):
    import threading

    folder = tmp_path / "export"
    folder.mkdir()
    os.mkfifo(folder / "doc.json")  # opened for reading, it waits for a writer that never comes
    m = mk()
    out: list[BaseException | None] = []

    def go() -> None:
        try:
            m.import_(str(folder))
            out.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            out.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # unblock the reader so the thread can end, then fail
        with open(folder / "doc.json", "wb"):
            pass
        pytest.fail("import waited on a FIFO")
    assert out == [None] and m.store.articles() == [] and m.stats()["records"] == 0  # no document there


@pytest.mark.parametrize("source, field", [
    ({"documents": [{"id": "e1", "content": "etchmem text", "source_hashes": 5}]}, "source_hashes"),
    ({"documents": "not a list"}, "documents"),
])
def test_malformed_import_fields_are_typed_refusals_naming_them(mk, source, field):
    m = mk()
    with pytest.raises(MemoryInputError, match=field):
        m.import_(source)
    assert m.store.articles() == []


def test_remembering_an_expired_records_text_again_does_not_revive_its_metadata(mk):
    m = mk()
    old = m.remember("Temporary launch code is 12345", ttl=0.5, metadata={"owner": "ann"}, label="ann's", hint=0.9)
    time.sleep(0.7)
    assert m.recall("launch code", where={"owner": "ann"}) == []
    new = m.remember("Temporary launch code is 12345", metadata={"owner": "bob"})
    assert new == old  # stored once per skill, as for a live record
    assert [h.id for h in m.recall("launch code", where={"owner": "bob"})] == [new]
    assert m.recall("launch code", where={"owner": "ann"}) == [] and m.find({"owner": "ann"}) == []
    rec = m.store.records([new])[new]
    assert rec.expires is None and rec.hint == "" and rec.importance is None
    assert m.store.text_search("ann", None, time.time(), 10) == []  # the old label's full text is gone too


def test_a_record_remembered_again_while_a_consolidation_purges_it_is_kept(mk):
    """The pass lists expired records at its start and deleted them by seq at its commit: a remember of the
    same text in between renewed the record and returned its id, which the commit then deleted."""
    m, other = mk(), mk()
    old = m.remember("The staging database lives on host db-7", skill="ops", ttl=0.2)
    time.sleep(0.4)
    m.remember("Deploys go out on Tuesdays", skill="ops")  # something for the pass to synthesize
    renewed: list[str] = []
    m.synthesizer.then = lambda: renewed.append(other.remember("The staging database lives on host db-7", skill="ops"))
    s = m.consolidate()
    assert not s.errors and renewed == [old] and s.expired == 0
    assert old in other.store.records([old], vectors=False)
    assert "db-7" in json.dumps([h.content for h in other.recall("where does the staging database live", top_k=10)])
