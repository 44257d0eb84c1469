"""What a surface answers for hostile input, and etchmem's names on recall and consolidate.

Client events with lone surrogates are the journal's typed 422, not a 500 from the run budget's byte count;
metadata filters find records by any key a record can hold, on both backends, as ``filters.matches`` says;
a body nested too deep for the JSON parser is the same 422 as one nested 101 deep; ``SearchResult.source``
and ``consolidate(None, None)`` are etchmem's.
"""

from __future__ import annotations

import json
import sqlite3

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engrain import MemoryInputError
from engrain._errors import JSONTooDeepError
from engrain._events import MAX_DEPTH, check_depth
from engrain._memory import Memory
from engrain._memory.filters import check_where, matches, sql
from engrain._memory.ranking import SearchResult
from engrain._memory.synth import ExtractiveSynthesizer
from engrain._server import create_app

LOCAL = "http://127.0.0.1:8765"
JSON = {"content-type": "application/json"}

#: Keys that are syntax in some JSON path grammar, need escaping in JSON text, or are not ASCII.
HOSTILE_KEYS = ['a"b', '"', 'a\\b', "\\", 'a\\"b', 'a]b', "a[0]", "[", "]", "$", "$.x", ".", "a.b", "a b", "a'b",
                "ünï", "😀", "tab\tkey", "nl\nkey", "\x01ctl", "\x7f", "a\\u0041", "'); DROP TABLE x; --", "%", "_",
                "*", "plain"]


@pytest.fixture
def client(store_url, tmp_path):
    app = create_app(store_url, routines_dir=tmp_path / "routines")
    # A 500 must show up as a status here, as a client would see it.
    with TestClient(app, base_url=LOCAL, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def sqlite_client(tmp_path):
    app = create_app(f"sqlite:///{tmp_path / 'srv.db'}", routines_dir=tmp_path / "routines")
    with TestClient(app, base_url=LOCAL, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def mem(store_url, embedder):
    m = Memory(store_url, embedder=embedder, synthesizer=ExtractiveSynthesizer())
    yield m
    m.close()


# -- client events with text that is not Unicode ---------------------------------------------------------------

@pytest.mark.parametrize("data", [b'{"\\udfff": 1}', b'{"v": "\\udfff"}', b'{"v": {"\\ud800x": ["\\udc00"]}}'])
def test_client_event_with_a_lone_surrogate_is_the_journals_422(client, data):
    start = {"kind": "run.started", "data": {"task": "t"}}
    assert client.post("/api/runs/r/events", json={"expected_seq": 0, "events": [start]}).status_code == 200
    body = b'{"expected_seq": 1, "events": [{"kind": "step.started", "name": "s", "data": ' + data + b"}]}"
    r = client.post("/api/runs/r/events", content=body, headers=JSON)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "NotJSONError" and "surrogate" in r.json()["detail"]
    # Nothing was stored or counted: the next append at seq 1 goes through.
    ok = {"kind": "step.started", "name": "s", "data": {"v": "fine"}}
    assert client.post("/api/runs/r/events", json={"expected_seq": 1, "events": [ok]}).status_code == 200
    assert [e["seq"] for e in client.get("/api/runs/r").json()["events"]] == [0, 1]


# -- metadata filters by any key --------------------------------------------------------------------------------

def test_find_and_recall_match_records_by_hostile_keys(mem):
    target = mem.remember("the record every hostile key points to", metadata={k: "v" for k in HOSTILE_KEYS})
    decoy = mem.remember("a record with the same keys and other values", metadata={k: "w" for k in HOSTILE_KEYS})
    for k in HOSTILE_KEYS:
        assert matches({k: "v"}, {k: "v"})
        assert [r.id for r in mem.find({k: "v"})] == [target], repr(k)
        assert [r.id for r in mem.find({k: "w"})] == [decoy], repr(k)
        assert mem.find({k: "x"}) == [], repr(k)
        assert [h.id for h in mem.recall("hostile key record", where={k: "v"})] == [target], repr(k)
    assert [r.id for r in mem.find({'a"b': "v", "a.b": "v", "$": "v"})] == [target]
    if mem.store.backend == "sqlite":  # a key compared through json_each still scans the covering index
        cond, params = sql("sqlite", {'a"b': "v", "plain": "v"})
        plan = " ".join(str(r[-1]) for r in mem.store._db.execute(
            f"EXPLAIN QUERY PLAN SELECT id FROM engrain_mem_records WHERE (expires IS NULL OR expires > 0){cond}", params))
        assert "COVERING INDEX engrain_mem_records_meta" in plan, plan


def test_filters_by_hostile_keys_compare_types_as_matches_does(mem):
    meta = {'a"b': 1, "x.y": True, "$": None, "a]b": 1.5, "😀": "1"}
    rid = mem.remember("typed values under hostile keys", metadata=meta)
    for where in [{'a"b': 1}, {'a"b': 1.0}, {'a"b': True}, {'a"b': "1"}, {"x.y": True}, {"x.y": 1}, {"$": None},
                  {"$": 0}, {"a]b": 1.5}, {"😀": "1"}, {"😀": 1}, {'a"b': 1, "x.y": True, "$": None}]:
        assert ([r.id for r in mem.find(where)] == [rid]) == matches(meta, where), where


@pytest.mark.parametrize("where", [{"k\x00": "v"}, {"k": "v\x00w"}, {"": 1}])
def test_filters_no_store_can_answer_are_refused_typed(where):
    with pytest.raises(MemoryInputError, match="where"):
        check_where(where, "find")


_KEY = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=12)
_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                   st.floats(allow_nan=False, allow_infinity=False), _KEY)


