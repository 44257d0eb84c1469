"""Agent tools: a Python function or a registered tool, with the JSON schema the model sees.

The schema comes from the signature and type hints (``str`` -> string, ``list[int]``
-> array of integers, ``Literal`` -> enum, a default -> optional, a ``None``
default -> also null, as ``Optional``) and the
description from the docstring's first paragraph. A registered WASM tool
(``engrain.tools.load_dir``) takes one JSON value, offered to the model as ``args``.
Arguments the model sends are checked against the schema before the tool runs;
a mismatch becomes an error message for the model, never a call.

An ``@engrain.tool`` keeps its step policy (``at_most_once``, ``retries``): the
agent journals its calls as a plain durable run journals them (see ``loop.run_tools``).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import types
import typing
from collections import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._durable.steps import DEFAULT_POLICY, StepPolicy
from .._errors import ConfigError, NotJSONError
from .._events import MAX_DEPTH, check_depth, check_json, check_text, dumps, is_json
from .volatile import DEFAULT as DEFAULT_CHECK
from .volatile import ResultCheck, result_check

MAX_ARGS = 256 * 1024  # bytes of argument JSON a model may send to one tool call

# json.loads' own parser (the same values, errors and limits), called without json.loads' layers
# around it: an object with no space around it is what models send for nearly every call.
_scan = json.JSONDecoder().scan_once


def _parse(raw: str) -> Any:
    """``json.loads(raw or "{}")``, faster for text that is one object from its first to its last character."""
    if raw[:1] == "{" and raw[-1:] == "}":
        try:
            value, end = _scan(raw, 0)
        except StopIteration:  # pragma: no cover - a "{" always starts a value or raises ValueError
            pass
        else:
            if end == len(raw):
                return value
    return json.loads(raw or "{}")

_SIMPLE: dict[Any, dict[str, Any]] = {
    str: {"type": "string"}, int: {"type": "integer"}, float: {"type": "number"}, bool: {"type": "boolean"},
    dict: {"type": "object"}, list: {"type": "array"}, type(None): {"type": "null"},
}


def json_schema(hint: Any) -> dict[str, Any]:
    """The JSON schema of a type hint (``{}``, meaning any value, when unknown)."""
    if hint is inspect.Parameter.empty or hint is Any:
        return {}
    if hint in _SIMPLE:
        return dict(_SIMPLE[hint])
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return {"enum": [a.value if isinstance(a, enum.Enum) else a for a in args]}
    if origin in (typing.Union, types.UnionType):
        options = [json_schema(a) for a in args]
        return {"anyOf": options} if all(options) else {}
    if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[int, str]: each position its own type
        items = [json_schema(a) for a in args]
        return {"type": "array", "prefixItems": items, "minItems": len(args), "maxItems": len(args)}
    if origin in (list, tuple, set, frozenset, typing.Sequence, abc.Sequence):
        item = json_schema(args[0]) if args else {}
        return {"type": "array", "items": item} if item else {"type": "array"}
    if origin is dict:
        return {"type": "object"}
    if hasattr(hint, "__annotations__") and hasattr(hint, "__required_keys__"):  # TypedDict
        hints = typing.get_type_hints(hint)
        return {"type": "object", "properties": {k: json_schema(v) for k, v in hints.items()},
                "required": sorted(hint.__required_keys__)}
    return {}


def _description(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


@dataclass(slots=True)
class AgentTool:
    """One tool the agent may call: ``fn(**args)`` behind ``name`` and a JSON schema."""

    name: str
    fn: Callable[..., Any]
    description: str
    parameters: dict[str, Any]
    validator: Any = None
    wasm: bool = False
    quick: Any = None  # a plain-Python check for flat schemas (see _quick_check); False: none applies
    result_check: ResultCheck = DEFAULT_CHECK  # how a replayed result is compared (see volatile.py)
    # An @engrain.tool's at_most_once and retries: unwrapped, the tool is journaled by the agent's
    # loop, which must journal it as the tool's own wrapper would (a payment is never retried blind).
    policy: StepPolicy = DEFAULT_POLICY
    # Arguments given as JSON but declared as an Enum, a dataclass or a pydantic model: built before the call.
    build: dict[str, Callable[[Any], Any]] | None = None
    # Parameters whose schema takes null only for their None default (`x: int = None`): see declared().
    null_defaults: tuple[str, ...] = ()

    def spec(self) -> dict[str, Any]:
        """The provider-neutral declaration sent to the model."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def declared(self) -> dict[str, Any]:
        """``parameters`` as engrain wrote them before a None default also took null: what an agent's
        definition digests, so that runs recorded then still resume (every call they hold fits both)."""
        if not self.null_defaults:
            return self.parameters
        props = dict(self.parameters["properties"])
        for name in self.null_defaults:
            widened = props[name]
            props[name] = {**widened["anyOf"][0], **{k: v for k, v in widened.items() if k != "anyOf"}}
        return {**self.parameters, "properties": props}

    def check(self, raw: str) -> dict[str, Any]:
        """Parse and validate the model's argument text; ``ValueError`` with a message for the model."""
        if len(raw) > MAX_ARGS:
            raise ValueError(f"arguments are {len(raw)} bytes; at most {MAX_ARGS} are accepted")
        try:
            args = _parse(raw)
        except ValueError as e:
            raise ValueError(f"arguments are not valid JSON ({e})") from None
        except RecursionError:
            raise ValueError(f"arguments nest lists/objects deeper than {MAX_DEPTH - 1} levels") from None
        if not isinstance(args, dict):
            raise ValueError(f"arguments must be a JSON object, got {type(args).__name__}")
        _journalable(args, raw)
        if self.quick is None:
            self.quick = _quick_check(self.parameters) or False
        if self.quick and self.quick(args):  # the common case, ~30x cheaper than jsonschema
            return args
        if self.validator is None:
            import jsonschema

            self.validator = jsonschema.Draft202012Validator(self.parameters)
        if self.validator.is_valid(args):  # collecting errors costs more
            return args
        errors = sorted(self.validator.iter_errors(args), key=lambda e: list(e.path))
        if errors:
            e = errors[0]
            where = "/".join(str(p) for p in e.path) or "(arguments)"
            raise ValueError(f"argument {where}: {e.message}")
        return args

    def invoke(self, args: dict[str, Any]) -> Any:
        """Run the tool with checked arguments."""
        if self.wasm:
            return self.fn(args.get("args"))
        if self.build:
            args = {k: self.build[k](v) if k in self.build else v for k, v in args.items()}
        return self.fn(**args)


