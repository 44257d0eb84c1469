"""The surfaces tell the truth about errors and waiting (a second round of surface fixes).

* ``Client`` maps a server error to its local counterpart by the server's error name,
  not by the HTTP status: answering a finished run is a ``RunFinishedError`` (as
  ``engrain.answer`` raises), and no 409 but a lost append race is a ``ConflictError``
  (code retrying on it would loop forever).
* ``Client.wait_run`` waits out a queued run too; ``Client`` has ``cancel``, ``fork``
  and ``queues``, as the local API and the server do.
* A run id holding a lone surrogate is bad input on every read path, never a
  "corrupt store" (SQLite and PostgreSQL).
* A CLI command given ``--json`` prints its error as JSON on stdout as well; a
  ``--limit`` below 1 is refused (exit 2) instead of listing everything.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import engrain as eg
from engrain._journal import open_journal

sys.path.insert(0, str(Path(__file__).parent))
from servers import serve  # noqa: E402

ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")


_REG = eg.ToolRegistry()


@eg.tool(registry=_REG)
def _add_one(n: int) -> int:
    return n + 1


def _asks(task: str) -> str:
    return eg.ask("ok?")


def _two_steps(task: str) -> int:
    return _add_one(_add_one(0))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A real ``engrain serve`` (with --allow-fork) on a SQLite store holding: a finished run, a
    cancelled run that had asked a question, a waiting run and two queued runs; and its journal."""
    tmp = tmp_path_factory.mktemp("served")
    url = f"sqlite:///{tmp / 's.db'}"
    j = open_journal(url)
    assert eg.run(_two_steps, "t", run_id="done", journal=j).status == "ok"
    assert eg.run(_asks, "t", run_id="asked", journal=j).status == "needs_input"
    assert eg.cancel("asked", journal=j) is True
    assert eg.run(_asks, "t", run_id="waiting", journal=j).status == "needs_input"
    for rid in ("queued1", "queued2", "queued3"):
        eg.enqueue("no_such_agent", "t", run_id=rid, journal=j)  # no worker runs them: they stay queued
    with serve(url, tmp, token=None, allow_fork=True) as base, eg.Client(base) as c:
        yield c, j
    j.close()


# -- Client: typed errors by the server's error name ---------------------------------


def test_client_answer_to_a_cancelled_or_finished_run_is_a_run_finished_error_not_a_conflict(served):
    c, j = served
    with pytest.raises(eg.RunFinishedError) as local:
        eg.answer("asked", {"x": 1}, journal=j)
    for run_id, ended in (("asked", "cancelled"), ("done", "ok")):
        with pytest.raises(eg.RunFinishedError) as e:
            c.answer(run_id, {"x": 1})
        assert isinstance(e.value, eg.RemoteError) and not isinstance(e.value, eg.ConflictError)
        # .status stays the HTTP status every RemoteError carries; how the run ended is run_status.
        assert e.value.status == 409 and e.value.run_status == ended and e.value.run_id == run_id
    assert type(local.value) is eg.RunFinishedError


def test_client_409_that_is_no_append_race_is_not_a_conflict_error(served):
    c, _ = served
    with pytest.raises(eg.RemoteError) as e:
        c.answer("queued1", {"x": 1})  # not waiting for input, not finished: the local API's plain EngrainError
    assert e.value.status == 409 and e.value.error == "NotWaitingForInput"
    assert not isinstance(e.value, (eg.ConflictError, eg.RunFinishedError))


def test_client_lost_append_race_is_still_a_conflict_error(served):
    c, _ = served
    started = [{"kind": "run.started", "data": {"task": "mine"}}]
    c.append("client-run", started, 0)
    with pytest.raises(eg.ConflictError) as e:
        c.append("client-run", started, 0)  # a second writer creating the same run
    assert isinstance(e.value, eg.RemoteError) and e.value.status == 409 and e.value.error == "ConflictError"


# -- Client: wait_run, cancel, fork, queues -----------------------------------------


def test_client_wait_run_waits_while_a_run_is_queued(served):
    c, j = served
    t0 = time.monotonic()
    assert c.wait_run("queued2", timeout=0.6).status == "queued"  # the timeout, not at once
    assert time.monotonic() - t0 >= 0.5
    timer = threading.Timer(0.5, lambda: eg.cancel("queued3", journal=j))
    timer.start()
    try:
        t0 = time.monotonic()
        r = c.wait_run("queued3", timeout=20)
    finally:
        timer.join()
    assert r.status == "cancelled" and time.monotonic() - t0 >= 0.4


