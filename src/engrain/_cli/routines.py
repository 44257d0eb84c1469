"""``engrain compile``, ``validate``, ``run``, ``resume``: routine packages.

``run`` and ``resume`` do their work in :mod:`.routine_run`, shared with the
fast path (:mod:`.fast`) that skips typer. Exit codes of ``run`` and ``resume``:
0 ok, 1 the run failed (or an engrain error), 2 bad input (file, JSON, inputs or
answers not matching the schema), 3 the run waits for input (``needs_input``;
answer with ``engrain resume``).

``--answers`` takes one format for both commands: a JSON file holding
``{field: value}`` (the current prompt) or ``{step_id: {field: value}}`` (one or
more prompts by step id). A failed run prints, with ``--json``, the result with
em-core's failure fields ``step_id``, ``error_type`` and ``message`` beside
``error``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from .._progress import task
from .common import (
    OBJECT_SPEC,
    JsonOption,
    UrlOption,
    command,
    errors_as_exit,
    print_json,
    typer_exit,
)

_ANSWERS_HELP = (
    "Answers JSON file ('-' for stdin): {field: value} for the current prompt, "
    "or {step_id: {field: value}} for one or more prompts."
)
ToolsOption = Annotated[
    str | None, typer.Option("--tools", help=f"Tool registry {OBJECT_SPEC} (default: engrain.tools).")
]


@command
def compile(
    trace: Annotated[str, typer.Argument(help="Trace JSON file (engrain export, or the em-core format).")],
    out: Annotated[str, typer.Option("-o", "--out", help="Folder to write the routine package to.")],
    json_out: JsonOption = False,
) -> None:
    """Compile a trace into a routine package (routine.yaml, udfs.py, input.json, expected_output.json)."""
    with errors_as_exit():
        from .._routines.compiler import compile_trace

        with task(f"compiling {trace}"):
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
    """Check a routine package without running it; exit 1 if it has problems, 2 if there is no such folder.

    An em-core package is converted on load; the conversions are listed.
    """
    from .routine_run import refuse_empty, routine_folder

    with typer_exit():
        refuse_empty("--tools", tools, "engrain.tools", json_out)
        routine_folder(path, json_out)
    from .routine_run import json_stdout

    with errors_as_exit(), json_stdout(json_out):
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
    input: Annotated[str | None, typer.Option("--input", "-i", help="Inputs JSON file ('-' for stdin; default: the package's input.json).")] = None,
    tools: ToolsOption = None,
    sandbox: Annotated[bool, typer.Option("--sandbox", help="Run UDFs in the WASM sandbox even if trusted.")] = False,
    answers: Annotated[str | None, typer.Option("--answers", help=_ANSWERS_HELP)] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run id (to resume a crashed run).")] = None,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Run a routine package as a durable run. Exit 0 ok, 1 failed, 2 bad input, 3 needs input."""
    from .routine_run import run_command

    with typer_exit():
        run_command(path, input, tools, sandbox, answers, run_id, url, json_out)


@command
def resume(
    run_id: Annotated[str, typer.Argument(help="Id of a routine run waiting for input.")],
    answers: Annotated[str, typer.Option("--answers", help=_ANSWERS_HELP)],
    tools: ToolsOption = None,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Answer a paused routine run and continue it from the journal (exit codes as ``run``)."""
    from .routine_run import resume_command

    with typer_exit():
        resume_command(run_id, answers, tools, url, json_out)