@pytest.fixture
def sql_backend(store_url):
    """``(backend, run)``: ``run(metadata_text, where)`` says whether filters.sql's condition keeps the row."""
    if store_url.startswith("sqlite"):
        db = sqlite3.connect(":memory:")

        def run(text, where):
            cond, params = sql("sqlite", where)
            return db.execute(f"SELECT 1 FROM (SELECT ? AS metadata) WHERE 1 = 1{cond}", (text, *params)).fetchone()

        yield run
        db.close()
        return
    import psycopg

    with psycopg.connect(store_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as db:
        def run(text, where):
            cond, params = sql("postgres", where)
            return db.execute(f"SELECT 1 FROM (SELECT %s::text AS metadata) m WHERE true{cond.replace('?', '%s')}",
                              (text, *params)).fetchone()

        yield run


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(meta=st.dictionaries(_KEY, _VALUE, min_size=1, max_size=5), data=st.data(), ascii_=st.booleans())
@example(meta={'a"b': "v"}, data=None, ascii_=True)
@example(meta={'\\"': 1, "a.b[0]": None}, data=None, ascii_=False)
def test_sql_filter_agrees_with_matches_for_any_key(sql_backend, meta, data, ascii_):
    if data is None:  # the explicit examples: every key with its own value
        where = dict(meta)
    else:
        keys = data.draw(st.lists(st.sampled_from(sorted(meta)), min_size=1, max_size=3, unique=True))
        where = {k: data.draw(st.one_of(st.just(meta[k]), _VALUE)) for k in keys}
        if data.draw(st.booleans()):
            where[data.draw(_KEY)] = data.draw(_VALUE)  # a key the record may not hold
    if isinstance(check_where(where), dict):  # the filter every caller passes on
        # Writers differ in escaping (export/import, update): the stored text must not decide the answer.
        text = json.dumps(meta, ensure_ascii=ascii_)
        assert bool(sql_backend(text, where)) == matches(meta, where), (meta, where)


# -- JSON bodies too deep for the parser ------------------------------------------------------------------------

def _deep_body(depth: int) -> str:
    return '{"data": "d", "metadata": ' + '{"a":' * depth + "1" + "}" * depth + "}"


def _expected_path(depth_body: str) -> str:
    """Where check_depth (Body's check of a parsed body) names a body first nested too deep."""
    with pytest.raises(JSONTooDeepError) as e:
        check_depth(json.loads(depth_body), "request body", "body", MAX_DEPTH)
    return e.value.path


@pytest.mark.parametrize("depth", [999, 1200, 20_000])
def test_body_too_deep_to_parse_is_the_422_of_a_deep_body(sqlite_client, depth):
    # The same first too-deep container as in the deeper bodies, in the same words.
    said = str(JSONTooDeepError("request body", _expected_path(_deep_body(200)), MAX_DEPTH))
    shallow = sqlite_client.post("/api/memory/remember", content=_deep_body(200), headers=JSON)
    r = sqlite_client.post("/api/memory/remember", content=_deep_body(depth), headers=JSON)
    assert shallow.status_code == r.status_code == 422, r.text
    assert r.json()["error"] == shallow.json()["error"] == "ValidationError"
    assert said in shallow.json()["detail"] and said in r.json()["detail"]
    assert r.json()["fields"] == [{"field": "body", "message": r.json()["detail"].removeprefix("body: ")}]


def test_bare_lists_too_deep_to_parse_name_their_index_path(sqlite_client):
    r = sqlite_client.post("/api/runs", content="[" * 100_000 + "]" * 100_000, headers=JSON)
    assert r.status_code == 422 and r.json()["error"] == "ValidationError", r.text
    assert str(JSONTooDeepError("request body", "body" + "[0]" * MAX_DEPTH, MAX_DEPTH)) in r.json()["detail"]
    raw = '{"routine": "x", "inputs": {"k\\"k": [1, ' + "[" * 5000 + "]" * 5000 + "]}}"
    r = sqlite_client.post("/api/runs", content=raw, headers=JSON)
    at = "body.inputs['k\"k'][1]" + "[0]" * (MAX_DEPTH - 3)
    assert r.status_code == 422 and str(JSONTooDeepError("request body", at, MAX_DEPTH)) in r.json()["detail"], r.text


def _first_too_deep(v: object, limit: int, at: str = "body", depth: int = 1) -> str | None:
    """The first container (in text order) nested deeper than ``limit``, named as check_depth names paths."""
    if not isinstance(v, (dict, list)):
        return None
    if depth > limit:
        return at
    items = ((f"{at}.{k}" if k.isidentifier() else f"{at}[{k!r}]", x) for k, x in v.items()) if isinstance(v, dict) \
        else ((f"{at}[{i}]", x) for i, x in enumerate(v))
    return next((found for p, x in items if (found := _first_too_deep(x, limit, p, depth + 1))), None)


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=4),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                     max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(value=_JSON, limit=st.integers(1, 5), ascii_=st.booleans())
@example(value={'a"]': [[1]], "b": {"[": {}}}, limit=2, ascii_=False)
def test_depth_scan_of_unparsed_text_names_what_a_walk_of_the_value_names(value, limit, ascii_):
    from engrain._server.errors import too_deep_at as _too_deep_at

    raw = json.dumps(value, ensure_ascii=ascii_).encode()
    assert _too_deep_at(raw, limit) == _first_too_deep(value, limit)
    try:
        check_depth(value, "request body", "body", limit)
        assert _too_deep_at(raw, limit) is None
    except JSONTooDeepError:
        assert _too_deep_at(raw, limit) is not None


