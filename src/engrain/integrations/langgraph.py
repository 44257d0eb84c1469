"""engrain under LangGraph: a checkpointer whose checkpoints live in the engrain journal.

    from engrain.integrations.langgraph import EngrainCheckpointer

    graph = builder.compile(checkpointer=EngrainCheckpointer())      # the one-line change
    graph.invoke(inputs, {"configurable": {"thread_id": "t-1"}})

Each LangGraph thread is one engrain run (``langgraph:<thread_id>``, tagged
``langgraph``; a thread id too long for a run id ends in its SHA-256 instead, see
:func:`thread_run_id`), so ``engrain runs --tag langgraph``, ``engrain show`` and the web
UI list threads and their checkpoints. A checkpoint is one ``log.entry`` event
(``checkpoint``) holding the serialized checkpoint, its metadata and the blobs of
the channels that changed; pending writes are ``writes`` entries. Killing the
process at any point loses nothing that LangGraph was told was saved: each put
is one atomic journal append, and a graph invoked again on the same thread
resumes from its last checkpoint, so nodes that finished are not run again.

The adapter is thin: storage is :class:`engrain._durable.log.EntryLog`; this
module only maps LangGraph's ``BaseCheckpointSaver`` interface onto it.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)

from .._durable.context import default_journal
from .._durable.log import EntryLog
from .._events import Event
from .._journal import Journal, open_journal
from ._common import is_digest_run_id, log_run_id

__all__ = ["EngrainCheckpointer", "EngrainStore", "thread_run_id"]

#: Run ids of threads start with this; the rest is the thread id (or its digest, see thread_run_id).
RUN_PREFIX = "langgraph:"
TAG = "langgraph"
#: Threads listed per page by ``list(None)`` (all threads).
_PAGE = 500


def thread_run_id(thread_id: str) -> str:
    """The engrain run id that holds LangGraph thread ``thread_id``.

    ``langgraph:<thread_id>``; LangGraph accepts thread ids of any length, so one too long for a
    run id (over 190 characters) keeps a readable head and ends in the SHA-256 of the whole id
    (the run's inputs keep the whole id). Shorter ids map as they always did.
    """
    return log_run_id(RUN_PREFIX, thread_id)


def _pack(typed: tuple[str, bytes]) -> list[str]:
    return [typed[0], base64.b64encode(typed[1]).decode("ascii")]


def _unpack(packed: list[str]) -> tuple[str, bytes]:
    return packed[0], base64.b64decode(packed[1])


def _vkey(version: Any) -> str:
    # Versions are ints, floats or strings; JSON text keeps 1 and "1" apart.
    return json.dumps(version)


class _Thread:
    """What one thread's entries say, rebuilt from its log."""

    def __init__(self, entries: list[Event]):
        # ns -> checkpoint id -> entry data; ns -> (channel, version key) -> packed blob
        self.checkpoints: dict[str, dict[str, dict[str, Any]]] = {}
        self.blobs: dict[str, dict[tuple[str, str], list[str]]] = {}
        # (ns, checkpoint id) -> (task id, idx) -> (task_path, task_id, idx, channel, packed value)
        self.writes: dict[tuple[str, str], dict[tuple[str, int], tuple[str, str, int, str, list[str]]]] = {}
        for e in entries:
            d = e.data
            ns = d.get("ns", "")
            if e.name == "checkpoint":
                self.checkpoints.setdefault(ns, {})[d["id"]] = d
                blobs = self.blobs.setdefault(ns, {})
                for channel, version, packed in d.get("blobs", []):
                    blobs[(channel, _vkey(version))] = packed
            elif e.name == "writes":
                stored = self.writes.setdefault((ns, d["checkpoint_id"]), {})
                for idx, channel, packed in d["writes"]:
                    key = (d["task_id"], idx)
                    # Regular writes are kept once (a retried task repeats them); special ones replace.
                    if idx >= 0 and key in stored:
                        continue
                    stored[key] = (d.get("task_path", ""), d["task_id"], idx, channel, packed)
            elif e.name == "removed":
                # Pruning and delete_for_runs append this instead of rewriting the log, so they are atomic.
                for rns, cid in d["checkpoints"]:
                    self.checkpoints.get(rns, {}).pop(cid, None)
                    self.writes.pop((rns, cid), None)


class EngrainCheckpointer(BaseCheckpointSaver):
    """A LangGraph ``BaseCheckpointSaver`` on the engrain journal (sync and async).

    ``url`` picks the store (default: ``ENGRAIN_URL`` or ``./.engrain/``); or pass
    an open ``journal``. Works on SQLite and PostgreSQL; several processes may
    share one store.
    """

    def __init__(self, url: str | None = None, *, journal: Journal | None = None, serde: Any = None):
        super().__init__(serde=serde)
        self.journal = journal or (open_journal(url) if url else default_journal())
        self._logs: dict[str, EntryLog] = {}

    # -- storage ----------------------------------------------------------------

    def _log(self, thread_id: str) -> EntryLog:
        log = self._logs.get(thread_id)
        if log is None:
            log = self._logs[thread_id] = EntryLog(
                self.journal, thread_run_id(thread_id), task=f"LangGraph thread {thread_id}", tags=[TAG],
                agent="langgraph", inputs={"thread_id": thread_id},
            )
        return log

    def _thread(self, thread_id: str) -> _Thread:
        return _Thread(self._log(thread_id).entries())

    def _tuple(self, thread_id: str, th: _Thread, ns: str, cid: str) -> CheckpointTuple:
        d = th.checkpoints[ns][cid]
        checkpoint = self.serde.loads_typed(_unpack(d["checkpoint"]))
        blobs = th.blobs.get(ns, {})
        values = {}
        for channel, version in checkpoint["channel_versions"].items():
            packed = blobs.get((channel, _vkey(version)))
            if packed is not None and packed[0] != "empty":
                values[channel] = self.serde.loads_typed(_unpack(packed))
        stored = th.writes.get((ns, cid), {})
        # LangGraph expects pending writes in the order a super-step applies them (writes_sort_key).
        order = sorted(stored.values(), key=lambda w: w[:3])
        parent = d.get("parent")
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}},
            checkpoint={**checkpoint, "channel_values": values},
            metadata=self.serde.loads_typed(_unpack(d["metadata"])),
            parent_config=(
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": parent}}
                if parent else None
            ),
            pending_writes=[(tid, ch, self.serde.loads_typed(_unpack(p))) for _, tid, _, ch, p in order],
        )

    # -- BaseCheckpointSaver ------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config`` (its latest, without a ``checkpoint_id``), or ``None``."""
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), conf.get("checkpoint_ns", "")
        th = self._thread(thread_id)
        saved = th.checkpoints.get(ns, {})
        cid = get_checkpoint_id(config)
        if cid is None:
            if not saved:
                return None
            cid = max(saved)  # checkpoint ids sort by time
        elif cid not in saved:
            return None
        return self._tuple(thread_id, th, ns, cid)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, filtered by thread/namespace/id, metadata and ``before``."""
        conf = (config or {}).get("configurable", {})
        if "thread_id" in conf:
            threads = [str(conf["thread_id"])]
        else:
            threads = self._all_threads()
        want_ns = conf.get("checkpoint_ns")
        want_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        left = limit
        for thread_id in threads:
            th = self._thread(thread_id)
            for ns, saved in th.checkpoints.items():
                if want_ns is not None and ns != want_ns:
                    continue
                for cid in sorted(saved, reverse=True):
                    if want_id and cid != want_id or before_id and cid >= before_id:
                        continue
                    tup = self._tuple(thread_id, th, ns, cid)
                    if filter and any(tup.metadata.get(k) != v for k, v in filter.items()):
                        continue
                    if left is not None:
                        if left <= 0:
                            return
                        left -= 1
                    yield tup

    def _all_threads(self) -> list[str]:
        threads, offset = [], 0
        while True:
            page = self.journal.runs(tag=TAG, limit=_PAGE, offset=offset)
            threads += [self._thread_of(r.run_id) for r in page if r.run_id.startswith(RUN_PREFIX)]
            if len(page) < _PAGE:
                return threads
            offset += _PAGE

    def _thread_of(self, run_id: str) -> str:
        """The thread id run ``run_id`` holds: the rest of the run id, or for a long id's digest the id its
        ``run.started`` recorded (the run id alone no longer spells it)."""
        if is_digest_run_id(run_id):
            first = self.journal.read(run_id, limit=1)
            inputs = first[0].data.get("inputs") if first else None
            if isinstance(inputs, dict) and isinstance(inputs.get("thread_id"), str):
                return inputs["thread_id"]
        return run_id[len(RUN_PREFIX):]

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Save ``checkpoint`` (one journal append) and return the config that names it."""
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), conf.get("checkpoint_ns", "")
        c = dict(checkpoint)
        values = c.pop("channel_values", {})
        # Only channels with a new version get a blob; the others are found at their older version.
        blobs = [
            [channel, version, _pack(self.serde.dumps_typed(values[channel])) if channel in values else ["empty", ""]]
            for channel, version in new_versions.items()
        ]
        meta = get_checkpoint_metadata(config, metadata)
        data = {
            "ns": ns,
            "id": checkpoint["id"],
            "parent": conf.get("checkpoint_id"),
            "checkpoint": _pack(self.serde.dumps_typed(c)),
            "metadata": _pack(self.serde.dumps_typed(meta)),
            "blobs": blobs,
            # What `engrain show` and the UI print; the packed fields above are what is read back.
            "summary": {"step": meta.get("step"), "source": meta.get("source"), "channels": sorted(new_versions)},
        }
        self._log(thread_id).append([("checkpoint", data)])
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Save a task's writes against the checkpoint in ``config`` (one journal append)."""
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), conf.get("checkpoint_ns", "")
        packed = [
            [WRITES_IDX_MAP.get(channel, idx), channel, _pack(self.serde.dumps_typed(value))]
            for idx, (channel, value) in enumerate(writes)
        ]
        data = {
            "ns": ns, "checkpoint_id": conf["checkpoint_id"], "task_id": task_id, "task_path": task_path,
            "writes": packed, "summary": {"task_id": task_id, "channels": [w[1] for w in packed]},
        }
        self._log(thread_id).append([("writes", data)])

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's checkpoints and writes (its run and events)."""
        self._log(str(thread_id)).delete()

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of one thread to another (one append to the target)."""
        entries = self._log(str(source_thread_id)).entries()
        if entries:
            self._log(str(target_thread_id)).append([(e.name, e.data) for e in entries])

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep each namespace's newest checkpoint; ``delete``: delete the threads."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}; use 'keep_latest' or 'delete'")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            th = self._thread(str(thread_id))
            old = [[ns, cid] for ns, saved in th.checkpoints.items() for cid in sorted(saved)[:-1]]
            if old:
                self._log(str(thread_id)).append([("removed", {"checkpoints": old, "summary": {"pruned": len(old)}})])

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) that LangGraph runs ``run_ids`` made, in every thread."""
        wanted = set(run_ids)
        if not wanted:
            return
        for thread_id in self._all_threads():
            th = self._thread(thread_id)
            gone = [
                [ns, cid] for ns, saved in th.checkpoints.items() for cid, d in saved.items()
                if self.serde.loads_typed(_unpack(d["metadata"])).get("run_id") in wanted
            ]
            if gone:
                self._log(thread_id).append([("removed", {"checkpoints": gone, "summary": {"runs": sorted(wanted)}})])

    # -- async: the journal is synchronous and thread-safe, so run it off the loop ---------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async :meth:`get_tuple` (run in a worker thread)."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async :meth:`list` (run in a worker thread)."""
        items = await asyncio.to_thread(lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in items:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async :meth:`put` (run in a worker thread)."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async :meth:`put_writes` (run in a worker thread)."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async :meth:`delete_thread` (run in a worker thread)."""
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async :meth:`copy_thread` (run in a worker thread)."""
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async :meth:`prune` (run in a worker thread)."""
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async :meth:`delete_for_runs` (run in a worker thread)."""
        await asyncio.to_thread(self.delete_for_runs, run_ids)


def __getattr__(name: str) -> Any:
    # EngrainStore loads skill memory (numpy, the embedder) only when asked for.
    if name == "EngrainStore":
        from .langgraph_store import EngrainStore

        return EngrainStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
