"""WASM sandbox: run a WASI module as a tool, JSON on stdin, JSON on stdout.

Each call gets a fresh wasmtime ``Store`` (so nothing leaks between calls)
with a fuel budget (CPU), a memory cap, a wall-clock deadline (epoch
interruption driven by a timer, and the WASI calls that could wait inside WASI
replaced by ones that never do, :mod:`.hostcalls`) and a cap on output bytes.
The memory cap covers everything a guest can allocate: multi-memory is off,
and the store bounds instances, tables and table elements too. The guest sees
no file system, no environment and no network: WASI preview 1 has no call that
opens a socket, and a directory is visible only when granted with
``readonly_dirs`` (mounted read-only; in it a tool opens regular files and
folders only, never a FIFO, device or socket); stdin is a file holding the request.
Every limit hit is a :class:`~engrain.SandboxLimitError` naming the tool and
the limit; the host process never crashes. Compiled modules are cached
in-process by file hash; a module file must be a regular file holding a binary
module (:func:`load_module`). Python UDFs run on CPython-on-WASI through
:mod:`.udf_host`.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import json
import os
import pathlib
import re
import stat
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import wasmtime

from .._errors import SandboxError, SandboxLimitError
from .growwatch import GROW_EXPORT, PAGE, watch_grows
from .hostcalls import OPEN_HELPER_WAT, POLL_HELPER_WAT, TRAMPOLINE_WAT, WASI, Open, Poll, poll_type
from .limits import Limits

__all__ = ["Limits", "WasmTool", "engine", "load_module", "run_wasm", "track"]

_engine_lock = threading.Lock()
_engines: dict[bool, wasmtime.Engine] = {}
_modules: dict[str, wasmtime.Module] = {}
_live_modules: weakref.WeakSet[wasmtime.Module] = weakref.WeakSet()


def engine(fuel: bool = True) -> wasmtime.Engine:
    """The process-wide engine, with fuel metering or without (epoch interruption always on).

    Metering fuel slows guest code by about a fifth, so the UDF host, bounded
    by its wall-clock deadline, uses the engine without it unless a fuel
    limit is asked for.
    """
    with _engine_lock:
        eng = _engines.get(fuel)
        if eng is None:
            cfg = wasmtime.Config()
            cfg.consume_fuel = fuel
            cfg.epoch_interruption = True
            # The store's memory limit is per linear memory: with several memories a guest
            # would get that much for each. WASI tools and CPython-on-WASI use one. 64-bit
            # memories are off too: WASI preview 1 addresses a 32-bit memory, and growwatch
            # handles 32-bit memory.grow only.
            cfg.wasm_multi_memory = False
            cfg.wasm_memory64 = False
            eng = _engines[fuel] = wasmtime.Engine(cfg)
            ticker = threading.Thread(target=_ticker, args=(eng,), daemon=True, name="engrain-epoch")
            ticker.start()
            # Stop ticking before interpreter teardown frees the engine under the thread.
            atexit.register(lambda: (_stop.set(), ticker.join(), _close_modules()))
        return eng


def _close_modules() -> None:
    # Free every compiled module while wasmtime's FFI is still loaded: one collected
    # during interpreter teardown fails in its __del__ with a TypeError.
    _modules.clear()
    for mod in list(_live_modules):
        mod.close()


def track(mod: wasmtime.Module) -> wasmtime.Module:
    """Register a compiled module to be freed before interpreter teardown (see ``_close_modules``)."""
    _live_modules.add(mod)
    return mod


_TICK = 0.01  # seconds per epoch; wall-clock limits are rounded up to ticks
_RELEASE_WAIT = 2.0  # most seconds a call waits for wasmtime to drop its stdout callback (microseconds, normally)


_stop = threading.Event()


def _ticker(eng: wasmtime.Engine) -> None:
    while not _stop.wait(_TICK):
        eng.increment_epoch()


def _read_module_file(path: pathlib.Path) -> bytes:
    """The bytes of the module file at ``path``: a regular file holding a binary module, else SandboxError.

    A FIFO or device would block the read (or have side effects on open), so the file is
    checked before it is opened, opened non-blocking, and checked again on the open file.
    """
    name = path.stem
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise SandboxError(name, f"{str(path)!r} is not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise SandboxError(name, f"{str(path)!r} is not a regular file")
            data = f.read()
    except OSError as e:
        raise SandboxError(name, f"cannot read {str(path)!r}: {e.strerror or e}") from None
    # wasmtime would also take WebAssembly text: a tool file must be a compiled module.
    if not data.startswith(b"\0asm"):
        raise SandboxError(name, f"{str(path)!r} is not a WebAssembly binary module (no \\0asm header)")
    return data


def load_module(path: str | os.PathLike[str]) -> wasmtime.Module:
    """Compile the module file ``path`` once per content hash (in-process cache).

    Every ``memory.grow`` is watched (:mod:`.growwatch`) when the module's shape allows, so a
    call can tell a refused grow (the memory limit) from any other failure. A file that is
    not a regular file holding a valid binary module is a :class:`~engrain.SandboxError`.
    """
    path = pathlib.Path(path)
    data = _read_module_file(path)
    key = hashlib.sha256(data).hexdigest()
    mod = _modules.get(key)
    if mod is None:
        mod = _compile(path, data)
        _modules[key] = mod
    return mod


def _compile(path: pathlib.Path, data: bytes) -> wasmtime.Module:
    # The module as written must be valid: the watched copy adds a function and a global
    # that code referring to indices past the module's own would otherwise reach.
    try:
        wasmtime.Module.validate(engine(), data)
    except wasmtime.WasmtimeError as e:
        # wasmtime says "failed to parse ...", then the cause on the lines after "Caused by:".
        lines = [line.strip() for line in str(e).splitlines() if line.strip() and line.strip() != "Caused by:"]
        why = ": ".join(lines) or type(e).__name__
        raise SandboxError(path.stem, f"{str(path)!r} is not a valid WebAssembly module ({why})") from None
    try:
        watched = watch_grows(data)
    except (ValueError, IndexError):  # a shape or opcode growwatch does not know: run it unwatched
        watched = None
    if watched is not None:
        try:
            return track(wasmtime.Module(engine(), watched))
        except wasmtime.WasmtimeError:
            pass  # run unwatched rather than not at all
    return track(wasmtime.Module(engine(), data))


class WasmTool:
    """A WASI command module callable as ``tool(args_dict) -> JSON value``."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        name: str | None = None,
        limits: Limits | None = None,
        *,
        module: wasmtime.Module | None = None,
        argv: list[str] | None = None,
        metered: bool = True,
        env: dict[str, str] | None = None,
        entry: str = "_start",
    ):
        self.path = pathlib.Path(path)
        self.name = name or self.path.stem
        self.limits = limits or Limits()
        # A given module must come from engine(metered); load_module compiles for the metered one.
        self.metered = metered if module is not None else True
        self.module = module if module is not None else load_module(self.path)
        self.argv = argv or [self.name]
        self.env = dict(env or {})  # the guest's whole environment (empty unless given)
        self.entry = entry  # the exported function a call runs
        # Refused here rather than as a puzzling trap at the first call.
        if not any(e.name == entry and isinstance(e.type, wasmtime.FuncType) for e in self.module.exports):
            raise SandboxError(self.name, f"{str(self.path)!r} exports no function {entry!r} "
                                          f"(a WASI command module, as built for wasm32-wasi, has _start)")

    def __call__(self, args: Any = None) -> Any:
        return self.call(args)

    def call(self, args: Any = None) -> Any:
        """Run the module once with ``args`` as JSON on stdin; return its stdout parsed as JSON."""
        out = self.call_raw(json.dumps({} if args is None else args).encode())
        try:
            # Strict JSON: NaN and Infinity are refused, and nesting too deep to parse
            # (RecursionError) is bad output like any other, not a host error.
            return json.loads(out.decode(), parse_constant=_not_json)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise SandboxError(self.name, f"wrote no valid JSON on stdout ({e}): {out[:200]!r}") from None

    def call_raw(self, payload: bytes, keep_memory: Callable[[bytes], object] | None = None) -> bytes:
        """Run the module once with ``payload`` on stdin; return its stdout bytes (limits enforced).

        ``keep_memory``, if given, is handed a copy of the guest's linear memory after a run that exited 0.
        """
        lim = self.limits
        store = wasmtime.Store(engine(self.metered))
        if self.metered:
            store.set_fuel(lim.fuel if lim.fuel is not None else 2**63 - 1)
        # memory_size bounds each linear memory (one: multi-memory is off); tables live in host
        # memory too, so they and their elements are bounded as well (_table_elements). Instances:
        # the guest and the helpers of .hostcalls (no memory of their own; the path_open
        # trampoline, made only with a granted folder, has a table of one element).
        grants = bool(lim.readonly_dirs)
        store.set_limits(memory_size=lim.memory_bytes, table_elements=_table_elements(lim.memory_bytes),
                         instances=4, tables=_MAX_TABLES + (1 if grants else 0), memories=1)
        ticks = max(1, int(lim.wall_clock_s / _TICK + 0.999))
        store.set_epoch_deadline(ticks)
        deadline = time.monotonic() + ticks * _TICK
        out = bytearray()
        overflow = [False]
        holder = [store]  # the callback reaches the store through this, cleared after the run
        metered = self.metered

        def write(chunk: bytes) -> int:
            if overflow[0] or len(out) + len(chunk) > lim.output_bytes:
                if not overflow[0]:
                    overflow[0] = True
                    if metered:  # take the remaining fuel so a guest ignoring write errors stops at once
                        holder[0].set_fuel(0)
                return -errno.EIO
            out.extend(chunk)
            return len(chunk)

        # wasmtime drops the stdout writer, and with it this Python callback, on one of
        # its tokio threads some time after the store is closed. Dropped while the
        # interpreter finalizes, the callback's GIL request ends that thread with
        # pthread_exit, whose forced unwind through Rust aborts ("panic in a function
        # that cannot unwind"). So the call waits until the callback is gone.
        released = threading.Event()
        weakref.finalize(write, released.set)
        with tempfile.NamedTemporaryFile(prefix="engrain-stdin-") as stdin:
            stdin.write(payload)
            stdin.flush()
            wasi = wasmtime.WasiConfig()
            for guest, host in lim.readonly_dirs.items():
                try:  # before the stdout callback is handed over, so a refusal leaves nothing to release
                    wasi.preopen_dir(str(host), guest, False)
                except wasmtime.WasmtimeError:
                    raise SandboxError(self.name, f"cannot grant {str(host)!r} as {guest!r}: "
                                                  "not a folder that can be opened") from None
            wasi.argv = self.argv
            if self.env:
                wasi.env = list(self.env.items())
            wasi.stdin_file = stdin.name
            wasi.stdout_custom = write
            del write  # wasmtime's reference must be the last one
            store.set_wasi(wasi)
            linker = wasmtime.Linker(store.engine)
            linker.define_wasi()
            # Epoch interruption stops only running wasm code, not a guest blocked inside WASI:
            # in poll_oneoff (a sleep) or in path_open of a FIFO. Ours never wait past the
            # deadline, and open nothing but regular files and folders (.hostcalls).
            linker.allow_shadowing = True
            poll = Poll(self.name, lim.wall_clock_s, deadline, store.engine,
                        lambda: _helper(metered, POLL_HELPER_WAT))
            linker.define_func(WASI, "poll_oneoff", poll_type(), poll, access_caller=True)
            opener = None  # without a folder, path_open has nothing to open
            code = 0
            inst = None
            failure: SandboxError | None = None
            try:
                if grants:
                    opener = Open(linker, store, _helper(metered, TRAMPOLINE_WAT), _helper(metered, OPEN_HELPER_WAT))
                inst = linker.instantiate(store, self.module)
                if opener is not None:
                    opener.ready(store, inst)
                inst.exports(store)[self.entry](store)
            except wasmtime.ExitTrap as e:
                code = e.code
            except Exception as e:  # any trap: the store is closed below, the host goes on
                failure = self._classify(e)
            try:
                if overflow[0]:
                    failure = SandboxLimitError(self.name, "output", f"{lim.output_bytes} bytes")
                elif (failure is not None or code != 0) and self._memory_full(inst, store, failure is not None):
                    failure = SandboxLimitError(self.name, "memory", f"{lim.memory_bytes} bytes")
                elif failure is None and code == 0 and keep_memory is not None and inst is not None:
                    mem = inst.exports(store).get("memory")
                    if isinstance(mem, wasmtime.Memory):
                        keep_memory(bytes(mem.read(store, 0, mem.data_len(store))))
            finally:
                # Close now: left to the GC, the WASI context is freed at interpreter exit,
                # after Python is gone, and wasmtime's I/O thread aborts the process.
                holder.clear()
                del inst, linker, wasi, poll, opener
                store.close()
                released.wait(_RELEASE_WAIT)
        if failure is not None:
            raise failure
        if overflow[0]:
            raise SandboxLimitError(self.name, "output", f"{lim.output_bytes} bytes")
        if code != 0:
            raise SandboxError(self.name, f"exited with code {code}: {bytes(out[:200])!r}")
        return bytes(out)

    def _memory_full(self, inst: wasmtime.Instance | None, store: wasmtime.Store, trapped: bool) -> bool:
        """Whether a failed run was refused memory past the cap (it then counts as a memory-limit hit)."""
        if inst is None:
            return False
        exports = inst.exports(store)
        refused = exports.get(GROW_EXPORT)
        if isinstance(refused, wasmtime.Global):  # a watched module (growwatch) says exactly
            return (refused.value(store) & (2**64 - 1)) * PAGE > self.limits.memory_bytes
        mem = exports.get("memory")
        if not trapped or not isinstance(mem, wasmtime.Memory):
            # Unwatched (a module given compiled, like the UDF runtime): an exit with a code is
            # the guest's own report, and is not taken for a memory-limit hit.
            return False
        # A trap with the memory within 1 MiB of the cap: most likely a grow past it was refused.
        return mem.data_len(store) + (1 << 20) > self.limits.memory_bytes

    def _classify(self, e: Exception) -> SandboxError:
        if isinstance(e, SandboxError):  # raised by one of our host functions (.hostcalls)
            return e
        text = str(e)
        lim = self.limits
        trap = getattr(e, "trap_code", None)
        if trap == wasmtime.TrapCode.OUT_OF_FUEL or "fuel" in text:
            return SandboxLimitError(self.name, "fuel", lim.fuel)
        if trap == wasmtime.TrapCode.INTERRUPT or "interrupt" in text:
            return SandboxLimitError(self.name, "wall_clock", f"{lim.wall_clock_s} s")
        if "memory" in text and ("limit" in text or "grow" in text or "out of bounds" not in text):
            return SandboxLimitError(self.name, "memory", f"{lim.memory_bytes} bytes")
        if "exceeds table limits" in text:  # a table too large to instantiate: tables count as memory
            return SandboxLimitError(self.name, "memory", f"{lim.memory_bytes} bytes")
        # wasmtime writes "error while executing at wasm backtrace:", frames, then the cause last.
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        cause = lines[-1] if "Caused by:" in lines else (lines[0] if lines else type(e).__name__)
        cause = re.sub(r"^\d+: ", "", cause)  # a numbered chain of causes: the innermost
        return SandboxError(self.name, f"trapped: {cause}")

    def __repr__(self) -> str:
        return f"<WasmTool {self.name} {self.path}>"


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


