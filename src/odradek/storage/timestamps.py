"""Finding a record by timestamp inside one v2 batch (ListOffsets by timestamp, max timestamp).

The indexes narrow a timestamp search to one batch; the answer is a record's offset, so the batch's
records are read. After the 61-byte header (see `odradek.records.header`) each record is:

    length varint, attributes int8, timestamp_delta varlong, offset_delta varint, key..., value...,
    headers...        (varints zigzag-encoded; a record's timestamp = base_timestamp + delta)

Only the first three fields are decoded. With LogAppendTime every record's timestamp is the batch's
max_timestamp. A compressed batch is decompressed with `decompress(codec, data) -> bytes`
(`odradek.records.codecs.decompress` by default in Log, size-capped); without one, or if the data does
not decompress, the answer is the batch's first offset at or after `min_offset`, which is never later
than the exact answer, so a consumer starting there misses nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from odradek.protocol.exceptions import ProtocolError
from odradek.records.header import HEADER_SIZE, BatchHeader
from odradek.storage.errors import CorruptRecordError

Decompress = Callable[[int, bytes], bytes]

LOG_APPEND_TIME = 1


def offset_for_timestamp(batch: bytes, target_timestamp: int, min_offset: int,
                         decompress: Decompress | None = None) -> tuple[int, int] | None:
    """(timestamp, offset) of the first record >= min_offset whose timestamp >= target, or None.

    The timestamp reported for LogAppendTime batches, and for compressed batches searched without
    `decompress`, is the batch's max_timestamp."""
    try:
        h = BatchHeader(batch, 0)
    except ProtocolError as e:
        raise CorruptRecordError(str(e)) from e
    if h.max_timestamp < target_timestamp or h.last_offset < min_offset:
        return None
    if h.timestamp_type == LOG_APPEND_TIME:
        return h.max_timestamp, max(h.base_offset, min_offset)
    records: bytes | memoryview = memoryview(batch)[HEADER_SIZE:h.size]
    if h.compression:
        try:
            if decompress is None:
                raise ProtocolError("no decompressor")
            records = decompress(h.compression, records)
        except ProtocolError:
            return h.max_timestamp, max(h.base_offset, min_offset)
    pos = 0
    for _ in range(h.records_count):
        length, pos = _varint(records, pos)
        start = pos
        pos += 1  # attributes
        ts_delta, pos = _varint(records, pos)
        offset_delta, pos = _varint(records, pos)
        offset = h.base_offset + offset_delta
        timestamp = h.base_timestamp + ts_delta
        if timestamp >= target_timestamp and offset >= min_offset:
            return timestamp, offset
        pos = start + length
    return None


def _varint(buf, pos: int) -> tuple[int, int]:
    """A zigzag varint (up to 10 bytes) at pos: (value, next position)."""
    raw = 0
    for shift in range(0, 70, 7):
        if pos >= len(buf):
            raise CorruptRecordError("record truncated inside a varint")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
    raise CorruptRecordError("varint longer than 10 bytes")
