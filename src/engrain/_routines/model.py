"""Routine packages: the model, the loader and the validator.

A routine package is a folder holding ``routine.yaml`` (``name, description,
version, trusted, inputs, output, tools, steps``) and, when it calls UDFs,
``udfs.py``. em-core's own package format (``input_schema``, ``check:``, a
``prompt:`` mapping, ``udf.py``, ``schemas/``) is converted on load by
:mod:`.emcore`; the loaded :class:`Routine` lists the conversions.
:func:`validate_routine` reports every problem with its file, step
id and field; it parses ``udfs.py`` with :mod:`ast` and never runs it.
:func:`load_routine` returns a :class:`Routine` (cached by path and mtimes) or
raises :class:`~engrain.RoutineError` listing the problems.

Each step's result is bound in the scope under its ``id`` and, when given, its
``save_as``; templates (``{{ step1.rows[0].dept }}``) and expressions
(``when``, ``assert``) read that scope, plus ``inputs``.
"""

from __future__ import annotations

import ast
import os
import pathlib
import threading
from dataclasses import dataclass, field
from typing import Any

from .._errors import JSONTooDeepError, RoutineError
from .._events import MAX_DEPTH, check_depth

ROUTINE_FILE = "routine.yaml"
UDFS_FILE = "udfs.py"

STEP_TYPES = ("tool.call", "udf.call", "assert", "prompt.user", "return")
FIELD_TYPES = ("text", "number", "boolean", "select")
_TOP_KEYS = {"name", "description", "version", "trusted", "inputs", "output", "tools", "steps"}
_COMMON_KEYS = {"id", "type", "when", "save_as", "description"}
_STEP_KEYS = {
    "tool.call": {"tool", "args"},
    "udf.call": {"function", "args"},
    "assert": {"expr", "message"},
    "prompt.user": {"prompt", "fields"},
    "return": {"value"},
}
_REQUIRED = {
    "tool.call": ("tool",),
    "udf.call": ("function",),
    "assert": ("expr",),
    "prompt.user": ("prompt", "fields"),
    "return": ("value",),
}
_FIELD_KEYS = {"name", "type", "options", "default", "label", "required"}
_TOOL_KEYS = {"args", "result", "description"}


@dataclass(frozen=True, slots=True)
class RoutineIssue:
    """One problem in a routine package: where (file, step id, field) and what."""

    file: str
    step: str | None
    field: str
    message: str

    def __str__(self) -> str:
        step = f" step {self.step!r}" if self.step else ""
        return f"{self.file}:{step} {self.field}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "step": self.step, "field": self.field, "message": self.message}


@dataclass(slots=True)
class Step:
    """One step of a routine, as written in ``routine.yaml`` (``spec``) plus parsed parts."""

    id: str
    type: str
    spec: dict[str, Any]
    when: str | None = None
    save_as: str | None = None
    when_expr: Any = None  # compiled _expr.Expr, set by the loader
    assert_expr: Any = None
    dynamic: bool = True  # False when the step's templated value has no placeholders


@dataclass(slots=True)
class UdfInfo:
    """What :mod:`ast` tells about a function of ``udfs.py`` (without running it)."""

    name: str
    params: list[str]
    required: list[str]
    var_kwargs: bool
    var_args: bool
    line: int


@dataclass(slots=True)
class Routine:
    """A loaded, validated routine package."""

    path: pathlib.Path
    name: str
    description: str
    version: str
    trusted: bool
    inputs: dict[str, Any]
    output: dict[str, Any] | None
    tools: dict[str, dict[str, Any]]
    steps: list[Step]
    udfs: dict[str, UdfInfo] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    _validators: dict[str, Any] = field(default_factory=dict)
    udf_module: Any = None  # udfs.py once imported (trusted runs); a new file version is a new Routine
    sandbox_host: Any = None  # the SandboxUdfHost of untrusted runs
    dialect: str = "engrain"  # or "em-core": converted on load, see conversions
    conversions: list[str] = field(default_factory=list)
    bare_inputs: bool = False  # em-core: inputs are read by bare name ({{ url }})
    udf_file: str = UDFS_FILE

    @property
    def udfs_path(self) -> pathlib.Path:
        return self.path / self.udf_file

    def validator(self, key: str, schema: dict[str, Any]) -> Any:
        """A compiled check of ``schema`` (``value -> (path, message) | None``), built once per key."""
        v = self._validators.get(key)
        if v is None:
            from .schema import compile_schema

            v = self._validators[key] = compile_schema(schema)
        return v


