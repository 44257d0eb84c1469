"""Make a module record the memory growth it was refused, so the host knows the memory cap was hit.

wasmtime refuses a ``memory.grow`` past the store's memory limit by returning -1 to the
guest and tells the host nothing (its Python API has no resource-limiter callback). A guest
that then exits with an error code, or traps, looks like any other failing guest, and
guessing from how full the memory is misreports a tool that used most of its allowance and
failed for another reason. :func:`watch_grows` rewrites every ``memory.grow`` of a module's
code into a call of one added function that grows the memory the same way and, when the
grow is refused, keeps in an added exported global (:data:`GROW_EXPORT`) the largest size,
in 64 KiB pages, a refused grow asked for. The host reads it after the run.

Nothing else changes: the added type, function and global come after all others, so no
existing index moves, and the guest sees the same results from ``memory.grow``.

Only the module shapes engrain runs are handled: one memory the module defines itself
(32-bit, 64 KiB pages), a type section of plain function types, and the instructions of the
proposals wasmtime enables. For anything else (or an opcode this decoder does not know)
:func:`watch_grows` returns None and the module runs unchanged.
May import: the standard library and :mod:`.wasmbin` only.
"""

from __future__ import annotations

from .wasmbin import MAGIC as _MAGIC
from .wasmbin import sections as _sections
from .wasmbin import u as _u
from .wasmbin import uleb as _uleb

__all__ = ["GROW_EXPORT", "PAGE", "watch_grows"]

#: The added export: an i64 global, the most pages a refused ``memory.grow`` asked for (0: none refused).
GROW_EXPORT = "engrain:grow_refused"
PAGE = 65536

# Where each known section goes; custom sections (0) may sit anywhere.
_ORDER = {1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 13: 6, 6: 7, 7: 8, 8: 9, 9: 10, 12: 11, 10: 12, 11: 13}
_REF = (0x63, 0x64)  # (ref null ht) and (ref ht): a heap type follows


def _skip(data: bytes, i: int) -> int:
    """The index after the LEB128 number at ``data[i]`` (signed or not)."""
    while data[i] & 0x80:
        i += 1
    return i + 1


def _valtype(data: bytes, i: int) -> int:
    return _skip(data, i + 1) if data[i] in _REF else i + 1


def _limits(data: bytes, i: int) -> tuple[int, int]:
    """The limits' flags and the index after them."""
    flags = data[i]
    i = _skip(data, i + 1)  # minimum
    if flags & 0x01:
        i = _skip(data, i)  # maximum
    if flags & 0x08:
        i = _skip(data, i)  # custom page size (log2)
    return flags, i


def _name(data: bytes, i: int) -> tuple[bytes, int]:
    n, i = _uleb(data, i)
    return data[i:i + n], i + n


def _imports(body: bytes) -> tuple[int, int, int]:
    """Imported functions, globals and memories."""
    funcs = globs = mems = 0
    count, i = _uleb(body, 0)
    for _ in range(count):
        _, i = _name(body, i)
        _, i = _name(body, i)
        kind = body[i]
        i += 1
        if kind == 0:  # function: type index
            i = _skip(body, i)
            funcs += 1
        elif kind == 1:  # table: reference type, limits
            _, i = _limits(body, _valtype(body, i))
        elif kind == 2:
            _, i = _limits(body, i)
            mems += 1
        elif kind == 3:  # global: value type, mutability
            i = _valtype(body, i) + 1
            globs += 1
        elif kind == 4:  # tag: attribute, type index
            i = _skip(body, i + 1)
        else:
            raise ValueError(f"unknown import kind {kind}")
    return funcs, globs, mems


def _func_types(body: bytes) -> int:
    """The number of types, all plain function types (GC's recursive groups count differently)."""
    count, i = _uleb(body, 0)
    for _ in range(count):
        if body[i] != 0x60:
            raise ValueError("a type section with GC types")
        i += 1
        for _ in range(2):  # parameters, results
            n, i = _uleb(body, i)
            for _ in range(n):
                i = _valtype(body, i)
    if i != len(body):
        raise ValueError("bad type section")
    return count


