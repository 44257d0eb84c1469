"""Routines from outside, second pass: provenance coincidences, shared constants, hostile traces and schemas."""

from __future__ import annotations

import json
import pathlib
import time

import pytest

import engrain as eg
from engrain._errors import EngrainError
from engrain._routines.loader import load_routine


def _emcore(inputs: dict, args: dict) -> dict:
    return {"version": "1", "app": {"name": "probe"}, "mission": {"goal": "g", "input_summary": inputs},
            "events": [{"type": "tool_call", "seq": 0, "tool": "fetch", "args": args, "result": {"ok": True}}],
            "final_output": {"ok": True}}


def _package(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "routine.yaml").write_text(text)
    return pkg


def _journal(tmp_path: pathlib.Path):
    return eg.open(f"sqlite:///{tmp_path / 'j.db'}")


# --- provenance: a value is templated only where it came from ---------------------------------


def test_an_input_inside_a_longer_word_is_not_templated(tmp_path):
    """Input "test" inside ".../latest/..." is a coincidence: another user must not fetch ".../labob/...". """
    trace = _emcore({"user": "test", "year": "2024"},
                    {"url": "https://x.io/latest/items", "who": "test", "file": "report-2024.csv",
                     "id": "120240", "greeting": "Hi test!"})
    args = load_routine(eg.compile_trace(trace, tmp_path / "pkg")).raw["steps"][0]["args"]
    assert args["url"] == "https://x.io/latest/items"
    assert args["id"] == "120240"  # 2024 inside a longer number
    assert args["who"] == "{{ inputs.user }}"
    assert args["file"] == "report-{{ inputs.year }}.csv"  # whole words are still templated
    assert args["greeting"] == "Hi {{ inputs.user }}!"


@pytest.mark.parametrize("key", ["cafe\u0301", "a\u00b7b"])
def test_input_keys_a_dotted_path_cannot_spell_still_compile(tmp_path, key):
    """An identifier with a combining accent or a middle dot is read with ["key"], not a dotted path that fails."""
    out = eg.compile_trace(_emcore({key: "Marguerite"}, {"who": "Marguerite"}), tmp_path / "pkg")
    assert load_routine(out).raw["steps"][0]["args"] == {"who": f'{{{{ inputs["{key}"] }}}}'}
    reg = eg.ToolRegistry()
    reg.register("fetch", lambda who: {"ok": who == "Bob"})
    res = eg.run_routine(out, {key: "Bob"}, tools=reg, journal=_journal(tmp_path))
    assert res.status == "ok" and res.output == {"ok": True}, res.error


# --- a loaded routine is shared: what a run is handed must be its own --------------------------


def test_a_tool_or_caller_mutating_constants_does_not_change_later_runs(tmp_path):
    pkg = _package(tmp_path, """
name: m
inputs: {type: object}
steps:
  - {id: s1, type: tool.call, tool: add, args: {items: [1, 2]}}
  - {id: r, type: return, value: {tags: [a, b], n: "{{ s1 }}"}}
""")
    reg = eg.ToolRegistry()

    def add(items: list) -> int:
        items.append(99)  # a tool may change what it is given
        return len(items)

    reg.register("add", add)
    j = _journal(tmp_path)
    for _ in range(3):
        res = eg.run_routine(pkg, {}, tools=reg, journal=j)
        assert res.status == "ok" and res.output == {"tags": ["a", "b"], "n": 3}, res.output
        res.output["tags"].append("x")  # and so may the caller
    assert load_routine(pkg).steps[0].spec["args"] == {"items": [1, 2]}


# --- hostile traces: typed errors, never a raw one ----------------------------------------------


def test_a_lone_surrogate_in_a_trace_compiles_and_round_trips(tmp_path):
    """JSON may hold "\\ud800" (json.loads accepts it); UTF-8 cannot, so writing input.json used to raise."""
    trace_file = tmp_path / "t.json"
    trace_file.write_text('{"version": "1", "app": {"name": "s"}, "mission": {"input_summary": {"q": "ab\\ud800cd"}},'
                          ' "events": [], "final_output": "x\\udfff"}')
    out = eg.compile_trace(trace_file, tmp_path / "pkg")
    assert json.loads((out / "input.json").read_text()) == {"q": "ab\ud800cd"}
    assert json.loads((out / "expected_output.json").read_text()) == "x\udfff"


