"""What ``engrain run`` and ``engrain resume`` do, without typer.

Both commands are reached two ways: through the typer app (``routines.py``)
and through the fast path (:mod:`.fast`), which parses their options by hand
so that running a routine does not pay typer's import. Either way the work and
the output are these functions'; a command ends by raising :class:`Exit`.

Exit codes, the same for every command (:func:`exit_code`): 0 ok, 1 the run
failed (or an engrain error, or a store server that cannot be reached), 2 bad
usage or input (a missing file, bad JSON, inputs or answers not matching the
schema, a malformed store URL, an option given as ``''``), 3 the run waits for input.

An error is one ``error: ...`` line on stderr; a command given ``--json`` also
prints ``{"error": TYPE, "detail": MESSAGE}`` on stdout (:func:`error_json`), so
a script reading stdout always gets JSON.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: Exit code of a run that paused on a ``prompt.user`` step.
EXIT_NEEDS_INPUT = 3


class Exit(Exception):
    """End the command with ``code`` (what typer.Exit is to the typer app)."""

    def __init__(self, code: int = 0):
        super().__init__(code)
        self.code = code


def echo(text: str, err: bool = False) -> None:
    """One line to stdout (or stderr), flushed as typer.echo does."""
    stream = sys.stderr if err else sys.stdout
    stream.write(text + "\n")
    stream.flush()


def error_json(error: str, detail: str) -> None:
    """``{"error": error, "detail": detail}`` on stdout: a ``--json`` command's failure, for the script reading it.

    ASCII-escaped, so no message (a run id with undecodable bytes, say) can fail to print.
    """
    import json

    sys.stdout.write(json.dumps({"error": error, "detail": detail}, indent=2) + "\n")
    sys.stdout.flush()


def fail(message: str, code: int = 1, *, json_out: bool = False, error: str | None = None) -> Exit:
    """Print ``error: message`` to stderr and return the Exit to raise.

    ``json_out`` (the command's ``--json``): also print it as JSON on stdout (:func:`error_json`), its
    type ``error`` (an exception's class name), else ``UsageError`` for bad input (code 2) or ``Error``.
    """
    echo(f"error: {message}", err=True)
    if json_out:
        error_json(error or ("UsageError" if code == 2 else "Error"), message)
    return Exit(code)


#: Errors that mean the command was given something wrong (exit 2), not that the work failed (exit 1).
_FILE_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


def exit_code(e: BaseException) -> int:
    """The one rule for every command: 2 for bad usage or input (bad JSON, a missing file, folder,
    store, run or record, an option out of range, a malformed store URL), 1 for a failure of the work
    itself or of what it runs on (a store server that cannot be reached, a store too new to open)."""
    from .._errors import (
        ConfigError,
        NotJSONError,
        RunNotFoundError,
        StoreUnreachableError,
        StoreVersionError,
        TraceError,
        UnknownInputError,
    )

    if isinstance(e, (StoreVersionError, StoreUnreachableError)):  # not the user's typo
        return 1
    # NotJSONError (a TypeError) reaches a command only from what it was given: a run's own values
    # that are not JSON end the run failed instead.
    bad = (ValueError, ConfigError, NotJSONError, TraceError, RunNotFoundError, UnknownInputError, *_FILE_ERRORS)
    return 2 if isinstance(e, bad) else 1


def message(e: BaseException) -> str:
    """One line for ``e``: a file error names the file, not ``[Errno 2]``."""
    if isinstance(e, OSError) and e.filename is not None:
        why = {FileNotFoundError: "no such file or folder", IsADirectoryError: "is a folder, not a file",
               NotADirectoryError: "not a folder", PermissionError: "permission denied"}.get(type(e), e.strerror)
        return f"{e.filename}: {why}"
    return " ".join(str(e).split()) or type(e).__name__


@contextmanager
def errors_as_exit(json_out: bool = False) -> Iterator[None]:
    """engrain's typed errors as one line and exit code 1 (2 for bad input; see :func:`exit_code`),
    as the typer app does; ``json_out``: also as ``{"error", "detail"}`` JSON on stdout."""
    from .._errors import EngrainError

    try:
        yield
    except (EngrainError, ValueError, *_FILE_ERRORS) as e:
        raise fail(message(e), exit_code(e), json_out=json_out, error=type(e).__name__) from None


def refuse_empty(flag: str, value: str | None, instead: str, json_out: bool = False) -> None:
    """Exit 2 when option ``flag`` was given as an empty string: the code below it reads "not given"
    as ``value or default``, so ``--run-id ''`` made a fresh id instead of saying the value was wrong.
    ``instead``: what leaving the option out does, said in the message."""
    if value is not None and not value:
        raise fail(f"{flag} must not be empty (leave it out for {instead})", 2, json_out=json_out)


#: Most bytes a command reads from a file it is given (inputs, answers, a routine.yaml): /dev/zero or a
#: stray huge file is refused with a message, not read until the memory runs out.
MAX_FILE_BYTES = 64 * 1024 * 1024


def read_text(path: str, what: str, json_out: bool = False, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of file ``path`` (``-``: stdin), at most ``limit`` bytes; exit 2 naming ``what``
    when it is unreadable, larger or not UTF-8 (``json_out``: said on stdout as JSON too)."""
    try:
        if path == "-":
            stdin = getattr(sys.stdin, "buffer", None)  # a test's replacement stdin may be text only
            raw = stdin.read(limit + 1) if stdin is not None else sys.stdin.read(limit + 1).encode("utf-8", "surrogateescape")
        else:
            with open(path, "rb") as f:
                raw = f.read(limit + 1)
    except OSError as e:
        raise fail(f"{what} {path}: {e.strerror or e}", 2, json_out=json_out) from None
    if len(raw) > limit:
        raise fail(f"{what} {path}: larger than the {limit:,} bytes a command reads", 2, json_out=json_out)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise fail(f"{what} {path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})", 2, json_out=json_out) from None


def load_json(path: str, what: str, json_out: bool = False) -> Any:
    """The JSON in file ``path`` (``-``: stdin); exit 2 naming ``what`` when unreadable or not JSON
    (``json_out``: said on stdout as JSON too)."""
    import json

    text = read_text(path, what, json_out)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise fail(f"{what} {path}: not JSON (line {e.lineno}: {e.msg})", 2, json_out=json_out) from None
    except RecursionError:
        raise fail(f"{what} {path}: nested too deeply to parse", 2, json_out=json_out) from None


def report(result: Any, json_out: bool, tools: str | None = None) -> None:
    """Print a routine run's result; raise :class:`Exit` 1 when it failed, 3 when it needs input."""
    import json

    if json_out:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2, ensure_ascii=False, default=str) + "\n")
    elif result.status == "ok":
        echo(json.dumps(result.output, indent=2, ensure_ascii=False))
    elif result.status == "needs_input":
        p = result.prompt or {}
        echo(f"run {result.run_id} needs input (step {p.get('step')}): {p.get('prompt')}")
        for f in p.get("fields") or []:
            extra = f" options={f['options']}" if f.get("options") else ""
            default = f" default={json.dumps(f['default'])}" if "default" in f else ""
            echo(f"  {f.get('name')} ({f.get('type', 'text')}){extra}{default}")
        again = f" --tools {tools}" if tools else ""  # the journal's record of it is never imported
        echo(f"answer with: engrain resume {result.run_id} --answers answers.json{again}")
    else:
        where = f" at step {result.step_id}" if result.step_id else ""
        echo(f"run {result.run_id} failed{where}: {result.error}", err=True)
    if result.status == "failed":
        raise Exit(1)
    if result.status == "needs_input":
        raise Exit(EXIT_NEEDS_INPUT)


