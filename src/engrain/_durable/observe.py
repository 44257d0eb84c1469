"""Observers of durable runs: how exporters (OpenTelemetry) see runs and steps as they happen.

An observer gets ``run_started(ctx, task)``, ``step_ended(ctx, step, outcome)``
for each step executed or replayed, and ``run_ended(ctx, status, error)``.
With no observer registered, the runner pays one truthiness test per step.
Observers must not raise: an exception is swallowed so a broken exporter never
breaks a run.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(slots=True)
class StepView:
    """One step as observers see it: timings are wall-clock seconds."""

    call_id: int
    name: str
    type: str
    args: dict[str, Any]
    started: float
    ended: float
    key: str
    attempt: int = 1
    replayed: bool = False
    result: Any = None
    error_type: str | None = None
    message: str | None = None


class Observer(Protocol):
    def run_started(self, ctx: Any, task: str) -> None: ...
    def step_ended(self, ctx: Any, step: StepView) -> None: ...
    def run_ended(self, ctx: Any, status: str, error: str | None) -> None: ...


#: Registered observers; read without the lock on the hot path (a list swap is atomic).
observers: list[Observer] = []
_lock = threading.Lock()


def add(observer: Observer) -> None:
    """Register ``observer`` for every run of this process."""
    global observers
    with _lock:
        observers = [*observers, observer]


def remove(observer: Observer) -> None:
    """Unregister ``observer``."""
    global observers
    with _lock:
        observers = [o for o in observers if o is not observer]


def notify(method: str, *args: Any) -> None:
    """Call ``method`` on every observer, never letting one break the run."""
    for o in observers:
        try:
            getattr(o, method)(*args)
        except Exception:  # noqa: BLE001 - an exporter's failure is not the run's
            pass
