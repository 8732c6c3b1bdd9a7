"""Every record of a run of v2 batches decoded at once, into columns of Python values (the consumer's
per-record read path). Pure: no I/O.

Input: `RecordBatch` views of one partition's batches, in offset order (control and aborted batches
already left out by the caller). Output: `RecordColumns`, parallel lists with one entry per record at or
after `first_offset`: offsets, timestamps, timestamp types, keys, values, and headers (a tuple of
(str key, bytes value or None) pairs per record; the column is None when no record has any). Each record is decoded exactly once, whatever slices of it the caller hands out later.

The record format is `batch`'s (seed 004, "Record"): length varint | attributes int8 | timestamp_delta
varlong | offset_delta varint | key_length varint | key | value_length varint | value | headers_count
varint | headers. The checks are `batch.iter_records_section`'s, so a malformed batch raises the same
ProtocolError there and here: a record count that the bytes cannot hold, a varint longer than 5 bytes
(varlong: 10) or wider than 32 (64) bits, a record length below 6 or past the records section, a field
past its record, a record not used exactly, records not filling their section. With LogAppendTime
(attributes bit 3) every timestamp is the batch's max_timestamp.

How, and why (profiled on 100 B and 1 KiB records; `bench/client_bench.py`): the batches' records
sections (decompressed where compressed, capped by max_uncompressed_bytes) are joined into one buffer
with zero padding, so every read below stays inside it. The only sequential step is finding where each
record starts, which needs each record's length: records come in runs of one encoded size (a producer's
values are often of one size, and the deltas change width only at 64, 8192, ...), so the next records
are guessed to have the current one's size and the guess is checked for a whole window at once with
numpy; where it fails a Python loop follows the lengths for a chunk. Every other field is then decoded
for all records at once with numpy, a varint in a few vectorised rounds. Keys and values are bytes
sliced from the joined buffer. Records with headers are parsed one by one (rare). Fewer than
NUMPY_MIN_RECORDS records (where numpy's fixed cost per call dominates), or no numpy installed: one
Python loop over the records, with the same output and the same checks.
"""

from __future__ import annotations

from typing import Any, Sequence

from odradek.protocol.exceptions import ProtocolError
from odradek.records import codecs
from odradek.records.batch import LOG_APPEND_TIME, MIN_HEADER_SIZE, MIN_RECORD_SIZE, RecordBatch

np: Any = None   # numpy, imported on the first decode that uses it (it takes ~0.1 s to import)
_NUMPY_MISSING = False

NUMPY_MIN_RECORDS = 64
_PAD = bytes(16)           # after the joined sections: a varint read (<= 10 bytes) never leaves the buffer
RUN_MIN = 16               # shortest run of equal-sized records worth checking with numpy
RUN_WINDOW_MAX = 8192
SCAN_CHUNK = 256
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


class RecordColumns:
    """Parallel lists, one entry per record; `headers` is None when no record has headers."""

    __slots__ = ("offsets", "timestamps", "timestamp_types", "keys", "values", "headers")

    def __init__(self, offsets: list, timestamps: list, timestamp_types: list, keys: list, values: list,
                 headers: list | None) -> None:
        self.offsets = offsets
        self.timestamps = timestamps
        self.timestamp_types = timestamp_types
        self.keys = keys
        self.values = values
        self.headers = headers

    def __len__(self) -> int:
        return len(self.offsets)

    def slice(self, start: int, stop: int) -> "RecordColumns":
        """Records start..stop-1 (list slices: a pointer copy per value, nothing decoded again)."""
        if start == 0 and stop >= len(self.offsets):
            return self
        h = self.headers
        return RecordColumns(self.offsets[start:stop], self.timestamps[start:stop],
                             self.timestamp_types[start:stop], self.keys[start:stop], self.values[start:stop],
                             None if h is None else h[start:stop])

    def extend(self, other: "RecordColumns") -> None:
        """Append other's records (the headers column appears once either side has one)."""
        if self.headers is not None or other.headers is not None:
            mine = self.headers if self.headers is not None else [()] * len(self)
            mine += other.headers if other.headers is not None else [()] * len(other)
            self.headers = mine
        self.offsets += other.offsets
        self.timestamps += other.timestamps
        self.timestamp_types += other.timestamp_types
        self.keys += other.keys
        self.values += other.values

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
        return _decode_numpy(buf, sections, total, first_offset)
    return _decode_python(buf, sections, first_offset)


