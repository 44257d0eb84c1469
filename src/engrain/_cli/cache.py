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
    limit: Annotated[int, typer.Option(min=1, help="At most this many entries.")] = 50,
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
    """Lookups, hits, misses, divergences, agent calls, entries, and what the agents' cache saved."""
    with errors_as_exit():
        store = _store(url)
        st: dict = dict(store.stats())
        saved = store.savings_total()
    looked = st["hits"] + st["misses"] + st["diverged"]
    st["hit_rate"] = round(st["hits"] / looked, 4) if looked else 0.0
    if json_out:
        print_json({**st, "savings": saved})
        return
    for k, v in st.items():
        typer.echo(f"{k:<12} {v}")
    avoided = saved["cache_calls"] + saved["resumed_calls"]
    paid = saved["calls_made"] + avoided
    share = f" ({100 * avoided / paid:.1f}% of {paid})" if paid else ""
    typer.echo(f"\nLLM calls over {saved['runs']} agent runs: {saved['calls_made']} made, {avoided} avoided{share}: "
               f"{saved['cache_calls']} replayed from the cache, {saved['resumed_calls']} not paid twice on resume")
    typer.echo(f"avoided: {saved['input_tokens']} input tokens, {saved['output_tokens']} output tokens, "
               f"{saved['model_seconds']:.2f} s of model time")


@cache_app.command("savings")
def savings(
    url: UrlOption = None,
    run: Annotated[str | None, typer.Option("--run", help="Only this run.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many runs.")] = 20,
    json_out: JsonOption = False,
) -> None:
    """Per agent run, newest first: LLM calls made and avoided, with the avoided tokens and model time."""
    import datetime as dt

    with errors_as_exit():
        rows = _store(url).savings(limit=limit, run_id=run)
    if json_out:
        print_json(rows)
        return
    if not rows:
        if run is not None:
            raise fail(f"no savings recorded for run {run!r} (only agent runs with the cache on, or resumed, have one)")
        typer.echo("no agent runs recorded yet")
        return
    typer.echo(f"{'RUN':<28} {'WHEN':<19} {'MADE':>5} {'CACHE':>5} {'RESUME':>6} {'IN TOK':>8} {'OUT TOK':>8} "
               f"{'MODEL S':>8}  AGENT")
    for r in rows:
        when = dt.datetime.fromtimestamp(r["ts"]).strftime("%Y-%m-%d %H:%M:%S")
        typer.echo(f"{r['run_id']:<28} {when:<19} {r['calls_made']:>5} {r['cache_calls']:>5} {r['resumed_calls']:>6} "
                   f"{r['input_tokens']:>8} {r['output_tokens']:>8} {r['model_seconds']:>8.2f}  {r['agent']}")


@cache_app.command("evict")
def evict(entry_id: str, url: UrlOption = None) -> None:
    """Delete one cache entry."""
    with errors_as_exit():
        gone = _store(url).evict(entry_id)
    if not gone:
        raise fail(f"no cache entry {entry_id!r}", 2)
    typer.echo(f"evicted {entry_id}")
