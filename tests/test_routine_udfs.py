"""Generalizing UDFs: @eg.udf records its source, compile writes the real function into udfs.py."""

from __future__ import annotations

import ast
import importlib.util
import json
import pathlib
import sys
import textwrap

import pytest

import engrain as eg
from engrain._durable.trace import export_run
from engrain._routines.loader import load_routine

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "csv_report"


def _load(path: pathlib.Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


agent = _load(EXAMPLE / "agent.py", "csv_report_agent_udfs")


def _agent_output(journal, inputs):
    """What the scripted agent itself produces on ``inputs`` (approving when asked)."""
    first = eg.run(agent.report_agent, "csv report", inputs=inputs, journal=journal)
    assert first.status == "needs_input", first
    eg.answer(first.run_id, {"approved": True}, journal=journal)
    done = eg.run(agent.report_agent, "csv report", run_id=first.run_id, inputs=inputs, journal=journal)
    assert done.status == "ok", done.error
    return done.output


def test_recorded_routine_generalizes_to_other_csvs_in_the_sandbox(tmp_path, monkeypatch):
    """Record on employees.csv, compile, run on three other CSVs: outputs equal the agent's own."""
    from engrain import _sandbox

    j = eg.open(f"sqlite:///{tmp_path / 'rec.db'}")
    trace = agent.record(j)
    pkg = eg.compile_trace(trace, tmp_path / "pkg")
    assert [(r.name, r.generalized) for r in pkg.report] == [("parse_csv", True), ("summarize", True)]
    assert load_routine(pkg).trusted is False
    used: list[str] = []
    real = _sandbox.SandboxUdfHost.call
    monkeypatch.setattr(_sandbox.SandboxUdfHost, "call", lambda self, n, a: (used.append(n), real(self, n, a))[1])
    others = {
        "sales.csv": 4,  # other departments (Legal, Marketing, Sales, Support), 8 rows
        "contractors.csv": 2,  # other row count (3)
        "empty.csv": 0,  # an empty file
    }
    for source, n_departments in others.items():
        inputs = {"source": source, "title": f"Report of {source}"}
        res = eg.run_routine(pkg, inputs, tools=agent.tools, journal=j, answers={"step3": {}})
        assert res.status == "ok", res.error
        assert res.output == _agent_output(j, inputs)
        assert len(res.output["departments"]) == n_departments
    assert used == ["parse_csv", "summarize"] * 3  # untrusted: every UDF call ran in the sandbox


def test_udf_source_is_journaled_once_per_run_and_exported(tmp_path):
    j = eg.open(f"sqlite:///{tmp_path / 'u.db'}")

    def twice(task):
        text = agent.fetch_csv("employees.csv")
        return [agent.parse_csv(text), agent.parse_csv(text + "Ada B,Ops,1\n")]

    res = eg.run(twice, "twice", journal=j)
    assert res.status == "ok", res.error
    completed = [e.data for e in j.read(res.run_id) if e.kind == "step.completed" and e.name == "parse_csv"]
    assert "source" in completed[0]["udf"] and "def parse_csv(text" in completed[0]["udf"]["source"]
    assert completed[0]["udf"]["imports"] == ["import csv", "import io"]
    assert completed[1]["udf"] == {"name": "parse_csv", "sha256": completed[0]["udf"]["sha256"]}
    trace = json.loads(json.dumps(export_run(j, res.run_id)))  # the export carries the source
    pkg = eg.compile_trace(trace, tmp_path / "pkg")
    assert [r.to_dict() for r in pkg.report] == [{"name": "parse_csv", "generalized": True, "reason": None}]


_MODULE = '''
from __future__ import annotations

import math
import os
import engrain as eg

SCALE = 3
STATE = {"calls": 0}


def _triple(x):
    return x * SCALE


@eg.udf
def good(x: int) -> int:
    """Uses a helper, a constant and an allow-listed module."""
    return _triple(math.floor(x))


@eg.udf
def twice_good(x):
    """Calls another recorded UDF: written once in udfs.py, shared."""
    return good(x) * 2


@eg.udf
def uses_os(x):
    return len(os.sep) + x


@eg.udf
def uses_state(x):
    return STATE["calls"] + x


def make_closure(k):
    @eg.udf(name="closure")
    def add(x):
        return x + k
    return add


lam = eg.udf(lambda x: x + 1, name="lam")
floor = eg.udf(math.floor, name="cfloor")


def agent(task, x):
    return [good(x), uses_os(x), uses_state(x), make_closure(2)(x), lam(x), floor(x), twice_good(x)]
'''


def test_uncapturable_udfs_fall_back_to_stubs_and_say_why(tmp_path):
    (tmp_path / "udf_agent_mod.py").write_text(textwrap.dedent(_MODULE))
    mod = _load(tmp_path / "udf_agent_mod.py", "udf_agent_mod")
    j = eg.open(f"sqlite:///{tmp_path / 'f.db'}")
    res = eg.run(mod.agent, "mixed udfs", inputs={"x": 4}, journal=j)
    assert res.status == "ok", res.error
    pkg = eg.compile_trace(export_run(j, res.run_id), tmp_path / "pkg")
    why = {r.name: r.reason for r in pkg.report}
    assert why["good"] is None and why["twice_good"] is None
    assert "module 'os'" in why["uses_os"] and "allow-list" in why["uses_os"]
    assert "module state 'STATE'" in why["uses_state"]
    assert "closure over k" in why["closure"]
    assert "lambda" in why["lam"]
    assert "not a Python function" in why["cfloor"]
    assert [r.name for r in pkg.stubs()] == ["uses_os", "uses_state", "closure", "lam", "cfloor"]
    src = (pkg / "udfs.py").read_text()
    ast.parse(src)
    assert "def _triple(x):" in src and "SCALE = 3" in src and "import math" in src and "import os" not in src
    assert "# replays recorded results: uses module 'os'" in src
    # The generalizing function runs on new input; the stubs replay what they saw.
    ns = _load(pkg / "udfs.py", "pkg_mixed_udfs")
    assert ns.good(10) == 30 and ns.twice_good(10) == 60 and ns.uses_os(4) == res.output[1]
    assert src.count("def good(") == 1
    with pytest.raises(eg.UnknownInputError):
        ns.uses_os(5)


def test_recorded_source_from_a_trace_is_checked_not_trusted(tmp_path):
    j = eg.open(f"sqlite:///{tmp_path / 't.db'}")
    trace = agent.record(j)
    events = [e for e in trace["events"] if e["kind"] == "step.completed" and "udf" in e["data"]]
    tampered = [
        ("imports", ["import os"], "not an allow-listed standard module"),
        ("source", "@decorated\ndef parse_csv(text):\n    return []\n", "without decorators"),
        ("source", "def parse_csv(text):\n    return []\nimport os\n", "one def statement"),
        ("helpers", [{"name": "x", "source": "x = open('/etc/passwd').read()\n"}], "recorded source rejected"),
    ]
    for key, value, message in tampered:
        bad = json.loads(json.dumps(trace))
        for e in bad["events"]:
            if e["kind"] == "step.completed" and e["data"].get("udf", {}).get("name") == "parse_csv":
                e["data"]["udf"][key] = value
        pkg = eg.compile_trace(bad, tmp_path / f"pkg-{key}")
        why = {r.name: r.reason for r in pkg.report}
        assert message in why["parse_csv"], (key, why)
        assert why["summarize"] is None
        tree = ast.parse((pkg / "udfs.py").read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "open" not in names and "decorated" not in names and "os" not in imported
    assert events  # the trace did record sources


def test_udf_outside_a_run_is_a_plain_call_and_rejects_async():
    assert agent.parse_csv("name,department,salary\nA,B,1\n") == [{"name": "A", "department": "B", "salary": 1}]
    with pytest.raises(TypeError, match="async"):

        @eg.udf
        async def nope(x):
            return x
