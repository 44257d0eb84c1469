"""WASM sandbox: run a WASI module as a tool, JSON on stdin, JSON on stdout.

Each call gets a fresh wasmtime ``Store`` (so nothing leaks between calls)
with a fuel budget (CPU), a memory cap, a wall-clock deadline (epoch
interruption driven by a timer) and a cap on output bytes. The guest sees no
file system, no environment and no network: WASI preview 1 has no call that
opens a socket, and a directory is visible only when granted with
``readonly_dirs`` (mounted read-only). Every limit hit is a
:class:`~engrain.SandboxLimitError` naming the tool and the limit; the host
process never crashes. Compiled modules are cached in-process by file hash.
Python UDFs run on CPython-on-WASI through :mod:`.udf_host`.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import json
import os
import pathlib
import tempfile
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import wasmtime

from .._errors import SandboxError, SandboxLimitError

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


def load_module(path: str | os.PathLike[str]) -> wasmtime.Module:
    """Compile ``path`` once per content hash (in-process cache)."""
    data = pathlib.Path(path).read_bytes()
    key = hashlib.sha256(data).hexdigest()
    mod = _modules.get(key)
    if mod is None:
        mod = track(wasmtime.Module(engine(), data))
        _modules[key] = mod
    return mod


@dataclass(frozen=True)
class Limits:
    """Per-call limits. ``readonly_dirs`` maps guest path -> host dir, mounted read-only."""

    fuel: int | None = 1_000_000_000  # None: no fuel metering (the wall clock still bounds the call)
    memory_bytes: int = 64 * 1024 * 1024
    wall_clock_s: float = 5.0
    output_bytes: int = 1024 * 1024
    readonly_dirs: dict[str, str] = field(default_factory=dict)


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

    def __call__(self, args: Any = None) -> Any:
        return self.call(args)

    def call(self, args: Any = None) -> Any:
        """Run the module once with ``args`` as JSON on stdin; return its stdout parsed as JSON."""
        out = self.call_raw(json.dumps({} if args is None else args).encode())
        try:
            return json.loads(out.decode())
        except (UnicodeDecodeError, ValueError) as e:
            raise SandboxError(self.name, f"wrote no valid JSON on stdout ({e}): {out[:200]!r}") from None

    def call_raw(self, payload: bytes, keep_memory: Callable[[bytes], object] | None = None) -> bytes:
        """Run the module once with ``payload`` on stdin; return its stdout bytes (limits enforced).

        ``keep_memory``, if given, is handed a copy of the guest's linear memory after a run that exited 0.
        """
        lim = self.limits
        store = wasmtime.Store(engine(self.metered))
        if self.metered:
            store.set_fuel(lim.fuel if lim.fuel is not None else 2**63 - 1)
        store.set_limits(memory_size=lim.memory_bytes)
        store.set_epoch_deadline(max(1, int(lim.wall_clock_s / _TICK + 0.999)))
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
            wasi.argv = self.argv
            if self.env:
                wasi.env = list(self.env.items())
            wasi.stdin_file = stdin.name
            wasi.stdout_custom = write
            del write  # wasmtime's reference must be the last one
            for guest, host in lim.readonly_dirs.items():
                wasi.preopen_dir(str(host), guest, False)
            store.set_wasi(wasi)
            linker = wasmtime.Linker(store.engine)
            linker.define_wasi()
            code = 0
            inst = None
            failure: SandboxError | None = None
            try:
                inst = linker.instantiate(store, self.module)
                inst.exports(store)[self.entry](store)
            except wasmtime.ExitTrap as e:
                code = e.code
            except Exception as e:  # any trap: the store is closed below, the host goes on
                failure = self._classify(e)
            try:
                if overflow[0]:
                    failure = SandboxLimitError(self.name, "output", f"{lim.output_bytes} bytes")
                elif (failure is not None or code != 0) and self._memory_full(inst, store):
                    failure = SandboxLimitError(self.name, "memory", f"{lim.memory_bytes} bytes")
                elif failure is None and code == 0 and keep_memory is not None and inst is not None:
                    mem = inst.exports(store).get("memory")
                    if isinstance(mem, wasmtime.Memory):
                        keep_memory(bytes(mem.read(store, 0, mem.data_len(store))))
            finally:
                # Close now: left to the GC, the WASI context is freed at interpreter exit,
                # after Python is gone, and wasmtime's I/O thread aborts the process.
                holder.clear()
                del inst, linker, wasi
                store.close()
                released.wait(_RELEASE_WAIT)
        if failure is not None:
            raise failure
        if overflow[0]:
            raise SandboxLimitError(self.name, "output", f"{lim.output_bytes} bytes")
        if code != 0:
            raise SandboxError(self.name, f"exited with code {code}: {bytes(out[:200])!r}")
        return bytes(out)

    def _memory_full(self, inst: wasmtime.Instance | None, store: wasmtime.Store) -> bool:
        """Whether the guest's memory reached the cap (a failed run then counts as a memory-limit hit)."""
        if inst is None:
            return False
        mem = inst.exports(store).get("memory")
        if not isinstance(mem, wasmtime.Memory):
            return False
        # A grow that would cross the cap is refused, so "full" means within 1 MiB of it.
        return mem.data_len(store) + (1 << 20) > self.limits.memory_bytes

    def _classify(self, e: Exception) -> SandboxError:
        text = str(e)
        lim = self.limits
        trap = getattr(e, "trap_code", None)
        if trap == wasmtime.TrapCode.OUT_OF_FUEL or "fuel" in text:
            return SandboxLimitError(self.name, "fuel", lim.fuel)
        if trap == wasmtime.TrapCode.INTERRUPT or "interrupt" in text:
            return SandboxLimitError(self.name, "wall_clock", f"{lim.wall_clock_s} s")
        if "memory" in text and ("limit" in text or "grow" in text or "out of bounds" not in text):
            return SandboxLimitError(self.name, "memory", f"{lim.memory_bytes} bytes")
        return SandboxError(self.name, f"trapped: {text.splitlines()[0] if text else type(e).__name__}")

    def __repr__(self) -> str:
        return f"<WasmTool {self.name} {self.path}>"


def run_wasm(path: str | os.PathLike[str], args: Any = None, *, name: str | None = None, **limits: Any) -> Any:
    """Run the WASI module at ``path`` once with ``args``; keyword limits as in :class:`Limits`."""
    return WasmTool(path, name=name, limits=Limits(**limits)).call(args)
