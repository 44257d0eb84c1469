"""Skill memory: ``remember``, ``recall``, ``consolidate``, ``export``, ``import_``, ``forget``, ``update``, ``stats``.

Memory lives in the journal's database in three tiers: **records** (raw
deposits, deduplicated per skill, with an optional TTL), the **buffer**
(deposits and recall events waiting for consolidation) and **articles**
(knowledge synthesized from records, with provenance to them).

    import engrain as eg

    mem = eg.Memory()                      # the default store, or Memory("postgresql://...")
    mem.remember("Deploys happen on Tuesdays", hint=0.9, skill="ops", metadata={"source": "runbook"})
    hits = mem.recall("when do we ship releases?", skill="ops", where={"source": "runbook"})
    mem.consolidate()                      # forms / reconsolidates articles
    other.import_(mem.export())            # hand the articles to another agent

The API is etchmem's (``hint`` is an importance from 0 to 1, ``consolidate``
returns a mapping, ``export`` a dict) with engrain's additions: a text
``label``, ``ttl``, ``where`` filters, ``forget``, ``update`` and ``import_``.

May import: ``_journal`` (store URLs), ``_errors``. Never a surface. This package only exports; the
class is in :mod:`.api`.
"""

from __future__ import annotations

from .api import Memory, SearchResult, memory
from .consolidate import ConsolidationSummary

__all__ = ["ConsolidationSummary", "Memory", "SearchResult", "memory"]
