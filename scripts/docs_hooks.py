"""MkDocs hooks for engrain's documentation site (``mkdocs.yml`` names this file).

Three reference pages are generated from the code at build time, so they cannot drift:

- ``<!-- engrain:python-api MODULE -->`` becomes one mkdocstrings block per name in
  ``MODULE.__all__`` (``engrain`` resolves its lazy ``_LAZY`` table to each name's home,
  so a name another branch adds appears without editing the page). A public name without
  a docstring is logged as a warning, which ``mkdocs build --strict`` turns into a failure.
- ``<!-- engrain:cli -->`` becomes the typer app's command tree (usage, help, options).
- ``<!-- engrain:http -->`` becomes the HTTP API from the FastAPI app's OpenAPI document,
  which is also published with the site as ``openapi.json``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.plugins.engrain")

# Document this checkout's code, whichever engrain the environment has installed.
SRC = Path(__file__).resolve().parents[1] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

MARKER = re.compile(r"^<!-- engrain:(python-api|cli|http)(?: ([\w.]+))? -->$", re.M)


# ------------------------------------------------------------------ Python API


def resolve_module(module_name: str) -> Any:
    """The module ``module_name``, also when it is a lazy attribute (``engrain.sandbox``); None if absent."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError:
        parent, _, attr = module_name.rpartition(".")
        if not parent:
            return None
        found = getattr(resolve_module(parent), attr, None)
        return found if inspect.ismodule(found) else None


def static_names(module: Any) -> set[str]:
    """Names the module binds where a static reader (griffe) sees them: top level, or under ``if TYPE_CHECKING``."""
    import ast

    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        return set()
    body = list(tree.body)
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            body.extend(node.body)
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def public_names(module_name: str) -> list[tuple[str, str, Any]]:
    """``(public name, path mkdocstrings renders it from, object)`` for each name in ``__all__``.

    The path is the public one (``engrain.Agent``) when the module binds the name statically (for
    ``engrain``: in its ``TYPE_CHECKING`` block), so anchors and members read as users write them;
    otherwise the path of its definition.
    """
    module = resolve_module(module_name)
    if module is None:
        return []
    lazy: dict[str, tuple[str, str | None]] = getattr(module, "_LAZY", {})
    static = static_names(module) if module.__name__ == module_name else set()
    out = []
    for name in sorted(getattr(module, "__all__", []), key=lambda n: (n.startswith("_"), n.lower())):
        obj = getattr(module, name)
        if name in static:
            path = f"{module_name}.{name}"
        elif name in lazy:
            mod, attr = lazy[name]
            path = importlib.import_module(mod, module_name).__name__ + (f".{attr}" if attr else "")
        elif inspect.ismodule(obj):
            path = obj.__name__
        elif getattr(obj, "__module__", None) and getattr(obj, "__qualname__", None):
            path = f"{obj.__module__}.{obj.__qualname__}"
        else:  # a constant (``__version__``)
            path = f"{module_name}.{name}"
        out.append((name, path, obj))
    return out


def missing_docstrings(module_name: str) -> list[str]:
    """Public names (and public methods of public classes) of ``module_name`` with no docstring."""
    missing = []
    for name, _path, obj in public_names(module_name):
        if not (inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj)):
            continue  # constants (__version__) carry no docstring of their own
        if not (obj.__doc__ or "").strip():
            missing.append(f"{module_name}.{name}")
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not (inspect.isfunction(member) or isinstance(member, (property, classmethod, staticmethod))):
                    continue
                fn = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                if not (getattr(fn, "__doc__", None) or "").strip():
                    missing.append(f"{module_name}.{name}.{attr}")
    return missing


def python_api(module_name: str) -> str:
    if resolve_module(module_name) is None:
        log.info("%s is not in this tree: its reference is left out", module_name)
        return f'!!! note "Not in this build"\n    `{module_name}` is not part of the engrain this site was built from.\n'
    for name in missing_docstrings(module_name):
        log.warning("public name without a docstring: %s", name)
    blocks = []
    for name, path, obj in public_names(module_name):
        full = f"{module_name}.{name}"
        if not (inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj)):
            # A constant (__version__) or a ready-made instance (engrain.memory, engrain.tools): its type says what it is.
            kind = type(obj)
            about = "" if kind in (str, int, float) else (inspect.getdoc(kind) or "").split("\n\n")[0]
            shown = repr(obj) if kind in (str, int, float) else f"{kind.__module__}.{kind.__qualname__}"
            blocks.append(f'<h3 id="{full}"><code>{full}</code></h3>\n\n`{full}`: `{shown}`. {about}\n')
            continue
        members = "\n      members: false" if inspect.ismodule(obj) else ""
        blocks.append(
            f"::: {path}\n    options:\n      heading: \"{full}\"\n      toc_label: \"{name}\"\n"
            f"      show_root_heading: true\n      heading_level: 3{members}\n"
        )
    return "\n".join(blocks)


# ------------------------------------------------------------------ CLI


def _param_row(param: Any) -> str:
    names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
    kind = "flag" if getattr(param, "is_flag", False) else (param.type.name.upper() if param.type else "")
    default = ""
    if not getattr(param, "is_flag", False) and param.default not in (None, (), [], False) and not callable(param.default):
        default = f" (default: `{param.default}`)"
    env = f" (env `{param.envvar}`)" if getattr(param, "envvar", None) else ""
    help_text = " ".join((getattr(param, "help", None) or "").split()).replace("|", "\\|")
    return f"| {names} | {kind} | {help_text}{default}{env} |"


