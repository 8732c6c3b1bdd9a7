"""Reading a v2 record batch: a header view over the bytes plus lazy, bounds-checked record iteration.

Batch header: see `header` (61 bytes; seed 004 "Message sets", the RecordBatch BNF). The records follow
it, compressed as one block when attributes bits 0-2 are non-zero. Each record (seed 004, "Record"):

    length            varint   bytes after this field
    attributes        int8     unused, 0
    timestamp_delta   varlong  timestamp - base_timestamp
    offset_delta      varint   offset - base_offset
    key_length        varint   -1 for a null key
    key               bytes
    value_length      varint   -1 for a null value
    value             bytes
    headers_count     varint
    headers           [header_key_length varint, header_key utf-8 (not null),
                       header_value_length varint (-1 null), header_value bytes]

As Kafka does: with LogAppendTime (attributes bit 3) every record's timestamp is the batch's
max_timestamp; records_count records must fill the records section exactly, and each record its
length exactly. Every length is checked against the bytes remaining before it is used, and a count
against the smallest size its items could have, so no input allocates more than it holds. Header
keys are decoded with surrogateescape so bytes that are not UTF-8 round-trip unchanged.

Iteration decompresses (capped by `max_uncompressed_bytes`) when it starts, not when the view is made;
building a view reads only the header, and `ensure_valid()` is one CRC-32C over a memoryview.
"""

from __future__ import annotations

from odradek.protocol.exceptions import ProtocolError
from odradek.records import codecs
from odradek.records.header import HEADER_SIZE, BatchHeader
from odradek.records.varint import read_varint, read_varlong

MIN_RECORD_SIZE = 7  # length, attributes, timestamp delta, offset delta, key and value lengths, count
MIN_HEADER_SIZE = 2  # key length and value length
CREATE_TIME = 0
LOG_APPEND_TIME = 1
NO_TIMESTAMP = -1


class Record:
    """One record of a v2 batch, with absolute offset and timestamp."""

    __slots__ = ("offset", "timestamp", "key", "value", "headers", "attributes", "offset_delta",
                 "timestamp_delta")

    def __init__(self, offset: int, timestamp: int, key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes | None]], attributes: int = 0, offset_delta: int = 0,
                 timestamp_delta: int = 0) -> None:
        self.offset = offset
        self.timestamp = timestamp
        self.key = key
        self.value = value
        self.headers = headers
        self.attributes = attributes
        self.offset_delta = offset_delta
        self.timestamp_delta = timestamp_delta

    def _fields(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and self._fields() == other._fields()

    def __repr__(self) -> str:
        return (f"Record(offset={self.offset}, timestamp={self.timestamp}, key={self.key!r}, "
                f"value={self.value!r}, headers={self.headers!r})")


def _read_bytes(buf, pos: int, end: int, what: str) -> tuple[bytes | None, int]:
    n, pos = read_varint(buf, pos, end)
    if n < 0:
        if n != -1:
            raise ProtocolError(f"record {what} length {n} is negative")
        return None, pos
    if n > end - pos:
        raise ProtocolError(f"record {what} length {n} runs past the end of the record")
    return bytes(buf[pos:pos + n]), pos + n


def _read_headers(buf, pos: int, end: int) -> tuple[list[tuple[str, bytes | None]], int]:
    count, pos = read_varint(buf, pos, end)
    if count == 0:
        return [], pos
    if count < 0 or count > (end - pos) // MIN_HEADER_SIZE:
        raise ProtocolError(f"record headers count {count} is invalid for the bytes remaining")
    headers = []
    for _ in range(count):
        key, pos = _read_bytes(buf, pos, end, "header key")
        if key is None:
            raise ProtocolError("record header key is null")
        value, pos = _read_bytes(buf, pos, end, "header value")
        headers.append((key.decode("utf-8", "surrogateescape"), value))
    return headers, pos


def iter_records_section(buf, pos: int, end: int, count: int, base_offset: int, base_timestamp: int,
                         log_append_time: int | None):
    """Yield `count` records from buf[pos:end], which they must fill exactly."""
    if count < 0 or count > (end - pos) // MIN_RECORD_SIZE:
        raise ProtocolError(f"record count {count} is invalid for the {end - pos} bytes of records")
    for _ in range(count):
        length, pos = read_varint(buf, pos, end)
        if length < MIN_RECORD_SIZE - 1 or length > end - pos:
            raise ProtocolError(f"record length {length} is invalid for the bytes remaining")
        record_end = pos + length
        attributes = buf[pos]
        timestamp_delta, p = read_varlong(buf, pos + 1, record_end)
        offset_delta, p = read_varint(buf, p, record_end)
        key, p = _read_bytes(buf, p, record_end, "key")
        value, p = _read_bytes(buf, p, record_end, "value")
        headers, p = _read_headers(buf, p, record_end)
        if p != record_end:
            raise ProtocolError(f"record declared {length} bytes but used {p - pos}")
        timestamp = base_timestamp + timestamp_delta if log_append_time is None else log_append_time
        yield Record(base_offset + offset_delta, timestamp, key, value, headers, attributes,
                     offset_delta, timestamp_delta)
        pos = record_end
    if pos != end:
        raise ProtocolError(f"{end - pos} bytes left over after the batch's records")


class RecordBatch(BatchHeader):
    """A v2 batch over buf[pos:pos + size]; header fields are read at once, records lazily."""

    __slots__ = ("_records",)

    def __init__(self, buf, pos: int = 0) -> None:
        super().__init__(buf, pos)
        self._records = None

    @property
    def delete_horizon_set(self) -> bool:
        return bool(self.attributes & 0x40)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    def records_bytes(self, max_uncompressed_bytes: int = codecs.DEFAULT_MAX_UNCOMPRESSED_BYTES):
        """The records section, decompressed (cached after the first call)."""
        if self._records is None:
            body = memoryview(self.buf)[self.pos + HEADER_SIZE:self.pos + self.size]
            self._records = codecs.decompress(self.compression, body, max_bytes=max_uncompressed_bytes)
        return self._records

    def records(self, *, check_crc: bool = True,
                max_uncompressed_bytes: int = codecs.DEFAULT_MAX_UNCOMPRESSED_BYTES):
        """Iterate the records; ProtocolError on a bad CRC or malformed records."""
        if check_crc:
            self.ensure_valid()
        data = self.records_bytes(max_uncompressed_bytes)
        log_append_time = self.max_timestamp if self.timestamp_type == LOG_APPEND_TIME else None
        return iter_records_section(data, 0, len(data), self.records_count, self.base_offset,
                                    self.base_timestamp, log_append_time)

    def __iter__(self):
        return self.records()

    def __repr__(self) -> str:
        return (f"RecordBatch(base_offset={self.base_offset}, last_offset_delta={self.last_offset_delta},"
                f" records_count={self.records_count}, compression={self.compression},"
                f" control={self.is_control}, transactional={self.is_transactional})")
