"""em-core compatibility: its hand-written packages run as they are, its failure report, one answers format."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil
import subprocess
import sys

import pytest

import engrain as eg
from engrain._routines.loader import load_routine

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
EM_PACKAGE = FIXTURES / "emcore_csv_report"  # verbatim copy, see fixtures/PROVENANCE_emcore_csv_report.md
EXAMPLE = ROOT / "examples" / "csv_report"
PACKAGE = ROOT / "tests" / "fixtures" / "csv_report" / "routine"  # the example compiled (tests/test_examples.py checks it still is)


def _load(path: pathlib.Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


em_tools = _load(FIXTURES / "emcore_tools.py", "emcore_tools_fixture")
agent = _load(EXAMPLE / "agent.py", "csv_report_agent_emcore")
EXPECTED = json.loads((EM_PACKAGE / "expected_output.json").read_text())
INPUT = json.loads((EM_PACKAGE / "input.json").read_text())


class EmCoreStyleRegistry:
    """A registry with em-core's interface (register/has/call), as an em-core user would pass it."""

    def __init__(self, fns):
        self.fns = fns

    def has(self, name):
        return name in self.fns

    def call(self, name, args):
        return self.fns[name](**args)


@pytest.fixture
def j(tmp_path):
    return eg.open(f"sqlite:///{tmp_path / 'em.db'}")


def test_emcore_package_loads_with_a_conversion_report():
    assert eg.validate_routine(EM_PACKAGE, em_tools.tools) == []
    r = load_routine(EM_PACKAGE)
    assert r.dialect == "em-core" and r.trusted is False and r.udf_file == "udf.py"
    assert "input_schema -> inputs" in r.conversions
    assert "step check_rows: check -> expr" in r.conversions
    assert "step check_delimiter: field proceed: type confirm -> boolean" in r.conversions
    assert set(r.udfs) >= {"parse_and_clean", "summarize_rows", "is_ambiguous_delimiter", "count"}
    # Our own format is not converted.
    assert load_routine(PACKAGE).dialect == "engrain" and load_routine(PACKAGE).conversions == []


def test_emcore_package_runs_to_its_expected_output_with_emcore_keywords(j):
    res = eg.run_routine(routine_dir=EM_PACKAGE, input_data=INPUT, tool_registry=em_tools.tools, journal=j)
    assert res.status == "ok", res.error
    assert res.output == EXPECTED
    # udf.py is untrusted: every UDF (and the UDFs called from when/check) ran as a journaled sandboxed step.
    names = [e.name for e in j.read(res.run_id) if e.kind == "step.completed"]
    assert names == ["fetch_csv", "parse_and_clean", "count", "is_ambiguous_delimiter", "summarize_rows"]
    # An em-core style registry object works too.
    reg = EmCoreStyleRegistry({"fetch_csv": em_tools.fetch_csv.__wrapped__})
    again = eg.run_routine(routine_dir=EM_PACKAGE, input_data=INPUT, tool_registry=reg, journal=j)
    assert again.output == EXPECTED
    with pytest.raises(TypeError, match="routine_dir"):
        eg.run_routine(EM_PACKAGE, routine_dir=EM_PACKAGE)


def test_failure_report_names_step_type_and_message(j):
    reg = EmCoreStyleRegistry({"fetch_csv": lambda url: "name,department,hours,rate\n"})
    res = eg.run_routine(routine_dir=EM_PACKAGE, input_data=INPUT, tool_registry=reg, journal=j)
    assert res.status == "failed"
    assert (res.step_id, res.error_type, res.message) == ("check_rows", "AssertionFailed", "CSV file is empty — no rows parsed")
    assert "check_rows" in res.error and "CSV file is empty" in res.error  # the error string is kept
    d = res.to_dict()
    assert {k: d[k] for k in ("status", "step_id", "error_type", "message")} == {
        "status": "failed", "step_id": "check_rows", "error_type": "AssertionFailed", "message": "CSV file is empty — no rows parsed",
    }
    # The finished run answers with the same report from the journal.
    again = eg.run_routine(routine_dir=EM_PACKAGE, input_data=INPUT, tool_registry=reg, journal=j, run_id=res.run_id)
    assert (again.step_id, again.error_type, again.message, again.error) == (res.step_id, res.error_type, res.message, res.error)
    # A tool that raises: the step and the tool's own error type.
    boom = EmCoreStyleRegistry({"fetch_csv": lambda url: (_ for _ in ()).throw(ConnectionError("down"))})
    res = eg.run_routine(routine_dir=EM_PACKAGE, input_data=INPUT, tool_registry=boom, journal=j)
    assert (res.status, res.step_id, res.error_type, res.message) == ("failed", "fetch", "ConnectionError", "down")


