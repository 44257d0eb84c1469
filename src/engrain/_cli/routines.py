"""``engrain compile``, ``validate``, ``run``, ``resume``: routine packages.

Exit codes of ``run`` and ``resume``: 0 ok, 1 the run failed (or an engrain
error), 2 bad input (file, JSON, inputs or answers not matching the schema),
3 the run waits for input (``needs_input``; answer with ``engrain resume``).

``--answers`` takes one format for both commands: a JSON file holding
``{field: value}`` (the current prompt) or ``{step_id: {field: value}}`` (one or
more prompts by step id). A failed run prints, with ``--json``, the result with
em-core's failure fields ``step_id``, ``error_type`` and ``message`` beside
``error``.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .common import (
    JsonOption,
    UrlOption,
    command,
    errors_as_exit,
    fail,
    open_store,
    print_json,
)

#: Exit code of a run that paused on a ``prompt.user`` step.
EXIT_NEEDS_INPUT = 3

_ANSWERS_HELP = (
    "Answers JSON file ('-' for stdin): {field: value} for the current prompt, "
    "or {step_id: {field: value}} for one or more prompts."
)
ToolsOption = Annotated[
    str | None, typer.Option("--tools", help="Tool registry as module:attribute (default: engrain.tools).")
]


def _load_json(path: str, what: str) -> Any:
    import json
    import pathlib
    import sys

    try:
        text = sys.stdin.read() if path == "-" else pathlib.Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise fail(f"{what} {path}: {e.strerror or e}", 2) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise fail(f"{what} {path}: not JSON (line {e.lineno}: {e.msg})", 2) from None


def _report(result: Any, json_out: bool, tools: str | None = None) -> None:
    import json

    if json_out:
        print_json(result.to_dict())
    elif result.status == "ok":
        typer.echo(json.dumps(result.output, indent=2, ensure_ascii=False))
    elif result.status == "needs_input":
        p = result.prompt or {}
        typer.echo(f"run {result.run_id} needs input (step {p.get('step')}): {p.get('prompt')}")
        for f in p.get("fields") or []:
            extra = f" options={f['options']}" if f.get("options") else ""
            default = f" default={json.dumps(f['default'])}" if "default" in f else ""
            typer.echo(f"  {f.get('name')} ({f.get('type', 'text')}){extra}{default}")
        again = f" --tools {tools}" if tools else ""  # the journal's record of it is never imported
        typer.echo(f"answer with: engrain resume {result.run_id} --answers answers.json{again}")
    else:
        where = f" at step {result.step_id}" if result.step_id else ""
        typer.echo(f"run {result.run_id} failed{where}: {result.error}", err=True)
    if result.status == "failed":
        raise typer.Exit(1)
    if result.status == "needs_input":
        raise typer.Exit(EXIT_NEEDS_INPUT)


@command
def compile(
    trace: Annotated[str, typer.Argument(help="Trace JSON file (engrain export, or the em-core format).")],
    out: Annotated[str, typer.Option("-o", "--out", help="Folder to write the routine package to.")],
    json_out: JsonOption = False,
) -> None:
    """Compile a trace into a routine package (routine.yaml, udfs.py, input.json, expected_output.json)."""
    with errors_as_exit():
        from .._routines.compiler import compile_trace

        path = compile_trace(trace, out)
    files = sorted(p.name for p in path.iterdir() if p.is_file())
    if json_out:
        print_json({"path": str(path), "files": files, "udfs": [r.to_dict() for r in path.report]})
        return
    typer.echo(f"compiled {trace} -> {path} ({', '.join(files)})")
    for r in path.report:
        typer.echo(f"  udf {r.name}: " + ("real function (generalizes)" if r.generalized else f"replays recorded results: {r.reason}"))
    if path.report:
        typer.echo("  the routine is trusted: false (UDFs run in the WASM sandbox); set trusted: true to run them natively")


@command
def validate(
    path: Annotated[str, typer.Argument(help="Routine package folder.")],
    tools: ToolsOption = None,
    json_out: JsonOption = False,
) -> None:
    """Check a routine package without running it; exit 1 if it has problems.

    An em-core package is converted on load; the conversions are listed.
    """
    with errors_as_exit():
        from .._routines.loader import load_routine, validate_routine
        from .._routines.runner import resolve_tools

        issues = validate_routine(path, resolve_tools(tools) if tools else None)
        routine = None if issues else load_routine(path)
    dialect = routine.dialect if routine else None
    conversions = routine.conversions if routine else []
    if json_out:
        print_json({"path": path, "valid": not issues, "issues": [i.to_dict() for i in issues],
                    "dialect": dialect, "conversions": conversions})
    elif not issues:
        typer.echo(f"{path}: ok" + (f" ({dialect} format, converted on load)" if conversions else ""))
        for c in conversions:
            typer.echo(f"  converted: {c}")
    else:
        for i in issues:
            # An issue about the folder itself already names it; one about a file names the file.
            typer.echo(str(i) if i.file == path or i.file.startswith(f"{path}/") else f"{path}/{i}", err=True)
    if issues:
        raise typer.Exit(1)


@command
def run(
    path: Annotated[str, typer.Argument(help="Routine package folder.")],
    input: Annotated[str, typer.Option("--input", "-i", help="Inputs JSON file ('-' for stdin; default: the package's input.json).")] = "",
    tools: ToolsOption = None,
    sandbox: Annotated[bool, typer.Option("--sandbox", help="Run UDFs in the WASM sandbox even if trusted.")] = False,
    answers: Annotated[str | None, typer.Option("--answers", help=_ANSWERS_HELP)] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run id (to resume a crashed run).")] = None,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Run a routine package as a durable run. Exit 0 ok, 1 failed, 2 bad input, 3 needs input."""
    import pathlib

    folder = pathlib.Path(path)
    if not folder.is_dir():
        raise fail(f"{path}: no such routine folder" if not folder.exists() else f"{path}: not a routine folder", 2)
    if not (folder / "routine.yaml").is_file():
        raise fail(f"{path}: not a routine folder (no routine.yaml in it)", 2)
    inputs = _load_json(input, "--input") if input else _load_json(str(pathlib.Path(path) / "input.json"), "input")
    given = _load_json(answers, "--answers") if answers else None
    with errors_as_exit():
        from .._routines.runner import run_routine

        result = run_routine(
            path, inputs, tools=tools, run_id=run_id, journal=open_store(url), answers=given, sandbox=True if sandbox else None
        )
    _report(result, json_out, tools)


@command
def resume(
    run_id: Annotated[str, typer.Argument(help="Id of a routine run waiting for input.")],
    answers: Annotated[str, typer.Option("--answers", help=_ANSWERS_HELP)],
    tools: ToolsOption = None,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Answer a paused routine run and continue it from the journal (exit codes as ``run``)."""
    given = _load_json(answers, "--answers")
    with errors_as_exit():
        from .._routines.runner import resume_routine

        result = resume_routine(run_id, given, tools=tools, journal=open_store(url))
    _report(result, json_out, tools)