def _engrain_trace(step_data: dict) -> dict:
    return {"format": "engrain.trace/1", "run": {"run_id": "r1", "task": "t"}, "events": [
        {"kind": "run.started", "name": "t", "data": {"task": "t", "inputs": {}}},
        {"kind": "step.completed", "name": "f", "data": {"call_id": 0, "result": 1, **step_data}},
        {"kind": "run.completed", "name": "t", "data": {"output": 1}}]}


@pytest.mark.parametrize("digest", [["a"], {"a": 1}])
def test_a_udf_digest_that_is_no_string_is_not_a_raw_type_error(tmp_path, digest):
    udf = {"name": "f", "source": "def f(x):\n    return 1\n", "sha256": digest}
    trace = _engrain_trace({"type": "udf", "args": {"x": 5}, "udf": udf})
    try:
        out = eg.compile_trace(trace, tmp_path / "pkg")
    except EngrainError:
        return
    assert (out / "udfs.py").exists()


def test_completion_args_that_are_no_object_are_a_trace_error_naming_the_field(tmp_path):
    with pytest.raises(eg.TraceError, match=r"events\[1\]\.data\.args"):
        eg.compile_trace(_engrain_trace({"type": "tool", "args": [1, 2]}), tmp_path / "pkg")


# --- hostile schemas in routine.yaml --------------------------------------------------------------


_PATTERN = """
name: m
inputs: {type: object, properties: {a: {type: string, pattern: "%s"}}}
steps:
  - {id: r, type: return, value: "{{ inputs.a }}"}
"""


@pytest.mark.parametrize("pattern", ["^(a|a)*$", "^(a|aa)+$", "^(\\\\w|\\\\w)*$"])
def test_a_backtracking_bomb_pattern_stops_at_its_deadline_naming_the_field(tmp_path, pattern):
    """``^(a|a)*$`` on 40 a's and a '!' takes hours in Python's re; a run must fail at once instead."""
    pkg = _package(tmp_path, _PATTERN % pattern)
    assert eg.validate_routine(pkg) == []  # a pattern is not refused for what it might do
    t0 = time.monotonic()
    with pytest.raises(eg.RoutineInputError, match=r"inputs\.a.*longer than") as e:
        eg.run_routine(pkg, {"a": "a" * 40 + "!"}, journal=_journal(tmp_path))
    assert time.monotonic() - t0 < 5, e.value
    assert eg.run_routine(pkg, {"a": "a" * 40}, journal=_journal(tmp_path)).output == "a" * 40


@pytest.mark.parametrize("schema", [
    '{type: object, properties: {a: {type: string, pattern: "^(a|a)*$", minLength: 1}}, "$defs": {}}',
    '{type: object, properties: {a: {type: object, patternProperties: {"^(a|a)*$": {type: string}}}}}',
    '{type: object, properties: {a: {type: object, patternProperties: {"^(a|a)*$": true}, '
    'additionalProperties: false}}}',
])
def test_every_keyword_that_matches_a_pattern_has_the_deadline(tmp_path, schema):
    """Schemas beyond the fast path go to jsonschema, whose own keywords call re; engrain's replace them."""
    pkg = _package(tmp_path, f"""
name: m
inputs: {schema}
steps:
  - {{id: r, type: return, value: "done"}}
""")
    value = "a" * 40 + "!"
    t0 = time.monotonic()
    with pytest.raises(eg.RoutineInputError, match="longer than"):
        eg.run_routine(pkg, {"a": {value: "x"} if "patternProperties" in schema else value},
                       journal=_journal(tmp_path))
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("pattern", ["^[a-z]+$", "^\\\\d+(\\\\.\\\\d+)?$", "^(\\\\d{1,3}\\\\.){3}\\\\d{1,3}$", "^(a++)+$", "^(ab)+$",
                                     "^([a-z0-9]+-)*[a-z0-9]+$", "^(\\\\s*,\\\\s*\\\\w+)*$"])
