"""Zig-zag varints and varlongs as record fields use them, every read bounds-checked.

Encoding (seed 003, "VARINT"/"VARLONG"; Protocol Buffers' zig-zag): a signed value n becomes the
unsigned u = (n << 1) ^ (n >> 63), written little-endian in 7-bit groups, low group first, the high bit
of each byte set when more follow. A varint (int32) takes at most 5 bytes, a varlong (int64) at most 10.

Readers take (buf, pos, end) and return (value, new_pos). A value that runs past `end`, needs more than
the maximum number of bytes, or does not fit its width raises ProtocolError, never IndexError.
Writers return bytes; unsigned values below 2**14 come from a table (`UVARINTS`).
"""

from __future__ import annotations

from odradek.protocol.exceptions import ProtocolError

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


def read_uvarint(buf, pos: int, end: int, max_bytes: int, what: str) -> tuple[int, int]:
    """Read an unsigned varint (no zig-zag) of at most max_bytes bytes from buf[pos:end]."""
    result = 0
    shift = 0
    limit = pos + max_bytes
    while True:
        if pos >= end:
            raise ProtocolError(f"truncated {what}")
        if pos >= limit:
            raise ProtocolError(f"{what} longer than {max_bytes} bytes")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    """Read a zig-zag varint (int32) from buf[pos:end]."""
    if pos + 1 < end:
        b = buf[pos]
        if b < 0x80:  # the common one- and two-byte cases, without a loop
            return (b >> 1) ^ -(b & 1), pos + 1
        c = buf[pos + 1]
        if c < 0x80:
            u = (b & 0x7F) | (c << 7)
            return (u >> 1) ^ -(u & 1), pos + 2
    elif pos < end:
        b = buf[pos]
        if b < 0x80:
            return (b >> 1) ^ -(b & 1), pos + 1
    u, pos = read_uvarint(buf, pos, end, 5, "varint")
    if u > 0xFFFFFFFF:
        raise ProtocolError("varint does not fit in 32 bits")
    return (u >> 1) ^ -(u & 1), pos


def read_varlong(buf, pos: int, end: int) -> tuple[int, int]:
    """Read a zig-zag varlong (int64) from buf[pos:end]."""
    if pos < end:
        b = buf[pos]
        if b < 0x80:
            return (b >> 1) ^ -(b & 1), pos + 1
    u, pos = read_uvarint(buf, pos, end, 10, "varlong")
    if u > 0xFFFFFFFFFFFFFFFF:
        raise ProtocolError("varlong does not fit in 64 bits")
    return (u >> 1) ^ -(u & 1), pos


# The encodings of the unsigned values below 2**14 (one or two bytes), by value: what record batches
# mostly need (offset and timestamp deltas, lengths), looked up instead of computed.
UVARINT_TABLE_SIZE = 1 << 14
UVARINTS: tuple[bytes, ...] = tuple(bytes((u,)) if u < 0x80 else bytes((u & 0x7F | 0x80, u >> 7))
                                    for u in range(UVARINT_TABLE_SIZE))


def read_varbytes(buf, pos: int, end: int, what: str) -> tuple[bytes | None, int]:
    """A record field of a varint length and that many bytes (-1: null), as `buf[pos:pos + n]` (a copy
    of a bytes or bytearray, a view of a memoryview), checked against `end`. Lengths below 64 take one
    byte, the common case, read without a call."""
    b = buf[pos] if pos < end else 0x100
    if b < 0x80:
        n = (b >> 1) ^ -(b & 1)
        pos += 1
    else:
        n, pos = read_varint(buf, pos, end)
    if n < 0:
        if n != -1:
            raise ProtocolError(f"record {what} length {n} is negative")
        return None, pos
    if n > end - pos:
        raise ProtocolError(f"record {what} length {n} runs past the end of the record")
    return buf[pos:pos + n], pos + n


def encode_uvarint(u: int) -> bytes:
    """An unsigned varint (u >= 0, not zig-zagged)."""
    if 0 <= u < UVARINT_TABLE_SIZE:
        return UVARINTS[u]
    if u < 0:
        raise ValueError(f"unsigned varint out of range: {u}")
    if u < 0x200000:
        return bytes((u & 0x7F | 0x80, (u >> 7) & 0x7F | 0x80, u >> 14))
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def encode_varint(n: int) -> bytes:
    if not INT32_MIN <= n <= INT32_MAX:
        raise ValueError(f"varint out of range: {n}")
    return encode_uvarint(((n << 1) ^ (n >> 31)) & 0xFFFFFFFF)


def encode_varlong(n: int) -> bytes:
    if not INT64_MIN <= n <= INT64_MAX:
        raise ValueError(f"varlong out of range: {n}")
    return encode_uvarint(((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF)


def size_of_varint(n: int) -> int:
    return len(encode_varint(n))


def size_of_varlong(n: int) -> int:
    return len(encode_varlong(n))
