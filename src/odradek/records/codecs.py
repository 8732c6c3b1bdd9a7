"""The four compression codecs, by Kafka's attribute ids, each decompression capped in size.

Codec ids (seed 004, "Compression"; the low three attribute bits of a message or batch):
0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd (zstd needs magic 2). 5-7 are invalid.

Formats, as the Java client writes them (and librdkafka, and kafka-python):
- gzip: RFC 1952, one or more members (zlib with gzip framing; trailer CRC and size checked).
- snappy: the xerial block framing, 16-byte header 0x82 'SNAPPY' 0x00, int32 version (1), int32
  minimum compatible version (1), then repeated [int32 block length, raw snappy block] (big-endian).
  We write that framing with 32 KiB blocks, as xerial does; we read it and also plain raw snappy.
- lz4: the LZ4 frame format, see `lz4frame` (with Kafka's legacy header checksum for magic 0).
- zstd: zstd frames.

Every `decompress` takes `max_bytes` (default DEFAULT_MAX_UNCOMPRESSED_BYTES) and raises
DecompressionLimitError (a ProtocolError) as soon as the output would exceed it, without allocating
much past it: gzip streams through zlib with `max_length`; snappy's declared lengths are checked
before allocating; lz4 goes block by block; zstd decompresses into a buffer grown geometrically up
to the cap (a frame's declared content size, when present, is checked first). Every library error
on bad input becomes ProtocolError.

`iter_decompress` gives the same bytes a bounded piece at a time, for a reader that consumes them as
they come (down-conversion, `downconvert`): gzip at most `piece_bytes` per piece, lz4 a block (at most
4 MiB), snappy a xerial block (32 KiB as written by the clients; a raw snappy block whole), zstd and
uncompressed data in pieces of `piece_bytes` (zstd decompressed whole first: callers that must bound
it refuse zstd, as Kafka does for down-conversion).
"""

from __future__ import annotations

import struct
import zlib

import cramjam

from odradek.protocol.exceptions import ProtocolError
from odradek.records import lz4frame
from odradek.records.lz4frame import DecompressionLimitError

NONE = 0
GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4
CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
LEGACY_CODECS = (NONE, GZIP, SNAPPY, LZ4)  # codecs a magic 0 or 1 message can carry

DEFAULT_MAX_UNCOMPRESSED_BYTES = 64 * 1024 * 1024

GZIP_LEVEL = 6  # java.util.zip default
ZSTD_LEVEL = 3  # Kafka's default zstd level
XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
XERIAL_BLOCK_SIZE = 32 * 1024
_XERIAL_MAGIC = XERIAL_HEADER[:8]
_I32 = struct.Struct(">i")


def compress(codec: int, data, *, legacy_lz4: bool = False) -> bytes:
    """Compress data with the codec; legacy_lz4 writes KAFKA-3160's header checksum (magic 0)."""
    if codec == GZIP:
        c = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
        return c.compress(data) + c.flush()
    if codec == SNAPPY:
        return _xerial_compress(data)
    if codec == LZ4:
        return lz4frame.compress(data, legacy_header_checksum=legacy_lz4)
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data, level=ZSTD_LEVEL))
    if codec == NONE:
        return bytes(data)
    raise ValueError(f"unknown compression codec {codec}")


def decompress(codec: int, data, *, max_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES):
    """Decompress data (bytes-like) and return a bytes-like object of at most max_bytes."""
    if codec == GZIP:
        return _gzip_decompress(data, max_bytes)
    if codec == SNAPPY:
        return _snappy_decompress(data, max_bytes)
    if codec == LZ4:
        return lz4frame.decompress(data, max_bytes)
    if codec == ZSTD:
        return _zstd_decompress(data, max_bytes)
    if codec == NONE:
        return data
    raise ProtocolError(f"unknown compression codec {codec}")


