"""WASM sandbox: limits, isolation, and journaled replay of WASM tools."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

import engrain
from engrain import SandboxError, SandboxLimitError
from engrain._durable.tools import ToolRegistry

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def wasm_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    if shutil.which("clang") is None:
        pytest.fail("clang is missing: scripts/test.sh installs clang, lld, wasi-libc, libclang-rt-dev-wasm32")
    out = tmp_path_factory.mktemp("wasm")
    subprocess.run(["bash", str(ROOT / "scripts/build_wasm_tools.sh"), str(out)], check=True, capture_output=True)
    return out


def run(wasm_dir: pathlib.Path, mode: str, **limits):
    return engrain.sandbox.run_wasm(wasm_dir / "hostile.wasm", {"mode": mode}, **limits)


def test_c_tool_json_in_json_out(wasm_dir):
    wc = wasm_dir / "wordcount.wasm"
    assert engrain.sandbox.run_wasm(wc, {"text": "a b c"}) == {"bytes": 5, "words": 3}  # the README's example
    # Only the text counts: other keys (with braces and spaces in them), escapes, non-ASCII.
    args = {"x": [1, {"y": "} {"}], "text": "  héllo\nworld \u00e9\U0001F600 ", "z": None}
    assert engrain.sandbox.run_wasm(wc, args) == {"bytes": len(args["text"].encode()), "words": 3}
    with pytest.raises(SandboxError, match='exited with code 2.*a JSON object with a .*text'):
        engrain.sandbox.run_wasm(wc, {"words": "a b"})


def test_infinite_loop_stopped_by_fuel(wasm_dir):
    with pytest.raises(SandboxLimitError) as e:
        run(wasm_dir, "loop", fuel=10_000_000)
    assert e.value.limit == "fuel" and e.value.tool == "hostile"
    assert "'hostile'" in str(e.value) and "fuel" in str(e.value)


def test_wall_clock_limit(wasm_dir):
    with pytest.raises(SandboxLimitError) as e:
        run(wasm_dir, "loop", fuel=10**15, wall_clock_s=0.2)
    assert e.value.limit == "wall_clock"


def test_memory_bomb_stopped(wasm_dir):
    with pytest.raises(SandboxLimitError) as e:
        run(wasm_dir, "bomb", memory_bytes=8 << 20)
    assert e.value.limit == "memory"


def test_oversized_output_cut(wasm_dir):
    with pytest.raises(SandboxLimitError) as e:
        run(wasm_dir, "flood", output_bytes=4096)
    assert e.value.limit == "output" and "4096" in str(e.value)


def test_file_access_denied_unless_granted(wasm_dir, tmp_path):
    assert run(wasm_dir, "file") == {"passwd_fd": -1, "data": ""}
    (tmp_path / "hello.txt").write_text("hi there\n")
    granted = run(wasm_dir, "file", readonly_dirs={"data": str(tmp_path)})
    assert granted == {"passwd_fd": -1, "data": "hi there"}


def test_no_socket_or_env_imports(wasm_dir):
    # WASI preview 1 offers no call that opens a socket; the linker exposes only those calls.
    mod = engrain.sandbox.load_module(wasm_dir / "hostile.wasm")
    imported = {i.name for i in mod.imports}
    assert not any("sock_open" in n or "sock_connect" in n for n in imported)


def test_host_survives_traps_and_keeps_working(wasm_dir):
    for _ in range(3):
        with pytest.raises(SandboxLimitError):
            run(wasm_dir, "loop", fuel=1_000_000)
    assert run(wasm_dir, "echo") == {"mode": "echo"}


def test_bad_output_is_typed_error(wasm_dir, tmp_path):
    with pytest.raises(SandboxError, match="no valid JSON"):
        run(wasm_dir, "garbage")
    with pytest.raises(SandboxError, match="exited with code 2"):
        run(wasm_dir, "fail")


def test_load_dir_registers_and_validates(wasm_dir, tmp_path):
    reg = ToolRegistry()
    assert reg.load_dir(wasm_dir) == ["hostile", "wordcount"]
    assert reg.get("wordcount")({"text": "x y"}) == {"bytes": 3, "words": 2}
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(wasm_dir / "wordcount.wasm", bad / "no good.wasm")
    with pytest.raises(engrain.EngrainError, match="invalid tool name"):
        ToolRegistry().load_dir(bad)
    esc = tmp_path / "esc"
    esc.mkdir()
    os.symlink(wasm_dir / "wordcount.wasm", esc / "wc.wasm")
    with pytest.raises(engrain.EngrainError, match="outside"):
        ToolRegistry().load_dir(esc)


def test_wasm_tool_replayed_after_sigkill(wasm_dir, tmp_path):
    """A child runs a WASM tool step, then is SIGKILLed; the rerun replays the step without re-running it."""
    tools = tmp_path / "tools"
    tools.mkdir()
    shutil.copy(wasm_dir / "wordcount.wasm", tools / "wordcount.wasm")
    db = tmp_path / "j.db"
    counter = tmp_path / "count"
    script = textwrap.dedent(
        f"""
        import os, signal, sys, pathlib
        import engrain
        from engrain._durable.tools import ToolRegistry
        import engrain._sandbox as sb
        counter = pathlib.Path({str(counter)!r})
        real_call = sb.WasmTool.call
        def counted(self, args=None):
            # Ticks only when the WASM module really runs.
            counter.write_text(str(int(counter.read_text()) + 1) if counter.exists() else "1")
            return real_call(self, args)
        sb.WasmTool.call = counted
        reg = ToolRegistry()
        reg.load_dir({str(tools)!r})
        wc = reg.get("wordcount")
        def agent(task):
            out = wc(task)
            if sys.argv[1] == "crash":
                os.kill(os.getpid(), signal.SIGKILL)
            return out
        r = engrain.run(agent, {{"text": "one two"}}, run_id="r1", journal=engrain.open("sqlite:///{db}"))
        print(r.status, r.output, r.replayed, r.executed)
        """
    )
    first = subprocess.run([sys.executable, "-c", script, "crash"], capture_output=True, text=True)
    assert first.returncode == -9, first.stderr
    assert counter.read_text() == "1"
    second = subprocess.run([sys.executable, "-c", script, "resume"], capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    status, rest = second.stdout.split(" ", 1)
    assert status == "ok" and "'words': 2" in rest
    assert counter.read_text() == "1"  # replayed from the journal, not run again


@pytest.fixture(scope="session")
def udf_cache(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    # Shared cache: CPython-on-WASI is compiled once per session (~5 s), then deserialized.
    return pathlib.Path(os.environ.get("ENGRAIN_CACHE_DIR") or tmp_path_factory.mktemp("cache"))


def test_udf_host_runs_function_and_refuses_files(udf_cache, tmp_path):
    SandboxUdfHost = engrain.sandbox.SandboxUdfHost

    udfs = tmp_path / "udfs.py"
    udfs.write_text(
        "import json\n"
        "def score(items, weight=2):\n"
        "    return {'total': sum(items) * weight, 'n': len(items)}\n"
        "def snoop():\n"
        "    return open('/etc/passwd').read()\n"
        "def odd():\n"
        "    return {1, 2}\n"
        "def spin():\n"
        "    while True: pass\n"
    )
    host = SandboxUdfHost(udfs, cache_dir=udf_cache, fuel=3_000_000_000)
    try:
        assert host.call("score", {"items": [1, 2, 3]}) == {"total": 12, "n": 3}
        with pytest.raises(SandboxError, match="No such file"):
            host.call("snoop", {})
        with pytest.raises(SandboxLimitError) as e:
            host.call("spin", {})
        assert e.value.limit == "fuel" and e.value.tool == "udf:spin"
        with pytest.raises(engrain.NotJSONError, match="not JSON"):  # as a trusted run of it raises
            host.call("odd", {})
        with pytest.raises(SandboxError, match="no function"):
            host.call("missing", {})
    finally:
        host.close()
    assert list(udf_cache.glob("wasm/python-*.cwasm"))


def test_udf_host_default_bounds_cpu_by_wall_clock(udf_cache, tmp_path):
    udfs = tmp_path / "udfs.py"
    udfs.write_text("def spin():\n    while True: pass\n\ndef add(a, b):\n    return a + b\n")
    host = engrain.sandbox.SandboxUdfHost(udfs, cache_dir=udf_cache, wall_clock_s=0.5)
    try:
        assert host.call("add", {"a": 2, "b": 3}) == 5
        with pytest.raises(SandboxLimitError) as e:
            host.call("spin", {})
        assert e.value.limit == "wall_clock" and e.value.tool == "udf:spin"
    finally:
        host.close()


def test_udf_host_sees_no_directory_and_no_environment(udf_cache, tmp_path):
    udfs = tmp_path / "udfs.py"
    udfs.write_text(
        "import csv, io, os, sys\n"
        "def where():\n"
        "    return {'env': dict(os.environ), 'csv': csv.__spec__.origin, 'path': sys.path[0]}\n"
        "def listing(path):\n"
        "    return os.listdir(path)\n"
        "def scribble():\n"
        "    open('/tmp/x', 'wb').write(b'x')\n"
        "def parse(text):\n"
        "    return list(csv.DictReader(io.StringIO(text)))\n"
    )
    host = engrain.sandbox.SandboxUdfHost(udfs, cache_dir=udf_cache)
    zipped = "/usr/local/lib/python312.zip"
    assert host.call("where", {}) == {"env": {}, "csv": f"{zipped}/csv.pyc", "path": zipped}
    for path in ["/", ".", "/stdlib", "/tmp"]:
        with pytest.raises(SandboxError, match="Error"):
            host.call("listing", {"path": path})
    with pytest.raises(SandboxError, match="Error|denied|not permitted|capabilit"):
        host.call("scribble", {})
    assert host.call("parse", {"text": "a,b\n1,2\n"}) == [{"a": "1", "b": "2"}]


def test_udf_host_starts_every_call_with_the_allow_listed_modules_imported(udf_cache, tmp_path):
    """Importing csv and its kin in the guest cost ~30 ms a call: the snapshot already holds what
    compiled UDFs import, and all that their bodies import in turn."""
    from engrain._durable.udf_source import ALLOWED_MODULES
    from engrain._sandbox.udf_host import PRELOAD

    assert ALLOWED_MODULES <= set(PRELOAD)
    udfs = tmp_path / "udfs.py"
    udfs.write_text(
        "import sys\n"
        "before = set(sys.modules)\n"
        f"import {', '.join(sorted(ALLOWED_MODULES))}\n"
        "def imported():\n"
        "    return sorted(set(sys.modules) - before)\n"
    )
    host = engrain.sandbox.SandboxUdfHost(udfs, cache_dir=udf_cache)
    assert host._snapshot is not None
    assert host.call("imported", {}) == []


def test_udf_host_compiles_udfs_once_and_checks_the_cached_code(udf_cache, tmp_path):
    from engrain._sandbox import udf_host

    udfs = tmp_path / "udfs.py"
    udfs.write_text("def twice(x):\n    return 2 * x\n")
    host = udf_host.SandboxUdfHost(udfs, cache_dir=udf_cache)
    assert host._code is not None and host.call("twice", {"x": 21}) == 42
    (entry,) = [p for p in (udf_cache / "python-code").iterdir() if p.read_bytes().endswith(host._code)]
    entry.write_bytes(entry.read_bytes()[:-4] + b"\x00\x00\x00\x00")  # not what the compiler wrote
    again = udf_host.SandboxUdfHost(udfs, cache_dir=udf_cache)
    assert again._code == host._code and again.call("twice", {"x": 4}) == 8

    broken = tmp_path / "broken" / "udfs.py"
    broken.parent.mkdir()
    broken.write_text("def f(:\n    pass\n")
    bad = udf_host.SandboxUdfHost(broken, cache_dir=udf_cache)
    assert bad._code is None
    with pytest.raises(SandboxError, match="SyntaxError"):
        bad.call("f", {})


def test_disk_cache_entries_are_used_only_when_private_and_intact(tmp_path):
    from engrain._disk_cache import cache_dir, read_verified, write_verified

    folder = cache_dir("t", tmp_path)
    assert folder is not None and (folder.stat().st_mode & 0o777) == 0o700
    entry = folder / "e"
    write_verified(entry, b"payload")
    assert read_verified(entry) == b"payload"
    entry.write_bytes(entry.read_bytes()[:-1] + b"X")  # changed after writing
    assert read_verified(entry) is None
    write_verified(entry, b"payload")
    entry.chmod(0o622)  # writable by others
    assert read_verified(entry) is None
    entry.chmod(0o600)
    link = folder / "link"
    link.symlink_to(entry)
    assert read_verified(link) is None
    folder.chmod(0o777)  # a directory others can write is not a cache
    assert cache_dir("t", tmp_path) is None


_EXIT_CHILD = textwrap.dedent("""
    import sys
    import engrain

    assert engrain.sandbox.run_wasm(sys.argv[1], {"text": "a b c"}) == {"bytes": 5, "words": 3}
    print("done")
""")


@pytest.mark.slow  # 200 interpreters starting wasmtime: ~40 CPU-seconds
def test_processes_that_ran_wasm_exit_cleanly(wasm_dir, tmp_path):
    """Issue 12 item 15: wasmtime used to drop the stdout callback on a tokio thread while the
    interpreter finalized, printing "panic in a function that cannot unwind" (and now and then
    aborting) at exit. 200 short processes, none may panic or abort."""
    from concurrent.futures import ThreadPoolExecutor

    script = tmp_path / "child.py"
    script.write_text(_EXIT_CHILD)

    def child(_: int) -> subprocess.CompletedProcess:
        wasm = str(wasm_dir / "wordcount.wasm")
        return subprocess.run([sys.executable, str(script), wasm], capture_output=True, text=True, timeout=120)

    with ThreadPoolExecutor(max_workers=8) as pool:
        runs = list(pool.map(child, range(200)))
    bad = [r for r in runs if r.returncode != 0 or "panicked" in r.stderr or r.stdout.strip() != "done"]
    assert not bad, (
        f"{len(bad)} of 200 processes exited badly (return codes {sorted({r.returncode for r in bad})});"
        f" first stderr:\n{bad[0].stderr[-2000:]}"
    )
