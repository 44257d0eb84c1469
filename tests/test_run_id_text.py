"""Run ids the stores cannot keep are refused by name, as a typed error that is still a ValueError.

A NUL character is refused for a new run on every backend (PostgreSQL's text holds none, so a SQLite store
moved there could not keep the run), and looking one up is simply no run, never a storage error. A value that
is not JSON in a run's tags is named as the tags, not as its inputs.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

import engrain as eg
from engrain._server import create_app


def _agent(task: str) -> str:
    return task.upper()


@pytest.mark.parametrize("bad", ["a\x00b", "\x00", "", "x" * 201, "a\ud800"])
def test_a_run_id_no_store_can_keep_is_a_typed_error_and_writes_nothing(journal, bad):
    with pytest.raises(eg.RunIdError) as e:
        journal.append(bad, [eg.NewEvent("run.started", "", {"task": "t"})], 0)
    assert isinstance(e.value, ValueError) and isinstance(e.value, eg.ConfigError) and "run_id" in str(e.value)
    ran: list[str] = []
    if bad:  # eg.run with run_id="" makes a new id
        with pytest.raises(eg.RunIdError):
            eg.run(lambda t: ran.append(t), "t", run_id=bad, journal=journal)
    assert ran == [] and journal.runs(limit=10) == []


def test_looking_up_a_run_id_holding_nul_is_no_run(journal, store_url, tmp_path):
    assert eg.run(_agent, "t", run_id="a", journal=journal).output == "T"
    assert journal.get_run("a\x00b") is None and journal.read("a\x00b") == []
    assert set(journal.get_runs(["a", "a\x00b"])) == {"a"}
    with TestClient(create_app(store_url, routines_dir=tmp_path / "r"), base_url="http://127.0.0.1:8765") as c:
        r = c.get("/api/runs/a%00b")
    assert r.status_code == 404 and r.json()["error"] == "RunNotFoundError"


def test_a_tag_that_is_not_json_is_named_as_the_tags(journal):
    with pytest.raises(eg.NotJSONError, match="tags"):
        eg.run(_agent, "t", run_id="tagged", tags=["ok", b"bytes"], journal=journal)
    assert journal.get_run("tagged") is None


def test_a_task_or_tag_holding_nul_is_a_typed_refusal_and_a_422_over_http(journal):
    from engrain._server.errors import status_of

    for task, tags in (("a\x00b", None), ("t", ["ok", "x\x00"])):
        with pytest.raises(eg.TextNotStorableError) as e:
            eg.run(_agent, task, tags=tags, journal=journal)
        assert isinstance(e.value, ValueError) and "NUL" in str(e.value)
        assert status_of(e.value) == 422
    assert journal.runs(limit=10) == []
