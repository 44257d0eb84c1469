"""Induce a routine from agent runs: explain every tool argument, or say why it cannot be.

An agent run is read from the journal into an
:class:`~.agent_trace.AgentTrace` (its task, and each tool call that succeeded
with the model turn that asked for it; see :mod:`.agent_trace`). Runs
with the same *shape* (the same tools, in the same turns, with the same
argument structure) are induced together. Each argument leaf is explained, in
this order of preference, as

* an **input** already named (the same value was explained as one earlier);
* a new **input from the task**: its value appears in every run's task text;
* a **template** over an earlier turn's result (``{{ step1.rows[0].iban }}``),
  the same path in every run;
* a string **template** mixing literal text and such values;
* a new **caller input**: a value the model wrote in its first turn, before it
  saw any tool result, so a caller that knows only the task can supply it;
* a **constant**: the same value in every run.

A value that none of these explains (the model composed or computed it after
seeing results, differently in each run) makes its step not compilable, and
the report says which step, which argument and why. One run explains nothing
for sure (every value is the same in every run of one), so a routine needs two
runs with different tasks to be *confirmed*; until then it stays a candidate.
Where the runs agree on a value that could still vary, the value is pinned: a
constant, or an input whose schema admits only that value, with an ``assert``
on the result it came from. What the runs relied on in the results they read
(status fields, flags, list lengths, two paths holding the same value) become
``assert`` steps (:mod:`.preconditions`), so the routine stops instead of
acting on a world that changed. See ARCHITECTURE.md ("Learning routines").
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field
from typing import Any

from .agent_trace import AgentTrace, _leaves, shape_of
from .compiler import _child
from .preconditions import _NO, Preconditions, Problem, _in_task, _literal, _same, _short, _task_count
from .template import escape, placeholder, render

_MAX_NODES = 4000  # nodes of one result indexed as template sources
_STOP = {"a", "an", "the", "in", "to", "of", "for", "on", "at", "from", "with", "and", "my", "me", "please", "by", "is"}


def _index(step: str, result: Any) -> dict[str, Any]:
    """Path -> value of every node of a result (the root too), breadth first, bounded."""
    out: dict[str, Any] = {}
    queue = [(step, result)]
    while queue and len(out) < _MAX_NODES:
        p, v = queue.pop(0)
        out[p] = v
        if isinstance(v, dict):
            queue.extend((c, x) for k, x in v.items() if (c := _child(p, k)) is not None)
        elif isinstance(v, list):
            queue.extend((f"{p}[{i}]", x) for i, x in enumerate(v))
    return out


@dataclass(slots=True)
class Induced:
    """The result of :func:`induce`: a routine (``routine.yaml`` data) and what it rests on.

    ``status`` is ``confirmed`` (two or more runs with different tasks, every
    argument explained), ``candidate`` (one run, runs that all had the same
    task, or ``doubts``: an argument read from one element of a list that held
    several, which no number of runs can explain) or ``not_compilable``
    (``problems`` say which steps and why).
    """

    name: str
    status: str
    routine: dict[str, Any]
    problems: list[Problem]
    pattern: str | None
    explained: list[dict[str, Any]] = field(default_factory=list)
    doubts: list[Problem] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "routine": self.routine, "pattern": self.pattern,
                "problems": [p.to_dict() for p in self.problems], "explained": self.explained,
                "doubts": [p.to_dict() for p in self.doubts]}


class _Inputs:
    """The routine's inputs as they are decided: name -> (schema, value in each run, where it came from)."""

    def __init__(self) -> None:
        self.values: dict[str, list[Any]] = {}
        self.schema: dict[str, dict[str, Any]] = {}

    def find(self, vals: list[Any]) -> str | None:
        for name, have in self.values.items():
            if all(_same(a, b) for a, b in zip(have, vals)):
                return name
        return None

    def add(self, base: str, vals: list[Any], source: str, pinned: bool) -> str:
        name = _ident(base, set(self.values))
        self.values[name] = vals
        s = _type_schema(vals)
        s["description"] = source
        if pinned:  # the runs never varied it: only that value is known to give the learned outcome
            s["const"] = vals[0]
        self.schema[name] = s
        return name


