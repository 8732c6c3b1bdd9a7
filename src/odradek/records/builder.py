"""Building a v2 record batch (layout: `header` and `batch`; seed 004, "Message sets").

The builder encodes records into one bytearray that starts with room for the 61-byte header, compresses
them once, writes the header in front and the CRC-32C over attributes..end last, as the Java client's
MemoryRecordsBuilder does:

- base_timestamp is the first record's timestamp; deltas may be negative (zig-zag varlongs);
- max_timestamp is the largest record timestamp, or `log_append_time` for LogAppendTime batches;
- offsets default to base_offset + 0, 1, 2, ...; explicit offsets must increase (gaps are allowed, as
  compaction and conversions produce them); last_offset_delta is the last record's delta;
- an empty batch has base and max timestamp -1 (NO_TIMESTAMP) and last_offset_delta 0 unless given.

The common record (no headers, next offset, key and value bytes or None: what producers mostly append)
takes `append_plain`, whose varints come from a table and which writes each record with one join; any
other record takes `encode_record`. Both write the same bytes. `build(copy=False)` hands out the
uncompressed batch without copying it (the producer's path).

The buffer is an `io.BytesIO` written sequentially. A builder may be given one that served an earlier
batch (`buffer=`, see `odradek.records.buffer_pool`): its memory is already allocated and mapped, so a
producer that reuses buffers does not grow a fresh one, page fault by page fault, for every batch.
`detach_buffer()` hands it back once the batch's bytes are no longer needed.

Builder misuse (out-of-range fields, decreasing offsets, wrong types) raises ValueError or TypeError:
that is a programming error, not malformed input.
"""

from __future__ import annotations

import io
import struct

from odradek.records import codecs
from odradek.records.crc import crc32c
from odradek.records.header import (
    ATTRIBUTES_OFFSET, CONTROL_MASK, CRC_OFFSET, HEADER_SIZE, LOG_OVERHEAD, NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, TIMESTAMP_TYPE_MASK, TRANSACTIONAL_MASK,
)
from odradek.records.varint import UVARINT_TABLE_SIZE, UVARINTS, encode_uvarint, encode_varint, encode_varlong

