"""The LZ4 frame format as Kafka uses it, written and read block by block so output stays capped.

Frame layout (LZ4 frame format 1.6; Kafka's codec 3, seed 004 "Compression"), little-endian:

    4   magic            0x184D2204
    1   FLG              bits 7-6 version (01), 5 block independence, 4 block checksum,
                         3 content size, 2 content checksum, 1 reserved (0), 0 dictionary id
    1   BD               bits 6-4 block maximum size: 4 = 64 KiB, 5 = 256 KiB, 6 = 1 MiB, 7 = 4 MiB
    8   content size     only when FLG bit 3
    4   dictionary id    only when FLG bit 0 (Kafka never uses one: rejected)
    1   HC               (xxh32(descriptor) >> 8) & 0xFF, descriptor = FLG .. last optional field
    then blocks: uint32 size (high bit set = stored uncompressed), data, uint32 checksum when FLG bit 4;
    a zero size ends the blocks; then uint32 content checksum when FLG bit 2.

KAFKA-3160: clients before Kafka 0.10 computed HC over the magic number as well (bytes 0 .. BD). Kafka
accepts that broken checksum with message format 0 and writes it there; we accept both variants on
every read and write the broken one when asked (`legacy_header_checksum=True`, magic 0 wrappers).

Kafka only supports independent blocks (it rejects linked ones), so each block is decompressed on its
own with a size cap of the declared block maximum, and the running total is checked against the
caller's cap before anything is appended. Block and content checksums are skipped, as the Java client
skips the content checksum; the batch CRC already covers the compressed bytes.
"""

from __future__ import annotations

import struct

import cramjam

from odradek.protocol.exceptions import ProtocolError


class DecompressionLimitError(ProtocolError):
    """Data that would decompress past the caller's cap (every codec raises this one; `codecs`
    re-exports it)."""


MAGIC = 0x184D2204
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")

_BLOCK_MAX_SIZES = {4: 1 << 16, 5: 1 << 18, 6: 1 << 20, 7: 1 << 22}
WRITE_BLOCK_SIZE = 1 << 16  # BD 4, as Kafka's Java writer uses
_FLG_WRITE = 0x60  # version 01, independent blocks, no checksums, no content size
_BD_WRITE = 0x40

_UNCOMPRESSED_BIT = 0x80000000

# xxHash32 primes
_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def xxh32(data: bytes, seed: int = 0) -> int:
    """xxHash32, pure Python: used only over frame descriptors (at most 18 bytes)."""
    n = len(data)
    i = 0
    if n >= 16:
        v = [(seed + _P1 + _P2) & _M32, (seed + _P2) & _M32, seed & _M32, (seed - _P1) & _M32]
        while i + 16 <= n:
            for lane in range(4):
                word = _U32.unpack_from(data, i)[0]
                v[lane] = (_rotl((v[lane] + word * _P2) & _M32, 13) * _P1) & _M32
                i += 4
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M32
    else:
        h = (seed + _P5) & _M32
    h = (h + n) & _M32
    while i + 4 <= n:
        h = (_rotl((h + _U32.unpack_from(data, i)[0] * _P3) & _M32, 17) * _P4) & _M32
        i += 4
    while i < n:
        h = (_rotl((h + data[i] * _P5) & _M32, 11) * _P1) & _M32
        i += 1
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    h ^= h >> 16
    return h


def _header_checksum(data) -> int:
    return (xxh32(bytes(data)) >> 8) & 0xFF


