"""A compiled routine calls its tools and UDFs exactly as the recorded run did.

Each test records a real run (or an em-core trace), compiles it into a package
on tmp_path, runs the package with the real runner and compares what the tools
received, and what the routine returned, with the recording: escaped ``{{`` in
steps with no variable (issue 41 #5), tools and UDFs taking ``**kwargs`` /
``*args`` / positional-only parameters (#6), and YAML line breaks and controls
(NEL, LS, PS, ...) in keys and values (#10).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import engrain as eg
from engrain._durable.trace import export_run

TRICKY = [
    "{{", "}}", "{{x}}", "Hello {{first_name}}, your order shipped", "{{ inputs.secret }}", "{{{", "{{'}}",
    "a }} b", "{% raw %}", "{%- if x %}", "{# c #}", "{{ '{{' }}", "'quoted'", '"dq"', "it's", "\\", "%",
    "yes", "NO", "off", "null", "~", "1e3", "0x1F", "2024-01-01", "12:30", ".inf", "True", "None", "100", "",
    "key: value", "- item", "#hash", "&anchor", "*alias", "!!python/object:os.system", "<<", "? q", "| pipe", "> gt",
    "@at", "`tick`", " lead", "trail ", "multi\nline", "é", "e\u0301", "日本語", "🙂", "[1, 2]", "{a: 1}",
]
# YAML line breaks (NEL, LS, PS), controls, BOM: each must come back as the same character.
BREAKS = ["\x85", "\u2028", "\u2029", "\r", "\r\n", "\t", "\x00", "\x01", "\x08", "\x0b", "\x1b", "\x1f", "\x7f",
          "\x80", "\x9f", "\ufeff", "\ufffe"]


def _record(agent: Any, inputs: dict[str, Any], tmp_path: Path, name: str = "pkg") -> tuple[eg.RunResult, Path]:
    j = eg.open(f"sqlite:///{tmp_path / 'rec.db'}")
    res = eg.run(agent, f"record {name}", inputs=inputs, journal=j)
    assert res.status == "ok", res.error
    return res, eg.compile_trace(export_run(j, res.run_id), tmp_path / name)


def _replay(out: Path, inputs: dict[str, Any], tools: Any, tmp_path: Path) -> eg.RunResult:
    j = eg.open(f"sqlite:///{tmp_path / 'run.db'}")
    res = eg.run_routine(out, inputs, tools=tools, journal=j, sandbox=False)
    assert res.status == "ok", (res.error, getattr(res, "message", None))
    return res


def _echo_tools(log: list[Any]) -> eg.ToolRegistry:
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg)
    def send(text: Any) -> str:
        log.append(("send", text))
        return "sent"

    @eg.tool(registry=reg)
    def put(record: dict) -> str:
        log.append(("put", record))
        return "stored"

    @eg.tool(registry=reg)
    def fetch(i: int) -> Any:
        log.append(("fetch", i))
        return {"text": TRICKY[i], "row": {TRICKY[i] or "empty": [TRICKY[i]]}}

    return reg


def test_recorded_text_reaches_the_tool_unchanged(tmp_path):
    """Round trip: tricky strings as tool args (alone, so the step has no variable), as dict keys, and as
    return values the later steps and the routine's output are templated from."""
    log: list[Any] = []
    tools = _echo_tools(log)
    send, put, fetch = (tools.get(n) for n in ("send", "put", "fetch"))

    def agent(task: str, secret: str) -> Any:
        for s in TRICKY:
            send(s)
        put({s or "empty": s for s in TRICKY})
        rows = [fetch(i) for i in range(len(TRICKY))]
        for r in rows:
            send(f"got {r['text']}!")
        return {"texts": TRICKY, "rows": rows, "by_key": {s or "empty": s for s in TRICKY}}

    recorded, out = _record(agent, {"secret": "TOPSECRET"}, tmp_path)
    want = list(log)
    log.clear()
    res = _replay(out, {"secret": "TOPSECRET"}, tools, tmp_path)
    assert log == want
    assert res.output == recorded.output
    # A step whose only template syntax is an escaped literal still renders (the first send, "{{").
    first = eg.load_routine(out).steps[0]
    assert first.spec["args"] == {"text": "{{ '{{' }}"} and first.dynamic


