"""The vectorised record scan: `scan.scan_records`' contract for batches of many records, in numpy.

Two steps, segment by segment, each of at most `CHUNK_RECORDS` records (memory stays bounded):

1. Framing: where each record starts. Each record's position depends on the previous record's
   length, so this is a chain. It is found by speculation: read the next record's length and layout
   (`_Layout`: where its deltas and its key length, value length and header count varints are) and
   assume the following records have the same size and layout (a producer's records often do). The
   8-byte words that cover those varints are read at once for every assumed record (a strided view
   of the bytes) and the longest prefix of records whose words equal the first one's, under a mask
   (every bit of the lengths, the continuation bits of the deltas), is a proved run: each record's
   length leads exactly to the next one, and all have the first one's layout. When a speculation
   proves fewer than `SPECULATE_MIN` records, the next records are framed by a plain loop over their
   length varints (`HOP_FIRST` records, doubling up to `HOP_MAX` while speculation keeps failing, then
   speculating over `WINDOW_FIRST` records only), so records of varied sizes cost about that loop.
2. Fields. In a run, only the two deltas are left: they are decoded from the same words, and the
   offset deltas compared with 0, 1, 2, ... Records outside runs (framed by the loop, or with
   headers, whose layout is not fixed) take the general path: each field is decoded for all records
   at once by gathering the bytes at each record's position, every length is checked against its
   record's end, and headers are decoded header by header across the records that have that many,
   then by a plain loop once few remain. Varints of up to 3 bytes are decoded there directly; longer
   ones (rare: 1 MiB records, timestamp deltas of 17 minutes or more) take a 2-D gather of their rows
   only.
"""

from __future__ import annotations

import functools

import numpy as np

from odradek.protocol.exceptions import ProtocolError
from odradek.records.scan import (
    KEY_ERROR, MIN_BODY_SIZE, MIN_HEADER_SIZE, TIMESTAMP_ERROR, DeltaBounds, InvalidRecordError, LoopBudget,
    RecordsScan, check_records,
)
from odradek.records.varint import INT64_MIN, read_varint, read_varlong

CHUNK_RECORDS = 1 << 15
SPECULATE_MIN = 16
HOP_FIRST = 64
HOP_MAX = 4096
WINDOW_FIRST = 1024
HEADER_VECTOR_MIN_ROWS = 64  # below this many records still holding headers, the plain loop

_I64 = np.int64
_COLUMNS_5 = np.arange(5, dtype=_I64)
_COLUMNS_10 = np.arange(10, dtype=_I64)
_SHIFTS_10 = (7 * np.arange(10, dtype=np.uint64)).astype(np.uint64)


class _Scan:
    """What one scan's steps share: the bytes (as an array and as given), the rules, the result so
    far and the budget of plain-loop work."""

    __slots__ = ("arr", "buf", "bounds", "result", "budget")

    def __init__(self, data, bounds: DeltaBounds, result: RecordsScan, budget: LoopBudget) -> None:
        self.arr = np.frombuffer(data, dtype=np.uint8)
        self.buf = data
        self.bounds = bounds
        self.result = result
        self.budget = budget


def scan_records_vector(data, count: int, bounds: DeltaBounds, budget: LoopBudget | None = None) -> RecordsScan:
    scan = _Scan(data, bounds, RecordsScan(count, INT64_MIN), budget or LoopBudget())
    end = len(scan.arr)
    framer = _Framer(scan.arr, data, end, scan.budget)
    done = 0
    pos = 0
    while done < count and pos < end:
        try:
            pos, done = _segment(scan, framer, pos, done, count)
        except InvalidRecordError as e:
            _first_error(scan, pos, done, e)
    result = scan.result
    if done < count:
        raise InvalidRecordError(f"the batch declares {count} records but holds {done}")
    if pos != end:
        raise InvalidRecordError(f"{end - pos} bytes are left over after the {count} records the batch "
                                 f"declares")
    return result


def _segment(scan: _Scan, framer: "_Framer", pos: int, done: int, count: int) -> tuple[int, int]:
    """Frame and check the next segment of records from pos (record `done`); return where it ends."""
    segment = framer.next(pos, min(CHUNK_RECORDS, count - done), done)
    if isinstance(segment, _Run):
        if not _check_run(scan, segment, done):
            _check_fields(scan, *segment.bounds(), done)
        return segment.end, done + segment.n
    starts, ends = segment
    _check_fields(scan, starts, ends, done)
    return int(ends[-1]), done + len(starts)


def _first_error(scan: _Scan, pos: int, done: int, error: InvalidRecordError) -> None:
    """Raise the first error among the records from `done` on: the vectorised checks go field by
    field, so the record they name may not be the first bad one. The plain loop finds that one (it
    need not go past the record named)."""
    last = done if error.index is None else error.index + 1
    check_records(scan.buf, pos, len(scan.arr), done, last, scan.bounds, scan.budget,
                  RecordsScan(0, INT64_MIN))
    raise error


