"""Where an engine call spends its time: ``engine.metrics`` (muscle-mem's surface).

Off by default; when off a measurement costs one attribute read. The tree of
timers has muscle-mem's shape: ``query`` (the lookup), ``filter`` (first-step
pre-checks at lookup: ``capture``, ``compare``) and ``runtime`` (during replay:
``precheck``/``postcheck`` each with ``capture`` and ``compare``).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Metrics"]


def _tree() -> dict[str, Any]:
    def t() -> dict[str, float]:
        return {"total_time": 0.0, "count": 0}

    return {
        "query": t(),
        "filter": {"capture": t(), "compare": t()},
        "runtime": {"precheck": {"capture": t(), "compare": t()}, "postcheck": {"capture": t(), "compare": t()}},
    }


def _fmt(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.4f}s"
    if seconds >= 0.001:
        return f"{seconds * 1e3:.4f}ms"
    return f"{seconds * 1e6:.4f}us"


class Metrics:
    """Timers of an engine's lookups and checks: ``enable()``, ``report()``, ``reset()``, ``data()``."""

    def __init__(self) -> None:
        self.enabled = False
        self.metrics = _tree()

    def enable(self) -> None:
        """Start timing."""
        self.enabled = True

    def disable(self) -> None:
        """Stop timing (what was measured stays)."""
        self.enabled = False

    def reset(self) -> None:
        """Zero every timer."""
        self.metrics = _tree()

    def add(self, path: tuple[str, ...], seconds: float) -> None:
        """Count one measurement of ``seconds`` under ``path`` (e.g. ``("runtime", "precheck", "capture")``)."""
        node = self.metrics
        for part in path:
            node = node[part]
        node["total_time"] += seconds
        node["count"] += 1

    def timed(self, path: tuple[str, ...], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, timed under ``path`` when enabled."""
        if not self.enabled:
            return fn(*args, **kwargs)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.add(path, time.perf_counter() - t0)

    def data(self) -> dict[str, Any]:
        """The timers with formatted totals and averages (a copy)."""
        out = copy.deepcopy(self.metrics)

        def walk(node: dict[str, Any]) -> None:
            for v in node.values():
                if isinstance(v, dict) and "count" in v:
                    raw = v["total_time"]
                    v["total_time"] = _fmt(raw)
                    if v["count"]:
                        v["avg_time"] = _fmt(raw / v["count"])
                elif isinstance(v, dict):
                    walk(v)

        walk(out)
        return out

    def report(self) -> None:
        """Print the timers as JSON (nothing when metrics are off, as in muscle-mem)."""
        if self.enabled:
            print(json.dumps(self.data(), indent=4))
