"""Journal backends and the URL that picks one.

``sqlite:///relative.db``, ``sqlite:////abs/path.db`` or a bare path pick
SQLite; ``postgresql://`` / ``postgres://`` pick PostgreSQL. A
``?durability=normal|full`` query parameter sets durability on either.

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
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path:
            raise ConfigError(f"store URL {url!r} has no file path; use sqlite:///path/to/engrain.db")
        return "sqlite", path, options
    if parts.scheme == "" or len(parts.scheme) == 1:  # bare path (or a Windows drive letter)
        return "sqlite", url.split("?", 1)[0], options
    raise ConfigError(f"unknown store scheme {parts.scheme!r} in {url!r}; use sqlite:/// or postgresql://")


def open_journal(url: str | None = None, *, durability: str | None = None) -> Journal:
    """Open the journal at ``url`` (default: :func:`default_url`)."""
    backend, target, options = parse_url(url or default_url())
    dur = durability or options.get("durability")
    if backend == "postgres":
        from .postgres import PostgresJournal

        return PostgresJournal(target, durability=dur or "full")
    from .sqlite import SQLiteJournal

    return SQLiteJournal(target, durability=dur or "normal")