# -------------------------------------------------------------------------------------- framing
class _Run:
    """n records of `stride` bytes from pos, each with the same length varint bytes (`head` of them).
    With a layout, every record also has the first one's layout."""

    __slots__ = ("pos", "stride", "n", "head", "layout", "words")

    def __init__(self, pos: int, stride: int, n: int, head: int, layout: "_Layout | None" = None) -> None:
        self.pos, self.stride, self.n, self.head, self.layout = pos, stride, n, head, layout
        self.words: dict[int, np.ndarray] = {}

    def word(self, arr: np.ndarray, at: int) -> np.ndarray:
        """Bytes at..at+7 of every record as a little-endian uint64 (at + 8 <= stride), copied from
        a strided view (numpy works on a contiguous copy several times faster) and kept."""
        word = self.words.get(at)
        if word is None:
            view = np.ndarray((self.n,), dtype="<u8", buffer=arr, offset=self.pos + at, strides=(self.stride,))
            word = self.words[at] = view.copy()
        return word[:self.n]

    @property
    def end(self) -> int:
        return self.pos + self.n * self.stride

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        starts = self.pos + self.stride * np.arange(self.n, dtype=_I64)
        return starts + self.head, starts + self.stride


class _Framer:
    """Finds successive records (see the module docstring, step 1)."""

    def __init__(self, arr: np.ndarray, buf, end: int, budget: LoopBudget) -> None:
        self.arr = arr
        self.buf = buf
        self.end = end
        self.budget = budget
        self.hop_run = 0
        self.next_hop = HOP_FIRST
        self.window = CHUNK_RECORDS

    def next(self, pos: int, limit: int, index: int) -> "_Run | tuple[np.ndarray, np.ndarray]":
        """The next segment of at most `limit` records from pos: a run, or (body starts, ends)."""
        if self.hop_run:
            n, self.hop_run = min(self.hop_run, limit), 0
            self.budget.spend(n)
            return self._hop(pos, n, index)
        run = self._speculate(pos, min(self.window, limit), index)
        if run.n >= SPECULATE_MIN or run.n >= limit:
            # Equal sizes so far (a run ends where a varint widens): speculate as far next time.
            self.window = CHUNK_RECORDS
            self.next_hop = HOP_FIRST
        else:  # varied sizes: frame one by one for a while, then speculate over a short window
            self.window = WINDOW_FIRST
            self.hop_run = self.next_hop
            self.next_hop = min(self.next_hop * 2, HOP_MAX)
        return run

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

    def _speculate(self, pos: int, limit: int, index: int) -> _Run:
        body, record_end = self._length(pos, index)
        stride = record_end - pos
        m = min(limit, (self.end - pos) // stride)
        layout = _layout(self.buf, pos, record_end)
        if layout is None:  # only the length varints are compared
            lengths = self.arr[pos:pos + m * stride].reshape(m, stride)[:, :body - pos]
            same = (lengths == lengths[0]).all(axis=1)
            return _Run(pos, stride, m if same.all() else int(np.argmin(same)), body - pos)
        run = _Run(pos, stride, m, body - pos, layout)
        differ = None
        for at, mask in layout.words:
            word = run.word(self.arr, at) & np.uint64(mask)
            differ = word != word[0] if differ is None else differ | (word != word[0])
        if differ is not None and differ.any():
            run.n = int(np.argmax(differ))
        return run


class _Layout:
    """A record's layout, read from its bytes. `words` are 8-byte windows [(column, mask)] covering
    its length varint, its timestamp and offset delta varints (continuation bits only) and its key
    length, value length and header count varints: a record of `stride` bytes with the same bytes
    under these masks has the same layout. `ts` and `od` are (column, width) of the two deltas."""

    __slots__ = ("words", "ts", "od", "null_key")

    def __init__(self, words: list[tuple[int, int]], ts: tuple[int, int], od: tuple[int, int],
                 null_key: bool) -> None:
        self.words, self.ts, self.od, self.null_key = words, ts, od, null_key


def _layout(buf, pos: int, end: int) -> _Layout | None:
    """The layout of the record at buf[pos:end]; None when it has headers, a delta of more than 8
    bytes, fewer than 8 bytes or a field that does not fit (the general path then says what is
    wrong)."""
    try:
        _, p = read_varint(buf, pos, end)
        ts_at = p + 1
        _, od_at = read_varlong(buf, ts_at, end)
        _, key_at = read_varint(buf, od_at, end)
        key_length, value_at = read_varint(buf, key_at, end)
        key_end = value_at
        value_at += max(key_length, 0)
        value_length, headers_at = read_varint(buf, value_at, end)
        value_end = headers_at
        headers_at += max(value_length, 0)
        headers, p = read_varint(buf, headers_at, end)
    except ProtocolError:
        return None
    if headers != 0 or p != end or key_length < -1 or value_length < -1 or end - pos < 8 \
            or od_at - ts_at > 8 or key_at - od_at > 8:
        return None
    spans = ((0, ts_at - 1 - pos, 0xFF), (ts_at - pos, key_at - pos, 0x80), (key_at - pos, key_end - pos, 0xFF),
             (value_at - pos, value_end - pos, 0xFF), (headers_at - pos, p - pos, 0xFF))
    return _Layout(_words(end - pos, spans), (ts_at - pos, od_at - ts_at), (od_at - pos, key_at - od_at),
                   key_length < 0)


@functools.lru_cache(maxsize=256)
def _words(stride: int, spans: tuple[tuple[int, int, int], ...]) -> list[tuple[int, int]]:
    """8-byte windows [(column, mask)] covering the columns of `spans` [(start, end, byte mask)] of a
    record of `stride` bytes (a producer's batches repeat a few layouts: cached)."""
    columns = [(c, mask) for start, stop, mask in spans for c in range(start, stop)]
    words = []
    i = 0
    while i < len(columns):
        at = min(columns[i][0], stride - 8)
        mask = 0
        while i < len(columns) and columns[i][0] < at + 8:
            mask |= columns[i][1] << (8 * (columns[i][0] - at))
            i += 1
        words.append((at, mask))
    return words


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
def _check_run(scan: _Scan, run: _Run, index: int) -> bool:
    """Check a run whose records share the first one's layout (see the module docstring, step 2):
    only the two deltas are left to decode. False, having noted nothing, for a run without a layout
    or with offset deltas out of order (the general path then says which)."""
    layout = run.layout
    if layout is None:
        return False
    offset_delta = _unsigned(scan.arr, run, *layout.od)
    if not np.array_equal(offset_delta, np.arange(2 * index, 2 * (index + run.n), 2, dtype=np.uint64)):
        return False  # zig-zag: offset delta i is 2i
    u = _unsigned(scan.arr, run, *layout.ts).view(_I64)
    _note(scan, (u >> 1) ^ -(u & 1), layout.null_key, index)
    return True


def _unsigned(arr: np.ndarray, run: _Run, at: int, width: int) -> np.ndarray:
    """The unsigned varint of `width` bytes (at most 8) at column `at` of every record of the run,
    from a word speculation already read when one covers it."""
    start = next((s for s in run.words if s <= at and at + width <= s + 8), min(at, run.stride - 8))
    word = run.word(arr, start)
    if at > start:
        word = word >> np.uint64(8 * (at - start))
    if width == 1:
        return word & np.uint64(0x7F)
    u = word & np.uint64(0x7F)
    for k in range(1, width):
        u |= (word >> np.uint64(k)) & np.uint64(0x7F << (7 * k))
    return u


def _check_fields(scan: _Scan, starts: np.ndarray, ends: np.ndarray, index: int) -> None:
    arr = scan.arr
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
        p = _headers(scan, p, ends, headers, index)
    if not np.array_equal(p, ends):
        i = int(np.argmax(p != ends))
        raise InvalidRecordError(f"length {int(ends[i] - starts[i])} but its fields take "
                                 f"{int(p[i] - starts[i])}", index + i)
    _note(scan, timestamp_delta, key_length < 0, index)


def _note(scan: _Scan, timestamp_delta: np.ndarray, null_key: "np.ndarray | bool", index: int) -> None:
    """Fold records into the result: their largest timestamp delta and their per-record errors.
    null_key: per record, or one answer for all of them."""
    bounds, result = scan.bounds, scan.result
    top = int(timestamp_delta.max())
    if top > result.max_timestamp_delta:
        result.max_timestamp_delta = top
    keys_bad = bounds.keys_required and bool(null_key.any() if isinstance(null_key, np.ndarray) else null_key)
    times_bad = bounds.checks_timestamps and (top > bounds.high or int(timestamp_delta.min()) < bounds.low)
    if not keys_bad and not times_bad:
        return
    n = len(timestamp_delta)
    if not bounds.keys_required:
        null_key = False
    bad_key = null_key if isinstance(null_key, np.ndarray) else np.full(n, null_key, dtype=bool)
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


def _headers(scan: _Scan, p: np.ndarray, ends: np.ndarray, counts: np.ndarray, index: int) -> np.ndarray:
    """Skip every record's headers; return the positions after them. Header j of all records that
    have a header j is decoded at once, until few records remain (then the plain loop)."""
    arr = scan.arr
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
    scan.budget.spend(int(left.sum()))
    for row, pos, row_end, n in zip(rows.tolist(), at.tolist(), row_ends.tolist(), left.tolist()):
        p[row] = _headers_loop(scan.buf, pos, row_end, n, index + row)
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
