"""The SQLite journal's WAL checkpointer: a thread that copies committed WAL pages into the database file.

SQLite checkpoints inside the commit that pushes the WAL past
``wal_autocheckpoint`` pages (1000 by default), so every thousandth step of a
run paid for copying the pages back and for the checkpoint's fsyncs: about 5-8
µs per step on average, a fifth of a step's cost with ``durability="normal"``.
Here the writer's connection checkpoints only as a backstop (:data:`BACKSTOP_PAGES`)
and this thread, on its own connection, runs ``wal_checkpoint(PASSIVE)`` after
every :data:`EVERY_COMMITS` commits. A passive checkpoint never blocks a writer
or a reader, and SQLite releases the GIL while it works, so on a machine with
two cores the copy runs beside the run instead of inside one of its steps.

Only for ``durability="normal"``, whose commits write the WAL without an
fsync. With ``"full"`` every commit fsyncs the WAL, and a checkpoint's own fsyncs
on another thread made those commits wait longer than SQLite's checkpoint in one
commit of a thousand costs, so a ``full`` journal keeps SQLite's default.

Durability is unchanged: a commit is in the WAL before ``append`` returns,
whoever checkpoints it later. If the thread cannot keep up (a long reader pins
the WAL, or it died), the backstop still bounds the WAL's size.
"""

from __future__ import annotations

import sqlite3
import threading

#: Commits by this journal between two wake-ups of the checkpointer, about the
#: pages SQLite's own autocheckpoint waits for (a step's commit writes one page or a few).
EVERY_COMMITS = 1000
#: The writer connection's own ``wal_autocheckpoint``: reached only when the thread falls behind.
BACKSTOP_PAGES = 4000


def no_commit_count() -> None:
    """:meth:`Checkpointer.committed` for a store no checkpointer serves (in memory, or ``full`` durability)."""


class Checkpointer:
    """Checkpoints one SQLite file's WAL from a daemon thread, woken by :meth:`committed`."""

    def __init__(self, path: str, busy_timeout_ms: int = 1000) -> None:
        self._path = path
        self._busy_timeout_ms = busy_timeout_ms
        self._commits = 0
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.checkpoints = 0  # completed passes, for tests and diagnostics

    def committed(self, n: int = 1) -> None:
        """Count ``n`` commits; every :data:`EVERY_COMMITS` of them wake the thread (started on first need)."""
        self._commits += n
        if self._commits >= EVERY_COMMITS:
            self._commits = 0
            if self._thread is None:
                self._start()
            self._wake.set()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stop:
                self._thread = threading.Thread(target=self._loop, name="engrain-wal-checkpoint", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        try:
            db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error:
            return  # the writer's backstop checkpoints instead
        try:
            db.execute(f"PRAGMA busy_timeout={self._busy_timeout_ms}")
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stop:
                    return
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.checkpoints += 1
                except sqlite3.Error:
                    pass  # busy or I/O trouble: the next wake-up (or the writer's backstop) tries again
        finally:
            db.close()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (after any checkpoint in progress); closing the last connection checkpoints the rest."""
        with self._lock:
            self._stop = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout)