def _have_numpy() -> bool:
    global np, _NUMPY_MISSING
    if np is None and not _NUMPY_MISSING:
        try:
            import numpy
        except ImportError:   # the pure-Python path serves every size, slower
            _NUMPY_MISSING = True
        else:
            np = numpy
    return np is not None


# ------------------------------------------------------------------------------------------ Python
def _uvarint(buf, pos: int, end: int, max_bytes: int, what: str) -> tuple[int, int]:
    result = shift = 0
    limit = pos + max_bytes
    while True:
        if pos >= end:
            raise ProtocolError(f"truncated {what}")
        if pos >= limit:
            raise ProtocolError(f"{what} longer than {max_bytes} bytes")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    u, pos = _uvarint(buf, pos, end, 5, "varint")
    if u > 0xFFFFFFFF:
        raise ProtocolError("varint does not fit in 32 bits")
    return (u >> 1) ^ -(u & 1), pos


def _varlong(buf, pos: int, end: int) -> tuple[int, int]:
    u, pos = _uvarint(buf, pos, end, 10, "varlong")
    if u > 0xFFFFFFFFFFFFFFFF:
        raise ProtocolError("varlong does not fit in 64 bits")
    return (u >> 1) ^ -(u & 1), pos


def _bytes_field(buf, pos: int, end: int, what: str) -> tuple[bytes | None, int]:
    b = buf[pos] if pos < end else 0x100
    if b < 0x80:   # a length below 64 (or -1) in one byte, the common case
        n = (b >> 1) ^ -(b & 1)
        pos += 1
    else:
        n, pos = _varint(buf, pos, end)
    if n < 0:
        if n != -1:
            raise ProtocolError(f"record {what} length {n} is negative")
        return None, pos
    if n > end - pos:
        raise ProtocolError(f"record {what} length {n} runs past the end of the record")
    return buf[pos:pos + n], pos + n


def _headers(buf, pos: int, end: int) -> tuple[tuple, int]:
    count, pos = _varint(buf, pos, end)
    if count == 0:
        return (), pos
    if count < 0 or count > (end - pos) // MIN_HEADER_SIZE:
        raise ProtocolError(f"record headers count {count} is invalid for the bytes remaining")
    out = []
    for _ in range(count):
        key, pos = _bytes_field(buf, pos, end, "header key")
        if key is None:
            raise ProtocolError("record header key is null")
        value, pos = _bytes_field(buf, pos, end, "header value")
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
                length, pos = _varint(buf, pos, end)
            if length < MIN_RECORD_SIZE - 1 or length > end - pos:
                raise ProtocolError(f"record length {length} is invalid for the bytes remaining")
            record_end = pos + length
            ts_delta, p = _varlong(buf, pos + 1, record_end)
            offset_delta, p = _varint(buf, p, record_end)
            key, p = _bytes_field(buf, p, record_end, "key")
            value, p = _bytes_field(buf, p, record_end, "value")
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


# ------------------------------------------------------------------------------------------ numpy
def _scan(buf, pos: int, count: int, out: list) -> int:
    """Append where each of `count` records from buf[pos] starts; return where the last ends. Only
    follows lengths (checked afterwards; an odd zig-zag value, a negative length, is caught then)."""
    append = out.append
    for _ in range(count):
        append(pos)
        b = buf[pos]
        if b < 0x80:
            pos += 1 + (b >> 1)
        else:
            b1 = buf[pos + 1]
            if b1 < 0x80:
                pos += 2 + (((b & 0x7F) | (b1 << 7)) >> 1)
            else:
                n, after = _uvarint(buf, pos, len(buf), 5, "record length")
                pos = after + (n >> 1)
    return pos


