"""Durable runs: the pillar every other one runs on.

Holds the run context (:mod:`.context`: ``run``, ``now``, ``ask``/``answer``,
steps (:mod:`.steps`: the fold of events into steps, per-tool policy, replay),
run leases (:mod:`.lease`), recovery of orphaned runs
(:mod:`.recovery`), the ``@tool``/``@llm`` decorators and tool registry
(:mod:`.tools`), runs journaled in one transaction (:mod:`.batched`) and trace
export (:mod:`.trace`).

May import: ``_journal``, ``_events``, ``_errors``, and ``_sandbox`` (WASM tools).
"""
