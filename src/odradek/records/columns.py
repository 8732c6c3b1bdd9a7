"""Every record of a run of v2 batches decoded at once, into columns of Python values (the consumer's
per-record read path). Pure: no I/O.

Input: `RecordBatch` views of one partition's batches, in offset order (control and aborted batches
already left out by the caller). Output: `RecordColumns`, parallel columns with one entry per record at
or after `first_offset`: offsets, timestamps, timestamp types, keys, values, and headers (a tuple of
(str key, bytes value or None) pairs per record; the column is None when no record has any). Each record
is decoded exactly once, whatever slices of it the caller hands out later.

The record format is `batch`'s (seed 004, "Record"): length varint | attributes int8 | timestamp_delta
varlong | offset_delta varint | key_length varint | key | value_length varint | value | headers_count
varint | headers. The checks are `batch.iter_records_section`'s, so a malformed batch raises the same
ProtocolError there and here: a record count that the bytes cannot hold, a varint longer than 5 bytes
(varlong: 10) or wider than 32 (64) bits, a record length below 6 or past the records section, a field
past its record, a record not used exactly, records not filling their section. With LogAppendTime
(attributes bit 3) every timestamp is the batch's max_timestamp.

How, and why (profiled on 100 B and 1 KiB records; `bench/client_bench.py`): the batches' records
sections (decompressed where compressed, capped by max_uncompressed_bytes) are joined into one buffer
with zero padding, so every read stays inside it. From NUMPY_MIN_RECORDS records on, `columns_numpy`
decodes every field of every record at once (numpy's fixed cost per call dominates below that); keys
and values are bytes sliced from the joined buffer, made when a caller first reads that column. Fewer
records, or no numpy installed: one Python loop over the records, with the same output and checks.
"""

from __future__ import annotations

from typing import Any, Sequence

from odradek.protocol.exceptions import ProtocolError
from odradek.records import codecs
from odradek.records.batch import LOG_APPEND_TIME, MIN_HEADER_SIZE, MIN_RECORD_SIZE, RecordBatch
from odradek.records.varint import read_varbytes, read_varint, read_varlong

_numpy_path: Any = None    # columns_numpy: imported by load_bulk_decoder or the first decode that uses it
_NUMPY_MISSING = False

NUMPY_MIN_RECORDS = 64
_PAD = bytes(16)           # after the joined sections: a varint read (<= 10 bytes) never leaves the buffer
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


