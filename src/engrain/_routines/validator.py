"""Checks of a parsed ``routine.yaml``: every problem with its file, step id and field.

:func:`check_routine_data` walks the YAML data (em-core's format already
converted) against the tool registry and the functions :mod:`ast` found in
``udfs.py``, and returns the issues and the parsed :class:`~.model.Step` list.
It never runs anything: templates and expressions are only parsed.
"""

from __future__ import annotations

from typing import Any

from .model import (
    _COMMON_KEYS,
    _FIELD_KEYS,
    _REQUIRED,
    _STEP_KEYS,
    _TOOL_KEYS,
    _TOP_KEYS,
    FIELD_TYPES,
    ROUTINE_FILE,
    STEP_TYPES,
    Package,
    RoutineIssue,
    Step,
    UdfInfo,
)


class _Checker:
    """Collects issues while walking ``routine.yaml``."""

    def __init__(self, tools: Any, udfs: dict[str, UdfInfo] | None, udf_problem: str | None, pkg: Package | None = None):
        self.issues: list[RoutineIssue] = []
        self.tools = tools
        self.udfs = udfs
        self.udf_problem = udf_problem
        self.pkg = pkg or Package()

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


def check_routine_data(
    data: Any, tools: Any, udfs: dict[str, UdfInfo] | None, udf_problem: str | None, pkg: Package | None = None
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

