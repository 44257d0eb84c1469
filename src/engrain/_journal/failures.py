"""What a database driver's error means for engrain: the store failed, it is corrupt, or neither.

The store failing (a full disk, an I/O error, a lost PostgreSQL connection, a lock
held past the timeout) is :class:`~engrain.StorageError`; a damaged SQLite file is
:class:`~engrain.StoreCorruptError`; anything else (a bug, a constraint) stays the
driver's error. The journal translates its own; :func:`storage_errors` does it for
the public methods of memory and the behavior cache, whose users should never
have to catch ``sqlite3`` or ``psycopg`` errors.
"""

from __future__ import annotations

import functools
import sqlite3
import sys
from collections.abc import Callable
from typing import Any

from .._errors import StorageError, StoreCorruptError
from ._common import redact_url

#: SQLite result codes (low byte) of a store that failed: BUSY LOCKED NOMEM READONLY IOERR FULL CANTOPEN PROTOCOL.
_STORAGE_CODES = frozenset({5, 6, 7, 8, 10, 13, 14, 15})
_CORRUPT_CODES = frozenset({11, 26})  # CORRUPT NOTADB

#: What a :class:`~engrain.StorageError` of memory or the behavior cache advises.
RETRY_ADVICE = "retry once the store works again: the next call connects anew"


def sqlite_failure(path: str, e: sqlite3.Error, advice: str | None = None) -> Exception:
    """The typed error for ``e`` on the SQLite file ``path``: corrupt, failed (disk, I/O, lock), or ``e`` itself."""
    code = getattr(e, "sqlite_errorcode", None)
    code = None if code is None else code & 0xFF
    text = str(e)
    if code in _CORRUPT_CODES or "not a database" in text or "malformed" in text:
        return StoreCorruptError(path, e)
    if "Could not decode to UTF-8" in text:  # damaged pages: the driver's message quotes the garbage
        column = text.split("column ", 1)[1].split(" ", 1)[0] if "column " in text else "a text"
        return StoreCorruptError(path, f"column {column} holds bytes that are not UTF-8 text")
    if code in _STORAGE_CODES or "disk" in text or "I/O" in text:
        return StorageError(path, e, advice)
    return e


def sqlite_rollback(db: sqlite3.Connection) -> None:
    """End the transaction a failed write left open on ``db``, never hiding that write's error: a COMMIT
    that failed on a full disk or an I/O error may have rolled back already, and a second ROLLBACK
    would then fail with "no transaction is active" instead."""
    if db.in_transaction:
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            pass


def is_outage(e: BaseException) -> bool:
    """True when ``e`` says the store is unavailable (a :class:`~engrain.StorageError`, or psycopg's
    ``OperationalError`` from code that does not wrap it): worth waiting for, unlike a bad request."""
    return isinstance(e, StorageError) or _lost_connection(e)


def _lost_connection(e: BaseException) -> bool:
    """psycopg's ``OperationalError`` (without importing psycopg where nothing used it)."""
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(e, psycopg.OperationalError)


def storage_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """A method of an object with a store ``url`` whose store failures are typed, as the journal's are: a
    lost PostgreSQL connection (psycopg's ``OperationalError``) is a :class:`~engrain.StorageError` naming
    the store (password redacted), and an SQLite error is what :func:`sqlite_failure` makes of it."""

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as e:
            typed = sqlite_failure(_sqlite_path(self.url), e, RETRY_ADVICE)
            if typed is e:
                raise
            raise typed from e
        except Exception as e:
            if _lost_connection(e):
                raise StorageError(redact_url(self.url), e, RETRY_ADVICE) from e
            raise

    return call


def _sqlite_path(url: str) -> str:
    return url[len("sqlite:///"):] if url.startswith("sqlite:///") else url
