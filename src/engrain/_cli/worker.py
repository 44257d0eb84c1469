"""``engrain worker``: a long-running process executing queued and orphaned runs."""

from __future__ import annotations

from typing import Annotated

import typer

from .common import UrlOption, command, errors_as_exit, open_store, print_json


@command
def worker(
    agents: Annotated[str, typer.Option("--agents", help="module:attr naming a dict name -> agent callable (or one agent).")],
    queue: Annotated[list[str] | None, typer.Option("--queue", help="Queue to serve (repeatable; default: default).")] = None,
    concurrency: Annotated[int, typer.Option(help="Runs this process executes at once.")] = 4,
    until_idle: Annotated[bool, typer.Option("--until-idle", help="Exit once nothing is left to claim.")] = False,
    park_after: Annotated[float, typer.Option(help="Park runs sleeping longer than this many seconds.")] = 5.0,
    url: UrlOption = None,
) -> None:
    """Claim and execute queued runs (and runs whose worker died) until SIGTERM; finishes what it holds first."""
    from .._errors import ConfigError
    from .._server.agents import load_agents
    from .._workers.worker import Worker

    with errors_as_exit():
        try:
            table = load_agents(agents)
        except ConfigError as e:
            from .._errors import RoutineInputError
            from .._routines.runner import resolve_tools

            try:
                fn = resolve_tools(agents)  # one agent function rather than a dict
            except RoutineInputError:
                raise e from None
            if not callable(fn):
                raise
            table = {getattr(fn, "__name__", "agent"): fn}
        w = Worker(open_store(url), table, list(queue or ["default"]), concurrency=concurrency, park_after=park_after)
    w.install_signal_handlers()
    typer.echo(f"worker: queues {', '.join(w.queues)}; agents {', '.join(sorted(table))}; concurrency {concurrency}", err=True)
    stats = w.run(until_idle=until_idle)
    print_json({"finished": stats.finished, "parked": stats.parked, "errors": stats.errors})
