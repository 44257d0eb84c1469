"""``engrain memory remember|recall|consolidate|export|stats``: skill memory from the shell."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from .common import JsonOption, UrlOption, app, errors_as_exit, fail, print_json

memory_app = typer.Typer(help="Skill memory: remember, recall, consolidate, export, stats.", no_args_is_help=True)
app.add_typer(memory_app, name="memory")

SkillOption = Annotated[str | None, typer.Option("--skill", help="Skill the memory belongs to.")]
HintOption = Annotated[str | None, typer.Option("--hint", help="Short topic hint (boosts matching items).")]


def _open(url: str | None) -> Any:
    from .._memory import Memory

    return Memory(url)


@memory_app.command("remember")
def remember(
    text: Annotated[str, typer.Argument(help="What to remember.")],
    skill: SkillOption = None,
    hint: HintOption = None,
    meta: Annotated[list[str] | None, typer.Option("--meta", help="Metadata as key=value (repeatable).")] = None,
    ttl: Annotated[float | None, typer.Option("--ttl", help="Lifetime in seconds.")] = None,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Store a record (no LLM); prints its id."""
    metadata: dict[str, str] = {}
    for kv in meta or []:
        if "=" not in kv:
            raise fail(f"--meta {kv!r}: expected key=value", 2)
        k, v = kv.split("=", 1)
        metadata[k] = v
    with errors_as_exit():
        rid = _open(url).remember(text, hint=hint, skill=skill, metadata=metadata or None, ttl=ttl)
    if json_out:
        print_json({"id": rid})
    else:
        typer.echo(rid)


@memory_app.command("recall")
def recall(
    query: Annotated[str, typer.Argument(help="What to look for.")],
    skill: SkillOption = None,
    hint: HintOption = None,
    top_k: Annotated[int, typer.Option("--top-k", help="How many results.")] = 5,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Search records and articles (hybrid vector + full text)."""
    with errors_as_exit():
        hits = _open(url).recall(query, skill=skill, top_k=top_k, hint=hint)
    if json_out:
        print_json([h.to_dict() for h in hits])
        return
    if not hits:
        typer.echo("nothing recalled")
    for h in hits:
        text = " ".join(h.content.split())
        typer.echo(f"{h.score:.3f}  {h.tier:<7}  {h.skill or '-':<12}  {text[:100]}")


@memory_app.command("consolidate")
def consolidate(
    num_records: Annotated[str, typer.Option("--num-records", help="'all' or how many buffer rows.")] = "all",
    method: Annotated[str, typer.Option("--method", help="LIFO (newest first) or FIFO.")] = "LIFO",
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Turn the buffer into articles; exit code 1 when any error was reported."""
    n: int | str = num_records
    if num_records != "all":
        try:
            n = int(num_records)
        except ValueError:
            raise fail(f"--num-records must be 'all' or an integer, not {num_records!r}", 2) from None
    with errors_as_exit():
        summary = _open(url).consolidate(n, method)
    if json_out:
        print_json(summary.to_dict())
    else:
        d = summary.to_dict()
        typer.echo(", ".join(f"{k} {d[k]}" for k in ("formed", "reconsolidated", "updated", "superseded", "dropped",
                                                      "flushed", "kept")))
        typer.echo(f"synthesizer: {summary.synthesizer}")
        for e in summary.errors:
            typer.echo(f"error: {e}", err=True)
    if summary.errors:
        raise typer.Exit(1)


@memory_app.command("export")
def export(url: UrlOption = None, json_out: JsonOption = False) -> None:
    """Write one JSON file per article; prints the folder."""
    with errors_as_exit():
        path = _open(url).export()
    if json_out:
        print_json({"path": str(path), "articles": len(list(path.glob("*.json")))})
    else:
        typer.echo(str(path))


@memory_app.command("stats")
def stats(url: UrlOption = None, json_out: JsonOption = False) -> None:
    """Records, buffer and articles counts."""
    with errors_as_exit():
        st = _open(url).stats()
    if json_out:
        print_json(st)
    else:
        for k, v in st.items():
            typer.echo(f"{k:<15} {json.dumps(v) if not isinstance(v, str) else v}")
