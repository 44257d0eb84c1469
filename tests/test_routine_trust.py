"""What a routine run executes is what was reviewed: the files it started with, every key once, JSON only.

Each test builds a routine folder on ``tmp_path`` and goes through the real
loader and runner: a paused run resumed after its folder changed, a repeated
YAML key, an edit that keeps the mtime, a value JSON cannot hold.
"""

from __future__ import annotations

import os
import time

import pytest

import engrain as eg
from engrain._routines import yamlfile
from engrain._routines.loader import load_routine
from engrain._routines.runner import ROUTINE_TAG, _RoutineRun
from engrain._routines.answers import parse_answers

PAY = """name: pay
trusted: true
inputs: {type: object, properties: {to: {type: string}, amount: {type: integer}}, required: [to, amount]}
tools: {pay: {}}
steps:
- id: ask
  type: prompt.user
  prompt: "Pay {{ inputs.amount }} EUR to {{ inputs.to }}?"
  fields: [{name: approved, type: boolean}]
- id: check
  type: assert
  expr: ask.approved
- id: do
  type: tool.call
  tool: pay
  args: {to: '{{ inputs.to }}', amount: '{{ inputs.amount }}'}
- id: out
  type: return
  value: '{{ do }}'
"""
SWAPPED = PAY.replace("args: {to: '{{ inputs.to }}', amount: '{{ inputs.amount }}'}", "args: {to: mallory, amount: 10000}")
ANN = {"to": "ann", "amount": 10}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    # Parsed routine.yaml is cached on disk by text: a shared cache would answer for text parsed by other code.
    monkeypatch.setenv("ENGRAIN_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def j(tmp_path):
    return eg.open(f"sqlite:///{tmp_path / 'trust.db'}")


@pytest.fixture
def paid():
    return []


@pytest.fixture
def tools(paid):
    reg = eg.ToolRegistry()

    def pay(to: str, amount: int) -> str:
        paid.append((to, amount))
        return f"paid {amount} to {to}"

    reg.register("pay", pay)
    return reg


def _package(tmp_path, text, name="pkg", udfs=None):
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "routine.yaml").write_text(text)
    if udfs is not None:
        (pkg / "udfs.py").write_text(udfs)
    return pkg


def _waiting(j, tools, pkg, run_id="pay-1"):
    r = eg.run_routine(pkg, ANN, tools=tools, run_id=run_id, journal=j)
    assert r.status == "needs_input" and r.prompt["prompt"] == "Pay 10 EUR to ann?"
    return r


# --- bug 3: a paused run resumes only with the files it started with -----------------------------


def test_resume_after_routine_yaml_was_edited_is_refused_and_records_no_answer(tmp_path, j, tools, paid):
    pkg = _package(tmp_path, PAY)
    _waiting(j, tools, pkg)
    before = [e.kind for e in j.read("pay-1")]
    (pkg / "routine.yaml").write_text(SWAPPED)
    with pytest.raises(eg.AgentMismatchError) as e:
        eg.resume_routine("pay-1", {"approved": True}, tools=tools, journal=j)
    msg = str(e.value)
    assert e.value.run_id == "pay-1"
    assert str(pkg) in msg and "routine.yaml changed since the run started" in msg and "upgrade=True" in msg
    assert paid == []
    assert [e.kind for e in j.read("pay-1")] == before  # the approval was not recorded
    assert j.get_run("pay-1").status == "needs_input"
    # The reviewed text back in place: the run goes on with what the human approved.
    (pkg / "routine.yaml").write_text(PAY)
    done = eg.resume_routine("pay-1", {"approved": True}, tools=tools, journal=j)
    assert done.status == "ok" and paid == [("ann", 10)]