class RecordColumns:
    """Parallel columns, one entry per record: `offsets`, `timestamps`, `timestamp_types`, `keys`,
    `values` (lists) and `headers` (None when no record has headers).

    From the numpy path the columns stay arrays over the decoded bytes (`source`, records lo..lo+n-1)
    until read: each list is made on its first use, so a reader of values alone (the console consumer)
    makes no offset, timestamp or key objects."""

    __slots__ = ("_n", "_offsets", "_timestamps", "timestamp_types", "_keys", "_values", "headers", "_source",
                 "_lo")

    def __init__(self, offsets: list, timestamps: list, timestamp_types: list, keys: list, values: list,
                 headers: list | None) -> None:
        self._n = len(offsets)
        self._offsets: list | None = offsets
        self._timestamps: list | None = timestamps
        self.timestamp_types = timestamp_types
        self._keys: list | None = keys
        self._values: list | None = values
        self.headers = headers
        self._source = None
        self._lo = 0

    @classmethod
    def from_source(cls, source, timestamp_types: list, headers: list | None, lo: int = 0) -> "RecordColumns":
        """Columns read lazily from `source` (columns_numpy.ColumnSource), records lo..lo+len-1."""
        c = cls.__new__(cls)
        c._n = len(timestamp_types)
        c._offsets = c._timestamps = c._keys = c._values = None
        c.timestamp_types = timestamp_types
        c.headers = headers
        c._source = source
        c._lo = lo
        return c

    def __len__(self) -> int:
        return self._n

    @property
    def offsets(self) -> list:
        if self._offsets is None:
            self._offsets = self._source.offsets_list(self._lo, self._lo + self._n)
        return self._offsets

    @property
    def timestamps(self) -> list:
        if self._timestamps is None:
            self._timestamps = self._source.timestamps_list(self._lo, self._lo + self._n)
        return self._timestamps

    @property
    def keys(self) -> list:
        if self._keys is None:
            self._keys = self._source.keys_list(self._lo, self._lo + self._n)
        return self._keys

    @property
    def values(self) -> list:
        if self._values is None:
            self._values = self._source.values_list(self._lo, self._lo + self._n)
        return self._values

    @property
    def last_offset(self) -> int:
        """The offset of the last record (there must be one)."""
        if self._offsets is not None:
            return self._offsets[-1]
        return self._source.last_offset(self._lo + self._n)

    def joined_values(self, separator: bytes, null: bytes) -> bytes:
        """Every value followed by `separator`, a null value as `null`: one bytes object (the console
        consumer's output), copied at once where the values allow it."""
        if self._values is None and self._source is not None and not self.headers:
            out = self._source.joined_values(self._lo, self._lo + self._n, separator)
            if out is not None:
                return out
        values = self.values
        if None in values:
            values = [null if v is None else v for v in values]
        return separator.join(values) + separator if values else b""

    def slice(self, start: int, stop: int) -> "RecordColumns":
        """Records start..stop-1 (list slices where lists were made: a pointer copy per value; nothing
        is decoded again)."""
        stop = min(stop, self._n)
        if start == 0 and stop == self._n:
            return self
        c = RecordColumns.from_source(self._source, self.timestamp_types[start:stop],
                                      None if self.headers is None else self.headers[start:stop], self._lo + start)
        for name in ("_offsets", "_timestamps", "_keys", "_values"):
            col = getattr(self, name)
            if col is not None:
                setattr(c, name, col[start:stop])
        return c

    def extend(self, other: "RecordColumns") -> None:
        """Append other's records (lists are made on both sides; the headers column appears once either
        side has one)."""
        if self.headers is not None or other.headers is not None:
            mine = self.headers if self.headers is not None else [()] * len(self)
            mine += other.headers if other.headers is not None else [()] * len(other)
            self.headers = mine
        self._offsets = self.offsets + other.offsets
        self._timestamps = self.timestamps + other.timestamps
        self._keys = self.keys + other.keys
        self._values = self.values + other.values
        self.timestamp_types = self.timestamp_types + other.timestamp_types
        self._n += other._n
        self._source = None

    @classmethod
    def of_records(cls, records) -> "RecordColumns":
        """Columns from record objects with offset, timestamp, timestamp_type, key, value and headers
        attributes (legacy records, which take the one-by-one path)."""
        headers = [tuple(r.headers) for r in records]
        return cls([r.offset for r in records], [r.timestamp for r in records],
                   [r.timestamp_type for r in records], [r.key for r in records], [r.value for r in records],
                   headers if any(headers) else None)


class _Section:
    """One batch's records section inside the joined buffer."""

    __slots__ = ("start", "end", "count", "base_offset", "base_timestamp", "log_append_time", "timestamp_type")

    def __init__(self, start: int, end: int, batch: RecordBatch) -> None:
        self.start = start
        self.end = end
        self.count = batch.records_count
        self.base_offset = batch.base_offset
        self.base_timestamp = batch.base_timestamp
        self.timestamp_type = batch.timestamp_type
        self.log_append_time = batch.max_timestamp if self.timestamp_type == LOG_APPEND_TIME else None


