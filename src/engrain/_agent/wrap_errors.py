"""The SDK errors of ``engrain.wrap``'s steps, journaled so that a resume raises them as the SDK did.

A failed LLM step is replayed by raising its recorded error again. The SDKs' API errors take a
response and a body, not a message, so rebuilt from the message alone they lacked
``status_code``, ``body``, ``response`` and ``request``: code that caught the error and read
them (``if e.status_code == 429``) failed on resume where it had gone on the first time. The
step's failure records what the constructors need (status, headers, body, request line) and a
replay builds the error with the SDK's own classes from it.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from .. import _events as ev
from .._durable.context import RunContext, StepRecord
from .._durable.steps import replay as _replay

KEY = "sdk_error"  # the step.failed field holding it


def recorded(exc: BaseException, sdk: str) -> dict[str, Any]:
    """The extra ``step.failed`` data of ``exc`` (an error of the SDK ``sdk``), or none."""
    try:
        base = importlib.import_module(sdk).APIError
    except (ImportError, AttributeError):  # pragma: no cover - the SDK is imported by its client
        return {}
    if not isinstance(exc, base):
        return {}
    request = getattr(exc, "request", None)
    info: dict[str, Any] = {"method": str(getattr(request, "method", "POST")), "url": str(getattr(request, "url", ""))}
    body = getattr(exc, "body", None)
    if ev.is_json(body):
        info["body"] = body
    response = getattr(exc, "response", None)
    if response is not None:
        info["status"] = int(response.status_code)
        info["headers"] = {str(k): str(v) for k, v in response.headers.items()}
    return {KEY: info}


def replayed(ctx: RunContext, step: StepRecord, sdk: str) -> Any:
    """:func:`engrain._durable.steps.replay` of a wrapped step, raising a recorded SDK error as the SDK built it."""
    if step.state == "failed" and step.error_module.split(".")[0] == sdk:
        exc = _rebuilt(ctx, step, sdk)
        if exc is not None:
            raise exc
    return _replay(step)


def _rebuilt(ctx: RunContext, step: StepRecord, sdk: str) -> BaseException | None:
    info = None
    for e in ctx.journal.read(ctx.run_id):  # only a failed wrapped step is read again: that is rare
        if e.kind == ev.STEP_FAILED and e.data.get("call_id") == step.call_id and isinstance(e.data.get(KEY), dict):
            info = e.data[KEY]
    if info is None:
        return None
    try:
        mod = importlib.import_module(sdk)
        exceptions = importlib.import_module(f"{sdk}._exceptions")
        http = getattr(exceptions, "httpx2", None) or importlib.import_module("httpx")
        # Only the SDK's own error classes are built: the name comes from journal data.
        cls = getattr(mod, step.error_type, None)
        if not (isinstance(cls, type) and issubclass(cls, mod.APIError)):
            return None
        request = http.Request(str(info.get("method") or "POST"), str(info.get("url") or "http://replayed.invalid"))
        body = info.get("body")
        if issubclass(cls, mod.APIStatusError) and isinstance(info.get("status"), int):
            content = body if isinstance(body, str) else json.dumps(body) if body is not None else ""
            response = http.Response(info["status"], headers=info.get("headers") or {}, content=content.encode(),
                                     request=request)
            return cls(step.message, response=response, body=body)
        if issubclass(cls, mod.APITimeoutError):
            return cls(request=request)
        if issubclass(cls, mod.APIConnectionError):
            return cls(message=step.message, request=request)
        if not issubclass(cls, mod.APIStatusError):
            return cls(step.message, request, body=body)
    except Exception:  # noqa: BLE001 - an SDK whose classes take other arguments: the plain replay
        return None
    return None
