"""Synthesizers: records (and the article they update) -> an article's title and text.

``LLMSynthesizer`` asks OpenAI or Anthropic (official SDKs, imported on first
use; the key comes from ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY``, the
endpoint from ``base_url`` or the SDKs' ``OPENAI_BASE_URL`` /
``ANTHROPIC_BASE_URL``). Failures raise ``SynthesisError``. Without a
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

from .._errors import SynthesisError
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
    """Synthesis by an LLM through the official SDK: ``provider`` is ``"openai"`` or ``"anthropic"``.

    ``openai`` calls Chat Completions, ``anthropic`` calls Messages. The key
    comes from ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY``; ``model`` defaults to
    ``$ENGRAIN_MEMORY_MODEL``, else a small model of the provider. ``base_url``
    points the SDK at another endpoint (a proxy, a gateway, a compatible
    server); when ``None`` the SDK reads ``OPENAI_BASE_URL`` /
    ``ANTHROPIC_BASE_URL`` itself, else uses the provider's public API.
    ``timeout`` (seconds per request) and ``max_retries`` (the SDK retries
    connection errors, 408, 409, 429 and 5xx with backoff) go to the client.
    """

    def __init__(self, provider: str, model: str | None = None, max_tokens: int = 1200,
                 base_url: str | None = None, timeout: float = 120.0, max_retries: int = 2):
        if provider not in ("openai", "anthropic"):
            raise ValueError(f"LLMSynthesizer provider must be 'openai' or 'anthropic', not {provider!r}")
        if timeout <= 0:
            raise ValueError(f"LLMSynthesizer timeout must be > 0 seconds, not {timeout!r}")
        if max_retries < 0:
            raise ValueError(f"LLMSynthesizer max_retries must be >= 0, not {max_retries!r}")
        self.provider = provider
        self.model = model or os.environ.get("ENGRAIN_MEMORY_MODEL") or (
            "gpt-4o-mini" if provider == "openai" else "claude-haiku-4-5")
        self.max_tokens = max_tokens
        self.base_url = base_url
        self.timeout = timeout
        self.max_retries = max_retries
        self.name = f"llm ({provider}:{self.model})"
        self._client: Any = None

    def _sdk(self) -> Any:
        """The SDK module; imported on first use so engrain runs without either installed."""
        try:
            if self.provider == "openai":
                import openai as sdk
            else:
                import anthropic as sdk
        except ImportError as e:
            raise SynthesisError(f"{self.name}: the {self.provider!r} package is not installed "
                                 f"(pip install {self.provider})") from e
        return sdk

    def _make_client(self, sdk: Any) -> Any:
        kw: dict[str, Any] = {"timeout": self.timeout, "max_retries": self.max_retries}
        if self.base_url:  # only when given, so the SDK's own *_BASE_URL lookup stays in charge otherwise
            kw["base_url"] = self.base_url
        return sdk.OpenAI(**kw) if self.provider == "openai" else sdk.Anthropic(**kw)

    def _complete(self, system: str, user: str) -> str:
        sdk = self._sdk()
        try:
            if self._client is None:
                self._client = self._make_client(sdk)
            if self.provider == "openai":
                resp = self._client.chat.completions.create(
                    model=self.model, max_tokens=self.max_tokens, response_format={"type": "json_object"},
                    messages=[{"role": "system", "content": system}, {"role": "user", "content": user}])
            else:
                resp = self._client.messages.create(model=self.model, max_tokens=self.max_tokens, system=system,
                                                    messages=[{"role": "user", "content": user}])
        except sdk.APIStatusError as e:
            raise SynthesisError(f"{self.name} at {self._where()}: HTTP {e.status_code}: {_api_message(e)}") from e
        except sdk.APIError as e:  # timeout, connection refused, unreadable body
            raise SynthesisError(f"{self.name} at {self._where()}: {type(e).__name__}: {e}") from e
        if isinstance(resp, str):  # the SDK hands back a body it could not read as JSON as text
            raise SynthesisError(f"{self.name} at {self._where()}: malformed response, not JSON: {resp[:120]!r}")
        try:
            if self.provider == "openai":
                choice = resp.choices[0]
                text, stop = choice.message.content or "", choice.finish_reason
                cut = stop == "length"
            else:
                text = "".join(b.text for b in resp.content if getattr(b, "type", "") == "text")
                stop = resp.stop_reason
                cut = stop == "max_tokens"
        except (AttributeError, IndexError, TypeError) as e:
            what = "Chat Completions" if self.provider == "openai" else "Messages"
            raise SynthesisError(f"{self.name} at {self._where()}: malformed response, not a {what} reply "
                                 f"({type(e).__name__}: {e})") from e
        if cut:  # a cut-off reply is half an article: never store it
            raise SynthesisError(f"{self.name}: reply cut off at max_tokens={self.max_tokens} "
                                 f"(stop reason {stop!r}); raise max_tokens")
        return text

    def _where(self) -> str:
        return str(getattr(self._client, "base_url", None) or self.base_url or "(default endpoint)")

    def synthesize(self, skill: str, records: list[Record], previous: Article | None) -> tuple[str, str]:
        text = self._complete(_SYSTEM.format(skill=skill or "(none)"), _prompt(records, previous))
        m = re.search(r"\{.*\}", text, re.S)
        try:
            obj = json.loads(m.group(0) if m else text)
            title, content = str(obj["title"]).strip(), str(obj["content"]).strip()
        except (ValueError, KeyError, TypeError) as e:
            raise SynthesisError(f"{self.name} returned no JSON with 'title' and 'content': {text[:200]!r}") from e
        if not content:
            raise SynthesisError(f"{self.name} returned an empty article")
        return title or "untitled", content


def _api_message(e: Any) -> str:
    """The provider's own error message and type from an SDK status error, else the SDK's text."""
    body = getattr(e, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(inner, dict) and inner.get("message"):
        return str(inner["message"]) + (f" ({inner['type']})" if inner.get("type") else "")
    return str(getattr(e, "message", e))


def default_synthesizer() -> Synthesizer:
    """An LLM synthesizer when ``OPENAI_API_KEY`` or ``ANTHROPIC_API_KEY`` is set, else the extractive one."""
    if os.environ.get("OPENAI_API_KEY"):
        return LLMSynthesizer("openai")
    if os.environ.get("ANTHROPIC_API_KEY"):
        return LLMSynthesizer("anthropic")
    return ExtractiveSynthesizer()
