"""``engrain demo``, part 4: skill memory with real local embeddings.

Observations an agent made in two skills are remembered (embedded locally by
the MiniLM model, no LLM), recalled by questions that share almost no words
with them, and consolidated into articles: by an LLM when ``OPENAI_API_KEY`` or
``ANTHROPIC_API_KEY`` is set, else by the offline extractive synthesizer, and
the tour prints which.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .._journal import Journal

#: (skill, hint, observation); the repeated one is stored once.
OBSERVATIONS = [
    ("deploys", "deploy day", "Production deploys happen on Tuesday mornings."),
    ("deploys", "deploy day", "We deploy to production every Tuesday morning after the stand-up."),
    ("deploys", "rollback", "Roll back a bad deploy with make rollback; it takes about four minutes."),
    ("deploys", "rollback", "To undo a broken deploy, run make rollback (about four minutes)."),
    ("support", "refunds", "Support agents may refund up to 50 EUR without a manager."),
    ("support", "refunds", "Refunds under 50 EUR need no manager approval."),
    ("support", "accounts", "Password reset links expire after 30 minutes."),
    ("deploys", "deploy day", "Production deploys happen on Tuesday mornings."),
]
#: Paraphrased questions, the skill they search (None: all) and the hint whose records must come first.
QUERIES = [
    ("when do releases go live?", None, "deploy day"),
    ("can a customer get their money back?", "support", "refunds"),
]


def _short(text: str, n: int = 64) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def memory_section(journal: Journal, workdir: Any, out: Callable[[str], None]) -> bool:
    """Part 4: remember, recall by a paraphrase, consolidate into articles, stats."""
    from .._memory import Memory
    from .._memory.embed import default_embedder

    out("4. Skill memory: remember observations, recall them by meaning, consolidate them into articles")
    out("   loading the local embedding model (all-MiniLM-L6-v2, int8 ONNX)…")
    t0 = time.perf_counter()
    embedder = default_embedder()
    embedder.embed(["warm-up"])  # the model loads on first use; time it here, not in remember()
    out(f"   loaded {embedder.name} in {time.perf_counter() - t0:.2f} s")
    ok = True
    with Memory(journal.url, embedder=embedder) as mem:
        t0 = time.perf_counter()
        ids = mem.remember_many([{"data": text, "label": hint, "skill": skill} for skill, hint, text in OBSERVATIONS])
        ms = (time.perf_counter() - t0) * 1000
        by_hint: dict[str, set[str]] = {}
        for (_, hint, _), rid in zip(OBSERVATIONS, ids):
            by_hint.setdefault(hint, set()).add(rid)
        skills = sorted({s for s, _, _ in OBSERVATIONS})
        out(f"   remembered {len(OBSERVATIONS)} observations in {len(skills)} skills ({', '.join(skills)}) as "
            f"{len(set(ids))} records (a repeat is stored once); no LLM call, {ms:.0f} ms")

        for query, skill, hint in QUERIES:
            t0 = time.perf_counter()
            hits = mem.recall(query, skill=skill, top_k=3)
            ms = (time.perf_counter() - t0) * 1000
            scope = f" in {skill}" if skill else ""
            top = hits[0] if hits else None
            # On a store kept from an earlier tour, the article built from those records may rank first.
            right = top is not None and (top.id in by_hint[hint] or bool(set(top.provenance.get("sources") or []) & by_hint[hint]))
            ok = ok and right
            out(f"   recall {query!r}{scope} ({ms:.0f} ms):")
            for h in hits:
                out(f"      {h.score:.3f}  {h.tier:<8}{h.skill or '-':<9}{_short(h.content)}")
            if not right:
                out(f"   expected a {hint!r} record (or an article built from them) first")

        t0 = time.perf_counter()
        summary = mem.consolidate()
        ms = (time.perf_counter() - t0) * 1000
        out(f"   consolidated in {ms:.0f} ms: {summary.formed} articles formed, {summary.flushed} buffer rows processed, "
            f"{len(summary.errors)} errors")
        out(f"   synthesizer: {summary.synthesizer}")
        for e in summary.errors:
            out(f"   error: {e}")
        arts = mem.store.articles()
        for a in sorted(arts, key=lambda a: (a.skill, a.title)):
            out(f"      {a.skill:<9}{_short(a.title, 24):<26}from {len(a.sources)} record{'s' if len(a.sources) != 1 else ''}")
        ok = ok and not summary.errors and len(arts) >= 1

        query, skill, _ = QUERIES[0]
        hits = mem.recall(query, skill=skill, top_k=1)
        if hits:
            h = hits[0]
            what = f"article {h.provenance.get('title')!r} from {len(h.provenance.get('sources') or [])} records" if h.tier == "article" else "record"
            out(f"   recall {query!r} again: {what}, score {h.score:.3f}")
        st = mem.stats()
        out(f"   stats: {st['records']} records, {st['articles']} articles, {st['buffer']} in the buffer (the recall since), "
            f"consolidation passes: {st['consolidations']}; vector search {st['vector_search']}, {st['backend']}")
    return ok