def _append(body: bytes | None, entry: bytes) -> tuple[bytes, int]:
    """A vector section with ``entry`` added last, and the number it had before."""
    if body is None:
        return b"\x01" + entry, 0
    count, i = _uleb(body, 0)
    return _u(count + 1) + body[i:] + entry, count


# Instruction immediates, by opcode.
_NONE, _IDX, _IDX2, _BLOCK, _END, _BR_TABLE, _MEMARG, _LEB, _F32, _F64, _SELECT, _TRY_TABLE, _DELEGATE = range(13)
_OPS: dict[int, int] = {op: _NONE for op in range(0x45, 0xC5)}  # numeric and sign-extension: no immediate
_OPS.update({op: _NONE for op in (0x00, 0x01, 0x05, 0x0A, 0x0F, 0x19, 0x1A, 0x1B, 0xD1, 0xD3, 0xD4)})
_OPS.update({op: _IDX for op in (0x07, 0x08, 0x09, 0x0C, 0x0D, 0x10, 0x12, 0x14, 0x15, 0x20, 0x21, 0x22, 0x23,
                                 0x24, 0x25, 0x26, 0x3F, 0x40, 0xD0, 0xD2, 0xD5, 0xD6)})
_OPS.update({op: _MEMARG for op in range(0x28, 0x3F)})
_OPS.update({0x02: _BLOCK, 0x03: _BLOCK, 0x04: _BLOCK, 0x06: _BLOCK, 0x0B: _END, 0x0E: _BR_TABLE,
             0x11: _IDX2, 0x13: _IDX2, 0x18: _DELEGATE, 0x1C: _SELECT, 0x1F: _TRY_TABLE,
             0x41: _LEB, 0x42: _LEB, 0x43: _F32, 0x44: _F64})
_MEMORY_GROW = 0x40

# 0xFB (GC): number of LEB immediates (heap types and indices alike), -1 for the br_on_cast pair.
_GC = {0: 1, 1: 1, 2: 2, 3: 2, 4: 2, 5: 2, 6: 1, 7: 1, 8: 2, 9: 2, 10: 2, 11: 1, 12: 1, 13: 1, 14: 1, 15: 0,
       16: 1, 17: 2, 18: 2, 19: 2, 20: 1, 21: 1, 22: 1, 23: 1, 24: -1, 25: -1, 26: 0, 27: 0, 28: 0, 29: 0, 30: 0}
# 0xFC (saturating truncation, bulk memory, tables, wide arithmetic): number of LEB immediates.
_MISC = {**{op: 0 for op in range(8)}, 8: 2, 9: 1, 10: 2, 11: 1, 12: 2, 13: 1, 14: 2, 15: 1, 16: 1, 17: 1,
         19: 0, 20: 0, 21: 0, 22: 0}


def _simd(code: bytes, i: int, sub: int) -> int:
    if sub <= 11 or sub in (92, 93):  # loads and stores
        return _memarg(code, i)
    if sub in (12, 13):  # v128.const, i8x16.shuffle
        return i + 16
    if 21 <= sub <= 34:  # lane extract and replace
        return i + 1
    if 84 <= sub <= 91:  # lane loads and stores
        return _memarg(code, i) + 1
    if sub <= 0x113:  # the rest of SIMD and relaxed SIMD
        return i
    raise ValueError(f"unknown SIMD opcode {sub}")


def _memarg(code: bytes, i: int) -> int:
    align, i = _uleb(code, i)
    if align & 0x40:  # a memory index follows
        i = _skip(code, i)
    return _skip(code, i)  # offset


