"""YAML files read within bounds: size, text, depth and expanded size checked before anything is built.

A routine file is input like any other. YAML aliases let a few hundred bytes
stand for billions of nodes (``&a [...]``, ``&b [*a, *a, ...]``, ...): PyYAML
builds them as shared objects, cheaply, but everything after that (the
validator, the JSON cache, a response body) walks the expanded tree. So before
PyYAML composes anything, one pass over the parser's event stream (iterative in
both the C and the pure-Python parser) counts the nodes the document expands
to, aliases included, and the nesting depth. Every failure is a
:class:`~engrain.RoutineError` with one issue naming the file and the line, the
same whichever parser PyYAML picks: the depth limit here is lower than
libyaml's own nesting limit and than what the pure-Python composer's recursion
allows, and a syntax error from libyaml in a file of up to ``REWORD_BYTES`` is
worded by the pure-Python parser (a larger one keeps libyaml's words: reading
it again in pure Python would cost more CPU than the file is worth).

What is built is JSON and nothing else, since everything downstream (templates,
the journal, the API) is JSON: a mapping that repeats a key is refused (PyYAML
would keep the last value silently, so a reviewer could read one ``args`` block
while another runs), and so is a value JSON cannot hold (``!!binary``,
``!!set``, ``!!omap``/``!!pairs``, ``.nan``/``.inf``, a key that is not a
string, and a bare date such as ``2024-01-01``, which YAML 1.1 makes a
``datetime.date``). Dates are refused rather than read as strings because
other YAML tools read that same text as a date: the error says to quote it.
Each refusal names the file and the line, and a non-JSON value its path.

Written the other way, :func:`dumper` emits a compiled ``routine.yaml`` whose text reads back as written.
"""

from __future__ import annotations

import functools
import math
import os
import re
from typing import Any

from .._errors import RoutineError
from .._events import MAX_DEPTH
from .model import RoutineIssue

#: Largest YAML file read, in bytes.
MAX_BYTES = 4 * 1024 * 1024
#: Most nodes a document may expand to, aliases expanded. A file of
#: ``MAX_BYTES`` without aliases holds at most ~2.1M nodes (``[1,1,...]``), so
#: only alias expansion reaches this.
MAX_NODES = 2_500_000
#: Most characters of scalars a document may expand to (one long string
#: repeated through aliases is a bomb of its own), again past what a file of
#: ``MAX_BYTES`` holds without aliases.
MAX_CHARS = 4 * MAX_BYTES
#: Largest text whose libyaml syntax error is worded again by the pure-Python parser (see ``load_yaml_text``).
REWORD_BYTES = 64 * 1024


class _TooDeep(Exception):
    """Raised by the pure-Python scanner at the ``MAX_DEPTH``-th open flow collection; carries its mark."""

    def __init__(self, mark: Any) -> None:
        super().__init__("too deep")
        self.mark = mark


@functools.cache
def pure_loader() -> Any:
    """PyYAML's pure-Python safe loader, its scanner stopped at ``MAX_DEPTH`` open flow collections.

    Why: in a flow collection every ``[``/``{`` may start a simple key, and
    the pure-Python scanner reads up to 1,024 characters ahead while one may,
    scanning its list of them on every token. ``[[[[...`` thus costs time
    quadratic in the lookahead (~0.5 s of CPU for one hostile line) before the
    parser's event reaches the depth check. Stopping the scanner itself keeps
    that list at most ``MAX_DEPTH`` long.
    """
    import yaml

    class BoundedSafeLoader(_json_only(), yaml.SafeLoader):  # type: ignore[misc, name-defined]
        def fetch_flow_collection_start(self, TokenClass: Any) -> None:
            if self.flow_level >= MAX_DEPTH:
                raise _TooDeep(self.get_mark())
            super().fetch_flow_collection_start(TokenClass)

    return _register(BoundedSafeLoader)


