"""``engrain routines``: review the routines agents learned (list, show, edit, promote, delete).

``engrain routines`` alone lists them. A learned routine is ``trusted: false``
until a human promotes it; ``edit`` replaces its ``routine.yaml`` (checked the
same way the HTTP API checks it) and stops it from being re-induced.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .common import JsonOption, UrlOption, app, errors_as_exit, json_wanted, print_json

learned_app = typer.Typer(help="Routines agents learned from their runs: list, show, edit, promote, delete.",
                          invoke_without_command=True)
app.add_typer(learned_app, name="routines")

SkillOption = Annotated[str | None, typer.Option("--skill", help="Only this skill's routines.")]
RefArg = Annotated[str, typer.Argument(help="The routine's id or name.")]


def _store(url: str | None) -> Any:
    from .._agent.learn import LearnedRoutines

    return LearnedRoutines(url)


def _line(r: Any) -> str:
    flag = "trusted" if r.trusted else "withheld" if r.demoted else "untrusted"
    inputs = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in (r.inputs.get("properties") or {}).items())
    return f"{r.id:<20} {r.skill[:16]:<16} {r.status:<15} {flag:<9} {r.uses:>4} {r.stops:>5}  {r.name}({inputs})"


@learned_app.callback()
def list_routines(
    ctx: typer.Context,
    skill: SkillOption = None,
    status: Annotated[str | None, typer.Option("--status", help="candidate, confirmed or not_compilable.")] = None,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """List learned routines, newest first (with no subcommand)."""
    if ctx.invoked_subcommand is not None:
        return
    with errors_as_exit():
        rows = _store(url).list(skill, status)
    if json_out:
        print_json([r.to_dict() for r in rows])
        return
    if not rows:
        typer.echo("no learned routines yet (run an agent with learn=True)")
        return
    typer.echo(f"{'ID':<20} {'SKILL':<16} {'STATUS':<15} {'TRUST':<9} {'USES':>4} {'STOPS':>5}  ROUTINE(INPUTS)")
    for r in rows:
        typer.echo(_line(r))
        for p in r.problems:
            typer.echo(f"{'':<22}{p['step']} ({p['tool']}) argument {p['arg']}: {p['reason']}")


@learned_app.command("show")
def show(ref: RefArg, skill: SkillOption = None, url: UrlOption = None, json_out: JsonOption = False) -> None:
    """Show a learned routine: its routine.yaml, source tasks, how each argument was explained, problems."""
    import yaml

    with errors_as_exit():
        r = _store(url).get(ref, skill)
    if json_out:
        print_json(r.to_dict(full=True))
        return
    typer.echo(f"# {r.name} ({r.id}) skill={r.skill} status={r.status} trusted={str(r.trusted).lower()}"
               f"{' withheld' if r.demoted else ''}{' edited' if r.edited else ''} uses={r.uses} stops={r.stops}")
    for t in r.tasks:
        typer.echo(f"# learned from: {t}")
    for e in r.explained:
        typer.echo(f"#   {e['step']} {e['tool']}.{e['arg']}: {e['as']}")
    for p in r.problems:
        typer.echo(f"# NOT COMPILABLE {p['step']} {p['tool']}.{p['arg']}: {p['reason']}")
    typer.echo(yaml.safe_dump(r.routine, sort_keys=False, allow_unicode=True, width=100).rstrip())


@learned_app.command("edit")
def edit(
    ref: RefArg,
    file: Annotated[str, typer.Argument(help="The new routine.yaml ('-' for stdin).")],
    skill: SkillOption = None,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Replace a learned routine with your routine.yaml (checked; it is then never re-induced)."""
    from .._routines.yamlfile import MAX_BYTES
    from .routine_run import Exit, read_text

    try:
        text = read_text(file, "routine.yaml", json_wanted(), MAX_BYTES)
    except Exit as e:
        raise typer.Exit(e.code) from None
    with errors_as_exit():
        r = _store(url).edit(ref, text, skill)
    if json_out:
        print_json(r.to_dict())
    else:
        typer.echo(f"edited {r.name} ({r.id}); trusted={str(r.trusted).lower()}")


@learned_app.command("promote")
def promote(
    ref: RefArg,
    undo: Annotated[bool, typer.Option("--undo", help="Take it back (trusted: false): no agent offers it, nor runs an "
                                               "offer made before, until it is promoted again.")] = False,
    skill: SkillOption = None,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Mark a learned routine reviewed (trusted: true); --undo takes it back and withholds it from agents."""
    with errors_as_exit():
        r = _store(url).promote(ref, not undo, skill)
    if json_out:
        print_json(r.to_dict())
    else:
        typer.echo(f"{r.name} ({r.id}): trusted={str(r.trusted).lower()}")


@learned_app.command("delete")
def delete(ref: RefArg, skill: SkillOption = None, url: UrlOption = None, json_out: JsonOption = False) -> None:
    """Delete a learned routine."""
    with errors_as_exit():
        r = _store(url).delete(ref, skill)
    if json_out:
        print_json({"deleted": r.id, "name": r.name})
    else:
        typer.echo(f"deleted {r.name} ({r.id})")
