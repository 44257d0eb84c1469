"""Crash test: a durable agent in a child process SIGKILLed at random points, then resumed.

For every run (on each backend): the child (``tests/crash_agent.py``) starts
the run and is killed after a random delay, one to three times, then a
finisher child resumes it to the end. Even steps journal only their completion;
odd steps are at-most-once (a durable start before the call). When a resumed
run pauses asking whether an at-most-once step happened, the test answers from
the side-effect file (``{"result": ...}`` if the effect is there, else
``{"retry": true}``), as an operator would from the payment provider's records,
and resumes it. The test then checks, from the journal and from the
side-effect file the tools append to:

- every run completed with the right output, and every step has its result;
- no event was lost: seqs are dense, each step has exactly one completion, the
  run ends with ``run.completed``; default steps journal no start, and an
  at-most-once step's starts all come before its completion;
- no completed step ran again: no side effect is later than its step's
  journaled completion, and a step's effect happens at most once per process;
- a default step running at a kill may run again, with the same idempotency
  key; an at-most-once step's effect happens exactly once, whatever the kills.

``ENGRAIN_CRASH_ITERATIONS`` (default 30) sets the number of runs per backend.
"""

from __future__ import annotations

import collections
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest

import engrain as eg
from engrain._durable.context import steps_of

AGENT = Path(__file__).with_name("crash_agent.py")
STEPS = 20
ITERATIONS = int(os.environ.get("ENGRAIN_CRASH_ITERATIONS", "30"))
LINE_TIMEOUT = 30.0  # seconds to wait for one line from a child: generous for a loaded CI machine