@contextmanager
def json_stdout(json_out: bool) -> Iterator[None]:
    """Under ``--json``, send what the work itself prints (a trusted UDF's or tool's ``print``, a module
    imported by ``--tools``, a subprocess) to stderr, so stdout holds only the command's JSON."""
    if not json_out:
        yield
        return
    import contextlib
    import os

    sys.stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no fd 1 or 2 to move: Python's own prints are still moved
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def _journal(url: str | None):
    from .._journal import open_journal

    return open_journal(url, create=True)


def routine_folder(path: str, json_out: bool = False) -> Any:
    """``path`` as a routine package folder; exit 2 naming it when it is missing or holds no routine.yaml
    (``json_out``: said on stdout as JSON too)."""
    import pathlib

    folder = pathlib.Path(path)
    if not folder.is_dir():
        raise fail(f"{path}: no such routine folder" if not folder.exists() else f"{path}: not a routine folder", 2,
                   json_out=json_out)
    if not (folder / "routine.yaml").is_file():
        raise fail(f"{path}: not a routine folder (no routine.yaml in it)", 2, json_out=json_out)
    return folder


def run_command(
    path: str,
    input: str | None = None,
    tools: str | None = None,
    sandbox: bool = False,
    answers: str | None = None,
    run_id: str | None = None,
    url: str | None = None,
    json_out: bool = False,
) -> None:
    """``engrain run``: run the routine package at ``path`` as a durable run."""
    for flag, value, instead in (("--run-id", run_id, "a fresh id"), ("--input", input, "the package's input.json"),
                                 ("--answers", answers, "no answers"), ("--tools", tools, "engrain.tools")):
        refuse_empty(flag, value, instead, json_out)
    folder = routine_folder(path, json_out)
    inputs = (load_json(input, "--input", json_out) if input is not None
              else load_json(str(folder / "input.json"), "input", json_out))
    given = load_json(answers, "--answers", json_out) if answers is not None else None
    with errors_as_exit(json_out), json_stdout(json_out):
        from .._routines.runner import run_routine

        result = run_routine(
            path, inputs, tools=tools, run_id=run_id, journal=_journal(url), answers=given, sandbox=True if sandbox else None
        )
    report(result, json_out, tools)


def resume_command(
    run_id: str, answers: str, tools: str | None = None, url: str | None = None, json_out: bool = False
) -> None:
    """``engrain resume``: answer a paused routine run and continue it from the journal."""
    refuse_empty("--tools", tools, "the tools the run was started with", json_out)
    given = load_json(answers, "--answers", json_out)
    with errors_as_exit(json_out), json_stdout(json_out):
        from .._routines.runner import resume_routine

        result = resume_routine(run_id, given, tools=tools, journal=_journal(url))
    report(result, json_out, tools)
