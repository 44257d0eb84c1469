"""The errors a replay raises when the code calls another step than the journal recorded (``NondeterminismError``)."""

from __future__ import annotations

from typing import Any

from .._errors import NondeterminismError
from .steps import StepRecord


class Mismatches:
    """A run context's errors for a replayed step that differs from its record (mixed into ``RunContext``)."""

    run_id: str
    #: Patches this run started before (``engrain.patch``): it replays their old branch.
    unpatched: list[str]

    def _mismatch(self, call_id: int, rec: StepRecord, name: str) -> NondeterminismError:
        """The error for a step called where the journal recorded another, naming the patches involved."""
        recorded = f"patch {rec.args.get('name')!r}" if rec.type == "patch" else rec.name
        err = NondeterminismError(self.run_id, call_id, recorded, name)
        if self.unpatched:
            names = ", ".join(repr(p) for p in self.unpatched)
            err.args = (f"{err.args[0]}; this run started before patch {names} and replays the old branch: keep it"
                        " in the code until no such run is in flight",)
        return err

    def _args_mismatch(self, call_id: int, rec: StepRecord, args: dict[str, Any]) -> NondeterminismError:
        """The error for a step called with other arguments than the journal recorded for it."""
        return NondeterminismError(self.run_id, call_id, f"{rec.name}({_args_text(rec.args)})",
                                   f"{rec.name}({_args_text(args)})")


def _args_text(args: dict[str, Any], limit: int = 300) -> str:
    """``k=v, ...`` of a step's arguments for a message, cut to ``limit`` characters."""
    text = ", ".join(f"{k}={v!r}" for k, v in args.items())
    return text if len(text) <= limit else text[: limit - 3] + "..."
