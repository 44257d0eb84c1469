"""A hostile outside tester's third round on the sandbox, the CLI and the MCP server.

* Sandbox limits given hostile values (0, negative, NaN, infinite, huge, bool, str) are a
  ``ConfigError`` when the limits are made: wasmtime read -1 as "no limit" (fuel, memory),
  a NaN output cap let a guest write without bound into host memory, NaN or infinite
  seconds raised raw ``ValueError``/``OverflowError``. A granted folder that cannot be
  opened is a ``SandboxError``, not wasmtime's raw error.
* The CLI: values that are not JSON (a lone surrogate, NaN, 1e999) in a file or argument
  the user gave are bad input (exit 2, not 1); ``engrain routines edit`` of a file that is
  not UTF-8 is one line and exit 2 (it was a traceback), and no command reads a given file
  without bound (/dev/zero); ``--json`` keeps stdout JSON when the run itself prints (a
  trusted UDF, a ``--tools`` module); ``serve --port`` out of range is a usage error.
* MCP: a trusted UDF or tool that reads stdin reads end of file; it took the client's
  request lines, which were then never answered. ``list_runs`` refuses a limit below 1
  (it listed one run).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest
import wasmtime

import engrain as eg
from engrain._sandbox.wasi import Limits, WasmTool

ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")


def _cli(*args: str, cwd: Path | None = None, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run([ENGRAIN, *args], capture_output=True, timeout=120, cwd=cwd, input=stdin)
    r.stdout, r.stderr = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
    return r


# -- sandbox: limits ---------------------------------------------------------------------

_HOSTILE_LIMITS = [
    {"fuel": 0}, {"fuel": -1}, {"fuel": 2**64}, {"fuel": True}, {"fuel": "10"}, {"fuel": 1.5},
    {"memory_bytes": 0}, {"memory_bytes": -1}, {"memory_bytes": 2**64}, {"memory_bytes": "x"}, {"memory_bytes": True},
    {"wall_clock_s": 0}, {"wall_clock_s": -1}, {"wall_clock_s": float("nan")}, {"wall_clock_s": float("inf")},
    {"wall_clock_s": 1e300}, {"wall_clock_s": "1"}, {"wall_clock_s": True},
    {"output_bytes": 0}, {"output_bytes": -5}, {"output_bytes": float("nan")}, {"output_bytes": "x"},
    {"readonly_dirs": "/etc"}, {"readonly_dirs": None}, {"readonly_dirs": {1: "/tmp"}},
]


@pytest.mark.parametrize("limits", _HOSTILE_LIMITS, ids=repr)
def test_hostile_sandbox_limits_are_config_errors(limits):
    with pytest.raises(eg.ConfigError, match="sandbox limit"):
        Limits(**limits)


def test_sane_sandbox_limits_still_pass():
    Limits(fuel=None, memory_bytes=1, wall_clock_s=0.001, output_bytes=1)
    Limits(fuel=2**64 - 1, memory_bytes=2**32, wall_clock_s=3600, readonly_dirs={"data": Path("/tmp")})


def test_a_udf_host_refuses_a_hostile_limit_before_compiling_anything(tmp_path):
    from engrain._sandbox.udf_host import SandboxUdfHost

    (tmp_path / "udfs.py").write_text("def f():\n    return 1\n")
    start = time.monotonic()
    with pytest.raises(eg.ConfigError, match="wall_clock_s"):
        SandboxUdfHost(tmp_path / "udfs.py", cache_dir=tmp_path / "cache", wall_clock_s=float("nan"))
    assert time.monotonic() - start < 2 and not (tmp_path / "cache").exists()


def test_a_granted_folder_that_cannot_be_opened_is_a_sandbox_error(tmp_path):
    tool = tmp_path / "echo.wasm"
    tool.write_bytes(wasmtime.wat2wasm('(module (memory (export "memory") 1) (func (export "_start")))'))
    bad = WasmTool(tool, limits=Limits(readonly_dirs={"data": str(tmp_path / "missing")}))
    for _ in range(2):  # and the host goes on
        with pytest.raises(eg.SandboxError, match="cannot grant"):
            bad.call_raw(b"{}")
    (tmp_path / "there").mkdir()
    assert WasmTool(tool, limits=Limits(readonly_dirs={"data": str(tmp_path / "there")})).call_raw(b"{}") == b""


# -- CLI ---------------------------------------------------------------------------------

_HELLO = """\
name: hello
inputs: {type: object, properties: {who: {type: string}}, required: [who]}
steps:
  - {id: result, type: return, value: "hello {{ inputs.who }}"}
