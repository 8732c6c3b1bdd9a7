"""The numpy path of `columns.decode_batches`: every record of the joined records sections decoded at
once, a field at a time (see `columns` for the format, the checks and why). Imported when a consumer
starts or on the first decode of NUMPY_MIN_RECORDS records or more, so that importing the client does
not import numpy.

Record starts: records come in runs of one encoded size, so the next records are guessed to have the
current one's size and the guess is checked for a whole window at once (every byte of each candidate's
length varint must match); where it fails a Python loop follows the lengths for a chunk. Every other
field is decoded for all records at once and checked against its record's end before the next is
read; a varint of up to 3 bytes (nearly all of them) from its record's first three bytes at once, a
longer one a byte at a time. The result keeps the arrays (`ColumnSource`): Python lists are made only
for the columns a caller reads; keys and values in runs of one size are gathered a run at a time, and
`joined_values` copies values of one size at fixed distances (a producer's records of one size) with
one strided copy.
"""

from __future__ import annotations

import numpy as np

from odradek.protocol.exceptions import ProtocolError
from odradek.records.batch import MIN_RECORD_SIZE
from odradek.records.columns import INT64_MIN, RecordColumns, _headers, _Section
from odradek.records.varint import read_uvarint

RUN_MIN = 16               # shortest run of equal-sized records worth checking with numpy
RUN_WINDOW_MAX = 8192
SCAN_CHUNK = 256
SLICE_RUN_MIN = 64         # records in a run of one key or value length (or distance) read at once


class ColumnSource:
    """The arrays of one numpy decode, over the joined buffer `buf`: per record its offset, timestamp,
    and key and value start and length (-1: null)."""

    __slots__ = ("buf", "offsets", "timestamps", "key_start", "key_len", "value_start", "value_len")

    def __init__(self, buf: bytes, offsets, timestamps, key_start, key_len, value_start, value_len) -> None:
        self.buf = buf
        self.offsets = offsets
        self.timestamps = timestamps
        self.key_start = key_start
        self.key_len = key_len
        self.value_start = value_start
        self.value_len = value_len

    def offsets_list(self, lo: int, hi: int) -> list:
        return self.offsets[lo:hi].tolist()

    def timestamps_list(self, lo: int, hi: int) -> list:
        return self.timestamps[lo:hi].tolist()

    def keys_list(self, lo: int, hi: int) -> list:
        return _slices(self.buf, self.key_start[lo:hi], self.key_len[lo:hi])

    def values_list(self, lo: int, hi: int) -> list:
        return _slices(self.buf, self.value_start[lo:hi], self.value_len[lo:hi])

    def last_offset(self, hi: int) -> int:
        return int(self.offsets[hi - 1])

    def joined_values(self, lo: int, hi: int, separator: bytes) -> bytes | None:
        """Values lo..hi-1 each followed by `separator`, when all have one length: one strided copy per
        run of records at one distance from each other (a run changes where a varint before the value
        grows a byte); None for values of several lengths, or too many runs."""
        n = hi - lo
        starts = self.value_start[lo:hi]
        lengths = self.value_len[lo:hi]
        if n < 2:
            return None
        size = int(lengths[0])
        if size < 0 or (lengths != size).any():
            return None
        steps = np.diff(starts)
        cuts = (np.flatnonzero(steps[1:] != steps[:-1]) + 2).tolist()
        if len(cuts) > n // 64:
            return None
        arr = np.frombuffer(self.buf, np.uint8)
        out = np.empty((n, size + len(separator)), np.uint8)
        for a, b in zip([0, *cuts], [*cuts, n]):
            if a >= n:
                break
            first = int(starts[a])
            stride = int(starts[a + 1]) - first if b - a > 1 else size
            out[a:b, :size] = np.lib.stride_tricks.as_strided(arr[first:], shape=(b - a, size), strides=(stride, 1),
                                                              writeable=False)
        out[:, size:] = np.frombuffer(separator, np.uint8)
        return out.tobytes()


def _slices(buf: bytes, start, length) -> list:
    """buf[start:start + length] per record, None where length is -1.

    Records mostly come in runs of one length (a producer's records of one size, keys all null): runs
    of SLICE_RUN_MIN records or more go to `_one_size`, where numpy makes the bytes objects (about half
    the cost of slicing in a Python loop); the records between them take the loop. This runs once a
    poll, on that poll's records (a few hundred): the common cases take few numpy calls."""
    n = len(start)
    if not n:
        return []
    size = int(length[0])
    if (length == size).all():   # one size
        if size <= 0:
            return [None if size < 0 else b""] * n
        return _one_size(buf, start, size)
    bounds = np.flatnonzero(length[1:] != length[:-1]) + 1
    bounds = np.concatenate(([0], bounds, [n]))
    long = np.flatnonzero(np.diff(bounds) >= SLICE_RUN_MIN)
    out: list = []
    at = 0
    for a, b in zip(bounds[long].tolist(), bounds[long + 1].tolist()):
        if at < a:
            out += _sliced(buf, start[at:a], length[at:a])
        size = int(length[a])
        if size < 0:
            out += [None] * (b - a)
        elif size == 0:
            out += [b""] * (b - a)
        else:
            out += _one_size(buf, start[a:b], size)
        at = b
    if at < n:
        out += _sliced(buf, start[at:], length[at:])
    return out