@functools.cache
def _loader() -> Any:
    import yaml

    base = getattr(yaml, "CSafeLoader", None)  # safe loaders only
    if base is None:
        return pure_loader()

    class JSONSafeLoader(_json_only(), base):  # type: ignore[misc, valid-type]
        pass

    return _register(JSONSafeLoader)


class _Duplicate(Exception):
    """A mapping repeats a key; raised while constructing, caught by :func:`load_yaml_text`."""

    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


class _NotJSON:
    """Stands in for a value JSON cannot hold until the whole document is built and its path can be named."""

    __slots__ = ("line", "what")

    def __init__(self, line: int, what: str) -> None:
        self.line, self.what = line, what


_TAG = "tag:yaml.org,2002:"
#: Tags whose values JSON has no form for, and what to write instead.
_REFUSED = {
    "binary": "!!binary data is not JSON; write it as a string (base64 text)",
    "set": "a !!set is not JSON; write a list",
    "omap": "an !!omap is not JSON; write a mapping or a list of mappings",
    "pairs": "!!pairs are not JSON; write a list of mappings",
}


@functools.cache
def _json_only() -> type:
    """A constructor mixin: duplicate keys raise :class:`_Duplicate`, non-JSON values become :class:`_NotJSON`."""
    import yaml

    class JSONOnly:
        def __init__(self, stream: Any) -> None:
            super().__init__(stream)  # type: ignore[call-arg]
            self.refused: list[_NotJSON] = []

        def _refuse(self, node: Any, what: str) -> _NotJSON:
            bad = _NotJSON(node.start_mark.line + 1, what)
            self.refused.append(bad)
            return bad

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                # Before merges are flattened: a key a ``<<`` merge brings in may be overridden, by YAML's design.
                seen: dict[Any, Any] = {}
                for key_node, _ in node.value:
                    if key_node.tag == _TAG + "merge":
                        continue
                    key = self.construct_object(key_node, deep=deep)  # type: ignore[attr-defined]
                    try:
                        first = seen.setdefault(key, key_node)
                    except TypeError:
                        continue  # unhashable: PyYAML's own error names it below
                    if first is not key_node:
                        raise _Duplicate(key, key_node.start_mark.line + 1, first.start_mark.line + 1)
            mapping = super().construct_mapping(node, deep=deep)  # type: ignore[misc]
            if all(type(k) is str for k in mapping):
                return mapping
            nodes = {self.construct_object(k): k for k, _ in node.value}  # type: ignore[attr-defined]

            def refused(key: Any) -> Any:
                text = nodes[key].value
                return self._refuse(nodes[key], f"key {text} is not a string (JSON keys are strings); quote it: '{text}'")

            return {k if type(k) is str or isinstance(k, _NotJSON) else refused(k): v for k, v in mapping.items()}

        def construct_yaml_float(self, node: Any) -> Any:
            value = super().construct_yaml_float(node)  # type: ignore[misc]
            return value if math.isfinite(value) else self._refuse(node, f"{node.value} is not a JSON number")

        def construct_yaml_timestamp(self, node: Any) -> Any:
            return self._refuse(node, f"{node.value} is a date, and JSON has no dates; quote it: '{node.value}'")

        def construct_refused(self, node: Any) -> Any:
            return self._refuse(node, _REFUSED[node.tag.removeprefix(_TAG)])

    return JSONOnly


def _register(cls: Any) -> Any:
    """``cls`` with the JSON-only constructors in its own table (PyYAML's tables hold functions, not method names)."""
    cls.add_constructor(_TAG + "float", cls.construct_yaml_float)
    cls.add_constructor(_TAG + "timestamp", cls.construct_yaml_timestamp)
    for tag in _REFUSED:
        cls.add_constructor(_TAG + tag, cls.construct_refused)
    return cls


