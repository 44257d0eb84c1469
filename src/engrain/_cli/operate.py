"""``engrain cancel``, ``engrain fork``, ``engrain gc``, ``engrain answer``: operate runs in the journal."""

from __future__ import annotations

from typing import Annotated

import typer

from .common import JsonOption, UrlOption, command, errors_as_exit, fail, open_store, print_json, refuse_empty


@command
def cancel(
    run_id: Annotated[str, typer.Argument(help="The run to cancel.")],
    reason: Annotated[str, typer.Option(help="Why, recorded with the cancellation.")] = "",
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Cancel a run: it stops at its next step boundary, ends cancelled and is never resumed."""
    from .._durable.operate import cancel as _cancel

    with errors_as_exit():
        done = _cancel(run_id, reason=reason, journal=open_store(url, create=False))
    if json_out:
        print_json({"run_id": run_id, "cancelled": done})
    else:
        typer.echo(f"run {run_id} cancelled" if done else f"run {run_id} had already finished")


@command
def fork(
    run_id: Annotated[str, typer.Argument(help="The run to fork.")],
    at_step: Annotated[int, typer.Option("--at-step", help="Reuse steps 0..N-1, execute from step N.")],
    new_id: Annotated[str | None, typer.Option("--run-id", help="Id of the new run (default: a fresh one).")] = None,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Fork a run: a new run reusing the recorded results of its first N steps (resume it with the agent)."""
    from .._durable.operate import fork as _fork

    refuse_empty("--run-id", new_id, "a fresh id")
    with errors_as_exit():
        new = _fork(run_id, at_step, run_id=new_id, journal=open_store(url, create=False))
    if json_out:
        print_json({"run_id": new, "source": run_id, "at_step": at_step})
    else:
        typer.echo(new)


@command
def gc(
    older_than: Annotated[str, typer.Option("--older-than", help="Age of the runs to delete: 30d, 12h, 15m, 45s.")],
    status: Annotated[
        list[str] | None, typer.Option("--status", help="Only these finished statuses (repeatable): ok, failed, cancelled.")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be deleted; delete nothing.")] = False,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Delete finished runs and their events older than --older-than; never running, waiting or queued ones."""
    from .._durable.operate import gc as _gc

    with errors_as_exit():
        report = _gc(older_than, status=status or None, dry_run=dry_run, journal=open_store(url, create=False))
    if json_out:
        print_json(report.to_dict())
        return
    n = len(report.runs)
    verb = "would delete" if dry_run else "deleted"
    typer.echo(f"{verb} {n} run{'s' if n != 1 else ''}")


@command
def answer(
    run_id: Annotated[str, typer.Argument(help="The run waiting for input (status needs_input).")],
    answers: Annotated[str, typer.Argument(help='The answers as a JSON object, e.g. \'{"retry": true}\'.')],
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Answer a run waiting for input; the next resume (engrain.run, a worker, recover) continues it.

    For an at-most-once step asking "did this step happen?": {"result": VALUE} (it
    happened), {"retry": true} (call it again) or {"error": "MESSAGE"} (fail it).
    """
    from .._durable.human import answer as _answer

    with errors_as_exit():
        given = json_object(answers, "ANSWERS")  # bad input is said before the store is looked at
        journal = open_store(url, create=False)
        _answer(run_id, given, journal=journal)
        info = journal.get_run(run_id)
    if json_out:
        print_json({"run_id": run_id, "answered": True, "status": info.status if info else None})
    else:
        typer.echo(f"run {run_id} answered; it continues when resumed with its agent")


def json_object(text: str, what: str) -> dict:
    """``text`` parsed as a JSON object (at most 1 MB), else a one-line error naming ``what`` (exit 2: bad input)."""
    import json

    if len(text) > 1_000_000:
        raise fail(f"{what}: at most 1000000 characters of JSON", 2)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise fail(f"{what}: not valid JSON ({e})", 2) from None
    if not isinstance(value, dict):
        raise fail(f"{what}: must be a JSON object, got {type(value).__name__}", 2)
    return value
