"""The CLI's fast path: ``engrain run`` and ``engrain resume`` without importing typer.

Importing typer (and its click) costs about as much as running a small
routine, and ``engrain run`` has a 150 ms budget from process start to exit. So
:func:`main` first tries to read the command line itself, for these two commands
only, with exactly the options the typer commands declare (``SPECS``; a test
checks both agree). Anything else, ``--help``, an unknown or incomplete option,
goes to the typer app unchanged, which prints its usual help and errors.
"""

from __future__ import annotations

import os
import sys
from typing import Any

#: Per command: its positional parameter, and option -> (parameter, takes a value).
SPECS: dict[str, tuple[str, dict[str, tuple[str, bool]]]] = {
    "run": (
        "path",
        {
            "--input": ("input", True),
            "-i": ("input", True),
            "--tools": ("tools", True),
            "--sandbox": ("sandbox", False),
            "--answers": ("answers", True),
            "--run-id": ("run_id", True),
            "--url": ("url", True),
            "--json": ("json_out", False),
        },
    ),
    "resume": (
        "run_id",
        {
            "--answers": ("answers", True),
            "--tools": ("tools", True),
            "--url": ("url", True),
            "--json": ("json_out", False),
        },
    ),
}
#: Parameters that typer reads from the environment when the option is not given.
ENVVARS = {"url": "ENGRAIN_URL"}
_REQUIRED = {"resume": ("answers",)}


def parse(argv: list[str]) -> tuple[str, dict[str, Any]] | None:
    """``(command, keyword arguments)`` when ``argv`` is a plain ``run``/``resume`` line, else None."""
    if not argv or argv[0] not in SPECS:
        return None
    command = argv[0]
    positional, options = SPECS[command]
    kwargs: dict[str, Any] = {}
    args = argv[1:]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-") and arg != "-":
            name, eq, value = arg.partition("=")
            spec = options.get(name)
            if spec is None:
                return None  # --help, --, a typo: typer says what is wrong
            param, takes_value = spec
            if not takes_value:
                if eq:
                    return None
                kwargs[param] = True
            elif eq:
                kwargs[param] = value
            elif i + 1 < len(args):
                i += 1
                kwargs[param] = args[i]
            else:
                return None
        elif positional in kwargs:
            return None  # a second positional argument
        else:
            kwargs[positional] = arg
        i += 1
    if positional not in kwargs or any(r not in kwargs for r in _REQUIRED.get(command, ())):
        return None
    for param, var in ENVVARS.items():
        if param not in kwargs and param in {p for p, _ in options.values()} and os.environ.get(var):
            kwargs[param] = os.environ[var]
    return command, kwargs


def main(argv: list[str]) -> int | None:
    """Run ``argv`` on the fast path and return the exit code, or None to hand it to typer."""
    parsed = parse(argv)
    if parsed is None:
        return None
    command, kwargs = parsed
    from .routine_run import Exit, resume_command, run_command

    try:
        (run_command if command == "run" else resume_command)(**kwargs)
    except Exit as e:
        return e.code
    except KeyboardInterrupt:  # as click ends an interrupted command
        sys.stderr.write("\nAborted!\n")
        return 1
    return 0
