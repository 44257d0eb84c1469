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
import os
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import MemoryInputError
from .inputs import check_str, new_row
from .items import Article

#: The Memory facade (typed loosely: this module must not import the package that imports it).
Memory = Any

FORMAT = "engrain.memory.article/1"
#: Limits of one import: documents, bytes per document file, sources per article, characters per text.
MAX_DOCS, MAX_FILE, MAX_SOURCES, MAX_TEXT = 100_000, 10 << 20, 10_000, 1_000_000


def export(mem: Memory) -> dict[str, Any]:
    """Write every article as ``<id>.json`` in a new timestamped folder; etchmem's result dict."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    out = mem.export_dir() / stamp
    out.mkdir(parents=True, exist_ok=False)
    docs = []
    for a in mem.store.articles():
        srcs = mem.store.records(a.sources)
        doc = {
            "format": FORMAT, "id": a.id, "skill": a.skill, "title": a.title, "content": a.content,
            "version": a.version, "created": a.created, "updated": a.updated, "synthesizer": a.synthesizer,
            "importance": a.importance, "metadata": a.metadata,
            "sources": [{"id": s, **({"content": srcs[s].content, "hint": srcs[s].hint, "label": srcs[s].hint,
                                      "importance": srcs[s].importance, "created": srcs[s].created,
                                      "metadata": srcs[s].metadata} if s in srcs else {"expired": True})}
                        for s in a.sources],
        }
        (out / f"{a.id}.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        docs.append(doc)
    return {"export_dir": str(out.resolve()), "count": len(docs), "documents": docs}


def _load(source: Any) -> tuple[list[tuple[str, Any]], str]:
    """``[(where, document)]`` from a folder or an export result, and a name for the origin."""
    if isinstance(source, dict):
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
        if p.stat().st_size > MAX_FILE:
            raise MemoryInputError(f"import: {p} is larger than {MAX_FILE} bytes")
        try:
            out.append((str(p), json.loads(p.read_text(encoding="utf-8"))))
        except (OSError, ValueError, RecursionError) as e:
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
    return v


def _num(v: Any, default: float | None) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else default


def _target_skill(skill: str, skill_map: dict[str, str] | str | None) -> str:
    if isinstance(skill_map, str):
        return skill_map
    if isinstance(skill_map, dict):
        return skill_map.get(skill, skill)
    return skill


def import_(mem: Memory, source: Any, skill_map: dict[str, str] | str | None) -> dict[str, Any]:
    """Load an export into ``mem``; returns ``{"imported", "updated", "unchanged", "records", "articles"}``."""
    if skill_map is not None and not isinstance(skill_map, (str, dict)):
        raise MemoryInputError(f"import: skill_map must be a dict or a skill name, not {type(skill_map).__name__}")
    if isinstance(skill_map, dict) and not all(isinstance(k, str) and isinstance(v, str) for k, v in skill_map.items()):
        raise MemoryInputError("import: skill_map must map skill names (text) to skill names (text)")
    docs, origin = _load(source)
    summary: dict[str, Any] = {"imported": 0, "updated": 0, "unchanged": 0, "records": 0, "articles": []}
    now = time.time()
    for where, doc in docs:
        if not isinstance(doc, dict):
            raise MemoryInputError(f"import: {where} is not a JSON object")
        _one(mem, doc, where, origin, skill_map, now, summary)
    return summary


def _one(mem: Memory, doc: dict[str, Any], where: str, origin: str, skill_map: dict[str, str] | str | None,
         now: float, summary: dict[str, Any]) -> None:
    content = _text(doc, "content", where)
    orig_id = _text(doc, "id", where)
    skill = _target_skill(_text(doc, "skill", where, required=False), skill_map)
    check_str(skill, "skill", empty_ok=True)
    title = _text(doc, "title", where, required=False).strip()
    if not title:
        words = re.findall(r"\S+", content)
        title = " ".join(words[:8]) + ("…" if len(words) > 8 else "")
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    version = doc.get("version") if isinstance(doc.get("version"), int) else 1
    aid = "art_" + hashlib.sha256(f"import\0{orig_id}\0{skill}".encode()).hexdigest()[:20]
    srcs = doc.get("sources")
    if srcs is None:  # etchmem's export: the article text is all there is
        srcs = [{"id": h, "expired": True} for h in doc.get("source_hashes") or [] if isinstance(h, str)]
    if not isinstance(srcs, list) or len(srcs) > MAX_SOURCES:
        raise MemoryInputError(f"import: {where}: sources must be a list of at most {MAX_SOURCES}")
    live = [s for s in srcs if isinstance(s, dict) and isinstance(s.get("content"), str) and s["content"].strip()]
    provenance = {"from_id": orig_id, "from_skill": doc.get("skill"), "from_version": version, "origin": origin,
                  "from_synthesizer": doc.get("synthesizer"), "from_created": doc.get("created"),
                  "source_ids": [s.get("id") for s in srcs if isinstance(s, dict)], "imported_at": now}
    old = {a.id: a for a in mem.store.articles(ids=[aid])}.get(aid)
    if old is not None and old.metadata.get("imported", {}).get("from_version") == version \
            and old.content == content:
        summary["unchanged"] += 1
        summary["articles"].append(aid)
        return
    if not live:  # no source text survived (expired, or an etchmem export): the article's text stands for them
        live = [{"content": content, "created": doc.get("created"), "metadata": {}}]
    rows = []
    for i, s in enumerate(live):
        rwhere = f"{where} sources[{i}]"
        text = _text(s, "content", rwhere)
        label = s.get("label", s.get("hint"))
        row = new_row(text, None, skill, s.get("metadata") if isinstance(s.get("metadata"), dict) else {},
                      None, mem.ttl, now, label if isinstance(label, str) else None, step="import")
        imp = _num(s.get("importance"), None)
        row["importance"] = imp if imp is not None and 0.0 <= imp <= 1.0 else None
        row["created"] = _num(s.get("created"), now)
        row["expires"] = None
        row["article_id"] = aid
        rows.append(row)
    vecs = mem.embedder.embed([r["content"] for r in rows] + [f"{title}\n{content}"])
    for r, v in zip(rows, vecs):
        r["embedding"] = v
    centre = np.mean(vecs[:-1], axis=0)
    vec = centre / max(float(np.linalg.norm(centre)), 1e-12) + vecs[-1]
    imp = _num(doc.get("importance"), None)
    art = Article(seq=0, id=aid, skill=skill, title=title, content=content, sources=[],
                  metadata={**meta, "imported": provenance}, created=_num(doc.get("created"), now) or now,
                  updated=now, version=(old.version + 1) if old else 1,
                  synthesizer=f"imported ({doc.get('synthesizer') or 'unknown'})",
                  embedding=(vec / max(float(np.linalg.norm(vec)), 1e-12)).astype(np.float32),
                  importance=imp if imp is not None and 0.0 <= imp <= 1.0 else None)
    st = mem.store
    with st.tx():
        for r in rows:
            got = st._x("SELECT id, article_id FROM engrain_mem_records WHERE skill = ? AND digest = ?",
                        (r["skill"], r["digest"])).fetchone()
            if got is None:
                st.insert_record(r, now)
                summary["records"] += 1
                art.sources.append(r["id"])
            else:  # the receiving agent already knew this fact: the article cites its record
                if got[1] is None or got[1] == aid:
                    st._x("UPDATE engrain_mem_records SET article_id = ? WHERE id = ?", (aid, got[0]))
                    st._x("DELETE FROM engrain_mem_buffer WHERE kind = 'deposit' AND ref = ?", (got[0],))
                art.sources.append(got[0])
        st.put_article(art)
        st._bump("articles_gen")
    summary["updated" if old is not None else "imported"] += 1
    summary["articles"].append(aid)