def _command_md(cmd: Any, path: str, ctx: Any) -> list[str]:
    # Duck-typed: typer carries its own copy of click (typer._click), so click's classes are not its.
    lines = [f"### `{path}`", ""]
    help_text = inspect.cleandoc(cmd.help or "")
    if help_text:
        lines += [help_text.replace("\b\n", ""), ""]
    sub_ctx = cmd.context_class(cmd, info_name=path.split()[-1], parent=ctx)
    args = [p for p in cmd.params if p.param_type_name == "argument"]
    opts = [p for p in cmd.params if p.param_type_name == "option" and not getattr(p, "hidden", False)]
    usage = ["[OPTIONS]"] + [a.name.upper() if a.required else f"[{a.name.upper()}]" for a in args]
    if hasattr(cmd, "list_commands"):
        usage.append("COMMAND [ARGS]...")
    lines += ["```", f"{path} {' '.join(usage)}", "```", ""]
    if args:
        lines += [f"- `{a.name.upper()}`: {' '.join((getattr(a, 'help', None) or '').split())}".rstrip(": ") for a in args]
        lines.append("")
    if opts:
        lines += ["| option | type | meaning |", "| --- | --- | --- |", *map(_param_row, opts), ""]
    if hasattr(cmd, "list_commands"):
        for name in cmd.list_commands(sub_ctx):
            sub = cmd.get_command(sub_ctx, name)
            if sub is not None and not sub.hidden:
                lines += _command_md(sub, f"{path} {name}", sub_ctx)
    return lines


def cli_reference() -> str:
    import typer.main

    from engrain._cli import app

    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="engrain")
    lines = [inspect.cleandoc(root.help or ""), ""]
    for name in root.list_commands(ctx):
        cmd = root.get_command(ctx, name)
        if cmd is not None and not cmd.hidden:
            lines += _command_md(cmd, f"engrain {name}", ctx)
    return "\n".join(lines)


# ------------------------------------------------------------------ HTTP API


def openapi_document() -> dict[str, Any]:
    from engrain._server.app import create_app

    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(f"sqlite:///{tmp}/openapi.db", routines_dir=tmp)
        return app.openapi()


def _schema_name(schema: dict[str, Any] | None) -> str:
    if not schema:
        return ""
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if schema.get("type") == "array":
        return f"list of {_schema_name(schema.get('items')) or 'any'}"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(filter(None, (_schema_name(s) or s.get("type", "") for s in schema[key])))
    return schema.get("type", "object")


def http_reference(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, ops in doc.get("paths", {}).items():
        for method, op in ops.items():
            by_tag.setdefault((op.get("tags") or ["other"])[0], []).append((method.upper(), path, op))
    for tag, ops in by_tag.items():
        lines += [f"### {tag}", ""]
        for method, path, op in ops:
            lines += [f"#### `{method} {path}`", ""]
            text = " ".join((op.get("description") or op.get("summary") or "").split())
            if text:
                lines += [text, ""]
            params = op.get("parameters") or []
            if params:
                lines += ["| parameter | in | type | meaning |", "| --- | --- | --- | --- |"]
                for p in params:
                    desc = " ".join((p.get("description") or "").split()).replace("|", "\\|")
                    req = " (required)" if p.get("required") else ""
                    lines.append(f"| `{p['name']}` | {p['in']} | {_schema_name(p.get('schema'))} | {desc}{req} |")
                lines.append("")
            body = (op.get("requestBody") or {}).get("content", {}).get("application/json", {}).get("schema")
            if body:
                lines += [f"Body: `{_schema_name(body)}`", ""]
            ok = next((r for code, r in op.get("responses", {}).items() if code.startswith("2")), None)
            ok_schema = ((ok or {}).get("content") or {}).get("application/json", {}).get("schema")
            if ok_schema:
                lines += [f"Returns: `{_schema_name(ok_schema)}`", ""]
    schemas = doc.get("components", {}).get("schemas", {})
    if schemas:
        lines += ["### Schemas", ""]
        for name, schema in sorted(schemas.items()):
            lines += [f"#### `{name}`", ""]
            if schema.get("description"):
                lines += [" ".join(schema["description"].split()), ""]
            props = schema.get("properties") or {}
            if props:
                required = set(schema.get("required") or [])
                lines += ["| field | type | meaning |", "| --- | --- | --- |"]
                for field, spec in props.items():
                    desc = " ".join((spec.get("description") or "").split()).replace("|", "\\|")
                    req = " (required)" if field in required else ""
                    lines.append(f"| `{field}` | {_schema_name(spec)} | {desc}{req} |")
                lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------ hooks

_openapi: dict[str, Any] | None = None


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    global _openapi

    def replace(m: re.Match[str]) -> str:
        global _openapi
        kind, arg = m.group(1), m.group(2)
        if kind == "python-api":
            return python_api(arg or "engrain")
        if kind == "cli":
            return cli_reference()
        _openapi = _openapi or openapi_document()
        return http_reference(_openapi)

    return MARKER.sub(replace, markdown)


# Docstrings cite names the Sphinx way (:class:`~engrain.Journal`); the rendered page shows the name.
ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj|py:\w+):<code>~?\.?([^<]*)</code>")


def _role(m: re.Match[str]) -> str:
    return f"<code>{m.group(1)}</code>"


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    return ROLE.sub(_role, html)


def on_files(files: Any, config: Any) -> Any:
    global _openapi
    from mkdocs.structure.files import File

    _openapi = openapi_document()
    files.append(File.generated(config, "openapi.json", content=json.dumps(_openapi, indent=2)))
    return files