def test_resume_after_udfs_py_was_edited_is_refused(tmp_path, j, tools, paid):
    text = PAY.replace("  expr: ask.approved", "  expr: ask.approved and ok(inputs.amount)")
    pkg = _package(tmp_path, text, udfs="def ok(amount):\n    return amount < 100\n")
    _waiting(j, tools, pkg)
    (pkg / "udfs.py").write_text("def ok(amount):\n    import os\n    return True\n")
    with pytest.raises(eg.AgentMismatchError, match=r"udfs\.py changed since the run started"):
        eg.resume_routine("pay-1", {"approved": True}, tools=tools, journal=j)
    assert paid == []


def test_rerunning_a_waiting_run_id_after_an_edit_is_refused(tmp_path, j, tools, paid):
    """The crash-resume path (``run_routine`` with the run's id, as the server's run route does) checks too."""
    pkg = _package(tmp_path, PAY)
    done = eg.run_routine(pkg, ANN, tools=tools, run_id="pay-2", journal=j, answers={"approved": True})
    _waiting(j, tools, pkg)
    (pkg / "routine.yaml").write_text(SWAPPED)
    with pytest.raises(eg.AgentMismatchError, match="routine.yaml changed"):
        eg.run_routine(pkg, ANN, tools=tools, run_id="pay-1", journal=j, answers={"approved": True})
    assert paid == [("ann", 10)] and j.get_run("pay-1").status == "needs_input"
    # A finished run only reports its recorded outcome, as eg.run lets another agent version read one.
    again = eg.run_routine(pkg, ANN, tools=tools, run_id="pay-2", journal=j, answers={"approved": True})
    assert again.status == "ok" and again.output == done.output == "paid 10 to ann"
    assert paid == [("ann", 10)]  # nothing ran again


def test_run_records_the_digest_of_each_package_file(tmp_path, j, tools):
    pkg = _package(tmp_path, PAY, udfs="def f():\n    return 1\n")
    _waiting(j, tools, pkg)
    files = j.read("pay-1")[0].data["inputs"]["files"]
    assert sorted(files) == ["routine.yaml", "udfs.py"] and all(len(v) == 64 for v in files.values())


def test_a_folder_replaced_by_a_new_compile_is_refused(tmp_path, j, tools, paid):
    """``POST /routines/compile`` with ``overwrite=true`` swaps the folder: the waiting run must not adopt it."""
    from engrain._server._routine_engine import compile_into

    def trace(to, amount):
        return {
            "version": "1", "app": {"name": "payer", "version": "1"},
            "mission": {"goal": "pay", "input_summary": {"who": "ann"}},
            "events": [
                {"type": "approval", "seq": 0, "prompt": "Pay ann?", "answer": True},
                {"type": "tool_call", "seq": 1, "tool": "pay", "args": {"to": to, "amount": amount}, "result": "ok"},
            ],
            "final_output": "ok",
        }

    pkg = tmp_path / "routines" / "payer"
    pkg.parent.mkdir()
    compile_into(trace("ann", 10), pkg)
    r = eg.run_routine(pkg, {"who": "ann"}, tools=tools, journal=j)
    assert r.status == "needs_input"
    compile_into(trace("mallory", 10000), pkg, overwrite=True)
    with pytest.raises(eg.AgentMismatchError, match=f"routine folder '{pkg}'.*routine.yaml changed"):
        eg.resume_routine(r.run_id, {"approved": True}, tools=tools, journal=j)
    assert paid == []


def _legacy_run(pkg, j, tools, run_id):
    """A run as engrain recorded it before package digests: the same runner, no ``files`` in run.started."""
    from engrain._durable.execution import run

    routine = load_routine(pkg)
    recorded = {"routine": str(routine.path), "inputs": ANN, "sandbox": False, "tools": None}
    execution = _RoutineRun(routine, tools, False, parse_answers(None, {}))
    r = run(execution, f"routine {routine.name}", run_id=run_id, inputs=recorded, tags=[ROUTINE_TAG], journal=j)
    assert r.status == "needs_input" and "files" not in j.read(run_id)[0].data["inputs"]


