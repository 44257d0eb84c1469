"""``engrain runs``, ``engrain show``, ``engrain export``: read the journal."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

import typer

from .._durable.steps import replayed_steps
from .common import JsonOption, UrlOption, command, errors_as_exit, open_store, print_json


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _one_line(text: str) -> str:
    """``text`` on one line: newlines and other control characters shown escaped, so one event is one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _short(value: Any, width: int = 60) -> str:
    import json

    text = _one_line(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str))
    return text if len(text) <= width else text[: width - 1] + "…"


def _full(value: Any) -> str:
    """An error text in full (never cut: it is what the reader came for), on one line."""
    return _one_line(str(value or ""))


@command
def runs(
    url: UrlOption = None,
    status: Annotated[str | None, typer.Option(help="Only runs in this status (ok, failed, needs_input, running, queued, cancelled).")] = None,
    tag: Annotated[str | None, typer.Option(help="Only runs with this tag.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many runs.")] = 50,
    json_out: JsonOption = False,
) -> None:
    """List runs, most recently updated first."""
    with errors_as_exit():
        j = open_store(url, create=False)
        rows = j.runs(status=status, tag=tag, limit=limit)
    if json_out:
        print_json([r.to_dict() for r in rows])
        return
    if not rows:
        typer.echo("no runs yet")
        return
    typer.echo(f"{'RUN ID':<26} {'STATUS':<12} {'EVENTS':>6}  {'UPDATED':<19}  TASK")
    for r in rows:
        typer.echo(f"{r.run_id:<26} {r.status:<12} {r.next_seq:>6}  {_when(r.updated):<19}  {_short(r.task, 50)}")


def timeline(events: list) -> list[str]:
    """Readable lines for a run's events: one per step, with its duration and outcome."""
    lines = []
    t0 = events[0].ts if events else 0.0
    started: dict[int, Any] = {}
    for e in events:
        d = e.data
        at = f"+{(e.ts - t0) * 1000:9.1f}ms"
        if e.kind == "run.started":
            lines.append(f"{at}  run started: {_short(d.get('task', ''))}  inputs={_short(d.get('inputs', {}), 50)}")
        elif e.kind == "step.started":
            started[d["call_id"]] = e
            if d.get("attempt", 1) > 1:
                lines.append(f"{at}  step {d['call_id']:>3} {_one_line(e.name)}  retry (attempt {d['attempt']}) after a crash")
        elif e.kind == "step.completed":
            s = started.get(d["call_id"])
            # A completion-only step (the default) carries its arguments and start time itself.
            # Its own start: t0 stays the run's start, which every line's offset is measured from.
            begun = d.get("started") if "started" in d else (s.ts if s else None)
            dur = f"{(e.ts - begun) * 1000:.1f}ms" if isinstance(begun, (int, float)) else "?"
            args = _short(d["args"] if "args" in d else (s.data.get("args", {}) if s else ""), 40)
            lines.append(f"{at}  step {d['call_id']:>3} {_one_line(e.name)}({args}) -> {_short(d.get('result'), 40)}  [{dur}]")
        elif e.kind == "step.failed" and "retry_in" in d:
            lines.append(
                f"{at}  step {d['call_id']:>3} {_one_line(e.name)} attempt {d.get('attempt', 1)} failed"
                f" {d.get('error_type')}: {_short(d.get('message', ''))}; retry in {d['retry_in']:.2f}s"
            )
        elif e.kind == "step.failed":
            lines.append(f"{at}  step {d['call_id']:>3} {_one_line(e.name)} FAILED {d.get('error_type')}: {_full(d.get('message'))}")
        elif e.kind == "replay.completed":  # a cache hit journaled at its end: its steps in one event
            lines.append(f"{at}  replayed cached trajectory {_one_line(e.name)}")
            for cid, (name, _type, args, result, begun) in replayed_steps(d):
                dur = f"{(e.ts - begun) * 1000:.1f}ms" if isinstance(begun, (int, float)) else "?"
                lines.append(f"{at}  step {cid:>3} {_one_line(name)}({_short(args, 40)}) -> {_short(result, 40)}  [{dur}]")
        elif e.kind == "input.requested":
            lines.append(f"{at}  waiting for input: {_short(d.get('prompt', ''))}")
        elif e.kind == "input.received":
            lines.append(f"{at}  input received: {_short(d.get('answers'))}")
        elif e.kind == "run.completed":
            lines.append(f"{at}  run completed -> {_short(d.get('output'))}")
        elif e.kind == "log.entry":  # an adapter's entry (a LangGraph checkpoint, a session item)
            lines.append(f"{at}  {e.name} {_short(d.get('summary', {}))}")
        elif e.kind == "run.failed":
            lines.append(f"{at}  run FAILED: {_full(d.get('error'))}")
            tb = d.get("traceback")
            if isinstance(tb, str) and tb.strip():
                # Indented under the failure so the timeline's columns stay readable.
                lines += [f"{'':14}{line}" for line in tb.rstrip().splitlines()]
        else:
            lines.append(f"{at}  {e.kind} {_one_line(e.name)} {_short(d)}")
    return lines


@command
def show(
    run_id: Annotated[str, typer.Argument(help="The run to show.")],
    url: UrlOption = None,
    json_out: JsonOption = False,
) -> None:
    """Show one run as a readable timeline of its events."""
    from .._durable.trace import export_run

    with errors_as_exit():
        j = open_store(url, create=False)
        trace = export_run(j, run_id)
    if json_out:
        print_json(trace)
        return
    from .._events import Event

    run = trace["run"]
    typer.echo(f"run {run['run_id']}  status={run['status']}  events={run['events']}  task={_short(run['task'])}")
    for line in timeline([Event.from_dict(e) for e in trace["events"]]):
        typer.echo(line)


@command
def export(
    run_id: Annotated[str, typer.Argument(help="The run to export.")],
    url: UrlOption = None,
) -> None:
    """Print a run's trace as JSON (engrain export RUN_ID > trace.json)."""
    from .._durable.trace import export_run

    with errors_as_exit():
        trace = export_run(open_store(url, create=False), run_id)
    print_json(trace)
