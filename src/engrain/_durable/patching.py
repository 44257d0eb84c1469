"""Versioning a running agent's code: ``engrain.patched("change-name")``, Temporal/DBOS style.

A new run takes the new branch and journals a marker step (``engrain.patched``,
type ``patch``) at that position. A run recorded before the change has another
step (or nothing finished) there: it gets ``False`` and replays the old branch,
and the marker takes no position, so its recorded steps still line up. A run
whose journal cannot be replayed by the code (a patch's old branch removed
while such runs are in flight, or a marker where the code no longer asks)
raises :class:`~engrain.NondeterminismError` naming the patch.
"""

from __future__ import annotations

import re

from .._errors import EngrainError
from .context import _current

_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")


def patched(name: str) -> bool:
    """``True`` where the run should take the new code of change ``name``, ``False`` to replay the old branch.

    Outside a run, always ``True``. Deploying a change while runs are in
    flight: wrap the new code in ``if engrain.patched("name"):`` and keep the
    old code in the ``else`` until no run started before the deploy is left;
    then remove the old branch (keep the ``patched`` call while runs that took
    it may still resume).
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise EngrainError(f"patch name must be 1-200 letters, digits, '_', '.', ':' or '-', got {name!r}")
    ctx = _current.get()
    if ctx is None:
        return True
    rec = ctx.steps.get(ctx.cursor)
    if rec is not None and not (rec.type == "patch" and rec.args.get("name") == name):
        # Recorded before the change: something else happened here.
        if name not in ctx.unpatched:
            ctx.unpatched.append(name)
        return False
    return bool(ctx.call("engrain.patched", "patch", {"name": name}, lambda: True))
