"""Journal backends and the URL that picks one.

SQLite URLs count slashes: ``sqlite://`` + ``/`` + the path, so
``sqlite:///data/engrain.db`` is ``data/engrain.db`` relative to the current
directory and ``sqlite:////srv/engrain.db`` (four slashes) is the absolute
``/srv/engrain.db``. A bare path (``./x.db``, ``/srv/x.db``) is SQLite too.
Other forms (``sqlite:/x.db``, ``sqlite://host/x.db``, ``sqlite:x.db``) are a
:class:`~engrain.StoreURLError` that shows these, since a typo there used to
create an empty store somewhere unexpected; so are an unknown scheme, a
scheme with a typo (``postgresql//host/db``, ``postgres:/db``) and a query
parameter nobody reads (``?durabilty=full``). ``postgresql://`` /
``postgres://`` pick PostgreSQL. A ``?durability=normal|full`` query parameter
sets durability on either. ``open_journal(url, create=False)`` (the read-only
CLI commands) refuses a store that does not exist yet.

May import: ``_events`` and ``_errors`` only; every pillar builds on it.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from .._errors import StoreURLError
from ._common import check_run_id, redact_url
from .base import Journal

DEFAULT_URL = "sqlite:///.engrain/engrain.db"

__all__ = ["DEFAULT_URL", "Journal", "check_run_id", "default_url", "open_journal", "parse_url", "redact_url", "refuse_newer_store"]


def default_url() -> str:
    """``$ENGRAIN_URL`` if set, else the embedded SQLite store in ``./.engrain/``."""
    return os.environ.get("ENGRAIN_URL") or DEFAULT_URL


#: The store URLs engrain reads, for errors about one it does not.
FORMS = ("sqlite:///relative/path.db (relative to the current directory), sqlite:////absolute/path.db "
         "(four slashes), a bare file path, or postgresql://user[:password]@host[:port]/dbname (postgres:// too)")
_SCHEMES = ("postgresql", "postgres", "sqlite")
#: Query parameters engrain itself reads (PostgreSQL URLs also take libpq's own).
OPTIONS = ("durability",)


def _bad(url: str, why: str) -> StoreURLError:
    return StoreURLError(f"store URL {redact_url(url)!r} {why}; use {FORMS}")


def _libpq_keywords() -> set[str] | None:
    try:
        from psycopg import pq

        return {o.keyword.decode() for o in pq.Conninfo.get_defaults()}
    except Exception:  # noqa: BLE001 - no psycopg (or no libpq): libpq judges the URL when connecting
        return None


def parse_url(url: str | os.PathLike[str]) -> tuple[str, str, dict[str, str]]:
    """Split a store URL into ``(backend, target, options)``.

    ``target`` is a file path for SQLite and a libpq URL (options removed) for
    PostgreSQL. Unknown schemes, malformed URLs (a missing ``:`` or ``//``) and
    unknown query parameters are a :class:`~engrain.StoreURLError` (a ConfigError) listing the forms accepted.
    """
    if isinstance(url, os.PathLike):  # a pathlib.Path is a bare file path
        url = os.fspath(url)
    if not isinstance(url, str):
        raise StoreURLError(f"a store URL is a string or a path, not {type(url).__name__}; use {FORMS}")
    if not url.strip():
        raise StoreURLError(f"store URL is empty; use {FORMS}")
    parts = urlsplit(url)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    scheme = parts.scheme.lower()
    if scheme in ("postgresql", "postgres"):
        if not url.split(":", 1)[1].startswith("//"):
            raise _bad(url, "is malformed (no // after the scheme)")
        libpq = _libpq_keywords()
        unknown = sorted(k for k in options if k not in OPTIONS and libpq is not None and k not in libpq)
        if unknown:
            raise _bad(url, f"has unknown query parameter(s) {', '.join(unknown)} (engrain reads {', '.join(OPTIONS)}; "
                       "the others go to libpq and must be its parameters, e.g. sslmode, connect_timeout, options)")
        # Keep the other parameters exactly as written (still percent-encoded) for libpq.
        query = "&".join(p for p in parts.query.split("&") if p and not p.startswith("durability="))
        # Cut by hand: urlunsplit drops an empty authority, and postgresql:///db (the local socket) became
        # postgresql:/db, which libpq cannot read.
        target = url.split("?", 1)[0] + (f"?{query}" if query else "")
        if libpq is not None:
            from psycopg.conninfo import conninfo_to_dict

            try:
                conninfo_to_dict(target)
            except Exception as e:  # noqa: BLE001 - psycopg's ProgrammingError: libpq could not parse it
                raise _bad(url, f"is malformed ({redact_url(str(e))})") from None
        return "postgres", target, options
    if scheme == "sqlite":
        # sqlite:///rel.db -> path "/rel.db" (relative); sqlite:////abs.db -> "//abs.db" (absolute)
        if not url.split(":", 1)[1].startswith("///") or parts.netloc or len(parts.path) < 2:
            raise _bad(url, "is not a SQLite URL engrain reads")
        _sqlite_options(url, options)
        return "sqlite", parts.path[1:], options
    if scheme == "" or len(scheme) == 1:  # bare path (or a Windows drive letter)
        head = url.lstrip().split("/", 1)[0].rstrip(":").lower()
        if head in _SCHEMES and url.lstrip()[len(head):].startswith(("//", ":")):
            raise _bad(url, f"looks like a {head} URL with a typo, not a file path")
        _sqlite_options(url, options)
        return "sqlite", url.split("?", 1)[0], options
    raise _bad(url, f"has an unknown scheme {parts.scheme!r}")


def _sqlite_options(url: str, options: dict[str, str]) -> None:
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise _bad(url, f"has unknown query parameter(s) {', '.join(unknown)} (a SQLite store reads {', '.join(OPTIONS)})")


def open_journal(url: str | os.PathLike[str] | None = None, *, durability: str | None = None, create: bool = True) -> Journal:
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


def refuse_newer_store(db: Any, backend: str, store: str) -> None:
    """Raise :class:`~engrain.StoreVersionError` if the database behind ``db`` was written by a newer engrain.

    For the openers that add their own tables next to the journal's (memory, the
    behavior cache): they read the store's schema version as the journal does and
    write nothing into a store whose version this engrain does not know. A
    database without engrain's tables yet is fine. ``db`` is an open sqlite3 or
    psycopg connection in autocommit mode, closed when refused; ``store`` names it in the error.
    """
    from .._errors import StoreVersionError
    from .sqlite_schema import VERSION

    if backend == "sqlite":
        exists = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'engrain_meta'").fetchone()
    else:
        exists = db.execute("SELECT to_regclass('engrain_meta')").fetchone()[0]
    if not exists:
        return
    row = db.execute("SELECT value FROM engrain_meta WHERE key = 'journal'").fetchone()
    found = int(row[0]) if row is not None and str(row[0]).isdigit() else 0
    if found > VERSION:
        db.close()
        raise StoreVersionError(store, found, VERSION)
