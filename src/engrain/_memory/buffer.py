"""The consolidation buffer's side of the memory store (mixed into :class:`~engrain._memory.store.MemoryStore`).

Deposits and recall events wait in ``engrain_mem_buffer``. A consolidation
*claims* rows under a token and a lease it renews while it works, and
:meth:`ConsolidationTables.commit` deletes them in the same transaction that
writes its articles, so each row is processed exactly once: a consolidation
that crashed leaves its claim to go stale, and a later one takes the rows over.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from .items import Article, BufferItem


class ConsolidationTables:
    """Buffer claims and a consolidation's atomic commit; needs the store's ``backend``, ``_x``, ``tx``,
    ``_lock``, ``put_article``, ``delete_article``, ``_fts_del`` and ``_bump``."""

    backend: str
    _lock: Any
    _x: Any
    tx: Any
    put_article: Any
    delete_article: Any
    _fts_del: Any
    _bump: Any

    def claim(self, token: str, limit: int | None, newest_first: bool, now: float, stale_after: float) -> list[BufferItem]:
        """Claim up to ``limit`` unclaimed buffer rows (or rows whose claim went stale)."""
        order = "DESC" if newest_first else "ASC"
        lim = "" if limit is None else f" LIMIT {int(limit)}"
        lock = " FOR UPDATE SKIP LOCKED" if self.backend == "postgres" else ""
        with self.tx():
            rows = self._x(
                "SELECT seq, kind, skill, ref, data, created FROM engrain_mem_buffer "
                f"WHERE claim IS NULL OR claimed_at < ? ORDER BY seq {order}{lim}{lock}", (now - stale_after,)).fetchall()
            seqs = [r[0] for r in rows]
            for i in range(0, len(seqs), 500):
                chunk = seqs[i:i + 500]
                self._x(f"UPDATE engrain_mem_buffer SET claim = ?, claimed_at = ? WHERE seq IN ({','.join('?' * len(chunk))})",
                        (token, now, *chunk))
        return [BufferItem(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5]) for r in rows]

    def renew_claim(self, token: str, now: float) -> None:
        """Extend the lease on the rows claimed with ``token`` (see :mod:`.consolidate`)."""
        with self.tx():
            self._x("UPDATE engrain_mem_buffer SET claimed_at = ? WHERE claim = ?", (now, token))

    def release(self, token: str, seqs: Sequence[int]) -> None:
        """Give claimed rows back to the buffer (their cluster failed; a later run retries them)."""
        with self.tx():
            for s in seqs:
                self._x("UPDATE engrain_mem_buffer SET claim = NULL, claimed_at = NULL WHERE seq = ? AND claim = ?", (s, token))

    def buffer_size(self) -> int:
        """Rows waiting in the buffer."""
        with self._lock:
            return int(self._x("SELECT COUNT(*) FROM engrain_mem_buffer").fetchone()[0])

    def commit(self, token: str, done: Sequence[int], upserts: Sequence[Article], deletes: Sequence[str],
               assign: dict[str, str], expect: dict[str, int] | None = None, purge: Sequence[int] = (),
               read: dict[str, str] | None = None) -> int:
        """Write one consolidation's outcome atomically and flush its buffer rows.

        ``done`` are buffer seqs processed (deleted here; raises if another
        consolidator took them over, which rolls everything back); ``upserts``
        are new or rewritten articles; ``deletes`` superseded article ids;
        ``assign`` maps record id -> article id; ``expect`` maps the id of each
        article this pass read and now rewrites or deletes to the version it
        read: if another consolidator changed it meanwhile, nothing is written.
        ``purge`` are seqs of expired records to delete (the count of those still expired is returned). ``read`` maps the id of each record an article was
        written from to the digest of the text it was written from: a record updated or forgotten since (whose
        own rewrite found no article citing it yet) writes nothing.
        """
        from .._errors import EngrainError

        with self.tx():
            ids = sorted(read or {})
            # Checked first (PostgreSQL: rows share-locked until the commit), before the articles are locked, so a
            # forget, which deletes records before articles, waits here instead of deadlocking with this commit.
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                have = dict(self._x(f"SELECT id, digest FROM engrain_mem_records WHERE id IN ({','.join('?' * len(chunk))})"
                                    + (" FOR SHARE" if self.backend == "postgres" else ""), chunk).fetchall())
                for rid in chunk:
                    if have.get(rid) != read[rid]:  # type: ignore[index]
                        raise EngrainError(f"record {rid} was {'updated' if rid in have else 'forgotten'} while this "
                                           "consolidation ran; nothing was written and its rows went back to the buffer")
            for aid, version in (expect or {}).items():
                row = self._x("SELECT version FROM engrain_mem_articles WHERE id = ?" +
                              (" FOR UPDATE" if self.backend == "postgres" else ""), (aid,)).fetchone()
                if row is None or int(row[0]) != version:
                    now_v = "deleted" if row is None else f"version {row[0]}"
                    raise EngrainError(f"article {aid} changed while this consolidation ran (read version {version}, "
                                       f"now {now_v}); nothing was written and its rows went back to the buffer")
            for i in range(0, len(done), 500):
                chunk = list(done[i:i + 500])
                cur = self._x(f"DELETE FROM engrain_mem_buffer WHERE claim = ? AND seq IN ({','.join('?' * len(chunk))})",
                              (token, *chunk))
                if cur.rowcount != len(chunk):
                    raise EngrainError(f"{len(chunk) - cur.rowcount} claimed buffer row(s) were taken over by another "
                                       "consolidation (claim went stale); nothing was written")
            for a in upserts:
                self.put_article(a)
            for aid in deletes:
                self.delete_article(aid)
            for rid, aid in assign.items():
                self._x("UPDATE engrain_mem_records SET article_id = ? WHERE id = ?", (aid, rid))
            gone: list[int] = []
            if purge:
                # Only what is still expired: a remember of the same text since the pass listed it renewed the
                # record (its id was returned to that caller), and deleting it would lose it.
                now = time.time()
                for i in range(0, len(purge), 500):
                    chunk = list(purge[i:i + 500])
                    gone += [r[0] for r in self._x(
                        f"DELETE FROM engrain_mem_records WHERE seq IN ({','.join('?' * len(chunk))}) "
                        "AND expires IS NOT NULL AND expires <= ? RETURNING seq", [*chunk, now]).fetchall()]
                # Deleted, not rewritten: indexes reload their mirror but keep their graph.
                self._fts_del(gone)
                self._bump("records_del")
            if upserts or deletes:
                self._bump("articles_gen")
            self._bump("consolidations")
            if done:
                self._x("INSERT INTO engrain_mem_state (name, value) VALUES ('cursor', ?) ON CONFLICT (name) DO UPDATE "
                        "SET value = CASE WHEN excluded.value > engrain_mem_state.value THEN excluded.value "
                        "ELSE engrain_mem_state.value END", (max(done),))
        return len(gone)
