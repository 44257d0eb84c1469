"""Journal backends and the URL that picks one.

SQLite URLs count slashes: ``sqlite://`` + ``/`` + the path, so
``sqlite:///data/engrain.db`` is ``data/engrain.db`` relative to the current
directory and ``sqlite:////srv/engrain.db`` (four slashes) is the absolute
``/srv/engrain.db``. A bare path (``./x.db``, ``/srv/x.db``) is SQLite too.
Other forms (``sqlite:/x.db``, ``sqlite://host/x.db``, ``sqlite:x.db``) are a
:class:`~engrain.ConfigError` that shows these, since a typo there used to
create an empty store somewhere unexpected. ``postgresql://`` /
``postgres://`` pick PostgreSQL. A ``?durability=normal|full`` query parameter
sets durability on either. ``open_journal(url, create=False)`` (the read-only
CLI commands) refuses a store that does not exist yet.

May import: ``_events`` and ``_errors`` only; every pillar builds on it.
"""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from .._errors import ConfigError
from .base import Journal

DEFAULT_URL = "sqlite:///.engrain/engrain.db"

__all__ = ["DEFAULT_URL", "Journal", "default_url", "open_journal", "parse_url"]


def default_url() -> str:
    """``$ENGRAIN_URL`` if set, else the embedded SQLite store in ``./.engrain/``."""
    return os.environ.get("ENGRAIN_URL") or DEFAULT_URL


def parse_url(url: str) -> tuple[str, str, dict[str, str]]:
    """Split a store URL into ``(backend, target, options)``.

    ``target`` is a file path for SQLite and a libpq URL (options removed) for
    PostgreSQL.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigError("store URL is empty; use sqlite:///path.db or postgresql://user@host/db")
    parts = urlsplit(url)
    options = dict(parse_qsl(parts.query))
    if parts.scheme in ("postgresql", "postgres"):
        # Keep the other parameters exactly as written (still percent-encoded) for libpq.
        query = "&".join(p for p in parts.query.split("&") if p and not p.startswith("durability="))
        return "postgres", urlunsplit(parts._replace(query=query)), options
    if parts.scheme == "sqlite":
        # sqlite:///rel.db -> path "/rel.db" (relative); sqlite:////abs.db -> "//abs.db" (absolute)
        if not url.split(":", 1)[1].startswith("///") or parts.netloc or len(parts.path) < 2:
            raise ConfigError(
                f"store URL {url!r} is not a SQLite URL engrain reads; use sqlite:///relative/path.db (relative to "
                "the current directory), sqlite:////absolute/path.db (four slashes), or a bare file path"
            )
        return "sqlite", parts.path[1:], options
    if parts.scheme == "" or len(parts.scheme) == 1:  # bare path (or a Windows drive letter)
        return "sqlite", url.split("?", 1)[0], options
    raise ConfigError(f"unknown store scheme {parts.scheme!r} in {url!r}; use sqlite:/// or postgresql://")


def open_journal(url: str | None = None, *, durability: str | None = None, create: bool = True) -> Journal:
    """Open the journal at ``url`` (default: :func:`default_url`).

    ``create=False`` refuses a store that does not exist yet with
    :class:`~engrain.StoreNotFoundError` instead of creating an empty one:
    what a command that only reads wants, so a mistyped URL is reported.
    """
    backend, target, options = parse_url(url or default_url())
    dur = durability or options.get("durability")
    if backend == "postgres":
        from .postgres import PostgresJournal

        return PostgresJournal(target, durability=dur or "full", create=create)
    from .sqlite import SQLiteJournal

    return SQLiteJournal(target, durability=dur or "normal", create=create)
