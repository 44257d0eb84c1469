"""Pieces shared by the journal backends: turning a batch of new events into rows."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._events import (
    CLIENT_TAG,
    INPUT_RECEIVED,
    INPUT_REQUESTED,
    KINDS,
    MAX_DEPTH,
    REPLAY_STARTED,
    RUN_CANCELLED,
    RUN_COMPLETED,
    RUN_FAILED,
    RUN_STARTED,
    CANCELLED,
    FAILED,
    OK,
    NewEvent,
    check_json,
    check_status,
    check_text,
    storable_text,
    dumps,
    dumps_checked,
    is_json,
    status_after,
)
from .._errors import RunFinishedError, RunIdError, TextNotStorableError
from .._events import _fast_encode

_STATUS_KINDS = frozenset(
    {RUN_STARTED, RUN_COMPLETED, RUN_FAILED, RUN_CANCELLED, INPUT_REQUESTED, INPUT_RECEIVED, REPLAY_STARTED}
)
#: Statuses whose event drops the run's lease (see ``Journal.append``).
FINISHED = frozenset({OK, FAILED, CANCELLED})
#: Event kinds that finish a run.
FINISH_KINDS = frozenset({RUN_COMPLETED, RUN_FAILED, RUN_CANCELLED})
#: The status each finishing kind leaves a run in.
ENDED_BY = {RUN_COMPLETED: OK, RUN_FAILED: FAILED, RUN_CANCELLED: CANCELLED}
# A finished run stays finished: nothing is appended after its finishing event, whatever the kind
# or the ending. No path of engrain's own writes there (a finished run is never resumed, a retry is
# a fork, i.e. a new run, cancel and answers check the end first), so anything that does is a stale
# or forged writer, and letting it in would add steps after the outcome or flip the status back to
# running (input.received, run.started, replay.started all set it). The backends check it in the
# append's own statement, against what they already read there (SQLite: the last event, which the
# dense-seq trigger seeks anyway; PostgreSQL: the runs row the gate updates).


@dataclass(slots=True)
class Batch:
    """A validated batch, ready for a backend's INSERT and its ``runs`` row update."""

    rows: list[tuple[str, int, float, str, str, str]]
    status: str | None  # None: the batch does not change the run's status
    task: str | None
    tags: str | None  # JSON text of the tag list
    next_seq: int
    agent: str | None = None  # the agent name a run.started records (kept from the run's creation on)


def check_run_id(run_id: Any) -> None:
    """Raise :class:`~engrain.RunIdError` (a ``ValueError``) unless ``run_id`` is a non-empty string of at most 200
    characters of Unicode text without NUL (a lone surrogate would fail in the store's driver, as an encoding error
    naming nothing, and PostgreSQL's text holds no NUL: a store moved there could not keep the run)."""
    if not isinstance(run_id, str) or not run_id:
        raise RunIdError("run_id must be a non-empty string")
    if len(run_id) > 200:
        raise RunIdError(f"run_id is {len(run_id)} characters long; at most 200 are allowed")
    if "\x00" in run_id:
        raise RunIdError(f"run_id {run_id!r} holds a NUL character (at {run_id.index(chr(0))}), which a store cannot keep")
    _check_id_text(run_id)


def _check_id_text(run_id: str) -> None:
    if run_id.isascii():  # nearly every id: no encoding to try
        return
    try:
        run_id.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RunIdError(f"run_id {run_id!r} is not Unicode text: a lone surrogate at character {e.start}") from None


def check_lookup_id(run_id: Any) -> None:
    """Raise ``ValueError`` unless ``run_id`` is a string the store's driver can look up (no lone surrogate).

    What a read (``read``, ``read_raw``, ``get_run``) checks before its query: the driver's encoding
    error would otherwise surface as a damaged store (SQLite's ``read`` takes a ``ValueError`` from
    its rows for corruption). Cheaper than :func:`check_run_id`, as reads sit on the resume path, and
    looser: an empty or over-long id is simply no run (the HTTP API answers 404 for it).
    """
    if type(run_id) is not str:
        raise RunIdError(f"run_id must be a string, got {type(run_id).__name__}")
    _check_id_text(run_id)


#: Past the last sequence number PostgreSQL's int4 columns hold: no run gets there, and the
#: driver's overflow (SQLite's past 2**63, PostgreSQL's past 2**31) would name nothing.
SEQ_END = 2**31 - 1


def _check_target(run_id: str, expected_seq: int) -> None:
    check_run_id(run_id)
    if not isinstance(expected_seq, int) or not 0 <= expected_seq < SEQ_END:
        raise ValueError(f"expected_seq must be an int from 0 to {SEQ_END - 1}, got {expected_seq!r}")


