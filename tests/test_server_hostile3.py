"""Values a store cannot keep or compare are bad input (4xx with ``{error, detail}``), never a 500.

* ``POST /api/memory/recall`` with ``where: {"k": 1e400}`` (JSON's parser reads it as infinity) went to
  PostgreSQL as ``Infinity``, which its JSON refuses: a 500. It is a 422 naming the field on every backend.
* A NUL character in a filter or an id (``GET /api/runs?tag=a%00``, ``DELETE /api/cache/entries/%00``,
  ``GET /api/learned/%00``, ``POST /api/memory/forget {"id": "a\\u0000"}``) reached psycopg, which refuses
  it in a text parameter: a 500 on PostgreSQL. It is a 422 there now.
* A client run's tag, event name or task holding a NUL: PostgreSQL cannot keep it in its text columns
  (a 500), and the journal now refuses it with a bare ``ValueError`` (a 500 on every backend). The
  append answers 422 naming the field.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from engrain._server import create_app

LOCAL = "http://127.0.0.1:8765"


def _client(url, tmp_path):
    # raise_server_exceptions=False: a 500 is what the old code answered; the test must see it as a response.
    return TestClient(create_app(url, routines_dir=tmp_path / "routines"), base_url=LOCAL,
                      raise_server_exceptions=False)


def _refused(r, status=422):
    assert r.status_code == status, (r.status_code, r.text)
    assert {"error", "detail"} <= set(r.json()), r.text


@pytest.mark.parametrize("number", [b"1e400", b"-1e400", b"Infinity", b"NaN"])
def test_recall_where_refuses_a_number_json_cannot_hold(store_url, tmp_path, number):
    with _client(store_url, tmp_path) as c:
        r = c.post("/api/memory/recall", content=b'{"query": "x", "where": {"k": %s}}' % number,
                   headers={"content-type": "application/json"})
        _refused(r)
        assert "where" in r.json()["detail"]


@pytest.mark.parametrize("event, field", [
    ({"kind": "run.started", "data": {"tags": ["a\x00b"]}}, "tags"),
    ({"kind": "run.started", "name": "a\x00b", "data": {}}, "name"),
    ({"kind": "run.started", "data": {"task": "a\x00b"}}, "task"),
], ids=["tag", "name", "task"])
def test_a_client_run_holding_a_nul_where_a_store_keeps_text_is_422(store_url, tmp_path, event, field):
    with _client(store_url, tmp_path) as c:
        r = c.post("/api/runs/nul/events", json={"events": [event], "expected_seq": 0})
        _refused(r)
        assert field in r.json()["detail"]
        assert c.get("/api/runs/nul").status_code == 404  # nothing was stored


def test_nul_in_filters_and_ids_is_never_a_500_on_postgres(pg_url, tmp_path):
    with _client(pg_url, tmp_path) as c:
        for method, path, body in [
            ("GET", "/api/runs?tag=a%00b", None),
            ("GET", "/api/runs?task=a%00b", None),
            ("GET", "/api/cache/entries?task=a%00b", None),
            ("GET", "/api/cache/savings?run_id=a%00b", None),
            ("DELETE", "/api/cache/entries/a%00b", None),
            ("GET", "/api/memory/articles?skill=a%00b", None),
            ("GET", "/api/learned?skill=a%00b", None),
            ("GET", "/api/learned/a%00b", None),
            ("DELETE", "/api/learned/a%00b", None),
            ("POST", "/api/memory/forget", {"id": "a\x00b"}),
            ("POST", "/api/memory/update", {"id": "a\x00b", "data": "x"}),
        ]:
            r = c.request(method, path, json=body)
            assert r.status_code < 500, (method, path, r.status_code, r.text)
            assert r.status_code < 400 or {"error", "detail"} <= set(r.json()), (method, path, r.text)
        assert c.get("/api/health").status_code == 200  # the store's connections are still usable
