"""The PostgreSQL journal's own wait for a step's result (``postgres_wire``), on a real server.

A step's append is sent and its answer awaited with libpq's non-blocking calls and ``poll``
on the socket instead of psycopg's wait: Ctrl-C must still interrupt a step the server holds
(and leave the journal usable), and a connection the server drops must fail the step at once.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psycopg
import pytest

import engrain
from engrain import NewEvent, StorageError

STEP = {"call_id": 0, "result": 1, "type": "tool", "args": {"x": 0}, "started": 1.5}


def _run(url: str, run_id: str) -> engrain.Journal:
    j = engrain.open(url)
    j.append(run_id, [NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": []})], 0, lease=("me", 600))
    return j  # leased at epoch 1: its steps are fenced with 1, as a durable run's are


def _hold_run_row(url: str, run_id: str) -> psycopg.Connection:
    """Another session holding the run's row lock, so a step's statement waits on it."""
    blocker = psycopg.connect(url)
    # The server ends the blocker after 10 s idle, so a test that goes wrong fails instead of hanging.
    blocker.execute("SET idle_in_transaction_session_timeout = '10s'")
    blocker.execute("SELECT 1 FROM engrain_runs WHERE run_id = %s FOR UPDATE", (run_id,))
    return blocker


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals go to the main thread")
def test_ctrl_c_interrupts_a_step_the_server_holds_and_the_journal_stays_usable(pg_url):
    j = _run(pg_url, "r")
    blocker = _hold_run_row(pg_url, "r")
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    # Python raises KeyboardInterrupt on SIGINT only when it started with SIGINT at its default; a shell's
    # background job (CI's, say) starts with it ignored. Ctrl-C in a terminal is what this test stands for.
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        t0 = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            j.append_one("r", "step.completed", "inc", STEP, 1, fence=1, json_checked=True)
        took = time.monotonic() - t0
        assert took < 3.0, f"Ctrl-C took {took:.1f} s to interrupt a step waiting on the server"
        blocker.rollback()
        # The interrupted statement was cancelled: it wrote nothing, and the connection runs the next one.
        assert [e.seq for e in j.read("r")] == [0]
        j.append_one("r", "step.completed", "inc", STEP, 1, fence=1, json_checked=True)
        assert [(e.seq, e.data) for e in j.read("r")][1:] == [(1, STEP)]
        assert j.get_run("r").next_seq == 2
    finally:
        signal.signal(signal.SIGINT, saved)
        timer.cancel()
        blocker.close()
        j.close()


def test_a_step_whose_connection_the_server_drops_fails_at_once_as_a_storage_error(pg_url):
    j = _run(pg_url, "r")
    blocker = _hold_run_row(pg_url, "r")
    backend = j._db.pgconn.backend_pid
    killer = threading.Timer(0.5, lambda: psycopg.connect(pg_url, autocommit=True).execute(
        "SELECT pg_terminate_backend(%s)", (backend,)))
    try:
        t0 = time.monotonic()
        killer.start()
        with pytest.raises(StorageError):
            j.append_one("r", "step.completed", "inc", STEP, 1, fence=1, json_checked=True)
        assert time.monotonic() - t0 < 5.0
    finally:
        killer.cancel()
        blocker.close()
        j.close()
    j = engrain.open(pg_url)
    try:
        assert [e.seq for e in j.read("r")] == [0]  # the step died with its connection: nothing written
    finally:
        j.close()


def test_a_steps_binary_parameters_store_what_the_text_ones_did(pg_url):
    """seq, ts and the fence travel in binary; past int4 or given as a float they fall back to text."""
    j = _run(pg_url, "r")
    try:
        j.append_one("r", "step.completed", "inc", STEP, 1, fence=1, json_checked=True)
        j.append_one("r", "step.completed", "inc", {**STEP, "call_id": 1}, 2, fence=1.0, json_checked=True)
        j.append("r", [NewEvent("step.completed", "inc", {**STEP, "call_id": 2})], 3, fence=True)
        events = j.read("r")
        assert [e.seq for e in events] == [0, 1, 2, 3]
        assert all(type(e.ts) is float and events[0].ts <= e.ts <= time.time() for e in events)
        raw = j._db.execute("SELECT seq, ts FROM engrain_events WHERE run_id = 'r' ORDER BY seq").fetchall()
        assert [(s, t) for s, t in raw] == [(e.seq, e.ts) for e in events]
        with pytest.raises(ValueError, match="expected_seq"):  # past int4: refused before it is sent, on both stores
            j.append_one("r", "step.completed", "inc", STEP, 2**31, fence=1, json_checked=True)
        j.append_one("r", "step.completed", "inc", {**STEP, "call_id": 3}, 4, fence=1, json_checked=True)
        assert j.get_run("r").next_seq == 5
    finally:
        j.close()
