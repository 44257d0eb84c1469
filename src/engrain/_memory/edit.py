"""``forget`` and ``update``: memory an agent (or its user) corrects.

Forgetting must leave no trace of the fact in what recall returns, so an
article built on a forgotten record is rewritten at once from its remaining
sources (through the synthesizer, an LLM call when one is configured), or
deleted when none remain. Forgetting an article forgets its source records
too: the article *is* their knowledge. ``forget(skill=...)`` clears a skill's
records, articles and buffer rows.

``update`` rewrites one record (new content, re-embedded; its article is
rewritten like after a forget) or one article (its text, and with ``label``
its title, replaced by hand; checked as ``remember`` checks its arguments).

A record has one home article (``article_id``: the one consolidation grows and
recall returns in its place), but other articles may cite it too: an import
whose article states a fact the receiving agent already knew cites that
agent's record. So the articles a record's change reaches are found by their
``sources``, never by ``article_id`` alone (:func:`citing`).

Every write is one transaction and bumps the tier's deletion counter (rows
gone: indexes reload their mirror, keep their graph) or generation (a vector
rewritten: indexes rebuild) so every process sees the change.
"""

from __future__ import annotations

import json
import time
from typing import Any

from .._errors import EngrainError, MemoryInputError
from .consolidate import citing, write_article
from .inputs import check_hint, check_metadata, check_str, new_row
from .items import to_blob

#: The Memory facade (typed loosely: this module must not import the package that imports it).
Memory = Any


def _delete_records(mem: Memory, ids: list[str]) -> int:
    """Delete records (rows, full text, pending deposits) inside a transaction; returns how many."""
    st = mem.store
    n = 0
    for i in range(0, len(ids), 500):
        chunk = ids[i:i + 500]
        marks = ",".join("?" * len(chunk))
        seqs = [int(r[0]) for r in st._x(f"SELECT seq FROM engrain_mem_records WHERE id IN ({marks})", chunk)]
        st._x(f"DELETE FROM engrain_mem_records WHERE id IN ({marks})", chunk)
        st._x(f"DELETE FROM engrain_mem_buffer WHERE kind = 'deposit' AND ref IN ({marks})", chunk)
        st._fts_del(seqs)
        n += len(seqs)
    return n


def _rewrite(mem: Memory, aids: set[str], now: float) -> tuple[int, int]:
    """Rewrite articles from their live sources (delete those left with none): ``(rewritten, deleted)``."""
    rewritten = deleted = 0
    for art in mem.store.articles(ids=sorted(aids)):
        live = [r for r in mem.store.records(art.sources).values() if r.expires is None or r.expires > now]
        new = write_article(mem, art.skill, live, art, now, []) if live else None
        with mem.store.tx():
            row = mem.store._x("SELECT version FROM engrain_mem_articles WHERE id = ?", (art.id,)).fetchone()
            if row is None or int(row[0]) != art.version:
                raise EngrainError(f"article {art.id} changed while it was being rewritten; run forget/update again")
            if new is None:
                mem.store.delete_article(art.id)
                deleted += 1
            else:
                mem.store.put_article(new)
                rewritten += 1
            mem.store._bump("articles_gen")
    return rewritten, deleted