def _ident(base: str, taken: set[str]) -> str:
    s = re.sub(r"\W+", "_", str(base), flags=re.ASCII).strip("_").lower() or "value"
    if s[0].isdigit() or keyword.iskeyword(s) or s == "inputs":
        s = f"v_{s}"
    out, n = s[:40], 2
    while out in taken:
        out, n = f"{s[:36]}_{n}", n + 1
    return out


def _type_schema(vals: list[Any]) -> dict[str, Any]:
    types = {type(v) for v in vals}
    if types <= {int}:
        return {"type": "integer"}
    if types <= {int, float}:
        return {"type": "number"}
    for t, name in ((str, "string"), (bool, "boolean"), (list, "array"), (dict, "object")):
        if types == {t}:
            return {"type": name}
    return {}


class _Induction(Preconditions):
    def __init__(self, traces: list[AgentTrace]):
        self.traces = traces
        self.n = len(traces)
        self.inputs = _Inputs()
        self.problems: list[Problem] = []
        self.doubts: list[Problem] = []  # what keeps an otherwise explained routine a candidate
        self.explained: list[dict[str, Any]] = []
        self.asserts: dict[int, list[tuple[str, str]]] = {}  # after step k: (expr, message)
        self.consumed: dict[int, set[str]] = {}  # step k -> paths read by later steps
        self.index: list[list[dict[str, Any]]] = [[] for _ in traces]  # run -> step -> path index

    # -- explaining one leaf ---------------------------------------------------------------

    def _scope(self, r: int, k: int) -> dict[str, Any]:
        scope: dict[str, Any] = {"inputs": {n: v[r] for n, v in self.inputs.values.items()}}
        for j, c in enumerate(self.traces[r].calls[:k]):
            scope[f"step{j + 1}"] = c.result
        return scope

    def _paths(self, k: int, vals: list[Any]) -> list[str]:
        """Paths into results of turns before step k's that hold this leaf's value in every run."""
        turn = self.traces[0].calls[k].turn
        found: list[str] = []
        for j in range(k):
            if self.traces[0].calls[j].turn >= turn:
                break  # the model asked for step k before it saw these results
            for p, v in self.index[0][j].items():
                if _same(v, vals[0]) and all(_same(self.index[r][j].get(p, _NO), vals[r]) for r in range(1, self.n)):
                    found.append(p)
        return found

    def _string_template(self, k: int, vals: list[Any], sure: bool) -> str | None:
        """Literal text around known strings (inputs, earlier results), rendering right in every run.

        A result value that was the same in every run is kept as literal text
        (the runs cannot tell it is read from there) and asserted instead: a
        routine learned from two bills that were both "paid" must not write
        "already unpaid" about a third.
        """
        if not isinstance(vals[0], str) or len(vals[0]) < 5:
            return None
        known: list[tuple[str, str]] = [(v[0], f"inputs.{n}") for n, v in self.inputs.values.items()
                                        if isinstance(v[0], str) and len(v[0]) >= 3]
        turn = self.traces[0].calls[k].turn
        for j in range(k):
            if self.traces[0].calls[j].turn < turn:
                known += [(v, p) for p, v in self.index[0][j].items() if isinstance(v, str) and len(v) >= 4 and "\n" not in v]
        known.sort(key=lambda s: -len(s[0]))
        text, spans = vals[0], []
        for s, p in known:
            if len(s) >= len(text):
                continue
            i = text.find(s)
            while i != -1:
                if all(i + len(s) <= a or i >= b for a, b, _ in spans):
                    spans.append((i, i + len(s), p))
                i = text.find(s, i + len(s))
        pinned = []
        for a, b, p in list(spans):
            if sure and not p.startswith("inputs.") and all(
                    _same(self._at(r, p), text[a:b]) for r in range(self.n)):
                spans.remove((a, b, p))
                pinned.append(p)
        if not spans:
            return None
        out, pos = [], 0
        for a, b, p in sorted(spans):
            out += [escape(text[pos:a]), placeholder(p)]
            pos = b
        tpl = "".join([*out, escape(text[pos:])])
        for r in range(self.n):
            try:
                if render(tpl, self._scope(r, k)) != vals[r]:
                    return None
            except Exception:  # noqa: BLE001 - a template that does not render here explains nothing
                return None
        for p in pinned:
            v = self._at(0, p)
            self._assert([p], f"{p} == {_literal(v)}", f"{p} is no longer {_short(v)}")
        pos, kept = 0, []
        for a, b, _ in sorted(spans):
            kept.append(text[pos:a])
            pos = b
        self.pin_embedded(k, "\n".join([*kept, text[pos:]]))
        return tpl

    def _at(self, r: int, path: str) -> Any:
        """The value at a result path in run r (``_NO`` when that run's result has no such node)."""
        j = int(re.match(r"step(\d+)", path).group(1)) - 1  # type: ignore[union-attr]
        return self.index[r][j].get(path, _NO)

    def explain(self, k: int, path: tuple[Any, ...], vals: list[Any]) -> Any:
        """The template of one argument leaf of step k (a :class:`Problem` is noted when nothing explains it)."""
        call = self.traces[0].calls[k]
        arg = ".".join(str(p) for p in path) or "(args)"
        varies = not all(_same(v, vals[0]) for v in vals)
        sure = self.n >= 2 and len({t.task for t in self.traces}) >= 2
        base = next((p for p in reversed(path) if isinstance(p, str)), call.name)

        def note(how: str, tpl: Any) -> Any:
            self.explained.append({"step": f"step{k + 1}", "tool": call.name, "arg": arg, "as": how})
            return tpl

        if not varies and (isinstance(vals[0], (dict, list)) or vals[0] is None or isinstance(vals[0], bool)):
            return note("constant", vals[0])  # an empty list/dict, a flag or null: not evidence of provenance
        have = self.inputs.find(vals)
        if have is not None:
            twice = max(_task_count(v, t.task) for v, t in zip(vals, self.traces))
            if twice > 1:  # "move my Monday meeting to Monday": the day to find and the day to move to
                self.doubts.append(Problem(f"step{k + 1}", call.name, arg, (
                    f"equal to input {have} in every run, but the task held that value in {twice} places: "
                    "the runs cannot tell which one the model read")))
            for p in self._paths(k, vals)[:3]:  # read from a result too: a world where that differs stops it
                self._assert([p], f"{p} == inputs.{have}", f"{p} is not the input {have}")
            return note(f"input {have}", placeholder(f"inputs.{have}"))
        paths = self._paths(k, vals)
        if all(_in_task(v, t.task) for v, t in zip(vals, self.traces)):
            pinned = sure and not varies
            name = self.inputs.add(base, vals, "a value from the task text" + (
                " (pinned: the learned runs all had this value)" if pinned else ""), pinned)
            for p in paths[:3]:  # the runs also found it there: a world where it is not stops the routine
                self._assert([p], f"{p} == inputs.{name}", f"{p} is not the task's {name}")
            return note(f"input {name} (from the task)" + (" pinned" if pinned else ""),
                        placeholder(f"inputs.{name}"))
        if paths and (varies or not sure):
            first = paths[0]
            self._consume(first)
            self._chosen(k, arg, first)
            for other in paths[1:4]:  # the runs could not tell these apart: the routine relies on them agreeing
                self._assert([first, other], f"{first} == {other}", f"{first} and {other} differ")
            return note(f"result {first}", placeholder(first))
        tpl = self._string_template(k, vals, sure) if varies or not sure else None
        if tpl is not None:
            for v in re.findall(r"\{\{ (step\d+[^ ]*) \}\}", tpl):
                self._consume(v)
                self._chosen(k, arg, v)
            return note("text around earlier values", tpl)
        if varies and call.turn == 0:
            name = self.inputs.add(base, vals, f"what you would pass as {call.name}'s {arg!r} for this task", False)
            return note(f"input {name} (the caller supplies it)", placeholder(f"inputs.{name}"))
        if not varies:
            for p in paths[:3]:  # pinned, and the world must still hold the value it came from
                self._assert([p], f"{p} == {_literal(vals[0])}", f"{p} is no longer {_short(vals[0])}")
            if isinstance(vals[0], str):
                self.pin_embedded(k, vals[0])
            elif not paths and call.turn > 0:  # a number the model may have computed from what it saw
                self.pin_numbers(k)
            return note("constant" if sure else "constant (unconfirmed: one run cannot tell)", _const(vals[0]))
        shown = ", ".join(_short(v) for v in vals[:3])
        why = ("the value differs between runs (" + shown + ") and is neither in the task text nor in an earlier "
               "result: the model composed or computed it after seeing results")
        self.problems.append(Problem(f"step{k + 1}", call.name, arg, why))
        return _const(vals[0])  # the first run's value, for a human to edit: the routine is never offered as is

    # -- the whole routine ------------------------------------------------------------------

    def run(self, name: str) -> Induced:
        calls = self.traces[0].calls
        for r, t in enumerate(self.traces):
            self.index[r] = [_index(f"step{j + 1}", c.result) for j, c in enumerate(t.calls)]
        step_args: list[Any] = []
        for k, call in enumerate(calls):
            leaves = _leaves(call.args)
            per_run = [_leaves(t.calls[k].args) for t in self.traces]
            filled: dict[tuple[Any, ...], Any] = {}
            for i, (path, _) in enumerate(leaves):
                filled[path] = self.explain(k, path, [pr[i][1] for pr in per_run])
            step_args.append(_rebuild(call.args, filled))
        for j in range(len(calls)):
            self.invariants(j)
        for k in range(len(calls)):
            self.relations(k, step_args[k])
        steps: list[dict[str, Any]] = []
        for k, call in enumerate(calls):
            steps.append({"id": f"step{k + 1}", "type": "tool.call", "tool": call.name, "args": step_args[k]})
            bad = [p.arg for p in self.problems if p.step == f"step{k + 1}"]
            if bad:
                steps[-1]["description"] = (f"NOT COMPILABLE: {', '.join(bad)} hold(s) the first run's value; "
                                            "nothing explains it in every run (edit before promoting)")
            if k + 1 < len(calls):
                for i, (expr, msg) in enumerate(self.asserts.get(k, [])):
                    steps.append({"id": f"check{k + 1}_{i + 1}", "type": "assert", "expr": expr,
                                  "message": escape(msg)})
        steps.append({"id": "result", "type": "return",
                      "value": [{"tool": c.name, "result": placeholder(f"step{k + 1}")} for k, c in enumerate(calls)]})
        pattern = self._pattern()
        tasks = list(dict.fromkeys(t.task for t in self.traces))
        if self.problems:
            status = "not_compilable"
        elif self.n >= 2 and len(tasks) >= 2 and not self.doubts:
            status = "confirmed"
        else:
            status = "candidate"
        schema = {"type": "object", "properties": self.inputs.schema, "required": list(self.inputs.schema),
                  "additionalProperties": False}
        routine = {
            "name": name,
            "description": describe(tasks, pattern, [c.name for c in calls], self.n,
                                    [s["expr"] for s in steps if s["type"] == "assert"]),
            "version": "1",
            "trusted": False,  # learned is not reviewed: a human promotes it
            "inputs": schema,
            "output": {"type": "array"},
            "tools": {c.name: {} for c in calls},
            "steps": steps,
        }
        return Induced(name, status, routine, self.problems, pattern, self.explained, self.doubts)

    def _pattern(self) -> str | None:
        """The task with each task input's value as ``{name}``, when it reads back every run's task."""
        task = self.traces[0].task
        named = [(n, v[0]) for n, v in self.inputs.values.items() if "task text" in self.inputs.schema[n]["description"]
                 and "const" not in self.inputs.schema[n]]
        if len(named) > 8 or any(len(t.task) > 2000 for t in self.traces):
            return None  # its lazy groups would backtrack too long on such text: no pattern, the embedding matches
        spans: list[tuple[int, int, str]] = []
        for n, v in sorted(named, key=lambda x: -len(str(x[1]))):
            s = str(v)
            i = task.find(s)
            while i != -1 and not all(i + len(s) <= a or i >= b for a, b, _ in spans):
                i = task.find(s, i + 1)
            if i == -1:
                return None
            spans.append((i, i + len(s), n))
        out, rx, pos = [], [], 0
        for a, b, n in sorted(spans):
            out += [task[pos:a], "{" + n + "}"]
            rx += [re.escape(task[pos:a]), f"(?P<{n}>.+?)"]
            pos = b
        out.append(task[pos:])
        rx.append(re.escape(task[pos:]))
        regex = re.compile("".join(rx) + r"\Z", re.S)
        for r, t in enumerate(self.traces):
            m = regex.match(t.task)
            if m is None or any(m.group(n) != str(self.inputs.values[n][r]) for n, _ in named):
                return None
        return "".join(out)


