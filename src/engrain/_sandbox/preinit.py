"""Write a pre-initialized copy of a WebAssembly module, as Wizer does, in Python.

Given a module, the linear memory and stack pointer of an instance of it that
ran its initialization, and one indirect call to make, :func:`preinitialized`
returns the same code with:

- the memory's non-zero runs as its only data segments (active, at constant
  offsets), so wasmtime maps them copy-on-write: a new instance costs a few
  page mappings, not a copy, and a page is copied only when written;
- the memory's minimum size that of the snapshot, and the one global (the
  C stack pointer) set to the given value;
- one new export, ``engrain_run`` (no parameters, no results), that makes the
  call (``call_indirect`` of a table slot with constant i32 arguments) and
  drops its i32 result;
- no custom sections (debug information the snapshot no longer matches).

Only the module shapes engrain needs are handled (one memory, one mutable i32
global, active data segments, no start function); anything else is a
:class:`ValueError`, and the caller runs the module from ``_start`` instead.
May import: the standard library and :mod:`.wasmbin` only.
"""

from __future__ import annotations

from .wasmbin import leb as _leb
from .wasmbin import sections as _sections
from .wasmbin import u as _u
from .wasmbin import uleb as _uleb

__all__ = ["ENTRY", "preinitialized", "stack_pointer"]

ENTRY = "engrain_run"
_I32 = 0x7F
_MERGE_GAP = 64  # zero bytes between two runs below which they stay one segment


def _s(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if (n == 0 and not byte & 0x40) or (n == -1 and byte & 0x40):
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def _types(body: bytes) -> list[bytes]:
    count, i = _uleb(body, 0)
    types = []
    for _ in range(count):
        start = i
        if body[i] != 0x60:
            raise ValueError("a type that is not a function type")
        n, i = _uleb(body, i + 1)
        i += n
        n, i = _uleb(body, i)
        i += n
        types.append(body[start:i])
    return types


def _imported_functions(body: bytes) -> int:
    count, i = _uleb(body, 0)
    functions = 0
    for _ in range(count):
        for _name in range(2):
            n, i = _uleb(body, i)
            i += n
        kind = body[i]
        i += 1
        if kind == 0:  # function: a type index
            _, i = _uleb(body, i)
            functions += 1
        elif kind in (1, 2):  # table (element type first) or memory: limits
            i += kind == 1
            flags = body[i]
            _, i = _uleb(body, i + 1)
            if flags & 1:
                _, i = _uleb(body, i)
        elif kind == 3:  # global: value type, mutability
            i += 2
        else:
            raise ValueError(f"import of unknown kind {kind}")
    return functions


def stack_pointer(module: bytes) -> int:
    """The initial value of the module's one global, its C stack pointer (the stack grows down from it)."""
    body = dict(_sections(module)).get(6)
    if body is None or body[:4] != bytes([1, _I32, 1, 0x41]):
        raise ValueError("not one mutable i32 global")
    return _leb(body, 4, signed=True)[0]


def _segments(memory: bytes) -> list[bytes]:
    out: list[bytes] = []
    page, zero, n = 4096, bytes(4096), len(memory)
    view = memoryview(memory)
    start = end = None
    for p in range(0, n, page):
        if view[p:p + page] == zero[:min(page, n - p)]:
            continue
        chunk = bytes(view[p:p + page])
        lo, hi = p + len(chunk) - len(chunk.lstrip(b"\0")), p + len(chunk.rstrip(b"\0"))
        if start is not None and end is not None and lo - end <= _MERGE_GAP:
            end = hi
            continue
        if start is not None and end is not None:
            out.append(b"\0\x41" + _s(start) + b"\x0b" + _u(end - start) + bytes(view[start:end]))
        start, end = lo, hi
    if start is not None and end is not None:
        out.append(b"\0\x41" + _s(start) + b"\x0b" + _u(end - start) + bytes(view[start:end]))
    return out


def preinitialized(module: bytes, memory: bytes, stack: int, table_index: int, args: list[int]) -> bytes:
    """``module`` starting from ``memory`` and ``stack``, exporting :data:`ENTRY` = ``table[table_index](*args)``."""
    if len(memory) % 65536:
        raise ValueError("memory is not whole pages")
    sections = _sections(module)
    ids = [sid for sid, _ in sections]
    if 8 in ids or 12 in ids or ids.count(5) != 1 or ids.count(6) != 1 or 11 not in ids:
        raise ValueError("a start function, a data count, no data, or not one memory and one global")
    types = _types(dict(sections)[1])
    call_type = bytes([0x60, len(args), *[_I32] * len(args), 1, _I32])
    void = bytes([0x60, 0, 0])
    for t in (call_type, void):
        if t not in types:
            types.append(t)
    imported = _imported_functions(dict(sections).get(2, b"\0"))
    defined = _uleb(dict(sections)[3], 0)[0]
    out = bytearray(module[:8])
    for sid, body in sections:
        if sid == 0:
            continue
        if sid == 1:
            body = _u(len(types)) + b"".join(types)
        elif sid == 3:
            count, i = _uleb(body, 0)
            body = _u(count + 1) + body[i:] + _u(types.index(void))
        elif sid == 5:
            if body[:2] != b"\x01\x00":  # one memory, no maximum
                raise ValueError("a memory with a maximum")
            body = b"\x01\x00" + _u(len(memory) // 65536)
        elif sid == 6:
            stack_pointer(module)  # checks the shape
            body = bytes([1, _I32, 1, 0x41]) + _s(stack) + b"\x0b"
        elif sid == 7:
            count, i = _uleb(body, 0)
            name = ENTRY.encode()
            body = _u(count + 1) + body[i:] + _u(len(name)) + name + b"\0" + _u(imported + defined)
        elif sid == 10:
            count, i = _uleb(body, 0)
            code = b"\0" + b"".join(b"\x41" + _s(a) for a in args)
            code += b"\x41" + _s(table_index) + b"\x11" + _u(types.index(call_type)) + b"\0" + b"\x1a\x0b"
            body = _u(count + 1) + body[i:] + _u(len(code)) + code
        elif sid == 11:
            count, i = _uleb(body, 0)
            for _ in range(count):  # every segment must be active (mode 0): none is named by code
                if body[i:i + 2] != b"\0\x41":
                    raise ValueError("a data segment that is not active at a constant offset")
                _, i = _uleb(body, i + 2)
                if body[i] != 0x0B:
                    raise ValueError("a data segment's offset is not a constant")
                n, i = _uleb(body, i + 1)
                i += n
            segments = _segments(memory)
            body = _u(len(segments)) + b"".join(segments)
        out += bytes([sid]) + _u(len(body)) + body
    return bytes(out)
