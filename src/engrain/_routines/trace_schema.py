"""JSON Schemas of the traces the compiler reads, and :func:`validate_trace`.

Two formats: our own export (``engrain.trace/1``: ``{format, run, events[{kind,
name, data}]}``) and em-core's (``{version, app, mission, events[{type: tool_call |
udf_call | approval, ...}], final_output}``). A trace is checked here, before the
compiler walks it, so a malformed one is a :class:`~engrain.TraceError` naming the
event index and field rather than an AttributeError deep in the compiler, or worse a
routine that compiled with a call silently missing (a ``step.started`` without its
``call_id`` used to be dropped and its result baked in as a constant).
"""

from __future__ import annotations

from typing import Any

from .._errors import JSONTooDeepError, TraceError
from .._events import KINDS, MAX_DEPTH, check_depth

TRACE_FORMAT = "engrain.trace/1"

_CALL_ID = {"type": "integer", "minimum": 0}
_OBJECT = {"type": "object"}
_FIELDS = {
    "type": "array",
    "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string", "minLength": 1}}},
}


def _data(required: list[str], **props: Any) -> dict[str, Any]:
    return {"properties": {"data": {"type": "object", "required": required, "properties": props}}}


def _when(kind: str, then: dict[str, Any]) -> dict[str, Any]:
    return {"if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]}, "then": then}


ENGRAIN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["events"],
    "properties": {
        "format": {"const": TRACE_FORMAT},
        "run": {"type": "object", "properties": {"run_id": {"type": "string"}, "task": {"type": "string"}}},
        "events": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["kind"],
                "properties": {
                    "kind": {"enum": sorted(KINDS)},
                    "name": {"type": "string"},
                    "seq": {"type": "integer", "minimum": 0},
                    "data": _OBJECT,
                },
                "allOf": [
                    _when("run.started", _data([], task={"type": "string"},
                                               tags={"type": "array", "items": {"type": "string"}})),
                    _when("step.started", {"required": ["name", "data"], "properties": {"name": {"minLength": 1}},
                                           **_data(["call_id"], call_id=_CALL_ID, type={"type": "string"},
                                                   args=_OBJECT)}),
                    # A completion-only step (the default) carries its arguments in its outcome.
                    _when("step.completed", {"required": ["data"], **_data(["call_id"], call_id=_CALL_ID, args=_OBJECT)}),
                    _when("step.failed", {"required": ["data"], **_data(["call_id"], call_id=_CALL_ID, args=_OBJECT)}),
                    _when("input.requested", {"required": ["data"], **_data(["call_id"], call_id=_CALL_ID,
                                                                           prompt={"type": "string"}, fields=_FIELDS)}),
                    _when("input.received", {"required": ["data"], **_data(["call_id"], call_id=_CALL_ID,
                                                                          answers=_OBJECT)}),
                ],
            },
        },
    },
}

EMCORE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["events"],
    "properties": {
        "version": {"type": ["string", "integer"]},
        "app": {"type": "object", "properties": {"name": {"type": "string"}, "version": {"type": ["string", "integer"]}}},
        "mission": {"type": "object", "properties": {"goal": {"type": "string"}}},
        "events": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type"],
                "properties": {
                    "type": {"enum": ["tool_call", "udf_call", "approval"]},
                    "seq": {"type": "integer"},
                    "args": _OBJECT,
                    "prompt": {"type": "string"},
                },
                "allOf": [
                    {"if": {"properties": {"type": {"const": "tool_call"}}},
                     "then": {"required": ["tool"], "properties": {"tool": {"type": "string", "minLength": 1}}}},
                    {"if": {"properties": {"type": {"const": "udf_call"}}},
                     "then": {"required": ["function"], "properties": {"function": {"type": "string", "minLength": 1}}}},
                ],
            },
        },
    },
}

_validators: dict[str, Any] = {}


def _validator(name: str) -> Any:
    v = _validators.get(name)
    if v is None:
        from jsonschema import Draft202012Validator

        schema = ENGRAIN_SCHEMA if name == "engrain" else EMCORE_SCHEMA
        v = _validators[name] = Draft202012Validator(schema)
    return v


def trace_format(data: dict[str, Any]) -> str:
    """``"engrain"`` or ``"emcore"``: which of the two formats ``data`` claims to be."""
    if data.get("format") == TRACE_FORMAT:
        return "engrain"
    if any(k in data for k in ("mission", "app", "version")):
        return "emcore"
    events = data.get("events")
    if isinstance(events, list) and events and isinstance(events[0], dict) and "kind" in events[0]:
        return "engrain"
    if "events" in data:
        return "engrain"
    raise TraceError("", "(root)", "unknown trace format: expected engrain.trace/1 {format, run, events} "
                                   "or em-core {version, app, mission, events}")


def _path(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(root)"


def validate_trace(data: Any, source: str = "trace") -> str:
    """Check ``data`` against its format's schema; return the format, or raise :class:`~engrain.TraceError`."""
    if not isinstance(data, dict):
        raise TraceError(source, "(root)", f"a trace must be a JSON object, got {type(data).__name__}")
    try:
        check_depth(data, source, "", MAX_DEPTH)
    except JSONTooDeepError as e:
        raise TraceError(source, e.path.lstrip("."), f"nested deeper than {MAX_DEPTH} levels") from None
    try:
        fmt = trace_format(data)
    except TraceError as e:
        raise TraceError(source, e.field, str(e).split(": ", 2)[-1]) from None
    errors = sorted(_validator(fmt).iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)), e.validator))
    if errors:
        # The deepest error of the first failing location names the field most precisely.
        first = errors[0]
        same = [e for e in errors if list(e.absolute_path)[:len(first.absolute_path)] == list(first.absolute_path)]
        err = max(same, key=lambda e: len(e.absolute_path))
        where = _path(err.absolute_path)
        if err.validator == "required":
            missing = err.message.split("'")[1] if "'" in err.message else ""
            where = f"{where}.{missing}" if where != "(root)" and missing else (missing or where)
            raise TraceError(source, where, "required")
        value = err.instance
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:60] + "…"
        raise TraceError(source, where, f"{shown} is not valid: {_expected(err)}")
    return fmt


def _expected(err: Any) -> str:
    v, s = err.validator, err.validator_value
    if v == "type":
        return f"expected {' or '.join(s) if isinstance(s, list) else s}"
    if v == "enum":
        return f"expected one of {', '.join(map(str, s))}"
    if v == "const":
        return f"expected {s!r}"
    if v == "minimum":
        return f"expected a number >= {s}"
    if v == "minLength":
        return "expected a non-empty string"
    return err.message
