"""muscle-mem's API on engrain: change ``muscle_mem`` to ``engrain.muscle_mem`` in the import and nothing else.

``from engrain.muscle_mem import Engine, Check`` (or ``import
engrain.muscle_mem as mm``) gives an :class:`Engine` with muscle-mem's
behaviour: it starts empty in a private store (``url=":memory:"``), files
trajectories by tags alone, caches runs with no tool call, refreshes
snapshots on a hit and is not journaled (``durability="off"``). Each of these
is an ordinary option of :class:`engrain.Engine`, so a program can move to
engrain's defaults (a shared persistent store, keys on task text and tags,
durable runs) one option at a time. What stays engrain's: ``params`` are bound
or pinned (a hit never replays an argument taken from another param value),
calls return an :class:`~engrain.Outcome` (truthy on a hit, like
muscle-mem's ``bool``), and snapshots are stored as JSON (bytes, numpy arrays
and registered codecs included, never pickle).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from ._cache.checks import Check
from ._cache.engine import Engine as _Engine
from ._cache.engine import Outcome
from ._events import is_json
from ._journal import Journal

__all__ = ["Check", "Engine"]


class Engine(_Engine):
    """:class:`engrain.Engine` with muscle-mem's defaults (see the module docstring)."""

    def __init__(
        self,
        journal: Journal | None = None,
        *,
        url: str | None = None,
        match: str = "tags",
        store_empty: bool = True,
        refresh_snapshots: bool = True,
        durability: str = "off",
        **options: Any,
    ):
        if journal is None and url is None:
            url = ":memory:"
        super().__init__(
            journal, url=url, match=match, store_empty=store_empty, refresh_snapshots=refresh_snapshots,
            durability=durability, **options,
        )

    def set_agent(self, agent: Callable[..., Any]) -> Engine:
        """The agent called on a miss. muscle-mem ignores what it returns: a result that is not JSON is dropped, not an error."""
        if callable(agent) and not inspect.iscoroutinefunction(agent):
            inner = agent

            @functools.wraps(inner)
            def agent(*args: Any, **kwargs: Any) -> Any:
                out = inner(*args, **kwargs)
                return out if is_json(out) else None

        super().set_agent(agent)
        return self

    def __call__(self, task: Any = "", *args: Any, tags: list[str] | None = None, params: dict[str, Any] | None = None, **kwargs: Any) -> Outcome:
        """Perform a task: ``agent(task, *args, **kwargs)`` on a miss. Finalizes the engine on first use, as muscle-mem does."""
        if not self._finalized:
            self.finalize()
        return super().__call__(task, *args, tags=tags, params=params, **kwargs)

    def enable_metrics(self) -> None:
        """Start timing lookups and checks (``engine.metrics``)."""
        self.metrics.enable()

    def disable_metrics(self) -> None:
        """Stop timing."""
        self.metrics.disable()

    def report_metrics(self) -> None:
        """Print the timers as JSON."""
        self.metrics.report()

    def reset_metrics(self) -> None:
        """Zero the timers."""
        self.metrics.reset()
