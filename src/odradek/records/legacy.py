"""Reading legacy message sets, magic 0 and 1 (seed 004, "Message sets", "Message format", "Compression").

A message set is a sequence of entries, each (big-endian):

    offset      int64
    size        int32    bytes after this field
    crc         uint32   CRC-32 (zlib) of magic .. end
    magic       int8     0 or 1
    attributes  int8     bits 0-2 codec, bit 3 timestamp type (magic 1 only: 1 = LogAppendTime)
    timestamp   int64    magic 1 only
    key         int32 length (-1 null) + bytes
    value       int32 length (-1 null) + bytes

A compressed message (codec != 0) is a wrapper: its value is a whole inner message set, compressed.
Inner messages must have the wrapper's magic and must not be compressed themselves; the wrapper must
hold at least one. Magic 0 inner offsets are absolute. Magic 1 inner offsets are relative and the
wrapper's offset is the absolute offset of the LAST inner message, so inner absolute offset =
wrapper offset - last inner offset + inner offset. Producers may write wrapper offset 0 (librdkafka,
kafka-python): when wrapper offset - last inner offset is negative the inner offsets are left as they
are, as Kafka and kafka-python do (the broker assigns offsets to produced data anyway). With a
LogAppendTime wrapper every inner message takes the wrapper's timestamp.

`LegacyBatch` views one outer entry (what Kafka calls a legacy batch); its records are the entry
itself or, for a wrapper, the inner messages. Key and value lengths must fill a message exactly;
every length is checked against the bytes remaining before use; magic 0 records have timestamp -1
and timestamp type -1 (Kafka's NO_TIMESTAMP and NO_TIMESTAMP_TYPE).
"""

from __future__ import annotations

import struct
import zlib

from odradek.protocol.exceptions import ProtocolError
from odradek.records import codecs

LOG_OVERHEAD = 12
MAGIC_OFFSET = 16
KEY_LENGTH_OFFSET = (18, 26)  # by magic, from the start of the entry
MIN_SIZE = (14, 22)  # smallest `size` field by magic: crc, magic, attributes, [timestamp], two lengths
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
NO_TIMESTAMP = -1
NO_TIMESTAMP_TYPE = -1

_ENTRY = struct.Struct(">qiIbb")
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")


class LegacyRecord:
    """One magic 0 or 1 message, with its absolute offset and effective timestamp."""

    __slots__ = ("offset", "timestamp", "timestamp_type", "key", "value", "magic", "attributes", "crc")

    def __init__(self, offset: int, timestamp: int, timestamp_type: int, key: bytes | None,
                 value: bytes | None, magic: int, attributes: int = 0, crc: int = 0) -> None:
        self.offset = offset
        self.timestamp = timestamp
        self.timestamp_type = timestamp_type
        self.key = key
        self.value = value
        self.magic = magic
        self.attributes = attributes
        self.crc = crc

    @property
    def headers(self) -> list:
        return []

    def _fields(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LegacyRecord) and self._fields() == other._fields()

    def __repr__(self) -> str:
        return (f"LegacyRecord(offset={self.offset}, timestamp={self.timestamp}, magic={self.magic},"
                f" key={self.key!r}, value={self.value!r})")


def _read_length(buf, pos: int, end: int, what: str) -> int:
    if end - pos < 4:
        raise ProtocolError(f"message {what} length truncated")
    n = _I32.unpack_from(buf, pos)[0]
    if n < -1 or n > end - pos - 4:
        raise ProtocolError(f"message {what} length {n} is invalid for the bytes remaining")
    return n


