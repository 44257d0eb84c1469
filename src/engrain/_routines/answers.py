"""Answers to ``prompt.user`` steps: one format for ``run`` and ``resume``, checked before use.

``answers`` is either ``{field: value}``, the answers to the current prompt (the
one a paused run waits at, or the first one a new run reaches), or ``{step_id:
{field: value}}``, answers to one or more prompts by step id, so a run does not
pause there. A mapping whose values are all objects is the second form, one
with no object value the first; anything else (a list, mixed values, an unknown
step id or field) is a :class:`~engrain.RoutineInputError`, never ignored.
Values are checked against the prompt's fields; numbers and booleans are parsed
from strings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .._errors import RoutineInputError

#: The documented shapes, quoted in errors.
SHAPES = "{field: value} for the current prompt, or {step_id: {field: value}} for one or more prompts"


@dataclass(slots=True)
class Answers:
    """Answers split by shape: ``current`` for the next prompt, ``by_step`` by prompt step id."""

    current: dict[str, Any] | None = None
    by_step: dict[str, dict[str, Any]] = field(default_factory=dict)

    def for_step(self, step_id: str) -> dict[str, Any] | None:
        """The answers given for ``step_id``; the current-prompt answers are used once, by the first prompt asking."""
        given = self.by_step.get(step_id)
        if given is None and self.current is not None:
            given, self.current = self.current, None
        return given


def parse_answers(answers: Any, prompts: dict[str, list[dict[str, Any]]], where: str = "answers") -> Answers:
    """Check the shape of ``answers`` against the routine's prompt steps (id -> declared fields)."""
    if answers is None:
        return Answers()
    if not isinstance(answers, dict):
        raise RoutineInputError(where, "(root)", f"must be a JSON object: {SHAPES}; got {type(answers).__name__}")
    nested = [k for k, v in answers.items() if isinstance(v, dict)]
    if nested and len(nested) != len(answers):
        flat = sorted(set(answers) - set(nested))
        raise RoutineInputError(
            where, "(root)", f"mixes step ids ({', '.join(map(str, nested))}) with field values ({', '.join(map(str, flat))}): {SHAPES}"
        )
    known = ", ".join(sorted(prompts)) or "none"
    if nested:
        for sid, given in answers.items():
            if sid not in prompts:
                raise RoutineInputError(where, str(sid), f"no prompt.user step with this id (prompt steps: {known})")
            _known_fields(given, prompts[sid], f"{where}.{sid}")
        return Answers(None, dict(answers))
    if answers and not prompts:
        raise RoutineInputError(where, "(root)", "the routine has no prompt.user step to answer")
    names = {f.get("name") for fields in prompts.values() for f in fields if isinstance(f, dict)}
    for extra in sorted(set(answers) - names, key=str):
        raise RoutineInputError(where, str(extra), f"no prompt has a field of this name (fields: {', '.join(sorted(map(str, names)))})")
    return Answers(dict(answers) if answers else None, {})


def _known_fields(given: dict[str, Any], fields: list[dict[str, Any]], where: str) -> None:
    names = {f.get("name") for f in fields if isinstance(f, dict)}
    for extra in sorted(set(given) - names, key=str):
        raise RoutineInputError(where, str(extra), f"no such field (fields: {', '.join(sorted(map(str, names)))})")


def _parse_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("true", "yes", "y", "1", "on"):
            return True
        if v in ("false", "no", "n", "0", "off"):
            return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    return None


def coerce_answers(fields: list[dict[str, Any]], answers: Any, where: str = "answers") -> dict[str, Any]:
    """Answers checked against the prompt's fields; numbers and booleans parsed from strings."""
    if not isinstance(answers, dict):
        raise RoutineInputError(where, "(root)", f"must be a JSON object, got {type(answers).__name__}")
    known = {f["name"] for f in fields}
    for extra in sorted(set(answers) - known):
        raise RoutineInputError(where, extra, f"no such field (fields: {', '.join(sorted(known))})")
    out: dict[str, Any] = {}
    for f in fields:
        name, ftype = f["name"], f.get("type", "text")
        if name in answers:
            value = answers[name]
        elif "default" in f:
            value = f["default"]
        elif f.get("required", True):
            raise RoutineInputError(where, name, "required (no default)")
        else:
            continue
        if ftype == "number":
            if isinstance(value, str):
                try:
                    value = int(value) if value.strip().lstrip("-").isdigit() else float(value)
                except ValueError:
                    raise RoutineInputError(where, name, f"{value!r} is not a number") from None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise RoutineInputError(where, name, f"{value!r} is not a number")
        elif ftype == "boolean":
            parsed = _parse_bool(value)
            if parsed is None:
                raise RoutineInputError(where, name, f"{value!r} is not a boolean (true/false)")
            value = parsed
        elif ftype == "select":
            options = f.get("options") or []
            if value not in options:
                raise RoutineInputError(where, name, f"{value!r} is not one of {options!r}")
        elif not isinstance(value, str):
            raise RoutineInputError(where, name, f"{value!r} is not text")
        out[name] = value
    return out