def _check_name(name: Any, i: int, kind: str) -> None:
    """Refuse an event name no store keeps as given: PostgreSQL's driver cuts a text parameter at a NUL
    (stored short, silently) and SQLite keeps a non-string as is (read back as another type or text)."""
    if not isinstance(name, str):
        raise TypeError(f"event {i} ({kind}): name must be a string, got {type(name).__name__}")
    if "\x00" in name:
        raise TextNotStorableError(f"event {i} ({kind}): name {name!r} holds a NUL character, which a store cannot keep")
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError as e:
            raise TextNotStorableError(f"event {i} ({kind}): name {storable_text(name)!r} holds a lone surrogate at {e.start}") from None


def _check_started(data: dict, i: int) -> None:
    """Refuse a ``run.started`` whose task or tags hold a NUL: they are copied to the runs row, whose PostgreSQL
    jsonb refuses it (a driver error) and whose text columns (both stores) would keep the task cut short."""
    task, tags = data.get("task"), data.get("tags")
    if isinstance(task, str) and "\x00" in task or isinstance(tags, (list, tuple)) and any("\x00" in str(t) for t in tags):
        raise TextNotStorableError(f"event {i} (run.started): its task or a tag holds a NUL character, which a store cannot keep")


def _row(
    run_id: str, kind: str, name: str, data: dict, seq: int, ts: float, i: int, encode: Callable[[Any], str] = dumps
) -> tuple[str, int, float, str, str, str]:
    """Validate event ``i`` (its kind and its data as JSON) and return its row; the name is the caller's."""
    if kind not in KINDS:
        raise ValueError(f"event {i}: unknown kind {kind!r}; known kinds: {sorted(KINDS)}")
    if type(data) is not dict and not isinstance(data, dict):
        raise TypeError(f"event {i} ({kind}): data must be a dict")
    if type(name) is not str or "\x00" in name or not name.isascii():
        _check_name(name, i, kind)
    if kind == RUN_STARTED:
        _check_started(data, i)
    try:
        text = encode(data)
    except (TypeError, ValueError):
        # dumps failed: let the strict checker name the offending field.
        check_json(data, f"event {i} ({kind} {name})", "data")
        raise
    if len(text) > 2 * MAX_DEPTH or not text.isascii():
        _check_text(text, data, kind, name, i)
    return (run_id, seq, ts, kind, name, text)


def _check_text(text: str, data: dict, kind: str, name: str, i: int) -> None:
    """Refuse the encoded ``text`` of event ``i`` if its data nests too deep or holds text no store can hold."""
    # The encoder does not bound nesting; only text with enough brackets can be too deep,
    # and counting them is cheap next to walking the value. Deeper than MAX_DEPTH takes more
    # than MAX_DEPTH brackets opened and as many closed, so a shorter text (a step's) is not counted.
    if len(text) > 2 * MAX_DEPTH and text.count("{") + text.count("[") > MAX_DEPTH and not is_json(data):
        check_json(data, f"event {i} ({kind} {name})", "data")
    if not text.isascii():  # check_text's own first test, inline: most events are ASCII
        check_text(text, data, f"event {i} ({kind} {name})", "data")


def prepare_row(
    run_id: str, kind: str, name: str, data: dict, expected_seq: int, ts: float, json_checked: bool = False
) -> tuple[str, int, float, str, str, str]:
    """Validate one event given by its fields and return its row: the per-step path, without a :class:`Batch`.

    ``json_checked``: the caller found ``data`` strictly JSON (:func:`is_json`), so the fast encoder may write it.
    """
    if (type(run_id) is not str or not 0 < len(run_id) <= 200 or not run_id.isascii() or "\x00" in run_id
            or type(expected_seq) is not int or not 0 <= expected_seq < SEQ_END):
        _check_target(run_id, expected_seq)  # raises, naming what is wrong (or accepts a str or int subclass, non-ASCII)
    if (json_checked and _fast_encode is not None and type(data) is dict and kind in KINDS and kind != RUN_STARTED
            and type(name) is str and "\x00" not in name and name.isascii()):
        # Every step of a durable run: _row with dumps_checked, inline (two calls fewer per step).
        try:
            text = _fast_encode(data).decode()
        except Exception:  # a lone surrogate, or anything else: the usual path decides and names it
            return _row(run_id, kind, name, data, expected_seq, ts, 0, dumps_checked)
        if len(text) > 2 * MAX_DEPTH or not text.isascii():
            _check_text(text, data, kind, name, 0)
        return (run_id, expected_seq, ts, kind, name, text)
    return _row(run_id, kind, name, data, expected_seq, ts, 0, dumps_checked if json_checked else dumps)


