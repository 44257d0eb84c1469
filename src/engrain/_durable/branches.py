"""Idempotency keys that name a step the same way on every execution of a run, concurrent branches included.

Step numbers (``call_id``) are given in the order calls begin, which concurrent
branches (threads, asyncio tasks) change from one execution to the next; a step
cut off by a crash leaves no record of its number, so a key ``run_id:N`` could
go on resume to another branch's call, and a service deduping by key would hand
that call the first one's effect. So a key never follows that order:

* a step of the run's own thread (or task), where calls follow program order, is
  ``run_id:P``: the P-th step that thread began. In a run without branches P is
  the step number, so such runs keep the keys they always had;
* a step of any other thread or task is ``run_id:name/digest/k``: its call (tool
  name and arguments) and how many identical calls this execution began before
  it. Only calls with the same name and arguments can trade keys when branches
  race, and those are the same call to the service that dedupes by key.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from .matching import args_digest

_get_ident = threading.get_ident
_running_loop = asyncio._get_running_loop
_current_task = asyncio.current_task


def _unit() -> tuple[int, Any]:
    """The thread and asyncio task the caller runs in: where calls follow program order."""
    loop = _running_loop()
    return _get_ident(), (None if loop is None else _current_task(loop))


class StepKeys:
    """The idempotency keys of one execution of a run (the caller holds the run's lock)."""

    __slots__ = ("run_id", "root", "position", "identical")

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.root = _unit()  # the run's own thread or task: built where the agent is called
        self.position = 0
        self.identical: dict[tuple[str, str, str], int] = {}

    def next(self, type_: str, name: str, args: Any) -> str:
        """The key of the call beginning now; every step a call takes, replayed or not, counts."""
        if _unit() == self.root:
            p = self.position
            self.position = p + 1
            return f"{self.run_id}:{p}"
        try:
            digest = args_digest(args)
        except (TypeError, ValueError):  # not JSON: the step fails before it runs
            digest = "-"
        sig = (type_, name, digest)
        k = self.identical.get(sig, 0)
        self.identical[sig] = k + 1
        return f"{self.run_id}:{name}/{digest}/{k}"
