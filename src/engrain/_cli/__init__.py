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
    from . import learned as _learned  # noqa: F401
    from . import cache as _cache  # noqa: F401
    from . import demo as _demo  # noqa: F401
    from . import memory as _memory  # noqa: F401
    from . import serve as _serve  # noqa: F401
    from . import docs as _docs  # noqa: F401

    return app


def __getattr__(name: str) -> Any:
    if name == "app":  # the typer app, with every command registered
        return _app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Console-script entry point: usage errors are one line on stderr (exit 2), like engrain's own errors.

    ``engrain run`` and ``engrain resume`` go through the fast path when they can. Long work
    shows progress on stderr (:mod:`.progress`), and a module named by ``--tools`` or
    ``--agents`` is found in the current directory, as uvicorn and celery find theirs.
    """
    import os

    from .._progress import set_reporter
    from .fast import main as fast_main
    from .progress import reporter

    if "" not in sys.path and os.getcwd() not in sys.path:  # the console script's path starts at its bin/
        sys.path.insert(0, os.getcwd())
    set_reporter(reporter())

    fast = fast_main(sys.argv[1:])
    if fast is not None:
        sys.exit(fast)
    app = _app()
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
        if "--json" in sys.argv[1:]:  # no command ran to read its --json: the line itself says it was asked
            from .routine_run import error_json

            error_json("UsageError", message)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
