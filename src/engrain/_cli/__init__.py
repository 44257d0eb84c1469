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
    """Console-script entry point: usage errors are one line on stderr (exit 2), like engrain's own errors."""
    import sys

    try:
        code = app(standalone_mode=False)
    except Exception as e:  # noqa: BLE001 - only click's usage errors are handled here; the rest re-raise
        kind = type(e).__name__
        if kind == "NoArgsIsHelpError":  # a bare `engrain` or `engrain memory`: show the help as before
            app(args=[*sys.argv[1:], "--help"], standalone_mode=False)
            sys.exit(getattr(e, "exit_code", 2))
        if kind == "Abort":  # Ctrl-C or end of input at a prompt (click turns both into Abort)
            sys.stderr.write("error: interrupted\n")
            sys.exit(130)
        if not hasattr(e, "format_message") or not hasattr(e, "exit_code"):
            raise
        message = " ".join(str(e.format_message()).split())
        ctx = getattr(e, "ctx", None)
        where = getattr(ctx, "command_path", "") or "engrain"
        sys.stderr.write(f"error: {message} (see {where} --help)\n")
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
