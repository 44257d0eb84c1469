"""``engrain worker``, ``engrain enqueue``, ``engrain queues``: queued runs and the processes executing them."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from .common import (OBJECT_SPEC, JsonOption, UpgradeOption, UrlOption, command, errors_as_exit, fail, open_store,
                     print_json, refuse_empty)
from .operate import json_object


@command
def worker(
    agents: Annotated[str, typer.Option("--agents", help=f"A dict name -> agent callable (or one agent), {OBJECT_SPEC}.")],
    queue: Annotated[list[str] | None, typer.Option("--queue", help="Queue to serve (repeatable; default: default).")] = None,
    concurrency: Annotated[int, typer.Option(help="Runs this process executes at once.")] = 4,
    until_idle: Annotated[bool, typer.Option("--until-idle", help="Exit once nothing is left to claim.")] = False,
    park_after: Annotated[float, typer.Option(help="Park runs sleeping longer than this many seconds.")] = 5.0,
    grace: Annotated[
        float, typer.Option(help="On SIGTERM, seconds runs in flight get to finish; the rest are released to other workers.")
    ] = 30.0,
    otel: Annotated[
        bool, typer.Option("--otel", help="Export runs as OpenTelemetry spans (OTEL_TRACES_EXPORTER=otlp or console).")
    ] = False,
    upgrade: UpgradeOption = False,
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
        provider = None
        if otel:
            from .._durable.otel import instrument_from_env

            provider = instrument_from_env()[1]
        w = Worker(open_store(url), table, list(queue or ["default"]), concurrency=concurrency, park_after=park_after,
                   grace=grace, upgrade=upgrade)
    w.install_signal_handlers()
    typer.echo(f"worker: queues {', '.join(w.queues)}; agents {', '.join(sorted(table))}; concurrency {concurrency}", err=True)
    stats = w.run(until_idle=until_idle)
    if provider is not None:
        provider.force_flush()
    if stats.unfinished:
        # Runs still executing after the grace period: hand them to other workers now and exit at
        # once (their threads die with the process, as in a crash; completed steps are journaled).
        w.release_unfinished()
        print_json(stats.to_dict())
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    print_json(stats.to_dict())
    if provider is not None:
        provider.shutdown()


@command
def enqueue(
    agent: Annotated[str, typer.Argument(help="The agent's name, as the worker's --agents table knows it.")],
    task: Annotated[str, typer.Argument(help="The task text.")],
    queue: Annotated[str, typer.Option("--queue", help="Queue to put the run on.")] = "default",
    inputs: Annotated[str | None, typer.Option("--inputs", help="Keyword inputs of the agent as a JSON object.")] = None,
    priority: Annotated[int, typer.Option(help="Higher runs first (-1000000 to 1000000).")] = 0,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Id of the new run (default: a fresh one).")] = None,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Queue a run for the workers serving its queue; prints its run id at once."""
    from .._workers.queues import enqueue as _enqueue

    refuse_empty("--run-id", run_id, "a fresh id")
    with errors_as_exit():
        data = json_object(inputs, "--inputs") if inputs is not None else None
        rid = _enqueue(agent, task, queue=queue, inputs=data, run_id=run_id, priority=priority, journal=open_store(url))
    if json_out:
        print_json({"run_id": rid, "queue": queue, "status": "queued"})
    else:
        typer.echo(rid)


@command
def queues(
    name: Annotated[str | None, typer.Argument(help="Declare (or change) this queue's limits; omit to list queues.")] = None,
    concurrency: Annotated[
        int | None, typer.Option(help="At most this many of its runs execute at once, across all workers.")
    ] = None,
    rate: Annotated[str | None, typer.Option(help="At most N runs start per period: N/SECONDS, e.g. 100/60 or 100/1m.")] = None,
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """List queues with their limits and queued/running counts, or declare one queue's limits."""
    from .._workers.queues import queue as _queue
    from .._workers.queues import queues as _queues

    with errors_as_exit():
        if name is None:
            if concurrency is not None or rate is not None:
                raise fail("--concurrency and --rate need a queue NAME", 2)
            rows = _queues(journal=open_store(url, create=False))  # listing reads: it never creates a store
        else:
            limit = _rate(rate) if rate is not None else None
            rows = [_queue(name, concurrency=concurrency, rate=limit, journal=open_store(url))]
    if json_out:
        print_json([q.to_dict() for q in rows])
        return
    typer.echo(f"{'QUEUE':<24} {'CONCURRENCY':>11} {'RATE':>12} {'QUEUED':>7} {'RUNNING':>7}")
    for q in rows:
        lim = "-" if q.concurrency is None else str(q.concurrency)
        per = "-" if q.rate is None else f"{q.rate[0]}/{q.rate[1]:g}s"
        typer.echo(f"{q.name:<24} {lim:>11} {per:>12} {q.queued:>7} {q.running:>7}")


def _rate(text: str) -> tuple[int, float]:
    """``100/60``, ``100/60s``, ``100/1m`` -> (100, 60.0)."""
    from .._durable.operate import parse_age
    from .._errors import EngrainError

    runs, sep, period = text.partition("/")
    if not sep or not runs.strip().isdigit() or len(runs.strip()) > 9:
        raise fail(f"--rate must be N/PERIOD, e.g. 100/60 or 100/1m, got {text!r}", 2)
    try:
        secs = parse_age(period)
    except EngrainError:
        raise fail(f"--rate must be N/PERIOD, e.g. 100/60 or 100/1m, got {text!r}", 2) from None
    return int(runs), secs
