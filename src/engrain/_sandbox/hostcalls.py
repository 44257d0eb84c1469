"""The WASI calls a sandboxed call answers itself, in front of WASI's own: ``poll_oneoff`` and ``path_open``.

WASI's host functions run outside wasm, where epoch interruption (the wall-clock limit)
cannot stop them: one that blocks there holds the calling thread past the tool's deadline.
Two can. ``poll_oneoff`` waits (a sleep): :class:`Poll` never waits past the deadline.
``path_open`` of a FIFO waits for a writer (and a read of it for data), and a device or
socket may block too or act when opened: :class:`Open` opens nothing but regular files and
directories. Both go on to WASI's own functions through small helper modules instantiated
on the guest's memory, since WASI host functions work on the memory of the instance that
calls them and so must be called from wasm. The helpers have no memory of their own.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

import wasmtime

from .._errors import SandboxError, SandboxLimitError

WASI = "wasi_snapshot_preview1"

# WASI preview 1 numbers (wasi-libc's wasi/api.h)
_ENOTSUP = 58
_ENXIO = 60  # what open(2) answers for a socket: "no such device or address"
_ENOENT = 44
_EBADF = 8
_DIRECTORY, _REGULAR_FILE, _SYMBOLIC_LINK = 3, 4, 7  # filetypes; the others are devices, sockets, unknown (a FIFO)
_SYMLINK_FOLLOW = 1  # lookupflags
_SUBSCRIPTION = 48  # bytes of a subscription; an event is 32
_CLOCKS = (0, 1)  # realtime, monotonic: the clocks WASI's poll_oneoff waits on (others are EINVAL at once)
_ABSTIME = 1  # subscription flag: the timeout is a time on the clock, not a duration

# Calls WASI's own poll_oneoff and clock_time_get for Poll, instantiated on the guest's memory.
POLL_HELPER_WAT = f"""(module
  (import "{WASI}" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (import "{WASI}" "clock_time_get" (func $now (param i32 i64 i32) (result i32)))
  (import "engrain" "memory" (memory 0))
  (export "memory" (memory 0))
  (func (export "poll") (param i32 i32 i32 i32) (result i32)
    (call $poll (local.get 0) (local.get 1) (local.get 2) (local.get 3)))
  (func (export "now") (param $clock i32) (param $at i32) (result i64)
    (if (call $now (local.get $clock) (i64.const 1) (local.get $at)) (then (return (i64.const -1))))
    (i64.load (local.get $at))))"""

# path_open's parameters: fd, lookupflags, path, its length, oflags, rights, inherited rights,
# fdflags, where the new fd goes.
_OPEN = "(param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)"
_ARGS = " ".join(f"(local.get {i})" for i in range(9))

# The guest's path_open: a call through the one slot of a table, which holds the open helper's
# checked open once the guest is made (Open.ready; the helper's instantiation puts it there),
# and until then (a start function), or for a guest whose memory WASI cannot use, a function
# answering ENOTSUP. No call enters Python.
# Instantiated before path_open is shadowed, it also hands on WASI's own path_open and
# path_filestat_get, for the open helper.
TRAMPOLINE_WAT = f"""(module
  (import "{WASI}" "path_open" (func $open {_OPEN}))
  (import "{WASI}" "path_filestat_get" (func $stat (param i32 i32 i32 i32 i32) (result i32)))
  (type $open (func {_OPEN}))
  (table $slot (export "slot") 1 1 funcref)
  (func $unready (type $open) (i32.const {_ENOTSUP}))
  (elem (table $slot) (i32.const 0) func $unready)
  (export "wasi_path_open" (func $open))
  (export "wasi_path_filestat_get" (func $stat))
  (func (export "path_open") (type $open) (call_indirect $slot (type $open) {_ARGS} (i32.const 0))))"""

_KEEP = range(0, 64, 8)  # a filestat: 64 bytes, 8-aligned, its filetype the byte at 16
_SAVE = "\n      ".join(f"(local.set $k{at} (i64.load (i32.const {at})))" for at in _KEEP)
_RESTORE = "\n      ".join(f"(i64.store (i32.const {at}) (local.get $k{at}))" for at in _KEEP)

# path_open for regular files and folders only, instantiated on the guest's memory. WASI's own
# path_filestat_get looks the path up first (same descriptor, flags and path as the open);
# the stat, which must go somewhere in the guest's memory, goes to its first 64 bytes, which
# are put back before the guest runs again (its memory is not shared: nothing else sees them
# meanwhile; the path, read before the stat is written, may lie there too). A path that is
# not there (ENOENT), or a descriptor that is not a folder (EBADF, where path_open answers
# before any lookup), goes on to path_open, whose own error stands; any other lookup error
# is the answer. Only a folder, a regular file, or a symlink not followed (path_open refuses
# it: ELOOP) is opened; anything else is ENXIO, never opened. A memory of no pages holds only
# an empty path, which names no file.
OPEN_HELPER_WAT = f"""(module
  (import "engrain" "path_filestat_get" (func $stat (param i32 i32 i32 i32 i32) (result i32)))
  (import "engrain" "path_open" (func $open {_OPEN}))
  (import "engrain" "memory" (memory 0))
  (import "engrain" "slot" (table 1 1 funcref))
  (export "memory" (memory 0))
  (elem (table 0) (i32.const 0) func $open_checked)
  (func $open_checked (param $fd i32) (param $flags i32) (param $path i32) (param $len i32)
      (param i32 i64 i64 i32 i32) (result i32)
    (local $err i32) (local $type i32) {" ".join(f"(local $k{at} i64)" for at in _KEEP)}
    (if (memory.size) (then
      {_SAVE}
      (local.set $err (call $stat (local.get $fd) (local.get $flags) (local.get $path) (local.get $len) (i32.const 0)))
      (local.set $type (i32.load8_u (i32.const 16)))
      {_RESTORE}
      (if (local.get $err)
        (then (if (i32.and (i32.ne (local.get $err) (i32.const {_ENOENT}))
                           (i32.ne (local.get $err) (i32.const {_EBADF})))
                (then (return (local.get $err)))))
        (else (if (i32.eqz (i32.or (i32.or (i32.eq (local.get $type) (i32.const {_DIRECTORY}))
                                           (i32.eq (local.get $type) (i32.const {_REGULAR_FILE})))
                                   (i32.and (i32.eq (local.get $type) (i32.const {_SYMBOLIC_LINK}))
                                            (i32.eqz (i32.and (local.get $flags) (i32.const {_SYMLINK_FOLLOW}))))))
                (then (return (i32.const {_ENXIO}))))))))
    (call $open {_ARGS})))"""


def poll_type() -> wasmtime.FuncType:
    # A new one each time: wasmtime binds a FuncType to the first engine it is used with,
    # and aborts the process when it is used with another (one engine meters fuel, one not).
    i32 = wasmtime.ValType.i32()
    return wasmtime.FuncType([i32, i32, i32, i32], [i32])


def _usable(store: wasmtime.Store | wasmtime.Caller, memory: object) -> wasmtime.Memory | None:
    """``memory`` if WASI can work on it: the guest's memory export, unshared (the helpers import an unshared one)."""
    return memory if isinstance(memory, wasmtime.Memory) and not memory.type(store).is_shared else None


class Open:
    """WASI ``path_open`` that opens only regular files and folders (a symlink counts as what it leads to).

    A FIFO, a device, a socket or a file of unknown type in a granted folder is ENXIO, and is
    never opened: opening or reading a FIFO would block inside WASI, past the wall-clock limit.
    The check and the open are two lookups of the path (see ``OPEN_HELPER_WAT``): the guest
    cannot change a folder it holds read-only between them, only the host can.

    Made before the guest: it instantiates the trampoline with ``linker`` (which must allow
    shadowing and not yet shadow path_open), then shadows path_open with the trampoline's.
    """

    def __init__(self, linker: wasmtime.Linker, store: wasmtime.Store, trampoline: wasmtime.Module,
                 helper: wasmtime.Module):
        self.helper = helper
        self.exports = linker.instantiate(store, trampoline).exports(store)
        linker.define(store, WASI, "path_open", self.exports["path_open"])

    def ready(self, store: wasmtime.Store, guest: wasmtime.Instance) -> None:
        """Instantiate the open helper on the made guest's memory: it puts its open in the trampoline's slot."""
        memory = _usable(store, guest.exports(store).get("memory"))
        if memory is not None:  # else path_open stays ENOTSUP
            ex = self.exports
            imports = [ex["wasi_path_filestat_get"], ex["wasi_path_open"], memory, ex["slot"]]
            wasmtime.Instance(store, self.helper, imports)


class Poll:
    """WASI ``poll_oneoff`` that never waits past the call's wall-clock deadline.

    A wait that only clocks can end (a sleep) and that would end after the deadline is the
    wall-clock limit, raised at once: the guest could not finish in time anyway. Any other
    poll is WASI's own, through the helper: its clocks end before the deadline, and every
    descriptor a guest can hold is always ready, so it answers at once: stdin (a file holding
    the request), stdout, stderr, and regular files and folders of a granted directory
    (:class:`Open` opens nothing else, no FIFO a read could wait on).
    """

    def __init__(self, tool: str, wall_clock_s: float, deadline: float, engine: wasmtime.Engine,
                 helper: Callable[[], wasmtime.Module]):
        self.tool = tool
        self.wall_clock_s = wall_clock_s
        self.deadline = deadline
        self.engine = engine
        self.module = helper  # compiles (once) or returns the helper module, at the first poll
        self.helper: wasmtime.Instance | None = None

    def __call__(self, caller: wasmtime.Caller, subs: int, events: int, n: int, nevents: int) -> int:
        mem = _usable(caller, caller.get("memory"))
        if mem is None:
            return _ENOTSUP
        subs, events, n, nevents = (v & 0xFFFFFFFF for v in (subs, events, n, nevents))
        size = mem.data_len(caller)
        if subs % 8 or events % 8 or nevents % 4 or max(subs + n * _SUBSCRIPTION, events + n * 32, nevents + 4) > size:
            # WASI traps on these too; checked first, as it would check the events only after waiting.
            raise SandboxError(self.tool, "trapped: poll_oneoff was given a misaligned or out-of-bounds pointer")
        helper = self._helper(caller, mem)
        data = mem.read(caller, subs, subs + n * _SUBSCRIPTION)
        wait: int | None = None  # nanoseconds until the first clock ends
        for i in range(n):
            at = i * _SUBSCRIPTION
            if data[at + 8] != 0:  # a descriptor: WASI answers at once (see above)
                wait = None
                break
            clock, timeout, flags = struct.unpack_from("<I4xQ8xH", data, at + 16)
            if clock not in _CLOCKS:
                wait = None
                break
            if flags & _ABSTIME:
                # The guest's own clock, read where the events go (overwritten by the poll).
                now = helper.exports(caller)["now"](caller, clock, events)
                if now == -1:
                    wait = None
                    break
                timeout -= now & (2**64 - 1)
            wait = timeout if wait is None else min(wait, timeout)
        if wait is not None and wait / 1e9 > self.deadline - time.monotonic():
            raise SandboxLimitError(self.tool, "wall_clock", f"{self.wall_clock_s} s")
        return helper.exports(caller)["poll"](caller, subs, events, n, nevents)

    def _helper(self, caller: wasmtime.Caller, mem: wasmtime.Memory) -> wasmtime.Instance:
        if self.helper is None:
            linker = wasmtime.Linker(self.engine)
            linker.define_wasi()
            linker.define(caller, "engrain", "memory", mem)
            self.helper = linker.instantiate(caller, self.module())
        return self.helper