def test_hand_written_escaped_literal_renders_to_braces(tmp_path):
    """A hand-written routine's ``{{ '{{' }}`` in a step with no variable is the text ``{{``."""
    pkg = tmp_path / "hand"
    pkg.mkdir()
    (pkg / "routine.yaml").write_text(
        "name: hand\ninputs: {type: object}\nsteps:\n"
        "- id: s1\n  type: tool.call\n  tool: send\n  args:\n    text: \"Hi {{ '{{' }}name}} and {{ \\\"}}\\\" }}\"\n"
        "- id: out\n  type: return\n  value: [\"{{ '{{' }}\", {k: \"{{ '{{' }}{{ '{{' }}\"}]\n"
    )
    log: list[Any] = []
    res = _replay(pkg, {}, _echo_tools(log), tmp_path)
    assert log == [("send", "Hi {{name}} and }}")]
    assert res.output == ["{{", {"k": "{{{{"}]


def test_yaml_line_breaks_and_controls_survive_compile(tmp_path):
    """NEL, LS, PS, CR, tab, controls and BOM in keys and values come back as recorded, whichever parser."""
    import yaml

    log: list[Any] = []
    tools = _echo_tools(log)
    send, put = tools.get("send"), tools.get("put")
    values = [f"a{c}b" for c in BREAKS] + [c for c in BREAKS] + ["\x85lead", "trail\u2028", "\ufeffbom"]
    keys = {f"k{c}ey": f"v{c}al" for c in BREAKS} | {c: i for i, c in enumerate(BREAKS)}

    def agent(task: str, x: dict) -> Any:
        for v in values:
            send(v)
        put(keys)
        put(x)  # an input whose keys hold NEL: templated as inputs.x["k\x85"], a path through such a key
        return {"keys": keys, "x": x["k\x85"]}

    inputs = {"x": {"k\x85": "nel value", "k\u2028": "ls value"}}
    recorded, out = _record(agent, inputs, tmp_path)
    want = list(log)
    log.clear()
    res = _replay(out, inputs, tools, tmp_path)
    assert log == want
    assert res.output == recorded.output
    text = (out / "routine.yaml").read_text(encoding="utf-8")
    assert not any(c in text for c in "\x85\u2028\u2029\r\ufeff"), "line breaks and BOM are written escaped"
    raw = eg.load_routine(out).raw
    assert yaml.load(text, Loader=yaml.SafeLoader) == raw  # users' PyYAML may be pure Python or libyaml
    if getattr(yaml, "__with_libyaml__", False):
        assert yaml.load(text, Loader=yaml.CSafeLoader) == raw


def _kw_tools(log: list[Any]) -> eg.ToolRegistry:
    reg = eg.ToolRegistry()

    @eg.tool(registry=reg)
    def create_user(name: str, **fields: Any) -> str:
        log.append(("create_user", name, fields))
        return f"user-{name}"

    @eg.tool(registry=reg)
    def tag(item: str, *labels: str, sep: str = "/") -> str:
        log.append(("tag", item, labels, sep))
        return sep.join((item, *labels))

    @eg.tool(registry=reg)
    def scale(x: int, /, factor: int = 2) -> int:
        log.append(("scale", x, factor))
        return x * factor

    return reg


def test_kwargs_tool_gets_its_keywords_back(tmp_path):
    log: list[Any] = []
    tools = _kw_tools(log)
    create_user = tools.get("create_user")

    def agent(task: str, who: str) -> Any:
        return [create_user(who, role="admin", team="ops"), create_user(who, name_="x"), create_user(who)]

    _, out = _record(agent, {"who": "ann"}, tmp_path)
    assert [e[2] for e in log] == [{"role": "admin", "team": "ops"}, {"name_": "x"}, {}]
    log.clear()
    res = _replay(out, {"who": "bob"}, tools, tmp_path)
    assert log == [("create_user", "bob", {"role": "admin", "team": "ops"}), ("create_user", "bob", {"name_": "x"}),
                   ("create_user", "bob", {})]
    assert res.output == ["user-bob"] * 3


