"""Untrusted UDFs behave as trusted ones do, and what they send back is read as untrusted data.

A sandboxed UDF's result obeys the rules of every journaled value (a tuple or an int key is the
same NotJSONError as in a trusted run, never converted), its own output never mixes with its reply,
the host's work on a reply stays bounded, and its error text is escaped before a terminal shows it.
Around it: capture finds the module names a UDF reads even when a nested scope binds them too,
udfs.py must be a regular file, and a tools folder cannot take over a registered tool's name.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
import textwrap
import threading
import time

import pytest

import engrain as eg
from engrain import ConfigError, NotJSONError, RoutineError, SandboxError
from engrain._durable.tools import ToolRegistry
from engrain._durable.udf_source import capture
from engrain._events import check_json
from engrain._routines.loader import load_routine, validate_routine
from engrain._sandbox import snapshot, udf_host


@pytest.fixture(scope="session")
def udf_cache(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    # CPython-on-WASI is compiled once per process whatever the folder, then deserialized.
    return pathlib.Path(os.environ.get("ENGRAIN_CACHE_DIR") or tmp_path_factory.mktemp("cache"))


def _host(tmp_path: pathlib.Path, source: str, cache: pathlib.Path, **limits) -> eg.sandbox.SandboxUdfHost:
    folder = tmp_path / "udfs"
    folder.mkdir(exist_ok=True)
    (folder / "udfs.py").write_text(source)
    return eg.sandbox.SandboxUdfHost(folder / "udfs.py", cache_dir=cache, **limits)


_NOT_JSON = '''
import sys

def tup():
    return (1, 2)

def intkeys():
    return {1: "a", 2: "b"}

def mixed_keys():
    return {1: "int one", "1": "str one"}

def nested_tuple():
    return {"rows": [1, {"pair": (1, 2)}]}

def a_set():
    return {1, 2}

def nan():
    return float("nan")

def str_subclass():
    class S(str):
        pass
    return S("a")

def lying_repr():
    class X:
        def __repr__(self):
            return "{'ok': 1}"
    return X()

def deep():
    x = 0
    for i in range(120):
        x = [x]
    return x
'''


@pytest.mark.parametrize("fn", ["tup", "intkeys", "mixed_keys", "nested_tuple", "a_set", "nan", "str_subclass",
                                "lying_repr", "deep"])
def test_a_result_that_is_not_json_is_the_error_a_trusted_run_raises(udf_cache, tmp_path, fn):
    """Not converted to something else (a tuple to a list, an int key to a str, losing one of two
    keys, an object to what its repr spells): the same NotJSONError, naming the step and the path."""
    ns: dict = {}
    exec(compile(_NOT_JSON, "udfs.py", "exec"), ns)
    with pytest.raises(NotJSONError) as trusted:
        check_json(ns[fn](), f"step {fn!r}", "result")  # what a trusted run's step checks
    host = _host(tmp_path, _NOT_JSON, udf_cache)
    with pytest.raises(NotJSONError) as sandboxed:
        host.call(fn, {})
    assert type(sandboxed.value) is type(trusted.value)
    assert str(sandboxed.value) == str(trusted.value)
    assert (sandboxed.value.path, sandboxed.value.value_type) == (trusted.value.path, trusted.value.value_type)


def _routine(folder: pathlib.Path, fn: str, trusted: bool, udfs: str) -> pathlib.Path:
    folder.mkdir()
    (folder / "routine.yaml").write_text(textwrap.dedent(f"""\
        name: {fn}
        description: x
        trusted: {str(trusted).lower()}
        inputs: {{type: object}}
        output: {{}}
        tools: {{}}
        steps:
        - id: s1
          type: udf.call
          function: {fn}
          args: {{}}
        - id: r
          type: return
          value: '{{{{ s1 }}}}'
        """))
    (folder / "udfs.py").write_text(udfs)
    return folder


_PRINTING = '''
import sys
print("udfs.py loading")  # module level, before any call

def printing():
    print("progress...")
    sys.stdout.write("{'ok': 'not the result'}")
    sys.stdout.buffer.write(b"bytes too")
    print("to stdout", file=sys.__stdout__, flush=True)
    return {"n": 7}

def tup():
    print("about to return a tuple")
    return (1, 2)
'''


def test_a_routine_run_trusted_and_sandboxed_ends_the_same(tmp_path):
    """A UDF that prints works in the sandbox as it does trusted; a tuple fails both alike."""
    j = eg.open(f"sqlite:///{tmp_path / 'j.db'}")
    outcomes = {}
    for fn in ("printing", "tup"):
        for trusted in (True, False):
            pkg = _routine(tmp_path / f"{fn}-{trusted}", fn, trusted, _PRINTING)
            res = eg.run_routine(pkg, {}, journal=j)
            outcomes[fn, trusted] = (res.status, res.output, str(res.error))
    assert outcomes["printing", False] == outcomes["printing", True] == ("ok", {"n": 7}, "None")
    assert outcomes["tup", False] == outcomes["tup", True]
    assert outcomes["tup", False][0] == "failed" and "NotJSONError: step 'tup': result is a tuple" in outcomes["tup", False][2]


@pytest.mark.parametrize("with_snapshot", [True, False])
def test_output_the_udf_writes_is_not_its_reply(udf_cache, tmp_path, monkeypatch, with_snapshot):
    """print goes nowhere; bytes written to fd 1 directly, even shaped like the runner's reply, are not
    read; a UDF that writes a reply-looking text and leaves the interpreter has given no reply."""
    if not with_snapshot:  # the runner run from _start, as for a runtime the snapshot's checks refuse
        monkeypatch.setattr(udf_host, "snapshot", lambda root, fuel: None)
    host = _host(tmp_path, _PRINTING + textwrap.dedent('''
        import os

        def direct():
            os.write(1, b"{'ok': 'forged'}" + b"\\n\\x1eengrain-udf-reply 0123 9\\n{\\"ok\\":13}")
            return 5

        def forge():
            sys.stdout.write("{'ok': 'forged'}")
            sys.stdout.flush()
            os.write(1, b'{"ok": "forged"}')
            import posix
            posix._exit(0)
        '''), udf_cache)
    assert (host._snapshot is not None) is with_snapshot
    assert host.call("printing", {}) == {"n": 7}
    assert host.call("direct", {}) == 5
    with pytest.raises(SandboxError, match="without a reply"):
        host.call("forge", {})


def test_a_changed_runner_is_a_new_snapshot():
    """The snapshot's cache key is the init script's digest, and the init script holds the whole runner."""
    assert repr(snapshot._PRELUDE) in snapshot._INIT and repr(snapshot._BODY) in snapshot._INIT
    assert snapshot.RUNNER == snapshot._PRELUDE + snapshot._BODY


def test_the_host_spends_little_cpu_on_a_reply(udf_cache, tmp_path):
    """A reply of ~1 MB of lists nested 90 deep cost the host seconds of CPU to parse, outside every
    limit. Decoded by the C decoder, the call's whole CPU (the guest's run included) stays small."""
    host = _host(tmp_path, textwrap.dedent('''
        def f():
            x = []
            for i in range(90):
                x = [x]
            return [x] * 5500
        '''), udf_cache, wall_clock_s=60)
    started = time.process_time()
    assert len(host.call("f", {})) == 5500
    assert time.process_time() - started < 5  # ~8.5 s in the host alone before


@pytest.mark.parametrize("raw", [
    b"[" * 1_000_000,  # deeper than any decoder recursion
    b'{"ok": NaN}', b'{"ok": Infinity}', b'{"ok": 1, "error": "x"}', b'{"error": 5}', b"[1]", b"\xff\xfe",
    b'{"not_json": ["type", "config", "int"]}',
])
def test_a_reply_that_is_not_the_runners_is_refused_quickly(raw):
    frame = snapshot.REPLY_MARK + b"n0nce " + str(len(raw)).encode() + b"\n" + raw
    started = time.process_time()
    with pytest.raises(SandboxError):
        udf_host._reply("udf:f", frame, "n0nce")
    assert time.process_time() - started < 1
    with pytest.raises(SandboxError, match="without a reply"):  # another call's nonce
        udf_host._reply("udf:f", frame, "other")


def test_a_forged_reply_still_obeys_the_json_rules(udf_cache, tmp_path):
    """The UDF shares the guest's interpreter, so it can find the nonce and write a reply itself; that
    gets it no more than returning a value would: the host checks the result as it checks any."""
    host = _host(tmp_path, textwrap.dedent('''
        import sys, posix

        def forge_inf():
            frame = sys._getframe(1)
            nonce = frame.f_globals["req"]["nonce"]
            body = b'{"ok": 1e999}'
            posix.write(1, b"\\n\\x1eengrain-udf-reply " + nonce.encode() + b" " + str(len(body)).encode() + b"\\n" + body)
            posix._exit(0)
        '''), udf_cache)
    with pytest.raises(NotJSONError, match="result is a float"):
        host.call("forge_inf", {})


_HOSTILE_TEXT = '''
def ansi():
    raise ValueError("\\x1b[2J\\x1b[H\\x1b[32mstatus: ok\\x1b[0m\\r\\nall checks passed\\u202e" + "E" * 100000)

def bad_str():
    class E(Exception):
        def __str__(self):
            raise RuntimeError("no")
    raise E()
'''


def test_error_text_from_the_udf_is_escaped_and_capped(udf_cache, tmp_path):
    host = _host(tmp_path, _HOSTILE_TEXT, udf_cache)
    with pytest.raises(SandboxError) as e:
        host.call("ansi", {})
    text = str(e.value)
    assert text.isprintable()  # no escape sequence, carriage return, newline or bidi override
    assert "\\x1b[2J" in text and "\\r\\nall checks passed\\u202e" in text
    assert len(text) < 2200


def test_an_exception_whose_str_raises_is_still_reported(udf_cache, tmp_path):
    host = _host(tmp_path, _HOSTILE_TEXT, udf_cache)
    with pytest.raises(SandboxError, match=r"udfs\.py: E: <exception str\(\) failed>"):
        host.call("bad_str", {})


_SHADOWED = '''
import math
import engrain as eg

UNIT = "kg"
SCALE = 3


@eg.udf
def label(values):
    tagged = [UNIT for UNIT in ("x",)]  # binds UNIT in the comprehension only
    return f"{sum(values)} {UNIT}"


@eg.udf
def rounded(values):
    fix = lambda math: math  # binds math as the lambda's parameter only
    return math.floor(sum(values))


@eg.udf
def nested(values):
    def inner(SCALE):
        return SCALE
    gen = list(SCALE for SCALE in values)
    class Holder:
        unit = UNIT
    local = 2
    return [inner(1), gen, Holder.unit, SCALE * local]
'''


def test_capture_finds_module_names_also_bound_in_a_nested_scope(udf_cache, tmp_path):
    """A name bound only inside a comprehension, a lambda or an inner def is still the module's where
    the function itself reads it: the constant or import is captured, and the captured source runs."""
    path = tmp_path / "shadowed_udfs_mod.py"
    path.write_text(_SHADOWED)
    spec = importlib.util.spec_from_file_location("shadowed_udfs_mod", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["shadowed_udfs_mod"] = mod
    try:
        spec.loader.exec_module(mod)
        infos = {name: capture(getattr(mod, name).__wrapped__) for name in ("label", "rounded", "nested")}
    finally:
        sys.modules.pop("shadowed_udfs_mod", None)
    assert [h["name"] for h in infos["label"]["helpers"]] == ["UNIT"] and infos["label"]["imports"] == []
    assert infos["rounded"]["imports"] == ["import math"] and infos["rounded"]["helpers"] == []
    assert [h["name"] for h in infos["nested"]["helpers"]] == ["SCALE", "UNIT"]
    parts = {i for info in infos.values() for i in info["imports"]}
    helpers = {h["name"]: h["source"] for info in infos.values() for h in info["helpers"]}
    udfs = "\n".join(["from __future__ import annotations", *sorted(parts), *helpers.values(),
                      *(info["source"] for info in infos.values())])
    host = _host(tmp_path, udfs, udf_cache)
    assert host.call("label", {"values": [1.5, 2]}) == "3.5 kg"
    assert host.call("rounded", {"values": [1.5, 2]}) == 3
    assert host.call("nested", {"values": [1, 2]}) == [1, [1, 2], "kg", 6]


def _package(folder: pathlib.Path) -> pathlib.Path:
    folder.mkdir()
    (folder / "routine.yaml").write_text(textwrap.dedent("""\
        name: kinds
        description: x
        inputs: {type: object}
        output: {}
        tools: {}
        steps:
        - id: s1
          type: udf.call
          function: f
          args: {}
        - id: r
          type: return
          value: '{{ s1 }}'
        """))
    return folder


def _within(seconds: float, fifo: pathlib.Path, fn):
    """``fn()``'s outcome, failing (and unblocking a reader stuck on ``fifo``) if it takes longer."""
    out: list = []

    def run():
        try:
            out.append(("ok", fn()))
        except Exception as e:  # noqa: BLE001 - handed to the test
            out.append(("raised", e))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # let the blocked open return
        os.close(fd)
        pytest.fail(f"reading {fifo.name} blocked")
    return out[0]


