"""Building a v2 record batch (layout: `header` and `batch`; seed 004, "Message sets").

The builder collects encoded records in one bytearray, compresses that once, writes the 61-byte header
in front and the CRC-32C over attributes..end last, as the Java client's MemoryRecordsBuilder does:

- base_timestamp is the first record's timestamp; deltas may be negative (zig-zag varlongs);
- max_timestamp is the largest record timestamp, or `log_append_time` for LogAppendTime batches;
- offsets default to base_offset + 0, 1, 2, ...; explicit offsets must increase (gaps are allowed, as
  compaction and conversions produce them); last_offset_delta is the last record's delta;
- an empty batch has base and max timestamp -1 (NO_TIMESTAMP) and last_offset_delta 0 unless given.

Builder misuse (out-of-range fields, decreasing offsets, wrong types) raises ValueError or TypeError:
that is a programming error, not malformed input.
"""

from __future__ import annotations

import struct

from crc32c import crc32c

from odradek.records import codecs
from odradek.records.header import (
    ATTRIBUTES_OFFSET, CONTROL_MASK, CRC_OFFSET, HEADER_SIZE, LOG_OVERHEAD, NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, TIMESTAMP_TYPE_MASK, TRANSACTIONAL_MASK,
)
from odradek.records.varint import encode_varint, encode_varlong

_HEADER = struct.Struct(">qiiBIhiqqqhii")
_U32 = struct.Struct(">I")
_NULL = encode_varint(-1)
_BYTE_LIKE = (bytes, bytearray, memoryview)


def _encode_bytes(data) -> bytes:
    if data is None:
        return _NULL
    if not isinstance(data, _BYTE_LIKE):
        raise TypeError(f"record key, value and header values must be bytes or None, not {type(data)}")
    return encode_varint(len(data)) + bytes(data)


def encode_record(offset_delta: int, timestamp_delta: int, key, value, headers=()) -> bytes:
    """One record's bytes, length prefix included."""
    parts = [b"\x00", encode_varlong(timestamp_delta), encode_varint(offset_delta),
             _encode_bytes(key), _encode_bytes(value), encode_varint(len(headers))]
    for header_key, header_value in headers:
        if not isinstance(header_key, str):
            raise TypeError(f"record header key must be str, not {type(header_key)}")
        parts.append(_encode_bytes(header_key.encode("utf-8", "surrogateescape")))
        parts.append(_encode_bytes(header_value))
    body = b"".join(parts)
    return encode_varint(len(body)) + body


class RecordBatchBuilder:
    """Append records, then `build()` the batch's bytes."""

    def __init__(self, *, compression: int = codecs.NONE, timestamp_type: int = 0, base_offset: int = 0,
                 producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH,
                 base_sequence: int = NO_SEQUENCE, is_transactional: bool = False,
                 is_control: bool = False, partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
                 log_append_time: int | None = None) -> None:
        if compression not in codecs.CODEC_NAMES:
            raise ValueError(f"unknown compression codec {compression}")
        if timestamp_type not in (0, 1):
            raise ValueError(f"unknown timestamp type {timestamp_type}")
        if timestamp_type == 1 and log_append_time is None:
            raise ValueError("a LogAppendTime batch needs log_append_time")
        self.compression = compression
        self.timestamp_type = timestamp_type
        self.base_offset = base_offset
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence
        self.is_transactional = is_transactional
        self.is_control = is_control
        self.partition_leader_epoch = partition_leader_epoch
        self.log_append_time = log_append_time
        self._records = bytearray()
        self._count = 0
        self._last_offset_delta = -1
        self._base_timestamp: int | None = None
        self._max_timestamp = -1

    def __len__(self) -> int:
        return self._count

    @property
    def uncompressed_size(self) -> int:
        """Bytes of the batch if it were built uncompressed now (for batch.size decisions)."""
        return HEADER_SIZE + len(self._records)

    @property
    def next_offset(self) -> int:
        return self.base_offset + self._last_offset_delta + 1

    def append(self, key, value, *, headers=(), timestamp: int = -1, offset: int | None = None) -> int:
        """Append one record; return its offset."""
        if offset is None:
            offset = self.next_offset
        offset_delta = offset - self.base_offset
        if offset_delta <= self._last_offset_delta:
            raise ValueError(f"offset {offset} does not follow {self.next_offset - 1}")
        if self._base_timestamp is None:
            self._base_timestamp = timestamp
        self._records += encode_record(offset_delta, timestamp - self._base_timestamp, key, value,
                                       headers)
        self._count += 1
        self._last_offset_delta = offset_delta
        if timestamp > self._max_timestamp:
            self._max_timestamp = timestamp
        return offset

    @property
    def base_timestamp(self) -> int:
        return -1 if self._base_timestamp is None else self._base_timestamp

    def build(self, *, last_offset_delta: int | None = None) -> bytes:
        """The batch's bytes with a correct CRC; last_offset_delta may extend past the last record."""
        body = (self._records if self.compression == codecs.NONE
                else codecs.compress(self.compression, self._records))
        if last_offset_delta is None:
            last_offset_delta = max(self._last_offset_delta, 0)
        elif last_offset_delta < self._last_offset_delta:
            raise ValueError("last_offset_delta before the last record")
        attributes = self.compression | (TIMESTAMP_TYPE_MASK if self.timestamp_type else 0)
        attributes |= (TRANSACTIONAL_MASK if self.is_transactional else 0)
        attributes |= (CONTROL_MASK if self.is_control else 0)
        max_timestamp = self.log_append_time if self.timestamp_type else self._max_timestamp
        header = bytearray(HEADER_SIZE)
        _HEADER.pack_into(
            header, 0, self.base_offset, HEADER_SIZE + len(body) - LOG_OVERHEAD,
            self.partition_leader_epoch, 2, 0, attributes, last_offset_delta, self.base_timestamp,
            max_timestamp, self.producer_id, self.producer_epoch, self.base_sequence, self._count)
        crc = crc32c(body, crc32c(memoryview(header)[ATTRIBUTES_OFFSET:]))
        _U32.pack_into(header, CRC_OFFSET, crc)
        return b"".join((header, body))
