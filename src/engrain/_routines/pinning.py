"""A routine run's files: their digests recorded when it starts, checked before it goes on.

A run goes on only with the files it started with (their SHA-256s, ``files`` in
``run.started``): its answers were given to the old prompts, so other steps would
act on approvals never given. A run recorded before the digests cannot be told
from a changed one, so it is refused too, with advice (``upgrade=True``).
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

from .. import _events as ev
from .._errors import AgentMismatchError, RoutineError
from .loader import PACKAGE_FILES, _mtimes, load_routine
from .model import Routine, RoutineIssue

#: Tag on every routine run; the run's recorded inputs name the routine folder.
ROUTINE_TAG = "routine"


def load_pinned(path: str | os.PathLike[str]) -> tuple[Routine, dict[str, str]]:
    """The routine at ``path`` and the SHA-256 of each file it was loaded from (absent ones left out)."""
    from .._disk_cache import digest

    root = pathlib.Path(path).absolute()
    for _ in range(3):
        stamp = _mtimes(root)  # the loader's cache key, unchanged around the read: the digests are of what loaded
        routine = load_routine(root)
        try:
            files = {n: digest((root / n).read_bytes()) for n, st in zip(PACKAGE_FILES, stamp) if st is not None}
        except OSError:
            continue  # removed or replaced under us: read again
        if _mtimes(root) == stamp:
            return routine, files
    raise RoutineError(str(root), [RoutineIssue(PACKAGE_FILES[0], None, "file", "kept changing while it was read; run it again")])


def refuse_changed(run_id: str, rec: dict[str, Any], files: dict[str, str]) -> None:
    """:class:`~engrain.AgentMismatchError` unless the run that recorded ``rec`` started with these ``files``."""
    folder, then = rec.get("routine"), rec.get("files")
    if not isinstance(then, dict):
        raise AgentMismatchError(run_id, (
            f"was started from routine folder {folder!r} before engrain recorded the digests of a routine's files, so"
            f" whether {', '.join(sorted(files))} changed since cannot be told: if they did not, resume it with"
            " upgrade=True; else start a new run"))
    changed = sorted(n for n in set(then) | set(files) if then.get(n) != files.get(n))
    if changed:
        raise AgentMismatchError(run_id, (
            f"was started from another version of routine folder {folder!r}: {', '.join(changed)} changed since the"
            " run started; restore the files as they were to resume it, start a new run, or resume with"
            " upgrade=True once this version replays the steps done so far"))


def check_resumable(j: Any, run_id: str, files: dict[str, str], inputs: dict[str, Any] | None = None,
                    upgrade: bool = False) -> dict[str, Any] | None:
    """Refuse to continue the unfinished routine run ``run_id`` with other files than it started with (unless
    ``upgrade``) or with other ``inputs`` (None: whatever it recorded); returns the inputs it recorded (None
    when ``run_id`` is no routine run yet)."""
    from .._durable.steps import same_json
    from .._errors import EngrainError
    from .._journal._common import check_run_id

    check_run_id(run_id)  # before the store reads it, as run() does
    first = j.read(run_id, limit=1)
    started = first[0].data if first and first[0].kind == ev.RUN_STARTED else {}
    tags, rec = started.get("tags") or [], started.get("inputs")
    if not isinstance(tags, list) or ROUTINE_TAG not in tags or not isinstance(rec, dict):
        return None  # a new run, or no routine's: run() refuses it as another task or agent
    info = j.get_run(run_id)
    if info is None or info.status not in (ev.OK, ev.FAILED, ev.CANCELLED):  # a finished one only reports its outcome
        if not upgrade:
            refuse_changed(run_id, rec, files)
        then = rec.get("inputs") if isinstance(rec.get("inputs"), dict) else {}
        # Its recorded steps (an approval among them) were taken for the recorded inputs, not for others.
        if inputs is not None and not same_json(then, inputs):
            raise EngrainError(f"run {run_id!r} was started with inputs {then!r}, not {inputs!r} (resume it with"
                               " the recorded inputs, or without inputs=)")
        return then
    return None