def _journalable(args: dict[str, Any], raw: str) -> None:
    """Refuse arguments the journal cannot record (``ValueError``), before the tool runs: a tool
    run whose step cannot be journaled would run again on resume, and the model would be told it failed.

    json.loads takes NaN, Infinity and lone surrogates (``"\\ud800"``), and nesting as deep as the
    stack allows; a step's data holds the arguments one level below its top.
    """
    try:
        if not is_json(args, 1):
            check_depth(args, "arguments", "arguments", MAX_DEPTH - 1)
            check_json(args, "arguments", "arguments")
        if "\\u" in raw or not raw.isascii():
            check_text(dumps(args), args, "arguments", "arguments")
    except NotJSONError as e:
        raise ValueError(str(e)) from None


def from_function(fn: Callable[..., Any]) -> AgentTool:
    """An :class:`AgentTool` for a Python function (an ``@engrain.tool`` is unwrapped: the agent journals it)."""
    step = getattr(fn, "__engrain_step__", None)
    name = step["name"] if step else getattr(fn, "__name__", "")
    inner = getattr(fn, "__wrapped__", fn) if step else fn
    if inspect.iscoroutinefunction(inner):
        raise ConfigError(f"tool {name!r}: async functions are not supported as agent tools yet; pass a sync function")
    try:
        sig = inspect.signature(inner)
        hints = typing.get_type_hints(inner)
    except (TypeError, ValueError, NameError) as e:
        raise ConfigError(f"tool {name!r}: cannot read its signature ({e})") from None
    props: dict[str, Any] = {}
    required: list[str] = []
    defs: dict[str, Any] = {}
    build: dict[str, Callable[[Any], Any]] = {}
    nulls: list[str] = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise ConfigError(f"tool {name!r}: parameter {p.name!r} must be a plain or keyword parameter")
        hint = hints.get(p.name, p.annotation)
        members = _enum_literals(hint)
        if members:  # Literal[Color.RED]: the model sends "red" (pydantic would refuse it)
            props[p.name], build[p.name] = json_schema(hint), lambda v, m=members: m.get(v, v)  # type: ignore[misc]
        elif _built(hint):
            props[p.name], build[p.name] = _model_schema(name, p.name, hint, defs)
        else:
            props[p.name] = json_schema(hint)
        default = p.default.value if isinstance(p.default, enum.Enum) else p.default
        if p.default is p.empty:
            required.append(p.name)
            continue
        if default is None and not _takes_null(props[p.name]):
            # `x: int = None` (PEP 484's implicit Optional): the schema said "an integer, default null",
            # and a model sending that null was refused. The call gets what leaving the argument out gives.
            props[p.name] = {"anyOf": [props[p.name], {"type": "null"}]}
            nulls.append(p.name)
            if p.name in build:
                build[p.name] = lambda v, b=build[p.name]: None if v is None else b(v)  # type: ignore[misc]
        if is_json(default):  # json.dumps takes NaN, which is no JSON a provider accepts
            props[p.name]["default"] = default
    params = {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    if defs:
        params["$defs"] = defs
    check = result_check(name, step.get("volatile"), step.get("same_result")) if step else DEFAULT_CHECK
    return AgentTool(name, inner, _description(inner) or name, params, result_check=check, policy=_policy(fn),
                     build=build or None, null_defaults=tuple(nulls))


def _takes_null(schema: dict[str, Any]) -> bool:
    """Whether JSON ``null`` fits ``schema`` as :func:`json_schema` and pydantic write them (any value,
    a ``null`` type, an enum with null, a union with a branch that takes it)."""
    if not schema:
        return True
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    if None in (schema.get("enum") or ()) or ("const" in schema and schema["const"] is None):
        return True
    return any(isinstance(o, dict) and _takes_null(o) for key in ("anyOf", "oneOf") for o in schema.get(key) or ())


def _built(hint: Any) -> bool:
    """Whether a value of ``hint`` is not the JSON itself: an Enum, a dataclass or a pydantic model,
    also inside Optional, a Union, a list or a dict (the tool would get a str or a dict instead)."""
    if isinstance(hint, type):
        return issubclass(hint, enum.Enum) or dataclasses.is_dataclass(hint) or hasattr(hint, "model_json_schema")
    if typing.get_origin(hint) is typing.Literal:
        return False
    return any(_built(a) for a in typing.get_args(hint))


def _enum_literals(hint: Any) -> dict[Any, enum.Enum]:
    """The Enum members of a ``Literal`` (or an Optional/Union of Literals) by their values."""
    origin = typing.get_origin(hint)
    options = [hint] if origin is typing.Literal else typing.get_args(hint) if origin in (typing.Union, types.UnionType) else []
    return {a.value: a for o in options if typing.get_origin(o) is typing.Literal
            for a in typing.get_args(o) if isinstance(a, enum.Enum)}


def _model_schema(tool: str, param: str, hint: Any, defs: dict[str, Any]) -> tuple[dict[str, Any], Callable[[Any], Any]]:
    """The JSON schema of ``hint`` (its definitions moved into ``defs``, where its references point)
    and the function that builds the tool's argument from the model's JSON (pydantic's)."""
    try:
        import pydantic

        adapter = pydantic.TypeAdapter(hint)
        schema = adapter.json_schema(ref_template="#/$defs/{model}")
    except Exception as e:  # noqa: BLE001 - pydantic's errors for types it cannot describe
        raise ConfigError(f"tool {tool!r}: parameter {param!r}: cannot describe {hint!r} as JSON ({e})") from None
    defs.update(schema.pop("$defs", {}))
    return schema, adapter.validate_python


def _policy(fn: Callable[..., Any]) -> StepPolicy:
    """The step policy an ``@engrain.tool`` was declared with (the default for a plain function)."""
    step = getattr(fn, "__engrain_step__", None)
    policy = step.get("policy") if isinstance(step, dict) else None
    return policy if isinstance(policy, StepPolicy) else DEFAULT_POLICY


def from_registry(name: str, fn: Callable[..., Any]) -> AgentTool:
    """An :class:`AgentTool` for a tool registered by name (a WASM tool takes one JSON value ``args``)."""
    inner = getattr(fn, "__wrapped__", fn)
    try:
        sig = inspect.signature(inner)
    except (TypeError, ValueError):
        sig = None
    if sig is not None and list(sig.parameters) == ["args"]:  # engrain.tools.load_dir's WASM caller
        params = {"type": "object", "properties": {"args": {"description": "the tool's JSON input"}},
                  "required": [], "additionalProperties": False}
        return AgentTool(name, inner, f"WASM tool {name}: takes one JSON value as 'args'", params, wasm=True,
                         policy=_policy(fn))
    t = from_function(fn)
    t.name = name
    return t


_QUICK_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}
_ANY: Callable[[Any], bool] = lambda v: True  # noqa: E731


