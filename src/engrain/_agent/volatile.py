"""How a replayed tool result is compared with the recorded one (the agent's behavior cache).

A cached trajectory replays while every tool returns what it returned then.
Some results can never be equal twice: a write tool that returns the record it
created carries the time it was written and an id it just minted. This module
decides which differences end a replay.

A tool says it itself (``@engrain.tool(volatile=[...])`` or
``same_result=fn``, or the agent's ``volatile=``/``same_result=`` for plain
functions): the fields listed are ignored, or ``fn(recorded, fresh)`` decides.
``volatile=()`` compares everything.

Otherwise the default tolerates a difference only when all of these hold:

* the two values have the shape of something a tool generates, not of
  something it looks up: a stamp of the call itself (an ISO date-time under a
  key such as ``created_at``, ``sent``, ``timestamp``, ``fetched_at`` or
  ``as_of``, or a number of epoch seconds there, that is within
  :data:`WINDOW` of the time of its call on both sides: a record's
  ``updated_at`` of last week or a quote ``as_of`` an hour ago is data the
  model may have judged, and never a due date or a time the tool was asked
  for), or a generated id (a UUID, a long hex or random token, a prefixed
  ``msg_8f3a91c2``-style id) with the same prefix and length on both sides
  that differ as two random draws do (in at least half of their characters,
  and only in parts holding a digit: ``ch_approved_…``/``ch_declined_…`` or
  two product codes a few characters apart differ in meaning);
* the recorded value is not in the task text or the session's earlier
  messages (then the user named it; for an id, any :data:`RUN` characters of
  it in any case count);
* the model never read it again. What the model did after seeing the result is
  on record: the arguments of its later tool calls and the text of its later
  replies and final answer. A value that appears in none of them was not
  used. An id that occurs anywhere before (the task, earlier replies and
  results, the turn's other results) or elsewhere in its own result (a
  ``deployed`` equal to a ``latest``) may have been compared, and ends the
  replay. A generated id that does appear there whole, and that this very call
  minted, is what the model copied, so the later
  recorded arguments and answer are replayed with the new id in its place; an
  id used in another form (a part of it, upper-cased) cannot be carried and
  ends the replay, and so does a stamp that appears there (as written, or its
  date or time of day in a usual form), as do stamps of one turn that came
  in another order.

Amounts, names, addresses, statuses, short or all-digit ids (card, account and
phone numbers), dates that are not write stamps and a bare time a tool was
asked for never have those shapes, so any change in them ends the replay: the
model's next step could depend on them. A field a tool declares ``volatile``
is ignored, but a changed value of it that the model copied into a later step
ends the replay unless it is a generated id (which is carried as above).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from .._errors import ConfigError

__all__ = ["ResultCheck", "Replayer", "result_check"]

_DATETIME = r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
_TOKEN = re.compile(_DATETIME + r"|[^\s\"',;:=(){}\[\]<>]+")
_DATETIME_RE = re.compile(_DATETIME)
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_PREFIXED = re.compile(r"([A-Za-z]{1,16}[_-])([A-Za-z0-9]{8,})")
_HEX = re.compile(r"[0-9a-fA-F]{16,}")
_SEP = re.compile(r"[_\-.:/]")
WINDOW = 120.0  # seconds: how near the time of its call a stamp must be to be a stamp of the call
RUN = 5  # characters of an id that, found in a later text, mean the model used that id (in some form)
_STAMP_WORDS = ("created", "sent", "received", "issued", "generated", "updated", "modified", "written",
                "saved", "posted", "logged", "uploaded", "submitted", "delivered", "processed", "requested",
                "fetched", "retrieved", "checked", "polled")
_STAMP_KEY = re.compile(
    r"(?:%s)(?:_?(?:at|on|time|timestamp|ts|date))?|timestamp|ts|as_?of|(?:date|time)_?(?:%s)"
    % ("|".join(_STAMP_WORDS), "|".join(_STAMP_WORDS)))


def _norm_key(key: str | None) -> str:
    if not key:
        return ""
    k = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key.strip().strip(":=")).lower()  # camelCase -> snake_case
    return k.replace("-", "_")


def _stamp_key(key: str | None) -> bool:
    return bool(_STAMP_KEY.fullmatch(_norm_key(key)))


def _id_shape(v: str) -> tuple[str, int] | None:
    """``(prefix, length)`` when ``v`` looks like a generated id, else None."""
    if _UUID.fullmatch(v):
        return ("uuid", 36)
    if (m := _PREFIXED.fullmatch(v)) and re.search(r"\d", m.group(2)) and re.search(r"[A-Za-z]", m.group(2)):
        return (m.group(1), len(v))
    if _HEX.fullmatch(v) and re.search(r"\d", v) and re.search(r"[a-fA-F]", v):
        return ("hex", len(v))
    if len(v) >= 16 and re.fullmatch(r"[A-Za-z0-9_-]+", v) and sum(c.isdigit() for c in v) >= 3 and \
            sum(c.isalpha() for c in v) >= 3:
        return ("token", len(v))
    return None


def _fresh_pair(shape: tuple[str, int], a: str, b: str) -> bool:
    """Whether two ids of the same shape differ as two draws of a generator do: every part (between
    ``_``, ``-``, ``.``, ``:``, ``/``) that differs holds a digit on both sides and differs in at least
    half of its characters (a word that changed, ``ch_approved_…`` against ``ch_declined_…``, or a
    code a few characters apart, is meaning; a constant part, ``ch_approved_``, is not a difference)."""
    if shape[0] == "uuid":
        return True
    sa, sb = _SEP.split(a), _SEP.split(b)
    return len(sa) == len(sb) and all(
        x == y or (len(x) == len(y) and bool(re.search(r"\d", x)) and bool(re.search(r"\d", y))
                   and 2 * sum(c != d for c, d in zip(x, y)) >= len(x))
        for x, y in zip(sa, sb))


def _kind(key: str | None, old: Any, new: Any) -> str | None:
    """``"stamp"`` or ``"id"`` when both values have that generated shape, else None."""
    if isinstance(old, bool) or isinstance(new, bool):
        return None
    if isinstance(old, (int, float)) and isinstance(new, (int, float)):
        # epoch seconds or milliseconds, only under a write-stamp key
        def epoch(x: float) -> bool:
            return 1e9 <= x < 1e10 or 1e12 <= x < 1e13
        return "stamp" if _stamp_key(key) and epoch(old) and epoch(new) else None
    if not isinstance(old, str) or not isinstance(new, str):
        return None
    if _DATETIME_RE.fullmatch(old) and _DATETIME_RE.fullmatch(new):
        return "stamp" if _stamp_key(key) else None
    a, b = _id_shape(old), _id_shape(new)
    return "id" if a is not None and a == b and _fresh_pair(a, old, new) else None


def _epochs(value: Any) -> list[float]:
    """The instants a stamp may stand for (a time without a zone: in UTC or in local time)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value / 1000 if value >= 1e12 else float(value)]
    try:
        t = _dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return []
    if t.tzinfo is not None:
        return [t.timestamp()]
    return [t.replace(tzinfo=_dt.timezone.utc).timestamp(), t.timestamp()]