class LegacyBatch:
    """One outer message of a legacy message set: buf[pos:pos + size]."""

    __slots__ = ("buf", "pos", "offset", "size", "crc", "magic", "attributes", "timestamp",
                 "_key_pos", "_key_len", "_value_len", "_inner")

    def __init__(self, buf, pos: int = 0) -> None:
        if pos < 0 or len(buf) - pos < LOG_OVERHEAD + 6:
            raise ProtocolError("legacy message shorter than its header")
        self.offset, length, self.crc, self.magic, self.attributes = _ENTRY.unpack_from(buf, pos)
        if self.magic not in (0, 1):
            raise ProtocolError(f"legacy message magic {self.magic}, expected 0 or 1")
        if length < MIN_SIZE[self.magic]:
            raise ProtocolError(f"legacy message size {length} below the minimum")
        if len(buf) - pos - LOG_OVERHEAD < length:
            raise ProtocolError("legacy message truncated")
        self.buf = buf
        self.pos = pos
        self.size = length + LOG_OVERHEAD
        end = pos + self.size
        self.timestamp = _I64.unpack_from(buf, pos + 18)[0] if self.magic else NO_TIMESTAMP
        key_pos = pos + KEY_LENGTH_OFFSET[self.magic]
        self._key_len = _read_length(buf, key_pos, end, "key")
        value_pos = key_pos + 4 + max(self._key_len, 0)
        self._value_len = _read_length(buf, value_pos, end, "value")
        if value_pos + 4 + max(self._value_len, 0) != end:
            raise ProtocolError("legacy message key and value do not fill the message")
        self._key_pos = key_pos
        self._inner = None

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        if self.magic == 0:
            return NO_TIMESTAMP_TYPE
        return 1 if self.attributes & TIMESTAMP_TYPE_MASK else 0

    @property
    def is_control(self) -> bool:
        return False

    @property
    def is_transactional(self) -> bool:
        return False

    @property
    def last_offset(self) -> int:
        return self.offset

    @property
    def next_offset(self) -> int:
        return self.offset + 1

    @property
    def key(self) -> bytes | None:
        if self._key_len < 0:
            return None
        start = self._key_pos + 4
        return memoryview(self.buf)[start:start + self._key_len].tobytes()

    def value_view(self) -> memoryview | None:
        if self._value_len < 0:
            return None
        start = self._key_pos + 4 + max(self._key_len, 0) + 4
        return memoryview(self.buf)[start:start + self._value_len]

    @property
    def value(self) -> bytes | None:
        view = self.value_view()
        return None if view is None else view.tobytes()

    def compute_crc(self) -> int:
        return zlib.crc32(memoryview(self.buf)[self.pos + MAGIC_OFFSET:self.pos + self.size])

    def is_valid(self) -> bool:
        return self.compute_crc() == self.crc

    def ensure_valid(self) -> None:
        computed = self.compute_crc()
        if computed != self.crc:
            raise ProtocolError(f"legacy message at offset {self.offset} is corrupt: stored crc "
                                f"{self.crc:#010x}, computed {computed:#010x}")

    def _shallow_record(self) -> LegacyRecord:
        return LegacyRecord(self.offset, self.timestamp, self.timestamp_type, self.key, self.value,
                            self.magic, self.attributes, self.crc)

    def inner_batches(self, *, check_crc: bool = True,
                      max_uncompressed_bytes: int = codecs.DEFAULT_MAX_UNCOMPRESSED_BYTES):
        """The inner messages of a compressed wrapper (cached), checked as Kafka checks them."""
        if self._inner is not None:
            return self._inner
        codec = self.compression
        if codec not in codecs.LEGACY_CODECS:
            raise ProtocolError(f"compression codec {codec} is invalid with magic {self.magic}")
        compressed = self.value_view()
        if compressed is None:
            raise ProtocolError("compressed legacy message has a null value")
        data = memoryview(codecs.decompress(codec, compressed, max_bytes=max_uncompressed_bytes))
        inner = []
        pos, end = 0, len(data)
        while pos < end:
            entry = LegacyBatch(data, pos)
            if entry.magic != self.magic:
                raise ProtocolError(f"inner message magic {entry.magic} differs from wrapper magic "
                                    f"{self.magic}")
            if entry.compression:
                raise ProtocolError("compressed legacy message inside a compressed message")
            if check_crc:
                entry.ensure_valid()
            inner.append(entry)
            pos += entry.size
        if not inner:
            raise ProtocolError("compressed legacy message with no inner messages")
        self._inner = inner
        return inner

    @property
    def base_offset(self) -> int:
        """The first record's offset (decompresses a wrapper, as Kafka does)."""
        return next(iter(self)).offset if self.compression else self.offset

    def records(self, *, check_crc: bool = True,
                max_uncompressed_bytes: int = codecs.DEFAULT_MAX_UNCOMPRESSED_BYTES):
        """Iterate the records: this message, or the inner messages of a wrapper."""
        if check_crc:
            self.ensure_valid()
        if not self.compression:
            return iter((self._shallow_record(),))
        inner = self.inner_batches(check_crc=check_crc, max_uncompressed_bytes=max_uncompressed_bytes)
        return self._iter_inner(inner)

    def _iter_inner(self, inner):
        shift = max(self.offset - inner[-1].offset, 0) if self.magic else 0
        timestamp_type = self.timestamp_type
        log_append_time = self.timestamp if timestamp_type == 1 else None
        for entry in inner:
            timestamp = entry.timestamp if log_append_time is None else log_append_time
            yield LegacyRecord(entry.offset + shift, timestamp, timestamp_type, entry.key, entry.value,
                               entry.magic, entry.attributes, entry.crc)

    def __iter__(self):
        return self.records()

    def __repr__(self) -> str:
        return (f"LegacyBatch(offset={self.offset}, magic={self.magic}, compression={self.compression},"
                f" size={self.size})")
