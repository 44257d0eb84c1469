"""Transfer of knowledge between agents: ``export`` and ``import_``.

``export`` writes one JSON document per article (format
:data:`FORMAT`: the article, its provenance and the text of its source
records) under ``export/<UTC timestamp>/`` and returns etchmem's dict
``{"export_dir", "count", "documents"}``.

``import_`` loads such an export (the folder, or the dict ``export``
returned) into another memory: each article with the records it was built
from, already consolidated (no buffer deposit), so the receiving agent
recalls the same knowledge with the same provenance. The imported article's
id is derived from the exported id and the target skill, which makes a second
import of the same export a no-op and a later export of a rewritten article
an update. ``skill_map`` files skills under other names (a dict, or one
skill name for everything). etchmem's own export documents (``content``,
``source_hashes``, no sources' text) import as an article backed by one
record holding its text.

Documents are data, never code: each is size-checked, type-checked and
re-embedded by the receiving memory's own embedder (no vector is read from
a file).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import re
import shutil
import stat
import time
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import EngrainError, MemoryInputError
from .inputs import check_metadata, check_str, check_text, new_row
from .items import Article

#: The Memory facade (typed loosely: this module must not import the package that imports it).
Memory = Any

FORMAT = "engrain.memory.article/1"
#: Limits of one import: documents, bytes per document file, sources per article, characters per text.
MAX_DOCS, MAX_FILE, MAX_SOURCES, MAX_TEXT = 100_000, 10 << 20, 10_000, 1_000_000


def export(mem: Memory) -> dict[str, Any]:
    """Write every article as ``<id>.json`` in a new timestamped folder; etchmem's result dict.

    A source record past its TTL is written as ``{"id", "expired": true}`` without its text, a live one with
    its ``expires`` (so an import keeps its lifetime), and an article none of whose sources is live is left
    out (recall no longer returns it; the next consolidation removes it). The folder appears whole or not
    at all: every document is encoded first, written in a hidden folder, then renamed into place.
    """
    now = time.time()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    root = mem.export_dir()
    out = root / stamp
    docs, files = [], []
    for a in mem.store.articles():
        srcs = {k: r for k, r in mem.store.records(a.sources).items() if r.expires is None or r.expires > now}
        if not srcs:
            continue
        doc = {
            "format": FORMAT, "id": a.id, "skill": a.skill, "title": a.title, "content": a.content,
            "version": a.version, "created": a.created, "updated": a.updated, "synthesizer": a.synthesizer,
            "importance": a.importance, "metadata": a.metadata,
            "sources": [{"id": s, **({"content": srcs[s].content, "hint": srcs[s].hint, "label": srcs[s].hint,
                                      "importance": srcs[s].importance, "created": srcs[s].created,
                                      "expires": srcs[s].expires, "metadata": srcs[s].metadata}
                                     if s in srcs else {"expired": True})}
                        for s in a.sources],
        }
        try:
            data = (json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
        except (ValueError, UnicodeEncodeError) as e:  # stored before its metadata was checked on the way in
            raise EngrainError(f"export: article {a.id!r} holds a value JSON cannot carry ({e}); fix it with "
                               "update(id, ..., metadata=) or forget it, then export again") from None
        files.append((f"{a.id}.json", data))
        docs.append(doc)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{stamp}.partial"
    tmp.mkdir()
    try:
        for name, data in files:
            (tmp / name).write_bytes(data)
        if out.exists():
            raise EngrainError(f"export: {out} exists already")
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"export_dir": str(out.resolve()), "count": len(docs), "documents": docs}


def _load(source: Any) -> tuple[list[tuple[str, Any]], str]:
    """``[(where, document)]`` from a folder or an export result, and a name for the origin."""
    if isinstance(source, dict):
        if source.get("documents") is not None and not isinstance(source["documents"], list):
            raise MemoryInputError(f"import: field 'documents' must be a list of export documents, not "
                                   f"{type(source['documents']).__name__}")
        if isinstance(source.get("documents"), list):
            docs = source["documents"]
            if len(docs) > MAX_DOCS:
                raise MemoryInputError(f"import: {len(docs)} documents; at most {MAX_DOCS}")
            return [(f"documents[{i}]", d) for i, d in enumerate(docs)], str(source.get("export_dir") or "(documents)")
        source = source.get("export_dir")
    if not isinstance(source, (str, os.PathLike)):
        raise MemoryInputError("import: give an export folder or the dict export() returned, "
                               f"not {type(source).__name__}")
    folder = Path(source)
    if not folder.is_dir():
        raise MemoryInputError(f"import: {folder} is not a folder")
    files = sorted(p for p in folder.iterdir() if p.suffix == ".json" and p.is_file())
    if len(files) > MAX_DOCS:
        raise MemoryInputError(f"import: {folder} holds {len(files)} documents; at most {MAX_DOCS}")
    out = []
    for p in files:
        # A link would read a file outside the export (any *.json the importing user can read) into memory,
        # and a FIFO would block the import: opened without following links or waiting, then checked.
        if p.is_symlink():
            raise MemoryInputError(f"import: {p} is a symbolic link; an export folder holds its documents as files")
        try:
            fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise MemoryInputError(f"import: {p} is not a regular file")
                data = f.read(MAX_FILE + 1)  # bounded: the file may grow after it was listed
        except OSError as e:
            raise MemoryInputError(f"import: {p} is not readable: {e}") from None
        if len(data) > MAX_FILE:
            raise MemoryInputError(f"import: {p} is larger than {MAX_FILE} bytes")
        try:
            out.append((str(p), json.loads(data.decode("utf-8"))))
        except (ValueError, RecursionError) as e:
            raise MemoryInputError(f"import: {p} is not readable JSON: {e}") from None
    return out, str(folder)


def _text(doc: dict[str, Any], key: str, where: str, *, required: bool = True) -> str:
    v = doc.get(key)
    if v is None and not required:
        return ""
    if not isinstance(v, str) or (required and not v.strip()):
        raise MemoryInputError(f"import: {where}: field {key!r} must be non-empty text")
    if len(v) > MAX_TEXT:
        raise MemoryInputError(f"import: {where}: field {key!r} is longer than {MAX_TEXT} characters")
    check_text(v, f"import: {where}: field {key!r}")
    return v


def _num(v: Any, default: float | None) -> float | None:
    """``v`` as a finite float, else ``default`` (an infinite time would reach the export as non-JSON)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return default
    try:
        f = float(v)
    except OverflowError:  # an integer past a float's range
        return default
    return f if math.isfinite(f) else default


