"""The ``engrain`` command line (typer).

One module per area registers its commands on the typer app (made in
:mod:`.common`, so the command modules never import this package). Modules import only
typer and the standard library at the top and import engrain's heavier parts
inside each command, so ``engrain --help`` and simple commands start fast.
``engrain run`` and ``engrain resume`` first try the fast path (:mod:`.fast`),
which reads their options without importing typer at all.

May import: every pillar, and the other surfaces (``serve`` starts the server).
"""

from __future__ import annotations

import sys
from typing import Any


def _app() -> Any:
    from .common import app

    # Registration happens on import; order is the order in --help.
    from . import runs as _runs  # noqa: F401
    from . import operate as _operate  # noqa: F401
    from . import worker as _worker  # noqa: F401
    from . import routines as _routines  # noqa: F401
    from . import cache as _cache  # noqa: F401
    from . import demo as _demo  # noqa: F401
    from . import memory as _memory  # noqa: F401
    from . import serve as _serve  # noqa: F401

    return app


def __getattr__(name: str) -> Any:
    if name == "app":  # the typer app, with every command registered
        return _app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Console-script entry point."""
    from .fast import main as fast_main

    code = fast_main(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    _app()()
