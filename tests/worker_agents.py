"""Scripted agents for tests/test_workers.py's worker processes (not real agents).

``AGENTS["steps"]`` runs ``inputs["steps"]`` tool steps; each appends
``KEY PID START END`` to ``$ENGRAIN_TEST_EFFECTS`` (O_APPEND, one write) so the
test can count executions per idempotency key and measure how many runs
executed at once. ``AGENTS["slow"]`` is one step of ``inputs["seconds"]``;
``AGENTS["nap"]`` sleeps ``inputs["seconds"]`` durably, then runs one step.
"""

from __future__ import annotations

import os
import time

import engrain as eg

_reg = eg.ToolRegistry()


@eg.tool(registry=_reg, name="work")
def work(n: int, pause: float) -> int:
    t0 = time.time()
    time.sleep(pause)
    fd = os.open(os.environ["ENGRAIN_TEST_EFFECTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{eg.idempotency_key()} {os.getpid()} {t0:.6f} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)
    return n + 1


def steps(task: str, steps: int = 5, pause: float = 0.01) -> int:
    return sum(work(n, pause) for n in range(steps))


def slow(task: str, seconds: float = 1.0) -> int:
    return work(0, seconds)


def nap(task: str, seconds: float = 1.0) -> int:
    eg.sleep(seconds)
    return work(0, 0.0)


AGENTS = {"steps": steps, "slow": slow, "nap": nap}
