"""Sandboxed Python UDFs: calls share no state, see no file outside their grant, and the
standard-library cache they start from is used only when it is private and intact."""

from __future__ import annotations

import os
import pathlib
import stat

import pytest

import engrain
from engrain import SandboxError
from engrain._sandbox import stdlib_cache


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


def test_a_udf_reads_no_file_outside_its_grant(udf_cache, tmp_path):
    """Not the host's files, not udfs.py itself, not the cache the stdlib came from (not even by
    climbing out of /stdlib), and nothing can be written where it was granted."""
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    host = _host(tmp_path, "def peek(path):\n    return open(path, 'rb').read()[:8].decode('latin-1')\n", udf_cache)
    boot = pathlib.Path(host._limits.readonly_dirs["/stdlib"])
    assert host.call("peek", {"path": "/stdlib/encodings/utf_8.pyc"})  # its grant works
    for path in [str(secret), "/etc/passwd", str(host.udfs_path), str(boot.parent / "lib.bundle"),
                 "/stdlib/../lib.bundle", "/stdlib/../MANIFEST.json", "../secret.txt", "/proc/self/environ"]:
        with pytest.raises(SandboxError, match="Error|denied|No such file|not permitted|capabilit"):
            host.call("peek", {"path": path})


_SEMANTICS = """
import csv, io, sys

def sniff(text):
    return csv.Sniffer().sniff(text).delimiter            # csv's re, run only now

def untouched():
    list(csv.DictReader(io.StringIO("a\\n1\\n")))
    return {n: type(sys.modules[n]).__name__ for n in ("csv", "re") if n in sys.modules}

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
    return "é€".encode("cp1252").hex()                      # not bundled: the runtime's zip serves it

def broken_attribute():
    import json
    json.no_such_name
"""


def test_bundled_modules_behave_as_imported(udf_cache, tmp_path):
    """Bundled modules run their bodies on first use; a UDF sees the same results as with eager imports."""
    host = _host(tmp_path, _SEMANTICS, udf_cache)
    assert host.call("sniff", {"text": "a;b\n1;2\n"}) == ";"
    assert host.call("untouched", {}) == {"csv": "module", "re": "_Pending"}
    assert host.call("submodule_first", {}) == [{"a": 1}, [2], True, "SubPattern", True]
    assert host.call("allow_listed", {}) == [2, "2024-01-31", 3, [1, 3], 4, "a-c", "1", 2, "list"]
    assert host.call("codec", {}) == "e980"
    with pytest.raises(SandboxError, match="AttributeError: module 'json' has no attribute 'no_such_name'"):
        host.call("broken_attribute", {})


def _private(path: pathlib.Path) -> bool:
    st = os.lstat(path)
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def test_stdlib_cache_is_private_and_checked_before_use(udf_cache, tmp_path):
    """A changed, added or others-writable file in the cache never runs: engrain exports it again
    (or, when the export cannot finish, mounts nothing and sends no bundle)."""
    udfs = "import csv\ndef dialect():\n    return csv.excel.delimiter\n"
    host = _host(tmp_path, udfs, udf_cache)
    boot = pathlib.Path(host._limits.readonly_dirs["/stdlib"])
    folder = boot.parent
    for path in [folder, *folder.rglob("*")]:
        assert _private(path), path
        assert not path.is_symlink()
    original = {p: p.read_bytes() for p in [boot / "encodings/utf_8.pyc", folder / "lib.bundle"]}

    def served_again() -> engrain.sandbox.SandboxUdfHost:
        stdlib_cache._cached.clear()  # a new process: verified again
        again = _host(tmp_path, udfs, udf_cache)
        mounted = again._limits.readonly_dirs.get("/stdlib")
        if mounted is not None:
            assert {p: p.read_bytes() for p in original} == original
            assert sorted(str(p.relative_to(boot)) for p in boot.rglob("*")) == [
                "encodings", "encodings/__init__.pyc", "encodings/aliases.pyc", "encodings/utf_8.pyc"]
            assert again._prefix.endswith(original[folder / "lib.bundle"])
        else:
            assert again._env == {}
        assert again.call("dialect", {}) == ","
        return again

    # A valid .pyc for 3.12 is not at hand on a 3.11 host; garbage in its place is enough to tell.
    (boot / "encodings/utf_8.pyc").write_bytes(original[boot / "encodings/utf_8.pyc"][:16] + b"\0" * 64)
    served_again()
    bundle = folder / "lib.bundle"
    bundle.write_bytes(bundle.read_bytes().replace(b"excel", b"EXCEL"))
    served_again()
    (boot / "textwrap.pyc").write_bytes(b"x")  # would shadow the zip's module
    served_again()
    (boot / "encodings").chmod(0o777)  # anyone could plant a file there
    served_again()
    assert not (boot / "encodings").stat().st_mode & 0o022
    folder.chmod(0o777)  # or swap boot/ for their own
    served_again()
    assert not folder.stat().st_mode & 0o022


def test_a_cache_others_can_write_is_not_used(udf_cache, tmp_path):
    """No bundle and no mount from a cache folder anyone may write: the runtime's own zip serves the imports."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    stdlib_cache._cached.clear()
    try:
        host = engrain.sandbox.SandboxUdfHost(_write(tmp_path, _PARSE), cache_dir=shared)
        assert host._limits.readonly_dirs == {} and host._env == {}
        assert host.call("parse", {"text": "a,b\n1,2\n"}) == {"rows": [{"a": "1", "b": "2"}], "origin": "zip"}
        assert not [p for p in shared.rglob("*") if p.is_file()]  # nothing cached there either
    finally:
        stdlib_cache._cached.clear()


def test_runner_and_udfs_that_could_not_be_compiled_ahead_still_run(udf_cache, tmp_path, monkeypatch):
    """When the guest compiler gives up (its time limit on a loaded machine), the runner and udfs.py
    go in as source and each call compiles them."""
    monkeypatch.setattr(engrain.sandbox.SandboxUdfHost, "_compiled", lambda self, root, filename, source: None)
    host = engrain.sandbox.SandboxUdfHost(_write(tmp_path, _PARSE), cache_dir=udf_cache)
    assert host._code is None
    assert host.call("parse", {"text": "a\n1\n"}) == {"rows": [{"a": "1"}], "origin": "bundle"}


_PARSE = """
import csv, io
def parse(text):
    rows = list(csv.DictReader(io.StringIO(text)))
    return {"rows": rows, "origin": "zip" if ".zip" in str(csv.__spec__.origin) else "bundle"}
"""


def _write(tmp_path: pathlib.Path, source: str) -> pathlib.Path:
    path = tmp_path / "udfs.py"
    path.write_text(source)
    return path