def _grows(code: bytes, i: int, end: int) -> list[tuple[int, int]]:
    """Where each ``memory.grow`` (opcode and memory index) of one function's instructions is.

    Decodes every instruction so that no immediate byte is mistaken for an opcode; the body
    must end with the ``end`` that closes the function, or it is a :class:`ValueError`.
    """
    found = []
    depth = 1  # the function's own block
    ops = _OPS
    while i < end:
        start = i
        op = code[i]
        i += 1
        kind = ops.get(op)
        if kind is None:
            if op == 0xFB:
                sub, i = _uleb(code, i)
                n = _GC.get(sub)
                if n is None:
                    raise ValueError(f"unknown GC opcode {sub}")
                if n < 0:  # br_on_cast(_fail): cast flags, label, two heap types
                    n, i = 3, i + 1
                for _ in range(n):
                    i = _skip(code, i)
            elif op == 0xFC:
                sub, i = _uleb(code, i)
                n = _MISC.get(sub)
                if n is None:
                    raise ValueError(f"unknown 0xFC opcode {sub}")
                for _ in range(n):
                    i = _skip(code, i)
            elif op == 0xFD:
                sub, i = _uleb(code, i)
                i = _simd(code, i, sub)
            elif op == 0xFE:
                sub, i = _uleb(code, i)
                if sub == 0x03:  # atomic.fence
                    i += 1
                elif sub <= 0x02 or 0x10 <= sub <= 0x4E:
                    i = _memarg(code, i)
                else:
                    raise ValueError(f"unknown atomic opcode {sub}")
            else:
                raise ValueError(f"unknown opcode {op:#x}")
        elif kind == _NONE:
            pass
        elif kind == _IDX:
            i = _skip(code, i)
            if op == _MEMORY_GROW:
                found.append((start, i))
        elif kind == _LEB:
            i = _skip(code, i)
        elif kind == _MEMARG:
            i = _memarg(code, i)
        elif kind == _END:
            depth -= 1
            if depth == 0:
                break
        elif kind == _BLOCK or kind == _TRY_TABLE:
            b = code[i]
            if b in _REF:
                i = _skip(code, i + 1)
            elif 0x40 <= b <= 0x7F:  # empty, or one value type
                i += 1
            else:  # a type index (s33)
                i = _skip(code, i)
            if kind == _TRY_TABLE:
                n, i = _uleb(code, i)
                for _ in range(n):
                    catch = code[i]
                    i = _skip(code, i + 1)  # tag or label
                    if catch < 2:  # catch and catch_ref: a tag, then the label
                        i = _skip(code, i)
            depth += 1
        elif kind == _IDX2:
            i = _skip(code, _skip(code, i))
        elif kind == _BR_TABLE:
            n, i = _uleb(code, i)
            for _ in range(n + 1):
                i = _skip(code, i)
        elif kind == _F32:
            i += 4
        elif kind == _F64:
            i += 8
        elif kind == _SELECT:
            n, i = _uleb(code, i)
            for _ in range(n):
                i = _valtype(code, i)
        elif kind == _DELEGATE:  # ends a legacy try block
            i = _skip(code, i)
            depth -= 1
    if depth != 0 or i != end:
        raise ValueError("a function body does not end where its size says")
    return found


def _code(body: bytes, hook: int) -> tuple[bytes, int]:
    """The code section with each ``memory.grow`` a call of function ``hook``, and how many there were."""
    count, i = _uleb(body, 0)
    out = [_u(count)]
    total = 0
    call = b"\x10" + _u(hook)
    for _ in range(count):
        head = i
        size, i = _uleb(body, i)
        end = i + size
        j = i
        n, j = _uleb(body, j)  # local declarations
        for _ in range(n):
            j = _valtype(body, _skip(body, j))
        grows = _grows(body, j, end)
        if grows:
            parts, at = [], i
            for start, stop in grows:
                parts += [body[at:start], call]
                at = stop
            parts.append(body[at:end])
            new = b"".join(parts)
            out += [_u(len(new)), new]
            total += len(grows)
        else:
            out.append(body[head:end])
        i = end
    if i != len(body):
        raise ValueError("bad code section")
    return b"".join(out), total