def test_client_cancel_fork_and_queues_mirror_the_local_api(served):
    c, j = served
    assert c.cancel("waiting", reason="not needed") is True
    assert c.cancel("waiting") is False  # already finished
    assert j.read("waiting")[-1].data == {"reason": "not needed"}
    with pytest.raises(eg.RunNotFoundError):
        c.cancel("nope")
    assert c.fork("done", 1, run_id="done-fork") == "done-fork"
    started = j.read("done-fork")[0].data
    assert started["forked_from"] == {"run_id": "done", "at_step": 1}
    fresh = c.fork("done", 0)  # an id the server chose
    assert isinstance(fresh, str) and fresh not in ("done", "done-fork") and j.get_run(fresh) is not None
    with pytest.raises(eg.RunNotFoundError):
        c.fork("nope", 0)
    view = c.queues()
    default = {q["name"]: q for q in view["queues"]}["default"]
    assert default["queued"] >= 1 and view["workers"] == []


# -- Journals: a lone surrogate in a run id is bad input, not a corrupt store ---------


def test_a_run_id_with_a_lone_surrogate_is_bad_input_on_every_read(journal):
    eg.run(lambda t: 1, "t", run_id="ok", journal=journal)
    bad = "\udcff"
    for read in (journal.read, journal.read_raw, journal.get_run, lambda i: journal.get_runs(["ok", i]),
                 lambda i: eg.cancel(i, journal=journal), lambda i: eg.fork(i, 0, journal=journal)):
        with pytest.raises(ValueError, match="lone surrogate") as e:
            read(bad)
        assert not isinstance(e.value, eg.StoreCorruptError)
    assert journal.get_run("ok") is not None and journal.read("") == [] and journal.get_run("x" * 300) is None


def test_cli_cancel_of_an_undecodable_run_id_exits_2_without_calling_the_store_corrupt(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    with open_journal(url) as j:
        eg.run(lambda t: 1, "t", run_id="ok", journal=j)
    r = subprocess.run([ENGRAIN.encode(), b"cancel", b"\xff", b"--url", url.encode()], capture_output=True, timeout=60)
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 2, err
    assert "corrupt" not in err and "lone surrogate" in err


# -- CLI: --json errors on stdout, --limit bounds ---------------------------------------


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([ENGRAIN, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_cli_json_errors_are_json_on_stdout_too(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    with open_journal(url) as j:
        eg.run(lambda t: 1, "t", run_id="ok", journal=j)
    cases = [
        (("cancel", "nope", "--url", url, "--json"), 2, "RunNotFoundError"),
        (("show", "nope", "--url", url, "--json"), 2, "RunNotFoundError"),
        (("runs", "--url", f"sqlite:///{tmp_path / 'missing.db'}", "--json"), 2, "StoreNotFoundError"),
        (("answer", "ok", "[1]", "--url", url, "--json"), 2, "UsageError"),  # fail() outside errors_as_exit
        (("run", str(tmp_path / "no-routine"), "--json"), 2, "UsageError"),  # the fast path
        (("runs", "--limit", "-5", "--url", url, "--json"), 2, "UsageError"),  # refused while parsing
    ]
    for args, code, error in cases:
        r = _cli(*args)
        assert r.returncode == code, (args, r.stdout, r.stderr)
        out = json.loads(r.stdout)
        assert out["error"] == error and out["detail"], (args, out)
        assert r.stderr.startswith("error: "), (args, r.stderr)  # the stderr line stays
    r = _cli("cancel", "nope", "--url", url)  # without --json: stdout stays empty
    assert r.returncode == 2 and r.stdout == "" and r.stderr.startswith("error: ")


@pytest.mark.parametrize("args", [("runs",), ("cache", "entries"), ("cache", "savings")])
def test_cli_limit_below_one_is_refused_not_unbounded(tmp_path, args):
    url = f"sqlite:///{tmp_path / 's.db'}"
    with open_journal(url) as j:
        for i in range(3):
            eg.run(lambda t: 1, "t", run_id=f"r{i}", journal=j)
    for limit in ("-5", "0"):
        r = _cli(*args, "--limit", limit, "--url", url, "--json")
        assert r.returncode == 2, (args, limit, r.stdout, r.stderr)
        assert "--limit" in r.stderr
    if args == ("runs",):
        r = _cli("runs", "--limit", "2", "--url", url, "--json")
        assert r.returncode == 0 and len(json.loads(r.stdout)) == 2
