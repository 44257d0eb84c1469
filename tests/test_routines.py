"""Routines: compile traces, validate packages, run them durably, resume after a prompt."""

from __future__ import annotations

import ast
import importlib.util
import json
import pathlib
import shutil
import sys

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import engrain as eg
from engrain._routines.loader import load_routine

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "csv_report"
PACKAGE = ROOT / "tests" / "fixtures" / "csv_report" / "routine"  # the example compiled (tests/test_examples.py checks it still is)


def _load_agent():
    spec = importlib.util.spec_from_file_location("csv_report_agent", EXAMPLE / "agent.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["csv_report_agent"] = mod
    spec.loader.exec_module(mod)
    return mod


agent = _load_agent()
EXPECTED = json.loads((PACKAGE / "expected_output.json").read_text())


def write(dir_: pathlib.Path, yaml_text: str, udfs: str | None = None) -> pathlib.Path:
    dir_.mkdir(parents=True, exist_ok=True)
    (dir_ / "routine.yaml").write_text(yaml_text)
    if udfs is not None:
        (dir_ / "udfs.py").write_text(udfs)
    return dir_


# --- compile --------------------------------------------------------------------------------


def test_example_trace_compiles_to_the_committed_package(tmp_path):
    """Golden test: recording the example agent again compiles to exactly the committed files."""
    j = eg.open(f"sqlite:///{tmp_path / 'rec.db'}")
    trace = agent.record(j)
    out = eg.compile_trace(trace, tmp_path / "pkg")
    for name in ("routine.yaml", "udfs.py", "input.json", "expected_output.json"):
        assert (out / name).read_text() == (PACKAGE / name).read_text(), name
    ast.parse((out / "udfs.py").read_text())
    assert eg.validate_routine(out, agent.tools) == []


def test_compiled_example_is_parameterized_by_provenance():
    steps = {s["id"]: s for s in load_routine(PACKAGE).raw["steps"]}
    assert steps["step1"]["args"] == {"source": "{{ inputs.source }}"}
    assert steps["step2"]["args"] == {"text": "{{ step1 }}"}
    assert steps["step3"]["type"] == "prompt.user"
    assert steps["step3"]["prompt"] == "Found 6 rows in {{ inputs.source }}. Build the report?"
    assert steps["step3"]["fields"] == [{"name": "approved", "type": "boolean", "default": True}]
    assert steps["result"]["value"] == {
        "title": "{{ inputs.title }}",
        "source": "{{ inputs.source }}",
        "departments": "{{ step5 }}",
    }


def test_our_trace_drops_failed_attempts(tmp_path):
    reg = eg.ToolRegistry()
    calls = {"n": 0}

    @eg.tool(registry=reg)
    def flaky(city: str) -> dict:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("down")
        return {"city": city, "temp": 21}

    def weather_agent(task, city):
        try:
            flaky(city)
        except ConnectionError:
            pass
        report = flaky(city)
        return {"summary": f"Weather in {report['city']}", "temp": report["temp"]}

    j = eg.open(f"sqlite:///{tmp_path / 'w.db'}")
    r = eg.run(weather_agent, "weather", inputs={"city": "Lisbon"}, journal=j)
    assert r.status == "ok", r.error
    from engrain._durable.trace import export_run

    out = eg.compile_trace(export_run(j, r.run_id), tmp_path / "pkg")
    raw = load_routine(out).raw
    assert [s["type"] for s in raw["steps"]] == ["tool.call", "return"]
    assert raw["steps"][0]["args"] == {"city": "{{ inputs.city }}"}
    assert raw["steps"][1]["value"] == {"summary": "Weather in {{ inputs.city }}", "temp": "{{ step1.temp }}"}
    res = eg.run_routine(out, {"city": "Porto"}, tools=reg, journal=j)
    assert res.status == "ok" and res.output == {"summary": "Weather in Porto", "temp": 21}
    paused = eg.run(agent.report_agent, "csv report", inputs=agent.INPUTS, journal=j)
    assert paused.status == "needs_input"
    with pytest.raises(eg.EngrainError, match="run.completed"):
        eg.compile_trace(export_run(j, paused.run_id), tmp_path / "nope")


EM_CORE = {
    "version": "1",
    "app": {"name": "Greeter App", "version": "2.0"},
    "mission": {"goal": "greet a user", "input_summary": {"name": "Marguerite", "user_id": 4242, "flag": True}},
    "events": [
        {"type": "tool_call", "seq": 0, "tool": "lookup_user", "args": {"id": 4242, "verbose": True}, "error": "timeout"},
        {"type": "tool_call", "seq": 1, "tool": "lookup_user", "args": {"id": 4242, "verbose": True},
         "result": {"email": "marguerite@example.org", "tags": ["vip", "beta"], "n": 1}},
        {"type": "udf_call", "seq": 2, "function": "make-greeting!",
         "args": {"class": "Marguerite", "my-arg": {"mail": "marguerite@example.org"}, "_x": 1},
         "result": "Hello Marguerite"},
        {"type": "approval", "seq": 3, "prompt": "Send mail to marguerite@example.org?", "answer": True},
        {"type": "tool_call", "seq": 4, "tool": "send_mail",
         "args": {"to": "marguerite@example.org", "body": "Hello Marguerite, welcome!", "count": 1}, "result": "sent-77"},
    ],
    "final_output": {"status": "sent-77", "greeting": "Hello Marguerite", "flag": True},
}


def _em_tools(sent: list) -> eg.ToolRegistry:
    reg = eg.ToolRegistry()

    def lookup_user(id: int, verbose: bool) -> dict:
        return {"email": "marguerite@example.org" if id == 4242 else f"user{id}@example.org", "tags": [], "n": 1}

    def send_mail(to: str, body: str, count: int) -> str:
        sent.append((to, body))
        return f"sent-{len(sent)}"

    reg.register("lookup_user", lookup_user)
    reg.register("send_mail", send_mail)
    return reg


def test_em_core_trace_imports(tmp_path):
    trace_file = tmp_path / "em.json"
    trace_file.write_text(json.dumps(EM_CORE))
    out = eg.compile_trace(trace_file, tmp_path / "pkg")
    raw = load_routine(out).raw
    assert raw["name"] == "greeter-app" and raw["trusted"] is False and raw["version"] == "2.0"
    types = [s["type"] for s in raw["steps"]]
    assert types == ["tool.call", "udf.call", "prompt.user", "assert", "tool.call", "return"]  # failed attempt dropped
    s = {x["id"]: x for x in raw["steps"]}
    assert s["step1"]["args"] == {"id": "{{ inputs.user_id }}", "verbose": True}  # bool is no evidence
    assert s["step2"]["args"] == {"class": "{{ inputs.name }}", "my-arg": {"mail": "{{ step1.email }}"}, "_x": 1}
    assert s["step3"]["fields"] == [{"name": "approved", "type": "boolean", "default": True}]
    assert s["step3"]["prompt"] == "Send mail to {{ step1.email }}?"
    # Inputs win over results; substrings are templated inside a longer string.
    assert s["step5"]["args"] == {"to": "{{ step1.email }}", "body": "{{ step2 }}, welcome!", "count": 1}
    assert s["result"]["value"] == {"status": "{{ step5 }}", "greeting": "{{ step2 }}", "flag": True}
    src = (out / "udfs.py").read_text()
    ast.parse(src)
    assert "def make_greeting(**kwargs):" in src
    assert json.loads((out / "input.json").read_text()) == EM_CORE["mission"]["input_summary"]

    sent: list = []
    j = eg.open(f"sqlite:///{tmp_path / 'em.db'}")
    res = eg.run_routine(out, EM_CORE["mission"]["input_summary"], tools=_em_tools(sent), journal=j, answers={"step3": {}})
    assert res.status == "ok", res.error
    assert res.output == {"status": "sent-1", "greeting": "Hello Marguerite", "flag": True}
    assert sent == [("marguerite@example.org", "Hello Marguerite, welcome!")]
    # Other inputs reach the UDF with arguments it never saw: a clear UnknownInputError.
    other = eg.run_routine(out, {"name": "Bob", "user_id": 7, "flag": False}, tools=_em_tools(sent), journal=j, answers={"step3": {}})
    assert other.status == "failed" and "UnknownInputError" in other.error and "step2" in other.error


def test_compiled_example_udfs_are_the_real_functions():
    """The example agent's @eg.udf functions are written into udfs.py as their own source."""
    spec = importlib.util.spec_from_file_location("pkg_udfs", PACKAGE / "udfs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.parse_csv((EXAMPLE / "data" / "contractors.csv").read_text())  # never seen by the trace
    assert rows == agent.parse_csv.__wrapped__((EXAMPLE / "data" / "contractors.csv").read_text())
    assert mod.summarize(rows) == agent.summarize.__wrapped__(rows)
    assert "_replay" not in (PACKAGE / "udfs.py").read_text()
    assert "trusted: false" in (PACKAGE / "routine.yaml").read_text()  # compiled routines are not trusted


# --- run / resume ---------------------------------------------------------------------------


def test_run_needs_input_then_resume(journal):
    res = eg.run_routine(PACKAGE, agent.INPUTS, tools=agent.tools, journal=journal)
    assert res.status == "needs_input"
    assert res.prompt["step"] == "step3"
    assert res.prompt["prompt"] == "Found 6 rows in employees.csv. Build the report?"
    assert res.prompt["fields"][0]["name"] == "approved"
    with pytest.raises(eg.RoutineInputError, match="approved"):
        eg.resume_routine(res.run_id, {"approved": "maybe"}, tools=agent.tools, journal=journal)
    with pytest.raises(eg.RoutineInputError, match="nope"):
        eg.resume_routine(res.run_id, {"nope": 1}, tools=agent.tools, journal=journal)
    done = eg.resume_routine(res.run_id, {"approved": "true"}, tools=agent.tools, journal=journal)
    assert done.status == "ok" and done.output == EXPECTED
    assert done.replayed >= 2  # the tool and the UDF were not called again
    kinds = [e.kind for e in journal.read(res.run_id)]
    assert kinds.count("step.completed") == 3 and kinds[-1] == "run.completed"
    started = journal.read(res.run_id)[0].data
    assert started["inputs"]["routine"] == str(PACKAGE) and "routine" in started["tags"]


def test_run_with_answers_and_decline(tmp_path):
    j = eg.open(f"sqlite:///{tmp_path / 'a.db'}")
    ok = eg.run_routine(PACKAGE, agent.INPUTS, tools=agent.tools, journal=j, answers={"step3": {}})
    assert ok.status == "ok" and ok.output == EXPECTED
    no = eg.run_routine(PACKAGE, agent.INPUTS, tools=agent.tools, journal=j, answers={"step3": {"approved": False}})
    assert no.status == "failed" and "step4" in no.error and "not approved" in no.error


def test_bad_inputs_raise_typed_error_naming_field(tmp_path):
    j = eg.open(f"sqlite:///{tmp_path / 'b.db'}")
    with pytest.raises(eg.RoutineInputError, match="title"):
        eg.run_routine(PACKAGE, {"source": "employees.csv"}, tools=agent.tools, journal=j)
    with pytest.raises(eg.RoutineInputError, match="inputs.source"):
        eg.run_routine(PACKAGE, {"source": 3, "title": "x"}, tools=agent.tools, journal=j)
    deep: dict = {}
    at = deep
    for _ in range(5000):  # the schema validator would stop with a RecursionError
        at["a"] = at = {}
    with pytest.raises(eg.RoutineInputError, match=r"inputs\.extra\.a\.a.*…: is nested deeper than 100 levels"):
        eg.run_routine(PACKAGE, {"source": "employees.csv", "title": "x", "extra": deep}, tools=agent.tools, journal=j)
    assert j.runs() == []  # nothing journaled for a run that never started


ROUTINE_FEATURES = """
name: features
trusted: true
inputs:
  type: object
  properties: {n: {type: integer}, who: {type: string}}
  required: [n, who]
output: {type: object, required: [total], properties: {total: {type: number}}}
tools:
  add: {args: {type: object, properties: {a: {type: integer}}}, result: {type: integer}}
steps:
- id: big
  type: udf.call
  function: double
  args: {x: "{{ inputs.n }}"}
  when: inputs.n > 10
- id: q
  type: prompt.user
  prompt: "How many extra for {{ inputs.who }}?"
  fields:
  - {name: extra, type: number}
  - {name: color, type: select, options: [red, blue], default: red}
- id: sum
  type: tool.call
  tool: add
  args: {a: "{{ inputs.n }}", b: "{{ q.extra }}"}
- id: check
  type: assert
  expr: sum >= 0
  message: "negative total {{ sum }}"
- id: out
  type: return
  value: {total: "{{ sum }}", color: "{{ q.color }}"}
"""


def _add_tools(calls: list) -> eg.ToolRegistry:
    reg = eg.ToolRegistry()

    def add(a, b):
        calls.append((a, b))
        return a + b

    reg.register("add", add)
    return reg


def test_when_skips_prompt_numbers_and_schemas(tmp_path):
    pkg = write(tmp_path / "f", ROUTINE_FEATURES, "def double(x):\n    return 2 * x\n")
    assert eg.validate_routine(pkg) == []
    j = eg.open(f"sqlite:///{tmp_path / 'f.db'}")
    calls: list = []
    reg = _add_tools(calls)
    res = eg.run_routine(pkg, {"n": 3, "who": "Ann"}, tools=reg, journal=j)
    assert res.status == "needs_input" and res.prompt["prompt"] == "How many extra for Ann?"
    # `when` was false: the UDF step was skipped and nothing was journaled for it.
    assert not any(e.kind.startswith("step.") for e in j.read(res.run_id))
    with pytest.raises(eg.RoutineInputError, match="extra"):
        eg.resume_routine(res.run_id, {"extra": "lots"}, tools=reg, journal=j)
    with pytest.raises(eg.RoutineInputError, match="color"):
        eg.resume_routine(res.run_id, {"extra": "4", "color": "green"}, tools=reg, journal=j)
    done = eg.resume_routine(res.run_id, {"extra": "4"}, tools=reg, journal=j)  # number parsed from a string
    assert done.status == "ok" and done.output == {"total": 7, "color": "red"}
    assert calls == [(3, 4)]
    # Assert failure names the step and renders its message.
    bad = eg.run_routine(pkg, {"n": 3, "who": "x"}, tools=reg, journal=j, answers={"q": {"extra": -10}})
    assert bad.status == "failed" and "check" in bad.error and "negative total -7" in bad.error
    # Tool args schema: `a` must be an integer.
    reg2 = _add_tools([])
    reg2.register("add", lambda a, b: "not an int")
    res3 = eg.run_routine(pkg, {"n": 3, "who": "x"}, tools=reg2, journal=j, answers={"q": {"extra": 1}})
    assert res3.status == "failed" and "sum" in res3.error and "result" in res3.error


def test_when_true_runs_udf_and_output_schema(tmp_path):
    text = ROUTINE_FEATURES.replace('value: {total: "{{ sum }}", color: "{{ q.color }}"}', 'value: {total: "{{ big }}"}')
    pkg = write(tmp_path / "g", text, "def double(x):\n    return 2 * x\n")
    j = eg.open(f"sqlite:///{tmp_path / 'g.db'}")
    res = eg.run_routine(pkg, {"n": 11, "who": "x"}, tools=_add_tools([]), journal=j, answers={"q": {"extra": 1}})
    assert res.status == "ok" and res.output == {"total": 22}
    text2 = ROUTINE_FEATURES.replace('value: {total: "{{ sum }}", color: "{{ q.color }}"}', 'value: {total: "{{ inputs.who }}"}')
    pkg2 = write(tmp_path / "h", text2, "def double(x):\n    return 2 * x\n")
    res2 = eg.run_routine(pkg2, {"n": 1, "who": "x"}, tools=_add_tools([]), journal=j, answers={"q": {"extra": 1}})
    assert res2.status == "failed" and "output.total" in res2.error


# --- validate -------------------------------------------------------------------------------

BROKEN = """
name: broken
inputs: {type: object}
colour: blue
steps:
- id: a
  type: tool.call
  tool: nowhere
  args: {x: "{{ later.value }}"}
  bogus: 1
- id: a
  type: udf.call
  function: missing_fn
- id: c
  type: assert
  expr: "len(a) >"
- id: d
  type: assert
  expr: "evil(a)"
- id: e
  type: prompt.user
  prompt: pick
  fields:
  - {name: choice, type: select}
- id: later
  type: udf.call
  function: needs_two
  args: {a: 1, z: 2}
"""

UDFS_WITH_SIDE_EFFECT = """
import pathlib
pathlib.Path(__file__).with_name("EXECUTED").write_text("validation ran udfs.py")

def needs_two(a, b):
    return a + b
"""


def test_validate_reports_file_step_and_field(tmp_path):
    pkg = write(tmp_path / "broken", BROKEN, UDFS_WITH_SIDE_EFFECT)
    issues = eg.validate_routine(pkg, tools=eg.ToolRegistry())
    found = {(i.file, i.step, i.field) for i in issues}
    expected = {
        ("routine.yaml", None, "colour"),  # unknown top-level key
        ("routine.yaml", "a", "bogus"),  # unknown step key
        ("routine.yaml", "a", "tool"),  # tool not in the registry
        ("routine.yaml", "a", "args"),  # undefined template variable (later is defined afterwards)
        ("routine.yaml", "a", "id"),  # duplicate id
        ("routine.yaml", "a", "function"),  # udf not defined in udfs.py
        ("routine.yaml", "c", "expr"),  # syntax error
        ("routine.yaml", "d", "expr"),  # unknown function
        ("routine.yaml", "e", "fields.choice.options"),  # select without options
        ("routine.yaml", "later", "args.b"),  # missing UDF argument
        ("routine.yaml", "later", "args.z"),  # unexpected UDF argument
        ("routine.yaml", None, "steps"),  # missing return
    }
    assert expected <= found, sorted(found)
    assert all(i.message for i in issues)
    assert not (pkg / "EXECUTED").exists()  # validation parsed udfs.py, never ran it
    with pytest.raises(eg.RoutineError) as e:
        load_routine(pkg)
    assert "missing_fn" in str(e.value) and len(e.value.issues) == len(issues) - 1  # no registry: tools unchecked


def test_validate_yaml_and_udfs_syntax_errors(tmp_path):
    pkg = write(tmp_path / "y", "name: [unclosed\n")
    (issue,) = eg.validate_routine(pkg)
    assert issue.file == "routine.yaml" and "YAML" in issue.message
    pkg2 = write(tmp_path / "z", "name: z\ninputs: {type: object}\nsteps:\n- {id: r, type: return, value: 1}\n", "def f(:\n")
    assert [(i.file, i.field) for i in eg.validate_routine(pkg2)] == [("udfs.py", "line 1")]
    pkg3 = write(tmp_path / "s", "!!python/object/apply:os.system ['echo pwned']\n")
    assert "YAML" in eg.validate_routine(pkg3)[0].message  # safe loader only
    assert eg.validate_routine(PACKAGE, agent.tools) == []


def test_udfs_symlink_outside_root_is_refused(tmp_path):
    pkg = tmp_path / "pkg"
    shutil.copytree(PACKAGE, pkg)
    outside = tmp_path / "outside.py"
    outside.write_text("def parse_csv(text):\n    return []\n")
    (pkg / "udfs.py").unlink()
    (pkg / "udfs.py").symlink_to(outside)
    issues = eg.validate_routine(pkg)
    assert issues and issues[0].file == "udfs.py" and "outside" in issues[0].message


def test_load_routine_is_cached_until_files_change(tmp_path):
    pkg = tmp_path / "pkg"
    shutil.copytree(PACKAGE, pkg)
    a = load_routine(pkg)
    assert load_routine(pkg) is a
    text = (pkg / "routine.yaml").read_text().replace("version: '1'", "version: '2'")
    (pkg / "routine.yaml").write_text(text)
    b = load_routine(pkg)
    assert b is not a and b.version == "2"


# --- sandbox --------------------------------------------------------------------------------


def test_untrusted_routine_runs_udfs_in_the_sandbox(tmp_path, monkeypatch):
    from engrain import _sandbox

    pkg = tmp_path / "pkg"
    shutil.copytree(PACKAGE, pkg)
    assert load_routine(pkg).trusted is False  # as compiled
    used: list[str] = []
    real = _sandbox.SandboxUdfHost.call

    def spy(self, name, args):
        used.append(name)
        return real(self, name, args)

    monkeypatch.setattr(_sandbox.SandboxUdfHost, "call", spy)
    j = eg.open(f"sqlite:///{tmp_path / 's.db'}")
    res = eg.run_routine(pkg, agent.INPUTS, tools=agent.tools, journal=j, answers={"step3": {}})
    assert res.status == "ok", res.error
    assert res.output == EXPECTED
    assert used == ["parse_csv", "summarize"]
    # A human marks the routine trusted: its UDFs then run natively.
    (pkg / "routine.yaml").write_text((pkg / "routine.yaml").read_text().replace("trusted: false", "trusted: true"))
    used.clear()
    res = eg.run_routine(pkg, agent.INPUTS, tools=agent.tools, journal=j, answers={"step3": {}})
    assert res.status == "ok" and res.output == EXPECTED and used == []


# --- generated Python is always valid -------------------------------------------------------


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# "\ufb00" (the ff ligature) folds to "ff" in Python identifiers: both as parameters would collide.
@example(calls=[("f", {"ff": 1, "\ufb00": 2}, 3)])
# "U" and "u" are two functions: their replay tables must not share a name.
@example(calls=[("U", {"a": 1}, 1), ("u", {}, 2)])
@given(
    calls=st.lists(
        st.tuples(st.text(min_size=1, max_size=10), st.dictionaries(st.text(max_size=8), _json, max_size=3), _json),
        min_size=1,
        max_size=3,
    )
)
def test_compiled_udfs_are_valid_python_for_any_names(tmp_path_factory, calls):
    trace = {
        "version": "1",
        "app": {"name": "fuzz"},
        "mission": {"goal": "fuzz", "input_summary": {"q": "some input"}},
        "events": [
            {"type": "udf_call", "seq": i, "function": fn, "args": args, "result": result}
            for i, (fn, args, result) in enumerate(calls)
        ],
        "final_output": None,
    }
    out = eg.compile_trace(trace, tmp_path_factory.mktemp("fuzz"))  # validates the package too
    source = (out / "udfs.py").read_text()
    ast.parse(source)
    spec = importlib.util.spec_from_file_location(f"fuzz_udfs_{out.name}", out / "udfs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    step = load_routine(out).raw["steps"][0]
    assert getattr(mod, step["function"])(**calls[0][1]) == calls[0][2]


def test_expression_calls_udf_as_journaled_step(tmp_path):
    pkg = write(
        tmp_path / "e",
        """
name: expr-udf
trusted: true
inputs: {type: object, properties: {n: {type: integer}}, required: [n]}
steps:
- {id: gate, type: assert, expr: "is_even(inputs.n) and len(str(inputs.n)) < 4", message: "odd: {{ inputs.n }}"}
- {id: out, type: return, value: "{{ inputs.n }}"}
""",
        "def is_even(x):\n    return x % 2 == 0\n",
    )
    j = eg.open(f"sqlite:///{tmp_path / 'e.db'}")
    ok = eg.run_routine(pkg, {"n": 4}, journal=j)
    assert ok.status == "ok" and ok.output == 4
    started = [e for e in j.read(ok.run_id) if e.kind == "step.completed"]
    assert [(e.name, e.data["type"], e.data["args"]) for e in started] == [("is_even", "udf", {"x": 4})]
    bad = eg.run_routine(pkg, {"n": 5}, journal=j)
    assert bad.status == "failed" and "odd: 5" in bad.error


def test_crashed_routine_run_resumes_without_redoing_steps(tmp_path):
    j = eg.open(f"sqlite:///{tmp_path / 'c.db'}")
    fetched: list[str] = []
    crash = {"on": True}
    reg = eg.ToolRegistry()

    def fetch_csv(source):
        fetched.append(source)
        return agent.fetch_csv.__wrapped__(source)

    reg.register("fetch_csv", fetch_csv)
    pkg = tmp_path / "pkg"
    shutil.copytree(PACKAGE, pkg)
    (pkg / "routine.yaml").write_text((pkg / "routine.yaml").read_text().replace("trusted: false", "trusted: true"))
    routine = load_routine(pkg)
    from engrain._routines import runner as _runner

    real_summarize = _runner._udf_module(routine).summarize

    def dying_summarize(rows):
        if crash["on"]:
            raise KeyboardInterrupt  # the process "dies" mid-step
        return real_summarize(rows)

    _runner._udf_module(routine).summarize = dying_summarize
    with pytest.raises(KeyboardInterrupt):
        eg.run_routine(pkg, agent.INPUTS, tools=reg, run_id="crash-1", journal=j, answers={"step3": {}})
    crash["on"] = False
    res = eg.run_routine(pkg, agent.INPUTS, tools=reg, run_id="crash-1", journal=j, answers={"step3": {}})
    assert res.status == "ok" and res.output == EXPECTED
    assert fetched == ["employees.csv"]  # the tool ran once; the journal replayed it
    # The crashed attempt left nothing (completion-only step); the step ran again, once.
    done = [e for e in j.read("crash-1") if e.name == "summarize" and e.kind.startswith("step.")]
    assert [e.kind for e in done] == ["step.completed"]


def test_keys_a_dotted_path_cannot_name_and_literal_braces(tmp_path):
    """Provenance through ``_id`` / ``my key`` keys uses bracket paths; recorded ``{{`` text stays literal."""
    trace = {
        "version": "1", "app": {"name": "t", "version": "1"},
        "mission": {"goal": "copy a record", "input_summary": {"rec": {"_id": "abc123", "my key": "hello world"}}},
        "events": [
            {"type": "tool_call", "seq": 1, "tool": "get", "args": {"id": "abc123", "k": "hello world"},
             "result": {"_id": "zz9", "text": "Hello {{name}} there"}},
            {"type": "tool_call", "seq": 2, "tool": "put", "args": {"id": "zz9", "t": "Hello {{name}} there"}, "result": "ok"},
        ],
        "final_output": "ok",
    }
    out = eg.compile_trace(trace, tmp_path / "r")
    assert eg.validate_routine(out) == []
    reg, sent = eg.ToolRegistry(), []

    @eg.tool(registry=reg)
    def get(id: str, k: str) -> dict:
        return {"_id": id[::-1], "text": "Hi {{x}} " + k}

    @eg.tool(registry=reg)
    def put(id: str, t: str) -> str:
        sent.append((id, t))
        return "ok"

    j = eg.open(f"sqlite:///{tmp_path / 'e.db'}")
    res = eg.run_routine(out, {"rec": {"_id": "q1", "my key": "bye"}}, tools=reg, journal=j)
    assert res.status == "ok", res.error
    assert sent == [("1q", "Hi {{x}} bye")]


def test_trace_of_a_routine_run_compiles_with_the_routines_inputs(tmp_path):
    j = eg.open(f"sqlite:///{tmp_path / 'e.db'}")
    res = eg.run_routine(PACKAGE, agent.INPUTS, tools=agent.tools, journal=j, answers={"step3": {}})
    assert res.status == "ok", res.error
    from engrain._durable.trace import export_run

    out = eg.compile_trace(export_run(j, res.run_id), tmp_path / "again")
    assert json.loads((out / "input.json").read_text()) == agent.INPUTS
    again = eg.run_routine(out, agent.INPUTS, tools=agent.tools, journal=j, answers={"step3": {}})
    assert again.status == "ok" and again.output == res.output


def _fresh_load(path):
    from engrain._routines import loader

    loader._cache.clear()  # the in-process cache would answer first
    return loader.load_routine(path)


def test_parsed_routine_yaml_is_cached_by_content_and_verified(tmp_path, monkeypatch):
    """The CLI skips PyYAML on a known routine.yaml; an entry that is not exactly ours is not used."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ENGRAIN_CACHE_DIR", str(cache))
    pkg = tmp_path / "pkg"
    shutil.copytree(PACKAGE, pkg)
    first = _fresh_load(pkg)
    (entry,) = (cache / "routines-2").iterdir()
    assert oct((cache / "routines-2").stat().st_mode & 0o777) == "0o700" and oct(entry.stat().st_mode & 0o777) == "0o600"
    assert entry.name == f"{__import__('hashlib').sha256((pkg / 'routine.yaml').read_bytes()).hexdigest()}.json"
    assert _fresh_load(pkg).raw == first.raw and first.trusted is False

    # A planted entry for this very text that flips trusted: without a matching hash it is ignored.
    head, _, payload = entry.read_bytes().partition(b"\n")
    forged = payload.replace(b'"trusted":false', b'"trusted":true')
    assert forged != payload
    entry.write_bytes(head + b"\n" + forged)
    assert _fresh_load(pkg).trusted is False
    # With a matching hash but writable by others, it is ignored too (and so is a symlink).
    entry.write_bytes(__import__("hashlib").sha256(forged).hexdigest().encode() + b"\n" + forged)
    entry.chmod(0o666)
    assert _fresh_load(pkg).trusted is False
    entry.unlink()
    other = tmp_path / "elsewhere.json"
    other.write_bytes(__import__("hashlib").sha256(forged).hexdigest().encode() + b"\n" + forged)
    other.chmod(0o600)
    entry.symlink_to(other)
    assert _fresh_load(pkg).trusted is False


def test_routine_yaml_that_json_cannot_hold_exactly_is_not_cached(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("ENGRAIN_CACHE_DIR", str(cache))
    pkg = write(tmp_path / "p", "name: p\ninputs: {type: object}\nsteps:\n- {id: r, type: return, value: {1: 2024-01-01}}\n")
    with pytest.raises(eg.RoutineError, match=r"steps\[0\]\.value: line 4: key 1 is not a string"):
        _fresh_load(pkg)
    assert list((cache / "routines-2").iterdir()) == []  # refused, and nothing kept
    (cache / "routines-2").chmod(0o777)  # a directory others can write is not used at all
    pkg2 = write(tmp_path / "q", "name: q\ninputs: {type: object}\nsteps:\n- {id: r, type: return, value: 1}\n")
    assert _fresh_load(pkg2).name == "q"
    assert list((cache / "routines-2").iterdir()) == []
