"""An entry's steps resolved against an engine's tools, and whether a call's params can fill them.

:class:`ToolSpec` is an engine tool with its checks; :class:`PlannedStep` is
step ``i`` of a cached entry resolved against those tools once (entries never
change, so plans are memoized per engine). :func:`fits` says whether a call's
``params`` can fill an entry's templates (names, inline text, types).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .. import _events as ev
from .._durable.steps import SCALARS
from .._durable.tools import _spreader
from .._routines.template import render
from .binding import json_type, text_of
from .checks import Check, decode_snapshot, keep
from .metrics import Metrics
from .store import CacheStore, Entry

__all__ = ["Engine", "PlannedStep", "ToolSpec", "fits", "param_names", "plan"]


def _parameter_names(fn: Callable[..., Any]) -> frozenset[str] | None:
    # The names a recorded call holds: _binder records every parameter (defaults applied), never self/cls.
    try:
        ps = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if ps and ps[0].name in ("self", "cls"):
        ps = ps[1:]
    return frozenset(p.name for p in ps)


@dataclass(slots=True)
class ToolSpec:
    """An engine tool: the undecorated function and its checks."""

    name: str
    fn: Callable[..., Any]
    is_method: bool
    pre: Check | None
    post: Check | None
    is_async: bool
    bind: Callable[[tuple, dict], dict[str, Any]]
    pre_where: str = ""
    post_where: str = ""
    split: Callable[[dict[str, Any]], tuple[tuple[Any, ...], dict[str, Any]]] | None = None
    names: frozenset[str] | None = None

    def __post_init__(self) -> None:
        # Where a snapshot that is not JSON is reported (built once, not per step).
        self.pre_where = f"tool {self.name!r} pre_check"
        self.post_where = f"tool {self.name!r} post_check"
        self.split = _spreader(self.fn)
        self.names = _parameter_names(self.fn)

    def arguments(self, args: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The recorded ``{name: value}`` arguments as a call's ``(*args, **kwargs)``."""
        return ((), args) if self.split is None else self.split(args)


_PARAM_RE = re.compile(r"\{\{ params\.(\w+) \}\}")
_WHOLE_RE = re.compile(r"\{\{ params\.\w+ \}\}")
_param_names: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
_UNSET: Any = object()
#: The pre-check of a step whose tool has a check it recorded no snapshot for (see PlannedStep.of).
_UNRECORDED = Check(capture=lambda *args, **kwargs: None, compare=lambda current, candidate: False)


def _strings(x: Any) -> list[str]:
    if isinstance(x, str):
        return [x]
    if isinstance(x, dict):
        return [s for v in x.values() for s in _strings(v)]
    if isinstance(x, list):
        return [s for v in x for s in _strings(v)]
    return []


def param_names(e: Entry) -> tuple[frozenset[str], frozenset[str]]:
    """The ``params`` an entry's templates need, and those of them it puts inside text (cached: entries never change)."""
    names = _param_names.get(e.id)
    if names is None:
        if len(_param_names) >= 65536:  # evicted entries leave ids behind: keep the memo bounded
            _param_names.clear()
        texts = _strings([s["args"] for s in e.steps if s.get("templated")] + [e.output.get("template")])
        inline = {n for t in texts if not _WHOLE_RE.fullmatch(t) for n in _PARAM_RE.findall(t)}
        names = _param_names[e.id] = (frozenset(n for t in texts for n in _PARAM_RE.findall(t)), frozenset(inline))
    return names


def fits(e: Entry, params: dict[str, Any]) -> bool:
    """Whether ``params`` can fill ``e``'s templates: every name given, and text-bound ones as the same text Python's str() gives."""
    names, inline = param_names(e)
    types = e.output.get("param_types")
    if types is None:
        # Recorded before bound params were listed: which params it left out of its key is unknown.
        return not params
    if not types.keys() <= names:
        # A param counted bound with no placeholder (the rule before unused params were pinned): its value
        # is in no key and no template, so another value would replay what the old one made.
        return False
    if not names:  # no templates (most entries): any params fit
        return True
    if not names <= params.keys() or not all(text_of(params[n]) is not None for n in inline):
        return False
    return all(json_type(params[n]) == types.get(n) for n in names)


def _decoded(stored: dict[str, Any] | None) -> Any:
    # A plain JSON snapshot decodes to the same value whatever the fresh one is,
    # so it is decoded once; a dataclass or model one needs the fresh type each time.
    if stored is None:  # compared only by _UNRECORDED's check, which fails whatever it gets
        return None
    if "dataclass" in stored or "model" in stored or stored.get("tagged"):
        return _UNSET
    return stored.get("value")


def _expected(stored: dict[str, Any] | None, decoded: Any, snap: Any) -> Any:
    """The recorded snapshot to compare the fresh ``snap`` with: decoded once when it can be (see :func:`_decoded`).

    A list or dict is given as a copy: the decoded value is shared by every later lookup and replay of
    the entry in this process, and a ``compare`` that changes its ``candidate`` would change them all.
    """
    if decoded is _UNSET:
        return decode_snapshot(stored, snap)  # type: ignore[arg-type]
    return ev.json_copy(decoded) if type(decoded) in _CONTAINERS else decoded


#: The decoded snapshots :func:`_expected` copies (the rest are JSON scalars, which never change).
_CONTAINERS = frozenset({dict, list})