def iter_decompress(codec: int, data, *, piece_bytes: int, max_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES):
    """Yield the decompressed bytes of `data` in pieces (see the module docstring); more than
    `max_bytes` in all raises DecompressionLimitError, bad data ProtocolError, when reached. `data` is
    bytes-like, or an iterable of bytes-like pieces of it: gzip and uncompressed data are then taken a
    piece at a time (so the whole of it is never held), the other codecs joined first."""
    if isinstance(data, _BYTES_LIKE):
        inputs = (memoryview(data)[start:start + _INPUT_PIECE] for start in range(0, len(data), _INPUT_PIECE))
    elif codec in (GZIP, NONE):
        inputs = iter(data)
    else:
        data = b"".join(data)
    if codec == GZIP:
        yield from _gzip_pieces(inputs, piece_bytes, max_bytes)
    elif codec == NONE:
        for chunk in inputs:
            yield chunk
    elif codec == LZ4:
        yield from lz4frame.iter_decompress(data, max_bytes)
    elif codec == SNAPPY:
        yield from _snappy_pieces(data, max_bytes)
    elif codec == ZSTD:
        view = memoryview(decompress(codec, data, max_bytes=max_bytes))
        for start in range(0, len(view), piece_bytes):
            yield view[start:start + piece_bytes]
    else:
        raise ProtocolError(f"unknown compression codec {codec}")


_BYTES_LIKE = (bytes, bytearray, memoryview)
_INPUT_PIECE = 64 * 1024     # compressed bytes fed to zlib at a time: its unconsumed tail is a copy


def _gzip_pieces(inputs, piece_bytes: int, max_bytes: int):
    """One or more gzip members from the input pieces, at most `piece_bytes` of output at a time."""
    total = 0
    d = zlib.decompressobj(31)
    fed = False                      # the current member has had input
    started = False
    for data in inputs:
        pending = data
        while pending or fed:
            if pending:
                fed = started = True
            try:
                out = d.decompress(pending, piece_bytes)
            except zlib.error as e:
                raise ProtocolError(f"gzip data corrupt: {e}") from None
            total += len(out)
            if total > max_bytes:
                raise DecompressionLimitError(f"gzip data decompresses past the {max_bytes}-byte limit")
            if out:
                yield out
            if d.eof:
                pending = d.unused_data
                d = zlib.decompressobj(31)
                fed = False
            elif d.unconsumed_tail:
                pending = d.unconsumed_tail
            elif out:
                pending = b""            # output may still be held back by the limit
            else:
                break                    # this input is used up: the next piece
    if fed or not started:
        raise ProtocolError("gzip data truncated")


def _gzip_decompress(data, max_bytes: int) -> bytes:
    parts = []
    total = 0
    rest = data
    while True:
        d = zlib.decompressobj(31)
        try:
            out = d.decompress(rest, max_bytes - total + 1)
        except zlib.error as e:
            raise ProtocolError(f"gzip data corrupt: {e}") from None
        total += len(out)
        if total > max_bytes:
            raise DecompressionLimitError(f"gzip data decompresses past the {max_bytes}-byte limit")
        if not d.eof:
            raise ProtocolError("gzip data truncated")
        parts.append(out)
        rest = d.unused_data
        if not rest:
            return b"".join(parts)


def _xerial_compress(data) -> bytes:
    view = memoryview(data)
    parts = [XERIAL_HEADER]
    for start in range(0, len(view), XERIAL_BLOCK_SIZE):
        block = cramjam.snappy.compress_raw(view[start:start + XERIAL_BLOCK_SIZE])
        parts.append(_I32.pack(len(block)))
        parts.append(bytes(block))
    return b"".join(parts)


def _snappy_raw_length(block) -> int:
    try:
        return cramjam.snappy.decompress_raw_len(block)
    except cramjam.DecompressionError as e:
        raise ProtocolError(f"snappy data corrupt: {e}") from None