class Child:
    """One crash_agent.py process, spoken to line by line with deadlines."""

    def __init__(self, url: str, side: Path, log: Path):
        # stderr to a file (a pipe nobody reads could block the child); closed in close().
        self._log = open(log, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, str(AGENT), url, str(side), str(STEPS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
        )
        self._buf = b""
        self.log = log

    def send(self, run_id: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{run_id}\n".encode())
        self.proc.stdin.flush()

    def readline(self, timeout: float = LINE_TIMEOUT) -> str:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"crash agent silent for {timeout}s; stderr: {self.stderr()}")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError(f"crash agent exited ({self.proc.poll()}); stderr: {self.stderr()}")
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def stderr(self) -> str:
        self._log.flush()
        return self.log.read_text(errors="replace")[-2000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.close()

    def close(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


class _Tail:
    """New lines of the side-effect file, read incrementally."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = b""

    def pids(self) -> list[int]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")
        return [int(line.split()[2]) for line in lines]


def _wait_effects(child: Child, tail: _Tail, k: int, timeout: float = LINE_TIMEOUT) -> bool:
    """Wait until ``child`` performed ``k`` side effects, finished its run, or died; True if it is done."""
    assert child.proc.stdout is not None
    fd = child.proc.stdout.fileno()
    pid, done = child.proc.pid, 0
    deadline = time.monotonic() + timeout
    while done < k and time.monotonic() < deadline:
        done += sum(1 for p in tail.pids() if p == pid)
        if done >= k:
            return False
        if select.select([fd], [], [], 0.0003)[0]:
            return True
    return bool(select.select([fd], [], [], 0)[0])


def _expected(steps: int) -> dict:
    results = [n * n + 1 for n in range(steps)]
    return {"results": results, "sum": sum(results)}


def _run_to_end(child: Child, run_id: str, journal=None, side: Path | None = None, asked: list | None = None) -> dict:
    """Resume ``run_id`` in ``child`` until it ends, answering at-most-once questions from the side-effect file."""
    while True:
        child.send(run_id)
        assert child.readline() == f"go {run_id}"
        result = json.loads(child.readline())
        if result["status"] != "needs_input" or journal is None:
            return result
        prompt = result["prompt"]
        assert prompt.get("at_most_once") and "did this step happen?" in prompt["prompt"], prompt
        n = prompt["call_id"]
        assert n % 2 == 1, f"default step {n} asked a question"
        happened = f"{run_id}:{n}" in _side_effects(side)
        eg.answer(run_id, {"result": n * n + 1} if happened else {"retry": True}, journal=journal)
        if asked is not None:
            asked.append(happened)


def _side_effects(path: Path | None) -> dict[str, list[tuple[int, float]]]:
    """Idempotency key -> (pid, time) of each execution of that step's effect."""
    out: dict[str, list[tuple[int, float]]] = collections.defaultdict(list)
    if path is not None and path.exists():
        for line in path.read_text().splitlines():
            key, n, pid, t = line.split()
            assert key.endswith(f":{n}"), line
            out[key].append((int(pid), float(t)))
    return out


def _check_run(journal, run_id: str, effects: dict[str, list[tuple[int, float]]]) -> tuple[int, int]:
    """Assert the invariants for one run; return (repeated effects of default steps, at-most-once starts retried)."""
    events = journal.read(run_id)
    assert [e.seq for e in events] == list(range(len(events))), f"{run_id}: seq not dense"
    kinds = [e.kind for e in events]
    assert kinds[0] == "run.started" and kinds[-1] == "run.completed", f"{run_id}: {kinds[0]} .. {kinds[-1]}"
    assert kinds.count("run.completed") == 1 and "run.failed" not in kinds
    assert events[-1].data["output"] == _expected(STEPS)

    starts: dict[int, list[int]] = collections.defaultdict(list)  # call_id -> seqs of step.started
    completions: dict[int, list[int]] = collections.defaultdict(list)
    for e in events:
        if e.kind == "step.started":
            starts[e.data["call_id"]].append(e.seq)
        elif e.kind == "step.completed":
            completions[e.data["call_id"]].append(e.seq)
    assert sorted(completions) == list(range(STEPS))
    # Only at-most-once (odd) steps journal a start.
    assert sorted(starts) == [n for n in range(STEPS) if n % 2], f"{run_id}: starts of {sorted(starts)}"
    steps = steps_of(events)
    repeated = retried = 0
    for n in range(STEPS):
        assert steps[n].state == "completed" and steps[n].result == n * n + 1
        assert len(completions[n]) == 1, f"{run_id} step {n} completed {len(completions[n])} times"
        done_seq = completions[n][0]
        # Steps run in order: step n+1 begins only after step n completed.
        if n + 1 < STEPS:
            assert done_seq < min(starts.get(n + 1, completions[n + 1]))
        runs = effects.get(f"{run_id}:{n}", [])
        assert runs, f"{run_id} step {n}: no side effect although it completed"
        pids = [p for p, _ in runs]
        assert len(set(pids)) == len(pids), f"{run_id} step {n} executed twice in one process: {pids}"
        # A replayed (completed) step never runs again: no effect after its completion.
        assert max(t for _, t in runs) <= events[done_seq].ts, f"{run_id} step {n} ran after it completed"
        if n % 2:
            assert max(starts[n]) < done_seq, f"{run_id} step {n} started again after it completed"
            assert len(runs) == 1, f"{run_id} at-most-once step {n} happened {len(runs)} times"
            retried += len(starts[n]) - 1
        else:
            repeated += len(runs) - 1
    return repeated, retried


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume(store_url: str, tmp_path: Path) -> None:
    side = tmp_path / "side-effects.log"
    log = tmp_path / "agent-stderr.log"
    rng = random.Random()
    seed = rng.randrange(2**32)
    rng.seed(seed)
    journal = eg.open(store_url)
    finisher = Child(store_url, side, log)
    kills = in_flight = mid_run = 0
    asked: list[bool] = []  # per at-most-once question: did the effect happen?
    try:
        t0 = time.monotonic()
        warm = _run_to_end(finisher, "warmup", journal, side)
        span = time.monotonic() - t0
        assert warm["status"] == "ok" and warm["output"] == _expected(STEPS)
        run_ids = [f"crash-{i:03d}" for i in range(ITERATIONS)]
        tail = _Tail(side)
        for run_id in run_ids:
            for _ in range(rng.randint(1, 3)):
                child = Child(store_url, side, log)
                try:
                    child.send(run_id)
                    assert child.readline() == f"go {run_id}"
                    # Kill after the child performed a random number of effects (0: during
                    # start-up; STEPS: after the end), then a random fraction of a step more:
                    # timing by progress, not by the clock, keeps kills mid-run under load.
                    ended = _wait_effects(child, tail, rng.randint(0, STEPS))
                    time.sleep(rng.uniform(0, 0.003))
                    ended = ended or bool(select.select([child.proc.stdout], [], [], 0)[0])
                finally:
                    child.kill()
                kills += 1
                in_flight += not ended
            result = _run_to_end(finisher, run_id, journal, side, asked)
            assert result["status"] == "ok", result
            assert result["output"] == _expected(STEPS)
            if 0 < result["replayed"] < STEPS:  # killed after some steps completed, before the last
                mid_run += 1
        finisher.close()

        effects = _side_effects(side)
        retried = repeated = 0
        for run_id in ["warmup", *run_ids]:
            r, p = _check_run(journal, run_id, effects)
            repeated += r
            retried += p
        # Every effect belongs to a run of this test.
        assert set(effects) == {f"{r}:{n}" for r in ["warmup", *run_ids] for n in range(STEPS)}
        info = {
            "seed": seed,
            "runs": ITERATIONS,
            "kills": kills,
            "kills in flight": in_flight,
            "finisher resumed mid-run": mid_run,
            "default steps run again (same key)": repeated,
            "at-most-once questions": len(asked),
            "answered happened": sum(asked),
            "answered retry": len(asked) - sum(asked),
            "at-most-once starts retried": retried,
            "run span ms": round(span * 1000, 1),
        }
        print(f"\ncrash test on {journal.backend}: {info}")
        # The kills must have hit runs in flight (and some between a step's effect and its
        # journaled completion), or the test proved nothing. Too few runs to be sure below 10.
        if ITERATIONS >= 10:
            assert in_flight > kills // 4 and mid_run > 0 and repeated > 0 and asked, info
    finally:
        finisher.kill()
        journal.close()


_SEND_THEN_DIE = """
import os, signal, sys
import engrain as eg
from engrain import NewEvent

j, run_id = eg.open(sys.argv[1]), sys.argv[2]
j.append(run_id, [NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": []})], 0)
print("started", flush=True)
sys.stdin.readline()  # the test may lock the run first, so the append waits in the server
j.append(run_id, [NewEvent("step.completed", "tool", {"call_id": 0, "result": 7})], 1, durable=False, wait=False)
os.kill(os.getpid(), signal.SIGKILL)  # right after the send: the result is never read
"""


def test_an_append_sent_without_waiting_survives_a_sigkill_right_after(store_url: str) -> None:
    """Journal.append(wait=False) returns once the append is sent: the store commits it even though
    the process is SIGKILLed before reading the answer, and (PostgreSQL) even when the server only
    gets to execute it after the client is gone (a transaction holds the run's row meanwhile)."""
    postgres = not store_url.startswith("sqlite")
    for locked in (False, True) if postgres else (False,):
        _send_then_die(store_url, locked, f"sent-{int(locked)}")


def _send_then_die(store_url: str, locked: bool, run_id: str) -> None:
    child_url = store_url
    if locked:  # a session that checks for a gone client every 20 ms: the journal must turn that off
        child_url = store_url.replace("options=", "options=" + quote("-cclient_connection_check_interval=20 ", safe=""))
    proc = subprocess.Popen([sys.executable, "-c", _SEND_THEN_DIE, child_url, run_id], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    journal = eg.open(store_url)
    lock = None
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == b"started\n", proc.stderr.read() if proc.stderr else ""
        if locked:
            import psycopg

            lock = psycopg.connect(eg._journal.parse_url(store_url)[1])
            lock.execute("SELECT 1 FROM engrain_runs WHERE run_id = %s FOR UPDATE", (run_id,))
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert proc.wait(30) == -signal.SIGKILL
        if lock is not None:
            time.sleep(0.2)  # ten of the child session's client checks, were they on
            assert len(journal.read(run_id)) == 1  # the append still waits in the server for the lock
            lock.commit()
        deadline = time.monotonic() + 10
        while len(events := journal.read(run_id)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [(e.seq, e.kind, e.data) for e in events] == [
            (0, "run.started", {"task": "t", "inputs": {}, "tags": []}),
            (1, "step.completed", {"call_id": 0, "result": 7})]
    finally:
        if lock is not None:
            lock.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        journal.close()


_START_THEN_DIE = """
import os, signal, sys
import engrain as eg

def agent(task):
    if not os.environ.get("RESUMING"):
        os.kill(os.getpid(), signal.SIGKILL)  # before any step: only the unflushed run.started is written
    return "done"

res = eg.run(agent, "t", run_id=sys.argv[2], journal=eg.open(sys.argv[1]))
print(res.status, res.output)
"""


def test_a_run_killed_before_its_first_durable_append_is_resumable(store_url: str, tmp_path: Path) -> None:
    """run.started is committed without its own flush (the run's first durable append flushes it):
    a process killed right after it leaves the run journaled, running, and resumable to the end."""
    url = store_url
    if store_url.startswith("sqlite"):
        url = f"sqlite:///{tmp_path / 'full.db'}?durability=full"  # where an unflushed commit differs
    env = {**os.environ, "ENGRAIN_LEASE_TTL": "0.5"}  # the dead process's lease expires soon
    proc = subprocess.run([sys.executable, "-c", _START_THEN_DIE, url, "killed-early"], capture_output=True, timeout=60,
                          env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    journal = eg.open(url)
    try:
        info = journal.get_run("killed-early")
        assert info is not None and info.status == "running"
        assert [e.kind for e in journal.read("killed-early")] == ["run.started"]
        time.sleep(0.6)
        # The same program started again resumes it (only the code that started a run may).
        again = subprocess.run([sys.executable, "-c", _START_THEN_DIE, url, "killed-early"], capture_output=True,
                               text=True, timeout=60, env={**env, "RESUMING": "1"})
        assert again.returncode == 0 and again.stdout.split() == ["ok", "done"], again.stderr
    finally:
        journal.close()
