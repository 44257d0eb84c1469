"""Compile a trace into a routine package.

A trace is either our own export of a journal run (``engrain.trace/1``) or the
em-core format (``{version, app, mission, events[{type: tool_call|udf_call|
approval, ...}], final_output}``). Failed attempts are dropped (only the call
that succeeded is kept), LLM calls and ``udf_call`` events become UDFs that
replay their recorded results, approvals become ``prompt.user`` steps with the
recorded answer as default, and arguments are parameterized by provenance: a
value becomes ``{{ inputs.x }}`` / ``{{ stepN.path }}`` only when it equals a
(non-trivial) value seen earlier in the inputs or in a result.
"""

from __future__ import annotations

import ast
import json
import keyword
import os
import pathlib
import re
from dataclasses import dataclass, field
from typing import Any

from .._errors import EngrainError, RoutineError, TraceError
from .udfs_file import UdfReport, check_recorded, udfs_source
from .yamlfile import dumper

#: Values too common to be evidence of provenance (``True``, ``0``, ``"id"``...).
_MIN_STRING = 3
_MIN_SUBSTRING = 4
_MAX_NODES = 20_000  # per source: bounds indexing time on huge results


@dataclass(slots=True)
class _Call:
    """One successful call, prompt, or the final return, in trace order."""

    kind: str  # tool | udf | prompt
    name: str
    args: dict[str, Any]
    result: Any = None
    prompt: str = ""
    fields: list[dict[str, Any]] = field(default_factory=list)
    udf: Any = None  # what the journal recorded about a UDF's source (see _durable.udf), or why it is a stub


@dataclass(slots=True)
class _Trace:
    name: str
    description: str
    inputs: dict[str, Any]
    calls: list[_Call]
    output: Any
    version: str = "1"


