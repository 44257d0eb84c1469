"""``engrain.Client``: the HTTP API of ``engrain serve`` with the local API's method names.

    client = engrain.Client("http://127.0.0.1:8765", token="...")
    for run in client.runs(status="needs_input"):
        client.answer(run.run_id, {"approved": True})
    client.remember("Deploys happen on Tuesdays", skill="ops")
    hits = client.recall("when do we deploy?", skill="ops")

Errors come back typed: every 4xx/5xx is a :class:`~engrain.RemoteError`, and
also a :class:`~engrain.RunNotFoundError` for an unknown run, a
:class:`~engrain.ConflictError` for a lost append race (the server's
``ConflictError``, nothing else: a 409 for another reason is no race to retry) or a
:class:`~engrain.RunFinishedError` for answers to a run that has ended (a
:class:`~engrain.NotWaitingForInputError` for one still going that asks nothing); a server
that cannot be reached is a :class:`~engrain.ServerUnreachableError` naming the URL.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import httpx

from .._durable.context import RunResult
from .._errors import ConfigError, RemoteError, RunNotFoundError, ServerUnreachableError
from .._events import STATUS_ALIASES, Event, RunInfo, check_status
from .errors import remote_error


#: Statuses of a run that has not ended and asks for nothing: :meth:`Client.wait_run` keeps waiting on them.
_UNFINISHED = frozenset({"running", "queued"})

#: Events asked for per ``GET /api/runs/{id}/events`` page (the server's default; it allows up to 10,000).
_PAGE = 1000


def _seg(value: str) -> str:
    """``value`` as one path segment: the server routes ``%2F`` as part of an id, not as a separator."""
    # httpx resolves "." and ".." segments before sending, so an id made only of dots is escaped too.
    return value.replace(".", "%2E") if value.strip(".") == "" else quote(value, safe="")


#: Longest wait (seconds) a retry takes from a ``Retry-After`` header.
MAX_RETRY_WAIT = 30.0


def _retry_wait(resp: httpx.Response, attempt: int) -> float:
    """Seconds before retrying ``resp``: its ``Retry-After`` (seconds; capped), else 0.5 s doubling."""
    try:
        wait = float(resp.headers["retry-after"])
    except (KeyError, ValueError):  # absent, or an HTTP date: back off on our own
        return 0.5 * 2 ** attempt
    return min(wait, MAX_RETRY_WAIT) if wait >= 0 else 0.0  # (NaN is not >= 0)


def _run_info(d: dict[str, Any]) -> RunInfo:
    return RunInfo(d["run_id"], STATUS_ALIASES.get(d["status"], d["status"]), d["task"], list(d.get("tags") or []),
                   d["created"], d["updated"], d["events"], d.get("lease_owner"), d.get("lease_until"),
                   agent=d.get("agent"))


def _run_result(d: dict[str, Any]) -> RunResult:
    return RunResult(d["run_id"], d["status"], d.get("output"), d.get("error"), d.get("prompt"),
                     d.get("replayed", 0), d.get("executed", 0),
                     d.get("step_id"), d.get("error_type"), d.get("message"))


class Client:
    """A client of an engrain server at ``base_url`` (``token``: its bearer token, if any).

    A read (GET) answered 503 (the server's store unavailable, or its connections full)
    or 429 is tried again up to ``max_retries`` times, after the ``Retry-After`` the
    server sent (at most 30 s; else 0.5 s, doubling). A write is never repeated: whether
    it took effect is the server's to say.
    """

    def __init__(self, base_url: str = "http://127.0.0.1:8765", token: str | None = None, *,
                 timeout: float = 60.0, transport: httpx.BaseTransport | None = None, max_retries: int = 2):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"Client base_url {base_url!r}: write it as http://HOST:PORT (engrain serve prints it)")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or not 0 <= max_retries <= 10:
            raise ConfigError(f"Client max_retries must be an integer from 0 to 10, got {max_retries!r}")
        self.max_retries = max_retries
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------

    @contextmanager
    def _reaching(self) -> Iterator[None]:
        """httpx's transport errors (refused, unknown host, timeout) as one engrain error naming the URL."""
        try:
            yield
        except httpx.TimeoutException as e:
            raise ServerUnreachableError(self.base_url, f"no answer in time ({type(e).__name__})") from e
        except httpx.TransportError as e:
            raise ServerUnreachableError(self.base_url, str(e) or type(e).__name__) from e

    def _raise(self, resp: httpx.Response, run_id: str | None) -> None:
        try:
            body = resp.json()
            error, detail = str(body.get("error", "HTTPError")), body.get("detail", "")
        except (ValueError, AttributeError):
            body, error, detail = None, "HTTPError", resp.text[:500]
        raise remote_error(resp.status_code, error, detail, body, run_id)

    def _call(self, method: str, path: str, *, run_id: str | None = None, **kw: Any) -> Any:
        for attempt in range(self.max_retries + 1):
            with self._reaching():
                resp = self._http.request(method, "/api" + path, **kw)
            if resp.status_code not in (429, 503) or method != "GET" or attempt == self.max_retries:
                break
            time.sleep(_retry_wait(resp, attempt))
        if resp.status_code >= 400:
            self._raise(resp, run_id)
        return resp.json()

    # -- runs -------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """The server's version, backend and features."""
        return self._call("GET", "/health")

    def runs(self, *, status: str | None = None, tag: str | None = None, task: str | None = None,
             limit: int = 50, offset: int = 0, internal: bool = True) -> list[RunInfo]:
        """Runs matching every filter, most recently updated first.

        ``status`` is checked before the request: :class:`~engrain.UnknownStatusError`
        lists the valid names (``"completed"`` is accepted for ``"ok"``). ``internal=False``
        leaves out the runs the runtime makes for itself (LLM agent definitions, cache calls).
        """
        if status is not None:
            status = check_status(status)
        params = {k: v for k, v in {"status": status, "tag": tag, "task": task}.items() if v is not None}
        if not internal:
            params["internal"] = "false"
        return [_run_info(d) for d in self._call("GET", "/runs", params={**params, "limit": limit, "offset": offset})]

    def get_run(self, run_id: str) -> RunInfo | None:
        """The summary of ``run_id``, or None if the server has no such run."""
        try:
            return _run_info(self.show(run_id)["run"])
        except RunNotFoundError:
            return None

    def show(self, run_id: str) -> dict[str, Any]:
        """``{run, events, steps, prompt, output, error}`` of a run (see docs/api.md)."""
        return self._call("GET", f"/runs/{_seg(run_id)}", run_id=run_id)

    def events(self, run_id: str, after: int = -1) -> list[Event]:
        """Events of ``run_id`` with ``seq > after`` (every page of them)."""
        out: list[Event] = []
        while True:
            page = self._call("GET", f"/runs/{_seg(run_id)}/events", params={"after": after, "limit": _PAGE},
                              run_id=run_id)
            out.extend(Event.from_dict(d) for d in page)
            if len(page) < _PAGE:
                return out
            after = out[-1].seq

    def read(self, run_id: str, after: int = -1) -> list[Event]:
        """Alias of :meth:`events`, the journal's name for it."""
        return self.events(run_id, after)

    def stream(self, run_id: str, after: int = -1) -> Iterator[Event]:
        """Events of ``run_id`` as they are appended (server-sent events), until the run finishes."""
        url = f"/api/runs/{_seg(run_id)}/stream"
        timeout = httpx.Timeout(self._http.timeout.connect, read=None)
        with self._reaching(), self._http.stream("GET", url, params={"after": after}, timeout=timeout) as resp:
            if resp.status_code >= 400:
                resp.read()
                self._raise(resp, run_id)
            data: list[str] = []
            for line in resp.iter_lines():
                if line.startswith("data:"):
                    data.append(line[5:].lstrip())
                elif not line and data:
                    yield Event.from_dict(json.loads("\n".join(data)))
                    data = []

    def append(self, run_id: str, events: list[dict[str, Any]], expected_seq: int) -> list[Event]:
        """Append ``[{kind, name, data}]`` at ``expected_seq`` (:class:`ConflictError` if another writer won).

        Only into a run this client created (``run.started`` at 0; the server tags it
        ``client``): runs engrain's runtime writes answer 403 ``RuntimeOnlyError``.
        """
        body = {"events": events, "expected_seq": expected_seq}
        return [Event.from_dict(d) for d in self._call("POST", f"/runs/{_seg(run_id)}/events", json=body, run_id=run_id)]

    def start_run(self, routine: str, inputs: dict[str, Any] | None = None, *, run_id: str | None = None) -> RunResult:
        """Start a run of a routine on the server (to its end or first prompt)."""
        body = {"routine": routine, "inputs": inputs or {}, "run_id": run_id}
        return _run_result(self._call("POST", "/runs", json=body))

    def start_agent(self, agent: str, task: str, inputs: dict[str, Any] | None = None, *,
                    run_id: str | None = None, wait: float | None = None) -> RunResult:
        """Start (or, with an unfinished ``run_id``, continue) a run of an agent registered on the server.

        The server waits up to ``wait`` seconds (its default: 5) for the run to end or
        ask for input; a run still going then has ``status == "running"`` (see :meth:`wait_run`).
        """
        # No inputs: none for a new run, the recorded ones for a run_id to continue.
        body: dict[str, Any] = {"agent": agent, "task": task, "inputs": inputs, "run_id": run_id}
        if wait is not None:
            body["wait"] = wait
        return _run_result(self._call("POST", "/runs", json=body, run_id=run_id))

    def answer(self, run_id: str, answers: dict[str, Any], *, wait: float | None = None) -> RunResult:
        """Answer the prompt a ``needs_input`` run waits for.

        A routine run, or a run of an agent registered on the server, is resumed
        there (an agent run is waited for up to ``wait`` seconds); any other run's
        answers are recorded for its own process and the status is ``running``.
        A run that has ended raises :class:`~engrain.RunFinishedError` (as
        :func:`engrain.answer` does); one not waiting for input, a :class:`~engrain.NotWaitingForInputError`.
        """
        body: dict[str, Any] = {"answers": answers, **({"wait": wait} if wait is not None else {})}
        return _run_result(self._call("POST", f"/runs/{_seg(run_id)}/answers", json=body, run_id=run_id))

    def wait_run(self, run_id: str, timeout: float = 60.0) -> RunResult:
        """Poll ``run_id`` until it is neither queued nor running (or ``timeout`` passes); its outcome.

        ``status`` is ``ok``, ``failed``, ``cancelled``, ``needs_input`` (``prompt`` set) or, on
        timeout, ``queued``/``running``. ``replayed``/``executed`` are not known from the journal and stay 0.
        """
        deadline, delay = time.monotonic() + timeout, 0.02
        while True:
            d = self.show(run_id)
            status = d["run"]["status"]
            # A queued run has not ended either: it waits for a worker, so returning at once would
            # hand the caller an outcome the run has not reached.
            if status not in _UNFINISHED or time.monotonic() >= deadline:
                break
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.5)
        # A server older than schema version 2 still says "completed" for ok.
        return RunResult(run_id, STATUS_ALIASES.get(status, status), d.get("output"), d.get("error"), d.get("prompt"))

    def cancel(self, run_id: str, reason: str | None = None) -> bool:
        """Cancel ``run_id`` on the server, as :func:`engrain.cancel`: it stops at its next step boundary,
        ends ``cancelled`` and is never resumed.

        True when this call cancelled it, False when it had already finished;
        :class:`~engrain.RunNotFoundError` for an unknown run.
        """
        body = {"reason": reason} if reason is not None else {}
        return bool(self._call("POST", f"/runs/{_seg(run_id)}/cancel", json=body, run_id=run_id)["cancelled"])

    def fork(self, source_run_id: str, at_step: int, *, run_id: str | None = None) -> str:
        """A new run reusing the recorded results of steps ``0..at_step-1`` of ``source_run_id``, as
        :func:`engrain.fork`; returns the new run's id (``run_id``, or one the server picks).

        The server forks only its API clients' own runs unless it was started with
        ``--allow-fork`` (403 ``ForkNotAllowedError``): a fork of a run its runtime executes
        runs the steps from ``at_step`` again when resumed.
        """
        body: dict[str, Any] = {"at_step": at_step, "run_id": run_id}
        return self._call("POST", f"/runs/{_seg(source_run_id)}/fork", json=body, run_id=source_run_id)["run_id"]

    def queues(self) -> dict[str, Any]:
        """The server's view of its queues and workers (``GET /api/queues``): ``queues`` is what
        :func:`engrain.queues` lists, as dicts ``{name, concurrency, rate, queued, running}``;
        ``workers`` lists ``{owner, runs}`` of the live lease holders (see docs/api.md for the rest)."""
        return self._call("GET", "/queues")

    def agents(self) -> list[dict[str, Any]]:
        """Agents the server runs: ``[{name, kind, description, ...}]`` (``kind`` ``python`` or ``llm``)."""
        return self._call("GET", "/agents")

    # -- LLM agents ---------------------------------------------------------------

    def create_agent(self, name: str, model: str, instructions: str = "", tools: list[str] | tuple[str, ...] = (),
                     *, memory: str | None = None, cache: bool = False, max_turns: int = 10,
                     answers_ttl: float | None = None, learn: bool | str = False) -> dict[str, Any]:
        """Create an LLM agent on the server; ``tools`` name tools the server was configured with
        (``answers_ttl``, ``learn``: see :class:`engrain.Agent`)."""
        body = {"name": name, "model": model, "instructions": instructions, "tools": list(tools), "memory": memory,
                "cache": cache, "max_turns": max_turns, "answers_ttl": answers_ttl, "learn": learn}
        return self._call("POST", "/agents", json=body)

    def chat(self, agent: str, message: str, *, session: str) -> Iterator[dict[str, Any]]:
        """Send ``message`` to an LLM agent in ``session``; iterate over its events as they stream in.

        Events are dicts with a ``type``: ``text`` (``delta``), ``tool_call``,
        ``tool_result``, ``cache``, ``error`` and last ``done``.
        """
        timeout = httpx.Timeout(self._http.timeout.connect, read=None)
        body = {"session": session, "message": message}
        with self._reaching(), \
                self._http.stream("POST", f"/api/agents/{_seg(agent)}/chat", json=body, timeout=timeout) as resp:
            if resp.status_code >= 400:
                resp.read()
                self._raise(resp, None)
            data: list[str] = []
            for line in resp.iter_lines():
                if line.startswith("data:"):
                    data.append(line[5:].lstrip())
                elif not line and data:
                    yield json.loads("\n".join(data))
                    data = []

    def history(self, agent: str, session: str) -> list[dict[str, Any]]:
        """An LLM agent's session: its messages in order, each with its original ``ts``."""
        return self._call("GET", f"/agents/{_seg(agent)}/sessions/{_seg(session)}")

    def run_agent(self, agent: str, task: str, *, run_id: str | None = None, wait: float | None = None) -> RunResult:
        """Start a durable run of an LLM agent on ``task`` (``status: running`` if it outlasts ``wait``)."""
        body: dict[str, Any] = {"task": task, "run_id": run_id}
        if wait is not None:
            body["wait"] = wait
        return _run_result(self._call("POST", f"/agents/{_seg(agent)}/runs", json=body))

    # -- routines ---------------------------------------------------------------

    def routines(self) -> list[dict[str, Any]]:
        """Routine packages on the server."""
        return self._call("GET", "/routines")

    def routine(self, name: str) -> dict[str, Any]:
        """``{name, yaml, routine, issues}`` of one routine."""
        return self._call("GET", f"/routines/{_seg(name)}")

    def validate_routine(self, name: str) -> dict[str, Any]:
        """``{name, ok, issues}``."""
        return self._call("POST", f"/routines/{_seg(name)}/validate")

    def run_routine(self, name: str, inputs: dict[str, Any] | None = None, *, run_id: str | None = None) -> RunResult:
        """Run a routine on the server."""
        body = {"inputs": inputs, "run_id": run_id}  # None: none for a new run, the recorded ones to continue
        return _run_result(self._call("POST", f"/routines/{_seg(name)}/run", json=body))

    def compile_trace(self, name: str, trace: dict[str, Any], *, overwrite: bool = False) -> dict[str, Any]:
        """Compile a trace into the routine ``name`` on the server."""
        return self._call("POST", "/routines/compile", json={"name": name, "trace": trace, "overwrite": overwrite})

    # -- learned routines ---------------------------------------------------------

    def learned(self, skill: str | None = None, status: str | None = None) -> list[dict[str, Any]]:
        """Routines agents learned (of ``skill``, with ``status``), newest first."""
        params = {k: v for k, v in (("skill", skill), ("status", status)) if v is not None}
        return self._call("GET", "/learned", params=params)

    def learned_routine(self, ref: str) -> dict[str, Any]:
        """One learned routine (id or name) with its routine.yaml data, explanations and evidence runs."""
        return self._call("GET", f"/learned/{_seg(ref)}")

    def edit_learned(self, ref: str, routine: str | dict[str, Any]) -> dict[str, Any]:
        """Replace a learned routine with ``routine.yaml`` text or data (checked by the server)."""
        body = {"yaml": routine} if isinstance(routine, str) else {"routine": routine}
        return self._call("PUT", f"/learned/{_seg(ref)}", json=body)

    def promote_learned(self, ref: str, trusted: bool = True) -> dict[str, Any]:
        """Mark a learned routine reviewed (``trusted: true``), or take that back."""
        return self._call("POST", f"/learned/{_seg(ref)}/promote", json={"trusted": trusted})

    def delete_learned(self, ref: str) -> dict[str, Any]:
        """Delete a learned routine."""
        return self._call("DELETE", f"/learned/{_seg(ref)}")

    # -- memory -----------------------------------------------------------------

    def remember(self, data: Any, hint: float | None = None, skill: str | None = None,
                 metadata: dict[str, Any] | None = None, *, label: str | None = None, ttl: float | None = None) -> str:
        """Store a record (``hint``: importance 0..1, ``label``: topic text); returns its id."""
        body = {"data": data, "hint": hint, "label": label, "skill": skill, "metadata": metadata, "ttl": ttl}
        return self._call("POST", "/memory/remember", json=body)["id"]

    def recall(self, query: str, skill: str | None = None, top_k: int = 5, hint: float | None = None, *,
               label: str | None = None, where: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Hits ``{score, content, tier, id, skill, metadata, provenance}``, best first."""
        return self._call("POST", "/memory/recall", json={"query": query, "skill": skill, "top_k": top_k, "hint": hint,
                                                          "label": label, "where": where})

    def forget(self, id: str | None = None, *, skill: str | None = None) -> dict[str, int]:
        """Delete a record, an article (with its records) or a whole skill on the server."""
        return self._call("POST", "/memory/forget", json={"id": id, "skill": skill})

    def update(self, id: str, data: Any, *, hint: float | None = None, label: str | None = None,
               metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """Replace a record's content or an article's text on the server."""
        return self._call("POST", "/memory/update", json={"id": id, "data": data, "hint": hint, "label": label,
                                                          "metadata": metadata})

    def import_(self, export: dict[str, Any], *, skill_map: dict[str, str] | str | None = None) -> dict[str, Any]:
        """Load an export (the dict ``export()`` returned, with its documents) into the server's memory."""
        return self._call("POST", "/memory/import", json={"documents": export.get("documents"), "skill_map": skill_map})

    def consolidate(self, num_records: int | str = "all", method: str = "LIFO") -> dict[str, Any]:
        """Process the memory buffer into articles; the summary as a dict."""
        return self._call("POST", "/memory/consolidate", json={"num_records": num_records, "method": method})

    def export(self) -> dict[str, Any]:
        """Export articles on the server: ``{export_dir (server side), count, documents}``."""
        return self._call("POST", "/memory/export")

    def stats(self) -> dict[str, Any]:
        """Memory tier counts and consolidation counters."""
        return self._call("GET", "/memory/stats")

    def articles(self, skill: str | None = None) -> list[dict[str, Any]]:
        """Articles with provenance to their records."""
        return self._call("GET", "/memory/articles", params={"skill": skill} if skill else {})

    # -- cache ------------------------------------------------------------------

    def cache_entries(self, *, limit: int = 50, offset: int = 0, task: str | None = None) -> list[dict[str, Any]]:
        """Behavior-cache entries, most recently used first."""
        params: dict[str, Any] = {"limit": limit, "offset": offset, **({"task": task} if task else {})}
        return self._call("GET", "/cache/entries", params=params)

    def cache_stats(self) -> dict[str, Any]:
        """Cache counters with ``hit_rate`` and ``agent_calls_saved``."""
        return self._call("GET", "/cache/stats")

    def evict(self, entry_id: str) -> bool:
        """Delete a cache entry; False if there was none."""
        try:
            self._call("DELETE", f"/cache/entries/{_seg(entry_id)}")
        except RemoteError as e:
            if e.status == 404:
                return False
            raise
        return True

    def __repr__(self) -> str:
        return f"<engrain.Client {self.base_url}>"