def _uvarints(arr, pos, max_bytes: int, what: str):
    """Unsigned varints at each position of arr (uint8, padded): (values uint64, sizes int64)."""
    b = arr[pos]
    val = (b & 0x7F).astype(np.uint64)
    size = np.ones(len(pos), np.int64)
    more = np.flatnonzero(b & 0x80)
    shift = 7
    while more.size:
        if shift >= 7 * max_bytes:
            raise ProtocolError(f"{what} longer than {max_bytes} bytes")
        b = arr[pos[more] + size[more]]
        if shift == 63 and (b > 1).any():
            raise ProtocolError(f"{what} does not fit in 64 bits")
        val[more] |= (b & 0x7F).astype(np.uint64) << np.uint64(shift)
        size[more] += 1
        more = more[(b & 0x80) != 0]
        shift += 7
    return val, size


def _zigzag(u):
    return (u >> np.uint64(1)).astype(np.int64) ^ -(u & np.uint64(1)).astype(np.int64)


def _varints32(arr, pos, what: str = "varint"):
    u, size = _uvarints(arr, pos, 5, what)
    if size.max(initial=0) == 5 and (u > 0xFFFFFFFF).any():
        raise ProtocolError(f"{what} does not fit in 32 bits")
    return _zigzag(u), size


def _starts(arr, buf, pos: int, end: int, count: int):
    """Where each of the `count` records of buf[pos:end] begins (lengths checked by the caller).

    Guess that the next records have the size of the current one; check the guess for a window of them
    at once (each candidate's length varint must give the same size); take the matching prefix. A short
    run falls back to the Python loop for a chunk, then guesses again."""
    out = []
    left = count
    window = 64
    while left > 0:
        if pos >= end:
            raise ProtocolError(f"{left} records missing at the end of a batch")
        n, after = _uvarint(buf, pos, end, 5, "record length")
        stride = after - pos + (n >> 1)
        k = min(left, window, (end - pos) // max(stride, 1))
        if stride > 0 and k >= RUN_MIN:
            cand = np.arange(k, dtype=np.int64) * stride + pos
            first = arr[cand]
            ok = first == arr[pos]
            for i in range(1, after - pos):   # every byte of the length varint matches
                ok &= arr[cand + i] == arr[pos + i]
            run = k if ok.all() else int(np.argmin(ok))
            if run >= RUN_MIN:
                out.append(cand[:run])
                pos += run * stride
                left -= run
                window = min(window * 2, RUN_WINDOW_MAX) if run == k else 64
                continue
        found: list[int] = []
        chunk = min(left, SCAN_CHUNK)
        try:
            pos = _scan(buf, pos, chunk, found)
        except IndexError:
            raise ProtocolError("record lengths run past the end of the records") from None
        if found[-1] >= end:
            raise ProtocolError("record lengths run past the end of the records")
        out.append(np.array(found, np.int64))
        left -= chunk
        window = 64
    if pos != end:
        raise ProtocolError("record lengths do not fill the batch's records")
    return out


def _check(ok, what: str) -> None:
    if not ok.all():
        raise ProtocolError(what)


def _decode_numpy(buf: bytes, sections: list[_Section], total: int, first_offset: int) -> RecordColumns:
    arr = np.frombuffer(buf, np.uint8)
    parts = []
    for s in sections:
        if s.count:
            parts += _starts(arr, buf, s.start, s.end, s.count)
        elif s.start != s.end:
            raise ProtocolError(f"{s.end - s.start} bytes left over after the batch's records")
    if not parts:
        return RecordColumns([], [], [], [], [], None)
    starts = np.concatenate(parts)
    counts = np.array([s.count for s in sections], np.int64)
    sec = np.repeat(np.arange(len(sections)), counts)
    # each record ends where the next begins, the last of a section where the section ends
    rec_end = np.empty_like(starts)
    rec_end[:-1] = starts[1:]
    last = np.cumsum(counts) - 1
    has = counts > 0
    rec_end[last[has]] = np.array([s.end for s in sections], np.int64)[has]
    length, size = _varints32(arr, starts, "record length")
    body = starts + size
    _check((length >= MIN_RECORD_SIZE - 1) & (body + length == rec_end), "record length does not match the records")
    ts_delta, size = _uvarints(arr, body + 1, 10, "varlong")
    ts_delta = _zigzag(ts_delta)
    p = body + 1 + size
    _check(p <= rec_end, "record timestamp delta runs past its record")
    offset_delta, size = _varints32(arr, p)
    p += size
    _check(p <= rec_end, "record offset delta runs past its record")
    key_len, size = _varints32(arr, p)
    key_start = p + size
    p = key_start + np.maximum(key_len, 0)
    _check((key_len >= -1) & (p <= rec_end), "record key length is invalid for its record")
    value_len, size = _varints32(arr, p)
    value_start = p + size
    p = value_start + np.maximum(value_len, 0)
    _check((value_len >= -1) & (p <= rec_end), "record value length is invalid for its record")
    no_headers = arr[p] == 0
    _check(~no_headers | (p + 1 == rec_end), "record declared more bytes than it used")
    offsets = _plus(np.array([s.base_offset for s in sections], np.int64)[sec], offset_delta)
    keep = None
    if first_offset > INT64_MIN:
        keep = offsets >= first_offset
        if keep.all():
            keep = None
    with_headers = np.flatnonzero(~no_headers)
    headers = None
    if with_headers.size:
        headers = _headers_of(buf, p, rec_end, with_headers, total)
        if keep is not None:
            headers = [h for h, k in zip(headers, keep.tolist()) if k]
        if not any(headers):
            headers = None
    lat = [s.log_append_time for s in sections]
    base_ts = np.array([s.base_timestamp for s in sections], np.int64)[sec]
    timestamps = _plus(base_ts, ts_delta)
    if any(t is not None for t in lat):
        fixed = np.array([t is not None for t in lat])[sec]
        timestamps = np.where(fixed, np.array([t if t is not None else 0 for t in lat], np.int64)[sec], timestamps)
    if keep is not None:
        offsets, timestamps, sec = offsets[keep], timestamps[keep], sec[keep]
        key_start, key_len, value_start, value_len = key_start[keep], key_len[keep], value_start[keep], value_len[keep]
    n = len(offsets)
    types = {s.timestamp_type for s in sections}
    if len(types) == 1:
        ts_types = [types.pop()] * n
    else:
        ts_types = np.array([s.timestamp_type for s in sections], np.int64)[sec].tolist()
    return RecordColumns(offsets.tolist(), timestamps.tolist(), ts_types, _slices(buf, key_start, key_len),
                         _slices(buf, value_start, value_len), headers)


def _plus(base, delta):
    """base + delta, int64, refusing results outside int64 (nonsense deltas from a broken batch)."""
    out = base + delta
    if len(out) and (((delta > 0) & (out < base)) | ((delta < 0) & (out > base))).any():
        raise ProtocolError("record offset or timestamp outside the 64-bit range")
    return out


def _slices(buf: bytes, start, length) -> list:
    """buf[start:start + length] per record, None where length is -1."""
    n = len(start)
    if not n:
        return []
    if (length < 0).all():
        return [None] * n
    s = start.tolist()
    if (length >= 0).all():
        return [buf[a:b] for a, b in zip(s, (start + length).tolist())]
    return [buf[a:a + m] if m >= 0 else None for a, m in zip(s, length.tolist())]


def _headers_of(buf: bytes, pos, rec_end, which, total: int) -> list:
    """Headers per record: () except for the records `which`, parsed one by one (each must end its
    record exactly)."""
    out: list = [()] * total
    for i, p, end in zip(which.tolist(), pos[which].tolist(), rec_end[which].tolist()):
        hdrs, p = _headers(buf, p, end)
        if p != end:
            raise ProtocolError(f"record declared {end} but used {p}")
        out[i] = hdrs
    return out