def compress(data, *, legacy_header_checksum: bool = False) -> bytes:
    """One LZ4 frame with independent 64 KiB blocks and no optional fields."""
    descriptor = bytes((_FLG_WRITE, _BD_WRITE))
    hc = _header_checksum(_MAGIC_BYTES + descriptor if legacy_header_checksum else descriptor)
    parts = [_MAGIC_BYTES, descriptor, bytes((hc,))]
    view = memoryview(data)
    for start in range(0, len(view), WRITE_BLOCK_SIZE):
        chunk = view[start:start + WRITE_BLOCK_SIZE]
        block = cramjam.lz4.compress_block(chunk, store_size=False)
        if len(block) < len(chunk):
            parts.append(_U32.pack(len(block)))
            parts.append(bytes(block))
        else:
            parts.append(_U32.pack(len(chunk) | _UNCOMPRESSED_BIT))
            parts.append(chunk.tobytes())
    parts.append(b"\x00\x00\x00\x00")
    return b"".join(parts)


def _read_u32(buf, pos: int, end: int, what: str) -> int:
    if end - pos < 4:
        raise ProtocolError(f"lz4 frame truncated in {what}")
    return _U32.unpack_from(buf, pos)[0]


def _read_descriptor(buf, end: int) -> tuple[int, int, int]:
    """Check the frame header; return (flg, block_max_size, position of the first block)."""
    if end < 7 or _U32.unpack_from(buf, 0)[0] != MAGIC:
        raise ProtocolError("not an lz4 frame")
    flg, bd = buf[4], buf[5]
    if flg >> 6 != 1:
        raise ProtocolError(f"lz4 frame version {flg >> 6} unsupported")
    if flg & 0x02 or bd & 0x8F:
        raise ProtocolError("lz4 frame reserved bits set")
    if not flg & 0x20:
        raise ProtocolError("lz4 frame with linked blocks is unsupported, as in Kafka")
    if flg & 0x01:
        raise ProtocolError("lz4 frame with a dictionary id is unsupported")
    block_max = _BLOCK_MAX_SIZES.get((bd >> 4) & 0x07)
    if block_max is None:
        raise ProtocolError("lz4 frame block maximum size invalid")
    hc_pos = 6 + (8 if flg & 0x08 else 0)
    if end <= hc_pos:
        raise ProtocolError("lz4 frame header truncated")
    hc = buf[hc_pos]
    if hc != _header_checksum(buf[4:hc_pos]) and hc != _header_checksum(buf[0:hc_pos]):
        raise ProtocolError("lz4 frame header checksum mismatch")
    return flg, block_max, hc_pos + 1


def decompress(data, max_bytes: int) -> bytearray:
    """Decompress one frame; more than max_bytes of output raises ProtocolError."""
    out = bytearray()
    for block in iter_decompress(data, max_bytes):
        out += block
    return out


def iter_decompress(data, max_bytes: int):
    """Decompress one frame a block at a time (each at most the frame's block maximum, 4 MiB): yields
    the blocks' bytes; more than max_bytes in all raises ProtocolError before the block is yielded."""
    buf = memoryview(data)
    end = len(buf)
    flg, block_max, pos = _read_descriptor(buf, end)
    block_checksum = 4 if flg & 0x10 else 0
    prefix = _I32.pack(block_max)
    total = 0
    while True:
        size = _read_u32(buf, pos, end, "block size")
        pos += 4
        if size == 0:
            break
        stored = size & _UNCOMPRESSED_BIT
        size &= ~_UNCOMPRESSED_BIT
        if size > block_max or size > end - pos:
            raise ProtocolError("lz4 block size past the end of the frame or its maximum")
        block = buf[pos:pos + size]
        pos += size + block_checksum
        if stored:
            chunk = block
        else:
            try:
                # the size prefix caps output at the block maximum; the call returns what it wrote
                chunk = cramjam.lz4.decompress_block(prefix + block)
            except cramjam.DecompressionError as e:
                raise ProtocolError(f"lz4 block corrupt: {e}") from None
        total += len(chunk)
        if total > max_bytes:
            raise DecompressionLimitError(f"lz4 data decompresses past the {max_bytes}-byte limit")
        yield chunk
    if flg & 0x04:
        pos += 4
    if pos != end:
        raise ProtocolError("lz4 frame truncated or followed by stray bytes")