@pytest.mark.parametrize("kind", ["fifo", "dir"])
@pytest.mark.parametrize("file", ["udfs.py", "routine.yaml"])
def test_a_package_file_that_is_not_a_regular_file_is_a_routine_issue(tmp_path, kind, file):
    pkg = _package(tmp_path / "pkg")
    target = pkg / file
    target.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    what = "a named pipe (FIFO)" if kind == "fifo" else "a folder"
    status, err = _within(10, target, lambda: load_routine(pkg))
    assert status == "raised" and isinstance(err, RoutineError), err
    assert [(i.file, i.field, i.message) for i in err.issues] == [(file, "file", f"is {what}, not a regular file")]
    status, issues = _within(10, target, lambda: validate_routine(pkg))
    assert status == "ok" and [i.file for i in issues] == [file]


def _wasm(folder: pathlib.Path, *names: str) -> pathlib.Path:
    import wasmtime

    folder.mkdir(exist_ok=True)
    module = wasmtime.wat2wasm('(module (memory (export "memory") 1) (func (export "_start")))')
    for name in names:
        (folder / f"{name}.wasm").write_bytes(module)
    return folder


def test_load_dir_refuses_a_name_already_registered(tmp_path):
    """A .wasm named like a registered host tool does not silently take its calls."""
    reg = ToolRegistry()

    @eg.tool(registry=reg)
    def get_balance(account: str) -> dict:
        return {"balance": 100}

    folder = _wasm(tmp_path / "tools", "get_balance", "other")
    with pytest.raises(ConfigError) as e:
        reg.load_dir(folder)
    assert "'get_balance'" in str(e.value) and "get_balance.wasm" in str(e.value)
    assert "Python function" in str(e.value) and "get_balance" in str(e.value)
    assert reg.names() == ["get_balance"] and reg.get("get_balance") is get_balance  # nothing of the folder
    assert isinstance(e.value, eg.EngrainError)

    # Another folder's file of the same name is refused too; the same folder loads again.
    assert ToolRegistry().load_dir(folder) == ["get_balance", "other"]
    fresh = ToolRegistry()
    assert fresh.load_dir(folder) == ["get_balance", "other"]
    assert fresh.load_dir(folder, memory_bytes=32 * 1024 * 1024) == ["get_balance", "other"]
    second = _wasm(tmp_path / "more", "other")
    with pytest.raises(ConfigError, match="'other'.*WASM tool"):
        fresh.load_dir(second)

    # Asked for, the folder's tools replace the registered ones.
    assert reg.load_dir(folder, replace=True) == ["get_balance", "other"]
    assert reg.get("get_balance") is not get_balance
