"""The vectorised record scan: `scan.scan_records`' contract for batches of many records, in numpy.

Two steps per chunk of at most `CHUNK_RECORDS` records (so memory stays bounded whatever the batch):

1. Framing: where each record starts. Each record's position depends on the previous record's
   length, so this is a chain. It is found by speculation: read the next record's length; assume the
   following records have the same size (a producer's records often do), decode the length varint at
   every assumed start at once and keep the longest prefix whose lengths agree with the assumption.
   Those records are proved, since each one's length leads exactly to the next start. When a
   speculation proves fewer than `SPECULATE_MIN` records, the next records are framed by a plain
   loop over their length varints (`HOP_FIRST` records, doubling up to `HOP_MAX` while speculation
   keeps failing), so records of varied sizes cost about that loop.
2. Fields: with every record's start and end known, each field is decoded for all records at once
   (the bytes at each record's position are gathered, one column per varint byte); every length is
   checked against its record's end, and the offset deltas against 0, 1, 2, ... Headers are decoded
   header by header across the records that have that many, and by the plain loop once few remain.

Varints of up to 3 bytes (values below 2**20, zig-zagged) are decoded in the vector path; longer ones
(rare: record lengths of 1 MiB or more, timestamp deltas of 17 minutes or more) take a 2-D gather of
their rows only.
"""

from __future__ import annotations

import numpy as np

from odradek.protocol.exceptions import ProtocolError
from odradek.records.scan import (
    KEY_ERROR, MIN_BODY_SIZE, MIN_HEADER_SIZE, TIMESTAMP_ERROR, DeltaBounds, InvalidRecordError, RecordsScan,
)
from odradek.records.varint import INT64_MIN, read_varint

CHUNK_RECORDS = 1 << 15
SPECULATE_MIN = 16
HOP_FIRST = 64
HOP_MAX = 4096
WINDOW_FIRST = 256
HEADER_VECTOR_MIN_ROWS = 8  # below this many records still holding headers, the plain loop is cheaper

_I64 = np.int64
_COLUMNS_5 = np.arange(5, dtype=_I64)
_COLUMNS_10 = np.arange(10, dtype=_I64)
_SHIFTS_10 = (7 * np.arange(10, dtype=np.uint64)).astype(np.uint64)


def scan_records_vector(data, count: int, bounds: DeltaBounds) -> RecordsScan:
    arr = np.frombuffer(data, dtype=np.uint8)
    end = len(arr)
    framer = _Framer(arr, data, end)
    result = RecordsScan(count, INT64_MIN)
    done = 0
    pos = 0
    while done < count and pos < end:
        starts, ends = framer.frame(pos, min(CHUNK_RECORDS, count - done), done)
        _check_fields(arr, data, starts, ends, done, bounds, result)
        done += len(starts)
        pos = int(ends[-1])
    if done < count:
        raise InvalidRecordError(f"the batch declares {count} records but holds {done}")
    if pos != end:
        raise InvalidRecordError(f"{end - pos} bytes are left over after the {count} records the batch "
                                 f"declares")
    return result


