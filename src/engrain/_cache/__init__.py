"""Behavior cache: muscle-mem's ``Engine`` on the journal.

Holds the engine and its outcome (:mod:`.engine`), one engine call's lookup,
replay, switch and hand-off (:mod:`.replay`), the entry store and task keys
(:mod:`.store`) and pre/post checks with their snapshot encoding
(:mod:`.checks`).

May import: ``_durable``, ``_routines`` (templates), ``_journal``, ``_events``, ``_errors``.
"""