def _const(v: Any) -> Any:
    return escape(v) if isinstance(v, str) else v


def _rebuild(value: Any, filled: dict[tuple[Any, ...], Any], path: tuple[Any, ...] = ()) -> Any:
    if isinstance(value, dict) and value:
        return {k: _rebuild(v, filled, (*path, k)) for k, v in value.items()}
    if isinstance(value, list) and value:
        return [_rebuild(v, filled, (*path, i)) for i, v in enumerate(value)]
    return filled[path]


def describe(tasks: list[str], pattern: str | None, tools: list[str], runs: int, expects: list[str] = ()) -> str:
    """The description the model sees when the routine is offered as a tool."""
    shown = "; ".join(repr(t[:120]) for t in tasks[:3])
    text = f"Learned routine: does in one call what these tasks needed: {shown}."
    if pattern:
        text += f" Task pattern: {pattern}."
    text += f" Calls {', '.join(dict.fromkeys(tools))}."
    if expects:  # what tells two routines of one task pattern apart (a bill unpaid, or already paid)
        text += f" Expects {'; '.join(expects[:4])}{' ...' if len(expects) > 4 else ''}."
    text += (f" Learned from {runs} run(s), not reviewed by a human. "
             "If the world differs from the learned runs it stops and returns what it did and why; then go on by hand.")
    return text


