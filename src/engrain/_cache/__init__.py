"""Behavior cache: muscle-mem's ``Engine`` on the journal.

Holds the engine and its outcome (:mod:`.engine`), one engine call's lookup,
replay, switch and hand-off (:mod:`.replay`), the engine's tools as the
agent calls them, each call recorded (:mod:`.tools`), entries resolved against the
engine's tools (:mod:`.plan`), the entry store (:mod:`.store`),
task keys and which params a trajectory binds or pins (:mod:`.binding`),
pre/post checks with their snapshot encoding (:mod:`.checks`), values as a
call had them and the results later calls used (:mod:`.values`) and
``engine.metrics`` (:mod:`.metrics`).

May import: ``_durable``, ``_routines`` (templates), ``_journal``, ``_events``, ``_errors``.
"""