def _of_call(value: Any, at: float | None) -> bool:
    """Whether a stamp is within :data:`WINDOW` of ``at``, the time of its call: a stamp the call
    made, not a time it looked up (a record's ``updated_at``, a quote's ``as_of``), which the
    model may have judged (fresh or stale, before or after)."""
    return at is not None and any(abs(t - at) <= WINDOW for t in _epochs(value))


def _at(reply: dict[str, Any]) -> float | None:
    e = _epochs(reply.get("ts") or "")
    return e[0] if e else None


MAX_DEPTH = 64  # nesting compared field by field; deeper results must be equal as a whole


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _text_diffs(key: str | None, path: str, old: str, new: str, out: list[tuple[str, str | None, Any, Any]]) -> bool:
    """Token differences between two texts of the same skeleton; False when the skeletons differ."""
    ta, tb = _TOKEN.findall(old), _TOKEN.findall(new)
    if len(ta) != len(tb) or _TOKEN.sub("\0", old) != _TOKEN.sub("\0", new):
        return False
    prev = key
    for a, b in zip(ta, tb):
        if a != b:
            out.append((path, prev, a, b))
        prev = a if a == b else None  # a word before a value names it ("timestamp: ...", "id=...")
    return True


def _diffs(old: Any, new: Any, path: str = "", key: str | None = None,
           out: list[tuple[str, str | None, Any, Any]] | None = None,
           depth: int = 0) -> list[tuple[str, str | None, Any, Any]] | None:
    """Leaf differences ``(dotted path, key, old, new)``; None when the two differ in structure."""
    out = [] if out is None else out
    if depth > MAX_DEPTH:
        return out if old == new else None
    if isinstance(old, dict) and isinstance(new, dict):
        if old.keys() != new.keys():
            return None
        for k in old:
            if _diffs(old[k], new[k], f"{path}.{k}" if path else str(k), str(k), out, depth + 1) is None:
                return None
        return out
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return None
        for i, (a, b) in enumerate(zip(old, new)):
            if _diffs(a, b, f"{path}.{i}" if path else str(i), key, out, depth + 1) is None:
                return None
        return out
    if old == new and type(old) is type(new):
        return out
    if isinstance(old, str) and isinstance(new, str):
        if _DATETIME_RE.fullmatch(old) or _id_shape(old) is not None:
            out.append((path, key, old, new))
            return out
        return out if _text_diffs(key, path, old, new, out) else None
    out.append((path, key, old, new))
    return out