def _path(parent: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if isinstance(key, str) and key.isidentifier():
        return f"{parent}.{key}" if parent else key
    return f"{parent}[{key!r}]"


def _not_json_issues(data: Any, file: str) -> list[RoutineIssue]:
    """One issue per refused value, with its path; walked only when something was refused."""
    found: dict[int, tuple[int, RoutineIssue]] = {}

    def note(bad: _NotJSON, at: str) -> None:
        found.setdefault(id(bad), (bad.line, RoutineIssue(file, None, at or "(top)", f"line {bad.line}: {bad.what}")))

    seen: set[int] = set()
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        value, at = stack.pop()
        if isinstance(value, _NotJSON):
            note(value, at)
        elif isinstance(value, (dict, list)) and id(value) not in seen:
            seen.add(id(value))  # an alias shares the object: one visit names it
            # Reversed onto the stack, so a value reached twice is named by its first path in the file.
            for k, v in reversed(list(value.items() if isinstance(value, dict) else enumerate(value))):
                if isinstance(k, _NotJSON):
                    note(k, at)
                stack.append((v, at if isinstance(k, _NotJSON) else _path(at, k)))
    return [issue for _, issue in sorted(found.values(), key=lambda f: f[0])]


def _construct(text: str, loader: Any, file: str) -> Any:
    ld = loader(text)
    try:
        data = ld.get_single_data()
        refused = ld.refused
    finally:
        ld.dispose()
    if refused:
        raise RoutineError(file, _not_json_issues(data, file))
    return data


def _issue(file: str, where: str, message: str, shown: str | None = None) -> RoutineError:
    return RoutineError(shown or file, [RoutineIssue(file, None, where, message)])


def _line(event: Any) -> str:
    mark = getattr(event, "start_mark", None)
    return f"line {mark.line + 1}" if mark is not None else "yaml"


def check_bounds(text: str, file: str, loader: Any = None) -> None:
    """Raise :class:`~engrain.RoutineError` if ``text`` nests deeper than ``MAX_DEPTH`` or expands past ``MAX_NODES``/``MAX_CHARS``.

    Walks parser events only, keeping one count per anchor, so a document is
    measured in time linear in its text whatever it expands to. An alias to a
    node still open (a recursive structure) is refused too.
    """
    import yaml

    depth = 0
    nodes = chars = 0
    sizes: dict[str, tuple[int, int]] = {}
    open_: list[tuple[str | None, int, int]] = []
    events = yaml.parse(text, Loader=loader or _loader())
    while True:
        try:
            ev = next(events)
        except StopIteration:
            return
        except _TooDeep as e:
            raise _issue(file, f"line {e.mark.line + 1}", f"nested deeper than {MAX_DEPTH} levels") from None
        if isinstance(ev, yaml.AliasEvent):
            size = sizes.get(ev.anchor)  # type: ignore[arg-type]
            if size is None:
                if any(a == ev.anchor for a, _, _ in open_):
                    raise _issue(file, _line(ev), f"alias *{ev.anchor} refers to a node that contains it (recursive data is not allowed)")
                raise _issue(file, _line(ev), f"alias *{ev.anchor} refers to no anchor before it")
            nodes += size[0]
            chars += size[1]
        elif isinstance(ev, yaml.ScalarEvent):
            nodes += 1
            chars += len(ev.value)
            if ev.anchor is not None:
                sizes[ev.anchor] = (1, len(ev.value))
        elif isinstance(ev, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise _issue(file, _line(ev), f"nested deeper than {MAX_DEPTH} levels")
            if ev.anchor is not None:
                sizes.pop(ev.anchor, None)  # redefined: the old one no longer answers inside
            open_.append((ev.anchor, nodes, chars))
            nodes += 1
        elif isinstance(ev, yaml.CollectionEndEvent):
            depth -= 1
            anchor, n0, c0 = open_.pop()
            if anchor is not None:
                sizes[anchor] = (nodes - n0, chars - c0)
        if nodes > MAX_NODES or chars > MAX_CHARS:
            what = f"{MAX_NODES:,} nodes" if nodes > MAX_NODES else f"{MAX_CHARS:,} characters of text"
            raise _issue(file, _line(ev), f"expands to more than {what} (through aliases); refused")


def load_yaml_text(text: str, file: str) -> Any:
    """The data of YAML ``text`` (JSON types only, no key repeated), bounded as :func:`check_bounds` says.

    ``file`` names the file in errors. Syntax errors, a repeated key and a
    value JSON cannot hold become a :class:`~engrain.RoutineError` naming the
    line (and the value's path).
    """
    import yaml

    if len(text) > MAX_BYTES:
        raise _issue(file, "file", f"larger than the {MAX_BYTES:,} bytes a YAML file may hold")
    loader = _loader()
    try:
        try:
            check_bounds(text, file, loader)
            return _construct(text, loader, file)
        except yaml.YAMLError as e:
            if loader is pure_loader() or isinstance(e, yaml.constructor.ConstructorError):
                raise  # a constructor's error (a tag, a key) is Python's whichever parser read the text
            if "nesting depth" in str(getattr(e, "problem", "")):
                # libyaml's own limit (1000 levels) is far past MAX_DEPTH: say so without re-parsing.
                mark = getattr(e, "problem_mark", None)
                where = f"line {mark.line + 1}" if mark is not None else "yaml"
                raise _issue(file, where, f"nested deeper than {MAX_DEPTH} levels") from None
            if len(text) > REWORD_BYTES:
                raise
        # libyaml words its errors its own way and stops at a nesting limit of
        # its own (deeper than MAX_DEPTH, so always a depth error here): the
        # pure-Python parser, bounded the same way, says what is wrong, so the
        # message is the same whichever parser PyYAML was built with. Only for a
        # text it reads fast: it is ~50x slower than libyaml, and a large file
        # whose last line is wrong would cost a minute of CPU.
        check_bounds(text, file, pure_loader())
        return _construct(text, pure_loader(), file)
    except _Duplicate as e:
        raise _issue(file, f"line {e.line}", f"duplicate key {e.key!r} (first at line {e.first}): "
                     "YAML would keep only the last value; write each key once") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "yaml"
        raise _issue(file, where, f"invalid YAML: {getattr(e, 'problem', None) or e}") from None
    except RecursionError:  # not reached within MAX_DEPTH; kept so no parser can turn depth into a crash
        raise _issue(file, "yaml", f"nested deeper than {MAX_DEPTH} levels") from None


def read_yaml_text(path: str | os.PathLike[str], file: str) -> str:
    """The text of the YAML file at ``path``: at most ``MAX_BYTES`` of UTF-8 (a BOM dropped).

    Raises :class:`~engrain.RoutineError` naming ``file`` otherwise (``FileNotFoundError``
    passes through). The size is checked before reading.
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_BYTES:
            raise _issue(file, "file", f"{size:,} bytes, larger than the {MAX_BYTES:,} a YAML file may hold")
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise _issue(file, "file", f"larger than the {MAX_BYTES:,} bytes a YAML file may hold")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise _issue(file, f"line {line}", f"not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); save the file as UTF-8") from None
    return text.removeprefix("\ufeff")


# YAML reads NEL, LS and PS as line breaks (folded to a space in quoted and plain scalars);
# PyYAML's emitter with allow_unicode writes them raw. Double quotes escape them (and every
# control, BOM or surrogate) as \N, \L, \P, \x.., \u.... Matched on keys too.
_UNSAFE_TEXT = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff]")


def dumper() -> Any:
    """A SafeDumper writing every string holding such a character double-quoted."""
    import yaml

    class _Dumper(yaml.SafeDumper):  # type: ignore[misc, name-defined]
        pass

    def text(dumper: Any, data: str) -> Any:
        style = '"' if _UNSAFE_TEXT.search(data) else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    _Dumper.add_representer(str, text)
    return _Dumper
