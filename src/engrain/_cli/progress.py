"""The CLI's progress reporter: a rich bar or spinner on a terminal, status lines elsewhere.

Installed by :func:`engrain._cli.main` for every command; long work in the
pillars reports through :mod:`engrain._progress`. rich (typer's dependency)
loads only when a task actually starts, so quick commands pay nothing.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from .._progress import LineReporter, Reporter


class RichReporter:
    """One rich ``Progress`` on stderr while any task runs: a bar with a count when the total
    is known, a spinner otherwise; each finished task stays on screen with its time."""

    def __init__(self) -> None:
        self._progress: Any = None
        self._open: dict[Any, tuple[str, int | None]] = {}
        self._lock = threading.Lock()

    def start(self, what: str, total: int | None) -> Any:
        """Show a new task line."""
        with self._lock:
            if self._progress is None:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    SpinnerColumn,
                    TextColumn,
                    TimeElapsedColumn,
                )

                columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn()]
                self._progress = Progress(*columns, console=Console(stderr=True), transient=False)
                self._progress.start()
            handle = self._progress.add_task(what, total=total)
            self._open[handle] = (what, total)
            return handle

    def advance(self, handle: Any, n: int) -> None:
        """Move the task's bar."""
        self._progress.advance(handle, n)

    def stop(self, handle: Any, failed: bool) -> None:
        """Finish the task's line; close the display when no task is left."""
        with self._lock:
            what, total = self._open.pop(handle)
            if failed:
                self._progress.update(handle, description=f"{what} (stopped)")
            else:
                self._progress.update(handle, total=total or 1, completed=total or 1)
            if not self._open:
                self._progress.stop()
                self._progress = None


def reporter() -> Reporter:
    """The reporter for this process's stderr: rich on a terminal, plain lines otherwise."""
    return RichReporter() if sys.stderr.isatty() else LineReporter()
