"""Learned routines, kept as a skill's memory: the routine, the runs it came from, and review state.

A learned routine belongs to a skill (``eg.Agent(learn="billing")``) and is one
row of ``engrain_mem_routines`` in the memory's database (SQLite or
PostgreSQL), next to the skill's records and articles. The row holds the
routine (``routine.yaml`` data), its status (``candidate``, ``confirmed``,
``not_compilable``), ``trusted`` (set only by a human: :meth:`LearnedRoutines.promote`),
``demoted`` (a human took the promotion back: never offered until promoted again),
whether a human edited it, the tasks and run ids it was learned from with their
tool calls (the evidence a later run is induced with), why steps are not
compilable, use counters, and one embedding per source task so that
:meth:`LearnedRoutines.match` recalls the routines whose tasks read like a new
one. Induction itself is :mod:`engrain._routines.induce`; offering a routine to
the model is :mod:`engrain._agent.learn`.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._errors import EngrainError, MemoryInputError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS engrain_mem_routines (
    id TEXT PRIMARY KEY, skill TEXT NOT NULL, name TEXT NOT NULL, shape TEXT NOT NULL, status TEXT NOT NULL,
    trusted INTEGER NOT NULL, edited INTEGER NOT NULL, data TEXT NOT NULL, embedding {blob},
    created DOUBLE PRECISION NOT NULL, updated DOUBLE PRECISION NOT NULL, version INTEGER NOT NULL,
    uses INTEGER NOT NULL DEFAULT 0, stops INTEGER NOT NULL DEFAULT 0, evidence TEXT NOT NULL,
    UNIQUE (skill, name));
CREATE UNIQUE INDEX IF NOT EXISTS engrain_mem_routines_shape ON engrain_mem_routines (skill, shape)
"""
_COLS = "id, skill, name, shape, status, trusted, edited, data, embedding, created, updated, version, uses, stops"
#: The evidence runs (up to MAX_EVIDENCE x 256 kB) are read only where a routine is induced or shown in full.
_FULL = _COLS + ", evidence"
STATUSES = ("candidate", "confirmed", "not_compilable")
MAX_EVIDENCE = 8  # runs kept per routine: the newest, enough to tell inputs from constants
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,47}$")


class LearnedRoutineNotFoundError(MemoryInputError, LookupError):
    """No learned routine has this id or name."""


class LearnedRoutineChangedError(EngrainError):
    """The learned routine changed (another run learned, or a human edited it) since it was read; read it again."""


@dataclass(slots=True)
class LearnedRoutine:
    """One learned routine of a skill (see the module docstring for the fields)."""

    id: str
    skill: str
    name: str
    shape: str
    status: str
    routine: dict[str, Any]
    trusted: bool = False
    edited: bool = False
    tasks: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    evidence: list[dict[str, Any]] = field(default_factory=list)
    problems: list[dict[str, Any]] = field(default_factory=list)
    explained: list[dict[str, Any]] = field(default_factory=list)
    pattern: str | None = None
    uses: int = 0
    stops: int = 0
    created: float = 0.0
    updated: float = 0.0
    version: int = 0  # 0: not saved yet; each save adds one (optimistic concurrency)
    partial: bool = field(default=False, repr=False)  # read by list(), without its evidence: never saved back
    embedding: np.ndarray | None = field(default=None, repr=False)
    demoted: bool = False  # a human took it back (promote(trusted=False)): not offered until promoted again

    def offerable(self, usable: tuple[str, ...] = ("confirmed",)) -> bool:
        """Whether an agent may offer (and run) this routine: confirmed or promoted, never taken back."""
        return not self.demoted and self.status != "not_compilable" and (self.status in usable or self.trusted)

    @property
    def description(self) -> str:
        return str(self.routine.get("description", ""))

    @property
    def inputs(self) -> dict[str, Any]:
        return dict(self.routine.get("inputs") or {})

    def to_dict(self, full: bool = False) -> dict[str, Any]:
        """JSON view: the review fields; ``full`` adds the routine, the evidence runs and the explanations."""
        out = {"id": self.id, "skill": self.skill, "name": self.name, "status": self.status, "trusted": self.trusted,
               "demoted": self.demoted, "edited": self.edited, "description": self.description, "inputs": self.inputs, "tasks": self.tasks,
               "runs": self.runs, "problems": self.problems, "pattern": self.pattern, "uses": self.uses,
               "stops": self.stops, "created": self.created, "updated": self.updated}
        if full:
            out.update(routine=self.routine, explained=self.explained, evidence=self.evidence)
        return out


