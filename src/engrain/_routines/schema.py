"""JSON Schema checks for routines: a small fast path, jsonschema for the rest.

Routine schemas are mostly ``type / properties / required / items / enum``.
Importing :mod:`jsonschema` costs ~80 ms, more than a whole ``engrain run``
should take, so schemas made only of the keywords below are checked here, with
the same meaning as JSON Schema 2020-12; any other keyword hands the schema to
jsonschema (imported then).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_TYPES = {"null", "boolean", "integer", "number", "string", "array", "object"}
_ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "$schema", "deprecated", "readOnly", "writeOnly"}
_KEYWORDS = {
    "type", "properties", "required", "additionalProperties", "items", "enum", "const",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
    "minItems", "maxItems", "pattern",
} | _ANNOTATIONS
_DRAFTS = ("https://json-schema.org/draft/2020-12/schema", "http://json-schema.org/draft-07/schema#")

#: ``(path, message)`` of the first violation, or None.
Check = Callable[[Any], "tuple[str, str] | None"]


def _is_type(v: Any, t: str) -> bool:
    if t == "integer":
        return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return isinstance(v, {"null": type(None), "boolean": bool, "string": str, "array": list, "object": dict}[t])


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _simple(schema: Any) -> bool:
    """True when the fast path understands every keyword of ``schema`` (recursively) and it is well-formed."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict) or not set(schema) <= _KEYWORDS:
        return False
    if "$schema" in schema and schema["$schema"] not in _DRAFTS:
        return False
    t = schema.get("type")
    if t is not None:
        ts = t if isinstance(t, list) else [t]
        if not ts or not all(isinstance(x, str) and x in _TYPES for x in ts):
            return False
    props = schema.get("properties", {})
    if not isinstance(props, dict) or not all(_simple(s) for s in props.values()):
        return False
    req = schema.get("required", [])
    if not isinstance(req, list) or not all(isinstance(x, str) for x in req):
        return False
    for k in ("additionalProperties", "items"):
        if k in schema and not _simple(schema[k]):
            return False
    if "enum" in schema and not isinstance(schema["enum"], list):
        return False
    for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if k in schema and not _num(schema[k]):
            return False
    for k in ("minLength", "maxLength", "minItems", "maxItems"):
        if k in schema and not (isinstance(schema[k], int) and not isinstance(schema[k], bool) and schema[k] >= 0):
            return False
    if "pattern" in schema:
        try:
            re.compile(schema["pattern"])
        except (re.error, TypeError):
            return False
    return True


def _first_error(schema: Any, v: Any, path: list[str]) -> tuple[str, str] | None:
    if schema is True:
        return None
    if schema is False:
        return ".".join(path), "no value is allowed here"
    t = schema.get("type")
    if t is not None:
        ts = t if isinstance(t, list) else [t]
        if not any(_is_type(v, x) for x in ts):
            return ".".join(path), f"{v!r} is not of type {', '.join(repr(x) for x in ts)}"
    if "const" in schema and not _equal(v, schema["const"]):
        return ".".join(path), f"{schema['const']!r} was expected"
    if "enum" in schema and not any(_equal(v, e) for e in schema["enum"]):
        return ".".join(path), f"{v!r} is not one of {schema['enum']!r}"
    if _num(v):
        for k, bad in (
            ("minimum", lambda b: v < b), ("maximum", lambda b: v > b),
            ("exclusiveMinimum", lambda b: v <= b), ("exclusiveMaximum", lambda b: v >= b),
        ):
            if k in schema and bad(schema[k]):
                return ".".join(path), f"{v!r} violates {k} {schema[k]!r}"
    elif isinstance(v, str):
        if "minLength" in schema and len(v) < schema["minLength"]:
            return ".".join(path), f"{v!r} is shorter than {schema['minLength']}"
        if "maxLength" in schema and len(v) > schema["maxLength"]:
            return ".".join(path), f"{v!r} is longer than {schema['maxLength']}"
        if "pattern" in schema and not re.search(schema["pattern"], v):
            return ".".join(path), f"{v!r} does not match {schema['pattern']!r}"
    elif isinstance(v, list):
        if "minItems" in schema and len(v) < schema["minItems"]:
            return ".".join(path), f"{v!r} has fewer than {schema['minItems']} items"
        if "maxItems" in schema and len(v) > schema["maxItems"]:
            return ".".join(path), f"{v!r} has more than {schema['maxItems']} items"
        if "items" in schema:
            for i, x in enumerate(v):
                err = _first_error(schema["items"], x, [*path, str(i)])
                if err:
                    return err
    elif isinstance(v, dict):
        for name in schema.get("required", ()):
            if name not in v:
                return ".".join([*path, name]), f"{name!r} is a required property"
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for k, x in v.items():
            sub = props.get(k, extra)
            if sub is False:
                return ".".join([*path, k]), f"additional property {k!r} is not allowed"
            if sub is not True:
                err = _first_error(sub, x, [*path, k])
                if err:
                    return err
    return None


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` is not a valid JSON schema, or None."""
    if _simple(schema):
        return None
    import jsonschema  # lazily: ~80 ms of imports

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except Exception as e:  # noqa: BLE001 - SchemaError, or an unknown $schema: both mean invalid
        return str(getattr(e, "message", e))
    return None


def compile_schema(schema: Any) -> Check:
    """A function returning ``(path, message)`` of the first violation of ``schema``, or None."""
    if _simple(schema):
        return lambda v: _first_error(schema, v, [])
    import jsonschema  # lazily: ~80 ms of imports
    import jsonschema.exceptions

    validator = jsonschema.validators.validator_for(schema)(schema)

    def check(v: Any) -> tuple[str, str] | None:
        err = jsonschema.exceptions.best_match(validator.iter_errors(v))
        if err is None:
            return None
        return ".".join(str(p) for p in err.absolute_path), err.message

    return check
