"""What a learned routine may hold once a human edits it: :func:`check_learned` and :func:`parse_edit`."""

from __future__ import annotations

from typing import Any

#: Step types a learned routine may hold: tool calls, sandboxed asserts and the return (no UDF, no prompt).
LEARNED_STEP_TYPES = ("tool.call", "assert", "return")
MAX_EDIT_CHARS = 256 * 1024


def check_learned(routine: Any, tools: set[str] | None = None) -> list[str]:
    """The problems of an edited learned routine (``routine.yaml`` data); empty when it may be saved.

    Besides the checks every routine package gets, a learned routine holds only
    tool calls (of ``tools``, when given), ``assert`` steps and its return:
    nothing an edit adds can run code outside the registered tools and the
    sandboxed expression evaluator.
    """
    import tempfile

    import yaml

    from .loader import validate_routine

    if not isinstance(routine, dict):
        return ["routine.yaml: must be a mapping"]
    problems = []
    steps = routine.get("steps")
    for i, st in enumerate(steps if isinstance(steps, list) else []):
        if not isinstance(st, dict):
            continue  # the package check below names it
        where = f"steps[{i}] ({st.get('id', '?')})"
        if st.get("type") not in LEARNED_STEP_TYPES:
            problems.append(f"{where}: type {st.get('type')!r}: a learned routine holds only {', '.join(LEARNED_STEP_TYPES)}")
        elif st.get("type") == "tool.call" and tools is not None and st.get("tool") not in tools:
            problems.append(f"{where}: tool {st.get('tool')!r} is not one of the routine's tools ({', '.join(sorted(tools))})")
    with tempfile.TemporaryDirectory(prefix="engrain-edit-") as d:
        with open(f"{d}/routine.yaml", "w", encoding="utf-8") as f:
            f.write(yaml.safe_dump(routine, sort_keys=False, allow_unicode=True))
        problems += [str(i) for i in validate_routine(d)]
    return problems


def parse_edit(text: str) -> Any:
    """The data of an edited ``routine.yaml`` text (safe loader, bounded size and depth); ``ValueError`` if bad."""
    from .._errors import RoutineError
    from .yamlfile import load_yaml_text

    if not isinstance(text, str) or len(text) > MAX_EDIT_CHARS:
        raise ValueError(f"routine.yaml: must be text of at most {MAX_EDIT_CHARS} characters")
    try:
        # The bounds of every routine file: a few hundred bytes of nested aliases expand to billions of nodes.
        return load_yaml_text(text, "routine.yaml")
    except RoutineError as e:
        raise ValueError("; ".join(map(str, e.issues))) from None