def routine_name(traces: list[AgentTrace], pattern: str | None, taken: set[str]) -> str:
    """A tool-like name from the task's words (``pay_bill``), unique among ``taken``."""
    text = pattern if pattern is not None else traces[0].task
    text = re.sub(r"\{[^}]*\}", " ", text)
    words = [w for w in re.findall(r"[A-Za-z]+", text.lower()) if w not in _STOP][:3]
    base = "_".join(words) or "routine"
    return _ident(base if base not in taken else f"{base}_routine", taken)  # not "transfer_2" beside a tool "transfer"


def induce(traces: list[AgentTrace], name: str | None = None, taken: set[str] | None = None) -> Induced:
    """Induce one routine from runs of the same :func:`shape_of` (``ValueError`` otherwise)."""
    if not traces:
        raise ValueError("induce() needs at least one run")
    shapes = {shape_of(t) for t in traces}
    if len(shapes) != 1:
        raise ValueError("induce() needs runs of one shape (the same tools, turns and argument structure)")
    if not traces[0].calls:
        raise ValueError(f"run {traces[0].run_id} called no tool: there is nothing to learn")
    ind = _Induction(traces)
    done = ind.run(name or "routine")
    if name is None:
        done.name = done.routine["name"] = routine_name(traces, done.pattern, taken or set())
    return done