def _hook_body(glob: int) -> bytes:
    """``(param $n i32) (result i32)``: ``memory.grow $n``; on -1 keep the pages asked for in global ``glob``."""
    g = _u(glob)
    code = (
        b"\x02\x01\x7f\x01\x7e"          # locals: $r i32, $want i64
        b"\x20\x00\x40\x00\x22\x01"      # local.get $n, memory.grow, local.tee $r
        b"\x41\x7f\x46\x04\x40"          # i32.const -1, i32.eq, if
        b"\x3f\x00\xad\x20\x00\xad\x7c"  #   memory.size, i64.extend_i32_u, local.get $n, i64.extend_i32_u, i64.add
        b"\x22\x02\x23" + g + b"\x56\x04\x40"  # local.tee $want, global.get, i64.gt_u, if
        b"\x20\x02\x24" + g + b"\x0b"    #     local.get $want, global.set, end
        b"\x0b\x20\x01\x0b"              # end, local.get $r, end
    )
    return _u(len(code)) + code


def watch_grows(module: bytes) -> bytes | None:
    """``module`` with its refused memory growth recorded in :data:`GROW_EXPORT`, or None if not handled."""
    sections = _sections(module)
    by_id: dict[int, bytes] = {}
    for sid, body in sections:
        if sid != 0:
            if sid in by_id or sid not in _ORDER:
                raise ValueError(f"section {sid} repeated or unknown")
            by_id[sid] = body
    funcs, globs, mems = _imports(by_id[2]) if 2 in by_id else (0, 0, 0)
    if mems or 5 not in by_id:
        return None  # no memory of its own: nothing of ours to watch
    count, i = _uleb(by_id[5], 0)
    flags, _ = _limits(by_id[5], i)
    if count != 1 or flags & 0x0C:  # one 32-bit memory of 64 KiB pages
        return None
    if 7 in by_id:
        n, i = _uleb(by_id[7], 0)
        for _ in range(n):
            name, i = _name(by_id[7], i)
            if name == GROW_EXPORT.encode():
                return None
            i = _skip(by_id[7], i + 1)
    types = _func_types(by_id[1]) if 1 in by_id else 0
    defined = _uleb(by_id[3], 0)[0] if 3 in by_id else 0
    hook = funcs + defined
    glob = globs + (_uleb(by_id[6], 0)[0] if 6 in by_id else 0)
    code, grows = _code(by_id[10], hook) if 10 in by_id else (b"\x00", 0)
    code, _ = _append(code, _hook_body(glob))
    new = {
        1: _append(by_id.get(1), b"\x60\x01\x7f\x01\x7f")[0],  # (i32) -> i32
        3: _append(by_id.get(3), _u(types))[0],
        6: _append(by_id.get(6), b"\x7e\x01\x42\x00\x0b")[0],  # (mut i64) = 0
        7: _append(by_id.get(7), _u(len(GROW_EXPORT)) + GROW_EXPORT.encode() + b"\x03" + _u(glob))[0],
        10: code,
    }
    out = [_MAGIC]
    placed: set[int] = set()

    def emit(sid: int, body: bytes) -> None:
        out.append(bytes([sid]) + _u(len(body)) + body)

    for sid, body in sections:
        if sid != 0:
            for missing in sorted((s for s in new if s not in by_id and s not in placed), key=_ORDER.get):
                if _ORDER[missing] < _ORDER[sid]:
                    emit(missing, new[missing])
                    placed.add(missing)
        if sid in new:
            emit(sid, new[sid])
            placed.add(sid)
        else:
            emit(sid, body)
    for missing in sorted((s for s in new if s not in placed), key=_ORDER.get):
        emit(missing, new[missing])
    return b"".join(out)
