"""A tool opens only regular files and folders in a granted folder: never a FIFO, device or socket.

Opening a FIFO waits for a writer inside WASI's own ``path_open``, where epoch interruption
(the wall-clock limit) cannot stop it, so the call used to hang past its limit; a device may
block too or act when opened. Each is refused with ENXIO, quickly, whatever the path takes
to reach it (a symlink, a folder opened first), while files, folders and links to them open
as before and every other error stays WASI's own.

Guests: a WAT tool that opens the path given on stdin and reads it, and CPython-on-WASI.
Each call runs in a thread with a deadline: a call blocked on a FIFO fails the test, and the
FIFO is then opened for writing so that the blocked call ends.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import stat
import threading
import time

import pytest
import wasmtime

from engrain import SandboxError
from engrain._sandbox.wasi import Limits, WasmTool

_WASI = "wasi_snapshot_preview1"
WALL_CLOCK_S = 3.0
QUICK_S = 1.0  # a refused open answers in milliseconds; this leaves room for a loaded machine

# WASI preview 1 errno values (wasi-libc's wasi/api.h)
ENOENT, ENOTDIR, ELOOP, ENOTSUP, ENXIO, EPERM = 44, 54, 32, 58, 60, 63
FOLLOW, NOFOLLOW = 1, 0  # lookupflags
O_DIRECTORY = 2  # oflags

# stdin, read to address 0: lookup flags (a byte), oflags (a byte), then the path, or a folder,
# a NUL and a path in it (the folder opened first, the path opened in it). The path lies in the
# guest's first 64 bytes, where the host's check puts a stat it then takes back. Output: "O" and
# 0, or "E" (the open failed), "D" (the folder's open failed) or "R" (the read failed) and the
# errno; then the guest's first bytes as they are after the calls; then what was read.
_GUEST = f"""(module
  (import "{_WASI}" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (import "{_WASI}" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "{_WASI}" "path_open" (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func $io (param $write i32) (param $fd i32) (param $at i32) (param $len i32) (result i32)
    (local $e i32)
    (i32.store (i32.const 1024) (local.get $at))
    (i32.store (i32.const 1028) (local.get $len))
    (local.set $e (if (result i32) (local.get $write)
      (then (call $write (local.get $fd) (i32.const 1024) (i32.const 1) (i32.const 1032)))
      (else (call $read (local.get $fd) (i32.const 1024) (i32.const 1) (i32.const 1032)))))
    (if (result i32) (local.get $e)
      (then (i32.sub (i32.const -1) (local.get $e)))
      (else (i32.load (i32.const 1032)))))
  (func $done (param $code i32) (param $err i32) (param $n i32)
    (i32.store8 (i32.const 1100) (local.get $code))
    (i32.store8 (i32.const 1101) (local.get $err))
    (drop (call $io (i32.const 1) (i32.const 1) (i32.const 1100) (i32.const 2)))
    (drop (call $io (i32.const 1) (i32.const 1) (i32.const 0) (local.get $n))))
  (func (export "_start")
    (local $n i32) (local $at i32) (local $dir i32) (local $path i32) (local $e i32) (local $got i32)
    (local.set $n (call $io (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 1024)))
    (local.set $dir (i32.const 3))
    (local.set $path (i32.const 2))
    (local.set $at (i32.const 2))
    (block $found (loop $scan
      (br_if $found (i32.ge_u (local.get $at) (local.get $n)))
      (if (i32.eqz (i32.load8_u (local.get $at))) (then
        (local.set $e (call $open (i32.const 3) (i32.load8_u (i32.const 0)) (i32.const 2)
          (i32.sub (local.get $at) (i32.const 2)) (i32.const {O_DIRECTORY}) (i64.const 2) (i64.const 2)
          (i32.const 0) (i32.const 1040)))
        (if (local.get $e) (then (call $done (i32.const 68) (local.get $e) (local.get $n)) (return)))
        (local.set $dir (i32.load (i32.const 1040)))
        (local.set $path (i32.add (local.get $at) (i32.const 1)))
        (br $found)))
      (local.set $at (i32.add (local.get $at) (i32.const 1)))
      (br $scan)))
    (local.set $e (call $open (local.get $dir) (i32.load8_u (i32.const 0)) (local.get $path)
      (i32.sub (local.get $n) (local.get $path)) (i32.load8_u (i32.const 1)) (i64.const 2) (i64.const 2)
      (i32.const 0) (i32.const 1036)))
    (if (local.get $e) (then (call $done (i32.const 69) (local.get $e) (local.get $n)) (return)))
    (local.set $got (call $io (i32.const 0) (i32.load (i32.const 1036)) (i32.const 2048) (i32.const 4096)))
    (if (i32.lt_s (local.get $got) (i32.const 0)) (then
      (call $done (i32.const 82) (i32.sub (i32.const -1) (local.get $got)) (local.get $n)) (return)))
    (call $done (i32.const 79) (i32.const 0) (local.get $n))
    (drop (call $io (i32.const 1) (i32.const 1) (i32.const 2048) (local.get $got)))))"""


@pytest.fixture()
def granted(tmp_path: pathlib.Path) -> pathlib.Path:
    """A folder holding files, a subfolder, FIFOs, and symlinks to each."""
    folder = tmp_path / "grant"
    (folder / "sub").mkdir(parents=True)
    (folder / "hello.txt").write_text("hi there")
    (folder / "sub" / "inner.txt").write_text("inner")
    os.mkfifo(folder / "pipe")  # opened for reading, it waits for a writer that never comes
    os.mkfifo(folder / "sub" / "pipe")
    os.symlink("pipe", folder / "to_pipe")
    os.symlink("hello.txt", folder / "to_hello")
    os.symlink("sub", folder / "to_sub")
    return folder


def _unblock(folder: pathlib.Path) -> None:
    """Open every FIFO under ``folder`` for writing (and close it), so that a call blocked opening one ends."""
    for path in folder.rglob("*"):
        if stat.S_ISFIFO(path.lstat().st_mode):
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # nobody is waiting on this one
                pass


def _within(folder: pathlib.Path, fn):
    """``fn()``'s result (or the exception it raised) and the seconds it took; fails if it blocks."""
    out: list = []

    def run():
        start = time.monotonic()
        try:
            out.append(fn())
        except Exception as e:  # noqa: BLE001 - handed to the test
            out.append(e)
        out.append(time.monotonic() - start)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(WALL_CLOCK_S + 3)
    if t.is_alive():
        _unblock(folder)
        t.join(WALL_CLOCK_S + 3)
        pytest.fail(f"the call blocked past its wall-clock limit ({WALL_CLOCK_S} s)")
    result, took = out
    return result, took


def _tool(tmp_path: pathlib.Path, folder: pathlib.Path) -> WasmTool:
    path = tmp_path / "opener.wasm"
    path.write_bytes(wasmtime.wat2wasm(_GUEST))
    return WasmTool(path, limits=Limits(wall_clock_s=WALL_CLOCK_S, readonly_dirs={"data": str(folder)}))


def _open(tool: WasmTool, folder: pathlib.Path, path: str, *, flags: int = FOLLOW, oflags: int = 0):
    """The guest's (status, errno, what it read) for ``path`` ("folder\\0path": the folder opened first)."""
    given = bytes([flags, oflags]) + path.encode()
    out, took = _within(folder, lambda: tool.call_raw(given))
    assert isinstance(out, bytes), out
    assert took < QUICK_S, f"{path!r} took {took:.2f} s"
    status, errno, echo, data = chr(out[0]), out[1], out[2:2 + len(given)], out[2 + len(given):]
    assert echo == given, "the guest's memory changed under it"
    return status, errno, data.decode()


@pytest.mark.parametrize(("path", "flags"), [
    ("pipe", FOLLOW),
    ("pipe", NOFOLLOW),  # not a symlink: opened as it is
    ("to_pipe", FOLLOW),  # a symlink to a FIFO
    ("sub/pipe", FOLLOW),
    ("to_sub/pipe", FOLLOW),  # through a symlinked folder
    ("sub\0pipe", FOLLOW),  # in a folder the guest opened itself
], ids=["fifo", "fifo-not-followed", "symlink", "in-subfolder", "via-symlinked-folder", "in-opened-folder"])
def test_a_fifo_in_a_granted_folder_is_refused_at_once(tmp_path, granted, path, flags):
    tool = _tool(tmp_path, granted)
    assert _open(tool, granted, path, flags=flags) == ("E", ENXIO, "")
    # A symlink to a FIFO that is not followed is not opened either: WASI's own ELOOP.
    assert _open(tool, granted, "to_pipe", flags=NOFOLLOW) == ("E", ELOOP, "")


def test_only_files_and_folders_open_in_a_granted_folder(tmp_path, granted):
    """Files, folders and links to them open and read as before, with WASI's own errors; a socket does not open."""
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(granted / "sock"))
        tool = _tool(tmp_path, granted)
        assert _open(tool, granted, "sock") == ("E", ENXIO, "")
        assert _open(tool, granted, "to_pipe\0x", flags=NOFOLLOW) == ("D", ELOOP, "")
        assert _open(tool, granted, "hello.txt") == ("O", 0, "hi there")
        assert _open(tool, granted, "hello.txt", flags=NOFOLLOW) == ("O", 0, "hi there")
        assert _open(tool, granted, "to_hello") == ("O", 0, "hi there")
        assert _open(tool, granted, "sub/inner.txt") == ("O", 0, "inner")
        assert _open(tool, granted, "to_sub/inner.txt") == ("O", 0, "inner")
        assert _open(tool, granted, "sub\0inner.txt") == ("O", 0, "inner")
        assert _open(tool, granted, "to_sub\0inner.txt") == ("O", 0, "inner")
        assert _open(tool, granted, "sub", oflags=O_DIRECTORY)[:2] == ("R", 8)  # a folder opens; reading it is EBADF
        # WASI's own answers, unchanged: no such file, a link not followed, not a folder, outside the grant.
        assert _open(tool, granted, "missing") == ("E", ENOENT, "")
        assert _open(tool, granted, "to_hello", flags=NOFOLLOW) == ("E", ELOOP, "")
        assert _open(tool, granted, "hello.txt", oflags=O_DIRECTORY) == ("E", ENOTDIR, "")
        assert _open(tool, granted, "hello.txt/") == ("E", ENOTDIR, "")
        assert _open(tool, granted, "../grant/hello.txt") == ("E", EPERM, "")
        assert _open(tool, granted, "sub\0../hello.txt") == ("E", EPERM, "")
    finally:
        sock.close()


def test_a_device_in_a_granted_folder_is_not_opened(tmp_path, granted):
    try:
        os.mknod(granted / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null
    except PermissionError:
        pytest.skip("making a device file needs CAP_MKNOD")
    tool = _tool(tmp_path, granted)
    assert _open(tool, granted, "null") == ("E", ENXIO, "")
    assert _open(tool, granted, "hello.txt") == ("O", 0, "hi there")


def test_a_start_function_cannot_open_before_the_check_is_in_place(tmp_path, granted):
    """path_open from a start function (run while the guest is made) answers ENOTSUP, for any path."""
    wat = f"""(module
      (import "{_WASI}" "path_open" (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
      (import "{_WASI}" "proc_exit" (func $exit (param i32)))
      (memory (export "memory") 1)
      (data (i32.const 100) "hello.txt")
      (global $err (mut i32) (i32.const -1))
      (func $early
        (global.set $err (call $open (i32.const 3) (i32.const 1) (i32.const 100) (i32.const 9) (i32.const 0)
          (i64.const 2) (i64.const 2) (i32.const 0) (i32.const 200))))
      (start $early)
      (func (export "_start") (call $exit (global.get $err))))"""
    path = tmp_path / "early.wasm"
    path.write_bytes(wasmtime.wat2wasm(wat))
    tool = WasmTool(path, limits=Limits(wall_clock_s=WALL_CLOCK_S, readonly_dirs={"data": str(granted)}))
    out, _ = _within(granted, lambda: tool.call_raw(b""))
    assert isinstance(out, SandboxError) and f"exited with code {ENOTSUP}" in str(out), out


_READER = r"""
import json, os, sys
out = {}
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as f:
            out[path] = f.read().decode()
    except OSError as e:
        out[path] = e.errno
out["listed"] = sorted(os.listdir("/data"))
sys.stdout.write(json.dumps(out))
"""


def test_python_on_wasi_reads_files_but_gets_an_error_for_a_fifo(tmp_path, granted):
    """CPython-on-WASI (wasi-libc's open) in a granted folder: files read, a FIFO is ENXIO at once."""
    from engrain._sandbox.snapshot import python_module

    cache = pathlib.Path(os.environ.get("ENGRAIN_CACHE_DIR") or tmp_path / "cache")
    paths = ["/data/hello.txt", "/data/to_sub/inner.txt", "/data/missing", "/data/pipe", "/data/to_pipe"]
    tool = WasmTool("python", name="reader", module=python_module(cache, False), metered=False,
                    argv=["python", "-S", "-P", "-c", _READER, *paths],
                    limits=Limits(fuel=None, memory_bytes=256 << 20, wall_clock_s=WALL_CLOCK_S,
                                  readonly_dirs={"/data": str(granted)}))
    out, took = _within(granted, lambda: tool.call_raw(b""))
    assert isinstance(out, bytes), out
    assert took < WALL_CLOCK_S / 2
    assert json.loads(out) == {
        "/data/hello.txt": "hi there", "/data/to_sub/inner.txt": "inner", "/data/missing": ENOENT,
        "/data/pipe": ENXIO, "/data/to_pipe": ENXIO,
        "listed": ["hello.txt", "pipe", "sub", "to_hello", "to_pipe", "to_sub"],
    }
