"""A PostgreSQL connection that comes back after the server dropped it.

The journal, the memory store and the behavior cache each own one psycopg
connection, used only while holding the owner's lock. When the server goes
away (a restart, a failover, a killed backend), the lock's next outermost
entry opens a new connection first, so a worker, a server or an agent that
keeps running heals once the database is back, instead of failing every call
until the process restarts.

Two kinds of loss are told apart. A server that ends a session it is not
serving (a restart, ``pg_terminate_backend``, a crash of another backend)
says so on the socket before it closes it; an idle connection whose socket
has something to read is checked before the call is sent (:func:`dropped`),
so that call goes to the new connection and nothing fails. A loss the socket
does not show (a network partition, a host gone without a word) or one in the
middle of a call fails that call with :class:`~engrain.StorageError`: whether
its write landed is unknown, so it is never retried here; the next call
connects anew.

The connection is replaced only on the lock's outermost entry, never inside a
call: a transaction (or a pipeline) stays on the connection it began on and
fails whole when that connection is lost. Which driver errors are the store's
failure is :mod:`.failures`'s to say.
"""

from __future__ import annotations

import select
import threading
from collections.abc import Callable
from typing import Any

from .._errors import EngrainError, StorageError, StoreUnreachableError, StoreURLError
from ._common import redact_url

#: Seconds a new connection may take (unless the store URL sets ``connect_timeout``).
CONNECT_TIMEOUT = 10


class RevivingLock:
    """A re-entrant lock whose outermost entry first calls ``revive`` (set by the connection's owner).

    ``revive`` checks the connection (a flag read: ``psycopg.Connection.broken``)
    and replaces it when broken; it is called with the lock held.
    """

    __slots__ = ("_lock", "_depth", "revive")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0  # entries by the holding thread: only the holder reads or writes it
        self.revive: Callable[[], None] | None = None

    def __enter__(self) -> RevivingLock:
        self._lock.acquire()
        self._depth += 1
        revive = self.revive  # read once: the owner's close may clear it meanwhile
        if self._depth == 1 and revive is not None:
            try:
                revive()
            except BaseException:
                self._depth -= 1
                self._lock.release()
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        self._lock.release()

    def closed(self, what: str) -> None:
        """The owner closed its connection (called holding the lock): from now on, entering raises
        :class:`~engrain.EngrainError` saying so. Not a :class:`~engrain.StorageError`: no wait mends it."""
        def refuse() -> None:
            raise EngrainError(f"{what} was closed; open it again to use it")

        self.revive = refuse


#: How libpq starts its refusal of a URL's own values (a port that is no number, an unknown sslmode, as many
#: ports as hosts), said before it tries any server: the URL is wrong, not the server away.
_LIBPQ_BAD_VALUE = ("invalid ", "could not match ")


def connect(url: str) -> Any:
    """A first autocommit connection to ``url``, before anything was used.

    A server that cannot be reached is a :class:`~engrain.StoreUnreachableError` naming the store
    (password redacted); a value in the URL that libpq or psycopg refuses, a :class:`~engrain.StoreURLError`.
    """
    import psycopg

    try:
        return psycopg.connect(url, autocommit=True)
    except psycopg.OperationalError as e:
        # psycopg prefixes "connection is bad:" both to these and to a local socket that is not there.
        said = str(e).removeprefix("connection is bad:").strip()
        kind = StoreURLError if said.startswith(_LIBPQ_BAD_VALUE) else StoreUnreachableError
        raise kind(f"cannot connect to PostgreSQL at {redact_url(url)}: {redact_url(said)}") from e
    except psycopg.ProgrammingError as e:  # psycopg's own reading of a value (connect_timeout=abc)
        raise StoreURLError(f"store URL {redact_url(url)!r} has a bad value: {redact_url(str(e))}") from e


def reconnect(url: str, old: Any, setup: Callable[[Any], None] | None = None, advice: str | None = None) -> Any:
    """A new autocommit connection to ``url`` in place of the broken ``old`` (closed here), after ``setup``.

    A server still unreachable is a :class:`~engrain.StorageError` naming the store;
    the caller keeps ``old`` and the next call tries again.
    """
    import psycopg

    # A host that drops packets would hold the owner's lock for the system's TCP timeout (minutes).
    timeout = {} if "connect_timeout" in url else {"connect_timeout": CONNECT_TIMEOUT}
    try:
        db = psycopg.connect(url, autocommit=True, **timeout)
    except psycopg.Error as e:
        raise StorageError(redact_url(url), e, advice) from e
    try:
        if setup is not None:
            setup(db)
    except BaseException as e:
        db.close()
        if isinstance(e, psycopg.Error):
            raise StorageError(redact_url(url), e, advice) from e
        raise
    old.close()
    return db


def dropped(db: Any, idle: bool = True) -> bool:
    """True when the server dropped ``db`` (a psycopg connection; a closed one is not dropped).

    Either a call already met the loss (psycopg's ``broken``: a flag read), or
    ``db`` is ``idle`` (no statement's result left unread) and its socket has
    something to read: with nothing asked, that is the server's farewell (or a
    notice), so one ``SELECT 1`` tells which. A poll without waiting costs about
    a microsecond, beside a round trip's hundreds.
    """
    if db.broken:
        return True
    if not idle or db.closed or not _readable(db.fileno()):
        return False
    try:
        db.execute("SELECT 1")
    except Exception:  # a loss sets broken; any other failure is the next call's to report
        pass
    return bool(db.broken)


def _readable(fd: int) -> bool:
    """Whether ``fd`` has bytes to read (or was closed by the peer), without waiting."""
    if hasattr(select, "poll"):
        poller = select.poll()  # not select(): no limit on the descriptor's number
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])  # pragma: no cover - Windows