@dataclass(frozen=True, slots=True)
class ResultCheck:
    """How one tool's replayed result is compared: ``volatile`` fields ignored (None: the default),
    or ``same(recorded, fresh) -> bool``."""

    volatile: tuple[str, ...] | None = None
    same: Callable[[Any, Any], bool] | None = None

    def ignores(self, path: str, key: str | None) -> bool:
        assert self.volatile is not None
        return any(p == key or p == path or fnmatchcase(path, p) for p in self.volatile)


DEFAULT = ResultCheck()


def result_check(tool: str, volatile: Iterable[str] | None = None,
                 same_result: Callable[[Any, Any], bool] | None = None) -> ResultCheck:
    """A :class:`ResultCheck` from a tool's options, checked (``ConfigError`` naming the tool)."""
    if volatile is not None and same_result is not None:
        raise ConfigError(f"tool {tool!r}: give volatile= or same_result=, not both")
    if same_result is not None:
        if not callable(same_result):
            raise ConfigError(f"tool {tool!r}: same_result must be a function (recorded, fresh) -> bool")
        return ResultCheck(same=same_result)
    if volatile is None:
        return DEFAULT
    if isinstance(volatile, str):
        volatile = [volatile]
    fields = tuple(volatile)
    if not all(isinstance(f, str) and f and len(f) <= 256 for f in fields) or len(fields) > 256:
        raise ConfigError(f"tool {tool!r}: volatile must be a list of field names or dotted paths ('*' matches any)")
    return ResultCheck(volatile=fields)


def _texts(turn: dict[str, Any]) -> list[str]:
    reply = turn["reply"]
    return [reply.get("text") or "", *(c["arguments"] for c in reply.get("tool_calls") or [])]


