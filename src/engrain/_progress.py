"""Progress of long work (a one-time cache build, a model load, a batch), shown only when asked.

Code that may take seconds wraps the work in :func:`task`; nothing is shown
unless a reporter is installed. The CLI installs one (a rich progress bar on a
terminal, plain status lines elsewhere: ``_cli/progress.py``); the Python API
stays quiet unless ``ENGRAIN_PROGRESS=1`` is set, which prints status lines to
stderr.

    with task("embedding records", total=len(texts)) as advance:
        for batch in batches:
            ...
            advance(len(batch))

May import: the standard library only (every layer uses it).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol


class Reporter(Protocol):
    """Shows tasks: ``start`` returns a handle that ``advance`` and ``stop`` take."""

    def start(self, what: str, total: int | None) -> Any: ...

    def advance(self, handle: Any, n: int) -> None: ...

    def stop(self, handle: Any, failed: bool) -> None: ...


_reporter: Reporter | None = None


def set_reporter(reporter: Reporter | None) -> None:
    """Install ``reporter`` for this process (None: quiet again)."""
    global _reporter
    _reporter = reporter


def _current() -> Reporter | None:
    global _reporter
    if _reporter is None and os.environ.get("ENGRAIN_PROGRESS", "").lower() in ("1", "true", "yes"):
        _reporter = LineReporter()
    return _reporter


def _nothing(n: int = 1) -> None:
    pass


@contextmanager
def quiet() -> Iterator[Callable[[int], None]]:
    """What :func:`task` yields when nothing is shown, for work too small to report."""
    yield _nothing


def _after() -> float:
    try:
        return max(0.0, float(os.environ.get("ENGRAIN_PROGRESS_AFTER", "0.5")))
    except ValueError:
        return 0.5


@contextmanager
def task(what: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
    """Report ``what`` while the block runs; yields ``advance(n=1)`` for work counted toward ``total``.

    Only work still running after half a second is shown (``ENGRAIN_PROGRESS_AFTER``
    seconds), so quick runs of the same code print nothing.
    """
    r = _current()
    if r is None:
        yield _nothing
        return
    lock = threading.Lock()
    state: dict[str, Any] = {"handle": None, "done": 0, "over": False}

    def show() -> None:
        with lock:
            if state["over"]:
                return
            state["handle"] = r.start(what, total)
            if state["done"]:
                r.advance(state["handle"], state["done"])

    def advance(n: int = 1) -> None:
        with lock:
            if state["handle"] is None:
                state["done"] += n
            else:
                r.advance(state["handle"], n)

    delay = _after()
    timer = threading.Timer(delay, show) if delay else None
    if timer is None:
        show()
    else:
        timer.daemon = True
        timer.start()
    failed = True
    try:
        yield advance
        failed = False
    finally:
        if timer is not None:
            timer.cancel()
        with lock:
            state["over"] = True
            if state["handle"] is not None:
                r.stop(state["handle"], failed)


class LineReporter:
    """Plain status lines on a stream (stderr): one when a task starts, one when it ends,
    and the count every few seconds in between (for logs and pipes, where a bar cannot redraw)."""

    def __init__(self, stream: Any = None, every: float = 5.0):
        self.stream, self.every = stream, every
        self._lock = threading.Lock()

    def _write(self, text: str) -> None:
        stream = self.stream or sys.stderr
        with self._lock:
            stream.write(text + "\n")
            stream.flush()

    def start(self, what: str, total: int | None) -> Any:
        """Say the task began."""
        self._write(f"{what}{f' ({total})' if total is not None else ''}...")
        return {"what": what, "total": total, "done": 0, "t0": time.monotonic(), "shown": time.monotonic()}

    def advance(self, handle: Any, n: int) -> None:
        """Count ``n`` more; a line every ``every`` seconds."""
        handle["done"] += n
        now = time.monotonic()
        if now - handle["shown"] >= self.every:
            handle["shown"] = now
            self._write(f"{handle['what']}: {handle['done']}/{handle['total'] if handle['total'] is not None else '?'}")

    def stop(self, handle: Any, failed: bool) -> None:
        """Say how it ended and how long it took."""
        took = time.monotonic() - handle["t0"]
        self._write(f"{handle['what']}: {'stopped' if failed else 'done'} in {took:.1f} s")
