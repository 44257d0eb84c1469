"""The WebAssembly binary format's smallest parts, shared by the module rewriters (preinit, growwatch)."""

from __future__ import annotations

#: A core module's first eight bytes: the magic and version 1.
MAGIC = b"\0asm\x01\0\0\0"


def leb(data: bytes, i: int, signed: bool = False) -> tuple[int, int]:
    """The LEB128 number at ``data[i]`` and the index after it."""
    result = shift = 0
    while True:
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return (result - (1 << shift) if signed and byte & 0x40 else result), i


def uleb(data: bytes, i: int) -> tuple[int, int]:
    """The unsigned LEB128 number at ``data[i]`` and the index after it."""
    return leb(data, i)


def u(n: int) -> bytes:
    """``n`` (>= 0) as unsigned LEB128."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def sections(module: bytes) -> list[tuple[int, bytes]]:
    """A core module's sections as ``(id, body)``, in file order; ``ValueError`` if it is none or cut short."""
    if module[:8] != MAGIC:
        raise ValueError("not a WebAssembly core module")
    out, i = [], 8
    while i < len(module):
        sid = module[i]
        size, i = uleb(module, i + 1)
        if i + size > len(module):
            raise ValueError("truncated section")
        out.append((sid, module[i:i + size]))
        i += size
    return out