def decode_batches(batches: Sequence[RecordBatch], first_offset: int = INT64_MIN, *,
                   max_uncompressed_bytes: int = codecs.DEFAULT_MAX_UNCOMPRESSED_BYTES,
                   use_numpy: bool | None = None) -> RecordColumns:
    """The records of `batches` whose offset is >= first_offset, as columns. CRCs are not checked here
    (`BatchHeader.ensure_valid`). use_numpy: None chooses by size; False forces the Python loop."""
    pieces = []
    sections = []
    at = 0
    total = 0
    for b in batches:
        if b.next_offset <= first_offset:
            continue
        data = b.records_bytes(max_uncompressed_bytes)
        n = len(data)
        count = b.records_count
        if count < 0 or count > n // MIN_RECORD_SIZE:
            raise ProtocolError(f"record count {count} is invalid for the {n} bytes of records")
        pieces.append(data)
        sections.append(_Section(at, at + n, b))
        at += n
        total += count
    pieces.append(_PAD)
    buf = b"".join(pieces)
    if use_numpy is None:
        use_numpy = total >= NUMPY_MIN_RECORDS
    if use_numpy and _have_numpy():
        return _numpy_path.decode(buf, sections, total, first_offset)
    return _decode_python(buf, sections, first_offset)


def load_bulk_decoder() -> bool:
    """Import the numpy path now (a consumer calls this when it starts, so that its first poll does not
    stall the event loop importing numpy); False when numpy is not installed."""
    return _have_numpy()


def _have_numpy() -> bool:
    global _numpy_path, _NUMPY_MISSING
    if _numpy_path is None and not _NUMPY_MISSING:
        try:
            from odradek.records import columns_numpy
        except ModuleNotFoundError as e:   # no numpy: the pure-Python path serves every size, slower
            if e.name != "numpy":          # anything else is a bug in our code: say so, do not fall back
                raise
            _NUMPY_MISSING = True
        else:
            _numpy_path = columns_numpy
    return _numpy_path is not None


# ------------------------------------------------------------------------------------------ Python
def _headers(buf, pos: int, end: int) -> tuple[tuple, int]:
    count, pos = read_varint(buf, pos, end)
    if count == 0:
        return (), pos
    if count < 0 or count > (end - pos) // MIN_HEADER_SIZE:
        raise ProtocolError(f"record headers count {count} is invalid for the bytes remaining")
    out = []
    for _ in range(count):
        key, pos = read_varbytes(buf, pos, end, "header key")
        if key is None:
            raise ProtocolError("record header key is null")
        value, pos = read_varbytes(buf, pos, end, "header value")
        out.append((key.decode("utf-8", "surrogateescape"), value))
    return tuple(out), pos


def _decode_python(buf: bytes, sections: list[_Section], first_offset: int) -> RecordColumns:
    offsets: list = []
    timestamps: list = []
    types: list = []
    keys: list = []
    values: list = []
    headers: list = []
    any_headers = False
    for s in sections:
        pos, end = s.start, s.end
        base_offset, base_ts, lat, tst = s.base_offset, s.base_timestamp, s.log_append_time, s.timestamp_type
        for _ in range(s.count):
            b = buf[pos] if pos < end else 0x100
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                length, pos = read_varint(buf, pos, end)
            if length < MIN_RECORD_SIZE - 1 or length > end - pos:
                raise ProtocolError(f"record length {length} is invalid for the bytes remaining")
            record_end = pos + length
            ts_delta, p = read_varlong(buf, pos + 1, record_end)
            offset_delta, p = read_varint(buf, p, record_end)
            key, p = read_varbytes(buf, p, record_end, "key")
            value, p = read_varbytes(buf, p, record_end, "value")
            if p < record_end and buf[p] == 0:
                hdrs: tuple = ()
                p += 1
            else:
                hdrs, p = _headers(buf, p, record_end)
                any_headers = any_headers or bool(hdrs)
            if p != record_end:
                raise ProtocolError(f"record declared {length} bytes but used {p - pos}")
            pos = record_end
            offset = base_offset + offset_delta
            timestamp = base_ts + ts_delta
            if not (INT64_MIN <= offset <= INT64_MAX and INT64_MIN <= timestamp <= INT64_MAX):
                raise ProtocolError("record offset or timestamp outside the 64-bit range")
            if offset < first_offset:
                continue
            offsets.append(offset)
            timestamps.append(timestamp if lat is None else lat)
            types.append(tst)
            keys.append(key)
            values.append(value)
            headers.append(hdrs)
        if pos != end:
            raise ProtocolError(f"{end - pos} bytes left over after the batch's records")
    return RecordColumns(offsets, timestamps, types, keys, values, headers if any_headers else None)
