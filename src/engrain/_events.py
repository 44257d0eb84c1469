"""The event: the one immutable record everything in engrain is built from.

An event is ``{run_id, seq, ts, kind, name, data}``; ``seq`` is dense from 0 per
run. ``data`` is always a JSON object. Kinds are few on purpose (see DESIGN.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, Final

from ._errors import JSONTooDeepError, NotJSONError, UnknownStatusError

try:  # reading a long run's journal is mostly JSON decoding, which msgspec does ~3x faster
    import msgspec as _msgspec
except ImportError:  # pragma: no cover - a core dependency, but the stdlib reads the same text
    _msgspec = None
_decode = None if _msgspec is None else _msgspec.json.Decoder().decode

# Kinds. Keep this list short: every consumer (replay, compiler, cache, UI)
# must understand every kind.
RUN_STARTED: Final = "run.started"
STEP_STARTED: Final = "step.started"
STEP_COMPLETED: Final = "step.completed"
STEP_FAILED: Final = "step.failed"
CHECK_FAILED: Final = "check.failed"
INPUT_REQUESTED: Final = "input.requested"
INPUT_RECEIVED: Final = "input.received"
REPLAY_STARTED: Final = "replay.started"
REPLAY_DIVERGED: Final = "replay.diverged"
#: A cached trajectory replayed to its end in a run journaled at its end (``durability="run"``): one
#: event carrying what ``replay.started`` says and every step completion of the run, in order.
REPLAY_COMPLETED: Final = "replay.completed"
RUN_COMPLETED: Final = "run.completed"
RUN_FAILED: Final = "run.failed"
#: An entry of an adapter's log (a LangGraph checkpoint, an agent-SDK session item): see ``_durable/log.py``.
LOG_ENTRY: Final = "log.entry"
RUN_CANCELLED: Final = "run.cancelled"

KINDS: Final = frozenset(
    {
        RUN_STARTED,
        STEP_STARTED,
        STEP_COMPLETED,
        STEP_FAILED,
        CHECK_FAILED,
        INPUT_REQUESTED,
        INPUT_RECEIVED,
        REPLAY_STARTED,
        REPLAY_DIVERGED,
        REPLAY_COMPLETED,
        RUN_COMPLETED,
        RUN_FAILED,
        LOG_ENTRY,
        RUN_CANCELLED,
    }
)

#: Tag the server adds to a run a client created with ``POST /api/runs/{id}/events``: such a
#: run is the client's record, never resumed or trusted by the runtime (routines, agents).
CLIENT_TAG: Final = "client"
#: Tag of the runs of an LLM agent an API client defined (``POST /api/agents``): its instructions
#: are the client's, so it never continues an in-process ``engrain.Agent``'s run of the same name,
#: nor does one continue its runs (see ``engrain._agent.sessions.check_origin``).
API_AGENT_TAG: Final = "llm-agent-api"

# Run statuses: one vocabulary for the store, the CLI, the API, the UI and
# RunResult, the same names as em-core's. The journal derives a run's status
# from the kinds appended (see ``status_after``); ``queued`` and ``cancelled``
# are set by the run queue, not by an event kind.
OK: Final = "ok"
FAILED: Final = "failed"
NEEDS_INPUT: Final = "needs_input"
RUNNING: Final = "running"
QUEUED: Final = "queued"
CANCELLED: Final = "cancelled"
STATUSES: Final = (OK, FAILED, NEEDS_INPUT, RUNNING, QUEUED, CANCELLED)
#: Old names still accepted where a status comes in (CLI, API, ``Journal.runs``).
STATUS_ALIASES: Final = {"completed": OK}
#: The old name of ``OK``; stores written before schema version 2 said "completed".
COMPLETED: Final = OK


def check_status(value: object) -> str:
    """``value`` as a run status (aliases mapped), or :class:`UnknownStatusError` listing the valid ones."""
    if isinstance(value, str):
        name = value.strip().lower()
        name = STATUS_ALIASES.get(name, name)
        if name in STATUSES:
            return name
    raise UnknownStatusError(value, STATUSES)


@dataclass(slots=True)
class Event:
    """One journal entry. Treat as immutable: the journal never changes an appended event.

    Not a frozen dataclass because frozen construction is several times slower,
    and resuming a long run builds one Event per journaled event.
    """

    run_id: str
    seq: int
    ts: float
    kind: str
    name: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The event as a plain JSON-ready dict."""
        return {
            "run_id": self.run_id,
            "seq": self.seq,
            "ts": self.ts,
            "kind": self.kind,
            "name": self.name,
            "data": self.data,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Event:
        """Build an event from :meth:`to_dict` output."""
        return cls(
            run_id=str(d["run_id"]),
            seq=int(d["seq"]),
            ts=float(d["ts"]),
            kind=str(d["kind"]),
            name=str(d.get("name", "")),
            data=dict(d.get("data") or {}),
        )


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event not yet appended: the journal assigns ``run_id``, ``seq`` and ``ts``."""

    kind: str
    name: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A run's summary, kept by the journal in the same transaction as its events.

    ``updated`` is the time of the run's last status change (start, input,
    completion); ``next_seq`` is the number of events; ``lease_epoch`` counts the times the
    lease changed hands (see ``Journal.take_lease``). ``agent`` is the agent name its
    ``run.started`` recorded (``None`` for runs recorded without one).
    """

    run_id: str
    status: str
    task: str
    tags: list[str]
    created: float
    updated: float
    next_seq: int
    lease_owner: str | None = None
    lease_until: float | None = None
    lease_epoch: int = 0
    agent: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The summary as a plain JSON-ready dict."""
        return {
            "run_id": self.run_id,
            "status": self.status,
            "task": self.task,
            "tags": list(self.tags),
            "created": self.created,
            "updated": self.updated,
            "events": self.next_seq,
            "lease_owner": self.lease_owner,
            "lease_until": self.lease_until,
            "agent": self.agent,
        }


def status_after(kinds: list[str], current: str | None) -> str:
    """The run status once events of ``kinds`` are appended to a run in ``current``."""
    status = current or RUNNING
    for kind in kinds:
        if kind == RUN_COMPLETED:
            status = OK
        elif kind == RUN_FAILED:
            status = FAILED
        elif kind == RUN_CANCELLED:
            status = CANCELLED
        elif kind == INPUT_REQUESTED:
            status = NEEDS_INPUT
        elif kind in (INPUT_RECEIVED, RUN_STARTED, REPLAY_STARTED):
            status = RUNNING
    return status


_SCALARS: Final = frozenset({str, bool, int, type(None)})

#: Deepest nesting of lists/objects accepted in journaled data and API bodies. Readers
#: (replay, JSON encoders, the UI) recurse, so a deeper value would break every later read.
MAX_DEPTH: Final = 100


def is_json(value: Any, _depth: int = 0) -> bool:
    """True if ``value`` is strictly JSON (see :func:`check_json`); builds no error path.

    Every journaled argument and result goes through here, so the common case
    (scalars, small dicts and lists) is kept to type lookups.
    """
    t = type(value)
    if t in _SCALARS:
        return True
    if t is float:
        return math.isfinite(value)
    if t is dict:
        if _depth >= MAX_DEPTH:
            return False
        _depth += 1
        for k, item in value.items():
            if type(k) is not str:
                return False
            if type(item) not in _SCALARS and not is_json(item, _depth):
                return False
        return True
    if t is list:
        if _depth >= MAX_DEPTH:
            return False
        _depth += 1
        for item in value:
            if type(item) not in _SCALARS and not is_json(item, _depth):
                return False
        return True
    return False


def check_depth(value: Any, where: str, path: str = "value", limit: int = MAX_DEPTH) -> None:
    """Raise :class:`JSONTooDeepError` naming ``where`` and ``path`` if lists/objects nest deeper than ``limit``.

    Iterative, so it also answers for values too deep for a recursive walk.
    """
    stack: list[tuple[Any, int, str]] = [(value, 1, path)]
    while stack:
        v, depth, at = stack.pop()
        if isinstance(v, dict):
            items: Any = ((f"{at}.{k}" if isinstance(k, str) and k.isidentifier() else f"{at}[{k!r}]", x) for k, x in v.items())
        elif isinstance(v, list):
            items = ((f"{at}[{i}]", x) for i, x in enumerate(v))
        else:
            continue
        if depth > limit:
            raise JSONTooDeepError(where, at, limit)
        stack.extend((x, depth + 1, p) for p, x in items if isinstance(x, (dict, list)))


def check_json(value: Any, where: str, path: str = "value") -> None:
    """Raise :class:`NotJSONError` naming ``where`` and ``path`` if ``value`` is not JSON.

    Strict on purpose: a tuple or a set would come back from the journal as a
    list, so the replayed run would see a different value than the live one.
    """
    if not is_json(value):
        _raise_at(value, where, path)


def _raise_at(value: Any, where: str, path: str, _depth: int = 0) -> None:
    """Find the first non-JSON value under ``value`` and raise for it (the slow, naming walk)."""
    t = type(value)
    if t in (dict, list) and _depth >= MAX_DEPTH:
        raise JSONTooDeepError(where, path, MAX_DEPTH)
    if t is dict:
        for k, item in value.items():
            if type(k) is not str:
                raise NotJSONError(where, f"{path} key {k!r}", k)
            if not is_json(item, _depth + 1):
                _raise_at(item, where, f"{path}[{k!r}]", _depth + 1)
    elif t is list:
        for i, item in enumerate(value):
            if not is_json(item, _depth + 1):
                _raise_at(item, where, f"{path}[{i}]", _depth + 1)
    raise NotJSONError(where, path, value)


def check_text(text: str, value: Any, where: str, path: str = "value") -> None:
    """Raise :class:`NotJSONError` if ``text``, the JSON of ``value``, is not storable UTF-8.

    The JSON encoder writes a lone surrogate (``"\\ud800"``, from a bad decode or
    a C extension) as is; no database can store it, so it is refused here,
    naming the string. Checks only non-ASCII text (``isascii`` costs nothing).
    """
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        at, bad = _surrogate_at(value, path)
        raise NotJSONError(where, at, bad, "holds a lone surrogate (text that is not valid Unicode), "
                           "which is not JSON; decode bytes with errors='replace' first") from None


def storable_text(text: str) -> str:
    """``text`` with any lone surrogate written as ``\\udXXX``: for error messages, which must always journal."""
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def _surrogate_at(value: Any, path: str) -> tuple[str, Any]:
    """The path of the first string (value or key) under ``value`` that UTF-8 cannot encode."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    return at, v
        elif isinstance(v, dict):
            for k, x in v.items():
                if isinstance(k, str) and not k.isascii():
                    stack.append((k, f"{at} key {k!r}"))
                stack.append((x, f"{at}[{k!r}]"))
        elif isinstance(v, list):
            stack.extend((x, f"{at}[{i}]") for i, x in enumerate(v))
    return path, value


_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
# The C encoder JSONEncoder.encode builds on every call, built once: that halves
# the cost of encoding an event. Without circular-reference markers (a shared
# markers dict would not be thread-safe); a cycle raises RecursionError, as
# check_json does on one.
_c_encode = (
    c_make_encoder(None, _encoder.default, encode_basestring, None, ":", ",", False, False, False)
    if c_make_encoder is not None
    else None
)


def json_copy(x: Any) -> Any:
    """``x`` with its lists and dicts copied (JSON scalars never change, so they are shared): what a call got
    or returned, kept as it was when the caller or a tool changes a list afterwards.

    Only for values known to be JSON, whose depth is bounded. A scalar item is taken inline, not by a call:
    the cache copies a replayed step's arguments with this on every hit.
    """
    t = type(x)
    if t is dict:
        return {k: v if type(v) in SCALAR_TYPES else json_copy(v) for k, v in x.items()}
    if t is list:
        return [v if type(v) in SCALAR_TYPES else json_copy(v) for v in x]
    return x


#: The types of JSON's scalars (strict JSON has exact types: see ``check_json``); immutable, so copies share them.
SCALAR_TYPES: Final = frozenset({str, int, float, bool, type(None)})


def dumps(value: Any) -> str:
    """Compact JSON text, the form stored in the journal."""
    if _c_encode is None:  # pragma: no cover - CPython always has the C encoder
        return _encoder.encode(value)
    return "".join(_c_encode(value, 0))


_fast_encode = None if _msgspec is None else _msgspec.json.Encoder().encode


def dumps_checked(value: Any) -> str:
    """:func:`dumps` for a value already found strictly JSON by :func:`is_json`: the same JSON, ~5x faster.

    Only for checked values, because msgspec is laxer than the journal: it writes
    NaN as null and encodes sets, bytes and dates, which the journal refuses. It
    spells some floats differently (``1e16`` for ``1e+16``); they read back equal.
    """
    if _fast_encode is not None:
        try:
            return _fast_encode(value).decode()
        except Exception:  # a lone surrogate, or anything else: the stdlib encoder decides and names it
            pass
    return dumps(value)


loads = json.loads


def loads_many(texts: list[str]) -> list[Any]:
    """Decode many JSON texts with one parser call (much faster than one call each)."""
    if not texts:
        return []
    text = "[" + ",".join(texts) + "]"
    if _decode is not None:
        try:
            return _decode(text)
        except _msgspec.MsgspecError:
            pass  # what msgspec refuses and the stdlib reads (NaN, 1e400, a lone surrogate): rare, and slower
    return json.loads(text)


#: One journal event as a backend reads it (``Journal.read_raw``): seq, ts, kind, name, and the data's JSON text.
Row = tuple[int, float, str, str, str]


def events_of(run_id: str, rows: list[Row]) -> list[Event]:
    """The events of ``run_id``'s raw rows, every data decoded in one parser call."""
    datas = loads_many([r[4] for r in rows])
    return [Event(run_id, r[0], r[1], r[2], r[3], d) for r, d in zip(rows, datas)]
