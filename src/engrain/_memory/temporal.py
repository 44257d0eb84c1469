"""Questions that ask when something happened, and records that say when (a prior of recall's score).

"When did Caroline go to the support group?" is answered by the message that
reports the event with its time ("I went to a support group yesterday"),
not by the many that mention the group. On LoCoMo's development conversations
69% of the evidence turns of temporal questions hold a relative time
expression in their message, against 10% of all turns; plain semantic and
word matching cannot see that, and ranked the reporting turn below the ones
that talk about the topic. So a question asking when a past event happened
(:func:`asks_when`) lends a small prior to the candidates whose text states
a time (:func:`states_time`). A question naming a date ("what did Audrey
cook on 3 July, 2023?", "... in October 2023?") lends the same prior to the
candidates that carry that date (:func:`dates`): a memory of conversations
stores when each message was said, so this matches a question to the
sessions of its day (22 of the 354 development questions name one).

A record's leading header (``"Caroline (1:56 pm on 8 May, 2023): ..."``, the
common form of a chat log: who spoke, and when it was said) is skipped: it
says when the message was written, on every record alike, not when its event
happened. English only; a question in another language gets no prior.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
_MONTHS = "january|february|march|april|may|june|july|august|september|october|november|december"
#: "13 October, 2023", "October 13th 2023", "October 2023": a day is optional, month and year are not.
_DATE = re.compile(rf"(?:\b(\d{{1,2}})(?:st|nd|rd|th)?\s+)?\b({_MONTHS})\b(?:\s+(\d{{1,2}})(?:st|nd|rd|th)?\b)?,?\s+"
                   r"((?:19|20)\d\d)\b", re.IGNORECASE)
#: Only the head of long texts is read (bounded work per candidate).
_READ = 4000


def asks_when(query: str) -> bool:
    """Whether ``query`` asks when a past event happened ("when did ...", "how long ago ...", "what year was ...")."""
    return bool(_ASKS.search(query[:_READ]))


def body(text: str) -> str:
    """The head of ``text`` (its first 4,000 characters) past a leading chat-log header ("Caroline (1:56 pm ...): ")."""
    return _HEADER.sub("", text[:_READ], count=1)


def states_time(text: str) -> bool:
    """Whether ``text`` (past a leading chat-log header) states when something happened ("last Friday", "yesterday")."""
    return bool(_TIME.search(body(text)))


def dates(text: str) -> set[tuple[int | None, str, int]]:
    """The dates ``text`` names, as ``(day or None, month name in lower case, year)``."""
    return {(int(d1 or d2) if (d1 or d2) else None, m.lower(), int(y))
            for d1, m, d2, y in _DATE.findall(text[:_READ])}


@dataclass(frozen=True, slots=True)
class Prior:
    """The temporal prior of one query: ``prior(text)`` is what an item with that text gains (at most ``most``)."""

    weight: float
    when: bool
    named: frozenset[tuple[int | None, str, int]]

    @property
    def most(self) -> float:
        return self.weight * (int(self.when) + int(bool(self.named)))

    def __call__(self, text: str) -> float:
        gain = self.weight if self.when and states_time(text) else 0.0
        if self.named and any(m == m2 and y == y2 and (d is None or d == d2)
                              for d, m, y in self.named for d2, m2, y2 in dates(text)):
            gain += self.weight
        return gain


def prior(query: str, weight: float) -> Prior | None:
    """The temporal prior of ``query`` (None when it neither asks when nor names a date, or ``weight`` is 0)."""
    if weight <= 0:
        return None
    p = Prior(weight, asks_when(query), frozenset(dates(query)))
    return p if p.most > 0 else None