class Replayer:
    """One replay of a recorded trajectory: compares fresh results with the recorded ones and
    carries the ids the fresh results minted into the recorded replies that copied them."""

    def __init__(self, turns: list[dict[str, Any]], task: str, before: Iterable[str] = (), at: str | None = None):
        """``at``: when the fresh calls run (an ISO time from the run's journal, so that a resumed
        run, comparing journaled results later, decides as the first attempt did; default: now)."""
        self.turns = turns
        self.task = task
        self.before = [task, *before]
        self.at = _at({"ts": at}) if at is not None else None
        self.subs: dict[str, str] = {}

    def _sub(self, text: str) -> str:
        for old, new in self.subs.items():
            if old in text:
                text = _whole(old).sub(lambda _: new, text)
        return text

    def reply(self, turn: int) -> dict[str, Any]:
        """The recorded reply of ``turn``, with minted ids replaced by the fresh ones."""
        reply = self.turns[turn]["reply"]
        if not self.subs:
            return reply
        return {**reply, "text": self._sub(reply.get("text") or ""),
                "tool_calls": [{**c, "arguments": self._sub(c["arguments"])} for c in reply.get("tool_calls") or []]}

    def matches(self, turn: int, names: list[str], fresh: list[str], checks: dict[str, ResultCheck]) -> bool:
        """Whether the fresh results of ``turn`` let the replay go on (see the module docstring)."""
        recorded = self.turns[turn]["results"]
        if len(recorded) != len(fresh):
            return False
        later = [t for x in self.turns[turn + 1:] for t in _texts(x)]
        earlier = [*self.before, *(t for x in self.turns[:turn] for t in (*_texts(x), *x["results"])),
                   *_texts(self.turns[turn])]
        rec_at, now = _at(self.turns[turn]["reply"]), self.at if self.at is not None else time.time()
        pending: dict[str, str] = {}
        stamps: list[tuple[float, float]] = []
        for i, (rec, new) in enumerate(zip(recorded, fresh)):
            rec = self._sub(rec)
            if rec == new:
                continue
            check = checks.get(names[i], DEFAULT)
            old_v, new_v = _parse(rec), _parse(new)
            if check.same is not None:
                try:
                    if not check.same(old_v, new_v):
                        return False
                except Exception:  # a failing check is a difference, never a pass
                    return False
                continue
            diffs = _diffs(old_v, new_v)
            if diffs is None:
                return False
            others = [*earlier, *(r for j, r in enumerate(recorded) if j != i)]
            for path, key, a, b in diffs:
                if check.volatile is not None:
                    if not check.ignores(path, key):
                        return False
                    kind = _kind(key, a, b)
                    if kind != "id":
                        if _used(a, later) if kind == "stamp" else any(_whole(str(a)).search(t) for t in later):
                            return False  # the model copied a value that changed: only an id is carried
                        continue
                elif (kind := _kind(key, a, b)) is None:
                    return False
                elif kind == "stamp":
                    if any(str(v) in t for v in (a, b) for t in self.before) or \
                            not (_of_call(a, rec_at) and _of_call(b, now)) or _used(a, later):
                        return False  # named, looked up rather than made by the call, or read again
                    stamps.append((_epochs(a)[0], _epochs(b)[0]))
                    continue
                a, b = str(a), str(b)
                if check.volatile is None and (_mentions(a, self.before) or _mentions(b, self.before)):
                    return False  # the user named it (the recorded or the fresh one: "is that my order?")
                if check.volatile is None and (any(a in t for t in others) or not _alone(a, b, diffs, rec, new)):
                    return False  # it was seen before or elsewhere in the result: the model may have compared it
                whole = any(_whole(a).search(t) for t in later)
                if _mentions(a, [_whole(a).sub(" ", t) for t in later]):
                    return False  # the model used it in another form (part of it, another case): not carried
                if whole and any(a in t for t in others):
                    return False  # an id the model used that this call did not mint
                if whole:
                    pending[a] = b
        if any((a1 - a2) * (b1 - b2) < 0 for a1, b1 in stamps for a2, b2 in stamps):
            return False  # the stamps of the turn came in another order ("the last one sent")
        self.subs.update(pending)
        return True


def _alone(a: str, b: str, diffs: list[tuple[str, str | None, Any, Any]], rec: str, new: str) -> bool:
    """Whether id ``a`` occurs in the recorded result only where the fresh one has ``b``, and ``b``
    only there: no other field equal to it (``deployed`` == ``latest``) that a decision compared."""
    at = [(str(x), str(y)) for _, _, x, y in diffs if str(x) == a or str(y) == b]
    return all(p == (a, b) for p in at) and rec.count(a) == len(at) == new.count(b)


def _whole(value: str) -> re.Pattern[str]:
    """``value`` as a whole token (not inside a longer word or id)."""
    return re.compile(r"(?<![A-Za-z0-9])" + re.escape(value) + r"(?![A-Za-z0-9])")


def _mentions(value: str, texts: Iterable[str]) -> bool:
    """Whether ``value`` or any :data:`RUN` characters of it occur in ``texts``, in any case."""
    v = value.lower()
    runs = {v[k:k + RUN] for k in range(len(v) - RUN + 1)}
    runs = {r for r in runs if r.isalnum()} or {v}
    return any(r in t.lower() for t in texts for r in runs)


_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")


def _used(value: Any, later: list[str]) -> bool:
    """Whether a later recorded argument or reply used a stamp: the value, or its date or time of
    day in a usual form (as written, in UTC or local time)."""
    probes = [re.escape(str(value))]
    for t in _epochs(value):
        for d in (_dt.datetime.fromtimestamp(t, _dt.timezone.utc), _dt.datetime.fromtimestamp(t)):
            month = _MONTHS[d.month - 1]
            probes += [d.strftime("%Y-%m-%d"), rf"(?<!\d){d.month}/{d.day}(?!\d)", rf"(?<!\d){d.day}/{d.month}(?!\d)",
                       rf"{month[:3]}\w*\.? {d.day}(?!\d)", rf"(?<!\d){d.day} {month[:3]}",
                       rf"(?<!\d)\d{{1,2}}:{d.minute:02d}(?!\d)"]  # any time of day at its minute (zones differ)
    return any(re.search(p, t, re.IGNORECASE) for p in probes for t in later)
