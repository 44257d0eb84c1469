"""The items memory keeps: records, articles and buffer rows, and their vector encoding."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def to_blob(vec: np.ndarray) -> bytes:
    """float32 bytes of one vector."""
    return np.asarray(vec, dtype=np.float32).tobytes()


def from_blob(blob: bytes | memoryview) -> np.ndarray:
    """The float32 vector stored in ``blob``."""
    return np.frombuffer(bytes(blob), dtype=np.float32)



@dataclass(slots=True)
class Record:
    """One raw deposit."""

    seq: int
    id: str
    skill: str
    content: str
    hint: str
    metadata: dict[str, Any]
    created: float
    expires: float | None
    article_id: str | None
    embedding: np.ndarray = field(repr=False)
    importance: float | None = None


@dataclass(slots=True)
class Article:
    """One synthesized article and the record ids it was made from."""

    seq: int
    id: str
    skill: str
    title: str
    content: str
    sources: list[str]
    metadata: dict[str, Any]
    created: float
    updated: float
    version: int
    synthesizer: str
    embedding: np.ndarray = field(repr=False)
    importance: float | None = None


@dataclass(slots=True)
class BufferItem:
    """A deposit (``kind="deposit"``, ``ref`` = record id) or a recall event (``kind="recall"``)."""

    seq: int
    kind: str
    skill: str | None
    ref: str | None
    data: dict[str, Any]
    created: float


#: The columns :func:`_record` and :func:`_article` read rows of, in their order.
_REC_COLS = "seq, id, skill, content, hint, metadata, created, expires, article_id, embedding, importance"
_ART_COLS = ("seq, id, skill, title, content, sources, metadata, created, updated, version, synthesizer, embedding,"
             " importance")


def _record(r: Sequence[Any]) -> Record:
    return Record(r[0], r[1], r[2], r[3], r[4], json.loads(r[5]), r[6], r[7], r[8], from_blob(r[9]), r[10])


def _article(r: Sequence[Any]) -> Article:
    return Article(r[0], r[1], r[2], r[3], r[4], json.loads(r[5]), json.loads(r[6]), r[7], r[8], r[9], r[10],
                   from_blob(r[11]), r[12])


#: Rows the vector mirror reads at a time: loading 1M records at once held every row's bytes twice beside the
#: mirror (the process peaked at 7.5 GB and kept 6.1; in chunks 3.1 GB, mirror and graph included, and 14-17 s
#: against 20 s on PostgreSQL, bench/memory.py's 1M store).
VECTOR_CHUNK = 50_000
#: Each tier's next rows past a seq (up to :data:`VECTOR_CHUNK`), as the vector mirror reads them.
VECTORS_SQL = {
    "record": f"SELECT seq, id, skill, expires, embedding FROM engrain_mem_records WHERE seq > ? ORDER BY seq "
              f"LIMIT {VECTOR_CHUNK}",
    "article": f"SELECT seq, id, skill, NULL, embedding FROM engrain_mem_articles WHERE seq > ? ORDER BY seq "
               f"LIMIT {VECTOR_CHUNK}",
}


def vector_rows(rows: Sequence[Any]) -> tuple[np.ndarray, list[str], list[str], np.ndarray, np.ndarray]:
    """``(seqs, ids, skills, expires, matrix)`` of rows read by :data:`VECTORS_SQL` (``expires`` inf: no TTL)."""
    seqs = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    exp = np.fromiter((np.inf if r[3] is None else r[3] for r in rows), dtype=np.float64, count=len(rows))
    mat = (np.frombuffer(b"".join(bytes(r[4]) for r in rows), dtype=np.float32).reshape(len(rows), -1)
           if rows else np.zeros((0, 0), dtype=np.float32))
    return seqs, [r[1] for r in rows], [r[2] for r in rows], exp, mat
