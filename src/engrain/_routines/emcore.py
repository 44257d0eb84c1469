"""em-core's hand-written routine packages, converted on load into engrain's routine format.

An em-core package (Executable Memory's ``em-core``) is a folder with
``routine.yaml`` (``input_schema``/``output_schema``, ``tools`` as a list with
``args_schema``/``result_schema``, ``check:`` on asserts, ``prompt: {message,
fields}``, ``confirm`` fields, templates like ``{{ url }}`` that read inputs by
their bare name), an optional ``udf.py`` and an optional ``schemas/`` folder
(``input.schema.json``, ``output.schema.json``). :func:`convert` rewrites the
parsed YAML into engrain's keys in memory and returns, next to it, one line per
change it made (the conversion report that ``engrain validate`` prints). Inputs
stay readable by bare name: the runner binds them at the top of the scope, as
em-core does. Nothing is executed here; ``udf.py`` is parsed like ``udfs.py``.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

#: Files of an em-core package besides routine.yaml.
UDF_FILE = "udf.py"
SCHEMAS_DIR = "schemas"
_SCHEMA_FILES = {"inputs": "input.schema.json", "output": "output.schema.json"}
_MAX_SCHEMA_BYTES = 1 << 20
_FIELD_TYPES = {"confirm": "boolean"}


def is_emcore(data: Any, root: pathlib.Path) -> bool:
    """Whether ``data`` (parsed routine.yaml of folder ``root``) is written in em-core's format."""
    if not isinstance(data, dict) or "inputs" in data:
        return False
    steps = data.get("steps") if isinstance(data.get("steps"), list) else []
    return (
        "input_schema" in data
        or "output_schema" in data
        or isinstance(data.get("tools"), list)
        or any(isinstance(s, dict) and ("check" in s or isinstance(s.get("prompt"), dict)) for s in steps)
        or (root / UDF_FILE).is_file()
        or (root / SCHEMAS_DIR).is_dir()
    )


def _schema_file(root: pathlib.Path, name: str) -> tuple[Any, str | None]:
    path = root / SCHEMAS_DIR / name
    if not path.is_file():
        return None, None
    real = path.resolve()
    if not real.is_relative_to((root / SCHEMAS_DIR).resolve()):
        return None, f"{SCHEMAS_DIR}/{name} resolves outside the routine folder"
    if real.stat().st_size > _MAX_SCHEMA_BYTES:
        return None, f"{SCHEMAS_DIR}/{name} is over {_MAX_SCHEMA_BYTES} bytes"
    try:
        return json.loads(real.read_text(encoding="utf-8")), None
    except (ValueError, UnicodeDecodeError) as e:
        return None, f"{SCHEMAS_DIR}/{name} is not JSON: {e}"
    except RecursionError:
        return None, f"{SCHEMAS_DIR}/{name} is nested too deeply to parse"


def convert(data: dict[str, Any], root: pathlib.Path) -> tuple[dict[str, Any], list[str], list[tuple[str, str]]]:
    """``(engrain routine dict, conversion notes, problems)`` for em-core routine ``data``.

    ``problems`` are ``(field, message)`` pairs for files that cannot be read.
    """
    out = {k: v for k, v in data.items() if k not in ("input_schema", "output_schema", "tools", "steps")}
    notes: list[str] = []
    problems: list[tuple[str, str]] = []
    for key, old in (("inputs", "input_schema"), ("output", "output_schema")):
        schema, problem = _schema_file(root, _SCHEMA_FILES[key])
        if problem:
            problems.append((f"{SCHEMAS_DIR}/{_SCHEMA_FILES[key]}", problem))
        if data.get(old) is not None:
            out[key] = data[old]
            notes.append(f"{old} -> {key}")
        elif schema is not None:
            out[key] = schema
            notes.append(f"{SCHEMAS_DIR}/{_SCHEMA_FILES[key]} -> {key}")
    if "inputs" not in out:
        out["inputs"] = {"type": "object"}
        notes.append("no input schema: inputs are any JSON object")
    tools = data.get("tools")
    if isinstance(tools, list):
        mapping: dict[str, Any] = {}
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or not isinstance(t.get("name"), str):
                problems.append((f"tools[{i}]", "must be a mapping with a name"))
                continue
            decl = {"description": t["description"]} if t.get("description") else {}
            if t.get("args_schema") is not None:
                decl["args"] = t["args_schema"]
            if t.get("result_schema") is not None:
                decl["result"] = t["result_schema"]
            mapping[t["name"]] = decl
        out["tools"] = mapping
        notes.append("tools list (args_schema/result_schema) -> tools mapping (args/result)")
    elif tools is not None:
        out["tools"] = tools
    steps = data.get("steps")
    if not isinstance(steps, list):
        out["steps"] = steps
    else:
        out["steps"] = [_step(s, notes) for s in steps]
        if not any(isinstance(s, dict) and s.get("type") == "return" for s in steps):
            names = sorted(_bare_inputs(out["inputs"]) | {s["save_as"] for s in steps if isinstance(s, dict) and isinstance(s.get("save_as"), str)})
            out["steps"].append({"id": "_context", "type": "return", "value": {n: f"{{{{ {n} }}}}" for n in names}})
            notes.append(f"no return step: returns the context ({', '.join(names) or 'empty'}), as em-core does")
    if (root / UDF_FILE).is_file():
        notes.append(f"{UDF_FILE} -> UDFs (run in the WASM sandbox unless the routine says trusted: true)")
    if "trusted" not in data:
        out["trusted"] = False
    notes.append("templates and expressions read inputs by bare name ({{ url }}), as em-core does")
    return out, notes, problems


def _bare_inputs(schema: Any) -> set[str]:
    props = schema.get("properties") if isinstance(schema, dict) else None
    return {k for k in props if isinstance(k, str) and k.isidentifier()} if isinstance(props, dict) else set()


def input_names(routine: dict[str, Any]) -> set[str]:
    """Inputs that templates and expressions of a converted em-core routine may read by bare name."""
    return _bare_inputs(routine.get("inputs"))


def _step(s: Any, notes: list[str]) -> Any:
    if not isinstance(s, dict):
        return s
    s = dict(s)
    sid = s.get("id")
    if s.get("type") == "assert" and "check" in s and "expr" not in s:
        s["expr"] = s.pop("check")
        notes.append(f"step {sid}: check -> expr")
    prompt = s.get("prompt")
    if s.get("type") == "prompt.user" and isinstance(prompt, dict):
        s["prompt"] = prompt.get("message", "")
        fields = prompt.get("fields")
        if isinstance(fields, list):
            s["fields"] = [_field(f, sid, notes) for f in fields]
        else:
            s["fields"] = fields
        extra = sorted(set(prompt) - {"message", "fields"})
        for k in extra:
            s[f"prompt.{k}"] = prompt[k]  # reported by the validator as an unknown key
        notes.append(f"step {sid}: prompt {{message, fields}} -> prompt, fields")
    return s


def _field(f: Any, sid: Any, notes: list[str]) -> Any:
    if not isinstance(f, dict):
        return f
    f = dict(f)
    if f.get("type") in _FIELD_TYPES:
        notes.append(f"step {sid}: field {f.get('name')}: type {f['type']} -> {_FIELD_TYPES[f['type']]}")
        f["type"] = _FIELD_TYPES[f["type"]]
    if "default" in f and f["default"] is None:
        del f["default"]  # em-core's "no default"
    return f
