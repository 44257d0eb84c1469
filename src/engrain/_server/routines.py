"""``/api/routines``: list, show, validate, run and compile routine packages.

Routines are folders under the server's routines dir. Names are validated and
every path is checked to stay inside that root. Validation, running and
compiling use the routine engine (``engrain._routines``); until it is
installed those routes answer 501.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi import Path as PathParam
from pydantic import Field

from .state import ApiError, Body, ServerState, state_of

router = APIRouter(tags=["routines"])

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: A routine name in a path: the document states the rule, so a name outside it is a 422 before any lookup.
RoutineName = Annotated[str, PathParam(pattern=NAME.pattern, description="Routine name (a folder under the routines dir).")]
ROUTINE_FILE = "routine.yaml"
#: Modules the routine engine needs to validate and run routines.
_CORE = ("_routines.model", "_routines.loader", "_routines.validator", "_routines.runner", "_routines.template", "_routines.expr")


class RunBody(Body):
    """Inputs of a routine run."""

    inputs: dict[str, Any] | None = Field(default=None, description=(
        "The routine's inputs (omitted: none for a new run, the recorded ones when run_id names a run to continue)."))
    run_id: str | None = Field(default=None, max_length=200)


def _trace_schema() -> dict[str, Any]:
    from .._routines.trace_schema import EMCORE_SCHEMA, ENGRAIN_SCHEMA

    # The compiler's own schemas: a trace the document calls valid is one the compiler reads.
    # Only a finished, successful run compiles: its trace holds a run.completed event.
    engrain = {**ENGRAIN_SCHEMA, "required": ["format", "events"],
               "properties": {**ENGRAIN_SCHEMA["properties"], "events": {
                   **ENGRAIN_SCHEMA["properties"]["events"],
                   "contains": {"type": "object", "required": ["kind"], "properties": {"kind": {"const": "run.completed"}}}}}}
    return {"anyOf": [engrain,
                      {**EMCORE_SCHEMA, "required": ["version", "app", "mission", "events"]}]}


_TRACE = Field(description="An engrain trace (engrain export) or an em-core trace.", json_schema_extra=_trace_schema())


class PreviewBody(Body):
    """A trace to compile without saving it (the UI's compile view)."""

    trace: dict[str, Any] = _TRACE


class CompileBody(Body):
    """A trace to compile into ``routines_dir/<name>``."""

    name: str = Field(pattern=NAME.pattern, description="Routine name (folder to create).")
    trace: dict[str, Any] = _TRACE
    overwrite: bool = False


def available(*modules: str) -> bool:
    """Whether the routine engine (or the given modules of it) is installed in this engrain."""
    return all(importlib.util.find_spec(f"engrain.{m}") is not None for m in (modules or _CORE))


def _engine(*modules: str) -> None:
    if not available(*modules):
        names = "/".join(modules or _CORE)
        raise ApiError(501, "NotImplemented", f"the routine engine ({names}) is not installed in this engrain")


def routine_dir(state: ServerState, name: str, *, must_exist: bool = True) -> Path:
    """The folder of routine ``name``, never outside the routines dir."""
    # The pattern keeps a name one path segment that is never "." or ".."; resolving below keeps it in the root.
    if not isinstance(name, str) or not NAME.match(name):
        raise ApiError(400, "BadRoutineName", f"routine name {name!r} must match {NAME.pattern}")
    root = state.routines_dir
    path = (root / name).resolve()
    if not path.is_relative_to(root):
        raise ApiError(400, "BadRoutineName", f"routine name {name!r} escapes the routines dir")
    if must_exist and not (path / ROUTINE_FILE).is_file():
        raise ApiError(404, "RoutineNotFoundError", f"no routine {name!r} ({path / ROUTINE_FILE} does not exist)")
    return path


def _read_yaml(path: Path) -> tuple[str, Any, str | None]:
    """The text of ``path``'s routine.yaml, its data and what is wrong with it, read within the YAML bounds."""
    from .._errors import RoutineError
    from .._routines.yamlfile import load_yaml_text, read_yaml_text

    file = path / ROUTINE_FILE
    text = ""
    try:
        text = read_yaml_text(file, ROUTINE_FILE)
        doc = load_yaml_text(text, ROUTINE_FILE)
    except RoutineError as e:
        return text, None, "; ".join(f"{file}: {i.field}: {i.message}" for i in e.issues)
    if doc is None:
        return text, None, f"{file}: empty: a routine file is a mapping with name, inputs and steps"
    return text, doc, None


def routine_infos(root: Path) -> list[dict[str, Any]]:
    """Summaries of the routine packages under ``root``, by name."""
    out = []
    if root.is_dir():
        for path in sorted(root.iterdir()):
            if not (path / ROUTINE_FILE).is_file() or not NAME.match(path.name):
                continue
            _, doc, err = _read_yaml(path)
            doc = doc if isinstance(doc, dict) else {}
            steps = doc.get("steps")
            out.append({
                "name": path.name, "description": str(doc.get("description") or ""),
                "inputs": _jsonable(doc.get("inputs")) if isinstance(doc.get("inputs"), dict) else {},
                "steps": len(steps) if isinstance(steps, list) else 0,
                "error": err or (None if doc else f"{path / ROUTINE_FILE} is not a YAML mapping"),
            })
    return out


@router.get("/routines")
def list_routines(request: Request) -> list[dict[str, Any]]:
    """Routine packages under the routines dir, by name."""
    return routine_infos(state_of(request).routines_dir)


@router.get("/routines/{name:segment}")
def get_routine(request: Request, name: RoutineName) -> dict[str, Any]:
    """A routine's YAML text, parsed form, validation issues, effective input schema and example inputs.

    ``inputs`` is the input schema after loading (an em-core package's converted
    ``input_schema``); ``input`` is the package's ``input.json`` (the recorded
    inputs of a compiled routine), or null.
    """
    path = routine_dir(state_of(request), name)
    text, doc, err = _read_yaml(path)
    issues = [_issue("error", err, ROUTINE_FILE)] if err else (validate_path(path, state_of(request).tools) if available() else [])
    inputs = doc.get("inputs") if isinstance(doc, dict) else None
    dialect, conversions = "engrain", []
    if not issues and available():
        from . import _routine_engine as eng

        inputs, dialect, conversions = eng.loaded_inputs(path)
    return {"name": name, "yaml": text, "routine": _jsonable(doc), "issues": issues, "inputs": _jsonable(inputs),
            "input": _example_input(path), "dialect": dialect, "conversions": conversions}


_MAX_EXAMPLE = 256 * 1024


def _example_input(path: Path) -> Any:
    """The package's input.json (a JSON object of at most 256 KiB inside the folder), else None."""
    import json

    file = path / "input.json"
    try:
        real = file.resolve()
        if real.parent != path.resolve() or real.stat().st_size > _MAX_EXAMPLE:
            return None
        value = json.loads(real.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


@router.post("/routines/{name:segment}/validate")
def validate(request: Request, name: RoutineName) -> dict[str, Any]:
    """Validate a routine package; ``ok`` is false when any issue is an error."""
    path = routine_dir(state_of(request), name)
    _engine()
    issues = validate_path(path, state_of(request).tools)
    return {"name": name, "ok": not any(i["severity"] == "error" for i in issues), "issues": issues}


@router.post("/routines/{name:segment}/run")
def run(request: Request, name: RoutineName, body: RunBody) -> dict[str, Any]:
    """Run a routine to its end or its first prompt; returns the RunResult."""
    return run_routine(state_of(request), name, body.inputs, body.run_id)


@router.post("/routines/compile/preview")
def preview_compile(request: Request, body: PreviewBody) -> dict[str, Any]:
    """Compile a trace without saving it: the generated routine.yaml, udfs.py, UDF report and validation issues."""
    _engine(*_CORE, "_routines.compiler")
    from . import _routine_engine as eng

    return eng.preview(body.trace, state_of(request).tools)


@router.post("/routines/compile")
def compile_trace(request: Request, body: CompileBody) -> dict[str, Any]:
    """Compile a trace into a routine package under the routines dir."""
    state = state_of(request)
    path = routine_dir(state, body.name, must_exist=False)
    _engine(*_CORE, "_routines.compiler")
    if path.exists() and not body.overwrite:
        raise ApiError(409, "RoutineExistsError", f"routine {body.name!r} already exists (pass overwrite=true)")
    from . import _routine_engine as eng

    state.routines_dir.mkdir(parents=True, exist_ok=True)
    report = eng.compile_into(body.trace, path, overwrite=body.overwrite)
    text, doc, _ = _read_yaml(path)
    return {"name": body.name, "path": str(path), "yaml": text, "routine": _jsonable(doc), "udfs": report,
            "issues": validate_path(path, state.tools) if available() else []}


# -- engine adapters (used by runs.py too) -------------------------------------------


def validate_path(path: Path, tools: Any = None) -> list[dict[str, Any]]:
    """Validation issues of the routine at ``path`` (tool names checked against ``tools`` if given)."""
    from . import _routine_engine as eng

    return eng.validate(path, tools)


def run_routine(state: ServerState, name: str, inputs: dict[str, Any] | None, run_id: str | None) -> dict[str, Any]:
    """Run routine ``name`` on the server's journal; the RunResult as a dict."""
    path = routine_dir(state, name)
    _engine()
    from . import _routine_engine as eng

    existing = state.journal.read(run_id, -1)[:1] if run_id else []
    if existing and routine_run_folder(state, existing) != path:
        # Continuing another run (a client's, an agent's, another routine's) would replay its events as ours.
        raise ApiError(409, "RunMismatchError", f"run {run_id!r} exists and is not a run of routine {name!r}")
    return eng.run(path, inputs, state.journal, run_id, state.tools)


def routine_run_folder(state: ServerState, events: list[Any]) -> Path | None:
    """The folder of a routine run this server may resume (inside its routines dir), else None."""
    if not available():
        return None
    from . import _routine_engine as eng

    folder = eng.routine_folder(events)
    if folder is None:
        return None
    folder = folder.resolve()
    return folder if folder.is_relative_to(state.routines_dir) else None


def resume(state: ServerState, run_id: str, answers: dict[str, Any]) -> dict[str, Any]:
    """Record ``answers`` for a routine run and continue it; its new RunResult as a dict."""
    from . import _routine_engine as eng

    return eng.resume(run_id, answers, state.journal, state.tools)


def _issue(severity: str, message: str, file: str, step: str | None = None, field: str = "") -> dict[str, Any]:
    return {"severity": severity, "file": file, "step": step, "field": field, "message": message}


def _jsonable(doc: Any) -> Any:
    """YAML can hold dates and other non-JSON scalars: make the parsed routine JSON-safe."""
    import json

    return json.loads(json.dumps(doc, default=str))