def _slug(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()
    return s[:60] or "routine"


def _read_trace(trace: dict[str, Any] | str | os.PathLike[str]) -> tuple[dict[str, Any], str]:
    """The trace's data, checked against its format's schema, and its format (``engrain`` or ``emcore``)."""
    from .trace_schema import validate_trace

    if not isinstance(trace, (str, os.PathLike)):
        return trace, validate_trace(trace)  # type: ignore[return-value]
    path = pathlib.Path(trace)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise TraceError(str(path), "(root)", f"not JSON (line {e.lineno}: {e.msg})") from None
    except RecursionError:
        raise TraceError(str(path), "(root)", "nested too deeply to parse") from None
    except UnicodeDecodeError as e:
        raise TraceError(str(path), "(root)", f"not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})") from None
    return data, validate_trace(data, str(path))


_FOLDED = ("step.started", "step.completed", "step.failed", "input.requested", "input.received")


def _from_engrain(data: dict[str, Any], source: str = "trace") -> _Trace:
    """Our own trace: fold the journal events into the calls that completed."""
    events = data.get("events") or []
    run = data.get("run") or {}
    started = next((e.get("data") or {} for e in events if e.get("kind") == "run.started"), {})
    inputs = started.get("inputs", run.get("inputs")) or {}
    if "routine" in (started.get("tags") or []) and isinstance(inputs, dict) and "routine" in inputs:
        # A routine run records its package and options around the routine's own inputs.
        inputs = inputs.get("inputs") or {}
    task = str(started.get("task", run.get("task", "")) or "")
    calls: dict[int, _Call] = {}
    order: list[int] = []
    output: Any = None
    for i, e in enumerate(events):
        kind, d = e.get("kind"), e.get("data") or {}
        cid = d.get("call_id")
        if cid in calls and kind in _FOLDED:
            # A name left out (a hand-written trace's answer) is no other call's.
            if e.get("name") not in ("", None, calls[cid].name) or (kind == "input.requested" and calls[cid].kind == "prompt"):
                # One call_id is one call: a second one there would replace it, and the routine lose a call.
                raise TraceError(source, f"events[{i}].data.call_id", f"{cid} already belongs to {calls[cid].name!r}")
            if kind.startswith("input.") and calls[cid].kind != "prompt":
                continue  # an at-most-once step's "did it happen?" after a crash: the answer comes back as its outcome
        if kind in ("step.completed", "step.failed") and cid not in calls and "args" in d:
            # A completion-only step (the default): its outcome carries its type and arguments.
            if d.get("type") in ("clock", "patch", "sleep"):
                continue
            calls[cid] = _Call("udf" if d.get("type") in ("udf", "llm") else "tool", e.get("name", ""), d.get("args") or {})
            calls[cid].result = _MISSING
            order.append(cid)
        if kind == "step.started" and cid not in calls:
            stype = d.get("type", "tool")
            if stype in ("clock", "patch", "sleep"):
                continue  # engrain.now(): the routine reads the real clock
            kind_ = "udf" if stype in ("udf", "llm") else "tool"
            calls[cid] = _Call(kind_, e.get("name", ""), d.get("args") or {})
            calls[cid].result = _MISSING
            if stype == "llm":
                calls[cid].udf = {"uncaptured": "an LLM call: its recorded answers are replayed"}
            order.append(cid)
        elif kind == "step.completed" and cid in calls:
            calls[cid].result = d.get("result")
            if "udf" in d:
                calls[cid].udf = d["udf"]
        elif kind == "step.failed" and cid in calls:
            calls[cid].result = _MISSING
        elif kind == "input.requested":
            c = _Call("prompt", e.get("name", ""), {}, _MISSING, str(d.get("prompt", "")), list(d.get("fields") or []))
            calls[cid] = c
            order.append(cid)
        elif kind == "input.received" and cid in calls:
            calls[cid].result = d.get("answers")
        elif kind == "run.completed":
            output = d.get("output")
    if not any(e.get("kind") == "run.completed" for e in events):
        raise EngrainError(
            f"trace of run {run.get('run_id', '?')!r} has no run.completed event: only a finished, successful run compiles"
        )
    kept = [calls[c] for c in order if calls[c].result is not _MISSING]
    # Within a run a UDF's source is journaled once; later calls carry its sha256.
    # The digests are trace data: only strings key the table (a list or dict there is no digest, and unhashable).
    sources = {u["sha256"]: u for c in kept if isinstance(u := c.udf, dict) and "source" in u and isinstance(u.get("sha256"), str)}
    for c in kept:
        if isinstance(c.udf, dict) and "source" not in c.udf and isinstance(c.udf.get("sha256"), str) and c.udf["sha256"] in sources:
            c.udf = sources[c.udf["sha256"]]
    return _Trace(_slug(task), task, inputs if isinstance(inputs, dict) else {"input": inputs}, kept, output)


def _from_emcore(data: dict[str, Any]) -> _Trace:
    app = data.get("app") or {}
    mission = data.get("mission") or {}
    inputs = mission.get("input_summary") or {}
    calls: list[_Call] = []
    for i, e in enumerate(sorted(data.get("events") or [], key=lambda e: e.get("seq", 0))):
        if not isinstance(e, dict):
            raise EngrainError(f"em-core trace: events[{i}] must be an object")
        if e.get("error"):
            continue  # a failed attempt: the retry that succeeded follows it
        t = e.get("type")
        if t == "tool_call":
            calls.append(_Call("tool", str(e.get("tool", "")), e.get("args") or {}, e.get("result")))
        elif t == "udf_call":
            calls.append(_Call("udf", str(e.get("function", "")), e.get("args") or {}, e.get("result"),
                               udf={"uncaptured": "an em-core trace records no source"}))
        elif t == "approval":
            calls.append(_Call("prompt", "approval", {}, e.get("answer"), str(e.get("prompt", ""))))
        else:
            raise EngrainError(f"em-core trace: events[{i}].type {t!r} is not tool_call, udf_call or approval")
    name = str(app.get("name") or mission.get("goal") or "routine")
    goal = str(mission.get("goal", ""))
    inputs = inputs if isinstance(inputs, dict) else {"input": inputs}
    return _Trace(_slug(name), goal, inputs, calls, data.get("final_output"), str(app.get("version") or "1"))


class _MissingType:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _MissingType()


def _trivial(v: Any) -> bool:
    if v is None or isinstance(v, bool):
        return True
    if isinstance(v, (int, float)):
        return abs(v) < 2
    if isinstance(v, str):
        return len(v) < _MIN_STRING
    if isinstance(v, (list, dict)):
        return len(v) == 0
    return True


def _key(v: Any) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def _child(path: str, k: Any) -> str | None:
    if isinstance(k, int):
        return f"{path}[{k}]"
    # isidentifier() also admits combining accents and a middle dot, which a dotted template path cannot spell
    if (isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k) and not k.startswith("_")
            and all(c.isalnum() or c == "_" for c in k)):
        return f"{path}.{k}"
    if isinstance(k, str) and k and not any(c in k for c in '"\\{}'):
        return f'{path}["{k}"]'  # keys a dotted path cannot name (``_id``, ``my key``)
    return None  # not addressable by a template path


