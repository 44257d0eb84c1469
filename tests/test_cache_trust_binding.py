"""Behavior cache: params that no placeholder re-binds, whitespace in tasks, checks added later, numpy verdicts.

Each case once replayed a trajectory recorded for other values (or refused a
plain numpy answer): a param the binder could not see (unused, derived, or a
list used element by element) was left out of the key; tasks differing only
in whitespace shared a key; a step whose tool gained a check after recording
ran unchecked.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import engrain as eg
from engrain import CacheError, Check, Engine
from engrain._cache import engine as engine_mod
from engrain._cache import binding
from engrain._cache.binding import Binding, bind, canonical_task


def _engine(tmp_path, name: str = "cache.db", **kw: Any) -> Engine:
    return Engine(eg.open(f"sqlite:///{tmp_path / name}"), **kw)


# -- params the steps do not show as whole values or text ----------------------------------------------------


def test_list_param_used_element_by_element_never_replays_old_elements(tmp_path):
    eng = _engine(tmp_path)
    deleted: list[str] = []

    @eng.function()
    def delete_file(path: str) -> str:
        deleted.append(path)
        return "deleted"

    def agent(task: str, files: list[str] = ()) -> str:  # type: ignore[assignment]
        for f in files:
            delete_file(f)
        return f"deleted {len(files)} files"

    eng.set_agent(agent).finalize()
    first = ["/tmp/a.log", "/tmp/b.log"]
    assert not eng("delete the listed files", params={"files": first}, files=first)
    deleted.clear()
    other = eng("delete the listed files", params={"files": ["/home/me/keep.txt"]}, files=["/home/me/keep.txt"])
    assert not other.hit and other.agent_called
    assert deleted == ["/home/me/keep.txt"] and other.output == "deleted 1 files"
    deleted.clear()
    again = eng("delete the listed files", params={"files": first}, files=first)  # the pinned value itself still hits
    assert again.hit and deleted == first


def test_list_param_used_whole_and_by_element_is_pinned(tmp_path):
    eng = _engine(tmp_path)
    log: list[tuple[str, Any]] = []

    @eng.function()
    def backup(paths: list) -> str:
        log.append(("backup", paths))
        return "ok"

    @eng.function()
    def delete_file(path: str) -> str:
        log.append(("delete", path))
        return "deleted"

    def agent(task: str, files: list[str] = ()) -> str:  # type: ignore[assignment]
        backup(list(files))
        for f in files:
            delete_file(f)
        return "done"

    eng.set_agent(agent).finalize()
    assert not eng("archive the files", params={"files": ["/tmp/a.log", "/tmp/b.log"]}, files=["/tmp/a.log", "/tmp/b.log"])
    log.clear()
    out = eng("archive the files", params={"files": ["/srv/x.db"]}, files=["/srv/x.db"])
    assert not out.hit and log == [("backup", ["/srv/x.db"]), ("delete", "/srv/x.db")]


def test_list_param_used_only_whole_still_rebinds(tmp_path):
    """The exact case stays a hit: a list passed on whole is re-bound with the new list."""
    eng = _engine(tmp_path)
    got: list[list[str]] = []

    @eng.function()
    def backup(paths: list) -> str:
        got.append(paths)
        return "ok"

    eng.set_agent(lambda task, files=(): backup(list(files))).finalize()
    assert not eng("back up the files", params={"files": ["/a", "/b"]}, files=["/a", "/b"])
    out = eng("back up the files", params={"files": ["/c"]}, files=["/c"])
    assert out.hit and not out.agent_called and got == [["/a", "/b"], ["/c"]]


def test_param_found_nowhere_in_the_steps_is_pinned(tmp_path):
    """1000 dollars paid as 100000 cents: the value never shows, so 5000 must not replay 100000."""
    eng = _engine(tmp_path)
    paid: list[int] = []

    @eng.function()
    def pay(amount_cents: int) -> str:
        paid.append(amount_cents)
        return "paid"

    eng.set_agent(lambda task: pay(int(task.split()[1]) * 100)).finalize()
    assert not eng("pay 1000 dollars to bob", params={"amount": 1000})
    out = eng("pay 5000 dollars to bob", params={"amount": 5000})
    assert not out.hit and out.agent_called and paid == [100000, 500000]
    assert eng("pay 5000 dollars to bob", params={"amount": 5000}).hit and paid[-1] == 500000


def test_entry_bound_under_the_old_rule_is_not_replayed(tmp_path, monkeypatch):
    """An entry stored before unused params were pinned lists the param as bound with no placeholder: it misses."""
    eng = _engine(tmp_path)
    paid: list[int] = []

    @eng.function()
    def pay(amount_cents: int) -> str:
        paid.append(amount_cents)
        return "paid"

    eng.set_agent(lambda task: pay(int(task.split()[1]) * 100)).finalize()

    def old_bind(values: list[Any], params: dict[str, Any]) -> Binding:
        b = bind(values, params)
        return Binding(b.values, b.templated, [], sorted(params))  # the old rule: a param with no use counted bound

    monkeypatch.setattr(engine_mod, "bind", old_bind)
    assert not eng("pay 1000 dollars to bob", params={"amount": 1000})
    monkeypatch.undo()
    (entry,) = eng.entries()
    assert entry.output["param_types"] == {"amount": "int"} and entry.steps[0]["args"] == {"amount_cents": 100000}
    out = eng("pay 5000 dollars to bob", params={"amount": 5000})
    assert not out.hit and out.agent_called and paid == [100000, 500000]


def test_binding_pins_unused_and_element_wise_params():
    assert bind([{"x": "KEEP"}], {"who": "Sarah"}).pinned == ["who"]
    assert bind([{"cents": 100000}], {"amount": 1000}).pinned == ["amount"]
    assert bind([{"path": "/a"}], {"files": ["/a", "/b"]}).pinned == ["files"]
    assert bind([{"note": "remove /a now"}], {"files": ["/a"]}).pinned == ["files"]
    assert bind([{"paths": ["/a"]}, {"path": "/a"}], {"files": ["/a"]}).pinned == ["files"]
    assert bind([{"k": "v"}], {"opts": {"mode": "v"}}).pinned == ["opts"]  # a dict param's value
    assert bind([{"m": {"mode": 1}}], {"opts": {"mode": "fast"}}).pinned == ["opts"]  # and its key
    assert bind([{"dry": None}], {"opts": {"dry": None, "n": 3}}).pinned == ["opts"]
    assert bind([{"row": [1, 2]}], {"grid": [[1, 2], [3, 4]]}).pinned == ["grid"]
    # Used whole and nowhere else: bound, re-filled with the new value.
    b = bind([{"paths": ["/a", "/b"]}], {"files": ["/a", "/b"]})
    assert b.bound == ["files"] and b.values == [{"paths": "{{ params.files }}"}]
    b = bind([{"who": "Sarah", "files": ["/a"]}], {"who": "Sarah", "files": ["/a"], "unused": 7})
    assert b.bound == ["files", "who"] and b.pinned == ["unused"]


# -- whitespace inside a task is meaning -------------------------------------------------------------------


def test_tasks_differing_in_indentation_do_not_share_an_entry(tmp_path):
    eng = _engine(tmp_path)
    written: list[str] = []

    @eng.function()
    def write_file(path: str, content: str) -> str:
        written.append(content)
        return "written"

    eng.set_agent(lambda task: write_file("job.py", task.split("---\n", 1)[1])).finalize()
    inside = "save this script:---\nfor x in xs:\n    check(x)\n    delete(x)\n"
    after = "save this script:---\nfor x in xs:\n    check(x)\ndelete(x)\n"
    assert not eng(inside)
    out = eng(after)
    assert not out.hit and out.agent_called and written[-1] == "for x in xs:\n    check(x)\ndelete(x)\n"
    crlf = eng(inside.replace("\n", "\r\n"))  # only the line endings differ: the same task
    assert crlf.hit and written[-1] == "for x in xs:\n    check(x)\n    delete(x)\n"


def test_no_break_space_and_tab_are_not_a_space(tmp_path):
    eng = _engine(tmp_path)

    @eng.function()
    def echo(s: str) -> str:
        return s

    eng.set_agent(lambda task: echo(task)).finalize()
    assert not eng("price:\u00a0100")
    for other in ("price: 100", "price:\t100", "price:  100"):
        out = eng(other)
        assert not out.hit and out.output == other
    assert eng("  price: 100 \n").hit  # around the text nothing is kept


def test_canonical_task_keeps_inner_whitespace():
    assert canonical_task("  lunch \n with   Sarah ", {}) == "  lunch \n with   Sarah"  # a first line's indent is kept
    assert canonical_task("a {{ b }}  c", {}) == "a {{ b }}  c"
    assert canonical_task("order\t30  boxes", {"n": 30}) == "order\t{{ params.n }}  boxes"
    assert binding.tidy("\r\n\n    if x:\r\n        y()\r\n") == "    if x:\n        y()"
    assert binding.tidy(" \t one line \n") == "one line"


# -- a check added to a tool after its entries were recorded ------------------------------------------------


def test_pre_check_added_later_is_not_skipped_at_the_first_step(tmp_path):
    db = f"sqlite:///{tmp_path / 'cache.db'}"
    env = {"logged_in": True}
    ran: list[str] = []
    e1 = Engine(eg.open(db))

    @e1.function()
    def delete_all(folder: str) -> str:
        ran.append(folder)
        return "deleted"

    e1.set_agent(lambda task: delete_all("tmp")).finalize()
    assert not e1("clean the tmp folder")
    env["logged_in"], ran[:] = False, []
    e2 = Engine(eg.open(db))

    @e2.function(pre_check=Check(capture=lambda folder: env["logged_in"], compare=lambda now, then: now is True))
    def delete_all(folder: str) -> str:  # noqa: F811 - the same tool in the program's next version
        ran.append(folder)
        return "deleted"

    agent_calls: list[str] = []
    e2.set_agent(lambda task: agent_calls.append(task) or "asked first").finalize()
    out = e2("clean the tmp folder")
    assert not out.hit and agent_calls and ran == [] and out.output == "asked first"


@pytest.mark.parametrize("added", ["pre", "post"])
def test_check_added_later_hands_over_before_the_step_runs(tmp_path, added):
    db = f"sqlite:///{tmp_path / 'cache.db'}"
    ran: list[str] = []

    def build(with_check: bool) -> Engine:
        eng = Engine(eg.open(db))

        @eng.function()
        def open_folder(folder: str) -> str:
            ran.append("open")
            return "opened"

        check = Check(capture=lambda folder: "same", compare=lambda now, then: True)  # passes anything it can compare
        kw = {f"{added}_check": check} if with_check else {}

        @eng.function(**kw)
        def delete_all(folder: str) -> str:
            ran.append("delete")
            return "deleted"

        def agent(task: str, continuation: Any = None) -> str:
            if continuation is None:
                open_folder("tmp")
            delete_all("tmp") if not with_check else None
            return "agent" if continuation is None else f"continued at {continuation.diverged_at}"

        eng.set_agent(agent).finalize()
        return eng

    assert not build(False)("clean the tmp folder")
    ran.clear()
    out = build(True)("clean the tmp folder")
    assert not out.hit and out.agent_called
    assert ran == ["open"] and out.output == "continued at 1"  # step 0 replayed, step 1 never ran unchecked


# -- numpy answers from compare ----------------------------------------------------------------------------


def test_numpy_answers_count_as_python_ones():
    np = pytest.importorskip("numpy")
    c = Check(capture=lambda: 0, compare=lambda a, b: True, threshold=0.5)
    a = np.array([1, 2])
    assert c.passes(0, 0) is True
    assert c.verdict((a == a).all()) is True and c.verdict((a == a + 1).all()) is False
    assert c.verdict(np.bool_(True)) is True and c.verdict(np.bool_(False)) is False
    assert c.verdict(np.int64(1)) is True and c.verdict(np.int64(0)) is False  # as 1 and 0: scores
    assert c.verdict(np.float32(0.75)) is True and c.verdict(np.float16(0.25)) is False
    for bad in (None, "yes", "", [], [1], float("nan"), np.float64("nan"), np.int64(2), -1, np.array([True])):
        with pytest.raises(CacheError):
            c.verdict(bad)


def test_numpy_bool_pre_check_replays(tmp_path):
    np = pytest.importorskip("numpy")
    eng = _engine(tmp_path)
    grid = np.zeros((2, 2))

    @eng.function(pre_check=Check(capture=lambda: grid.copy(), compare=lambda now, then: (now == then).all()))
    def paint() -> str:
        return "painted"

    eng.set_agent(lambda task: paint()).finalize()
    assert not eng("paint the grid")
    assert eng("paint the grid").hit
    grid[0, 0] = 1
    assert not eng("paint the grid").hit


def test_verdict_does_not_import_numpy():
    code = (
        "import sys\nfrom engrain._cache.checks import Check\n"
        "c = Check(lambda: 0, lambda a, b: 0.7)\nassert c.verdict(0.7) and not c.verdict(0)\n"
        "try:\n    c.verdict('x')\nexcept Exception:\n    pass\nprint('numpy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
