"""Routine packages: the data model, and the vocabulary of ``routine.yaml``.

A routine package is a folder holding ``routine.yaml`` (``name, description,
version, trusted, inputs, output, tools, steps``) and, when it calls UDFs,
``udfs.py``. This module holds what a loaded package is made of
(:class:`Routine`, :class:`Step`, :class:`UdfInfo`), what a problem report is
(:class:`RoutineIssue`) and the allowed keys and step types. Reading a folder is
:mod:`.loader` (``load_routine``, ``validate_routine``); checking the parsed
YAML is :mod:`.validator`.

Each step's result is bound in the scope under its ``id`` and, when given, its
``save_as``; templates (``{{ step1.rows[0].dept }}``) and expressions
(``when``, ``assert``) read that scope, plus ``inputs``.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field
from typing import Any

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


@dataclass(slots=True)
class Package:
    """What the loader found besides routine.yaml: the UDF file, and em-core conversions."""

    udf_file: str = UDFS_FILE
    dialect: str = "engrain"
    conversions: list[str] = field(default_factory=list)
    bare: set[str] = field(default_factory=set)  # em-core inputs readable by bare name
    open_inputs: bool = False  # em-core without declared inputs: unknown names are read as inputs