_HEADER = struct.Struct(">qiiBIhiqqqhii")
_U32 = struct.Struct(">I")
_NULL = encode_varint(-1)
_BYTE_LIKE = (bytes, bytearray, memoryview)
_PLAIN = (bytes, bytearray, type(None))   # key and value types append_plain takes
_UV = UVARINTS
_SMALL = UVARINT_TABLE_SIZE // 2   # zig-zag doubles: offset deltas below this come from the table
_NO_BASE = 1 << 64    # base timestamp before the first record: no int64 timestamp is this far from it
_HEADER_ROOM = bytes(HEADER_SIZE)


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
                 log_append_time: int | None = None, buffer: io.BytesIO | None = None) -> None:
        """`buffer`: a BytesIO to write into from its start (an earlier batch's, for its memory); it
        must have no exported views."""
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
        out = io.BytesIO() if buffer is None else buffer
        out.seek(0)
        out.write(_HEADER_ROOM)   # the header, written by build(), then the records; bytes past
        self._out = out           # tell() are an earlier batch's and never read
        self._write = out.write
        self._last_offset_delta = -1
        self._skipped = 0                    # offsets left out by explicit offsets
        self._base_timestamp = _NO_BASE
        self._max_timestamp = -1

    def __len__(self) -> int:
        return self._last_offset_delta + 1 - self._skipped

    @property
    def uncompressed_size(self) -> int:
        """Bytes of the batch if it were built uncompressed now (for batch.size decisions)."""
        return self._out.tell()

    @property
    def next_offset(self) -> int:
        return self.base_offset + self._last_offset_delta + 1

    @property
    def base_timestamp(self) -> int:
        return -1 if self._base_timestamp == _NO_BASE else self._base_timestamp

    def append(self, key, value, *, headers=(), timestamp: int = -1, offset: int | None = None) -> int:
        """Append one record; return its offset."""
        if offset is None and not headers and type(key) in _PLAIN and type(value) in _PLAIN:
            return self.append_plain(key, value, timestamp)
        if offset is None:
            offset = self.next_offset
        offset_delta = offset - self.base_offset
        if offset_delta <= self._last_offset_delta:
            raise ValueError(f"offset {offset} does not follow {self.next_offset - 1}")
        if self._base_timestamp == _NO_BASE:
            self._base_timestamp = timestamp
        self._write(encode_record(offset_delta, timestamp - self._base_timestamp, key, value, headers))
        self._skipped += offset_delta - self._last_offset_delta - 1
        self._last_offset_delta = offset_delta
        if timestamp > self._max_timestamp:
            self._max_timestamp = timestamp
        return offset

    def append_plain(self, key, value, timestamp: int) -> int:
        """`append(key, value, timestamp=timestamp)` for key and value bytes, bytearray or None (the
        producer's hot path); return the record's offset."""
        od = self._last_offset_delta + 1
        td = timestamp - self._base_timestamp
        if td >= 0:   # (not before the first record: the base is still _NO_BASE)
            try:      # varints from the table; past it (IndexError) or None (TypeError): encode_record
                rec = b"".join((b"\x00", _UV[td + td],
                                _UV[od + od] if od < _SMALL else encode_uvarint(od + od),
                                b"\x01" if key is None else _UV[len(key) * 2] + key,
                                _UV[len(value) * 2], value, b"\x00"))
                n = len(rec)
                length = _UV[n + n]
            except (IndexError, TypeError):
                pass
            else:
                write = self._write
                write(length)
                write(rec)
                self._last_offset_delta = od
                if timestamp > self._max_timestamp:
                    self._max_timestamp = timestamp
                return self.base_offset + od
        return self._append_encoded(od, key, value, timestamp)

    def _append_encoded(self, od: int, key, value, timestamp: int) -> int:
        if self._base_timestamp == _NO_BASE:
            self._base_timestamp = timestamp
        self._write(encode_record(od, timestamp - self._base_timestamp, key, value))
        self._last_offset_delta = od
        if timestamp > self._max_timestamp:
            self._max_timestamp = timestamp
        return self.base_offset + od

    def build(self, *, last_offset_delta: int | None = None, copy: bool = True):
        """The batch's bytes with a correct CRC; last_offset_delta may extend past the last record.

        copy=False: an uncompressed batch is a read-only memoryview of the builder's buffer, valid until
        the next build; the builder takes no appends while the view is alive."""
        if last_offset_delta is None:
            last_offset_delta = max(self._last_offset_delta, 0)
        elif last_offset_delta < self._last_offset_delta:
            raise ValueError("last_offset_delta before the last record")
        size = self._out.tell()
        buf = self._out.getbuffer()[:size]   # exported: the buffer takes no writes while views live
        if self.compression == codecs.NONE:
            self._write_header(buf, size, last_offset_delta)
            _U32.pack_into(buf, CRC_OFFSET, crc32c(buf[ATTRIBUTES_OFFSET:]))
            if not copy:
                return buf.toreadonly()
            out = bytes(buf)
            buf.release()
            return out
        body = codecs.compress(self.compression, buf[HEADER_SIZE:])
        buf.release()
        header = bytearray(HEADER_SIZE)
        self._write_header(header, HEADER_SIZE + len(body), last_offset_delta)
        _U32.pack_into(header, CRC_OFFSET, crc32c(body, crc32c(memoryview(header)[ATTRIBUTES_OFFSET:])))
        return b"".join((header, body))

    def detach_buffer(self) -> io.BytesIO:
        """Give up the buffer (for another builder: `buffer=`); this builder takes no more calls."""
        out = self._out
        self._out = self._write = None   # type: ignore[assignment]
        return out

    def _write_header(self, out, size: int, last_offset_delta: int) -> None:
        """The 61-byte header at the front of `out`, the CRC left for the caller."""
        attributes = self.compression | (TIMESTAMP_TYPE_MASK if self.timestamp_type else 0)
        attributes |= (TRANSACTIONAL_MASK if self.is_transactional else 0)
        attributes |= (CONTROL_MASK if self.is_control else 0)
        max_timestamp = self.log_append_time if self.timestamp_type else self._max_timestamp
        _HEADER.pack_into(
            out, 0, self.base_offset, size - LOG_OVERHEAD, self.partition_leader_epoch, 2, 0, attributes,
            last_offset_delta, self.base_timestamp, max_timestamp, self.producer_id, self.producer_epoch,
            self.base_sequence, len(self))
