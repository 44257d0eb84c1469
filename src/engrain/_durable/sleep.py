"""Durable sleep: the wake-up time is journaled, so a restarted run sleeps only what is left.

``engrain.sleep(seconds)`` inside a run is a step (``engrain.sleep``, type
``sleep``) whose result is the wake-up time, computed once when the step first
runs. A run killed during a one-hour sleep and restarted 59 minutes later
replays that step and sleeps the one minute left. The clock is :data:`clock`,
replaceable in tests.

A worker does not hold a process for a long sleep: when the run context says
so (``RunContext.park_after``), a sleep longer than that unwinds the run as
parked until its wake-up time, and the worker claims it again when it is due.

A run cancelled while it sleeps (``engrain.cancel``) stops when the sleep ends,
or sooner: the wait looks at the run's status every ``CANCEL_POLL`` seconds,
and no step begins after the cancel.
"""

from __future__ import annotations

import datetime as _dt
import math
import time
from typing import Any

from .._errors import EngrainError
from .context import CANCEL_POLL, RunContext, _Cancelled, _current

#: Longest sleep accepted (seconds): ten years.
MAX_SLEEP = 10 * 365 * 86400.0


class Clock:
    """Wall-clock time and waiting; tests swap in a controllable one."""

    def now(self) -> float:
        """Seconds since the epoch."""
        return time.time()

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds``."""
        time.sleep(seconds)

    def wait(self, seconds: float, ctx: RunContext) -> None:
        """Block for ``seconds`` inside run ``ctx``, raising ``_Cancelled`` once the run is found cancelled.

        The real clock waits in stretches of at most ``CANCEL_POLL`` seconds, asking between them; a
        clock whose ``sleep`` is replaced (a test's) waits in that one call, and is asked after it.
        """
        if type(self).sleep is not Clock.sleep:
            self.sleep(seconds)
        else:
            end = time.monotonic() + seconds
            while (left := end - time.monotonic()) > CANCEL_POLL:
                time.sleep(CANCEL_POLL)
                if ctx.cancelled():
                    raise _Cancelled()
            if left > 0:
                time.sleep(left)
        # Asked once more at the end: the step after the sleep must not begin in a cancelled run.
        if ctx.cancelled():
            raise _Cancelled()


#: The clock durable sleeps read and wait on.
clock: Clock = Clock()


def _seconds(value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise EngrainError(f"engrain.sleep(seconds): seconds must be a finite number, got {value!r}")
    if not 0 <= value <= MAX_SLEEP:
        raise EngrainError(f"engrain.sleep(seconds): seconds must be from 0 to {MAX_SLEEP:.0f}, got {value!r}")
    return float(value)


def _wait_until(ctx: RunContext, until: float) -> None:
    left = until - clock.now()
    if left <= 0:
        return
    if ctx.park_after is not None and left > ctx.park_after:
        ctx.park(until)  # raises _Park, the run parked while its lease is still held
    clock.wait(left, ctx)


def sleep(seconds: float) -> None:
    """Sleep ``seconds``; inside a run, durably: the wake-up time is journaled and a resumed run sleeps what is left."""
    secs = _seconds(seconds)
    ctx = _current.get()
    if ctx is None:
        clock.sleep(secs)
        return
    until = ctx.call("engrain.sleep", "sleep", {"seconds": secs}, lambda: {"until": clock.now() + secs})["until"]
    _wait_until(ctx, until)


def sleep_until(when: _dt.datetime) -> None:
    """Sleep until ``when`` (a timezone-aware datetime); inside a run, durably, like :func:`sleep`."""
    if not isinstance(when, _dt.datetime) or when.tzinfo is None:
        raise EngrainError(f"engrain.sleep_until(when): when must be a timezone-aware datetime, got {when!r}")
    target = when.timestamp()
    ctx = _current.get()
    if ctx is None:
        left = target - clock.now()
        if left > 0:
            clock.sleep(left)
        return
    until = ctx.call("engrain.sleep", "sleep", {"until": when.isoformat()}, lambda: {"until": target})["until"]
    _wait_until(ctx, until)