def test_positional_only_tool_is_called_positionally(tmp_path):
    log: list[Any] = []
    tools = _kw_tools(log)
    scale = tools.get("scale")

    def agent(task: str, n: int) -> Any:
        return [scale(n, factor=3), scale(n)]

    _, out = _record(agent, {"n": 5}, tmp_path)
    log.clear()
    res = _replay(out, {"n": 7}, tools, tmp_path)
    assert log == [("scale", 7, 3), ("scale", 7, 2)]
    assert res.output == [21, 14]


def test_kwargs_tool_in_a_hand_written_routine_takes_plain_keywords(tmp_path):
    """Keys naming no parameter go into ``**fields`` as before; the recorded ``fields:`` mapping is spread."""
    pkg = tmp_path / "hand"
    pkg.mkdir()
    (pkg / "routine.yaml").write_text(
        "name: hand\ninputs: {type: object}\nsteps:\n"
        "- id: a\n  type: tool.call\n  tool: create_user\n  args: {name: ann, role: admin}\n"
        "- id: b\n  type: tool.call\n  tool: create_user\n  args: {name: bob, fields: {team: ops}, role: dev}\n"
        "- id: out\n  type: return\n  value: done\n"
    )
    log: list[Any] = []
    _replay(pkg, {}, _kw_tools(log), tmp_path)
    assert log == [("create_user", "ann", {"role": "admin"}), ("create_user", "bob", {"role": "dev", "team": "ops"})]


def test_var_positional_tool_from_a_trace_gets_its_positional_arguments(tmp_path):
    """A trace records ``*labels`` as the list under its name (em-core here; the journal binds calls the same way)."""
    trace = {
        "version": "1",
        "app": {"name": "tagger"},
        "mission": {"goal": "tag", "input_summary": {"item": "invoice-7"}},
        "events": [{"type": "tool_call", "seq": 0, "tool": "tag",
                    "args": {"item": "invoice-7", "labels": ["paid", "q3"], "sep": "|"}, "result": "invoice-7|paid|q3"}],
        "final_output": "invoice-7|paid|q3",
    }
    out = eg.compile_trace(trace, tmp_path / "pkg")
    log: list[Any] = []
    res = _replay(out, {"item": "invoice-9"}, _kw_tools(log), tmp_path)
    assert log == [("tag", "invoice-9", ("paid", "q3"), "|")]
    assert res.output == "invoice-9|paid|q3"


@eg.udf
def label(name: str, **extra: Any) -> str:
    return name + ":" + ",".join(f"{k}={v}" for k, v in sorted(extra.items()))


@eg.udf
def halve(x: int, /) -> int:
    return x // 2


def test_kwargs_udf_compiles_to_a_keyword_call(tmp_path):
    """The journal records ``**extra`` as one argument; the compiled step spreads it, so the UDF gets its keywords."""

    def agent(task: str, who: str) -> Any:
        return [label(who, role="admin", team="ops"), label(who, extra=1), label(who)]

    recorded, out = _record(agent, {"who": "ann"}, tmp_path)
    assert recorded.output == ["ann:role=admin,team=ops", "ann:extra=1", "ann:"]
    assert [r.generalized for r in out.report] == [True]
    res = _replay(out, {"who": "bob"}, eg.ToolRegistry(), tmp_path)
    assert res.output == ["bob:role=admin,team=ops", "bob:extra=1", "bob:"]
    steps = eg.load_routine(out).raw["steps"]
    assert steps[0]["args"] == {"name": "{{ inputs.who }}", "role": "admin", "team": "ops"}


def test_positional_only_udf_replays_by_keyword(tmp_path):
    """A keyword call cannot fill ``x, /``: the compiled UDF replays its recorded results, and says why."""

    def agent(task: str, n: int) -> Any:
        return halve(n)

    recorded, out = _record(agent, {"n": 10}, tmp_path)
    res = _replay(out, {"n": 10}, eg.ToolRegistry(), tmp_path)
    assert res.output == recorded.output == 5
    (r,) = out.report
    assert not r.generalized and "positional-only" in (r.reason or "")
