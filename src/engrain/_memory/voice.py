"""A question about a speaker of a chat log, asked in that speaker's own voice (the dense half of a recall).

A memory of conversations holds turns as their speakers wrote them, in the
first person under a chat-log header ("Melanie (8:56 pm on 20 July, 2023): We
always look forward to our family camping trip..."), while a question about
them names the speaker in the third person ("What does Melanie do with her
family on hikes?"). The embedder compares the two as they are written, so the
question sits closer to turns *about* Melanie (her partner's "Wow, Melanie!")
than to Melanie's own. When a skill's records are a chat log (two or more
speakers each heading several of its recent records, :func:`speakers_of`) and
an English wh-question names exactly one of them, the query vector is made
from the question in that speaker's voice, under the same kind of header:
"Melanie: What does I do with my family on hikes?" (:func:`in_voice`; the
verb is left as it is: fixing its agreement changed no result). Only the
vector is: the full text, the temporal prior and the recall event keep the
question as asked. A yes/no question is left as asked too: in the first
person ("Ben: Does I still have my dog?") it reads like the conversation's
own questions ("Do you still have the beagle?"), not like the turn answering
them.

Whether it applies depends on the embedder (:func:`wanted`): it helps the
shipped MiniLM, whose vectors follow a text's surface (names, persons), and
not a stronger model, which already relates "What does Melanie do" to
Melanie's "We always..." (EmbeddingGemma-300M, LoCoMo dev: any@5 0.763 ->
0.760, session-hit@1 0.754 -> 0.746 with it; without its prompts 0.740 ->
0.726). So an embedder opts in with ``speaker_voice = True`` (the shipped
MiniLM, both files, does), and ``Ranking(voice=...)`` overrides either way.

Measured on bench/memory_quality.py (default embedder, all four sets in one
run, any@5 all@5 any@10 session-hit@1): LoCoMo's development conversations
0.692 0.565 0.811 0.706 -> 0.709 0.579 0.814 0.715 (any@5 / session-hit@1 per
conversation: 26 0.720/0.740 -> 0.740/0.747, 30 0.704/0.728 -> 0.728/0.741,
44 0.650/0.650 -> 0.659/0.659); dense search alone on the voiced questions
0.477 -> 0.540 any@5. The chats and the FAQ sets rank exactly as before
(their records carry no chat-log header). The header alone ("Melanie: What
does Melanie do...") lowered dense search (0.444), and the first person alone
did not help (0.466): the two together match how the turns are written.
Mixing the voiced and the asked question's vectors did less (0.698 any@5).
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

#: A chat-log header: a name of one to three words (each capitalised, :func:`speaker`), an optional time stamp in
#: parentheses, a colon.
_HEADER = re.compile(r"^\s*([^\W\d_][\w'.-]{0,20}(?: [^\W\d_][\w'.-]{0,20}){0,2})\s*(?:\([^)\n]{0,80}\))?\s*:\s")
#: Records read per skill to learn its speakers (its most recent ones), and the characters read of each.
SAMPLE, HEAD_CHARS = 256, 128
#: Seconds a skill's speakers are kept on PostgreSQL (no in-process mirror tells when its records changed).
KEEP_SECONDS = 60
#: Records a name must head in the sample to count as a speaker, and speakers a skill needs to be a chat log.
MIN_TURNS, MIN_SPEAKERS = 2, 2
#: The least share of the sample the speakers' turns must be: a few lines headed "Teacher:" and "Student:" in a
#: joke among a skill's notes are no chat log.
MIN_SHARE = 0.5
#: An English wh-question (what the pronoun rewrite knows, and what the speaker's own turns answer in kind).
_ENGLISH_QUESTION = re.compile(r"^\s*(what|what's|when|where|who|whom|whose|why|how|which)\b", re.IGNORECASE)
#: Third-person words that stand for the one speaker a question names, and their first-person forms.
_FIRST_PERSON = {"she": "I", "he": "I", "her": "my", "his": "my", "herself": "myself", "himself": "myself"}
_PRONOUN = re.compile(r"\b(" + "|".join(_FIRST_PERSON) + r")\b", re.IGNORECASE)
#: Questions longer than this are left as they are (bounded work on any input).
_MAX_QUERY = 2000


def speaker(text: str) -> str | None:
    """The name heading ``text`` as a chat-log speaker (``"Melanie (8:56 pm ...): ..."`` -> ``"Melanie"``), else None."""
    m = _HEADER.match(text[:HEAD_CHARS])
    return m.group(1) if m and all(w[0].isupper() for w in m.group(1).split()) else None


def speakers_of(heads: Iterable[str]) -> frozenset[str]:
    """The speakers of a chat log whose records open with these texts: names heading at least ``MIN_TURNS`` of them,
    when at least ``MIN_SPEAKERS`` names do (one name heading many records is a label such as "Note:", not a chat)
    and their turns are at least ``MIN_SHARE`` of the texts."""
    heads = list(heads)
    counts = Counter(s for s in map(speaker, heads) if s is not None)
    names = frozenset(n for n, c in counts.items() if c >= MIN_TURNS)
    if len(names) < MIN_SPEAKERS or sum(counts[n] for n in names) < MIN_SHARE * len(heads):
        return frozenset()
    return names


def in_voice(query: str, speakers: frozenset[str] | Callable[[], frozenset[str]]) -> str:
    """``query`` as the one speaker it names would say it ("Melanie: What does I do with my family?"), or ``query``
    unchanged when it is not an English question or names no speaker, or more than one.

    ``speakers`` may be a function returning them, called only for an English question.
    """
    if len(query) > _MAX_QUERY or not _ENGLISH_QUESTION.match(query):
        return query
    if callable(speakers):
        speakers = speakers()
    named = [n for n in speakers if re.search(rf"(?<!\w){re.escape(n)}(?!\w)", query)]
    if len(named) != 1:
        return query
    name = re.escape(named[0])
    # "the User" (a transcript's role names) is the speaker as much as "User" is
    said = re.sub(rf"(?<!\w)(?:the\s+)?{name}['’]s\b", "my", query)
    said = re.sub(rf"(?<!\w)(?:the\s+)?{name}(?!\w)", "I", said)
    said = _PRONOUN.sub(lambda m: _FIRST_PERSON[m.group(1).lower()], said)
    return f"{named[0]}: {said}"


def wanted(embedder: object, setting: bool | None) -> bool:
    """Whether recall asks in a speaker's voice: ``setting`` (``Ranking.voice``) when given, else the embedder's
    ``speaker_voice`` (True for the shipped MiniLM, which it was measured to help; absent means no)."""
    return bool(getattr(embedder, "speaker_voice", False)) if setting is None else setting


class Speakers:
    """Per skill, its chat-log speakers (:func:`speakers_of` its most recent records), kept while ``key`` holds."""

    def __init__(self) -> None:
        self._kept: dict[str | None, tuple[Any, frozenset[str]]] = {}
        self._lock = threading.Lock()

    def get(self, skill: str | None, key: Any, heads: Callable[[], list[str]]) -> frozenset[str]:
        """The speakers of ``skill``; ``heads()`` reads its recent records' heads when ``key`` changed since."""
        with self._lock:
            hit = self._kept.get(skill)
        if hit is not None and hit[0] == key:
            return hit[1]
        names = speakers_of(heads())
        with self._lock:
            if len(self._kept) > 1000:
                self._kept.clear()
            self._kept[skill] = (key, names)
        return names
