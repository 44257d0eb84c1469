"""Chat sessions: each turn is one durable run, the session is the sequence of turns.

Turn ``n`` of session ``s`` of agent ``a`` is the run ``chat:a:s:n`` whose task
is the user's message and whose output holds the turn's messages, each with
the time it was written. So a session lives in the journal like every run:
it survives restarts, a turn killed midway resumes like any run, and the
history is the finished turns' messages in order of turn number. Finished turns
never change, so they are cached per process. A turn's run may be deleted
(``engrain.gc``): the turns after a missing number are listed, never dropped, and
a new turn is numbered after the highest. Messages sent to one session at once
are played one after the other (:func:`serial` in a process; across processes a
taken number is found when the turn's run opens, and the message takes the next).
A turn's run that an HTTP API client created (a client may create a run of any id)
is refused, never read as the agent's history.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .. import _events as ev
from .._durable.identity import CLIENT_RUN
from .._errors import AgentMismatchError, ConfigError
from .._events import RunInfo
from .._journal import Journal

_SESSION_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")
_TURN_RE = re.compile(r"0|[1-9][0-9]*")  # (fullmatch) the text turn_id writes for a number: "07" is no turn
#: Seconds of clock difference tolerated between processes writing one session: a listing of the turns
#: after a known one asks for runs updated since that turn was created, less this much.
CLOCK_SLACK = 300.0
_PAGE = 1000  # runs per listing query
#: Seconds a message waits for a turn another process is running in its session before giving up.
BUSY_WAIT = 300.0

_ENDS = frozenset({ev.RUN_COMPLETED, ev.RUN_FAILED, ev.RUN_CANCELLED})

_lock = threading.Lock()


@dataclass(slots=True)
class _Seen:
    """What this process has read of a session: its finished turns in order, which never change."""

    turns: list[tuple[int, list[dict[str, Any]] | None]] = field(default_factory=list)  # (turn, messages or None)
    last: int = -1  # the highest finished turn read: a load reads the journal from last + 1 on
    created: float | None = None  # when that turn's run was created (see _listed's ``since``)


_finished: dict[tuple[str, str, str, bool], _Seen] = {}
# One turn at a time per session in this process (see serial), with how many callers use each lock.
_serial: dict[tuple[str, str, str, bool], list[Any]] = {}


def check_session(session: str) -> str:
    """``session`` if it is a valid id (letters, digits, ``_ . -``, at most 100), else :class:`ConfigError`."""
    if not isinstance(session, str) or not _SESSION_RE.match(session):
        raise ConfigError(f"session id {session!r}: use 1-100 letters, digits, '_', '.' or '-'")
    return session


def turn_id(agent: str, session: str, n: int) -> str:
    """The run id of turn ``n``."""
    return f"chat:{agent}:{session}:{n}"


def session_tag(session: str) -> str:
    """The tag every turn of a session carries (of every agent: the run id names the agent)."""
    return f"session:{session}"


@contextlib.contextmanager
def serial(url: str, agent: str, session: str, api: bool = False) -> Iterator[None]:
    """Hold the session for one message: messages sent to one session at once from this process are
    played one after the other, each as the next turn (each turn's history holds the turns before it).

    Other processes are not held off by this: a turn number another process took first is found
    when the turn's run is opened (see ``Agent._send``), and the message takes the next number.
    """
    key = (url, agent, session, api)
    with _lock:
        entry = _serial.get(key)
        if entry is None:
            entry = _serial[key] = [threading.Lock(), 0]
        entry[1] += 1
    try:
        with entry[0]:
            yield
    finally:
        with _lock:
            entry[1] -= 1
            if not entry[1]:  # nobody waits on it: sessions come and go, their locks must not pile up
                del _serial[key]


@dataclass(slots=True)
class SessionState:
    """What the journal says about a session: finished messages, the next turn, an unfinished one."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    next_turn: int = 0
    unfinished: tuple[int, str] | None = None  # (turn, message) of a turn that neither completed nor failed


def check_origin(run_id: str, tags: list[str], agent: str, api: bool) -> None:
    """Refuse a run of agent ``agent`` that the other kind of agent of that name started.

    An LLM agent an API client defined (``api``, its runs tagged ``API_AGENT_TAG``)
    and an in-process ``engrain.Agent`` may share a name and a store: neither
    continues the other's run, whose model replies came from other instructions.
    """
    if (ev.API_AGENT_TAG in tags) == api:
        return
    if api:
        raise AgentMismatchError(run_id, f"was not started by the LLM agent {agent!r} defined over the HTTP API (an"
                                         " in-process engrain.Agent of that name, or a run from before they were told"
                                         " apart): this agent never continues it")
    raise AgentMismatchError(run_id, f"was started by the LLM agent {agent!r} an API client defined over the HTTP API,"
                                     " not by this engrain.Agent: it is never continued here")


def load(journal: Journal, agent: str, session: str, api: bool = False) -> SessionState:
    """Read the session's turns (finished ones from the process cache), in turn order.

    A turn's run may be gone (``engrain.gc`` deletes finished runs: a failed turn, or old ones),
    so the turns are not read up to the first missing number: the session's turns after it are
    listed (by their ids' prefix), ordered by number, and the next turn comes after the highest one.
    A failed or cancelled turn adds no message. The first unfinished turn ends the read: it is
    resumed before a next turn is written (``next_turn`` is its number).

    An in-process agent (not ``api``) refuses a session an API-defined agent of its
    name wrote a turn of (:func:`check_origin`); an API-defined one may read an
    in-process agent's turns (its clients may read every run) but never continues one.
    """
    check_session(session)
    ck = (journal.url, agent, session, api)
    with _lock:
        seen = _finished.get(ck)
        turns = list(seen.turns) if seen is not None else []
        last, created = (seen.last, seen.created) if seen is not None else (-1, None)
    state = SessionState()
    for _, msgs in turns:
        if msgs:
            state.messages.extend(msgs)
    listed: dict[int, RunInfo] | None = None
    n = last + 1
    while True:
        info = journal.get_run(turn_id(agent, session, n))
        if info is None:
            # Turn ids are probed in order (so a run at the next id is always seen, whatever its tags),
            # but a missing one may be a gap: later turns are found by listing the session's.
            if listed is None:
                since = None if created is None else created - CLOCK_SLACK
                listed = _listed(journal, agent, session, since)
            later = [k for k in listed if k > n]
            if not later:
                break
            n = min(later)
            info = listed[n]
        if ev.CLIENT_TAG in info.tags:
            # A client may create a run of any id: a forged turn's messages are never this agent's history.
            raise AgentMismatchError(info.run_id, CLIENT_RUN)
        if not api:
            check_origin(info.run_id, info.tags, agent, api)
        end = journal.read(info.run_id, after=info.next_seq - 2)
        if end and end[-1].kind not in _ENDS:
            # Unfinished, or a row follows its end (an answer an older engrain took after a cancel, a
            # forged one): the first finishing event is the run's end, as a resume reads it.
            end = [e for e in journal.read(info.run_id) if e.kind in _ENDS][:1]
        kind = end[-1].kind if end else ""
        if kind == ev.RUN_COMPLETED:
            msgs = (end[-1].data.get("output") or {}).get("messages") or []
        elif kind == ev.RUN_FAILED or kind == ev.RUN_CANCELLED:
            msgs = None  # skipped: its message got no answer (a cancelled turn is never resumed either)
        else:
            state.unfinished = (n, info.task)
            break
        turns.append((n, msgs))
        last, created = n, info.created
        if msgs:
            state.messages.extend(msgs)
        n += 1
    with _lock:
        seen = _finished.get(ck)
        if turns and (seen is None or seen.last < last):  # another thread may have read further meanwhile
            _finished[ck] = _Seen(turns, last, created)
    state.next_turn = n
    return state


def _listed(journal: Journal, agent: str, session: str, since: float | None) -> dict[int, RunInfo]:
    """The session's turns of ``agent`` by number, as the journal lists them (by their ids' prefix).

    ``since``: only runs updated since then (a turn after a known one was created after it, so
    its run was updated after it too; the caller gives the known turn's creation less
    :data:`CLOCK_SLACK`). A run's update time is its writer's clock.
    """
    prefix = turn_id(agent, session, 0)[:-1]
    out: dict[int, RunInfo] = {}
    offset = 0
    while True:
        # by the turn ids' prefix, not the session tag: SQLite reads a prefix from the primary key,
        # where a tag is a scan of every run (the first message of every new session lists)
        page = journal.runs(prefix=prefix, since=since, limit=_PAGE, offset=offset)
        for info in page:
            rid = info.run_id
            if rid.startswith(prefix) and _TURN_RE.fullmatch(rid[len(prefix):]):
                out[int(rid[len(prefix):])] = info
        if len(page) < _PAGE:
            return out
        offset += _PAGE
