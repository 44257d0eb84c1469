"""The ``engrain`` command line (typer).

One module per area registers its commands on :data:`app` (made in
:mod:`.common`, so the command modules never import this package). Modules import only
typer and the standard library at the top and import engrain's heavier parts
inside each command, so ``engrain --help`` and simple commands start fast.

May import: every pillar, and the other surfaces (``serve`` starts the server).
"""

from __future__ import annotations

from .common import app

# Registration happens on import; order is the order in --help.
from . import runs as _runs  # noqa: E402,F401
from . import operate as _operate  # noqa: E402,F401
from . import worker as _worker  # noqa: E402,F401
from . import routines as _routines  # noqa: E402,F401
from . import cache as _cache  # noqa: E402,F401
from . import demo as _demo  # noqa: E402,F401
from . import memory as _memory  # noqa: E402,F401
from . import serve as _serve  # noqa: E402,F401


def main() -> None:
    """Console-script entry point."""
    app()