def _kept(stored: dict[str, Any] | None, decoded: Any, snap: Any, where: str) -> Any:
    """What a replay keeps of a fresh ``snap`` until it may be stored, taken before ``compare`` can change it:
    the recorded snapshot when they are equal (a hit's usual case, with nothing copied), else :func:`.checks.keep`."""
    if decoded is not _UNSET and type(snap) is type(decoded):
        try:
            if snap == decoded:
                return stored
        except Exception:  # an element whose == is no bool (a numpy array inside a dict): copied below
            pass
    return keep(snap, where)


def _seen_key(name: str, args: Any) -> str:
    return json.dumps([name, args], sort_keys=True, default=str)


@dataclass(frozen=True, slots=True)
class PlannedStep:
    """Step ``i`` of an entry resolved against the engine's tools (once per entry: entries never change).

    ``pre``/``post`` are the stored snapshots; ``check_pre``/``check_post``
    say whether this engine's tool has the check to run against them.
    """

    i: int
    name: str
    spec: ToolSpec | None
    args: dict[str, Any]
    templated: bool
    pre: dict[str, Any] | None
    post: dict[str, Any] | None
    check_pre: bool
    check_post: bool
    pre_value: Any
    post_value: Any
    seen_key: str | None  # the capture-sharing key of untemplated arguments
    plain: bool = False  # a function tool called with its recorded arguments as keywords (replay's fast path)
    scalars: bool = False  # every recorded argument is a JSON scalar (a call cannot change them)
    feeds: tuple[dict[str, Any], ...] = ()  # the parts of the result later steps used (see values.find_feeds)

    @staticmethod
    def of(i: int, step: dict[str, Any], spec: ToolSpec | None) -> PlannedStep:
        templated = bool(step.get("templated"))
        pre, post = step.get("pre"), step.get("post")
        if spec is not None and spec.names is not None and step["args"].keys() != spec.names:
            # The tool's parameters changed since the step was recorded (or another tool took its name): the
            # recorded call is not a call of this tool. No spec: the lookup skips the entry, a replay hands over.
            spec = None
        if spec is not None and (spec.pre is not None and pre is None or spec.post is not None and post is None):
            # The tool has a check this step recorded no snapshot for (added since): the step cannot be checked, so it
            # must not run unchecked. A pre-check that never passes makes the lookup skip the entry (step 0) or the
            # replay diverge before the step runs, handing over to the agent as any failed pre-check does.
            spec = dataclasses.replace(spec, pre=_UNRECORDED)
        return PlannedStep(
            i, step["name"], spec, step["args"], templated, pre, post,
            spec is not None and (spec.pre is _UNRECORDED or spec.pre is not None and pre is not None),
            spec is not None and spec.post is not None and post is not None,
            _decoded(pre), _decoded(post), None if templated else _seen_key(step["name"], step["args"]),
            spec is not None and not templated and not spec.is_method and spec.split is None,
            not templated and all(type(v) in SCALARS for v in step["args"].values()),
            tuple(step.get("feeds") or ()),
        )

    def render(self, params: dict[str, Any]) -> dict[str, Any]:
        """The arguments for this call (placeholders filled from ``params``)."""
        if not self.templated:
            return self.args
        return render(self.args, {"params": params})

    def shown(self, args: dict[str, Any]) -> dict[str, Any]:
        """The ``args`` a replay's outcome shows: a copy of recorded ones, which are the entry's (a caller may redact them)."""
        if self.templated:  # rendered for this call
            return args
        return dict(args) if self.scalars else ev.json_copy(args)

    def kept_pre(self, snap: Any) -> Any:
        """What a replay keeps of this step's fresh pre-check ``snap`` (see :func:`_kept`)."""
        return _kept(self.pre, self.pre_value, snap, self.spec.pre_where)  # type: ignore[union-attr]

    def kept_post(self, snap: Any) -> Any:
        """What a replay keeps of this step's fresh post-check ``snap`` (see :func:`_kept`)."""
        return _kept(self.post, self.post_value, snap, self.spec.post_where)  # type: ignore[union-attr]

    def held(self, kept: Any) -> Any:
        """The pre-check snapshot to store for this replayed step: the recorded one (``_UNSET``: not taken again),
        what :func:`~.checks.keep` made, or a bare str or number (the fast path makes the pair only when stored)."""
        if kept is _UNSET:
            return self.pre
        return kept if type(kept) is tuple or type(kept) is dict else (kept, self.spec.pre_where)  # type: ignore[union-attr]


class Engine(Protocol):
    """What a replay uses of its :class:`~engrain._cache.engine.Engine`.

    Declared here, not imported, so the engine module (which starts sessions)
    and this one (which runs them) do not import each other.
    """

    store: CacheStore
    evict_after: int
    metrics: Metrics
    _plans: dict[str, tuple[PlannedStep, ...]]
    _specs: dict[str, ToolSpec]
    _context: Any

    def set_context(self, obj: Any) -> Any: ...


def plan(engine: Engine, e: Entry) -> tuple[PlannedStep, ...]:
    """The planned steps of ``e`` for ``engine`` (memoized per engine; cleared when a tool is added)."""
    plans = engine._plans
    p = plans.get(e.id)
    if p is None:
        if len(plans) >= 4096:  # evicted entries leave plans behind: keep the memo bounded
            plans.clear()
        specs = engine._specs
        p = plans[e.id] = tuple(PlannedStep.of(i, s, specs.get(s["name"])) for i, s in enumerate(e.steps))
    return p
