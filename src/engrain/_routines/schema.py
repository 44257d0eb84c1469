"""JSON Schema checks for routines: a small fast path, jsonschema for the rest.

Routine schemas are mostly ``type / properties / required / items / enum``.
Importing :mod:`jsonschema` costs ~80 ms, more than a whole ``engrain run``
should take, so schemas made only of the keywords below are checked here, with
the same meaning as JSON Schema 2020-12; any other keyword hands the schema to
jsonschema (imported then).
"""

from __future__ import annotations

import contextvars
import re
import time
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
        if "pattern" in schema:
            try:
                if not pattern_search(schema["pattern"], v):
                    return ".".join(path), f"{v!r} does not match {schema['pattern']!r}"
            except PatternTimeout as e:
                return ".".join(path), str(e)
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


def _walk(schema: Any) -> Any:
    """Every mapping inside ``schema`` (iteratively: depth was bounded when the file was read)."""
    stack = [schema]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            yield v
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


#: Longest one ``pattern`` may search one value, in seconds. Python's re has no limit: a pattern such as
#: ``^(a|a)*$`` takes time exponential in a value it fails to match, and the schema is the routine file's while
#: the value may be anyone's input or tool result. The ``regex`` module stops at a deadline instead.
PATTERN_TIMEOUT = 0.25
#: Longest all the pattern searches of one value's check may take together, in seconds: many patterns over
#: many strings (each within :data:`PATTERN_TIMEOUT`) must not add up to minutes.
PATTERNS_BUDGET = 1.0

# The monotonic time the current check's pattern searches must end by (None: outside a check, no budget).
_budget_end: contextvars.ContextVar[float | None] = contextvars.ContextVar("engrain_pattern_budget", default=None)


class PatternTimeout(Exception):
    """A schema's pattern took longer than :data:`PATTERN_TIMEOUT` on one value, or the check's patterns
    together longer than :data:`PATTERNS_BUDGET`."""

    def __init__(self, pattern: str, budget: bool = False):
        self.pattern = pattern
        if budget:
            msg = (f"the schema's patterns took longer than {PATTERNS_BUDGET} s on this value in all (at pattern"
                   f" {pattern!r}): use fewer patterns, or check fewer strings with them")
        else:
            msg = (f"pattern {pattern!r} took longer than {PATTERN_TIMEOUT} s on this value (it backtracks"
                   " without bound: make its repeats possessive, a++ or (...)*+, or rewrite it)")
        super().__init__(msg)


def pattern_search(pattern: str, value: str) -> bool:
    """Whether ``pattern`` matches somewhere in ``value``, as JSON Schema's ``pattern`` asks; time-bounded
    (within a check, also by what is left of the check's budget)."""
    import regex

    timeout, end = PATTERN_TIMEOUT, _budget_end.get()
    if end is not None:
        left = end - time.monotonic()
        if left <= 0:
            raise PatternTimeout(pattern, budget=True)
        timeout = min(timeout, left)
    try:
        return regex.search(pattern, value, timeout=timeout) is not None
    except TimeoutError:
        raise PatternTimeout(pattern, budget=timeout < PATTERN_TIMEOUT) from None


def _budgeted(check: Check) -> Check:
    """``check`` with its pattern searches sharing one :data:`PATTERNS_BUDGET` per value checked."""

    def budgeted(v: Any) -> tuple[str, str] | None:
        token = _budget_end.set(time.monotonic() + PATTERNS_BUDGET)
        try:
            return check(v)
        finally:
            _budget_end.reset(token)

    return budgeted


