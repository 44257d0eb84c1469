"""LLMSynthesizer through the official OpenAI and Anthropic SDKs, over real HTTP.

There is no network here, so ``ProviderStandIn`` is a local stand-in for the
providers' HTTP APIs: a stdlib HTTP server on 127.0.0.1 (a thread of this test
process) that speaks the wire format of OpenAI's Chat Completions and
Anthropic's Messages API, checks the parts of a request the real APIs reject
(auth header, required fields), records every request, and replies with
what the test scripted. It is not an LLM: the articles it returns are the
test's own text. Everything between ``Memory.consolidate()`` and the socket is
the real code: engrain, the SDK clients, their retries and error mapping.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from engrain._memory import Memory
from engrain._memory.synth import LLMSynthesizer, SynthesisError, _date, default_synthesizer

KEYS = {"openai": "sk-test-openai-5a1f", "anthropic": "sk-ant-test-9c2e"}
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}


class ProviderStandIn:
    """A local stand-in for the OpenAI and Anthropic HTTP APIs (records requests, replies as scripted).

    ``script`` holds the next replies, one per request, oldest first: ``("article", title, content)``
    answers in the provider's success format with that article as the model's JSON text;
    ``("error", status, type, message, headers)`` answers in the provider's error format;
    ``("raw", status, content_type, body)`` sends exactly those bytes; ``("sleep", seconds)`` waits and
    then takes the next entry. With an empty script it answers with a fixed article.
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.script: deque[tuple[Any, ...]] = deque()
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.server.block_on_close = False  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="provider-stand-in", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)

    def base_url(self, provider: str) -> str:
        """What a client's base URL is for this provider (OpenAI's includes ``/v1``, Anthropic's does not)."""
        return self.url + "/v1" if provider == "openai" else self.url

    def _next(self) -> tuple[Any, ...]:
        with self._lock:
            return self.script.popleft() if self.script else ("article", "Stand-in title", "Stand-in content.")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
                pass

            def _send(self, status: int, body: bytes, ctype: str = "application/json",
                      headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def _error(self, provider: str, status: int, etype: str, message: str,
                       headers: dict[str, str] | None = None) -> None:
                if provider == "openai":
                    err = {"error": {"message": message, "type": etype, "param": None, "code": None}}
                else:
                    err = {"type": "error", "error": {"type": etype, "message": message}}
                self._send(status, json.dumps(err).encode(), headers=headers)

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                provider = next((p for p, path in PATHS.items() if self.path == path), None)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                api.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                     "body": body})
                if provider is None:
                    return self._error("openai", 404, "not_found_error", f"no route {self.path}")
                if not isinstance(body, dict):
                    return self._error(provider, 400, "invalid_request_error", "body is not a JSON object")
                problem = self._check(provider, body)
                if problem:
                    return self._error(provider, *problem)
                step = api._next()
                while step[0] == "sleep":
                    time.sleep(step[1])
                    step = api._next()
                if step[0] == "error":
                    return self._error(provider, step[1], step[2], step[3], step[4] if len(step) > 4 else None)
                if step[0] == "raw":
                    return self._send(step[1], step[3], ctype=step[2])
                text = json.dumps({"title": step[1], "content": step[2]})
                self._send(200, json.dumps(self._success(provider, body, text)).encode())

            def _check(self, provider: str, body: dict[str, Any]) -> tuple[int, str, str] | None:
                """What the real API would refuse: wrong key, missing or mistyped required fields."""
                h = {k.lower(): v for k, v in self.headers.items()}
                if provider == "openai":
                    if h.get("authorization") != f"Bearer {KEYS['openai']}":
                        return 401, "invalid_request_error", "Incorrect API key provided"
                    msgs = body.get("messages")
                    if not isinstance(body.get("model"), str) or not isinstance(msgs, list) or not msgs:
                        return 400, "invalid_request_error", "'model' and 'messages' are required"
                    if not all(isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
                               and isinstance(m.get("content"), str) for m in msgs):
                        return 400, "invalid_request_error", "each message needs a role and string content"
                    return None
                key = h.get("x-api-key") or h.get("authorization", "").removeprefix("Bearer ")
                if key != KEYS["anthropic"]:
                    return 401, "authentication_error", "invalid x-api-key"
                if not h.get("anthropic-version"):
                    return 400, "invalid_request_error", "anthropic-version: header is required"
                msgs = body.get("messages")
                if not isinstance(body.get("model"), str) or not isinstance(body.get("max_tokens"), int) \
                        or not isinstance(msgs, list) or not msgs:
                    return 400, "invalid_request_error", "model, max_tokens and messages are required"
                if any(m.get("role") == "system" for m in msgs):
                    return 400, "invalid_request_error", "the system prompt goes in the top-level 'system' field"
                return None

            @staticmethod
            def _success(provider: str, body: dict[str, Any], text: str) -> dict[str, Any]:
                n_in = len(json.dumps(body)) // 4
                n_out = len(text) // 4
                if provider == "openai":
                    return {"id": "chatcmpl-" + uuid.uuid4().hex[:24], "object": "chat.completion",
                            "created": int(time.time()), "model": body["model"], "system_fingerprint": None,
                            "choices": [{"index": 0, "logprobs": None, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": text, "refusal": None}}],
                            "usage": {"prompt_tokens": n_in, "completion_tokens": n_out,
                                      "total_tokens": n_in + n_out}}
                return {"id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant",
                        "model": body["model"], "content": [{"type": "text", "text": text}],
                        "stop_reason": "end_turn", "stop_sequence": None,
                        "usage": {"input_tokens": n_in, "output_tokens": n_out}}

        return Handler


@pytest.fixture
def provider_api(monkeypatch) -> Iterator[ProviderStandIn]:
    # Whatever the machine has set must not steer the SDKs elsewhere.
    for var in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "OPENAI_CUSTOM_HEADERS",
                "ANTHROPIC_CUSTOM_HEADERS", "ANTHROPIC_PROFILE", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID",
                "ENGRAIN_MEMORY_MODEL", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("OPENAI_API_KEY", KEYS["openai"])
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEYS["anthropic"])
    api = ProviderStandIn()
    yield api
    api.close()


def _synth(provider: str, api: ProviderStandIn, route: str, monkeypatch, **kw: Any) -> LLMSynthesizer:
    """A synthesizer pointed at the stand-in through the SDK's env var or through ``base_url``."""
    if route == "env":
        monkeypatch.setenv(f"{provider.upper()}_BASE_URL", api.base_url(provider))
        return LLMSynthesizer(provider, **kw)
    return LLMSynthesizer(provider, base_url=api.base_url(provider), **kw)


def _prompt_parts(provider: str, body: dict[str, Any]) -> tuple[str, str]:
    """(system, user) text out of a recorded request body, in each provider's own layout."""
    if provider == "openai":
        roles = {m["role"]: m["content"] for m in body["messages"]}
        return roles["system"], roles["user"]
    assert [m["role"] for m in body["messages"]] == ["user"]
    return body["system"], body["messages"][0]["content"]


@pytest.mark.parametrize("route", ["env", "argument"])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_consolidate_through_sdk(provider, route, store_url, embedder, provider_api, monkeypatch):
    model = f"{provider}-test-model"
    llm = _synth(provider, provider_api, route, monkeypatch, model=model)
    provider_api.script.append(("article", "Production deploys", "Deploys run on Tuesday afternoons (runbook, wiki)."))
    m = Memory(store_url, embedder=embedder, synthesizer=llm)
    try:
        a = m.remember("Production deploys happen every Tuesday afternoon.", skill="ops",
                       metadata={"source": "runbook"})
        b = m.remember("Deploys to production go out on Tuesday afternoons.", skill="ops", metadata={"author": "wiki"})
        s = m.consolidate()
        assert not s.errors and s.formed == 1 and s.kept == 0, s
        assert s.synthesizer == f"llm ({provider}:{model})"

        (req,) = provider_api.requests
        assert req["path"] == PATHS[provider]
        if provider == "openai":
            assert req["headers"]["authorization"] == f"Bearer {KEYS['openai']}"
            assert req["body"]["response_format"] == {"type": "json_object"}
        else:
            h = req["headers"]
            assert KEYS["anthropic"] in (h.get("x-api-key"), h.get("authorization", "").removeprefix("Bearer "))
            assert h["anthropic-version"]
        assert req["body"]["model"] == model and req["body"]["max_tokens"] == 1200
        system, user = _prompt_parts(provider, req["body"])
        assert "'ops'" in system and "date" in system and "attribute" in system and "JSON" in system
        recs = m.store.records([a, b])
        assert f"[{_date(recs[a].created)}] [source: runbook] Production deploys happen every Tuesday" in user
        assert f"[{_date(recs[b].created)}] [source: wiki] Deploys to production go out" in user
        assert "PREVIOUS ARTICLE" not in user

        (art,) = m.store.articles(skill="ops")
        assert (art.title, art.content) == ("Production deploys", "Deploys run on Tuesday afternoons (runbook, wiki).")
        assert art.synthesizer == s.synthesizer and set(art.sources) == {a, b} and art.version == 1

        # Reconsolidation sends the article the provider wrote back as the previous version.
        assert any(h.tier == "article" for h in m.recall("when do production deploys happen?", skill="ops"))
        m.remember("Since March 2026 production deploys moved to Thursday.", skill="ops", metadata={"source": "cto"})
        provider_api.script.append(("article", "Production deploys", "Thursdays since March 2026 (cto)."))
        s = m.consolidate()
        assert not s.errors and s.reconsolidated == 1, s
        _, user2 = _prompt_parts(provider, provider_api.requests[1]["body"])
        assert "PREVIOUS ARTICLE (version 1" in user2 and "Deploys run on Tuesday afternoons (runbook, wiki)." in user2
        assert "[source: cto] Since March 2026" in user2
        (art,) = m.store.articles(skill="ops")
        assert art.content == "Thursdays since March 2026 (cto)." and art.version == 2
    finally:
        m.close()


def test_default_synthesizer_follows_sdk_env(provider_api, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", provider_api.base_url("openai"))
    monkeypatch.setenv("ENGRAIN_MEMORY_MODEL", "env-model")
    llm = default_synthesizer()
    assert isinstance(llm, LLMSynthesizer) and llm.name == "llm (openai:env-model)"
    provider_api.script.append(("article", "T", "C"))
    assert llm.synthesize("", [], None) == ("T", "C")
    assert provider_api.requests[0]["body"]["model"] == "env-model"


def _prose_reply(provider: str, text: str) -> dict[str, Any]:
    """A well-formed success body whose model text is ``text`` (not the article JSON)."""
    if provider == "openai":
        return {"id": "chatcmpl-prose", "object": "chat.completion", "created": int(time.time()), "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                             "message": {"role": "assistant", "content": text, "refusal": None}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    return {"id": "msg_prose", "type": "message", "role": "assistant", "model": "m",
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1}}


#: name -> (the stand-in's reply for a provider, what the reported error must say).
FAILURES: dict[str, tuple[Any, tuple[str, ...]]] = {
    "http-500": (lambda p: ("error", 500, "api_error", "The server had an error processing your request"),
                 ("HTTP 500", "The server had an error processing your request (api_error)")),
    "http-429": (lambda p: ("error", 429, "rate_limit_error", "Rate limit reached for requests", {"retry-after": "0"}),
                 ("HTTP 429", "Rate limit reached for requests (rate_limit_error)")),
    "html-body": (lambda p: ("raw", 200, "text/html", b"<html><body>502 Bad Gateway</body></html>"),
                  ("malformed response, not JSON", "502 Bad Gateway")),
    "wrong-shape": (lambda p: ("raw", 200, "application/json", b'{"object": "list", "data": []}'),
                    ("malformed response, not a ",)),
    "not-an-article": (lambda p: ("raw", 200, "application/json",
                                  json.dumps(_prose_reply(p, "Sorry, I cannot help with that.")).encode()),
                       ("no JSON", "Sorry, I cannot help")),
}


@pytest.mark.parametrize("failure", list(FAILURES))
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_provider_failure_is_reported_and_records_kept(provider, failure, store_url, embedder, provider_api,
                                                       monkeypatch):
    llm = _synth(provider, provider_api, "argument", monkeypatch, model="m", max_retries=0)
    reply, says = FAILURES[failure]
    provider_api.script.append(reply(provider))
    m = Memory(store_url, embedder=embedder, synthesizer=llm)
    try:
        ids = [m.remember("Invoices must be approved by the finance lead.", skill="finance", metadata={"by": "cfo"}),
               m.remember("The finance lead approves every invoice before payment.", skill="finance")]
        s = m.consolidate()
        assert s.formed == 0 and s.kept == 2 and len(s.errors) == 1, s
        err = s.errors[0]
        assert "skill 'finance'" in err and "SynthesisError" in err and f"llm ({provider}:m)" in err
        assert KEYS[provider] not in err
        assert all(x in err for x in says), err
        if failure == "wrong-shape":
            assert ("Chat Completions" if provider == "openai" else "Messages") + " reply" in err
        if failure.startswith("http-"):
            assert provider_api.url in err  # names the endpoint it called
        assert m.store.articles() == [] and m.stats()["buffer"] == 2
        assert all(r.article_id is None for r in m.store.records(ids).values())

        # The provider recovers: the next pass consolidates the same records, nothing lost.
        provider_api.script.append(("article", "Invoice approval", "The finance lead approves invoices (cfo)."))
        s = m.consolidate()
        assert not s.errors and s.formed == 1 and s.kept == 0, s
        (art,) = m.store.articles()
        assert set(art.sources) == set(ids) and art.content == "The finance lead approves invoices (cfo)."
        assert len(provider_api.requests) == 2
    finally:
        m.close()


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_sdk_retry_rides_out_one_429(provider, store_url, embedder, provider_api, monkeypatch):
    llm = _synth(provider, provider_api, "argument", monkeypatch, model="m", max_retries=1)
    provider_api.script.extend([("error", 429, "rate_limit_error", "slow down", {"retry-after-ms": "50"}),
                                ("article", "Coffee", "Third floor, next to the lifts.")])
    m = Memory(store_url, embedder=embedder, synthesizer=llm)
    try:
        m.remember("The office coffee machine is on the third floor next to the lifts.", skill="office")
        s = m.consolidate()
        assert not s.errors and s.formed == 1, s
        assert len(provider_api.requests) == 2
        assert provider_api.requests[0]["body"] == provider_api.requests[1]["body"]
    finally:
        m.close()


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_timeout_is_reported(provider, provider_api, monkeypatch):
    llm = _synth(provider, provider_api, "argument", monkeypatch, model="m", timeout=0.3, max_retries=0)
    provider_api.script.extend([("sleep", 1.0), ("article", "late", "late")])
    t0 = time.monotonic()
    with pytest.raises(SynthesisError, match="Timeout"):
        llm.synthesize("ops", [], None)
    assert time.monotonic() - t0 < 0.9


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_cut_off_reply_is_refused(provider, provider_api, monkeypatch):
    llm = _synth(provider, provider_api, "argument", monkeypatch, model="m", max_tokens=5, max_retries=0)
    reply = _prose_reply(provider, '{"title": "Half", "content": "an art')
    if provider == "openai":
        reply["choices"][0]["finish_reason"] = "length"
    else:
        reply["stop_reason"] = "max_tokens"
    provider_api.script.append(("raw", 200, "application/json", json.dumps(reply).encode()))
    with pytest.raises(SynthesisError, match="cut off at max_tokens=5"):
        llm.synthesize("ops", [], None)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="provider"):
        LLMSynthesizer("mistral")
    with pytest.raises(ValueError, match="timeout"):
        LLMSynthesizer("openai", timeout=0)
    with pytest.raises(ValueError, match="max_retries"):
        LLMSynthesizer("anthropic", max_retries=-1)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_related_facts_form_one_llm_article(provider, store_url, embedder, provider_api, monkeypatch):
    """etchmem's three Eiffel Tower facts: one request to the model, one article (as with the extractive one)."""
    llm = _synth(provider, provider_api, "argument", monkeypatch)
    provider_api.script.append(("article", "Eiffel Tower", "330 m tall; completed 1889; ~7 million visitors a year."))
    m = Memory(store_url, embedder=embedder, synthesizer=llm)
    try:
        for t in ("The Eiffel Tower is 330 metres tall including its antenna.",
                  "The tower was completed in 1889 and was originally intended to be temporary.",
                  "It receives about 7 million visitors per year, making it the world's most visited paid monument."):
            m.remember(t)
        s = m.consolidate()
        assert not s.errors and s.formed == 1, s
        (req,) = provider_api.requests
        _, user = _prompt_parts(provider, req["body"])
        assert "330 metres" in user and "1889" in user and "7 million visitors" in user
        (art,) = m.store.articles()
        assert art.title == "Eiffel Tower" and len(art.sources) == 3
    finally:
        m.close()
