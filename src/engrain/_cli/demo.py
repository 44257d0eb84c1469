"""``engrain demo``: the tour of engrain on the embedded store (grows with each feature)."""

from __future__ import annotations

from typing import Annotated

import typer

from .common import command


@command
def demo(
    url: Annotated[str | None, typer.Option("--url", help="Store URL (default: a fresh store in ./.engrain/demo/).")] = None,
) -> None:
    """Tour engrain: durable runs (kill -9, resume), the behavior cache, routines, skill memory."""
    from .._demo import main as run_demo

    raise typer.Exit(run_demo(url))
