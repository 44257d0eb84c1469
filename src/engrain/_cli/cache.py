"""``engrain cache entries|stats|evict``: inspect the behavior cache's store."""

from __future__ import annotations

from typing import Annotated

import typer

from .common import (
    JsonOption,
    UrlOption,
    app,
    errors_as_exit,
    fail,
    open_store,
    print_json,
)

cache_app = typer.Typer(help="Inspect the behavior cache: entries, hit/miss counters, eviction.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


def _store(url: str | None):
    """The cache on an existing store (every cache command reads or changes what is there)."""
    from .._cache.store import CacheStore

    return CacheStore(open_store(url, create=False))


@cache_app.command("entries")
def entries(
    url: UrlOption = None,
    task: Annotated[str | None, typer.Option(help="Only entries whose canonical task contains this text.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many entries.")] = 50,
    json_out: JsonOption = False,
) -> None:
    """List cached trajectories, most recently used first."""
    import datetime as dt

    with errors_as_exit():
        rows = _store(url).entries(limit=limit, task=task)
    if json_out:
        print_json([e.to_dict() for e in rows])
        return
    if not rows:
        typer.echo("no cache entries yet")
        return
    typer.echo(f"{'ENTRY':<26} {'STEPS':>5} {'OK':>4} {'DIV':>4}  {'LAST USED':<19}  TASK [TAGS]")
    for e in rows:
        when = dt.datetime.fromtimestamp(e.last_used).strftime("%Y-%m-%d %H:%M:%S")
        tags = f" [{', '.join(e.tags)}]" if e.tags else ""
        typer.echo(f"{e.id:<26} {len(e.steps):>5} {e.successes:>4} {e.divergences:>4}  {when:<19}  {e.task}{tags}")


@cache_app.command("stats")
def stats(url: UrlOption = None, json_out: JsonOption = False) -> None:
    """Lookups, hits, misses, divergences, agent calls and entries."""
    with errors_as_exit():
        st = _store(url).stats()
    looked = st["hits"] + st["misses"] + st["diverged"]
    st["hit_rate"] = round(st["hits"] / looked, 4) if looked else 0.0
    if json_out:
        print_json(st)
        return
    for k, v in st.items():
        typer.echo(f"{k:<12} {v}")


@cache_app.command("evict")
def evict(entry_id: str, url: UrlOption = None) -> None:
    """Delete one cache entry."""
    with errors_as_exit():
        gone = _store(url).evict(entry_id)
    if not gone:
        raise fail(f"no cache entry {entry_id!r}", 2)
    typer.echo(f"evicted {entry_id}")
