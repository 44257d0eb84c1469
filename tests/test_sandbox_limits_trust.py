"""WASM sandbox limits hold against a guest that tries to get around them, and errors stay typed.

- wall_clock_s stops a guest waiting in WASI's poll_oneoff (a sleep), not only running code;
- memory_bytes covers all the host memory a guest can take: one linear memory, bounded tables;
- a tool's stdout must be strict JSON, and bad JSON of any shape is a SandboxError;
- a tool file that is not a regular file holding a binary module with ``_start`` is refused
  when loaded, with a SandboxError naming it (a FIFO does not hang the host);
- a failed run counts as a memory-limit hit only when a memory grow was actually refused.

Tools are tiny C programs (Debian clang + wasi-libc, as in test_sandbox.py) or WAT.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import threading
import time

import pytest
import wasmtime

import engrain
from engrain import SandboxError, SandboxLimitError
from engrain._durable.tools import ToolRegistry

_WASI = "wasi_snapshot_preview1"


def _tool(folder: pathlib.Path, name: str, wat: str) -> pathlib.Path:
    path = folder / f"{name}.wasm"
    path.write_bytes(wasmtime.wat2wasm(wat))
    return path


def _run(path: pathlib.Path, args=None, **limits):
    return engrain.sandbox.run_wasm(path, args, **limits)


def _raw(path: pathlib.Path, **limits) -> bytes:
    return engrain.sandbox.WasmTool(path, limits=engrain.sandbox.Limits(**limits)).call_raw(b"")


# --- the wall clock bounds a guest waiting in the host ---------------------------------------

_SLEEPER_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int main(void) {
    char buf[64] = {0};
    fread(buf, 1, sizeof buf - 1, stdin);       /* a bare JSON number: milliseconds */
    long ms = atol(buf);
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, 0);
    printf("{\"slept_ms\": %ld}", ms);
    return 0;
}
"""