def test_emcore_prompt_pauses_and_resumes_with_field_answers(j):
    ambiguous = "name;department,hours,rate\nA;Ops,1,2.0\n"  # ';' and ',' once each: em-core asks
    reg = EmCoreStyleRegistry({"fetch_csv": lambda url: ambiguous})
    res = eg.run_routine(routine_dir=EM_PACKAGE, input_data=INPUT, tool_registry=reg, journal=j)
    assert res.status == "needs_input" and res.prompt["step"] == "check_delimiter"
    assert [f["type"] for f in res.prompt["fields"]] == ["select", "boolean"]
    with pytest.raises(eg.RoutineInputError, match="delimiter"):
        eg.resume_routine(res.run_id, {"delimiter": "#"}, tools=reg, journal=j)
    done = eg.resume_routine(res.run_id, {"delimiter": ";", "proceed": "yes"}, tools=reg, journal=j)
    assert done.status == "ok", done.error
    assert done.output["total_rows"] == 1
    answered = [e.data["answers"] for e in j.read(res.run_id) if e.kind == "input.received"]
    assert answered == [{"delimiter": ";", "proceed": True}]


# --- one answers format -----------------------------------------------------------------------


def test_answers_field_form_and_step_form_are_equivalent(j):
    by_field = eg.run_routine(PACKAGE, agent.INPUTS, tools=agent.tools, journal=j, answers={"approved": True})
    by_step = eg.run_routine(PACKAGE, agent.INPUTS, tools=agent.tools, journal=j, answers={"step3": {"approved": True}})
    assert by_field.status == by_step.status == "ok"
    assert by_field.output == by_step.output
    paused = eg.run_routine(PACKAGE, agent.INPUTS, tools=agent.tools, journal=j)
    done = eg.resume_routine(paused.run_id, {"step3": {"approved": True}}, tools=agent.tools, journal=j)
    assert done.status == "ok" and done.output == by_field.output


@pytest.mark.parametrize(
    ("answers", "match"),
    [
        ([{"approved": True}], "must be a JSON object"),
        ("yes", "must be a JSON object"),
        ({"step3": {"approved": True}, "approved": True}, "mixes step ids"),
        ({"step9": {"approved": True}}, "no prompt.user step with this id"),
        ({"step3": {"approve": True}}, "approve"),
        ({"aproved": True}, "no prompt has a field"),
    ],
)
def test_wrong_answer_shapes_are_typed_errors(j, answers, match):
    with pytest.raises(eg.RoutineInputError, match=match):
        eg.run_routine(PACKAGE, agent.INPUTS, tools=agent.tools, journal=j, answers=answers)
    paused = eg.run_routine(PACKAGE, agent.INPUTS, tools=agent.tools, journal=j)
    with pytest.raises(eg.RoutineInputError, match=match):
        eg.resume_routine(paused.run_id, answers, tools=agent.tools, journal=j)
    assert j.get_run(paused.run_id).status == "needs_input"  # nothing was recorded


def test_resume_with_answers_for_another_step_is_refused(tmp_path, j):
    pkg = tmp_path / "two"
    pkg.mkdir()
    (pkg / "routine.yaml").write_text(
        "name: two\ninputs: {type: object}\nsteps:\n"
        "- {id: first, type: prompt.user, prompt: 'one?', fields: [{name: a, type: number}]}\n"
        "- {id: second, type: prompt.user, prompt: 'two?', fields: [{name: b, type: text}]}\n"
        "- {id: out, type: return, value: {a: '{{ first.a }}', b: '{{ second.b }}'}}\n"
    )
    paused = eg.run_routine(pkg, {}, journal=j)
    assert paused.prompt["step"] == "first"
    with pytest.raises(eg.RoutineInputError, match="waits at step 'first'"):
        eg.resume_routine(paused.run_id, {"second": {"b": "x"}}, journal=j)
    # Answering the current step and pre-answering the next one finishes the run.
    done = eg.resume_routine(paused.run_id, {"first": {"a": "2"}, "second": {"b": "x"}}, journal=j)
    assert done.status == "ok" and done.output == {"a": 2, "b": "x"}
    # The field form answers only the first prompt reached; the run pauses at the next.
    half = eg.run_routine(pkg, {}, journal=j, answers={"a": 1})
    assert half.status == "needs_input" and half.prompt["step"] == "second"


# --- CLI ---------------------------------------------------------------------------------------


def _cli(*args, cwd=None):
    import os
    import subprocess

    exe = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False)