# -------------------------------------------------------------------------------------- framing
class _Framer:
    """Finds the body start and end of successive records (see the module docstring, step 1)."""

    def __init__(self, arr: np.ndarray, buf, end: int) -> None:
        self.arr = arr
        self.buf = buf
        self.end = end
        self.hop_run = 0
        self.next_hop = HOP_FIRST
        self.window = WINDOW_FIRST

    def frame(self, pos: int, limit: int, index: int) -> tuple[np.ndarray, np.ndarray]:
        starts: list[np.ndarray] = []
        ends: list[np.ndarray] = []
        got = 0
        while got < limit and pos < self.end:
            if self.hop_run:
                s, e = self._hop(pos, min(self.hop_run, limit - got), index + got)
                self.hop_run = 0
            else:
                s, e = self._speculate(pos, min(self.window, limit - got), index + got)
                self._adapt(len(s), limit - got)
            starts.append(s)
            ends.append(e)
            got += len(s)
            pos = int(e[-1])
        if len(starts) == 1:
            return starts[0], ends[0]
        return np.concatenate(starts), np.concatenate(ends)

    def _adapt(self, proved: int, wanted: int) -> None:
        """Widen speculation while it proves whole windows; hop, longer each time, while it fails."""
        if proved >= min(self.window, wanted):
            self.window = min(self.window * 4, CHUNK_RECORDS)
            self.next_hop = HOP_FIRST
        else:
            self.window = WINDOW_FIRST
            if proved < SPECULATE_MIN:
                self.hop_run = self.next_hop
                self.next_hop = min(self.next_hop * 2, HOP_MAX)

    def _length(self, pos: int, index: int) -> tuple[int, int]:
        """The body start and end of the record at pos, read one varint at a time."""
        try:
            length, body = read_varint(self.buf, pos, self.end)
        except ProtocolError as e:
            raise InvalidRecordError(f"length: {e}", index) from None
        if length < MIN_BODY_SIZE or length > self.end - body:
            raise InvalidRecordError(f"length {length} is invalid for the {self.end - body} bytes left", index)
        return body, body + length

    def _hop(self, pos: int, n: int, index: int) -> tuple[np.ndarray, np.ndarray]:
        """The plain loop: one length varint after another (one- and two-byte ones inline)."""
        buf, end = self.buf, self.end
        starts: list[int] = []
        ends: list[int] = []
        start, finish = starts.append, ends.append
        for i in range(n):
            if pos >= end:
                break
            b = buf[pos]
            if b < 0x80:
                body = pos + 1
            elif pos + 1 < end and buf[pos + 1] < 0x80:
                b = (b & 0x7F) | (buf[pos + 1] << 7)
                body = pos + 2
            else:
                body, pos = self._length(pos, index + i)
                start(body)
                finish(pos)
                continue
            length = (b >> 1) ^ -(b & 1)
            if length < MIN_BODY_SIZE or length > end - body:
                self._length(pos, index + i)  # raises, with the message
            start(body)
            pos = body + length
            finish(pos)
        return np.array(starts, dtype=_I64), np.array(ends, dtype=_I64)

    def _speculate(self, pos: int, limit: int, index: int) -> tuple[np.ndarray, np.ndarray]:
        body, record_end = self._length(pos, index)
        stride = record_end - pos
        m = min(limit, (self.end - pos) // stride)
        if m <= 1:
            return np.array([body], dtype=_I64), np.array([record_end], dtype=_I64)
        candidates = pos + stride * np.arange(m, dtype=_I64)
        u, size = _uvarint3(self.arr, candidates)
        length = (u >> 1) ^ -(u & 1)
        ok = (size + length == stride) & (length >= MIN_BODY_SIZE)
        proved = m if ok.all() else max(int(np.argmin(ok)), 1)  # row 0 is proved by _length
        if proved == 1 and not ok[0]:  # a length varint longer than 3 bytes: take _length's answer
            return np.array([body], dtype=_I64), np.array([record_end], dtype=_I64)
        candidates = candidates[:proved]
        return candidates + size[:proved], candidates + stride


def _uvarint3(arr: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unsigned varints of at most 3 bytes at positions p: (values, sizes); size 0 where longer."""
    b0 = arr.take(p, mode="clip").astype(_I64)
    more0 = b0 >> 7
    if not more0.any():
        return b0, np.ones_like(b0)
    b1 = arr.take(p + 1, mode="clip").astype(_I64)
    b2 = arr.take(p + 2, mode="clip").astype(_I64)
    more1 = more0 & (b1 >> 7)
    u = (b0 & 0x7F) | (((b1 & 0x7F) << 7) * more0) | (((b2 & 0x7F) << 14) * more1)
    size = (1 + more0 + more1) * (1 - (more1 & (b2 >> 7)))
    return u, size


# -------------------------------------------------------------------------------------- fields
def _check_fields(arr: np.ndarray, buf, starts: np.ndarray, ends: np.ndarray, index: int,
                  bounds: DeltaBounds, result: RecordsScan) -> None:
    p = starts + 1  # attributes: present, since every body has at least MIN_BODY_SIZE bytes
    timestamp_delta, p = _field(arr, p, ends, index, "timestamp delta", long=True)
    offset_delta, p = _field(arr, p, ends, index, "offset delta")
    expected = np.arange(index, index + len(starts), dtype=_I64)
    if not np.array_equal(offset_delta, expected):
        i = int(np.argmax(offset_delta != expected))
        raise InvalidRecordError(f"offset delta {int(offset_delta[i])}, expected {index + i}", index + i)
    key_length, p = _bytes_field(arr, p, ends, index, "key", -1)
    _, p = _bytes_field(arr, p, ends, index, "value", -1)
    headers, p = _field(arr, p, ends, index, "header count")
    room = (ends - p) // MIN_HEADER_SIZE
    bad = (headers < 0) | (headers > room)
    if bad.any():
        i = int(np.argmax(bad))
        raise InvalidRecordError(f"header count {int(headers[i])} is invalid for the bytes left", index + i)
    if headers.any():
        p = _headers(arr, buf, p, ends, headers, index)
    if not np.array_equal(p, ends):
        i = int(np.argmax(p != ends))
        raise InvalidRecordError(f"length {int(ends[i] - starts[i])} but its fields take "
                                 f"{int(p[i] - starts[i])}", index + i)
    _note(timestamp_delta, key_length, index, bounds, result)


def _note(timestamp_delta: np.ndarray, key_length: np.ndarray, index: int, bounds: DeltaBounds,
          result: RecordsScan) -> None:
    """Fold a chunk into the result: its largest timestamp delta and its per-record errors."""
    top = int(timestamp_delta.max())
    if top > result.max_timestamp_delta:
        result.max_timestamp_delta = top
    if not bounds.keys_required and not bounds.checks_timestamps:
        return
    bad_key = key_length < 0 if bounds.keys_required else np.zeros(len(key_length), dtype=bool)
    bad = bad_key
    if bounds.checks_timestamps:
        bad_time = (timestamp_delta < bounds.low) | (timestamp_delta > bounds.high)
        if bounds.skip is not None:
            bad_time &= timestamp_delta != bounds.skip
        bad = bad_key | bad_time
    if not bad.any():
        return
    found = np.flatnonzero(bad)
    room = max(bounds.max_errors - len(result.errors), 0)
    for i in found[:room].tolist():
        result.errors.append((index + i, KEY_ERROR if bad_key[i] else TIMESTAMP_ERROR))
    result.error_count += len(found)


def _at(index: int, rows: np.ndarray | None, i) -> int:
    """The record index of local row i (rows maps local rows to chunk rows when a subset is decoded)."""
    return index + int(i if rows is None else rows[i])


def _field(arr: np.ndarray, p: np.ndarray, ends: np.ndarray, index: int, what: str,
           long: bool = False, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The zig-zag varint (varlong when long) at each p, which must end by its record's end."""
    u, size = _uvarint3(arr, p)
    value = (u >> 1) ^ -(u & 1)
    if not size.all():
        wide_rows = np.flatnonzero(size == 0)
        indexes = index + (wide_rows if rows is None else rows[wide_rows])
        wide, wide_size = _long_varints(arr, p[wide_rows], indexes, what, long)
        value[wide_rows] = wide
        size[wide_rows] = wide_size
    q = p + size
    if (q > ends).any():
        raise InvalidRecordError(f"{what} runs past the end of the record", _at(index, rows, np.argmax(q > ends)))
    return value, q


def _long_varints(arr: np.ndarray, p: np.ndarray, indexes: np.ndarray, what: str,
                  long: bool) -> tuple[np.ndarray, np.ndarray]:
    """Zig-zag varints (varlongs when long) longer than 3 bytes at positions p, of the records with
    these indexes: (values, sizes)."""
    width = 10 if long else 5
    b = arr.take(p[:, None] + (_COLUMNS_10 if long else _COLUMNS_5), mode="clip").astype(np.uint64)
    last = b < 0x80
    ended = last.any(axis=1)
    if not ended.all():
        raise InvalidRecordError(f"{what} is longer than {width} bytes", int(indexes[np.argmin(ended)]))
    n = np.argmax(last, axis=1) + 1
    bad = (n == 10) & (b[:, 9] > 1) if long else (n == 5) & (b[:, 4] > 0x0F)
    if bad.any():
        raise InvalidRecordError(f"{what} does not fit in {64 if long else 32} bits",
                                 int(indexes[np.argmax(bad)]))
    keep = np.arange(width)[None, :] < n[:, None]
    u = (((b & np.uint64(0x7F)) << _SHIFTS_10[:width]) * keep).sum(axis=1, dtype=np.uint64)
    one = np.uint64(1)
    value = ((u >> one) ^ (np.uint64(0) - (u & one))).view(_I64)
    return value, n.astype(_I64)


def _bytes_field(arr: np.ndarray, p: np.ndarray, ends: np.ndarray, index: int, what: str,
                 smallest: int, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A length varint (>= smallest; -1 means null) and the bytes it counts, inside each record."""
    n, p = _field(arr, p, ends, index, f"{what} length", rows=rows)
    if (n < smallest).any():
        i = int(np.argmax(n < smallest))
        raise InvalidRecordError(f"{what} length {int(n[i])} is negative", _at(index, rows, i))
    q = p + np.maximum(n, 0)
    if (q > ends).any():
        i = int(np.argmax(q > ends))
        raise InvalidRecordError(f"{what} length {int(n[i])} runs past the end of the record",
                                 _at(index, rows, i))
    return n, q


def _headers(arr: np.ndarray, buf, p: np.ndarray, ends: np.ndarray, counts: np.ndarray,
             index: int) -> np.ndarray:
    """Skip every record's headers; return the positions after them. Header j of all records that
    have a header j is decoded at once, until few records remain (then the plain loop)."""
    p = p.copy()
    rows = np.flatnonzero(counts)
    at = p[rows]
    row_ends = ends[rows]
    left = counts[rows]
    while len(rows) >= HEADER_VECTOR_MIN_ROWS:
        _, at = _bytes_field(arr, at, row_ends, index, "header key", 0, rows)
        _, at = _bytes_field(arr, at, row_ends, index, "header value", -1, rows)
        left = left - 1
        done = left == 0
        if done.any():
            p[rows[done]] = at[done]
            keep = ~done
            rows, at, row_ends, left = rows[keep], at[keep], row_ends[keep], left[keep]
    for row, pos, row_end, n in zip(rows.tolist(), at.tolist(), row_ends.tolist(), left.tolist()):
        p[row] = _headers_loop(buf, pos, row_end, n, index + row)
    return p


def _headers_loop(buf, pos: int, end: int, count: int, index: int) -> int:
    try:
        for _ in range(count):
            for what, smallest in (("header key", 0), ("header value", -1)):
                n, pos = read_varint(buf, pos, end)
                if n < smallest:
                    raise InvalidRecordError(f"{what} length {n} is negative", index)
                if n > end - pos:
                    raise InvalidRecordError(f"{what} length {n} runs past the end of the record", index)
                pos += max(n, 0)
    except InvalidRecordError:
        raise
    except ProtocolError as e:
        raise InvalidRecordError(str(e), index) from None
    return pos
