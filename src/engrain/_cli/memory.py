"""``engrain memory remember|recall|consolidate|export|import|forget|update|stats|reembed``: skill memory from the shell."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from .._progress import task
from .common import JsonOption, UrlOption, app, errors_as_exit, fail, open_store, print_json

memory_app = typer.Typer(help="Skill memory: remember, recall, consolidate, export, import, forget, update, stats, reembed.",
                         no_args_is_help=True)
app.add_typer(memory_app, name="memory")

SkillOption = Annotated[str | None, typer.Option("--skill", help="Skill the memory belongs to.")]
HintOption = Annotated[float | None, typer.Option("--hint", help="Importance from 0 to 1 (used in ranking).")]
LabelOption = Annotated[str | None, typer.Option("--label", help="Short topic label (boosts matching items).")]
MetaOption = Annotated[list[str] | None, typer.Option("--meta", help="Metadata as key=value (repeatable).")]
WhereOption = Annotated[list[str] | None, typer.Option(
    "--where", help="Only items whose metadata has key=value (repeatable; a JSON value like 3 or true is typed).")]


def _pairs(items: list[str] | None, flag: str, typed: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in items or []:
        if "=" not in kv:
            raise fail(f"{flag} {kv!r}: expected key=value", 2)
        k, v = kv.split("=", 1)
        if typed:
            try:
                parsed = json.loads(v)
                out[k] = parsed if parsed is None or isinstance(parsed, (int, float, bool)) else v
            except ValueError:
                out[k] = v
        else:
            out[k] = v
    return out


def _open(url: str | None, create: bool = True) -> Any:
    """The skill memory on ``url``; ``create=False`` (commands that read or change what is there)
    refuses a store that does not exist instead of creating an empty one."""
    from .._memory import Memory

    if not create:
        open_store(url, create=False).close()
    return Memory(url)


@memory_app.command("remember")
def remember(
    text: Annotated[str, typer.Argument(help="What to remember.")],
    skill: SkillOption = None,
    hint: HintOption = None,
    label: LabelOption = None,
    meta: MetaOption = None,
    ttl: Annotated[float | None, typer.Option("--ttl", help="Lifetime in seconds.")] = None,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Store a record (no LLM); prints its id."""
    metadata = _pairs(meta, "--meta", typed=False)
    with errors_as_exit():
        rid = _open(url).remember(text, hint=hint, label=label, skill=skill, metadata=metadata or None, ttl=ttl)
    if json_out:
        print_json({"id": rid})
    else:
        typer.echo(rid)


