"""Synthesizers: records (and the article they update) -> an article's title and text.

``LLMSynthesizer`` asks OpenAI or Anthropic (official SDKs, imported on first
use; the key comes from ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY``). Without a
key, ``ExtractiveSynthesizer`` builds the article offline from the records'
own sentences, and its ``name`` says so in every consolidation summary.
Both keep facts, dates and attribution: each line of an extractive article is
one dated, attributed record; the LLM prompt demands the same.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from typing import Any, Protocol

import numpy as np

from .items import Article, Record

#: Metadata keys read (in order) as the source of a record.
ATTRIBUTION_KEYS = ("source", "author", "by", "user", "agent", "url")


class Synthesizer(Protocol):
    """Writes an article from records; ``previous`` is the article being rewritten, if any."""

    name: str

    def synthesize(self, skill: str, records: list[Record], previous: Article | None) -> tuple[str, str]: ...


def _date(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d")


def attribution(r: Record) -> str:
    """Who or what a record came from (metadata source/author/...), else its hint, else ``""``."""
    for k in ATTRIBUTION_KEYS:
        v = r.metadata.get(k)
        if isinstance(v, (str, int, float)) and str(v).strip():
            return str(v)
    return r.hint


def _line(r: Record) -> str:
    who = attribution(r)
    return f"- {_date(r.created)}: {r.content.strip()}" + (f" (source: {who})" if who else "")


class ExtractiveSynthesizer:
    """Offline synthesis: the records' own text, deduplicated, dated, attributed, oldest first.

    Near-identical records (cosine >= ``dedupe``) collapse into their newest
    wording. The title is the previous title, else the first hint, else the
    opening words of the record closest to the cluster's centre.
    """

    name = "extractive (offline: no OPENAI_API_KEY or ANTHROPIC_API_KEY set, no LLM used)"

    def __init__(self, dedupe: float = 0.95, title_words: int = 8):
        self.dedupe = dedupe
        self.title_words = title_words

    def synthesize(self, skill: str, records: list[Record], previous: Article | None) -> tuple[str, str]:
        recs = sorted(records, key=lambda r: (r.created, r.seq))
        kept: list[Record] = []
        for r in reversed(recs):  # newest first, so a restated fact keeps its latest wording
            if all(float(r.embedding @ k.embedding) < self.dedupe for k in kept):
                kept.append(r)
        kept.reverse()
        if previous is not None:
            title = previous.title
        else:
            hints = [r.hint for r in recs if r.hint]
            if hints:
                title = hints[0]
            else:
                centre = np.mean([r.embedding for r in recs], axis=0)
                best = max(recs, key=lambda r: float(r.embedding @ centre))
                words = re.findall(r"\S+", best.content)
                title = " ".join(words[: self.title_words]) + ("…" if len(words) > self.title_words else "")
        span = f"{_date(recs[0].created)} to {_date(recs[-1].created)}" if recs else ""
        body = "\n".join(_line(r) for r in kept)
        return title, f"{body}\n({len(kept)} fact(s) from {len(recs)} record(s), {span})"


_SYSTEM = (
    "You maintain one article of an AI agent's long-term memory for the skill {skill!r}. "
    "Write the article from the records below (and the previous version, if given). Keep every fact, "
    "number, name and date; attribute each fact to its source exactly as given; when a newer record "
    "contradicts an older fact, keep the newer one and say what changed and when. Do not invent anything. "
    'Reply with JSON only: {{"title": "<short title>", "content": "<the article>"}}.'
)


def _prompt(records: list[Record], previous: Article | None) -> str:
    parts = []
    if previous is not None:
        parts.append(f"PREVIOUS ARTICLE (version {previous.version}, updated {_date(previous.updated)}):\n"
                     f"{previous.title}\n{previous.content}\n")
    parts.append("RECORDS (oldest first):")
    for r in sorted(records, key=lambda r: r.created):
        who = attribution(r)
        parts.append(f"[{_date(r.created)}]" + (f" [source: {who}]" if who else "") + f" {r.content}")
    return "\n".join(parts)


class LLMSynthesizer:
    """Synthesis by an LLM: ``provider`` is ``"openai"`` or ``"anthropic"``."""

    def __init__(self, provider: str, model: str | None = None, max_tokens: int = 1200):
        if provider not in ("openai", "anthropic"):
            raise ValueError(f"LLMSynthesizer provider must be 'openai' or 'anthropic', not {provider!r}")
        self.provider = provider
        self.model = model or os.environ.get("ENGRAIN_MEMORY_MODEL") or (
            "gpt-4o-mini" if provider == "openai" else "claude-3-5-haiku-latest")
        self.max_tokens = max_tokens
        self.name = f"llm ({provider}:{self.model})"
        self._client: Any = None

    def _complete(self, system: str, user: str) -> str:
        if self.provider == "openai":
            if self._client is None:
                import openai

                self._client = openai.OpenAI()
            resp = self._client.chat.completions.create(
                model=self.model, max_tokens=self.max_tokens, response_format={"type": "json_object"},
                messages=[{"role": "system", "content": system}, {"role": "user", "content": user}])
            return resp.choices[0].message.content or ""
        if self._client is None:
            import anthropic

            self._client = anthropic.Anthropic()
        resp = self._client.messages.create(model=self.model, max_tokens=self.max_tokens, system=system,
                                            messages=[{"role": "user", "content": user}])
        return "".join(getattr(b, "text", "") for b in resp.content)

    def synthesize(self, skill: str, records: list[Record], previous: Article | None) -> tuple[str, str]:
        from .._errors import EngrainError

        text = self._complete(_SYSTEM.format(skill=skill or "(none)"), _prompt(records, previous))
        m = re.search(r"\{.*\}", text, re.S)
        try:
            obj = json.loads(m.group(0) if m else text)
            title, content = str(obj["title"]).strip(), str(obj["content"]).strip()
        except (ValueError, KeyError, TypeError) as e:
            raise EngrainError(f"{self.name} returned no JSON with 'title' and 'content': {text[:200]!r}") from e
        if not content:
            raise EngrainError(f"{self.name} returned an empty article")
        return title or "untitled", content


def default_synthesizer() -> Synthesizer:
    """An LLM synthesizer when ``OPENAI_API_KEY`` or ``ANTHROPIC_API_KEY`` is set, else the extractive one."""
    if os.environ.get("OPENAI_API_KEY"):
        return LLMSynthesizer("openai")
    if os.environ.get("ANTHROPIC_API_KEY"):
        return LLMSynthesizer("anthropic")
    return ExtractiveSynthesizer()