def _target_skill(skill: str, skill_map: dict[str, str] | str | None) -> str:
    if isinstance(skill_map, str):
        return skill_map
    if isinstance(skill_map, dict):
        return skill_map.get(skill, skill)
    return skill


def import_(mem: Memory, source: Any, skill_map: dict[str, str] | str | None) -> dict[str, Any]:
    """Load an export into ``mem``; returns ``{"imported", "updated", "unchanged", "records", "articles"}``.

    Every document is checked (and its rows built) before the first is written, so a bad one anywhere
    refuses the whole import with a :class:`MemoryInputError` naming it and its field.
    """
    if skill_map is not None and not isinstance(skill_map, (str, dict)):
        raise MemoryInputError(f"import: skill_map must be a dict or a skill name, not {type(skill_map).__name__}")
    if isinstance(skill_map, dict) and not all(isinstance(k, str) and isinstance(v, str) for k, v in skill_map.items()):
        raise MemoryInputError("import: skill_map must map skill names (text) to skill names (text)")
    docs, origin = _load(source)
    summary: dict[str, Any] = {"imported": 0, "updated": 0, "unchanged": 0, "records": 0, "articles": []}
    now = time.time()
    ready = []
    for where, doc in docs:
        if not isinstance(doc, dict):
            raise MemoryInputError(f"import: {where} is not a JSON object")
        ready.append(_check(mem, doc, where, origin, skill_map, now))
    for one in ready:
        if one is not None:
            _write(mem, one, now, summary)
    return summary