"""

_ASKING = """\
name: asking
inputs: {type: object}
steps:
  - id: confirm
    type: prompt.user
    prompt: "Greet?"
    fields: [{name: greeting, type: text}, {name: n, type: number}]
  - {id: result, type: return, value: "{{ confirm.greeting }}"}
"""

_PRINTING = """\
name: printing
trusted: true
inputs: {type: object}
steps:
  - {id: s1, type: udf.call, function: noisy, args: {}}
  - {id: r, type: return, value: "{{ s1 }}"}
"""

_PRINTING_UDFS = """\
import os
print("udfs.py loading")

def noisy():
    print("progress...")
    os.write(1, b"straight to fd 1\\n")
    return {"n": 1}
"""


def _package(root: Path, name: str, yaml: str, udfs: str | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "routine.yaml").write_text(yaml)
    (folder / "input.json").write_text("{}")
    if udfs is not None:
        (folder / "udfs.py").write_text(udfs)
    return folder


@pytest.mark.parametrize("text", ['{"who": "\\ud800"}', '{"who": "a", "x": 1e999}', '{"who": "a", "x": NaN}'])
def test_cli_input_that_is_not_json_is_bad_input(tmp_path, text):
    hello = _package(tmp_path, "hello", _HELLO)
    (tmp_path / "in.json").write_text(text)
    r = _cli("run", str(hello), "-i", str(tmp_path / "in.json"), "--url", f"sqlite:///{tmp_path / 's.db'}", "--json")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert json.loads(r.stdout)["error"] and "Traceback" not in r.stderr


@pytest.mark.parametrize("answers", ['{"greeting": "\\ud800", "n": 1}', '{"greeting": "hi", "n": NaN}',
                                     '{"greeting": "hi", "n": 1e999}'])
def test_cli_answers_that_are_not_json_are_bad_input(tmp_path, answers):
    url = f"sqlite:///{tmp_path / 's.db'}"
    asking = _package(tmp_path, "asking", _ASKING)
    assert _cli("run", str(asking), "--run-id", "p1", "--url", url).returncode == 3
    assert _cli("run", str(asking), "--run-id", "p2", "--url", url).returncode == 3
    (tmp_path / "a.json").write_text(answers)
    for args in (("resume", "p1", "--answers", str(tmp_path / "a.json")), ("answer", "p2", answers)):
        r = _cli(*args, "--url", url, "--json")
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert json.loads(r.stdout)["error"] in ("NotJSONError", "RoutineInputError")


def test_cli_routines_edit_of_a_file_not_utf8_or_unbounded_is_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"name: x\n\xff\n")
    for args, stdin, said in [((str(bad),), None, "not UTF-8"), (("-",), b"name: \xfe\n", "not UTF-8"),
                              (("/dev/zero",), None, "larger than")]:
        r = _cli("routines", "edit", "some-routine", *args, "--url", url, "--json", stdin=stdin)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr[-500:])
        assert said in json.loads(r.stdout)["detail"] and len(r.stderr.strip().splitlines()) == 1


def test_cli_run_of_an_endless_input_file_is_refused(tmp_path):
    hello = _package(tmp_path, "hello", _HELLO)
    r = _cli("run", str(hello), "-i", "/dev/zero", "--url", f"sqlite:///{tmp_path / 's.db'}", "--json")
    assert r.returncode == 2 and "larger than" in json.loads(r.stdout)["detail"]


def test_cli_json_stdout_stays_json_when_the_run_prints(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    pkg = _package(tmp_path, "printing", _PRINTING, _PRINTING_UDFS)
    (tmp_path / "noisytools.py").write_text("import os\nimport engrain\nprint('importing')\n"
                                            "os.write(1, b'fd 1 at import\\n')\nreg = engrain.tools\n")
    for args in (("run", str(pkg), "--url", url), ("run", str(pkg), "--tools", "noisytools:reg", "--url", url),
                 ("validate", str(pkg), "--tools", "noisytools:reg")):
        r = _cli(*args, "--json", cwd=tmp_path)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        out = json.loads(r.stdout)  # only the command's JSON
        assert out.get("output", {"n": 1}) == {"n": 1}
        if args[0] == "run":
            assert "progress..." in r.stderr and "straight to fd 1" in r.stderr
    r = _cli("run", str(pkg), "--url", url)  # without --json the run's prints stay where they were
    assert r.returncode == 0 and "progress..." in r.stdout


@pytest.mark.parametrize("port", ["99999", "-1"])
def test_cli_serve_port_out_of_range_is_a_usage_error(tmp_path, port):
    r = _cli("serve", "--port", port, "--url", f"sqlite:///{tmp_path / 's.db'}")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-500:]
    assert "--port" in r.stderr


# -- MCP ---------------------------------------------------------------------------------

_READER = """\
name: reader
trusted: true
inputs: {type: object}
steps:
  - {id: s1, type: udf.call, function: reader, args: {}}
  - {id: r, type: return, value: "{{ s1 }}"}
