"""Questions that ask when something happened, and records that say when (a prior of recall's score).

"When did Caroline go to the support group?" is answered by the message that
reports the event with its time ("I went to a support group yesterday"),
not by the many that mention the group. On LoCoMo's development conversations
69% of the evidence turns of temporal questions hold a relative time
expression in their message, against 10% of all turns; plain semantic and
word matching cannot see that, and ranked the reporting turn below the ones
that talk about the topic. So a question asking when a past event happened
(:func:`asks_when`) lends a small prior to the candidates whose text states
a time (:func:`states_time`).

A record's leading header (``"Caroline (1:56 pm on 8 May, 2023): ..."``, the
common form of a chat log: who spoke, and when it was said) is skipped: it
says when the message was written, on every record alike, not when its event
happened. English only; a question in another language gets no prior.
"""

from __future__ import annotations

import re

_ASKS = re.compile(
    r"\b(when\s+(did|was|were|had)|how\s+long\s+ago|(what|which)\s+(year|month|date|day|week)\s+(did|was|were))\b",
    re.IGNORECASE)
#: Relative time expressions (what a message reporting an event says); absolute dates are left out, since a
#: store whose records all carry one (a log's header, a document's date line) would lift every record alike.
_TIME = re.compile(
    r"\b(yesterday|today|tonight|ago|recently|(last|this|past)\s+(\w+\s+)?(week|weekend|month|year|night|morning|"
    r"evening|summer|winter|spring|fall|autumn|monday|tuesday|wednesday|thursday|friday|saturday|sunday|"
    r"mon|tue|wed|thu|fri|sat|sun))\b", re.IGNORECASE)
#: A chat-log header: up to ~40 characters of name, an optional parenthesis (a time stamp), then a colon.
_HEADER = re.compile(r"^\s*[^\W\d_][\w .'-]{0,40}?\s*(\([^)\n]{0,80}\))?\s*:\s*")
#: Only the head of long texts is read (bounded work per candidate).
_READ = 4000


def asks_when(query: str) -> bool:
    """Whether ``query`` asks when a past event happened ("when did ...", "how long ago ...", "what year was ...")."""
    return bool(_ASKS.search(query[:_READ]))


def states_time(text: str) -> bool:
    """Whether ``text`` (past a leading chat-log header) states when something happened ("last Friday", "yesterday")."""
    head = text[:_READ]
    return bool(_TIME.search(_HEADER.sub("", head, count=1)))