def _safe_file(root: pathlib.Path, name: str) -> pathlib.Path:
    """``root/name``, refusing a file whose real path (symlinks resolved) leaves ``root``."""
    p = root / name
    real = p.resolve()
    if real.parent != root.resolve():
        raise RoutineError(str(root), [RoutineIssue(name, None, "file", f"resolves outside the routine folder: {real}")])
    return p


def parse_udfs(source: str) -> dict[str, UdfInfo]:
    """Top-level functions of ``udfs.py`` source, found with :mod:`ast` (never executed)."""
    out: dict[str, UdfInfo] = {}
    for node in ast.parse(source, UDFS_FILE).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            a = node.args
            pos = [p.arg for p in a.posonlyargs + a.args]
            kwonly = [p.arg for p in a.kwonlyargs]
            n_default = len(a.defaults)
            required = pos[: len(pos) - n_default] + [p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
            out[node.name] = UdfInfo(node.name, pos + kwonly, required, a.kwarg is not None, a.vararg is not None, node.lineno)
    return out


@dataclass(slots=True)
class _Package:
    """What the loader found besides routine.yaml: the UDF file, and em-core conversions."""

    udf_file: str = UDFS_FILE
    dialect: str = "engrain"
    conversions: list[str] = field(default_factory=list)
    bare: set[str] = field(default_factory=set)  # em-core inputs readable by bare name
    open_inputs: bool = False  # em-core without declared inputs: unknown names are read as inputs


class _Checker:
    """Collects issues while walking ``routine.yaml``."""

    def __init__(self, tools: Any, udfs: dict[str, UdfInfo] | None, udf_problem: str | None, pkg: _Package | None = None):
        self.issues: list[RoutineIssue] = []
        self.tools = tools
        self.udfs = udfs
        self.udf_problem = udf_problem
        self.pkg = pkg or _Package()

    def _undefined(self, names: set[str]) -> list[str]:
        if self.pkg.open_inputs:
            return []
        return sorted(names)

    def add(self, step: str | None, field: str, message: str, file: str = ROUTINE_FILE) -> None:
        self.issues.append(RoutineIssue(file, step, field, message))

    def schema(self, value: Any, where: str, step: str | None = None) -> None:
        if not isinstance(value, dict):
            self.add(step, where, f"must be a JSON schema object, got {type(value).__name__}")
            return
        from .schema import schema_problem

        problem = schema_problem(value)
        if problem:
            self.add(step, where, f"invalid JSON schema: {problem}")

    def template(self, value: Any, step: str, where: str, scope: set[str]) -> None:
        from .._errors import EngrainError
        from . import template as _template

        try:
            names = _template.variables(value)
        except EngrainError as e:
            self.add(step, where, f"bad template: {e}")
            return
        for n in self._undefined(names - scope):
            self.add(step, where, f"undefined template variable {n!r} (defined: {', '.join(sorted(scope))})")

    def expression(self, text: Any, step: str, where: str, scope: set[str]) -> Any:
        from .._errors import EngrainError
        from . import expr as _expr

        if not isinstance(text, str) or not text.strip():
            self.add(step, where, "must be a non-empty expression string")
            return None
        try:
            expr = _expr.compile_expr(text)
        except EngrainError as e:
            self.add(step, where, f"bad expression: {e}")
            return None
        builtins = set(getattr(_expr, "FUNCTIONS", ()) or getattr(_expr, "BUILTINS", ()))
        for n in self._undefined(set(expr.names) - scope - set(expr.calls)):
            self.add(step, where, f"undefined name {n!r} (defined: {', '.join(sorted(scope))})")
        for c in sorted(set(expr.calls) - builtins):
            if self.udfs is None or c not in self.udfs:
                self.add(step, where, f"unknown function {c!r} (not a builtin and not defined in {self.pkg.udf_file})")
        return expr


def _check(
    data: Any, tools: Any, udfs: dict[str, UdfInfo] | None, udf_problem: str | None, pkg: _Package | None = None
) -> tuple[list[RoutineIssue], list[Step]]:
    c = _Checker(tools, udfs, udf_problem, pkg)
    steps: list[Step] = []
    if not isinstance(data, dict):
        c.add(None, "(top)", f"must be a mapping, got {type(data).__name__}")
        return c.issues, steps
    for k in sorted(set(data) - _TOP_KEYS, key=str):
        c.add(None, str(k), f"unknown key (allowed: {', '.join(sorted(_TOP_KEYS))})")
    if not isinstance(data.get("name"), str) or not data.get("name"):
        c.add(None, "name", "required: a non-empty string")
    for k in ("description", "version"):
        if k in data and not isinstance(data[k], (str, int, float)):
            c.add(None, k, "must be a string")
    if "trusted" in data and not isinstance(data["trusted"], bool):
        c.add(None, "trusted", "must be true or false")
    if "inputs" not in data:
        c.add(None, "inputs", "required: a JSON schema of the routine's inputs")
    else:
        c.schema(data["inputs"], "inputs")
    if data.get("output") is not None:
        c.schema(data["output"], "output")
    tools_decl = data.get("tools") or {}
    if not isinstance(tools_decl, dict):
        c.add(None, "tools", "must be a mapping of tool name to {args, result} schemas")
        tools_decl = {}
    for tname, decl in tools_decl.items():
        if decl is None:
            continue
        if not isinstance(decl, dict):
            c.add(None, f"tools.{tname}", "must be a mapping with optional args/result schemas")
            continue
        for k in sorted(set(decl) - _TOOL_KEYS, key=str):
            c.add(None, f"tools.{tname}.{k}", "unknown key (allowed: args, result, description)")
        for k in ("args", "result"):
            if k in decl:
                c.schema(decl[k], f"tools.{tname}.{k}")
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        c.add(None, "steps", "required: a non-empty list of steps")
        return c.issues, steps
    scope = {"inputs"} | c.pkg.bare
    seen: set[str] = set()
    has_return = False
    for i, s in enumerate(raw_steps):
        if not isinstance(s, dict):
            c.add(f"#{i}", "(step)", f"must be a mapping, got {type(s).__name__}")
            continue
        sid = s.get("id")
        label = sid if isinstance(sid, str) and sid else f"#{i}"
        if not isinstance(sid, str) or not sid.isidentifier():
            c.add(label, "id", "required: an identifier (letters, digits, '_')")
        elif sid in seen:
            c.add(label, "id", "duplicate step id")
        elif sid == "inputs":
            c.add(label, "id", "'inputs' is reserved")
        seen.add(label)
        stype = s.get("type")
        if stype not in STEP_TYPES:
            c.add(label, "type", f"must be one of {', '.join(STEP_TYPES)}, got {stype!r}")
            continue
        for k in sorted(set(s) - _COMMON_KEYS - _STEP_KEYS[stype], key=str):
            c.add(label, str(k), f"unknown key for a {stype} step (allowed: {', '.join(sorted(_COMMON_KEYS | _STEP_KEYS[stype]))})")
        for k in _REQUIRED[stype]:
            if k not in s:
                c.add(label, k, f"required for a {stype} step")
        save_as = s.get("save_as")
        if save_as is not None and (not isinstance(save_as, str) or not save_as.isidentifier()):
            c.add(label, "save_as", "must be an identifier")
            save_as = None
        step = Step(label, stype, s, s.get("when"), save_as)
        if "when" in s:
            step.when_expr = c.expression(s["when"], label, "when", scope)
        _check_step(c, step, s, scope, tools_decl)
        if stype == "return":
            has_return = True
        steps.append(step)
        scope.add(label)
        if save_as:
            scope.add(save_as)
    if not has_return:
        c.add(None, "steps", "missing a return step (type: return)")
    elif not any(st.type == "return" and "when" not in st.spec for st in steps):
        c.add(None, "steps", "every return step has a 'when': the routine may end without output")
    return c.issues, steps


def _check_step(c: _Checker, step: Step, s: dict[str, Any], scope: set[str], tools_decl: dict[str, Any]) -> None:
    sid, stype = step.id, step.type
    if stype == "tool.call":
        tool = s.get("tool")
        if not isinstance(tool, str) or not tool:
            c.add(sid, "tool", "must be a tool name")
        elif c.tools is not None and tool not in c.tools:
            c.add(sid, "tool", f"no tool named {tool!r} in the registry (registered: {', '.join(c.tools.names()) or 'none'})")
        _args(c, s, sid, scope)
    elif stype == "udf.call":
        fn = s.get("function")
        if not isinstance(fn, str) or not fn:
            c.add(sid, "function", "must be a function name")
        elif c.udf_problem:
            c.add(sid, "function", c.udf_problem)
        elif c.udfs is not None and fn not in c.udfs:
            c.add(sid, "function", f"{c.pkg.udf_file} defines no function {fn!r} (defined: {', '.join(sorted(c.udfs)) or 'none'})")
        elif c.udfs is not None and isinstance(s.get("args", {}), dict):
            info = c.udfs[fn]
            given = set(s.get("args") or {})
            for miss in sorted(set(info.required) - given):
                c.add(sid, f"args.{miss}", f"{fn}() at {c.pkg.udf_file}:{info.line} requires argument {miss!r}")
            if not info.var_kwargs:
                for extra in sorted(given - set(info.params)):
                    c.add(sid, f"args.{extra}", f"{fn}() at {c.pkg.udf_file}:{info.line} takes no argument {extra!r}")
        _args(c, s, sid, scope)
    elif stype == "assert":
        step.assert_expr = c.expression(s.get("expr"), sid, "expr", scope) if "expr" in s else None
        if "message" in s and not isinstance(s["message"], str):
            c.add(sid, "message", "must be a string")
        elif "message" in s:
            c.template(s["message"], sid, "message", scope)
    elif stype == "prompt.user":
        if "prompt" in s:
            if not isinstance(s["prompt"], str):
                c.add(sid, "prompt", "must be a string")
            else:
                c.template(s["prompt"], sid, "prompt", scope)
        fields = s.get("fields")
        if "fields" in s and (not isinstance(fields, list) or not fields):
            c.add(sid, "fields", "must be a non-empty list of {name, type} fields")
        elif isinstance(fields, list):
            _fields(c, sid, fields, scope)
    elif stype == "return":
        c.template(s.get("value"), sid, "value", scope)


def _args(c: _Checker, s: dict[str, Any], sid: str, scope: set[str]) -> None:
    args = s.get("args", {})
    if not isinstance(args, dict):
        c.add(sid, "args", "must be a mapping of argument name to value")
        return
    c.template(args, sid, "args", scope)


def _fields(c: _Checker, sid: str, fields: list[Any], scope: set[str]) -> None:
    names: set[str] = set()
    for j, f in enumerate(fields):
        where = f"fields[{j}]"
        if not isinstance(f, dict):
            c.add(sid, where, "must be a mapping with name and type")
            continue
        name = f.get("name")
        if not isinstance(name, str) or not name:
            c.add(sid, f"{where}.name", "required: a non-empty string")
        elif name in names:
            c.add(sid, f"{where}.name", f"duplicate field name {name!r}")
        else:
            names.add(name)
            where = f"fields.{name}"
        for k in sorted(set(f) - _FIELD_KEYS, key=str):
            c.add(sid, f"{where}.{k}", f"unknown key (allowed: {', '.join(sorted(_FIELD_KEYS))})")
        ftype = f.get("type", "text")
        if ftype not in FIELD_TYPES:
            c.add(sid, f"{where}.type", f"must be one of {', '.join(FIELD_TYPES)}, got {ftype!r}")
        if ftype == "select":
            opts = f.get("options")
            if not isinstance(opts, list) or not opts:
                c.add(sid, f"{where}.options", "a select field needs a non-empty options list")
            elif "default" in f and f["default"] not in opts:
                c.add(sid, f"{where}.default", f"{f['default']!r} is not one of the options")
        elif "options" in f:
            c.add(sid, f"{where}.options", f"options only apply to select fields, not {ftype}")
        if "default" in f and ftype in FIELD_TYPES:
            from .template import variables

            if not variables(f["default"]):
                ok = {"text": isinstance(f["default"], str), "number": isinstance(f["default"], (int, float)) and not isinstance(f["default"], bool), "boolean": isinstance(f["default"], bool), "select": True}[ftype]
                if not ok:
                    c.add(sid, f"{where}.default", f"default {f['default']!r} is not a {ftype}")
            else:
                c.template(f["default"], sid, f"{where}.default", scope)


def _read(root: pathlib.Path) -> tuple[Any, str | None, list[RoutineIssue], _Package]:
    """routine.yaml data (em-core's format converted) and the UDF source; issues for unreadable files."""
    import yaml

    from . import emcore

    pkg = _Package()
    if not root.is_dir():
        why = "not a routine folder (no such folder)" if not root.exists() else "not a routine folder (not a folder)"
        raise RoutineError(str(root), [RoutineIssue(str(root), None, "path", why)])
    path = _safe_file(root, ROUTINE_FILE)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, None, [RoutineIssue(ROUTINE_FILE, None, "file", "missing")], pkg
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # safe loader only
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "yaml"
        return None, None, [RoutineIssue(ROUTINE_FILE, None, where, f"invalid YAML: {getattr(e, 'problem', e)}")], pkg
    except RecursionError:
        return None, None, [RoutineIssue(ROUTINE_FILE, None, "yaml", f"nested deeper than {MAX_DEPTH} levels")], pkg
    try:
        check_depth(data, ROUTINE_FILE, "routine", MAX_DEPTH)
    except JSONTooDeepError as e:
        return None, None, [RoutineIssue(ROUTINE_FILE, None, e.path.removeprefix("routine."), f"nested deeper than {MAX_DEPTH} levels")], pkg
    issues: list[RoutineIssue] = []
    has_udfs, has_udf = (root / UDFS_FILE).exists(), (root / emcore.UDF_FILE).exists()
    if has_udfs and has_udf:
        issues.append(RoutineIssue(emcore.UDF_FILE, None, "file", f"both {UDFS_FILE} and {emcore.UDF_FILE} exist: keep one"))
    elif has_udf:
        pkg.udf_file = emcore.UDF_FILE
    if emcore.is_emcore(data, root):
        data, pkg.conversions, problems = emcore.convert(data, root)
        pkg.dialect = "em-core"
        pkg.bare = emcore.input_names(data)
        pkg.open_inputs = not pkg.bare and not (data.get("inputs") or {}).get("properties")
        issues += [RoutineIssue(f, None, "file", m) for f, m in problems]
    udfs = _safe_file(root, pkg.udf_file)
    source = udfs.read_text(encoding="utf-8") if udfs.exists() else None
    return data, source, issues, pkg


def _analyse(
    root: pathlib.Path, tools: Any
) -> tuple[Any, dict[str, UdfInfo] | None, list[RoutineIssue], list[Step], _Package]:
    data, source, issues, pkg = _read(root)
    if data is None:
        return data, None, issues, [], pkg
    udfs: dict[str, UdfInfo] | None = None
    problem = None
    if source is not None:
        try:
            udfs = parse_udfs(source)
        except SyntaxError as e:
            issues.append(RoutineIssue(pkg.udf_file, None, f"line {e.lineno}", f"syntax error: {e.msg}"))
            problem = f"{pkg.udf_file} has a syntax error"
    else:
        udfs = {}
        problem = None
    found, steps = _check(data, tools, udfs, problem, pkg)
    if source is None:
        found = [
            RoutineIssue(i.file, i.step, i.field, i.message.replace(f"{UDFS_FILE} defines no function", f"{UDFS_FILE} is missing; no function"))
            for i in found
        ]
    return data, udfs, issues + found, steps, pkg


def validate_routine(path: str | os.PathLike[str], tools: Any = None) -> list[RoutineIssue]:
    """Every problem of the routine package at ``path`` (empty when valid).

    With ``tools`` (a :class:`~engrain.ToolRegistry`), tool names must be registered.
    ``udfs.py`` is parsed, never imported or executed.
    """
    root = pathlib.Path(path)
    try:
        return _analyse(root, tools)[2]
    except RoutineError as e:
        return list(e.issues)


_cache: dict[str, tuple[tuple[float, ...], Routine]] = {}
_cache_lock = threading.Lock()


def _mtimes(root: pathlib.Path) -> tuple[float, ...]:
    out = []
    for name in (ROUTINE_FILE, UDFS_FILE, "udf.py", "schemas/input.schema.json", "schemas/output.schema.json"):
        try:
            st = os.stat(root / name)
            out.append(st.st_mtime_ns + st.st_size * 1e-3)
        except FileNotFoundError:
            out.append(-1.0)
    return tuple(out)


def load_routine(path: str | os.PathLike[str]) -> Routine:
    """The routine package at ``path``; :class:`~engrain.RoutineError` listing every problem.

    Parsed packages are cached by absolute path and the mtimes of their files.
    """
    root = pathlib.Path(path).absolute()
    key = str(root)
    stamp = _mtimes(root)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    data, udfs, issues, steps, pkg = _analyse(root, None)
    if issues:
        raise RoutineError(key, issues)
    from . import template as _template

    for st in steps:
        value = st.spec.get("args", {}) if st.type in ("tool.call", "udf.call") else st.spec.get("value")
        if st.type in ("tool.call", "udf.call", "return"):
            st.dynamic = bool(_template.variables(value))
    r = Routine(
        path=root,
        name=data["name"],
        description=str(data.get("description", "")),
        version=str(data.get("version", "")),
        trusted=bool(data.get("trusted", False)),
        inputs=data["inputs"],
        output=data.get("output"),
        tools={k: (v or {}) for k, v in (data.get("tools") or {}).items()},
        steps=steps,
        udfs=udfs or {},
        raw=data,
        dialect=pkg.dialect,
        conversions=pkg.conversions,
        bare_inputs=pkg.dialect == "em-core",
        udf_file=pkg.udf_file,
    )
    with _cache_lock:
        _cache[key] = (stamp, r)
    return r