class _Provenance:
    """Values seen so far (inputs first, then results in order) and where they came from."""

    def __init__(self) -> None:
        self.whole: dict[str, str] = {}
        self.strings: list[tuple[str, str]] = []

    def add(self, path: str, value: Any) -> None:
        stack = [(path, value)]
        n = 0
        while stack and n < _MAX_NODES:
            p, v = stack.pop(0)
            n += 1
            if not _trivial(v):
                self.whole.setdefault(_key(v), p)
                if isinstance(v, str) and len(v) >= _MIN_SUBSTRING and "\n" not in v:
                    self.strings.append((v, p))
            if isinstance(v, dict):
                stack.extend((c, x) for k, x in v.items() if (c := _child(p, k)) is not None)
            elif isinstance(v, list):
                stack.extend((f"{p}[{i}]", x) for i, x in enumerate(v))
        self.strings.sort(key=lambda s: -len(s[0]))

    def param(self, v: Any, placeholder: Any) -> Any:
        if not _trivial(v):
            hit = self.whole.get(_key(v))
            if hit is not None:
                return placeholder(hit)
        if isinstance(v, dict):
            return {k: self.param(x, placeholder) for k, x in v.items()}
        if isinstance(v, list):
            return [self.param(x, placeholder) for x in v]
        if isinstance(v, str):
            return self._substrings(v, placeholder)
        return v

    def _substrings(self, text: str, placeholder: Any) -> str:
        # Longest known strings first; each span of text is replaced at most once.
        spans: list[tuple[int, int, str]] = []
        for s, p in self.strings:
            if len(s) >= len(text):
                continue
            start = text.find(s)
            while start != -1:
                end = start + len(s)
                # "test" inside "latest" is a coincidence: another input would make it "labob"
                if not _inside_word(text, start, end) and all(end <= a or start >= b for a, b, _ in spans):
                    spans.append((start, end, p))
                start = text.find(s, end)
        if not spans:
            return escape(text)
        out, pos = [], 0
        for a, b, p in sorted(spans):
            out.append(escape(text[pos:a]))
            out.append(placeholder(p))
            pos = b
        out.append(escape(text[pos:]))
        return "".join(out)