@pytest.fixture(scope="module")
def sleeper(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    if shutil.which("clang") is None:
        pytest.fail("clang is missing: scripts/test.sh installs clang, lld, wasi-libc, libclang-rt-dev-wasm32")
    out = tmp_path_factory.mktemp("c-tools")
    (out / "sleeper.c").write_text(_SLEEPER_C)
    subprocess.run(["clang", "--target=wasm32-wasi", "--sysroot=/usr", "-O2", "-o", str(out / "sleeper.wasm"),
                    str(out / "sleeper.c")], check=True, capture_output=True)
    return out / "sleeper.wasm"


def test_a_c_tool_sleeping_past_its_deadline_is_stopped_at_once(sleeper):
    start = time.monotonic()
    with pytest.raises(SandboxLimitError) as e:
        _run(sleeper, 5000, wall_clock_s=1)
    assert e.value.limit == "wall_clock" and e.value.tool == "sleeper"
    assert time.monotonic() - start < 3  # not the 5 s the guest asked for
    # A sleep that ends in time is still a sleep.
    start = time.monotonic()
    assert _run(sleeper, 200, wall_clock_s=3) == {"slept_ms": 200}
    assert 0.2 <= time.monotonic() - start < 3


def _poller(clock: int, timeout_ns: int, *, absolute: bool = False, stdin_too: bool = False) -> str:
    """Poll one clock subscription (and stdin's readiness); exit with 10 * the first event's userdata + events."""
    timeout = (f"(i64.add (i64.const {timeout_ns}) (block (result i64) "
               f"(drop (call $now (i32.const {clock}) (i64.const 1) (i32.const 512))) (i64.load (i32.const 512))))"
               if absolute else f"(i64.const {timeout_ns})")
    return f"""(module
      (import "{_WASI}" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
      (import "{_WASI}" "clock_time_get" (func $now (param i32 i64 i32) (result i32)))
      (import "{_WASI}" "proc_exit" (func $exit (param i32)))
      (memory (export "memory") 1)
      (func (export "_start")
        (i64.store (i32.const 0) (i64.const 1))
        (i32.store8 (i32.const 8) (i32.const 0))
        (i32.store (i32.const 16) (i32.const {clock}))
        (i64.store (i32.const 24) {timeout})
        (i32.store16 (i32.const 40) (i32.const {int(absolute)}))
        (i64.store (i32.const 48) (i64.const 2))
        (i32.store8 (i32.const 56) (i32.const 1))
        (i32.store (i32.const 64) (i32.const 0))
        (if (call $poll (i32.const 0) (i32.const 128) (i32.const {2 if stdin_too else 1}) (i32.const 256))
          (then (call $exit (i32.const 99))))
        (call $exit (i32.add (i32.mul (i32.wrap_i64 (i64.load (i32.const 128))) (i32.const 10))
                             (i32.load (i32.const 256))))))"""


@pytest.mark.parametrize("clock", [0, 1], ids=["realtime", "monotonic"])
@pytest.mark.parametrize("absolute", [False, True], ids=["relative", "absolute"])
def test_a_poll_on_clocks_never_waits_past_the_deadline(tmp_path, clock, absolute):
    long = _tool(tmp_path, "long", _poller(clock, 5 * 10**9, absolute=absolute))
    start = time.monotonic()
    with pytest.raises(SandboxLimitError) as e:
        _raw(long, wall_clock_s=1)
    assert e.value.limit == "wall_clock" and time.monotonic() - start < 3
    # A short wait is WASI's own: it waits, then reports the clock's event (userdata 1, one event).
    short = _tool(tmp_path, "short", _poller(clock, 50 * 10**6, absolute=absolute))
    start = time.monotonic()
    with pytest.raises(SandboxError, match="exited with code 11:"):
        _raw(short, wall_clock_s=2)
    assert 0.04 <= time.monotonic() - start < 2


def test_a_poll_on_stdin_answers_at_once(tmp_path):
    # stdin is a file holding the request, always ready: the clock (however long) never matters.
    both = _tool(tmp_path, "both", _poller(1, 60 * 10**9, stdin_too=True))
    start = time.monotonic()
    with pytest.raises(SandboxError, match="exited with code 21:"):  # the stdin event (userdata 2), alone
        _raw(both, wall_clock_s=1)
    assert time.monotonic() - start < 1


@pytest.fixture(scope="module")
def udf_cache(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    # CPython-on-WASI is compiled once per process whatever the folder, then deserialized.
    return pathlib.Path(os.environ.get("ENGRAIN_CACHE_DIR") or tmp_path_factory.mktemp("cache"))


def test_a_sleeping_udf_is_stopped_by_its_wall_clock(udf_cache, tmp_path):
    (tmp_path / "udfs.py").write_text("import time\n\ndef nap(s):\n    time.sleep(s)\n    return 'woke'\n")
    host = engrain.sandbox.SandboxUdfHost(tmp_path / "udfs.py", cache_dir=udf_cache, wall_clock_s=1)
    assert host.call("nap", {"s": 0.05}) == "woke"
    start = time.monotonic()
    with pytest.raises(SandboxLimitError) as e:
        host.call("nap", {"s": 5})
    assert e.value.limit == "wall_clock" and e.value.tool == "udf:nap"
    assert time.monotonic() - start < 3


# --- memory_bytes covers all of a guest's memory ---------------------------------------------

def test_a_second_linear_memory_is_refused(tmp_path):
    two = _tool(tmp_path, "two", """(module (memory 0) (memory (export "memory") 1) (func (export "_start")))""")
    with pytest.raises(SandboxError, match="two.wasm.*multiple memories"):
        _raw(two, memory_bytes=8 << 20)


def test_tables_are_bounded_by_the_memory_limit(tmp_path):
    grow = _tool(tmp_path, "grow", f"""(module
      (import "{_WASI}" "proc_exit" (func $exit (param i32)))
      (memory (export "memory") 1) (table $t 0 funcref)
      (func (export "_start")
        (if (i32.eq (table.grow $t (ref.null func) (i32.const 1000000)) (i32.const -1))
          (then (call $exit (i32.const 7))))))""")
    with pytest.raises(SandboxError, match="exited with code 7"):  # 1e6 elements (8 MB) refused under 8 MiB
        _raw(grow, memory_bytes=8 << 20)
    assert _raw(grow, memory_bytes=1 << 30) == b""  # allowed under 1 GiB
    big = _tool(tmp_path, "big", """(module (memory (export "memory") 1) (table 1000000 funcref)
      (func (export "_start")))""")
    with pytest.raises(SandboxLimitError) as e:  # 1e6 elements from the start: never instantiated
        _raw(big, memory_bytes=8 << 20)
    assert e.value.limit == "memory"
    assert _raw(big, memory_bytes=1 << 30) == b""


# --- output must be strict JSON --------------------------------------------------------------

def _printer(text: bytes) -> str:
    escaped = "".join(f"\\{b:02x}" for b in text)
    return f"""(module
      (import "{_WASI}" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
      (memory (export "memory") 1)
      (data (i32.const 64) "{escaped}")
      (func (export "_start")
        (i32.store (i32.const 0) (i32.const 64))
        (i32.store (i32.const 4) (i32.const {len(text)}))
        (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"""


@pytest.mark.parametrize("text", [b"[" * 5000 + b"]" * 5000, b'{"a": NaN}', b'{"b": Infinity}', b"[-Infinity]"],
                         ids=["too-deep", "nan", "infinity", "minus-infinity"])
def test_output_that_is_not_strict_json_is_a_sandbox_error(tmp_path, text):
    tool = _tool(tmp_path, "printer", _printer(text))
    with pytest.raises(SandboxError, match="wrote no valid JSON"):
        _run(tool)


def test_strict_json_output_still_parses(tmp_path):
    tool = _tool(tmp_path, "printer", _printer(b'{"a": [1.5, -2e3, null, true], "b": "NaN"}'))
    assert _run(tool) == {"a": [1.5, -2000.0, None, True], "b": "NaN"}


# --- loading tool files ---------------------------------------------------------------------

def _load(folder: pathlib.Path) -> list[str]:
    """ToolRegistry.load_dir in a thread, so a hang fails the test instead of blocking it."""
    result: list = []

    def go() -> None:
        try:
            result.append(ToolRegistry().load_dir(folder))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            result.append(e)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    thread.join(10)
    assert result, f"load_dir({folder}) still blocked after 10 s"
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


@pytest.mark.parametrize("case", ["text", "wat", "directory", "fifo", "no-start", "bad-binary"])
def test_a_tool_file_that_is_not_a_command_module_is_refused_by_name(tmp_path, case):
    folder = tmp_path / case
    folder.mkdir()
    bad = folder / "bad.wasm"
    if case == "text":
        bad.write_text("this is not wasm")
    elif case == "wat":  # wasmtime would compile WebAssembly text; a tool file must be a binary module
        bad.write_text('(module (memory (export "memory") 1) (func (export "_start")))')
    elif case == "directory":
        bad.mkdir()
    elif case == "fifo":
        os.mkfifo(bad)
    elif case == "no-start":
        bad.write_bytes(wasmtime.wat2wasm('(module (memory (export "memory") 1))'))
    else:
        bad.write_bytes(b"\0asm\x01\0\0\0\x01\x05garbage")
    with pytest.raises(SandboxError, match=r"'bad'.*bad\.wasm") as e:
        _load(folder)
    message = str(e.value)
    expected = {"text": "no \\0asm header", "wat": "no \\0asm header", "directory": "not a regular file",
                "fifo": "not a regular file", "no-start": "exports no function '_start'",
                "bad-binary": "not a valid WebAssembly module"}[case]
    assert expected in message


def test_a_symlinked_tool_file_still_loads(tmp_path):
    real = _tool(tmp_path, "real", _printer(b"{}"))
    (tmp_path / "link.wasm").symlink_to(real)
    assert _run(tmp_path / "link.wasm") == {}


# --- a memory-limit hit is a refused grow, not a full memory --------------------------------

def _grower(pages: int, then: str) -> str:
    return f"""(module
      (import "{_WASI}" "proc_exit" (func $exit (param i32)))
      (memory (export "memory") 1)
      (func (export "_start")
        (if (i32.eq (memory.grow (i32.const {pages})) (i32.const -1))
          (then (call $exit (i32.const 3))))
        {then}))"""


def test_an_exit_code_after_a_granted_grow_is_not_a_memory_hit(tmp_path):
    # 121 pages of an 8 MiB (128-page) allowance: the grow succeeded, the exit code is the tool's own.
    tool = _tool(tmp_path, "exit2", _grower(120, "(call $exit (i32.const 2))"))
    with pytest.raises(SandboxError, match="exited with code 2") as e:
        _raw(tool, memory_bytes=8 << 20)
    assert not isinstance(e.value, SandboxLimitError)
    trap = _tool(tmp_path, "trap", _grower(120, "unreachable"))
    with pytest.raises(SandboxError, match="trapped") as e:
        _raw(trap, memory_bytes=8 << 20)
    assert not isinstance(e.value, SandboxLimitError)


def test_a_refused_grow_then_a_failure_is_a_memory_hit(tmp_path):
    # The guest asks for 200 pages at once (12.5 MiB of 8 MiB) while using 64 KiB: refused, it exits 3.
    tool = _tool(tmp_path, "greedy", _grower(200, "(call $exit (i32.const 0))"))
    with pytest.raises(SandboxLimitError) as e:
        _raw(tool, memory_bytes=8 << 20)
    assert e.value.limit == "memory" and e.value.tool == "greedy"
    assert _raw(tool, memory_bytes=16 << 20) == b""  # granted: the run succeeds


def test_the_grow_watch_keeps_what_every_instruction_does(tmp_path):
    from engrain._sandbox import growwatch, wasi

    # memory.grow among instructions whose immediates hold 0x40 (the memory.grow opcode) and
    # instructions of several proposals: the watched module must decode, and compute the same.
    wat = f"""(module
      (import "{_WASI}" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
      (type $ii (func (param i32) (result i32)))
      (memory (export "memory") 2)
      (table $t 2 funcref)
      (tag $e (param i32))
      (global $g (mut i32) (i32.const 64))
      (elem (table $t) (i32.const 0) func $twice $tail)
      (func $twice (type $ii) (i32.mul (local.get 0) (i32.const 2)))
      (func $tail (type $ii) (return_call $twice (i32.add (local.get 0) (memory.grow (i32.const 0)))))
      (func (export "_start") (local $v v128) (local $r i32) (local $f f32)
        (local.set $v (v128.const i8x16 64 64 64 64 64 64 64 64 64 64 64 64 64 64 64 64))
        (local.set $f (f32.const 2.0))
        (local.set $r (i32.add (i32.const 64) (i8x16.extract_lane_u 3 (local.get $v))))
        (local.set $r (i32.add (local.get $r) (i32.trunc_f32_s (local.get $f))))
        (local.set $r (i32.add (local.get $r)
          (block $caught (result i32)
            (try_table (catch $e $caught) (throw $e (memory.grow (i32.const 1))))
            (i32.const 1000))))
        (memory.fill (i32.const 0) (i32.const 64) (i32.const 16))
        (local.set $r (i32.add (local.get $r) (i32.load8_u offset=64 (i32.const 0))))
        (local.set $r (i32.add (local.get $r) (call_indirect $t (type $ii) (i32.const 3) (i32.const 1))))
        (local.set $r (i32.add (local.get $r) (select (result i32) (i32.const 64) (i32.const 1) (global.get $g))))
        (block $b (block $a (br_table $a $b (i32.const 1))) (local.set $r (i32.const 0)))
        (drop (ref.is_null (ref.null func)))
        (local.set $r (i32.add (local.get $r) (i32.wrap_i64 (i64.const 64))))
        (local.set $r (i32.add (local.get $r) (memory.grow (i32.const 64))))
        (i32.store (i32.const 1024) (i32.add (local.get $r) (i32.atomic.load (i32.const 0))))
        (i32.store (i32.const 1040) (i32.const 1024))
        (i32.store (i32.const 1044) (i32.const 4))
        (drop (call $write (i32.const 1) (i32.const 1040) (i32.const 1) (i32.const 1048)))))"""
    original = wasmtime.wat2wasm(wat)
    watched = growwatch.watch_grows(original)
    assert watched is not None
    assert wasmtime.Module(wasi.engine(), watched).exports[-1].name == growwatch.GROW_EXPORT

    def result(data: bytes) -> int:
        tool = engrain.sandbox.WasmTool(tmp_path / "probe.wasm", module=wasmtime.Module(wasi.engine(), data))
        return int.from_bytes(tool.call_raw(b""), "little")

    # lane 64 + 64, f32 2, caught 2 (the size before the grow), byte 64 of memory 0, twice(3 + 3 pages),
    # select 64, i64 64, grow 3 (pages before it), the filled bytes 0x40404040
    assert result(watched) == result(original) == 128 + 2 + 2 + 0 + 12 + 64 + 64 + 3 + 0x40404040


def test_a_module_invalid_as_written_stays_refused(tmp_path):
    # Its code sets global 0, which it does not define: the watched copy appends a global,
    # which would make it valid (and let it write the memory-limit record).
    data = wasmtime.wat2wasm("""(module (global $g (mut i64) (i64.const 0)) (memory (export "memory") 1)
      (func (export "_start") (drop (memory.grow (i32.const 1))) (global.set $g (i64.const 99))))""")
    out, i = bytearray(data[:8]), 8
    while i < len(data):
        size = data[i + 1]  # these sections are all under 128 bytes: a one-byte size
        if data[i] != 6:  # drop the global section
            out += data[i:i + 2 + size]
        i += 2 + size
    (tmp_path / "dangling.wasm").write_bytes(bytes(out))
    with pytest.raises(SandboxError, match="dangling.wasm.*not a valid WebAssembly module.*global"):
        _run(tmp_path / "dangling.wasm")


def test_the_metered_and_unmetered_engines_run_in_one_process(tmp_path):
    from engrain._sandbox import wasi

    # Each engine gets its own host function types: sharing one across engines aborts wasmtime.
    data = wasmtime.wat2wasm(_printer(b"[1]"))
    unmetered = engrain.sandbox.WasmTool(tmp_path / "u.wasm", module=wasmtime.Module(wasi.engine(False), data),
                                         metered=False)
    (tmp_path / "m.wasm").write_bytes(data)
    for _ in range(2):
        assert unmetered.call() == [1]
        assert _run(tmp_path / "m.wasm") == [1]