def _check(mem: Memory, doc: dict[str, Any], where: str, origin: str, skill_map: dict[str, str] | str | None,
           now: float) -> dict[str, Any] | None:
    """One document checked as ``remember`` checks its arguments: its article and rows, not yet embedded (None:
    every source it carried has expired since the export)."""
    orig_id = _text(doc, "id", where)
    where = f"{where} (id {orig_id!r})"
    content = _text(doc, "content", where)
    skill = _target_skill(_text(doc, "skill", where, required=False), skill_map)
    try:
        check_str(skill, "skill", empty_ok=True)
    except MemoryInputError as e:
        raise MemoryInputError(f"import: {where}: field 'skill': {e}") from None
    title = _text(doc, "title", where, required=False).strip()
    if not title:
        words = re.findall(r"\S+", content)
        title = " ".join(words[:8]) + ("…" if len(words) > 8 else "")
    meta = doc.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise MemoryInputError(f"import: {where}: field 'metadata' must be an object, not {type(meta).__name__}")
    meta = dict(meta or {})
    if doc.get("tags") not in (None, [], {}) and "tags" not in meta:  # etchmem's tags: kept as metadata
        meta["tags"] = doc["tags"]
    version = doc.get("version")
    version = version if isinstance(version, int) and not isinstance(version, bool) and 1 <= version < 2**63 else 1
    # etchmem names it created_at
    created = _num(doc.get("created"), None) if doc.get("created") is not None else _num(doc.get("created_at"), None)
    synth = doc.get("synthesizer") if isinstance(doc.get("synthesizer"), str) else None
    srcs = doc.get("sources")
    if srcs is None:  # etchmem's export: the article text is all there is
        hashes = doc.get("source_hashes") or []
        if not isinstance(hashes, list):
            raise MemoryInputError(f"import: {where}: field 'source_hashes' must be a list, not {type(hashes).__name__}")
        srcs = [{"id": h, "expired": True} for h in hashes if isinstance(h, str)]
    if not isinstance(srcs, list) or len(srcs) > MAX_SOURCES:
        raise MemoryInputError(f"import: {where}: sources must be a list of at most {MAX_SOURCES}")
    texts = [(i, s) for i, s in enumerate(srcs)
             if isinstance(s, dict) and isinstance(s.get("content"), str) and s["content"].strip()]
    # A source whose TTL ran out after the export stays expired here: its text is not brought back.
    live = [(i, s) for i, s in texts if _num(s.get("expires"), math.inf) > now]  # type: ignore[operator]
    if texts and not live:
        return None
    provenance = {"from_id": orig_id, "from_skill": doc.get("skill") if isinstance(doc.get("skill"), str) else None,
                  "from_version": version, "origin": origin, "from_synthesizer": synth, "from_created": created,
                  "source_ids": [s["id"] for s in srcs if isinstance(s, dict) and isinstance(s.get("id"), str)],
                  "imported_at": now}
    try:
        meta = check_metadata({**meta, "imported": provenance}, "import")
    except MemoryInputError as e:
        raise MemoryInputError(f"import: {where}: field 'metadata': {e}") from None
    if not live:  # no source text survived (expired, or an etchmem export): the article's text stands for them
        live = [(0, {"content": content, "created": created, "metadata": {}})]
    rows = []
    for i, s in live:
        rwhere = f"{where} sources[{i}]"
        text = _text(s, "content", rwhere)
        label = s.get("label", s.get("hint"))
        try:
            row = new_row(text, None, skill, s.get("metadata") if isinstance(s.get("metadata"), dict) else {},
                          None, mem.ttl, now, label if isinstance(label, str) else None, step="import")
        except MemoryInputError as e:
            raise MemoryInputError(f"import: {rwhere}: {e}") from None
        imp = _num(s.get("importance"), None)
        row["importance"] = imp if imp is not None and 0.0 <= imp <= 1.0 else None
        row["created"] = _num(s.get("created"), now)
        row["expires"] = _num(s.get("expires"), None)
        rows.append(row)
    imp = _num(doc.get("importance"), None)
    aid = "art_" + hashlib.sha256(f"import\0{orig_id}\0{skill}".encode()).hexdigest()[:20]
    art = Article(seq=0, id=aid, skill=skill, title=title, content=content, sources=[], metadata=meta,
                  created=now if created is None else created, updated=now, version=1,
                  synthesizer=f"imported ({synth or 'unknown'})",
                  embedding=np.zeros(0, dtype=np.float32),
                  importance=imp if imp is not None and 0.0 <= imp <= 1.0 else None)
    return {"article": art, "rows": rows, "version": version}


def _write(mem: Memory, one: dict[str, Any], now: float, summary: dict[str, Any]) -> None:
    """Embed and store one checked document (one transaction); an unchanged re-import writes nothing."""
    art, rows = one["article"], one["rows"]
    aid = art.id
    old = {a.id: a for a in mem.store.articles(ids=[aid])}.get(aid)
    if old is not None and old.metadata.get("imported", {}).get("from_version") == one["version"] \
            and old.content == art.content:
        summary["unchanged"] += 1
        summary["articles"].append(aid)
        return
    vecs = mem.embedder.embed([r["content"] for r in rows] + [f"{art.title}\n{art.content}"])
    for r, v in zip(rows, vecs):
        r["embedding"] = v
    centre = np.mean(vecs[:-1], axis=0)
    vec = centre / max(float(np.linalg.norm(centre)), 1e-12) + vecs[-1]
    art.embedding = (vec / max(float(np.linalg.norm(vec)), 1e-12)).astype(np.float32)
    art.version = (old.version + 1) if old else 1
    st = mem.store
    with st.tx():
        for r in rows:
            r["article_id"] = aid
            got = st._x("SELECT id, article_id FROM engrain_mem_records WHERE skill = ? AND digest = ?",
                        (r["skill"], r["digest"])).fetchone()
            if got is None:
                st.insert_record(r, now)
                summary["records"] += 1
                rid = r["id"]
            else:
                # The receiving agent already knew this fact: the article cites its record. A record has one home
                # article (its article_id), which this one becomes only if it has none; forget and update find
                # every article citing it by their sources.
                rid = got[0]
                if got[1] is None or got[1] == aid:
                    st._x("UPDATE engrain_mem_records SET article_id = ? WHERE id = ?", (aid, rid))
                    st._x("DELETE FROM engrain_mem_buffer WHERE kind = 'deposit' AND ref = ?", (rid,))
            if rid not in art.sources:
                art.sources.append(rid)
        if old is not None:
            # Records homed in the replaced article that the new text does not cite (local ones consolidation
            # folded in since the last import) would stay folded into an article that no longer states them:
            # never recalled, never exported. They go back to the buffer to be consolidated again.
            for r in st.records([s for s in old.sources if s not in art.sources], vectors=False).values():
                if r.article_id == aid:
                    st._x("UPDATE engrain_mem_records SET article_id = NULL WHERE id = ?", (r.id,))
                    st._x("INSERT INTO engrain_mem_buffer (kind, skill, ref, data, created) "
                          "VALUES ('deposit', ?, ?, '{}', ?)", (r.skill, r.id, now))
        st.put_article(art)
        st._bump("articles_gen")
    summary["updated" if old is not None else "imported"] += 1
    summary["articles"].append(aid)
