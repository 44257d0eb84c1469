"""The package layout's import rules, checked by parsing every module's imports.

Imports flow one way: surfaces -> pillars -> base (journal, events, errors),
with no cycle between modules or between pillars. Every import counts: at the
top, inside functions and under ``TYPE_CHECKING``, plus the facade's lazy table.
A new top-level module or folder must be put in one of the layers below.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import engrain

SRC = pathlib.Path(engrain.__file__).parent

BASE = {"_errors", "_events", "_journal", "_text", "_version", "_disk_cache", "_progress"}
PILLARS = {"_sandbox", "_durable", "_routines", "_cache", "_memory", "_agent", "_workers"}
SURFACES = {"engrain", "muscle_mem", "testing", "integrations", "_server", "_cli", "_mcp", "_client", "_demo", "__main__"}
LAYER = {**{u: 0 for u in BASE}, **{u: 1 for u in PILLARS}, **{u: 2 for u in SURFACES}}
LAYER_NAME = {0: "base", 1: "pillar", 2: "surface"}


def _module_name(path: pathlib.Path) -> str:
    parts = ["engrain", *path.relative_to(SRC).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in SRC.rglob("*.py")}


def _imports(name: str, path: pathlib.Path) -> set[str]:
    """The engrain modules ``name`` imports (a ``from pkg import sub`` names the submodule)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "engrain")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "engrain":
                continue
            subs = {f"{target}.{a.name}" for a in node.names} & MODULES.keys()
            out.update(subs)
            if len(subs) < len(node.names):
                out.add(target)
    if name == "engrain":  # the facade's lazy exports are imports too
        out.update(f"engrain{mod}" for mod, _ in engrain._LAZY.values())
    return {m for m in out if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "engrain"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_top_level_module_has_a_layer():
    unknown = sorted({_unit(m) for m in MODULES} - LAYER.keys())
    assert not unknown, f"put {unknown} in BASE, PILLARS or SURFACES of tests/test_layout.py"


def test_no_import_cycle_between_modules():
    assert _cycles(GRAPH) == []


def test_no_import_cycle_between_pillars_or_surfaces():
    units: dict[str, set[str]] = {}
    for mod, deps in GRAPH.items():
        units.setdefault(_unit(mod), set()).update(_unit(d) for d in deps if _unit(d) != _unit(mod))
    assert _cycles(units) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_flow_down(module):
    mine = LAYER.get(_unit(module), 2)
    upward = sorted(d for d in GRAPH[module] if LAYER.get(_unit(d), 2) > mine)
    assert not upward, (
        f"{module} ({LAYER_NAME[mine]}) imports {upward}: "
        "base never imports a pillar, a pillar never imports a surface"
    )


def test_the_checker_sees_cycles_and_upward_imports():
    # The rules above are only as good as the parser: a known cycle and a known
    # upward import must be reported.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert "engrain._journal" in GRAPH["engrain._durable.context"]
    assert "engrain._durable.context" in GRAPH["engrain"]
    assert "engrain._client" in GRAPH["engrain"]  # through _LAZY
    assert LAYER[_unit("engrain._server.app")] > LAYER[_unit("engrain._durable.context")]


def test_every_package_says_what_it_holds_and_may_import():
    for name, path in MODULES.items():
        if path.name == "__init__.py" and name.count(".") == 1:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            assert doc, f"{name} needs a module docstring"
            if _unit(name) in PILLARS or _unit(name) in BASE:
                assert "May import" in doc or "may import" in doc, f"{name}'s docstring must say what it may import"
