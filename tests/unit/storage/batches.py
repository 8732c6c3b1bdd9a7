"""A tiny v2 record batch builder for storage tests (layout: odradek.records.header docstring)."""

from __future__ import annotations

import struct

from crc32c import crc32c


def varint(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        b = raw & 0x7F
        raw >>= 7
        if raw:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def record(offset_delta: int, timestamp_delta: int, value: bytes | None,
           key: bytes | None = None) -> bytes:
    body = (b"\x00" + varint(timestamp_delta) + varint(offset_delta)
            + (varint(-1) if key is None else varint(len(key)) + key)
            + (varint(-1) if value is None else varint(len(value)) + value) + varint(0))
    return varint(len(body)) + body


def batch(values: list[bytes | None], *, base_offset: int = 0, base_timestamp: int = 1_000,
          timestamp_deltas: list[int] | None = None, attributes: int = 0, leader_epoch: int = -1,
          producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
          offset_deltas: list[int] | None = None, compress=None,
          keys: list[bytes | None] | None = None) -> bytes:
    """One v2 batch; with `compress`, the records are compressed with it (set the codec bits in
    `attributes` to match). A value None is a tombstone."""
    deltas = timestamp_deltas if timestamp_deltas is not None else [0] * len(values)
    offsets = offset_deltas if offset_deltas is not None else list(range(len(values)))
    keys = keys if keys is not None else [None] * len(values)
    records = b"".join(record(o, d, v, k) for o, d, v, k in zip(offsets, deltas, values, keys))
    if compress is not None:
        records = compress(records)
    after_crc = struct.pack(">hiqqqhii", attributes, offsets[-1], base_timestamp,
                            base_timestamp + max(deltas), producer_id, producer_epoch,
                            base_sequence, len(values)) + records
    batch_length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", base_offset, batch_length, leader_epoch, 2,
                       crc32c(after_crc)) + after_crc


def batches(count: int, *, size: int = 100, records: int = 1, base_timestamp: int = 1_000,
            timestamp_step: int = 10) -> list[bytes]:
    """`count` batches of `records` records each whose values pad every batch to about `size`."""
    pad = max(size - 61 - 10 * records, 1) // records
    return [batch([bytes([i % 256]) * pad for _ in range(records)],
                  base_timestamp=base_timestamp + i * timestamp_step,
                  timestamp_deltas=list(range(records)))
            for i in range(count)]


def header(buf: bytes, pos: int = 0) -> dict[str, int]:
    (base_offset, batch_length, epoch, magic, crc, attributes, last_offset_delta, base_ts,
     max_ts) = struct.unpack_from(">qiibIhiqq", buf, pos)
    return {"base_offset": base_offset, "size": batch_length + 12, "leader_epoch": epoch,
            "magic": magic, "crc": crc, "attributes": attributes,
            "last_offset": base_offset + last_offset_delta, "base_timestamp": base_ts,
            "max_timestamp": max_ts}


def split(buf: bytes) -> list[dict[str, int]]:
    """Headers of every batch in buf; asserts buf is whole batches."""
    out, pos = [], 0
    while pos < len(buf):
        h = header(buf, pos)
        assert pos + h["size"] <= len(buf), "partial batch"
        h["crc_ok"] = crc32c(buf[pos + 21:pos + h["size"]]) == h["crc"]
        out.append(h)
        pos += h["size"]
    return out
