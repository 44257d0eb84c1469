"""Where a vector graph's files live, how they are written, and when a cached one is removed.

A graph (usearch HNSW, :class:`~engrain._memory.index.VectorIndex`) is saved with a JSON
sidecar recording what it covers and the graph file's digest. On SQLite both sit beside the
database; a PostgreSQL store has no file of its own, so its graph is kept in this machine's
cache folder (:func:`pg_graph_path`), where nothing else would ever remove the graph of a
store that was dropped: saving one removes those unused for :data:`GRAPH_CACHE_DAYS`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("engrain.memory")

#: Days a cached PostgreSQL graph may go unused (neither loaded nor saved) before the next save of another
#: store's graph removes it: a dropped or moved store's graph (at 1M rows ~800 MB) would otherwise stay forever.
GRAPH_CACHE_DAYS = 14.0
_CACHED = re.compile(r"pg-[0-9a-f]{32}\.(record|article)\.usearch(\.json)?(\.[A-Za-z0-9_]+\.tmp)?")


def pg_graph_path(store: Any, tier: str) -> Path | None:
    """Where a PostgreSQL store's graph is cached on this machine: ``$ENGRAIN_CACHE_DIR/graphs`` (a private folder;
    None, no cache, when it is not), named by a digest of the server's address (password masked) and the store's
    identity, so neither names a path and two stores never share a file. (Two copies of one store reached by the
    same address would: the sidecar then checks which rows the graph holds, and hits are scored exactly.)"""
    from .._disk_cache import cache_dir
    from .._journal import redact_url

    folder = cache_dir("graphs")
    if folder is None:
        return None
    key = hashlib.sha256(f"{redact_url(store.url or '')}\0{store.identity()}".encode()).hexdigest()[:32]
    return folder / f"pg-{key}.{tier}.usearch"


def mark_used(*paths: Path) -> None:
    """Note that a cached graph was just used (its files' times), so :func:`prune_graph_cache` keeps it."""
    for p in paths:
        with contextlib.suppress(OSError):
            os.utime(p)


def prune_graph_cache(folder: Path, days: float = GRAPH_CACHE_DAYS, now: float | None = None) -> int:
    """Remove the graphs (and sidecars, and temp files a crash left) in the cache ``folder`` unused for ``days``;
    returns how many files went. Only files named as :func:`pg_graph_path` names them are touched; a store whose
    graph went rebuilds it on its next recall, as after any cache loss."""
    cutoff = (time.time() if now is None else now) - days * 86400.0
    gone = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for e in entries:
        if not _CACHED.fullmatch(e.name):
            continue
        with contextlib.suppress(OSError):  # another process may remove or replace it meanwhile
            if e.is_file(follow_symlinks=False) and e.stat(follow_symlinks=False).st_mtime < cutoff:
                os.unlink(e.path)
                gone += 1
    if gone:
        log.info("removed %d graph cache files unused for %g days from %s", gone, days, folder)
    return gone


def file_digest(path: Path) -> tuple[str, int]:
    """SHA-256 and size of the file at ``path``, read in 4 MB chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def write_graph(ann: Any, graph_path: Path, meta_path: Path, meta: dict[str, Any], mode: int) -> None:
    """Save ``ann`` to ``graph_path`` and ``meta`` (with the graph's digest and size) to ``meta_path``, each
    through a temp file of permissions ``mode`` renamed into place; raises ``OSError``/``RuntimeError``."""
    tmps: list[str] = []
    try:
        for _ in range(2):
            fd, tmp = tempfile.mkstemp(dir=graph_path.parent, prefix=graph_path.name + ".", suffix=".tmp")
            os.close(fd)
            tmps.append(tmp)
            os.chmod(tmp, mode)
        ann.save(tmps[0])
        meta = {**meta}
        meta["graph_sha256"], meta["graph_bytes"] = file_digest(Path(tmps[0]))
        Path(tmps[1]).write_text(json.dumps(meta))
        # Graph first, sidecar second: a crash in between leaves a sidecar whose
        # digest does not match the graph, which the next load detects.
        os.replace(tmps[0], graph_path)
        os.replace(tmps[1], meta_path)
    finally:
        for tmp in tmps:
            with contextlib.suppress(OSError):  # already renamed, or never written
                os.unlink(tmp)
