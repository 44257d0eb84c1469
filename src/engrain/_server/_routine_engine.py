"""The server's bridge to the routine engine (``_routine``, ``_runner``, ``_compiler``).

Kept apart so the routes stay independent of the engine's module layout, and
so the server's safety rules live in one place: a routine run is only resumed
when its recorded folder is inside the server's routines dir, and tools always
come from the server's own registry, never from a module named in the journal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._events import Event


def validate(path: Path, tools: Any = None) -> list[dict[str, Any]]:
    """Issues of the routine at ``path`` as ``{severity, file, step, field, message}``."""
    from .._routines.loader import validate_routine

    return [{"severity": "error", **i.to_dict()} for i in validate_routine(path, tools)]


def run(path: Path, inputs: dict[str, Any] | None, journal: Any, run_id: str | None, tools: Any = None) -> dict[str, Any]:
    """Run the routine at ``path``; the RunResult as a dict."""
    from .._routines.runner import resolve_tools, run_routine

    return run_routine(path, inputs, tools=resolve_tools(tools), run_id=run_id, journal=journal).to_dict()


def routine_folder(events: list[Event]) -> Path | None:
    """The routine folder a run was started from, or None if it is not a routine run."""
    from .._events import CLIENT_TAG
    from .._routines.runner import ROUTINE_TAG

    if not events or events[0].kind != "run.started":
        return None
    started = events[0].data
    rec = started.get("inputs")
    tags = started.get("tags") or []
    if not isinstance(tags, list) or ROUTINE_TAG not in tags or CLIENT_TAG in tags or not isinstance(rec, dict):
        return None
    folder = rec.get("routine")
    return Path(folder) if isinstance(folder, str) else None


def resume(run_id: str, answers: dict[str, Any], journal: Any, tools: Any = None) -> dict[str, Any]:
    """Record ``answers`` (checked against the prompt's fields) and continue the routine run."""
    from .._routines.runner import resolve_tools, resume_routine

    return resume_routine(run_id, answers, tools=resolve_tools(tools), journal=journal).to_dict()


def loaded_inputs(path: Path) -> tuple[Any, str, list[str]]:
    """The routine's effective input schema (em-core's converted), its dialect and its conversions."""
    from .._routines.loader import load_routine

    r = load_routine(path)
    return r.inputs, r.dialect, list(r.conversions)


def _compile(trace: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    from .._routines.compiler import compile_trace

    try:
        done = compile_trace(trace, out)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as e:
        # The trace is the client's input: a malformed one is a 422, not a server error.
        from .state import ApiError

        raise ApiError(422, "TraceError", f"trace is malformed: {type(e).__name__}: {e}") from None
    return [r.to_dict() for r in done.report]


def preview(trace: dict[str, Any], tools: Any = None) -> dict[str, Any]:
    """Compile ``trace`` into a temporary folder and return what it would write, then delete it."""
    import json
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="engrain-preview-"))
    try:
        report = _compile(trace, tmp / "pkg")
        pkg = tmp / "pkg"
        udfs = pkg / "udfs.py"
        return {
            "yaml": (pkg / "routine.yaml").read_text(encoding="utf-8"),
            "udfs_py": udfs.read_text(encoding="utf-8") if udfs.exists() else None,
            "udfs": report,
            "input": json.loads((pkg / "input.json").read_text(encoding="utf-8")),
            "issues": validate(pkg, tools),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def compile_into(trace: dict[str, Any], path: Path, *, overwrite: bool = False) -> list[dict[str, Any]]:
    """Compile ``trace`` into a routine package at ``path``; the UDF report (see CompiledRoutine.report).

    The package is compiled into a hidden sibling folder and moved into place
    only once valid, so a failed compile never leaves a half-written routine and
    an overwrite never mixes old and new files.
    """
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix=f".compile-{path.name}-", dir=path.parent))
    try:
        report = _compile(trace, tmp / "pkg")
        if path.exists():
            if not overwrite:
                from .state import ApiError

                raise ApiError(409, "RoutineExistsError", f"routine {path.name!r} already exists (pass overwrite=true)")
            path.rename(tmp / "old")
        (tmp / "pkg").rename(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report
