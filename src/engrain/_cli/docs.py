"""``engrain docs``: build this checkout's documentation site and serve it locally (MkDocs)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from .common import command, fail

#: The packages of the ``docs`` extra (module names), and how to get them.
DOCS_MODULES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
INSTALL_HINT = "pip install 'engrain[docs]' (or, in a clone: pip install -e '.[docs]')"


def find_config(start: Path | None = None) -> Path | None:
    """``mkdocs.yml`` of the current directory or a parent, else of the checkout engrain runs from."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "mkdocs.yml").is_file() and (folder / "docs").is_dir():
            return folder / "mkdocs.yml"
    checkout = Path(__file__).resolve().parents[3] / "mkdocs.yml"  # src/engrain/_cli/docs.py -> the clone
    return checkout if checkout.is_file() else None


def missing_modules() -> list[str]:
    """The docs extra's modules that cannot be imported here."""
    out = []
    for name in DOCS_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                out.append(name)
        except ModuleNotFoundError:  # a parent package is missing
            out.append(name)
    return out


@command
def docs(
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to serve on (127.0.0.1).")] = 8000,
    build_only: Annotated[bool, typer.Option("--build-only", help="Build the site (strictly) and exit; do not serve.")] = False,
    site_dir: Annotated[str | None, typer.Option("--site-dir", help="Where --build-only writes the site (default: site/ beside mkdocs.yml).")] = None,
) -> None:
    """Build the documentation site and serve it on http://127.0.0.1:PORT (needs the docs extra).

    The site is this checkout's docs/ with the API, CLI and HTTP references generated from the code. The build is strict: a broken link or a public name without a docstring fails it.
    """
    missing = missing_modules()
    if missing:
        raise fail(f"the docs extra is not installed (missing: {', '.join(missing)}); {INSTALL_HINT}")
    config = find_config()
    if config is None:
        raise fail("no mkdocs.yml here or in the checkout engrain runs from: the documentation sources "
                   "come with a clone of the repository (run engrain docs from it)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    base = [sys.executable, "-m", "mkdocs"]
    if build_only:
        args = [*base, "build", "--strict", "-f", str(config)] + (["-d", os.path.abspath(site_dir)] if site_dir else [])
        sys.stderr.write(f"building the documentation site from {config.parent / 'docs'} ...\n")
        raise typer.Exit(subprocess.call(args, env=env, cwd=config.parent))
    sys.stderr.write(f"building the documentation site; it will be served on http://127.0.0.1:{port}/ (Ctrl-C stops)\n")
    try:
        code = subprocess.call([*base, "serve", "--strict", "-f", str(config), "-a", f"127.0.0.1:{port}"],
                               env=env, cwd=config.parent)
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)