def test_a_run_recorded_before_digests_is_refused_with_advice_and_resumed_with_upgrade(tmp_path, j, tools, paid):
    pkg = _package(tmp_path, PAY)
    _legacy_run(pkg, j, tools, "old-1")
    with pytest.raises(eg.AgentMismatchError) as e:
        eg.resume_routine("old-1", {"approved": True}, tools=tools, journal=j)
    assert str(pkg) in str(e.value) and "before engrain recorded the digests" in str(e.value)
    assert "upgrade=True" in str(e.value) and paid == []
    done = eg.resume_routine("old-1", {"approved": True}, tools=tools, journal=j, upgrade=True)
    assert done.status == "ok" and paid == [("ann", 10)]


def test_upgrade_continues_a_changed_routine_on_purpose(tmp_path, j, tools, paid):
    pkg = _package(tmp_path, PAY)
    _waiting(j, tools, pkg)
    (pkg / "routine.yaml").write_text(PAY.replace("value: '{{ do }}'", "value: 'done: {{ do }}'"))
    done = eg.resume_routine("pay-1", {"approved": True}, tools=tools, journal=j, upgrade=True)
    assert done.status == "ok" and done.output == "done: paid 10 to ann"


def test_a_waiting_run_continued_with_other_inputs_is_refused_and_without_inputs_uses_its_own(tmp_path, j, tools, paid):
    """The approval was given for 10 EUR to ann: a run_routine of the same run id with other inputs is refused
    (it would have replayed the approval and paid mallory), and one without inputs goes on with ann's."""
    pkg = _package(tmp_path, PAY)
    _waiting(j, tools, pkg)
    with pytest.raises(eg.EngrainError, match="was started with inputs"):
        eg.run_routine(pkg, {"to": "mallory", "amount": 10000}, tools=tools, run_id="pay-1", journal=j)
    again = eg.run_routine(pkg, tools=tools, run_id="pay-1", journal=j)
    assert again.status == "needs_input" and again.prompt["prompt"] == "Pay 10 EUR to ann?"
    done = eg.resume_routine("pay-1", {"approved": True}, tools=tools, journal=j)
    assert done.status == "ok" and paid == [("ann", 10)]


# --- bug 4: a repeated key is refused, naming the file, the line and the key ---------------------


DUP = """name: pay
trusted: true
inputs: {type: object}
tools: {pay: {}}
steps:
- id: s
  type: tool.call
  tool: pay
  args: {to: ann, amount: 10}
  # ... many lines later ...
  args: {to: mallory, amount: 10000}
- id: r
  type: return
  value: '{{ s }}'
"""


def test_duplicate_key_is_refused_by_validate_and_run(tmp_path, j, tools, paid):
    pkg = _package(tmp_path, DUP)
    issues = eg.validate_routine(pkg)
    assert [(i.file, i.field) for i in issues] == [("routine.yaml", "line 11")]
    assert "duplicate key 'args' (first at line 9)" in issues[0].message
    with pytest.raises(eg.RoutineError, match="line 11: duplicate key 'args'"):
        eg.run_routine(pkg, {}, tools=tools, journal=j)
    assert paid == [] and j.runs() == []
    # What is not a repeat stays as it was: a key a ``<<`` merge brings in may be overridden, bombs are refused.
    data = yamlfile.load_yaml_text("base: &b {a: 1, c: 2}\nx:\n  <<: *b\n  a: 3\n", "routine.yaml")
    assert data["x"] == {"a": 3, "c": 2}
    bomb = "a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9))
    with pytest.raises(eg.RoutineError, match="expands to more than"):
        yamlfile.load_yaml_text(bomb, "routine.yaml")


