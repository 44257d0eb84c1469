"""The BaseExceptions that unwind an agent mid-run: cancelled elsewhere, parked by a long sleep, or waiting
for a human. BaseExceptions, so an agent's ``except Exception`` cannot swallow them."""

from __future__ import annotations

from typing import Any


class _Cancelled(BaseException):
    """Unwinds the agent of a run cancelled elsewhere (``run.cancelled`` took its next seq)."""


class _Park(BaseException):
    """Unwinds the agent of a run that sleeps past ``RunContext.park_after``: a worker claims it again at ``until``."""

    def __init__(self, until: float):
        self.until = until


class _Suspend(BaseException):
    """Unwinds the agent when it waits for human input.

    A BaseException so an agent's ``except Exception`` cannot swallow it.
    """

    def __init__(self, prompt: dict[str, Any]):
        self.prompt = prompt