def prepare(run_id: str, events: Sequence[NewEvent], expected_seq: int, ts: float, json_checked: bool = False) -> Batch:
    """Validate ``events`` and lay them out as rows starting at ``expected_seq`` (``json_checked``: see :func:`prepare_row`)."""
    _check_target(run_id, expected_seq)
    if not events:
        raise ValueError("append needs at least one event")
    encode = dumps_checked if json_checked else dumps
    rows = [_row(run_id, ev.kind, ev.name, ev.data, expected_seq + i, ts, i, encode) for i, ev in enumerate(events)]
    kinds = [r[3] for r in rows]
    task = tags = status = agent = None
    if not _STATUS_KINDS.isdisjoint(kinds):
        if not FINISH_KINDS.isdisjoint(kinds[:-1]):  # the batch goes on after its own end
            end = next(i for i, k in enumerate(kinds) if k in FINISH_KINDS)
            raise RunFinishedError(run_id, ENDED_BY[kinds[end]], kinds[end + 1])
        status = status_after(kinds, None)
        for ev in events:
            if ev.kind == RUN_STARTED:
                task = str(ev.data.get("task", ""))
                tags = dumps([str(t) for t in ev.data.get("tags") or []])
                agent = agent_of(ev.data)
    return Batch(rows, status, task, tags, expected_seq + len(rows), agent)


def agent_of(started: dict) -> str | None:
    """The agent name in a ``run.started`` event's data, or ``None`` if it records none (or not a string)."""
    agent = started.get("agent")
    return agent if isinstance(agent, str) and agent else None


#: Agents a claim may take runs of: names (``None`` for runs that record none), or a mapping of
#: name to the code fingerprint its runs must record (``None``: any), see ``Journal.claim_runs``.
Agents = Collection[str | None] | Mapping[str | None, str | None]


def agents_filter(agents: Agents, column: str, placeholder: str, code: str = "NULL") -> tuple[str, list[str]]:
    """A SQL condition (and its arguments) true for rows whose ``column`` is one of ``agents``; ``None`` matches NULL.

    With a mapping, a name's runs must also record its code: ``code`` is the SQL expression
    of a run's recorded ``agent_code`` (NULL for runs recorded without one, which match by name).
    """
    codes: Mapping[str | None, str | None] = agents if isinstance(agents, Mapping) else dict.fromkeys(agents)
    names = sorted(a for a, c in codes.items() if a is not None and c is None)
    parts = [f"{column} IN ({', '.join([placeholder] * len(names))})"] if names else []
    for name in sorted(a for a, c in codes.items() if a is not None and c is not None):
        parts.append(f"({column} = {placeholder} AND COALESCE({code}, {placeholder}) = {placeholder})")
        names += [name, codes[name], codes[name]]  # type: ignore[list-item]
    if None in codes:
        parts.append(f"{column} IS NULL")
    return "(" + (" OR ".join(parts) or "1 = 0") + ")", names


def trust_sql(pg: bool, runs: str) -> tuple[str, str]:
    """SQL over the runs row ``runs`` (a table name or alias): the ``agent_code`` its ``run.started``
    records, and a condition true unless the run is an API client's (tagged ``client`` by the server).

    Claims use both: a run is handed only to the code that started it, and a client's run to none.
    """
    if pg:
        code = f"(SELECT e.data::json ->> 'agent_code' FROM engrain_events e WHERE e.run_id = {runs}.run_id AND e.seq = 0)"
        return code, f"NOT ({runs}.tags @> '[\"{CLIENT_TAG}\"]'::jsonb)"
    code = f"(SELECT json_extract(e.data, '$.agent_code') FROM events e WHERE e.run_id = {runs}.run_id AND e.seq = 0)"
    return code, f"NOT EXISTS (SELECT 1 FROM json_each({runs}.tags) WHERE value = '{CLIENT_TAG}')"


def check_lease(lease: tuple[str, float] | None, expected_seq: int) -> tuple[str, float] | None:
    """Validate the ``lease`` argument of ``Journal.append``."""
    if lease is None:
        return None
    if expected_seq != 0:
        raise ValueError(f"append(lease=...) creates a leased run, so it needs expected_seq=0, not {expected_seq!r}")
    try:
        owner, ttl = lease
    except (TypeError, ValueError):
        raise ValueError(f"lease must be an (owner, ttl) pair, got {lease!r}") from None
    if not isinstance(owner, str) or not owner:
        raise ValueError(f"lease owner must be a non-empty string, got {owner!r}")
    if "\x00" in owner:  # PostgreSQL's driver would cut it at the NUL
        raise TextNotStorableError(f"lease owner must be a string without NUL, got {owner!r}")
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl < float("inf"):
        raise ValueError(f"lease ttl must be a positive number of seconds, got {ttl!r}")
    return owner, float(ttl)