def _sliced(buf: bytes, start, length) -> list:
    """`_slices` one record at a time."""
    s = start.tolist()
    if (length >= 0).all():
        return [buf[a:b] for a, b in zip(s, (start + length).tolist())]
    return [buf[a:a + m] if m >= 0 else None for a, m in zip(s, length.tolist())]


def _one_size(buf: bytes, start, size: int) -> list:
    """buf[s:s + size] for each s of `start` (increasing, size > 0), as bytes made by numpy's tolist.

    Records at one distance from each other (one size, one layout) are read through a strided view of
    buf, so each value is copied once, into its bytes object; a run's distance changes where a varint
    before the value grows a byte. Runs shorter than SLICE_RUN_MIN are gathered into an array first."""
    k = len(start)
    void = np.dtype((np.void, size))
    first = int(start[0])
    stride = int(start[1]) - first if k > 1 else size
    steps = np.diff(start)
    if (steps == stride).all():
        return np.ndarray((k,), void, buffer=buf, offset=first, strides=(stride,)).tolist()
    # records a..b-1 are at one distance from each other when steps a..b-2 are equal
    bounds = np.concatenate(([0], np.flatnonzero(steps[1:] != steps[:-1]) + 2, [k]))
    long = np.flatnonzero(np.diff(bounds) >= SLICE_RUN_MIN)
    out: list = []
    at = 0
    for a, b in zip(bounds[long].tolist(), bounds[long + 1].tolist()):
        if at < a:
            out += _gathered(buf, start[at:a], void)
        first = int(start[a])
        out += np.ndarray((b - a,), void, buffer=buf, offset=first, strides=(int(start[a + 1]) - first,)).tolist()
        at = b
    if at < k:
        out += _gathered(buf, start[at:], void)
    return out


def _gathered(buf: bytes, start, void) -> list:
    """buf[s:s + size] for each s of `start`: item i of the view is buf[i:i + size]; the gather copies."""
    items = np.ndarray((len(buf) - void.itemsize + 1,), void, buffer=buf, strides=(1,))
    return items[start].tolist()


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
                n, after = read_uvarint(buf, pos, len(buf), 5, "record length")
                pos = after + (n >> 1)
    return pos


def _uvarints(arr, pos, max_bytes: int, what: str):
    """Unsigned varints at each position of arr (uint8, padded): (values uint64, sizes int64).

    Varints of up to 3 bytes (lengths below 1 MiB, deltas below 2**20) are decoded for every record
    from its first three bytes at once; the longer ones take `_uvarints_long`."""
    b0 = arr[pos]
    if not (b0 & 0x80).any():
        return b0.astype(np.uint64), np.ones(len(pos), np.int64)
    b0 = b0.astype(np.int64)
    b1 = arr[pos + 1].astype(np.int64)
    b2 = arr[pos + 2].astype(np.int64)
    more0 = b0 >> 7
    more1 = more0 & (b1 >> 7)
    val = (b0 & 0x7F) | (((b1 & 0x7F) << 7) * more0) | (((b2 & 0x7F) << 14) * more1)
    size = 1 + more0 + more1
    longer = np.flatnonzero(more1 & (b2 >> 7))
    val = val.astype(np.uint64)
    if longer.size:
        val[longer], size[longer] = _uvarints_long(arr, pos[longer], max_bytes, what)
    return val, size


def _uvarints_long(arr, pos, max_bytes: int, what: str):
    """`_uvarints` a byte at a time, for every position."""
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
        n, after = read_uvarint(buf, pos, end, 5, "record length")
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


def decode(buf: bytes, sections: list[_Section], total: int, first_offset: int) -> RecordColumns:
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
    source = ColumnSource(buf, offsets, timestamps, key_start, key_len, value_start, value_len)
    return RecordColumns.from_source(source, ts_types, headers)


def _plus(base, delta):
    """base + delta, int64, refusing results outside int64 (nonsense deltas from a broken batch)."""
    out = base + delta
    if len(out) and (((delta > 0) & (out < base)) | ((delta < 0) & (out > base))).any():
        raise ProtocolError("record offset or timestamp outside the 64-bit range")
    return out


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