class LearnedRoutines:
    """The learned routines in ``memory``'s database (an :class:`engrain.Memory`, or a store URL)."""

    def __init__(self, memory: Any = None):
        if memory is None or isinstance(memory, str):
            from . import Memory

            memory = Memory(memory)
        self.memory = memory
        self.store = memory.store
        blob = "BLOB" if self.store.backend == "sqlite" else "BYTEA"
        with self.store.tx():
            if self.store.backend != "sqlite":  # concurrent first opens race on CREATE TABLE IF NOT EXISTS
                self.store._x("SELECT pg_advisory_xact_lock(hashtext('engrain_mem_routines'))")
            for stmt in _SCHEMA.format(blob=blob).split(";"):
                if stmt.strip():
                    self.store._x(stmt)

    # -- reading ---------------------------------------------------------------------------

    def _row(self, row: tuple) -> LearnedRoutine:
        d = json.loads(row[7])
        partial = len(row) <= 14
        d["evidence"] = [] if partial else json.loads(row[14])
        emb = np.frombuffer(bytes(row[8]), dtype=np.float32) if row[8] is not None else None
        r = LearnedRoutine(row[0], row[1], row[2], row[3], row[4], d["routine"], bool(row[5]), bool(row[6]),
                           d.get("tasks", []), d.get("runs", []), d.get("evidence", []), d.get("problems", []),
                           d.get("explained", []), d.get("pattern"), int(row[12]), int(row[13]),
                           float(row[9]), float(row[10]), int(row[11]), partial=partial,
                           demoted=bool(d.get("demoted", False)))
        if emb is not None and emb.size:
            r.embedding = emb.reshape(len(r.tasks), -1) if r.tasks and emb.size % len(r.tasks) == 0 else None
        return r

    def list(self, skill: str | None = None, status: str | None = None) -> list[LearnedRoutine]:
        """The learned routines (of ``skill``, with ``status``), newest first, without their evidence runs."""
        if status is not None and status not in STATUSES:
            raise MemoryInputError(f"status must be one of {', '.join(STATUSES)}, not {status!r}")
        sql, args = f"SELECT {_COLS} FROM engrain_mem_routines WHERE 1 = 1", []
        if skill is not None:
            sql, args = sql + " AND skill = ?", [*args, skill]
        if status is not None:
            sql, args = sql + " AND status = ?", [*args, status]
        with self.store._lock:
            rows = self.store._x(sql + " ORDER BY updated DESC, id", args).fetchall()
        return [self._row(r) for r in rows]

    def get(self, ref: str, skill: str | None = None) -> LearnedRoutine:
        """The routine with id ``ref``, or named ``ref`` (in ``skill`` when names repeat across skills)."""
        if not isinstance(ref, str) or not ref:
            raise MemoryInputError("a learned routine is named by its id or name (a non-empty string)")
        with self.store._lock:
            rows = self.store._x(f"SELECT {_FULL} FROM engrain_mem_routines WHERE id = ?", (ref,)).fetchall()
            if not rows:
                sql, args = f"SELECT {_FULL} FROM engrain_mem_routines WHERE name = ?", [ref]
                if skill is not None:
                    sql, args = sql + " AND skill = ?", [*args, skill]
                rows = self.store._x(sql, args).fetchall()
        if not rows:
            where = f" in skill {skill!r}" if skill is not None else ""
            raise LearnedRoutineNotFoundError(f"no learned routine {ref!r}{where} (see `engrain routines`)")
        if len(rows) > 1:
            skills = ", ".join(sorted(r[1] for r in rows))
            raise MemoryInputError(f"learned routine name {ref!r} is in several skills ({skills}): give its id or --skill")
        return self._row(rows[0])

    def by_shape(self, skill: str, shape: str) -> LearnedRoutine | None:
        """The routine learned from runs of this shape in ``skill``, if any."""
        with self.store._lock:
            row = self.store._x(f"SELECT {_FULL} FROM engrain_mem_routines WHERE skill = ? AND shape = ?",
                                (skill, shape)).fetchone()
        return self._row(row) if row else None

    def names(self, skill: str) -> set[str]:
        with self.store._lock:
            return {n for (n,) in self.store._x("SELECT name FROM engrain_mem_routines WHERE skill = ?", (skill,))}

    def match(self, skill: str, task: str, *, top_k: int = 3, min_score: float = 0.35,
              usable: tuple[str, ...] = ("confirmed",)) -> list[tuple[float, LearnedRoutine]]:
        """The routines of ``skill`` whose source tasks read most like ``task`` (best first).

        Only routines with a status in ``usable``, or promoted by a human, and
        not taken back by one (:meth:`LearnedRoutine.offerable`) are considered; the score is the best cosine similarity between ``task`` and
        one of the routine's source tasks (its task pattern matching counts 1.0).
        """
        found = [r for r in self.list(skill) if r.offerable(usable)]
        if not found:
            return []
        q = self.memory.embedder.embed([task])[0]  # a task against stored tasks: like with like, one side
        scored = []
        for r in found:
            score = float(np.max(r.embedding @ q)) if r.embedding is not None and r.embedding.size else 0.0
            if r.pattern and _pattern_matches(r.pattern, task):
                score = 1.0
            if score >= min_score:
                scored.append((score, r))
        scored.sort(key=lambda x: -x[0])
        return scored[:top_k]

    # -- writing ---------------------------------------------------------------------------

    def save(self, r: LearnedRoutine) -> LearnedRoutine:
        """Insert ``r`` (``version`` 0) or update it if nobody saved it since it was read.

        :class:`LearnedRoutineChangedError` when another writer saved first (or
        took its name): read again and redo the change. Use counters are not
        written here (see :meth:`note_use`).
        """
        if r.partial:
            raise MemoryInputError(f"learned routine {r.name!r} was read by list(), without its evidence: get() it to save")
        if r.status not in STATUSES:
            raise MemoryInputError(f"learned routine {r.name!r}: status must be one of {', '.join(STATUSES)}")
        if not _NAME.match(r.name):
            raise MemoryInputError(f"learned routine name {r.name!r}: lower-case letters, digits and '_', at most 48")
        r.evidence = r.evidence[-MAX_EVIDENCE:]
        if r.embedding is None or r.embedding.shape[0] != len(r.tasks):
            r.embedding = self.memory.embedder.embed(list(r.tasks)) if r.tasks else None
        now = time.time()
        data = json.dumps({"routine": r.routine, "tasks": r.tasks, "runs": r.runs, "problems": r.problems,
                           "explained": r.explained, "pattern": r.pattern, "demoted": r.demoted}, default=str)
        evidence = json.dumps(r.evidence, default=str)
        emb = np.asarray(r.embedding, dtype=np.float32).tobytes() if r.embedding is not None else None
        with self.store.tx():
            if r.version == 0:
                taken = self.store._x(
                    "SELECT 1 FROM engrain_mem_routines WHERE id = ? OR (skill = ? AND (name = ? OR shape = ?))",
                    (r.id, r.skill, r.name, r.shape)).fetchone()
                if taken:
                    raise LearnedRoutineChangedError(f"learned routine {r.name!r} of skill {r.skill!r} exists already")
                try:
                    self.store._x(f"INSERT INTO engrain_mem_routines ({_FULL}) VALUES "
                                  "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, ?)",
                                  (r.id, r.skill, r.name, r.shape, r.status, int(r.trusted), int(r.edited), data, emb,
                                   now, now, 1, evidence))
                except Exception as e:  # a concurrent writer inserted it between the check and here (PostgreSQL)
                    if type(e).__name__ not in ("IntegrityError", "UniqueViolation"):
                        raise
                    raise LearnedRoutineChangedError(f"learned routine {r.name!r} of skill {r.skill!r} exists already") from None
                r.created = now
            else:
                cur = self.store._x(
                    "UPDATE engrain_mem_routines SET name = ?, status = ?, trusted = ?, edited = ?, data = ?, "
                    "embedding = ?, updated = ?, version = version + 1, evidence = ? WHERE id = ? AND version = ?",
                    (r.name, r.status, int(r.trusted), int(r.edited), data, emb, now, evidence, r.id, r.version))
                if cur.rowcount != 1:
                    raise LearnedRoutineChangedError(f"learned routine {r.name!r} changed since it was read")
        r.updated, r.version = now, r.version + 1
        return r

    def new_id(self) -> str:
        return "lr_" + os.urandom(8).hex()

    def promote(self, ref: str, trusted: bool = True, skill: str | None = None) -> LearnedRoutine:
        """Mark a routine reviewed (``trusted: true``), or take that back with ``trusted=False``.

        Taking it back (also from a routine confirmed by runs and never
        promoted) withholds it: no agent offers it, an offer made before is
        refused when the model calls it, and runs of its shape no longer
        re-induce it, until a human promotes it again. A routine with steps that are not compilable is promoted only after a
        human edited it (:meth:`edit`): its unexplained arguments hold one run's values.
        """
        r = self.get(ref, skill)
        if trusted and r.status == "not_compilable" and not r.edited:
            steps = ", ".join(sorted({p["step"] for p in r.problems}))
            raise MemoryInputError(f"learned routine {r.name!r} has steps that are not compilable ({steps}): "
                                   "edit it before promoting it")
        r.trusted = bool(trusted)
        r.demoted = not r.trusted
        r.routine = {**r.routine, "trusted": r.trusted}
        return self.save(r)

    def replace(self, ref: str, routine: dict[str, Any], skill: str | None = None) -> LearnedRoutine:
        """Replace the routine's ``routine.yaml`` data with a human's version, unchecked (storage only:
        ``engrain.LearnedRoutines.edit`` checks it first).

        An edited routine keeps its review state, counts as ``confirmed`` (a
        human wrote it) and is no longer re-induced when more runs arrive.
        """
        r = self.get(ref, skill)
        if not isinstance(routine, dict):
            raise MemoryInputError(f"learned routine {r.name!r}: the edited routine must be a mapping")
        r.routine = {**routine, "name": r.name, "trusted": r.trusted}
        r.edited, r.status, r.problems = True, "confirmed", []
        return self.save(r)

    def delete(self, ref: str, skill: str | None = None) -> LearnedRoutine:
        """Delete a learned routine; returns what was deleted."""
        r = self.get(ref, skill)
        with self.store.tx():
            self.store._x("DELETE FROM engrain_mem_routines WHERE id = ?", (r.id,))
        return r

    def note_use(self, id: str, stopped: bool) -> None:
        """Count one use of routine ``id`` (and one stop, when it handed back to the model)."""
        with self.store.tx():
            self.store._x("UPDATE engrain_mem_routines SET uses = uses + 1, stops = stops + ? WHERE id = ?",
                          (int(stopped), id))


MAX_PATTERN_TASK = 2000  # characters of task text a pattern is matched against (lazy groups backtrack)
MAX_PATTERN_SLOTS = 8


def _pattern_matches(pattern: str, task: str) -> bool:
    """Whether ``task`` reads as ``pattern`` with its ``{name}`` slots filled (bounded: long text never matches)."""
    parts = re.split(r"\{[A-Za-z_]\w*\}", pattern)
    if len(task) > MAX_PATTERN_TASK or len(parts) - 1 > MAX_PATTERN_SLOTS:
        return False
    rx = "(.+?)".join(re.escape(p) for p in parts)
    return re.fullmatch(rx, task.strip(), re.S) is not None