def test_ordinary_patterns_still_validate_and_run(tmp_path, pattern):
    pkg = _package(tmp_path, _PATTERN % pattern)
    assert eg.validate_routine(pkg) == []
    with pytest.raises(eg.RoutineInputError, match="inputs.a"):
        eg.run_routine(pkg, {"a": "?" * 40}, journal=_journal(tmp_path))


@pytest.mark.parametrize("ref", ["#/$defs/missing", "http://127.0.0.1:9/schema.json", "file:///etc/passwd"])
def test_an_unresolvable_ref_is_an_issue_naming_the_field_not_a_raw_jsonschema_error(tmp_path, ref):
    pkg = _package(tmp_path, f"""
name: m
inputs: {{type: object, properties: {{a: {{$ref: "{ref}"}}}}}}
steps:
  - {{id: r, type: return, value: "{{{{ inputs.a }}}}"}}
""")
    issues = eg.validate_routine(pkg)
    assert len(issues) == 1 and issues[0].field == "inputs" and ref in issues[0].message
    with pytest.raises(eg.RoutineError):
        eg.run_routine(pkg, {"a": "x"}, journal=_journal(tmp_path))


def test_a_local_ref_still_validates_and_runs(tmp_path):
    pkg = _package(tmp_path, """
name: m
inputs: {type: object, $defs: {s: {type: string}}, properties: {a: {$ref: "#/$defs/s"}}}
steps:
  - {id: r, type: return, value: "{{ inputs.a }}"}
""")
    assert eg.validate_routine(pkg) == []
    j = _journal(tmp_path)
    assert eg.run_routine(pkg, {"a": "x"}, journal=j).output == "x"
    with pytest.raises(eg.RoutineInputError, match="inputs.a"):
        eg.run_routine(pkg, {"a": 5}, journal=j)


# --- call ids: one call each ---------------------------------------------------------------------


@pytest.mark.parametrize("answer", [{"result": "charged 5 (provider)"}, {"retry": True}])
def test_an_at_most_once_recovery_question_is_no_prompt_of_the_routine(tmp_path, answer):
    """A crash inside an at-most-once tool asks "did this step happen?" under the tool's own call_id: the
    routine keeps the tool call (it used to crash with an AttributeError, the question taken for a prompt)."""
    from engrain._durable.trace import export_run

    j = _journal(tmp_path)
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg, at_most_once=True)
    def charge(amount: int) -> str:
        return f"charged {amount}"

    @eg.tool(registry=reg)
    def notify(msg: str) -> str:
        return "ok"

    def agent(task):
        return notify(f"done: {charge(5)}")

    started = {"call_id": 0, "type": "tool", "args": {"amount": 5}, "attempt": 1, "at_most_once": True}
    j.append("p1", [eg.NewEvent("run.started", "", {"task": "pay", "inputs": {}, "tags": []}),
                    eg.NewEvent("step.started", "charge", started)], 0)
    assert eg.run(agent, "pay", run_id="p1", journal=j).status == "needs_input"
    eg.answer("p1", answer, journal=j)
    assert eg.run(agent, "pay", run_id="p1", journal=j).status == "ok"
    steps = load_routine(eg.compile_trace(export_run(j, "p1"), tmp_path / "pkg")).raw["steps"]
    assert [(s["type"], s.get("tool")) for s in steps] == [("tool.call", "charge"), ("tool.call", "notify"), ("return", None)]
    assert steps[1]["args"] == {"msg": "done: {{ step1 }}"}