def _bounded(cls: Any) -> Any:
    """``cls`` (a jsonschema validator class) with every keyword that matches a pattern time-bounded.

    A pattern out of time is a violation at the value it was searching, so the error names that field.
    """
    import jsonschema
    from jsonschema.exceptions import ValidationError

    def pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Any:
        if validator.is_type(instance, "string"):
            try:
                if not pattern_search(patrn, instance):
                    yield ValidationError(f"{instance!r} does not match {patrn!r}")
            except PatternTimeout as e:
                yield ValidationError(str(e))

    def pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any, schema: Any) -> Any:
        if validator.is_type(instance, "object"):
            for p, sub in patterns.items():
                for k, v in instance.items():
                    try:
                        found = pattern_search(p, k)
                    except PatternTimeout as e:
                        yield ValidationError(f"property name {k!r}: {e}")
                        return
                    if found:
                        yield from validator.descend(v, sub, path=k, schema_path=p)

    def additional_properties(validator: Any, ap: Any, instance: Any, schema: Any) -> Any:
        if not validator.is_type(instance, "object"):
            return
        props, patterns = schema.get("properties", {}), list(schema.get("patternProperties", {}))
        try:
            extras = [k for k in instance if k not in props and not any(pattern_search(p, k) for p in patterns)]
        except PatternTimeout as e:
            yield ValidationError(f"a property name: {e}")
            return
        if validator.is_type(ap, "object"):
            for k in extras:
                yield from validator.descend(instance[k], ap, path=k)
        elif not ap and extras:
            yield ValidationError(f"additional properties are not allowed ({', '.join(map(repr, sorted(extras)))}"
                                  " unexpected)")

    return jsonschema.validators.extend(cls, {"pattern": pattern, "patternProperties": pattern_properties,
                                              "additionalProperties": additional_properties})


def _ref_problem(schema: Any) -> str | None:
    """Why a ``$ref`` of ``schema`` cannot be resolved (engrain fetches no remote schema), or None."""
    refs = [d["$ref"] for d in _walk(schema) if isinstance(d.get("$ref"), str)]
    if not refs or any("$id" in d for d in _walk(schema) if d is not schema):
        return None  # a nested $id moves the base URI: left to jsonschema, which names it when run
    import referencing.exceptions
    import referencing.jsonschema
    from jsonschema_specifications import REGISTRY

    spec = referencing.jsonschema.specification_with(
        schema.get("$schema", _DRAFTS[0]), default=referencing.jsonschema.DRAFT202012)
    resolver = REGISTRY.resolver_with_root(spec.create_resource(schema))
    for ref in refs:
        try:
            resolver.lookup(ref)
        except referencing.exceptions.Unresolvable:
            return f"$ref {ref!r} cannot be resolved (a remote schema is never fetched: put it under $defs)"
    return None


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` is not a valid JSON schema, or None."""
    if _simple(schema):
        return None
    import jsonschema  # lazily: ~80 ms of imports

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except Exception as e:  # noqa: BLE001 - SchemaError, or an unknown $schema: both mean invalid
        return str(getattr(e, "message", e))
    return _unbounded_patterns(schema) or _ref_problem(schema)


def _unbounded_patterns(schema: Any) -> str | None:
    """Why ``schema`` would search a pattern without a time limit, or None."""
    parts = list(_walk(schema))
    if any("unevaluatedProperties" in d for d in parts) and any("patternProperties" in d for d in parts):
        # jsonschema finds the properties patternProperties evaluated with Python's re, which has no time
        # limit and which engrain cannot replace there: a routine file's pattern could hang its runs.
        return ("unevaluatedProperties beside patternProperties is not supported (their pattern search cannot be"
                " time-bounded): use additionalProperties instead")
    return None


def compile_schema(schema: Any) -> Check:
    """A function returning ``(path, message)`` of the first violation of ``schema``, or None."""
    if _simple(schema):
        return _budgeted(lambda v: _first_error(schema, v, []))
    if (problem := _unbounded_patterns(schema)) is not None:  # loading refused it; a schema built otherwise too
        return lambda v: ("(schema)", problem)
    import jsonschema  # lazily: ~80 ms of imports
    import jsonschema.exceptions
    import referencing.exceptions

    validator = _bounded(jsonschema.validators.validator_for(schema))(schema)

    def check(v: Any) -> tuple[str, str] | None:
        try:
            err = jsonschema.exceptions.best_match(validator.iter_errors(v))
        except referencing.exceptions.Unresolvable as e:  # a $ref validation could not check (see _ref_problem)
            return "(schema)", f"the schema's $ref cannot be resolved: {e}"
        if err is None:
            return None
        return ".".join(str(p) for p in err.absolute_path), err.message

    return _budgeted(check)