"""

_READER_UDFS = """\
import sys

def reader():
    return {"read": sys.stdin.readline()}
"""


def test_mcp_a_udf_reading_stdin_takes_no_request_of_the_client(tmp_path):
    _package(tmp_path / "routines", "reader", _READER, _READER_UDFS)
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    proc = subprocess.Popen([ENGRAIN, "mcp", "--url", f"sqlite:///{tmp_path / 'm.db'}", "--routines", str(tmp_path / "routines")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=str(tmp_path))

    def send(message: dict) -> None:
        proc.stdin.write(json.dumps(message).encode() + b"\n")
        proc.stdin.flush()

    replies: dict = {}
    try:
        send(init)
        assert select.select([proc.stdout], [], [], 60)[0], "no reply to initialize"
        proc.stdout.readline()
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "run_routine", "arguments": {"name": "reader"}}})
        time.sleep(2)  # the UDF is reading stdin by now
        send({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
        while len(replies) < 2 and select.select([proc.stdout], [], [], 20)[0]:
            reply = json.loads(proc.stdout.readline())
            replies[reply["id"]] = reply
    finally:
        proc.kill()
        proc.wait()
    assert sorted(replies) == [2, 3], replies
    result = json.loads(replies[2]["result"]["content"][0]["text"])
    assert result["status"] == "ok" and result["output"] == {"read": ""}


def test_mcp_list_runs_refuses_a_limit_below_one(tmp_path):
    from mcp.server.mcpserver.exceptions import ToolError

    from engrain._mcp import build_server

    url = f"sqlite:///{tmp_path / 'm.db'}"
    with eg.open(url) as j:
        for i in range(3):
            eg.run(lambda t: 1, "t", run_id=f"r{i}", journal=j)
    server = build_server(url, str(tmp_path / "routines"))

    async def call(limit: int):
        return await server.call_tool("list_runs", {"limit": limit})

    for limit in (0, -5):
        with pytest.raises(ToolError, match="limit must be at least 1"):
            anyio.run(call, limit)
    assert len(anyio.run(call, 2).structured_content["result"]) == 2