def run_filters(
    status: str | Sequence[str] | None,
    task: str | None,
    tag: str | None,
    since: float | None,
    *,
    placeholder: str,
    tag_clause: str,
    prefix: str | None = None,
    prefix_clause: str = "",
) -> tuple[str, list]:
    """The WHERE clause (or "") and its arguments for ``Journal.runs`` filters.

    ``placeholder`` is the driver's parameter marker; ``tag_clause`` tests tag
    membership in the backend's JSON dialect, with one placeholder for the tag.
    ``prefix_clause`` keeps run ids starting with ``prefix`` (its one placeholder gets
    ``prefix``, as the backend spells it).
    """
    where: list[str] = []
    args: list = []
    if any(isinstance(v, str) and "\x00" in v for v in (task, tag, prefix)):
        # no run holds a NUL there (refused on append), and PostgreSQL's driver refuses the query
        return " WHERE 1 = 0", []
    if status is not None:
        many = isinstance(status, (list, tuple, set, frozenset))
        statuses = [check_status(s) for s in (status if many else [status])]
        # no status at all matches nothing (PostgreSQL takes no empty IN list)
        where.append(f"status IN ({', '.join([placeholder] * len(statuses))})" if statuses else "1 = 0")
        args += statuses
    if task is not None:
        where.append(f"task = {placeholder}")
        args.append(task)
    if tag is not None:
        where.append(tag_clause)
        args.append(tag)
    if since is not None:
        where.append(f"updated >= {placeholder}")
        args.append(since)
    if prefix:
        where.append(prefix_clause)
        args.append(prefix)
    return (" WHERE " + " AND ".join(where)) if where else "", args


def page(limit: int, offset: int) -> tuple[int, int]:
    """``Journal.runs``' ``limit`` and ``offset`` as the query takes them: a negative one refused (SQLite read
    it as no limit, PostgreSQL refused it), a huge one cut to what either store's integer holds."""
    limit, offset = int(limit), int(offset)
    if limit < 0 or offset < 0:
        raise ValueError(f"limit and offset must be >= 0, got limit={limit!r}, offset={offset!r}")
    return min(limit, 2**62), min(offset, 2**62)


def window(run_id: str, after: int, limit: int | None) -> tuple[int, int | None]:
    """Check ``run_id`` (:func:`check_lookup_id`) and bound ``Journal.read``'s ``after`` and ``limit`` to the
    sequence numbers a run can have: past them the drivers overflow (SQLite beyond 2**63, PostgreSQL beyond its
    bigint), each with an error of its own, where the answer is simply all or none of the run's events."""
    check_lookup_id(run_id)
    return max(-1, min(int(after), SEQ_END)), None if limit is None else max(0, min(int(limit), SEQ_END))


def glob_prefix(prefix: str) -> str:
    """A SQLite GLOB pattern matching exactly the texts that start with ``prefix``.

    GLOB compares case-sensitively, so on a BINARY column SQLite reads the matches from
    the index's range; its wildcards in ``prefix`` are made literal by brackets.
    """
    return "".join(f"[{c}]" if c in "*?[" else c for c in prefix) + "*"


#: Query parameters of a PostgreSQL URL that carry a secret.
_SECRET_PARAMS = ("password", "sslpassword")


_USER_PASSWORD = re.compile(r"(^|[:/])([^:/@?#]*):[^@/?#]*@")


def redact_url(url: str) -> str:
    """``url`` with its password (in the user part or a ``password=`` parameter) shown as ``***``."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # a malformed netloc (bad port): mask everything between :// and @
        head, sep, tail = url.partition("://")
        user, at, rest = tail.rpartition("@")
        return f"{head}{sep}{user.split(':', 1)[0]}:***@{rest}" if at and ":" in user else url
    if not parts.netloc and "@" in url:
        # Not read as a URL with an authority (postgresql//u:pw@h, a typo; u:pw@h, no scheme): whatever
        # looks like user:password@ is masked, as what names a store must never show its password.
        return _USER_PASSWORD.sub(r"\1\2:***@", url)
    secret_query = any(p.partition("=")[0].lower() in _SECRET_PARAMS for p in parts.query.split("&"))
    if not password and not secret_query:
        return url
    netloc = parts.netloc
    if password:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.split(':', 1)[0]}:***@{host}"
    query = "&".join(
        f"{k}=***" if (k := p.partition("=")[0]).lower() in _SECRET_PARAMS else p for p in parts.query.split("&")
    ) if parts.query else ""
    return urlunsplit(parts._replace(netloc=netloc, query=query))
