"""engrain's own cache directory, and the checks that make a cached file safe to use.

Two things are cached on disk: the WASM sandbox's compiled CPython module
(:mod:`engrain._sandbox.wasi`, native code) and parsed ``routine.yaml`` data
(:mod:`engrain._routines.loader`). Neither may let a file on disk choose what
runs, so every entry is named by the content hash of what it was made from,
carries its own hash, and is used only from a directory and file owned by the
current user that nobody else can write (a group- or world-writable cache is not
used at all). Any doubt means a miss: the caller parses or compiles again.

The directory is ``$ENGRAIN_CACHE_DIR`` or ``~/.cache/engrain`` (configuration,
never data). May import: the standard library only.
"""

from __future__ import annotations

import os
import pathlib
import stat
from collections.abc import Callable
from typing import BinaryIO, TypeVar

try:  # CPython's own SHA-256: hashlib would load OpenSSL first (~10 ms of a CLI run's start-up)
    from _sha256 import sha256 as _sha256  # type: ignore[import-not-found]  # CPython <= 3.11
except ImportError:
    try:
        from _sha2 import sha256 as _sha256  # type: ignore[import-not-found,no-redef]  # CPython >= 3.12
    except ImportError:
        from hashlib import sha256 as _sha256  # type: ignore[assignment]

__all__ = ["cache_dir", "default_cache_dir", "digest", "is_private_dir", "is_private_file", "private_file_digest", "read_private", "read_verified", "write_private", "write_verified"]

_T = TypeVar("_T")


def default_cache_dir() -> pathlib.Path:
    """``$ENGRAIN_CACHE_DIR`` or ``~/.cache/engrain``."""
    env = os.environ.get("ENGRAIN_CACHE_DIR")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "engrain"


def digest(data: bytes) -> str:
    """The hex SHA-256 of ``data``."""
    if len(data) > 1 << 20:  # a compiled module: OpenSSL's SHA-256 is several times faster
        import hashlib

        return hashlib.sha256(data).hexdigest()
    return _sha256(data).hexdigest()


def _private(st: os.stat_result) -> bool:
    """Owned by this user and writable by nobody else (always true where there are no uids)."""
    if not hasattr(os, "geteuid"):
        return True
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def cache_dir(kind: str, root: pathlib.Path | None = None) -> pathlib.Path | None:
    """``root/kind`` (made private if new), or None when it is not safe to cache there."""
    path = (root or default_cache_dir()) / kind
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(os.stat(path)) or not _private(os.stat(path.parent)):
            return None
    except OSError:
        return None
    return path


def is_private_dir(path: pathlib.Path) -> bool:
    """Whether ``path`` is a directory (no symlink) owned by this user that nobody else can write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and _private(st)


def _use_private(path: pathlib.Path, use: Callable[[BinaryIO], _T]) -> _T | None:
    """``use(file)`` of ``path`` if it is a regular file (no symlink) owned by this user that others cannot write."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _private(st):
            return None
        with os.fdopen(fd, "rb") as f:
            fd = -1
            return use(f)
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def read_private(path: pathlib.Path) -> bytes | None:
    """The bytes of ``path`` if it is a regular file (no symlink) owned by this user that others cannot write."""
    return _use_private(path, lambda f: f.read())


def is_private_file(path: pathlib.Path) -> bool:
    """Whether ``path`` is a regular file (no symlink) owned by this user that others cannot write."""
    return _use_private(path, lambda f: True) is not None


def private_file_digest(path: pathlib.Path) -> str | None:
    """The hex SHA-256 of ``path`` read as :func:`read_private` would, without holding it in memory."""
    import hashlib

    return _use_private(path, lambda f: hashlib.file_digest(f, "sha256").hexdigest())


def read_verified(path: pathlib.Path) -> bytes | None:
    """The payload of a cache file written by :func:`write_verified`, or None if it is not one.

    The file must pass :func:`read_private`, and its payload must match the
    SHA-256 it carries.
    """
    blob = read_private(path)
    if blob is None:
        return None
    head, sep, payload = blob.partition(b"\n")
    if not sep or head != digest(payload).encode():
        return None
    return payload


def write_verified(path: pathlib.Path, payload: bytes) -> None:
    """Write ``payload`` with its SHA-256 for :func:`read_verified` (see :func:`write_private`)."""
    write_private(path, digest(payload).encode() + b"\n" + payload)


def write_private(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, readable by this user only.

    Best effort: a cache that cannot be written is simply not written.
    """
    import tempfile

    try:
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # a concurrent reader sees the old file or the whole new one
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
