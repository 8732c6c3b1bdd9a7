"""Batches that lie, built by hand: any field may be given any value, and the CRC is made right
afterwards, so the lie gets past the CRC check to the record checks (what a broken or hostile producer
sends). Used by the scanner and validator unit tests and by the produce abuse integration tests.
"""

from __future__ import annotations

import struct
import zlib

from crc32c import crc32c

from odradek.records import codecs
from odradek.records.varint import encode_varint, encode_varlong

V2_HEADER = struct.Struct(">qiiBIhiqqqhii")


def v(n: int) -> bytes:
    return encode_varint(n)


def rec(i: int, key: bytes | None = b"k", value: bytes | None = b"v", *, headers: list | None = None,
        ts: int = 0, offset: int | None = None, length: int | None = None, key_length: int | None = None,
        value_length: int | None = None, header_count: int | None = None, tail: bytes = b"") -> bytes:
    """Record i of a v2 batch (ts is its timestamp delta); overrides give fields wrong values."""
    body = b"\x00" + encode_varlong(ts) + v(i if offset is None else offset)
    body += v(-1 if key is None else len(key)) if key_length is None else v(key_length)
    body += key or b""
    body += v(-1 if value is None else len(value)) if value_length is None else v(value_length)
    body += value or b""
    headers = headers or []
    body += v(len(headers) if header_count is None else header_count)
    for hk, hv in headers:
        body += v(len(hk)) + hk + (v(-1) if hv is None else v(len(hv)) + hv)
    body += tail
    return v(len(body) if length is None else length) + body


def v2_batch(records: bytes, count: int, *, base_timestamp: int, max_timestamp: int | None = None,
             codec: int = codecs.NONE, base_offset: int = 0, last_offset_delta: int | None = None,
             attributes: int = 0, producer_id: int = -1, base_sequence: int = -1) -> bytes:
    """A v2 batch around `records` (an uncompressed records section), compressed with `codec`,
    with a correct CRC whatever the header says."""
    body = codecs.compress(codec, records) if codec else records
    head = bytearray(V2_HEADER.pack(
        base_offset, 49 + len(body), -1, 2, 0, attributes | codec,
        count - 1 if last_offset_delta is None else last_offset_delta, base_timestamp,
        base_timestamp if max_timestamp is None else max_timestamp, producer_id, 0 if producer_id >= 0 else -1,
        base_sequence, count))
    data = head + body
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    return bytes(data)


def good_records(n: int, *, key: bytes | None = b"k", value: bytes = b"value", deltas=None) -> bytes:
    deltas = deltas or [0] * n
    return b"".join(rec(i, key, value, ts=deltas[i]) for i in range(n))


def legacy_message(key: bytes | None, value: bytes | None, *, magic: int = 1, attributes: int = 0,
                   offset: int = 0, timestamp: int = 0, crc: int | None = None) -> bytes:
    """One magic 0 or 1 message (a wrapper when attributes carry a codec and value is compressed)."""
    ts = struct.pack(">q", timestamp) if magic == 1 else b""
    body = struct.pack(">bb", magic, attributes) + ts
    body += struct.pack(">i", -1 if key is None else len(key)) + (key or b"")
    body += struct.pack(">i", -1 if value is None else len(value)) + (value or b"")
    return struct.pack(">qiI", offset, 4 + len(body), zlib.crc32(body) if crc is None else crc) + body


def legacy_wrapper(inner: bytes, codec: int = codecs.GZIP, *, magic: int = 1, attributes: int = 0,
                   timestamp: int = 0) -> bytes:
    return legacy_message(None, codecs.compress(codec, inner), magic=magic, attributes=attributes | codec,
                          timestamp=timestamp)


def gzip_bomb_wrapper(messages: int, magic: int = 0) -> bytes:
    """A legacy gzip wrapper holding `messages` empty messages (null key and value): some 26 (magic
    0) or 34 (magic 1) inflated bytes each, compressed about 250 to 1 by gzip."""
    one = legacy_message(None, None, magic=magic)
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = []
    step = 1 << 16
    block = one * step
    left = messages
    while left:
        n = min(step, left)
        parts.append(z.compress(block if n == step else one * n))
        left -= n
    parts.append(z.flush())
    return legacy_message(None, b"".join(parts), magic=magic, attributes=codecs.GZIP)