def test_malformed_json_keeps_its_422(sqlite_client):
    for raw in ['{"data": ', "not json", '{"data": "x"']:
        r = sqlite_client.post("/api/memory/remember", content=raw, headers=JSON)
        assert r.status_code == 422 and "JSON decode error" in r.json()["detail"], r.text


# -- etchmem's SearchResult.source and consolidate(None, None) --------------------------------------------------

def test_search_result_source_follows_tier_and_matched_records():
    rec = SearchResult(0.5, "c", "record", "r1", None)
    art = SearchResult(0.5, "c", "article", "a1", None, {}, {"sources": ["r1"]})
    blended = SearchResult(0.5, "c", "article", "a2", None, {}, {"sources": ["r1"], "via": ["r1"]})
    assert (rec.source, art.source, blended.source) == ("relational", "injected", "blended")


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_recall_sources_and_consolidate_with_etchmems_defaults(mem):
    eiffel = ["The Eiffel Tower is 330 metres tall including its antenna.",
              "The Eiffel Tower was completed in 1889 and was meant to be temporary.",
              "The Eiffel Tower receives about 7 million visitors per year."]
    for text in eiffel:
        mem.remember(text, skill="paris")
    summary = mem.consolidate(num_records=None, method=None)
    assert summary["flushed"] == 3 and summary["formed"] == 1 and not summary["errors"]
    fresh = mem.remember("The Louvre pyramid was designed by I. M. Pei.", skill="paris")
    hits = mem.recall("How tall is the Eiffel Tower?", skill="paris", top_k=5)
    article = next(h for h in hits if h.tier == "article")
    assert article.source == ("blended" if article.provenance.get("via") else "injected")
    assert article.provenance.get("via"), "the article's own records matched the question"
    assert next(h for h in hits if h.id == fresh).source == "relational"
    for args in [{"num_records": None}, {"method": None}, {}]:
        assert mem.consolidate(**args)["flushed"] >= 0
    for bad in [{"num_records": 0}, {"num_records": "some"}, {"method": "random"}, {"method": ""}]:
        with pytest.raises(MemoryInputError):
            mem.consolidate(**bad)


def test_a_filter_with_a_nul_is_a_422_over_http(sqlite_client):
    r = sqlite_client.post("/api/memory/recall", json={"query": "x", "where": {"k": "v\x00"}})
    assert r.status_code == 422 and r.json()["error"] == "MemoryInputError" and "NUL" in r.json()["detail"], r.text
    assert sqlite_client.post("/api/memory/recall", json={"query": "x", "where": {'a"b': "v"}}).status_code == 200