def _inside_word(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` runs on into the letters or digits around it (part of a longer word or number)."""
    def glued(a: str, b: str) -> bool:
        return (a.isalpha() and b.isalpha()) or (a.isdigit() and b.isdigit())
    return (start > 0 and glued(text[start - 1], text[start])) or (end < len(text) and glued(text[end - 1], text[end]))


def escape(text: str) -> str:
    """Recorded text as a template that renders back to itself (a literal ``{{`` is escaped)."""
    from .template import escape as _escape

    return _escape(text)


def _literal_template(v: Any) -> Any:
    if isinstance(v, str):
        return escape(v)
    if isinstance(v, dict):
        return {k: _literal_template(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_literal_template(x) for x in v]
    return v


def _ident(name: str, taken: set[str]) -> str:
    base = re.sub(r"\W", "_", name, flags=re.ASCII).strip("_") or "udf"
    if base[0].isdigit() or keyword.iskeyword(base):
        base = f"udf_{base}"
    out, n = base, 2
    while out in taken:
        out, n = f"{base}_{n}", n + 1
    taken.add(out)
    return out


def _schema_of(v: Any, depth: int = 0) -> dict[str, Any]:
    t = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object", type(None): "null"}[type(v)]
    if t == "object" and depth == 0:
        return {"type": "object", "properties": {k: _schema_of(x, 1) for k, x in v.items()}, "required": list(v)}
    return {"type": "number"} if t == "integer" and depth > 0 else {"type": t}


def _prompt_fields(call: _Call) -> tuple[list[dict[str, Any]], Any]:
    """prompt.user fields with the recorded answers as defaults, and the answers as a dict."""
    ans = call.result
    if isinstance(call.fields, list) and call.fields and all(isinstance(f, dict) and "name" in f for f in call.fields):
        fields = []
        for f in call.fields:
            f = {k: v for k, v in f.items() if k in ("name", "type", "options", "default", "label")}
            f.setdefault("type", "text")
            if isinstance(ans, dict) and f["name"] in ans:
                f["default"] = _literal_template(ans[f["name"]])
            fields.append(f)
        return fields, ans
    if not isinstance(ans, dict):
        ans = {"approved": ans} if isinstance(ans, bool) or ans is None else {"answer": ans}
    fields = []
    for k, v in ans.items():
        ftype = "boolean" if isinstance(v, bool) else "number" if isinstance(v, (int, float)) else "text"
        f: dict[str, Any] = {"name": str(k), "type": ftype}
        if v is not None:
            f["default"] = _literal_template(v if ftype != "text" or isinstance(v, str) else json.dumps(v))
        fields.append(f)
    return fields, ans


class CompiledRoutine(type(pathlib.Path())):  # type: ignore[misc]
    """The folder of a compiled routine package (a :class:`pathlib.Path`) with its compile ``report``.

    ``report`` lists each UDF as a :class:`UdfReport`: ``generalized`` when its
    recorded source was written into ``udfs.py``, else the ``reason`` it replays
    recorded results. Paths derived from it (``path / "x"``) have ``report = []``.
    """

    report: list[UdfReport] = []

    def stubs(self) -> list[UdfReport]:
        """The UDFs that only replay recorded results (the routine fails on other inputs there)."""
        return [r for r in self.report if not r.generalized]


def compile_trace(trace: dict[str, Any] | str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> CompiledRoutine:
    """Compile ``trace`` (a dict or a JSON file) into a routine package in ``out_dir``; return the folder.

    Writes ``routine.yaml``, ``udfs.py`` (when the trace has UDF or LLM calls),
    ``input.json`` (the recorded inputs) and ``expected_output.json``. A UDF
    recorded with its source (``@engrain.udf``) is written as the real function;
    any other becomes a stub replaying its recorded results, and the returned
    path's ``report`` says which and why. The routine is written ``trusted:
    false``, so its UDFs run in the WASM sandbox until a human marks it trusted.
    The package is validated before this returns (:class:`~engrain.RoutineError`
    otherwise).
    """
    import yaml

    from . import template as _template
    from .loader import validate_routine

    data, fmt = _read_trace(trace)
    t = _from_engrain(data, str(trace) if isinstance(trace, (str, os.PathLike)) else "trace") if fmt == "engrain" else _from_emcore(data)

    prov = _Provenance()
    prov.add("inputs", t.inputs)
    ph = _template.placeholder
    steps: list[dict[str, Any]] = []
    tools: dict[str, dict[str, Any]] = {}
    udfs: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    udf_names: dict[str, str] = {}
    recorded: dict[str, dict[str, Any]] = {}
    reasons: dict[str, str] = {}
    taken: set[str] = set()
    sigs: dict[str, ast.arguments | None] = {}
    for call in t.calls:
        sid = f"step{len(steps) + 1}"
        if call.kind == "tool":
            tools.setdefault(call.name, {})
            steps.append({"id": sid, "type": "tool.call", "tool": call.name, "args": {k: prov.param(v, ph) for k, v in call.args.items()}})
        elif call.kind == "udf":
            fname = udf_names.get(call.name) or udf_names.setdefault(call.name, _ident(call.name, taken))
            call.args = _as_keywords(call.args, _params(call.udf, sigs))
            records = udfs.setdefault(fname, [])
            if not any(_key(a) == _key(call.args) for a, _ in records):
                records.append((call.args, call.result))
            _note_source(fname, call.udf, recorded, reasons, _params(call.udf, sigs))
            steps.append({"id": sid, "type": "udf.call", "function": fname, "args": {k: prov.param(v, ph) for k, v in call.args.items()}})
        else:
            fields, answers = _prompt_fields(call)
            call.result = answers
            steps.append({"id": sid, "type": "prompt.user", "prompt": prov.param(call.prompt, ph), "fields": fields})
            if answers.get("approved") is True:
                prov.add(sid, call.result)
                steps.append({
                    "id": f"step{len(steps) + 1}",
                    "type": "assert",
                    "expr": f"{sid}.approved",
                    "message": f"not approved: {steps[-1]['prompt']}",
                })
                continue
        prov.add(sid, call.result)
    steps.append({"id": "result", "type": "return", "value": prov.param(t.output, ph)})
    routine: dict[str, Any] = {
        "name": t.name,
        "description": t.description or f"compiled from a trace of {t.name}",
        "version": t.version,
        "trusted": False,  # generated UDFs run sandboxed until a human vouches for them
        "inputs": _schema_of(t.inputs),
        "output": {"type": _schema_of(t.output)["type"]},
    }
    if tools:
        routine["tools"] = tools
    routine["steps"] = steps

    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "routine.yaml").write_text(
        yaml.dump(routine, Dumper=dumper(), sort_keys=False, allow_unicode=True, width=100), encoding="utf-8"
    )
    report: list[UdfReport] = []
    if udfs:
        source, report = udfs_source(udfs, recorded, reasons)
        (out / "udfs.py").write_text(source, encoding="utf-8")
    (out / "input.json").write_bytes(_json_file(t.inputs))
    (out / "expected_output.json").write_bytes(_json_file(t.output))
    issues = validate_routine(out)
    if issues:
        raise RoutineError(str(out), issues)
    done = CompiledRoutine(out)
    done.report = report
    return done


def _json_file(value: Any) -> bytes:
    """``value`` as a JSON file; a lone surrogate (valid JSON, not UTF-8) is kept as its ``\\u`` escape."""
    try:
        return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(value, indent=2) + "\n").encode("ascii")


def _params(info: Any, sigs: dict[str, ast.arguments | None]) -> ast.arguments | None:
    """The parameters of a UDF's recorded source, if usable (parsed once per source)."""
    src = info.get("source") if isinstance(info, dict) else None
    if not isinstance(src, str):
        return None
    if src not in sigs:
        node = ast.parse(src).body[0] if check_recorded(info) is None else None
        sigs[src] = node.args if isinstance(node, ast.FunctionDef) else None
    return sigs[src]


def _as_keywords(args: dict[str, Any], params: ast.arguments | None) -> dict[str, Any]:
    """Recorded UDF arguments as the keywords the runner calls it with.

    The journal records ``**extra`` as one argument named ``extra``; the runner
    calls ``fn(**args)``, which would pass that mapping as a keyword ``extra``.
    """
    kw = params.kwarg.arg if params is not None and params.kwarg is not None else None
    extra = args.get(kw) if kw is not None else None
    if not isinstance(extra, dict):
        return args
    named = {p.arg for p in params.posonlyargs + params.args + params.kwonlyargs}  # type: ignore[union-attr]
    if any(k in named for k in extra):
        return args  # only reachable through positional-only names; left as recorded
    return {**{k: v for k, v in args.items() if k != kw}, **extra}


def _note_source(
    fname: str, info: Any, recorded: dict[str, dict[str, Any]], reasons: dict[str, str], params: ast.arguments | None = None
) -> None:
    """Keep the recorded source of UDF ``fname`` if it is usable, else the reason it is a stub."""
    if fname in reasons:
        return
    problem = check_recorded(info)
    if problem is None and params is not None and (params.posonlyargs or params.vararg):
        # The runner calls a UDF by keyword only; the stub replays by keyword too.
        problem = "its positional-only or *args parameters cannot be called by keyword"
    if problem is not None:
        recorded.pop(fname, None)
        reasons[fname] = problem
    elif fname in recorded and recorded[fname].get("sha256") != info.get("sha256"):
        recorded.pop(fname)
        reasons[fname] = "the trace records two different sources for it"
    else:
        recorded[fname] = info