def test_a_prompt_reusing_a_tools_call_id_is_a_trace_error_not_a_lost_call(tmp_path):
    """The prompt used to replace the tool call: the routine asked twice and never sent."""
    trace = {"format": "engrain.trace/1", "run": {"run_id": "r", "task": "t"}, "events": [
        {"kind": "run.started", "name": "t", "data": {"task": "t", "inputs": {}}},
        {"kind": "step.completed", "name": "send", "data": {"call_id": 0, "type": "tool", "args": {"to": "x"}, "result": "sent"}},
        {"kind": "input.requested", "name": "ask", "data": {"call_id": 0, "prompt": "ok?", "fields": [{"name": "ok"}]}},
        {"kind": "input.received", "name": "ask", "data": {"call_id": 0, "answers": {"ok": "yes"}}},
        {"kind": "run.completed", "name": "t", "data": {"output": 1}}]}
    with pytest.raises(eg.TraceError, match=r"events\[2\]\.data\.call_id.*'send'"):
        eg.compile_trace(trace, tmp_path / "pkg")


def test_an_answer_without_a_name_still_answers_its_prompt(tmp_path):
    """A hand-written trace may leave the answer's name out: it is that prompt's, not another call."""
    trace = {"format": "engrain.trace/1", "run": {"run_id": "r", "task": "t"}, "events": [
        {"kind": "run.started", "name": "t", "data": {"task": "t", "inputs": {}}},
        {"kind": "input.requested", "name": "ask", "data": {"call_id": 0, "prompt": "ok?", "fields": [{"name": "ok"}]}},
        {"kind": "input.received", "data": {"call_id": 0, "answers": {"ok": "yes"}}},
        {"kind": "run.completed", "name": "t", "data": {"output": 1}}]}
    out = eg.compile_trace(trace, tmp_path / "pkg")
    assert "prompt.user" in (out / "routine.yaml").read_text()


def test_a_udf_file_too_large_to_parse_is_refused_before_parsing(tmp_path):
    """udfs.py is parsed on the host even for a sandboxed routine: 6 MB of short lines took 15 s and 2.4 GB."""
    pkg = _package(tmp_path, """
name: m
inputs: {type: object}
steps:
  - {id: r, type: return, value: 1}
""")
    (pkg / "udfs.py").write_text("x = 1\n" * 200_000)  # 1.2 MB
    t0 = time.monotonic()
    issues = eg.validate_routine(pkg)
    assert time.monotonic() - t0 < 2
    assert [(i.file, i.field) for i in issues] == [("udfs.py", "file")] and "larger than" in issues[0].message
    (pkg / "udfs.py").write_text("def f(x):\n    return x\n")
    assert eg.validate_routine(pkg) == []


def test_the_patterns_of_one_check_share_one_budget(tmp_path):
    """Each search stops at its own deadline, but 20 strings each taking it would add up to 5 s per check."""
    pkg = _package(tmp_path, """
name: m
inputs: {type: object, "$defs": {}, properties: {a: {type: array, items: {type: string, pattern: "^(a|a)*$"}}}}
steps:
  - {id: r, type: return, value: "done"}
""")
    t0 = time.monotonic()
    with pytest.raises(eg.RoutineInputError, match="longer than"):
        eg.run_routine(pkg, {"a": ["a" * 40 + "!"] * 20}, journal=_journal(tmp_path))
    assert time.monotonic() - t0 < 3.5
    assert eg.run_routine(pkg, {"a": ["aaa"] * 20}, journal=_journal(tmp_path)).output == "done"


def test_unevaluated_properties_beside_pattern_properties_is_refused_at_load(tmp_path):
    """jsonschema searches those patterns with Python's re, which no deadline can stop: the file is refused."""
    pkg = _package(tmp_path, """
name: m
inputs: {type: object, properties: {a: {type: object, patternProperties: {"^(a|a)*$": true},
                                        unevaluatedProperties: false}}}
steps:
  - {id: r, type: return, value: "done"}
""")
    issues = eg.validate_routine(pkg)
    assert len(issues) == 1 and issues[0].field == "inputs" and "unevaluatedProperties" in issues[0].message
    t0 = time.monotonic()
    with pytest.raises(eg.RoutineError, match="unevaluatedProperties"):
        eg.run_routine(pkg, {"a": {"a" * 40 + "!": 1}}, journal=_journal(tmp_path))
    assert time.monotonic() - t0 < 5
