"""What the CLI modules share: the typer app, the store option, JSON output, typed-error exit."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Annotated, Any

import typer

from .._text import plain_doc
from . import routine_run as plain  # typer-free: the fast path's messages and exit codes

#: ``--url`` option shared by every command that opens the store.
UrlOption = Annotated[
    str | None,
    typer.Option("--url", envvar="ENGRAIN_URL", help="Store URL (sqlite:///path.db or postgresql://...)."),
]
#: Whether the command running now was given ``--json``: set by the option's callback as typer parses the
#: line (typer vendors click from 0.28 on, so click's own current context is not there to ask), reset for
#: every command by the app's callback. Errors read it to print themselves as JSON too (:func:`json_wanted`).
_JSON_OUT: ContextVar[bool] = ContextVar("engrain_cli_json_out", default=False)


def _note_json(value: bool) -> bool:
    _JSON_OUT.set(bool(value))
    return value


JsonOption = Annotated[bool, typer.Option("--json", callback=_note_json, help="Print machine-readable JSON.")]
UpgradeOption = Annotated[
    bool, typer.Option("--upgrade", help="Also resume runs another version of the agents' code started (a deploy).")
]

#: The typer app; each command module registers its commands on it.
app = typer.Typer(
    name="engrain",
    help="Memory for AI agents: durable runs, routines, a behavior cache and skill memory.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from .._version import __version__

        typer.echo(f"engrain {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool | None, typer.Option("--version", callback=_version, is_eager=True,
                                                 help="Print engrain's version and exit.")] = None,
) -> None:
    _JSON_OUT.set(False)  # a command without --json (or before its options are read) prints errors as text


#: How --tools and --agents name Python objects (said in each option's help).
OBJECT_SPEC = ("as module:attr (a module in the current directory works, as with uvicorn) "
               "or path/to/file.py:attr")


def print_json(value: Any) -> None:
    """Write ``value`` as indented JSON to stdout."""
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False, default=str) + "\n")


def json_wanted() -> bool:
    """Whether the command running now was given ``--json``, so that every command's errors follow
    its own ``--json`` without each call site passing it; False outside a command."""
    return _JSON_OUT.get()


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``error: message`` to stderr (and, under ``--json``, as JSON on stdout); return the Exit to raise."""
    return typer.Exit(plain.fail(message, code, json_out=json_wanted()).code)


@contextmanager
def typer_exit() -> Iterator[None]:
    """End with typer's Exit where the typer-free command code (:mod:`.routine_run`) ends with its own."""
    try:
        yield
    except plain.Exit as e:
        raise typer.Exit(e.code) from None


@contextmanager
def errors_as_exit() -> Iterator[None]:
    """Turn engrain's typed errors into a one-line message and exit code 1 (2 for bad input).

    The rule is :func:`.routine_run.errors_as_exit`'s, so the fast path and the typer app agree;
    under ``--json`` the error is also ``{"error": TYPE, "detail": MESSAGE}`` on stdout.
    """
    with typer_exit(), plain.errors_as_exit(json_out=json_wanted()):
        yield


def refuse_empty(flag: str, value: str | None, instead: str) -> None:
    """Exit 2 when ``flag`` was given as ``''`` (see :func:`.routine_run.refuse_empty`)."""
    with typer_exit():
        plain.refuse_empty(flag, value, instead, json_out=json_wanted())


def open_store(url: str | None, *, create: bool = True):
    """Open the journal at ``url`` (or the default store); ``create=False`` for commands that only read."""
    from .._journal import open_journal

    return open_journal(url, create=create)


def command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Register ``fn`` as a top-level command of the app (its docstring, without markup, is the help)."""
    return app.command(help=plain_doc(fn.__doc__))(fn)