def test_cli_runs_and_validates_the_emcore_package(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    tools = f"{FIXTURES / 'emcore_tools.py'}:tools"
    r = _cli("validate", str(EM_PACKAGE), "--tools", tools, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["valid"] and out["dialect"] == "em-core" and "output_schema -> output" in out["conversions"]
    r = _cli("validate", str(EM_PACKAGE))
    assert r.returncode == 0 and "converted: step check_rows: check -> expr" in r.stdout
    r = _cli("run", str(EM_PACKAGE), "--tools", tools, "--url", url, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["output"] == EXPECTED
    r = _cli("run", str(EM_PACKAGE), "--tools", tools, "--url", url)
    assert r.returncode == 0 and json.loads(r.stdout) == EXPECTED


def test_cli_failed_run_prints_the_failure_report(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    bad = tmp_path / "in.json"
    bad.write_text(json.dumps({"url": "fixture://nosuch.csv"}))
    tools = f"{FIXTURES / 'emcore_tools.py'}:tools"
    r = _cli("run", str(EM_PACKAGE), "--input", str(bad), "--tools", tools, "--url", url, "--json")
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert out["status"] == "failed" and out["step_id"] == "fetch" and out["error_type"] == "FileNotFoundError"
    assert "nosuch.csv" in out["message"] and out["error"].startswith("RoutineStepError")
    r = _cli("run", str(EM_PACKAGE), "--input", str(bad), "--tools", tools, "--url", url)
    assert r.returncode == 1 and "at step fetch" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_cli_answers_one_format_and_typed_errors(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    tools = f"{EXAMPLE / 'agent.py'}:tools"
    ans = tmp_path / "a.json"
    ans.write_text(json.dumps({"approved": True}))
    r = _cli("run", str(PACKAGE), "--tools", tools, "--url", url, "--answers", str(ans), "--json")
    assert r.returncode == 0, r.stderr
    ans.write_text(json.dumps(["approved"]))
    r = _cli("run", str(PACKAGE), "--tools", tools, "--url", url, "--answers", str(ans))
    assert r.returncode == 2 and "must be a JSON object" in r.stderr
    r = _cli("run", str(PACKAGE), "--tools", tools, "--url", url, "--json")
    paused = json.loads(r.stdout)
    ans.write_text(json.dumps({"step9": {"approved": True}}))
    r = _cli("resume", paused["run_id"], "--answers", str(ans), "--tools", tools, "--url", url)
    assert r.returncode == 2 and "step9" in r.stderr
    ans.write_text(json.dumps({"step3": {"approved": True}}))
    r = _cli("resume", paused["run_id"], "--answers", str(ans), "--tools", tools, "--url", url, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["status"] == "ok"


def test_emcore_schemas_folder_open_inputs_and_no_return(tmp_path, j):
    """Schemas from schemas/, inputs read by bare name without a schema, and em-core's context return."""
    pkg = tmp_path / "greet"
    (pkg / "schemas").mkdir(parents=True)
    (pkg / "routine.yaml").write_text(
        "version: '1'\nname: greet\nsteps:\n"
        "  - {id: s1, type: udf.call, function: greet, args: {name: '{{ name }}'}, save_as: greeting}\n"
        "  - {id: s2, type: assert, check: \"greeting != ''\"}\n"
    )
    (pkg / "udf.py").write_text("def greet(name: str) -> str:\n    return f'Hello {name}'\n")
    r = load_routine(pkg)
    assert r.dialect == "em-core" and r.inputs == {"type": "object"}
    assert any(c.startswith("no return step: returns the context") for c in r.conversions)
    res = eg.run_routine(pkg, {"name": "Alice"}, journal=j)
    assert res.status == "ok", res.error
    assert res.output == {"greeting": "Hello Alice"}
    (pkg / "schemas" / "input.schema.json").write_text(json.dumps(
        {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}))
    r = load_routine(pkg)
    assert "schemas/input.schema.json -> inputs" in r.conversions
    with pytest.raises(eg.RoutineInputError, match="name"):
        eg.run_routine(pkg, {"name": 7}, journal=j)
    assert eg.run_routine(pkg, {"name": "Bo"}, journal=j).output == {"greeting": "Hello Bo", "name": "Bo"}
    # A schema file that escapes the folder is refused, not read.
    (pkg / "schemas" / "output.schema.json").symlink_to("/etc/hostname")
    assert any("outside the routine folder" in i.message for i in eg.validate_routine(pkg))


def test_a_schema_file_nested_too_deeply_is_one_issue_naming_it(tmp_path):
    """A schemas/*.json within the size cap but nested 100k deep: an issue, not a RecursionError traceback."""
    pkg = tmp_path / "deep"
    shutil.copytree(EM_PACKAGE, pkg)
    (pkg / "schemas" / "input.schema.json").write_text("[" * 100_000 + "]" * 100_000)
    issues = eg.validate_routine(pkg)
    (issue,) = [i for i in issues if "nested too deeply" in i.message]
    assert issue.file == "schemas/input.schema.json", issues
    out = subprocess.run([sys.executable, "-m", "engrain", "validate", str(pkg)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr + out.stdout, out.stderr[-400:]
    assert "schemas/input.schema.json" in out.stdout + out.stderr
