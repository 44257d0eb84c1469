"""The ``engrain`` command line (typer).

One module per area registers its commands on :data:`app`. Modules import only
typer and the standard library at the top and import engrain's heavier parts
inside each command, so ``engrain --help`` and simple commands start fast.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="engrain",
    help="Memory for AI agents: durable runs, routines, a behavior cache and skill memory.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Registration happens on import; order is the order in --help.
from . import runs as _runs  # noqa: E402,F401
from . import routines as _routines  # noqa: E402,F401
from . import cache as _cache  # noqa: E402,F401
from . import demo as _demo  # noqa: E402,F401
from . import memory as _memory  # noqa: E402,F401
from . import serve as _serve  # noqa: E402,F401


def main() -> None:
    """Console-script entry point."""
    app()
