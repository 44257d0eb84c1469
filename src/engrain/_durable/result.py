"""What :func:`engrain.run` returns: a run's outcome, its output or where and why it stopped."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._errors import RunFailedError


@dataclass(slots=True)
class RunResult:
    """The outcome of :func:`run`: truthy when the run completed.

    ``status`` is ``"ok"``, ``"failed"``, ``"needs_input"`` or ``"cancelled"``; ``replayed`` counts
    steps returned from the journal, ``executed`` steps actually called now. A
    failed run also says where and why, as em-core's failure report does:
    ``step_id`` (the routine step, when the failure is a step's), ``error_type``
    and ``message``; ``error`` keeps the whole ``"Type: message"`` string.
    """

    run_id: str
    status: str
    output: Any = None
    error: str | None = None
    prompt: dict[str, Any] | None = None
    replayed: int = 0
    executed: int = 0
    step_id: str | None = None
    error_type: str | None = None
    message: str | None = None

    def __bool__(self) -> bool:
        return self.status == "ok"

    def unwrap(self) -> Any:
        """The output, or :class:`~engrain.RunFailedError` if the run did not complete."""
        if self.status != "ok":
            raise RunFailedError(self.run_id, self.error or self.status)
        return self.output

    def to_dict(self) -> dict[str, Any]:
        """The result as a JSON-ready dict."""
        return {
            "run_id": self.run_id,
            "status": self.status,
            "output": self.output,
            "error": self.error,
            "prompt": self.prompt,
            "replayed": self.replayed,
            "executed": self.executed,
            "step_id": self.step_id,
            "error_type": self.error_type,
            "message": self.message,
        }
