"""The Wizer-style rewriter the UDF snapshot is built with, on small hand-written modules."""

from __future__ import annotations

import struct

import pytest
import wasmtime

from engrain._sandbox import preinit

_WAT = """
(module
  (type $call (func (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $sp (mut i32) (i32.const 4096))
  (table 2 funcref)
  (elem (i32.const 1) $sum)
  (func $sum (type $call)
    (i32.store (i32.const 0) (i32.add (i32.add (local.get 0) (local.get 1)) (i32.add (local.get 2) (local.get 3))))
    (i32.store (i32.const 4) (global.get $sp))
    (i32.const 0))
  (func (export "_start"))
  %s
  (data (i32.const 100) "from the original"))
"""


def _run(module: bytes) -> bytes:
    store = wasmtime.Store()
    inst = wasmtime.Instance(store, wasmtime.Module(store.engine, module), [])
    inst.exports(store)[preinit.ENTRY](store)
    mem = inst.exports(store)["memory"]
    return bytes(mem.read(store, 0, mem.data_len(store)))


def test_the_snapshot_is_the_new_module_memory_and_the_entry_makes_the_call():
    original = wasmtime.wat2wasm(_WAT % "")
    assert preinit.stack_pointer(original) == 4096
    memory = bytearray(2 * 65536)  # grown during the init: the new module starts at this size
    memory[2000:2004] = b"snap"
    memory[70000:70003] = b"end"
    memory[70100:70104] = b"near"  # close to the run before: one segment with it
    new = preinit.preinitialized(original, bytes(memory), 1232, 1, [1, 2, 3, 4])
    after = _run(new)
    assert len(after) == len(memory)
    assert struct.unpack_from("<ii", after, 0) == (10, 1232)  # the call ran, on the given stack pointer
    assert after[8:] == bytes(memory[8:])  # the rest is the snapshot; the original's data is gone
    assert b"from the original" not in new


@pytest.mark.parametrize("extra, why", [
    ("(start 1)", "start function"),
    ('(data "passive")', "not active"),
])
def test_shapes_it_cannot_rewrite_are_refused(extra, why):
    module = wasmtime.wat2wasm(_WAT % extra)
    with pytest.raises(ValueError, match=why):
        preinit.preinitialized(module, bytes(65536), 1024, 1, [0, 0, 0, 0])
    with pytest.raises(ValueError, match="whole pages"):
        preinit.preinitialized(wasmtime.wat2wasm(_WAT % ""), bytes(1000), 1024, 1, [0, 0, 0, 0])
