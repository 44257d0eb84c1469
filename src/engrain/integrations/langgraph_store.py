"""LangGraph's long-term memory (``BaseStore``) on engrain's skill memory.

    from engrain.integrations.langgraph import EngrainStore

    graph = builder.compile(checkpointer=EngrainCheckpointer(), store=EngrainStore())
    store.put(("users", "ann"), "food", {"likes": "spicy ramen"})
    store.search(("users", "ann"), query="what does she like to eat?")   # hybrid recall

An item is one memory record of the skill ``langgraph`` (``skill=`` to change
it): its text (the value, or the fields named by ``index``) is embedded locally
and indexed for full text, so ``search(query=...)`` gets engrain's hybrid recall,
and ``consolidate()`` can fold related items into articles. The namespace, key
and value ride in the record's metadata (``lg_ns0``, ``lg_ns1``, … per level, so
a namespace prefix is an exact metadata filter), which is how ``get``,
``delete`` and ``list_namespaces`` find items without a query. Filters on values
(``{"color": "red"}``, ``{"score": {"$gt": 4}}``) are applied to the stored value,
and as in LangGraph's ``InMemoryStore`` they pick the items a query then ranks:
a search with both returns every matching item there is (up to ``limit``), not
only those among the query's best matches overall.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from .._errors import EngrainError
from .._memory import Memory
from .._memory.items import Record

__all__ = ["EngrainStore"]

#: Namespace levels kept as separate metadata keys (deeper namespaces are refused).
MAX_DEPTH = 16
_OPS = {"$eq": lambda a, b: a == b, "$ne": lambda a, b: a != b, "$gt": lambda a, b: a > b,
        "$gte": lambda a, b: a >= b, "$lt": lambda a, b: a < b, "$lte": lambda a, b: a <= b}


def _ns_where(namespace: tuple[str, ...]) -> dict[str, Any]:
    return {f"lg_ns{i}": part for i, part in enumerate(namespace)}


def _check_ns(namespace: tuple[str, ...]) -> None:
    if not namespace or len(namespace) > MAX_DEPTH or not all(isinstance(p, str) and p for p in namespace):
        raise InvalidNamespaceError(
            f"namespace {namespace!r} must be 1 to {MAX_DEPTH} non-empty strings")


def _when(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=timezone.utc)


def _value_matches(value: dict[str, Any], flt: dict[str, Any] | None) -> bool:
    for field, want in (flt or {}).items():
        have = value.get(field)
        if isinstance(want, dict) and want and all(k in _OPS for k in want):
            try:
                if not all(_OPS[op](have, arg) for op, arg in want.items()):
                    return False
            except TypeError:  # comparing across types: no match
                return False
        elif have != want:
            return False
    return True


def _text(namespace: tuple[str, ...], key: str, value: dict[str, Any], index: list[str] | None) -> str:
    if index:
        parts = [str(value[f]) for f in index if f in value]
        body = " ".join(parts) if parts else json.dumps(value, ensure_ascii=False, sort_keys=True)
    else:
        body = json.dumps(value, ensure_ascii=False, sort_keys=True)
    # Namespace and key are part of the text: memory stores identical text once per skill, and two
    # items with the same value are still two items.
    return f"{'/'.join(namespace)} {key}: {body}"


class EngrainStore(BaseStore):
    """LangGraph's ``BaseStore`` (sync and async) on an engrain :class:`~engrain.Memory`.

    ``url`` picks the store (default: ``ENGRAIN_URL`` or ``./.engrain/``); or
    pass a ``memory``. Items are records of ``skill``.
    """

    def __init__(self, url: str | None = None, *, memory: Memory | None = None, skill: str = "langgraph"):
        self.memory = memory or Memory(url)
        self.skill = skill

    # -- one operation each ------------------------------------------------------

    def _find(self, namespace: tuple[str, ...], key: str | None = None) -> list[Record]:
        """Items in ``namespace`` (and below it, without ``key``), oldest first."""
        where = _ns_where(namespace)
        if key is not None:
            where.update(lg_depth=len(namespace), lg_key=key)
        return self.memory.find(where, skill=self.skill)

    def _item(self, r: Record, score: float | None = None) -> Item:
        m = r.metadata
        ns, key, value = tuple(m["lg_ns"]), m["lg_key"], m["lg_value"]
        created, updated = _when(m.get("lg_created", r.created)), _when(m.get("lg_updated", r.created))
        if score is None:
            return Item(value=value, key=key, namespace=ns, created_at=created, updated_at=updated)
        return SearchItem(namespace=ns, key=key, value=value, created_at=created, updated_at=updated, score=score)

    def _get(self, op: GetOp) -> Item | None:
        _check_ns(op.namespace)
        found = self._find(op.namespace, op.key)
        return self._item(found[-1]) if found else None

    def _put(self, op: PutOp) -> None:
        _check_ns(op.namespace)
        old = self._find(op.namespace, op.key)
        if op.value is None:
            for r in old:
                self.memory.forget(r.id)
            return
        if not isinstance(op.value, dict):
            raise EngrainError(f"EngrainStore.put: value for key {op.key!r} must be a dict")
        now = time.time()
        meta = {**_ns_where(op.namespace), "lg_item": True, "lg_ns": list(op.namespace), "lg_depth": len(op.namespace),
                "lg_key": op.key, "lg_value": op.value,
                "lg_created": old[0].metadata.get("lg_created", now) if old else now, "lg_updated": now}
        text = _text(op.namespace, op.key, op.value, op.index if isinstance(op.index, list) else None)
        ttl = op.ttl * 60 if op.ttl is not None else None  # LangGraph counts minutes
        if old:
            self.memory.update(old[0].id, text, metadata=meta)
            for extra in old[1:]:
                self.memory.forget(extra.id)
        else:
            self.memory.remember(text, skill=self.skill, metadata=meta, ttl=ttl)

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        want = op.limit + op.offset
        if op.query:
            out = self._ranked(op.query, prefix, op.filter, want)
        else:  # no query: newest first
            out = self._matching([(r, 0.0) for r in reversed(self._in(prefix))], op.filter)
        return out[op.offset:op.offset + op.limit]  # type: ignore[return-value]

    def _in(self, prefix: tuple[str, ...]) -> list[Record]:
        """Every item under namespace ``prefix`` (all items for ``()``), oldest first."""
        return self._find(prefix) if prefix else self._all()

    def _matching(self, scored: Iterable[tuple[Record, float]], flt: dict[str, Any] | None,
                  seen: set[str] | None = None) -> list[SearchItem]:
        """The items of ``scored`` (in order, each once) whose value passes ``flt``."""
        seen = set() if seen is None else seen
        out = []
        for r, score in scored:
            if r.id in seen or "lg_key" not in r.metadata or not _value_matches(r.metadata["lg_value"], flt):
                continue
            seen.add(r.id)
            out.append(self._item(r, score))
        return out  # type: ignore[return-value]

    def _ranked(self, query: str, prefix: tuple[str, ...], flt: dict[str, Any] | None,
                want: int) -> list[SearchItem]:
        """At least ``want`` items under ``prefix`` passing ``flt`` (all there are, if fewer), best match first.

        As LangGraph's ``InMemoryStore``: the filter picks the items and the query ranks them, so a
        matching item is never lost for ranking below items the filter drops. Recall ranks
        ``max(4 * want, 10)`` hits first (enough when the filter keeps most items) and is asked
        again for more, up to every item under ``prefix``, until ``want`` of its hits pass.
        """
        where = _ns_where(prefix) or None
        top_k, total, passing = max(want * 4, 10), None, 0
        while True:
            hits = self.memory.recall(query, skill=self.skill, top_k=top_k, where=where)
            # A record folded into an article comes back as the article: take the records it names.
            ranked = [(rid, h.score) for h in hits
                      for rid in ([h.id] if h.tier == "record" else h.provenance.get("via") or [])]
            records = self.memory.store.records([rid for rid, _ in ranked])
            seen: set[str] = set()
            out = self._matching(((records[rid], score) for rid, score in ranked if rid in records), flt, seen)
            if len(out) >= want:
                return out
            if total is None:
                total = self._in(prefix)
                passing = sum(1 for r in total
                              if "lg_key" in r.metadata and _value_matches(r.metadata["lg_value"], flt))
            if len(out) >= passing or len(hits) < top_k or top_k >= len(total):
                break  # every passing item is ranked, or recall has nothing more to rank
            top_k = min(top_k * 4, len(total))
        # Items recall did not return at all still pass the filter, and InMemoryStore returns every
        # item that does: they follow the ranked ones, newest first, with score 0.
        return out + self._matching(((r, 0.0) for r in reversed(total)), flt, seen)

    def _all(self) -> list[Record]:
        return self.memory.find({"lg_item": True}, skill=self.skill)

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        spaces = {tuple(r.metadata["lg_ns"]) for r in self._all() if "lg_ns" in r.metadata}
        for cond in op.match_conditions or ():
            spaces = {ns for ns in spaces if _matches(cond.match_type, tuple(cond.path), ns)}
        if op.max_depth is not None:
            spaces = {ns[:op.max_depth] for ns in spaces}
        return sorted(spaces)[op.offset:op.offset + op.limit]

    # -- BaseStore -------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order; each result at its op's position."""
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op))
            elif isinstance(op, PutOp):
                results.append(self._put(op))
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            else:
                raise EngrainError(f"EngrainStore: unknown operation {type(op).__name__}")
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Async :meth:`batch` (memory is synchronous: it runs in a worker thread)."""
        return await asyncio.to_thread(self.batch, list(ops))


def _matches(kind: str, path: tuple[str, ...], ns: tuple[str, ...]) -> bool:
    if len(path) > len(ns):
        return False
    part = ns[: len(path)] if kind == "prefix" else ns[len(ns) - len(path):]
    return all(p == "*" or p == q for p, q in zip(path, part))