def forget(mem: Memory, id: str | None, skill: str | None) -> dict[str, int]:
    """Delete a record, an article (with its sources) or a whole skill; see the module docstring."""
    if (id is None) == (skill is None):
        raise MemoryInputError("forget: give exactly one of id or skill=")
    st, now = mem.store, time.time()
    out = {"records": 0, "articles": 0, "rewritten": 0}
    if skill is not None:
        if not isinstance(skill, str):
            raise MemoryInputError(f"forget: skill must be a string, not {type(skill).__name__}")
        with st.tx():
            ids = [r[0] for r in st._x("SELECT id FROM engrain_mem_records WHERE skill = ?", (skill,))]
            out["records"] = _delete_records(mem, ids)
            for (aid,) in st._x("SELECT id FROM engrain_mem_articles WHERE skill = ?", (skill,)).fetchall():
                out["articles"] += st.delete_article(aid)
            st._x("DELETE FROM engrain_mem_buffer WHERE skill = ?", (skill,))
            st._bump("records_del")
            st._bump("articles_gen")
        return out
    if not isinstance(id, str) or not id:
        raise MemoryInputError(f"forget: id must be a record or article id, not {id!r}")
    rec = st.records([id]).get(id)
    if rec is not None:
        aids = citing(mem, [id], {rec.article_id} if rec.article_id else set())
        with st.tx():
            out["records"] = _delete_records(mem, [id])
            st._bump("records_del")
        if aids:
            out["rewritten"], out["articles"] = _rewrite(mem, aids, now)
        return out
    arts = st.articles(ids=[id])
    if not arts:
        raise MemoryInputError(f"forget: no record or article with id {id!r}")
    # Its sources may be cited by other articles (an import's): those lose them as after forgetting each.
    others = citing(mem, arts[0].sources) - {id}
    with st.tx():
        out["records"] = _delete_records(mem, arts[0].sources)
        out["articles"] = int(st.delete_article(id))
        st._bump("records_del")
        st._bump("articles_gen")
    if others:
        out["rewritten"], gone = _rewrite(mem, others, now)
        out["articles"] += gone
    return out


def update(mem: Memory, id: str, data: Any, hint: Any, label: str | None,
           metadata: dict[str, Any] | None) -> dict[str, Any]:
    """Replace a record's content (and optionally its hint, label, metadata) or an article's text."""
    if not isinstance(id, str) or not id:
        raise MemoryInputError(f"update: id must be a record or article id, not {id!r}")
    st, now = mem.store, time.time()
    rec = st.records([id]).get(id)
    if rec is not None:
        row = new_row(data, hint if hint is not None else rec.importance, rec.skill,
                      metadata if metadata is not None else rec.metadata, None, mem.ttl, now,
                      label if label is not None else rec.hint, step="update")
        vec = mem.embedder.embed([row["content"]])[0]
        with st.tx():
            clash = st._x("SELECT id FROM engrain_mem_records WHERE skill = ? AND digest = ? AND id <> ?",
                          (rec.skill, row["digest"], id)).fetchone()
            if clash is not None:
                raise MemoryInputError(f"update: record {clash[0]} of skill {rec.skill!r} already holds this content; "
                                       "forget one of them instead")
            vset = f", vec = ?::{st._vtype}" if st.pgvector else ""
            from .store import _vec_literal  # the pgvector text form, only needed with the extension

            vval = [_vec_literal(vec)] if st.pgvector else []
            st._x(f"UPDATE engrain_mem_records SET content = ?, hint = ?, metadata = ?, digest = ?, importance = ?, "
                  f"embedding = ?{vset} WHERE id = ?",
                  (row["content"], row["hint"], json.dumps(row["metadata"]), row["digest"], row["importance"],
                   to_blob(vec), *vval, id))
            st._fts_put(rec.seq, f"{row['hint']} {row['content']}", rec.skill, id, rec.expires)
            st._bump("records_gen")
        out: dict[str, Any] = {"id": id, "tier": "record", "rewritten": 0}
        aids = citing(mem, [id], {rec.article_id} if rec.article_id else set())
        if aids:
            out["rewritten"], _ = _rewrite(mem, aids, now)
        return out
    arts = st.articles(ids=[id])
    if not arts:
        raise MemoryInputError(f"update: no record or article with id {id!r}")
    art = arts[0]
    # The same checks as remember, all before anything is embedded or written.
    if not isinstance(data, str):
        raise MemoryInputError(f"update: an article's new content (data) must be non-empty text, "
                               f"not {type(data).__name__}")
    check_str(data, "data")
    importance = check_hint(hint, "update") if hint is not None else art.importance
    meta = check_metadata(metadata, "update") if metadata is not None else art.metadata
    if label is not None:  # an article's title is its label: recall's label= matches it
        art.title = check_str(label, "label").strip()
    art.content = data
    art.embedding = mem.embedder.embed([f"{art.title}\n{data}"])[0]
    art.importance = importance
    art.metadata = meta
    art.version += 1
    art.updated = now
    art.synthesizer = "edited by hand"
    with st.tx():
        st.put_article(art)
        st._bump("articles_gen")
    return {"id": id, "tier": "article", "version": art.version}