_MAX_TABLES = 4  # C, Rust and CPython-on-WASI tools have one function table
_MIN_TABLE_ELEMENTS = 1 << 16


def _table_elements(memory_bytes: int) -> int:
    """Elements allowed per table: all tables together take at most a quarter of ``memory_bytes``.

    wasmtime stores a table element in at most 8 bytes, in host memory beside the linear
    memory, so unbounded tables would let a guest allocate far past its memory cap.
    """
    return max(_MIN_TABLE_ELEMENTS, memory_bytes // (4 * 8 * _MAX_TABLES))


_helpers: dict[tuple[bool, str], wasmtime.Module] = {}


def _helper(fuel: bool, wat: str) -> wasmtime.Module:
    """A helper module of :mod:`.hostcalls`, compiled once for the engine with fuel or without."""
    with _engine_lock:
        mod = _helpers.get((fuel, wat))
    if mod is None:
        mod = track(wasmtime.Module(engine(fuel), wasmtime.wat2wasm(wat)))
        with _engine_lock:
            mod = _helpers.setdefault((fuel, wat), mod)
    return mod


def run_wasm(path: str | os.PathLike[str], args: Any = None, *, name: str | None = None, **limits: Any) -> Any:
    """Run the WASI module at ``path`` once with ``args``; keyword limits as in :class:`Limits`."""
    return WasmTool(path, name=name, limits=Limits(**limits)).call(args)