def _quick_check(schema: dict[str, Any]) -> Callable[[dict[str, Any]], bool] | None:
    """A check that says True only for arguments the JSON schema accepts, for the flat object
    schemas most signatures give (each property one simple ``type``, an ``anyOf`` of them such as
    ``Optional[int]``'s, or any value); else None.

    False is not a verdict: jsonschema then decides and words the error (it also accepts
    what this check is strict about, such as 1.0 for an integer).
    """
    if set(schema) - {"type", "properties", "required", "additionalProperties"} or schema.get("type") != "object":
        return None
    props, required = schema.get("properties", {}), schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(props, dict) or not isinstance(required, list) or extra not in (True, False):
        return None
    checks: dict[str, Callable[[Any], bool]] = {}
    for name, sub in props.items():
        if not isinstance(sub, dict) or set(sub) - {"type", "anyOf", "default", "description"}:
            return None
        if "anyOf" in sub:  # Optional[int] and `x: int = None`: a union of simple types
            options = sub["anyOf"]
            if ("type" in sub or not isinstance(options, list) or not options
                    or not all(isinstance(o, dict) and set(o) == {"type"} and o["type"] in _QUICK_TYPES for o in options)):
                return None
            kinds = [_QUICK_TYPES[o["type"]] for o in options]
            checks[name] = lambda v, kinds=kinds: any(k(v) for k in kinds)
        elif "type" not in sub:
            checks[name] = _ANY
        elif sub["type"] in _QUICK_TYPES:
            checks[name] = _QUICK_TYPES[sub["type"]]
        else:
            return None

    def check(args: dict[str, Any]) -> bool:
        for name in required:
            if name not in args:
                return False
        for k, v in args.items():
            ok = checks.get(k)
            if ok is None:
                if not extra:
                    return False
            elif not ok(v):
                return False
        return True

    return check
