"""``engrain demo``: a guided tour on the embedded store, one module per part.

Part 1 durable runs (:mod:`.durable`), part 2 the behavior cache
(:mod:`.cache`), part 3 routines (:mod:`.routines`), part 4 skill memory
(:mod:`.memory`), part 5 the agent engine (:mod:`.agent`). Each part is a function ``(journal, workdir, out) -> ok``;
:data:`SECTIONS` names them in order and :func:`main` runs them. Parts are
imported when they run, so ``python -m engrain._demo.durable`` (the child
process of part 1) does not import the rest.

May import: anything below the surfaces (the pillars, and the public facade).
"""

from __future__ import annotations

import importlib
import pathlib
from collections.abc import Callable

#: The tour's parts, in order: (module, function).
SECTIONS: list[tuple[str, str]] = [
    (".durable", "durable_section"),
    (".cache", "cache_section"),
    (".routines", "routines_section"),
    (".memory", "memory_section"),
    (".agent", "agent_section"),
]


def main(url: str | None = None, out: Callable[[str], None] = print) -> int:
    """Run the tour; returns the process exit code (0 when every part behaved)."""
    from .._journal import open_journal

    workdir = pathlib.Path(".engrain") / "demo"
    workdir.mkdir(parents=True, exist_ok=True)
    if url is None:
        db = workdir / "demo.db"
        # The demo store is the demo's own, started afresh so its output reads the same every time.
        for suffix in ("", "-wal", "-shm"):
            pathlib.Path(f"{db}{suffix}").unlink(missing_ok=True)
        url = f"sqlite:///{db}"
    journal = open_journal(url)
    out(f"engrain demo — store {url}")
    out("")
    ok = True
    try:
        for module, fn in SECTIONS:
            section = getattr(importlib.import_module(module, __name__), fn)
            ok = section(journal, workdir, out) and ok
            out("")
        trip = journal.runs(task=_durable_task(), limit=1)
    finally:
        journal.close()
    out("demo finished" if ok else "demo finished with problems (see above)")
    routines = workdir / "routines"
    next_commands(url, trip[0].run_id if trip else None, routines if routines.is_dir() else None, out)
    return 0 if ok else 1


def _durable_task() -> str:
    from .durable import TASK

    return TASK


def next_commands(url: str, run_id: str | None, routines: pathlib.Path | None, out: Callable[[str], None]) -> None:
    """Where the demo's store is and commands to try on it, each working as printed (from this directory)."""
    import shlex

    flag = f" --url {shlex.quote(url)}"
    out("")
    out(f"The demo's runs, cache, routines and memory are in {url}. Try next:")
    out(f"  engrain runs{flag}")
    if run_id:
        out(f"  engrain show {run_id}{flag}   # the run killed with -9 and resumed")
    served = f" --routines {shlex.quote(str(routines))}" if routines else ""
    out(f"  engrain serve{flag}{served}   # then open http://127.0.0.1:8765 (the web UI)")
