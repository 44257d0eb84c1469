"""Durable runs: the pillar every other one runs on.

Holds the run context (:mod:`.context`: a run's journal cursor, replay,
cancellation), a run's life (:mod:`.execution`: ``run``/``run_async``), the
clock and human input (:mod:`.human`: ``now``, ``ask``/``answer``), sleep
(:mod:`.sleep`), versioning (:mod:`.patching`), cancel/fork/gc
(:mod:`.operate`), observers for exporters (:mod:`.observe`, :mod:`.otel`),
steps (:mod:`.steps`: the fold of events into steps, per-tool policy, replay),
what a run records about its agent (:mod:`.outcome`: its name, its failure and
traceback), run leases (:mod:`.lease`), recovery of orphaned runs by agent
(:mod:`.recovery`), the ``@tool``/``@llm`` decorators and tool registry
(:mod:`.tools`), ``@udf`` (:mod:`.udf`) and its source capture (:mod:`.udf_source`),
runs journaled in one transaction (:mod:`.batched`) and trace
export (:mod:`.trace`).

May import: ``_journal``, ``_events``, ``_errors``, and ``_sandbox`` (WASM tools).
"""