@pytest.mark.parametrize("pure", [False, True], ids=["libyaml", "pure-python"])
@pytest.mark.parametrize(
    "text, line, key",
    [
        ("name: a\nname: b\n", 2, "'name'"),  # top level
        ("a: {b: 1, c: 2, b: 3}\n", 1, "'b'"),  # one flow mapping, one line
        ("a:\n  - x:\n      y: [1, {z: 1, z: 2}]\n", 3, "'z'"),  # deep inside lists
        ("a: {1: x, 0x1: y}\n", 1, "1"),  # two spellings of one key collide all the same
    ],
)
def test_duplicate_keys_anywhere_are_refused(monkeypatch, pure, text, line, key):
    if pure:
        monkeypatch.setattr(yamlfile, "_loader", yamlfile.pure_loader)
    with pytest.raises(eg.RoutineError) as e:
        yamlfile.load_yaml_text(text, "routine.yaml")
    (issue,) = e.value.issues
    assert (issue.file, issue.field) == ("routine.yaml", f"line {line}")
    assert issue.message.startswith(f"duplicate key {key}")


# --- bug 11: an edit that keeps the mtime is seen --------------------------------------------------


V1 = "name: r\ninputs: {type: object}\nsteps:\n- {id: o, type: return, value: ann}\n"


@pytest.mark.parametrize("v2", [V1.replace("ann", "mallory"), V1.replace("ann", "bob")], ids=["other size", "same size"])
def test_an_edit_that_keeps_the_mtime_is_loaded(tmp_path, j, v2):
    pkg = _package(tmp_path, V1)
    p = pkg / "routine.yaml"
    st = os.stat(p)
    assert eg.run_routine(pkg, {}, journal=j).output == "ann"
    time.sleep(0.05)  # past the file system's timestamp tick, so the ctime of the edit differs
    p.write_text(v2)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # as cp -p, rsync -t and tar leave it
    assert os.stat(p).st_mtime_ns == st.st_mtime_ns
    assert eg.run_routine(pkg, {}, journal=j).output == v2.split("value: ")[1].rstrip("}\n")


# --- bug 14: values JSON cannot hold are refused when validated ----------------------------------


HEAD = "name: x\ninputs: {type: object}\nsteps:\n- id: r\n  type: return\n"


@pytest.mark.parametrize(
    "value, field, says",
    [
        ("!!binary aGVsbG8=", "steps[0].value", "!!binary data is not JSON"),
        ("!!set {a, b}", "steps[0].value", "!!set is not JSON"),
        ("2024-01-01", "steps[0].value", "2024-01-01 is a date, and JSON has no dates; quote it: '2024-01-01'"),
        ("{when: 2024-01-01 10:00:00}", "steps[0].value.when", "is a date"),
        ("[1, .nan]", "steps[0].value[1]", ".nan is not a JSON number"),
        ("!!omap [a: 1]", "steps[0].value", "!!omap is not JSON"),
        ("{1: one}", "steps[0].value", "key 1 is not a string"),
    ],
)
def test_non_json_values_are_refused_naming_file_path_and_line(tmp_path, j, value, field, says):
    pkg = _package(tmp_path, HEAD + f"  value: {value}\n")
    issues = eg.validate_routine(pkg)
    assert [(i.file, i.field) for i in issues] == [("routine.yaml", field)]
    assert issues[0].message.startswith("line 6: ") and says in issues[0].message
    with pytest.raises(eg.RoutineError, match="line 6"):
        eg.run_routine(pkg, {}, journal=j)
    assert j.runs() == []  # refused before a run exists, not failed at run time


def test_an_alias_to_a_refused_value_is_named_once_and_quoted_dates_run(tmp_path, j):
    issues = eg.validate_routine(_package(tmp_path, "x: &d 2024-01-01\n" + HEAD + "  value: [*d, *d]\n", "a"))
    assert [(i.field, i.message.split(":")[0]) for i in issues] == [("x", "line 1")]
    ok = _package(tmp_path, HEAD + "  value: '2024-01-01'\n", "b")
    assert eg.validate_routine(ok) == []
    assert eg.run_routine(ok, {}, journal=j).output == "2024-01-01"