def _snappy_blocks(data) -> list:
    """The raw snappy blocks of xerial-framed data, or the data as one raw block."""
    view = memoryview(data)
    if view[:8] == _XERIAL_MAGIC:
        if len(view) < 16:
            raise ProtocolError("xerial snappy header truncated")
        # The version fields are not checked: some producers write them little-endian.
        blocks = []
        pos, end = 16, len(view)
        while pos < end:
            if end - pos < 4:
                raise ProtocolError("xerial snappy block length truncated")
            size = _I32.unpack_from(view, pos)[0]
            pos += 4
            if size < 0 or size > end - pos:
                raise ProtocolError("xerial snappy block length past the end of the data")
            blocks.append(view[pos:pos + size])
            pos += size
        return blocks
    return [view]


def _snappy_pieces(data, max_bytes: int):
    total = 0
    for block in _snappy_blocks(data):
        n = _snappy_raw_length(block)
        total += n
        if total > max_bytes:
            raise DecompressionLimitError(f"snappy data decompresses past the {max_bytes}-byte limit")
        out = bytearray(n)
        try:
            written = cramjam.snappy.decompress_raw_into(block, out)
        except cramjam.DecompressionError as e:
            raise ProtocolError(f"snappy data corrupt: {e}") from None
        if written != n:
            raise ProtocolError("snappy block shorter than its declared length")
        yield out


def _snappy_decompress(data, max_bytes: int) -> bytearray:
    blocks = _snappy_blocks(data)
    lengths = []
    total = 0
    for block in blocks:
        n = _snappy_raw_length(block)
        total += n
        if total > max_bytes:
            raise DecompressionLimitError(f"snappy data decompresses past the {max_bytes}-byte limit")
        lengths.append(n)
    out = bytearray(total)
    out_view = memoryview(out)
    pos = 0
    for block, n in zip(blocks, lengths):
        try:
            written = cramjam.snappy.decompress_raw_into(block, out_view[pos:pos + n])
        except cramjam.DecompressionError as e:
            raise ProtocolError(f"snappy data corrupt: {e}") from None
        if written != n:
            raise ProtocolError("snappy block shorter than its declared length")
        pos += n
    out_view.release()
    return out


_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_MIN_GUESS = 64 * 1024
_ZSTD_TOO_SMALL = ("failed to write whole buffer", "destination buffer is too small",
                   "Destination buffer is too small")


def zstd_declared_size(data) -> int | None:
    """The Frame_Content_Size of the first zstd frame, or None when the frame omits it."""
    view = memoryview(data)
    if len(view) < 5 or struct.unpack_from("<I", view, 0)[0] != _ZSTD_MAGIC:
        raise ProtocolError("not a zstd frame")
    fhd = view[4]
    fcs_flag, single_segment, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    fcs_size = (0, 2, 4, 8)[fcs_flag] if fcs_flag or not single_segment else 1
    if fcs_size == 0:
        return None
    pos = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
    if len(view) < pos + fcs_size:
        raise ProtocolError("zstd frame header truncated")
    value = int.from_bytes(view[pos:pos + fcs_size], "little")
    return value + 256 if fcs_size == 2 else value


def _zstd_decompress(data, max_bytes: int) -> bytearray:
    declared = zstd_declared_size(data)
    if declared is not None and declared > max_bytes:
        raise DecompressionLimitError(f"zstd frame declares {declared} bytes, past the {max_bytes}-byte "
                                      f"limit")
    size = declared if declared is not None else max(_ZSTD_MIN_GUESS, 4 * len(data))
    size = min(size, max_bytes)
    while True:
        out = bytearray(size)
        try:
            written = cramjam.zstd.decompress_into(data, out)
        except cramjam.DecompressionError as e:
            if not any(s in str(e) for s in _ZSTD_TOO_SMALL):
                raise ProtocolError(f"zstd data corrupt: {e}") from None
            if size >= max_bytes:
                raise DecompressionLimitError(f"zstd data decompresses past the {max_bytes}-byte limit") from None
            del out
            size = min(max_bytes, max(_ZSTD_MIN_GUESS, size * 4))
            continue
        del out[written:]
        return out
