"""Which recorded step answers a call on replay: the same type, name and arguments (JSON kinds included).

A recorded result goes only to the call that recorded it. In sequence the cursor
names that call; concurrent branches (threads, ``asyncio.gather``) may begin their
steps in another order on resume, so a branch finds its own unconsumed step by
(type, name, argument digest) among those that ran together (:class:`RecordedCalls`,
:func:`steps_together`).
"""

from __future__ import annotations

from typing import Any, Protocol

from .. import _events as ev
from .._events import is_json


class StepRecord(Protocol):
    """What matching reads of a recorded step (:class:`.steps.StepRecord`, which imports this module)."""

    type: str
    name: str
    args: Any
    digest: str | None

#: Step types whose arguments identify the call: a recorded result goes only to a call with the same
#: type, name and arguments. Clock reads, sleeps and patch markers are matched by name only.
ARGS_CHECKED = frozenset({"tool", "udf", "llm"})
#: Types a replay still hands their recorded step at the cursor when the arguments differ, if that step ran
#: alone (see :func:`steps_together`): frameworks rebuild an LLM call's conversation with fresh timestamps
#: and ids on every run, and a question's prompt may quote the time; in sequence, order names the call.
LOOSE_IN_ORDER = frozenset({"llm", "input"})
#: Types whose recorded steps concurrent branches may take out of order (their identity is exact).
_IDENTIFIED = ARGS_CHECKED | {"input"}


_blake2b: Any = None


def args_digest(args: dict[str, Any]) -> str:
    """A digest of strictly JSON ``args`` (recorded as ``ad``, taken before the call can change them)."""
    global _blake2b
    if _blake2b is None:
        from hashlib import blake2b  # lazily: hashlib (OpenSSL) costs ~20 ms of start-up

        _blake2b = blake2b
    return _blake2b(ev.dumps_checked(args).encode(), digest_size=8).hexdigest()


#: The types of JSON's scalars (``_events.SCALAR_TYPES``).
SCALARS = _SCALARS = ev.SCALAR_TYPES


def mutable_args_digest(args: dict[str, Any]) -> str | None:
    """:func:`args_digest` when the call could change ``args`` (a list or dict among them), else None.

    The digest exists because the recorded arguments are written after the call; arguments that
    are all scalars cannot have been changed by it, so the recorded ones are the call's and
    :func:`same_args` compares them directly. Most tool calls pass scalars: this spares each the
    encoding and hashing.
    """
    for v in args.values():
        if type(v) not in _SCALARS:
            return args_digest(args)
    return None