@memory_app.command("recall")
def recall(
    query: Annotated[str, typer.Argument(help="What to look for.")],
    skill: SkillOption = None,
    label: LabelOption = None,
    where: WhereOption = None,
    top_k: Annotated[int, typer.Option("--top-k", help="How many results.")] = 5,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Search records and articles (hybrid vector + full text)."""
    filt = _pairs(where, "--where", typed=True)
    with errors_as_exit():
        hits = _open(url, create=False).recall(query, skill=skill, top_k=top_k, label=label, where=filt or None)
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
        mem = _open(url, create=False)
        with task("consolidating the memory buffer"):
            summary = mem.consolidate(n, method)
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
        res = _open(url, create=False).export()
    if json_out:
        print_json({"export_dir": res["export_dir"], "count": res["count"]})
    else:
        typer.echo(res["export_dir"])


@memory_app.command("import")
def import_(
    folder: Annotated[str, typer.Argument(help="An export folder (from engrain memory export).")],
    skill_map: Annotated[list[str] | None, typer.Option(
        "--skill-map", help="Rename a skill: from=to (repeatable); a bare name files every article under it.")] = None,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Load another agent's exported articles (idempotent)."""
    mapping: dict[str, str] | str | None = None
    if skill_map:
        bare = [m for m in skill_map if "=" not in m]
        if bare and len(skill_map) > 1:
            raise fail("--skill-map: give either one bare skill name or from=to pairs", 2)
        mapping = bare[0] if bare else _pairs(skill_map, "--skill-map", typed=False)
    with errors_as_exit():
        mem = _open(url)
        with task(f"importing {folder}"):
            res = mem.import_(folder, skill_map=mapping)
    if json_out:
        print_json(res)
    else:
        typer.echo(f"imported {res['imported']}, updated {res['updated']}, unchanged {res['unchanged']}, "
                   f"new records {res['records']}")


@memory_app.command("forget")
def forget(
    id: Annotated[str | None, typer.Argument(help="A record or article id.")] = None,
    skill: Annotated[str | None, typer.Option("--skill", help="Forget everything of this skill instead.")] = None,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Delete a record, an article (with its records) or a whole skill."""
    if (id is None) == (skill is None):
        raise fail("give a record/article id or --skill, not both", 2)
    with errors_as_exit():
        res = _open(url, create=False).forget(id, skill=skill)
    if json_out:
        print_json(res)
    else:
        typer.echo(", ".join(f"{k} {v}" for k, v in res.items()))


@memory_app.command("update")
def update(
    id: Annotated[str, typer.Argument(help="A record or article id.")],
    text: Annotated[str, typer.Argument(help="The new content.")],
    hint: HintOption = None,
    label: LabelOption = None,
    meta: MetaOption = None,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Replace a record's content (its article is rewritten) or an article's text."""
    metadata = _pairs(meta, "--meta", typed=False) if meta else None
    with errors_as_exit():
        res = _open(url, create=False).update(id, text, hint=hint, label=label, metadata=metadata)
    if json_out:
        print_json(res)
    else:
        typer.echo(f"updated {res['tier']} {res['id']}")


@memory_app.command("stats")
def stats(url: UrlOption = None, json_out: JsonOption = False) -> None:
    """Records, buffer and articles counts."""
    with errors_as_exit():
        st = _open(url, create=False).stats()
    if json_out:
        print_json(st)
    else:
        for k, v in st.items():
            typer.echo(f"{k:<15} {json.dumps(v) if not isinstance(v, str) else v}")


@memory_app.command("reembed")
def reembed(
    embedder: Annotated[str, typer.Argument(help="The embedder to move to: 'openai:<model>', 'ollama:<model>', "
                                                 "'sentence-transformers:<name or path>', 'default', "
                                                 "'minilm-fp32' (the shipped file in fp32, the default before "
                                                 "2026-11-27) or 'minilm-int8' (faster, less exact).")],
    base_url: Annotated[str | None, typer.Option("--base-url", help="An OpenAI-compatible server for openai:/ollama:.")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, max=4096, help="Texts per batch.")] = 256,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Re-embed every record and article with another embedder (resumable: run it again after a crash)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from .._memory.embedders import is_spec
    from .._memory.reembed import reembed_url

    if not is_spec(embedder):
        raise fail(f"embedder {embedder!r}: write 'default', 'minilm-fp32', 'minilm-int8' or '<provider>:<model>' with provider "
                   "one of openai, ollama, sentence-transformers", 2)
    with errors_as_exit():
        open_store(url, create=False).close()  # a mistyped URL is an error, not a new empty store "moved"
    with errors_as_exit(), Progress(TextColumn("re-embedding"), BarColumn(), MofNCompleteColumn(),
                                    TimeRemainingColumn(), transient=True, disable=json_out) as bar:
        task = bar.add_task("reembed", total=None)
        res = reembed_url(url, embedder, base_url=base_url, batch_size=batch_size,
                          progress=lambda done, total: bar.update(task, completed=done, total=total))
    if json_out:
        print_json(res)
    elif res["from"] == res["to"]:
        typer.echo(f"already on {res['to']}: nothing to do")
    else:
        typer.echo(f"moved {res['records']} records and {res['articles']} articles from {res['from']} to {res['to']} "
                   f"({res['embedded']} embedded now, {res['resumed']} staged by an earlier run)")
