"""Chat sessions: each turn is one durable run, the session is the sequence of turns.

Turn ``n`` of session ``s`` of agent ``a`` is the run ``chat:a:s:n`` whose task
is the user's message and whose output holds the turn's messages, each with
the time it was written. So a session lives in the journal like every run:
it survives restarts, a turn killed midway resumes like any run, and the
history is the finished turns' messages in order. Finished turns never change,
so they are cached per process. A turn's run that an HTTP API client created (a
client may create a run of any id) is refused, never read as the agent's history.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any

from .. import _events as ev
from .._durable.identity import CLIENT_RUN
from .._errors import AgentMismatchError, ConfigError
from .._journal import Journal

_SESSION_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")
MAX_TURNS_SCAN = 100_000

_lock = threading.Lock()
_finished: dict[tuple[str, str, str, bool], list[tuple[int, list[dict[str, Any]] | None]]] = {}


def check_session(session: str) -> str:
    """``session`` if it is a valid id (letters, digits, ``_ . -``, at most 100), else :class:`ConfigError`."""
    if not isinstance(session, str) or not _SESSION_RE.match(session):
        raise ConfigError(f"session id {session!r}: use 1-100 letters, digits, '_', '.' or '-'")
    return session


def turn_id(agent: str, session: str, n: int) -> str:
    """The run id of turn ``n``."""
    return f"chat:{agent}:{session}:{n}"


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
    """Read the session's turns (finished ones from the process cache).

    An in-process agent (not ``api``) refuses a session an API-defined agent of its
    name wrote a turn of (:func:`check_origin`); an API-defined one may read an
    in-process agent's turns (its clients may read every run) but never continues one.
    """
    check_session(session)
    ck = (journal.url, agent, session, api)
    with _lock:
        done = list(_finished.get(ck, ()))
    state = SessionState()
    for _, msgs in done:
        if msgs:
            state.messages.extend(msgs)
    n = len(done)
    while n < MAX_TURNS_SCAN:
        info = journal.get_run(turn_id(agent, session, n))
        if info is None:
            break
        if ev.CLIENT_TAG in info.tags:
            # A client may create a run of any id: a forged turn's messages are never this agent's history.
            raise AgentMismatchError(info.run_id, CLIENT_RUN)
        if not api:
            check_origin(info.run_id, info.tags, agent, api)
        last = journal.read(info.run_id, after=info.next_seq - 2)
        kind = last[-1].kind if last else ""
        if kind == ev.RUN_COMPLETED:
            msgs = (last[-1].data.get("output") or {}).get("messages") or []
        elif kind == ev.RUN_FAILED:
            msgs = None  # a failed turn is skipped: its message got no answer
        else:
            state.unfinished = (n, info.task)
            break
        with _lock:
            lst = _finished.setdefault(ck, [])
            if len(lst) == n:
                lst.append((n, msgs))
        if msgs:
            state.messages.extend(msgs)
        n += 1
    state.next_turn = n
    return state