def same_json(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` are the same JSON value, kinds included: ``True``, ``1`` and ``1.0`` differ.

    Python's ``==`` says ``True == 1 == 1.0``, but a tool given ``True`` is not the call that
    recorded ``1``. The journal keeps the difference (its text holds ``true``, ``1``, ``1.0``, and
    decodes each back to its own type), so a faithful replay always passes the recorded kinds and
    this never flags it. Strict JSON has exact types (``check_json``), so ``type() is`` suffices.
    """
    t = type(a)
    if t is not type(b):
        return False
    if t is dict:
        return a.keys() == b.keys() and all(same_json(v, b[k]) for k, v in a.items())
    if t is list:
        return len(a) == len(b) and all(map(same_json, a, b))
    return a == b


def same_kinds(recorded: Any, given: Any) -> bool:
    """For values already found ``==``: True when each pair is also the same JSON kind (see :func:`same_json`).

    The replay fast path's check, after its tuple comparison: a type lookup per argument
    (a plain loop: ~3x cheaper than building lists of types), the deep walk only for a list or dict.
    """
    scalars = _SCALARS
    for r, g in zip(recorded, given):
        t = type(r)
        if t is not type(g) or (t not in scalars and not same_json(r, g)):
            return False
    return True


def same_args(rec: StepRecord, args: dict[str, Any]) -> bool:
    """True when a call with ``args`` is the call ``rec`` recorded (the same JSON values, see :func:`same_json`)."""
    if same_json(args, rec.args):
        return True  # the common case: no encoding
    if rec.digest is None:
        return False
    try:
        # The recorded arguments may have been changed by the call itself (recorded after it): the
        # digest was taken before.
        return args_digest(args) == rec.digest
    except (TypeError, ValueError):  # not JSON: not what was recorded
        return False


def call_digest(type_: str, args: dict[str, Any]) -> str | None:
    """The ``ad`` a new step of ``type_`` records: an LLM call's always (so a journal without one is known to
    predate the check: see :meth:`RecordedCalls.find`), a tool's or UDF's when the call could change ``args``."""
    if type_ == "llm":
        return args_digest(args)
    return mutable_args_digest(args) if type_ in ARGS_CHECKED else None


def same_call(rec: StepRecord, type_: str, name: str, args: dict[str, Any]) -> bool:
    """True when ``rec`` recorded this very call: same type and name, and the same arguments where they count."""
    return rec.name == name and rec.type == type_ and (type_ not in _IDENTIFIED or same_args(rec, args))


class RecordedCalls:
    """A resumed run's identified steps by (type, name, argument digest), in recorded order: where a
    concurrent branch (threads, ``asyncio.gather``) finds its own step when the cursor's is another's."""

    def __init__(self, steps: dict[int, StepRecord]):
        self.by_key: dict[tuple[str, str, str], list[int]] = {}
        for cid in sorted(steps):
            rec = steps[cid]
            if rec.type in _IDENTIFIED:
                try:
                    # ``ad`` was taken as the call began; without one the recorded arguments are the call's.
                    key = (rec.type, rec.name, rec.digest or args_digest(rec.args))
                except (TypeError, ValueError):
                    continue
                self.by_key.setdefault(key, []).append(cid)

    def find(self, steps: dict[int, StepRecord], type_: str, name: str, args: dict[str, Any],
             free: Any) -> StepRecord | None:
        """The first recorded step ``free(call_id)`` says is unconsumed that recorded this call, or None."""
        if type_ not in _IDENTIFIED or not self.by_key or not is_json(args):
            return None
        try:
            ids = self.by_key.get((type_, name, args_digest(args)))
        except (TypeError, ValueError):
            return None
        for cid in ids or ():
            rec = steps[cid]
            if free(cid) and same_call(rec, type_, name, args):  # the digest's word checked, type-exact
                return rec
        return None


def steps_together(steps: dict[int, StepRecord], events: list[ev.Event]) -> set[int]:
    """The recorded steps whose spans (start to outcome) overlapped another's. Numbers are given as calls
    begin, so a step that never finished was in flight with every step recorded after it."""
    spans: dict[int, list[float]] = {}
    for e in events:
        d = e.data
        kind = e.kind
        if kind == ev.REPLAY_COMPLETED:
            continue  # one transaction, in call order: nothing ran together
        cid = d.get("call_id") if isinstance(d, dict) else None
        if type(cid) is not int or cid not in steps:
            continue
        span = spans.get(cid)
        if kind == ev.STEP_STARTED:
            if span is None:
                spans[cid] = [e.ts, float("inf")]  # until its outcome, if any
        elif kind in (ev.STEP_COMPLETED, ev.STEP_FAILED):
            start = d.get("started")
            if span is None:
                spans[cid] = [start if isinstance(start, (int, float)) else e.ts, e.ts]
            else:
                span[1] = e.ts
        elif kind == ev.INPUT_REQUESTED and span is None:
            spans[cid] = [e.ts, e.ts]
    ids = sorted(steps)
    hole = next((i for i, cid in enumerate(ids) if cid != i), None)
    together = set(ids[hole:]) if hole is not None else set()
    order = sorted(spans.items(), key=lambda x: (x[1][0], x[0]))
    latest = float("-inf")
    for i, (cid, (start, end)) in enumerate(order):
        # Overlapping an earlier-started span, or the next one to start (the earliest of the later ones).
        if start < latest or (i + 1 < len(order) and order[i + 1][1][0] < end):
            together.add(cid)
        latest = max(latest, end)
    return together
