"""Recovery of orphaned runs and how runs end (issue 12, items 1, 2 and 5), on SQLite and PostgreSQL.

A run records its agent's name; ``recover()`` resumes a run only with that agent,
never raises for one bad run, and a run that cannot finish (nondeterminism,
output that is not JSON) ends ``failed`` with its error and traceback journaled.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

import engrain as eg
from engrain import NewEvent
from engrain._events import FAILED, RUNNING

ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")

tools = eg.ToolRegistry()
crash = {"on": False}


@eg.tool(registry=tools)
def charge(amount: int) -> str:
    return f"charged {amount}"


@eg.tool(registry=tools)
def send(to: str) -> str:
    return f"sent to {to}"


def pay(task: str, amount: int) -> str:
    receipt = charge(amount)
    if crash["on"]:
        raise KeyboardInterrupt  # the process "dies" after the step was journaled
    return receipt


def email(task: str, to: str) -> str:
    sent = send(to)
    if crash["on"]:
        raise KeyboardInterrupt
    return sent


def crashed(journal, agent, run_id, inputs, **kw) -> None:
    """Leave ``run_id`` as a dead process does: ``running``, one step done, its lease gone."""
    crash["on"] = True
    try:
        with pytest.raises(KeyboardInterrupt):
            eg.run(agent, "task", run_id=run_id, inputs=inputs, journal=journal, **kw)
    finally:
        crash["on"] = False
    info = journal.get_run(run_id)
    assert info.status == RUNNING and info.lease_owner is None


def orphan(journal, run_id, started: dict, *steps: NewEvent) -> None:
    journal.append(run_id, [NewEvent("run.started", "", {"inputs": {}, "tags": [], **started}), *steps], 0)


# -- item 1: a run is resumed only by its own agent ------------------------------------------


def test_run_started_records_the_agent_name(journal):
    eg.run(pay, "task", run_id="p", inputs={"amount": 5}, journal=journal)
    eg.run(pay, "task", run_id="named", inputs={"amount": 5}, journal=journal, agent_name="pay")
    assert journal.read("p")[0].data["agent"] == f"{__name__}:pay" == eg.agent_name(pay)
    assert journal.get_run("p").agent == f"{__name__}:pay"
    assert journal.read("named")[0].data["agent"] == journal.get_run("named").agent == "pay"
    assert journal.get_run("named").to_dict()["agent"] == "pay"
    with pytest.raises(eg.ConfigError, match="agent_name must be a non-blank string"):
        eg.run(pay, "task", inputs={"amount": 5}, journal=journal, agent_name=" ")


def test_recover_resumes_only_the_runs_of_the_agent_it_is_given(journal):
    crashed(journal, pay, "pay-1", {"amount": 30})
    crashed(journal, email, "email-1", {"to": "ada@example.com"})
    before = len(journal.read("pay-1"))

    results = eg.recover(email, journal=journal)

    by_id = {r.run_id: r for r in results}
    assert set(by_id) == {"pay-1", "email-1"}
    assert by_id["email-1"].status == "ok" and by_id["email-1"].output == "sent to ada@example.com"
    assert by_id["email-1"].agent == eg.agent_name(email) and by_id["email-1"].replayed == 1
    # The pay run is listed, not touched: no lease taken, no event written, still resumable.
    skipped = by_id["pay-1"]
    assert skipped.status == "unmatched" and not skipped and skipped.agent == eg.agent_name(pay)
    assert eg.agent_name(pay) in skipped.error
    info = journal.get_run("pay-1")
    assert info.status == RUNNING and info.lease_owner is None and len(journal.read("pay-1")) == before
    # Its own agent resumes it later.
    (r,) = eg.recover(pay, journal=journal)
    assert r.run_id == "pay-1" and r.output == "charged 30" and r.replayed == 1 and r.executed == 0


def test_recover_takes_several_agents_by_their_recorded_names(journal):
    crashed(journal, pay, "pay-2", {"amount": 7}, agent_name="pay")
    crashed(journal, email, "email-2", {"to": "bob@example.com"}, agent_name="email")
    crashed(journal, email, "email-3", {"to": "eve@example.com"})  # named by module:qualname
    results = eg.recover({"pay": pay, "email": email}, journal=journal)
    assert {(r.run_id, r.status, r.output) for r in results} == {
        ("pay-2", "ok", "charged 7"),
        ("email-2", "ok", "sent to bob@example.com"),
        ("email-3", "unmatched", None),
    }


def test_claim_by_agent_leases_no_other_run(journal):
    orphan(journal, "a", {"task": "t", "agent": "pay"})
    orphan(journal, "b", {"task": "t", "agent": "email"})
    orphan(journal, "c", {"task": "t"})
    assert [r.run_id for r in journal.claim_runs("w1", ttl=60, agents=["email"])] == ["b"]
    assert journal.get_run("a").lease_owner is None and journal.get_run("c").lease_owner is None
    assert [r.run_id for r in journal.claim_runs("w1", ttl=60, agents=[None])] == ["c"]
    assert journal.claim_runs("w1", ttl=60, agents=[]) == []
    assert [r.run_id for r in journal.claim_runs("w1", ttl=60)] == ["a"]


def test_runs_recorded_without_an_agent_are_resumed_only_when_asked(journal):
    """Runs from before agent names were journaled are never handed to an agent by guess."""
    orphan(journal, "old", {"task": "t", "inputs": {"amount": 3}})
    (r,) = eg.recover(pay, journal=journal)
    assert r.run_id == "old" and r.status == "unmatched" and r.agent is None and "unnamed=" in r.error
    assert journal.get_run("old").status == RUNNING and journal.get_run("old").lease_owner is None
    (r,) = eg.recover({}, unnamed=pay, journal=journal)
    assert r.run_id == "old" and r.output == "charged 3"


def test_live_runs_of_other_agents_are_not_listed(journal):
    journal.append("live", [NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": [], "agent": "x"})], 0,
                   lease=("otherhost:1:alive", 60))
    assert eg.recover(pay, journal=journal) == []


def _drop_agent_column(store_url: str) -> None:
    """Make the store look like one written before runs recorded their agent (schema version 3)."""
    if store_url.startswith("sqlite"):
        db = sqlite3.connect(store_url.removeprefix("sqlite:///"))
        db.executescript("""
            DROP TRIGGER events_run_created;
            ALTER TABLE runs DROP COLUMN agent;
            CREATE TRIGGER events_run_created AFTER INSERT ON events WHEN NEW.seq = 0 BEGIN
                INSERT INTO runs (run_id, status, task, tags, created, updated) VALUES (
                    NEW.run_id, 'running',
                    CASE WHEN NEW.kind = 'run.started' THEN COALESCE(json_extract(NEW.data, '$.task'), '') ELSE '' END,
                    CASE WHEN NEW.kind = 'run.started' THEN COALESCE(json_extract(NEW.data, '$.tags'), '[]') ELSE '[]' END,
                    NEW.ts, NEW.ts);
            END;
            UPDATE engrain_meta SET value = '3' WHERE key = 'journal';
        """)
        db.close()
    else:
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as c:
            c.execute("ALTER TABLE engrain_runs DROP COLUMN agent")
            c.execute("UPDATE engrain_meta SET value = '3' WHERE key = 'journal'")


def test_an_older_store_gains_the_agent_column(store_url):
    j = eg.open(store_url)
    orphan(j, "old", {"task": "t"})
    j.close()
    _drop_agent_column(store_url)
    j = eg.open(store_url)
    try:
        assert j.get_run("old").agent is None
        crashed(j, pay, "new", {"amount": 1})
        assert j.get_run("new").agent == eg.agent_name(pay)
        assert {(r.run_id, r.status) for r in eg.recover(pay, journal=j)} == {("new", "ok"), ("old", "unmatched")}
    finally:
        j.close()


# -- item 2: a run that cannot finish ends failed; recover() goes on -------------------------


def test_nondeterminism_and_non_json_output_end_the_run_failed_and_recover_goes_on(journal):
    def agent(task: str, n: int):
        charge(n)
        return {1, 2} if n == 2 else n  # a set is not JSON

    name = eg.agent_name(agent)
    # Recorded step 0 is "send", but the agent now calls "charge": nondeterminism.
    orphan(journal, "nd", {"task": "t", "inputs": {"n": 1}, "agent": name},
           NewEvent("step.started", "send", {"call_id": 0, "type": "tool", "args": {"to": "x"}, "attempt": 1}),
           NewEvent("step.completed", "send", {"call_id": 0, "result": "sent"}))
    orphan(journal, "set", {"task": "t", "inputs": {"n": 2}, "agent": name})
    orphan(journal, "fine", {"task": "t", "inputs": {"n": 3}, "agent": name})

    results = eg.recover(agent, journal=journal)

    by_id = {r.run_id: r for r in results}
    assert {k: r.status for k, r in by_id.items()} == {"nd": "failed", "set": "failed", "fine": "ok"}
    assert by_id["nd"].error.startswith("NondeterminismError: ") and "'send'" in by_id["nd"].error
    assert by_id["set"].error.startswith("NotJSONError: ") and "output" in by_id["set"].error
    assert by_id["fine"].output == 3
    for run_id, error_type in (("nd", "NondeterminismError"), ("set", "NotJSONError")):
        assert journal.get_run(run_id).status == FAILED and journal.get_run(run_id).lease_owner is None
        last = journal.read(run_id)[-1]
        assert last.kind == "run.failed" and last.data["error_type"] == error_type and last.data["terminal"] is True
    # Nothing is left to retry forever.
    assert eg.recover(agent, journal=journal) == []


def test_non_json_output_fails_the_run_instead_of_raising(journal):
    res = eg.run(lambda task: object(), "t", run_id="obj", journal=journal)
    assert res.status == "failed" and "NotJSONError" in res.error
    assert journal.get_run("obj").status == FAILED
    with pytest.raises(eg.RunFailedError):
        res.unwrap()


def test_a_run_that_raises_while_resuming_is_reported_and_the_batch_goes_on(journal):
    """A conflicting write (another executor got in) is no failure of the run: it stays resumable, and is reported."""
    def agent(task: str, n: int):
        if n == 1:  # someone else appends to this run behind our back: our next append conflicts
            journal.append("clash", [NewEvent("step.started", "x", {"call_id": 9, "type": "tool", "args": {}})],
                           journal.next_seq("clash"))
        return charge(n)

    name = eg.agent_name(agent)
    orphan(journal, "clash", {"task": "t", "inputs": {"n": 1}, "agent": name})
    orphan(journal, "calm", {"task": "t", "inputs": {"n": 2}, "agent": name})
    by_id = {r.run_id: r for r in eg.recover(agent, journal=journal)}
    assert by_id["clash"].status == "error" and by_id["clash"].error.startswith("ConflictError")
    assert by_id["calm"].status == "ok" and by_id["calm"].output == "charged 2"
    info = journal.get_run("clash")
    assert info.status == RUNNING and info.lease_owner is None  # released for another worker


# -- item 5: the traceback of a failed run is journaled and shown ---------------------------


def deep_failure(task: str) -> None:
    charge(1)
    _inner_helper(task)


def _inner_helper(task: str) -> None:
    raise RuntimeError(f"gave up on {task}")


def test_a_failed_run_journals_its_traceback(journal):
    res = eg.run(deep_failure, "the job", run_id="tb", journal=journal)
    assert res.status == "failed" and res.error == "RuntimeError: gave up on the job"
    data = journal.read("tb")[-1].data
    tb = data["traceback"]
    assert tb.startswith("Traceback (most recent call last):")
    assert "in deep_failure" in tb and "in _inner_helper" in tb and 'raise RuntimeError(f"gave up on {task}")' in tb
    assert tb.rstrip().endswith("RuntimeError: gave up on the job")
    assert data["error_module"] == "builtins"


def test_a_huge_traceback_is_cut_to_its_end(journal):
    from engrain._durable.outcome import TRACEBACK_LIMIT

    def agent(task: str) -> None:
        raise ValueError("x" * 100_000 + " the end")

    eg.run(agent, "t", run_id="big", journal=journal)
    tb = journal.read("big")[-1].data["traceback"]
    assert len(tb) <= TRACEBACK_LIMIT + 40 and tb.startswith("[... ") and tb.rstrip().endswith(" the end")


def test_engrain_show_prints_the_traceback(store_url):
    j = eg.open(store_url)
    try:
        eg.run(deep_failure, "the job", run_id="tb", journal=j)
    finally:
        j.close()
    out = subprocess.run([ENGRAIN, "show", "tb", "--url", store_url], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    failed_at = next(i for i, line in enumerate(lines) if "run FAILED: RuntimeError: gave up on the job" in line)
    tail = lines[failed_at + 1:]
    assert tail[0].strip() == "Traceback (most recent call last):" and tail[0].startswith(" " * 14)
    assert any("in _inner_helper" in line for line in tail)
    assert tail[-1].strip() == "RuntimeError: gave up on the job"
