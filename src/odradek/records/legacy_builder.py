"""Writing legacy message sets, magic 0 and 1 (layout: `legacy`; seed 004, "Message sets").

Uncompressed, every appended record becomes one message with its absolute offset. Compressed, the
records become an inner message set that is compressed into the value of one wrapper message, as the
Java client's MemoryRecordsBuilder writes it:

- magic 1: inner offsets relative to the first record (0, 1, ... for a contiguous run), wrapper offset
  = the last record's absolute offset, wrapper timestamp = the largest inner timestamp (CreateTime) or
  the log append time (LogAppendTime, attributes bit 3 set on the wrapper only);
- magic 0: inner offsets absolute, wrapper offset = the last inner offset, no timestamps;
- lz4 with magic 0 uses the broken header checksum old clients expect (KAFKA-3160, see `lz4frame`).

zstd cannot be used with magic 0 or 1 (ValueError, as for any builder misuse). Headers cannot be
represented and are not accepted.
"""

from __future__ import annotations

import struct
import zlib

from odradek.records import codecs
from odradek.records.legacy import LOG_OVERHEAD, NO_TIMESTAMP, TIMESTAMP_TYPE_MASK

_V0_HEAD = struct.Struct(">qiIbb")
_V1_HEAD = struct.Struct(">qiIbbq")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_NULL = _I32.pack(-1)
_BYTE_LIKE = (bytes, bytearray, memoryview)


def _length_prefixed(data) -> bytes:
    if data is None:
        return _NULL
    if not isinstance(data, _BYTE_LIKE):
        raise TypeError(f"message key and value must be bytes or None, not {type(data)}")
    return _I32.pack(len(data)) + bytes(data)


def encode_message(offset: int, magic: int, attributes: int, timestamp: int, key, value) -> bytes:
    """One message set entry: offset, size, crc, magic, attributes, [timestamp], key, value."""
    tail = _length_prefixed(key) + _length_prefixed(value)
    if magic == 0:
        head = bytearray(_V0_HEAD.pack(offset, _V0_HEAD.size - LOG_OVERHEAD + len(tail), 0, 0,
                                       attributes))
    elif magic == 1:
        head = bytearray(_V1_HEAD.pack(offset, _V1_HEAD.size - LOG_OVERHEAD + len(tail), 0, 1,
                                       attributes, timestamp))
    else:
        raise ValueError(f"legacy magic must be 0 or 1, not {magic}")
    crc = zlib.crc32(tail, zlib.crc32(memoryview(head)[16:]))
    _U32.pack_into(head, 12, crc)
    return b"".join((head, tail))


class LegacyBuilder:
    """Append records, then `build()` a magic 0 or 1 message set (one wrapper when compressed)."""

    def __init__(self, magic: int, *, compression: int = codecs.NONE, timestamp_type: int = 0,
                 log_append_time: int | None = None, base_offset: int = 0) -> None:
        if magic not in (0, 1):
            raise ValueError(f"legacy magic must be 0 or 1, not {magic}")
        if compression not in codecs.LEGACY_CODECS:
            raise ValueError(f"compression codec {compression} is not available with magic {magic}")
        if timestamp_type not in (0, 1) or (magic == 0 and timestamp_type):
            raise ValueError(f"timestamp type {timestamp_type} is invalid with magic {magic}")
        if timestamp_type == 1 and log_append_time is None:
            raise ValueError("a LogAppendTime message set needs log_append_time")
        self.magic = magic
        self.compression = compression
        self.timestamp_type = timestamp_type
        self.log_append_time = log_append_time
        self.base_offset = base_offset
        self._entries: list[tuple[int, int, object, object]] = []

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def next_offset(self) -> int:
        return self._entries[-1][0] + 1 if self._entries else self.base_offset

    def append(self, key, value, *, timestamp: int = NO_TIMESTAMP, offset: int | None = None) -> int:
        """Append one record; return its offset. Magic 0 ignores the timestamp."""
        if offset is None:
            offset = self.next_offset
        if self._entries and offset <= self._entries[-1][0]:
            raise ValueError(f"offset {offset} does not follow {self._entries[-1][0]}")
        if self.magic == 0:
            timestamp = NO_TIMESTAMP
        elif self.timestamp_type == 1:
            timestamp = self.log_append_time
        self._entries.append((offset, timestamp, key, value))
        return offset

    def build(self) -> bytes:
        if not self._entries:
            return b""
        type_bit = TIMESTAMP_TYPE_MASK if self.timestamp_type else 0
        if self.compression == codecs.NONE:
            return b"".join(encode_message(offset, self.magic, type_bit, timestamp, key, value)
                            for offset, timestamp, key, value in self._entries)
        first_offset = self._entries[0][0]
        shift = first_offset if self.magic else 0
        inner = b"".join(encode_message(offset - shift, self.magic, 0, timestamp, key, value)
                         for offset, timestamp, key, value in self._entries)
        compressed = codecs.compress(self.compression, inner, legacy_lz4=self.magic == 0)
        last_offset = self._entries[-1][0]
        if self.magic == 0:
            wrapper_timestamp = NO_TIMESTAMP
        elif self.timestamp_type == 1:
            wrapper_timestamp = self.log_append_time
        else:
            wrapper_timestamp = max(entry[1] for entry in self._entries)
        return encode_message(last_offset, self.magic, self.compression | type_bit, wrapper_timestamp,
                              None, compressed)
