"""Kafka v2 record batches -> one Arrow record batch with Spark's Kafka columns. Pure: no I/O.

Input: the raw bytes of whole v2 batches of one partition, in offset order, as the client's batch-level
read path hands them out (`FetchedBatch.data`: control batches and aborted transactions are already
gone). The 61-byte batch header (seed 004, "Message sets", the RecordBatch BNF):

    base_offset int64 | batch_length int32 | partition_leader_epoch int32 | magic int8 | crc uint32 |
    attributes int16 | last_offset_delta int32 | base_timestamp int64 | max_timestamp int64 |
    producer_id int64 | producer_epoch int16 | base_sequence int32 | records_count int32 | records...

and each record: length varint | attributes int8 | timestamp_delta varlong | offset_delta varint |
key_length varint | key | value_length varint | value | headers_count varint | headers.
Varints are zig-zag; a length of -1 is null. With LogAppendTime (attributes bit 3) every record's
timestamp is the batch's max_timestamp, as in Kafka.

How, and why (profiled on 100-byte records): the only sequential step is finding where each record
starts, which needs each record's length; a tight Python loop does just that (one or two byte reads per
record). Every other field is decoded for all records at once with numpy, a varint in a few vectorized
rounds. Keys and values are never copied one by one in Python: an Arrow `binary_view` array points into
the batch bytes and one C++ cast gathers them into the `binary` column Spark expects.

Compressed batches need their records section decompressed first: the caller passes `payloads`, the
decompressed section of each compressed batch (see `kafka`).
"""

from __future__ import annotations

import struct
from itertools import repeat
from typing import Sequence

import numpy as np
import pyarrow as pa

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size            # 61
LOG_APPEND_TIME = 1
_PAD = 32                            # zero bytes after the data, so a varint read never runs off the end


class CorruptBatchError(ValueError):
    """A batch whose records do not add up (the client checked the CRC, so this is a broker bug)."""


def _uvarint(buf, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise CorruptBatchError("varint longer than 10 bytes")


def scan_records(buf, pos: int, count: int, starts: list) -> int:
    """Append where each of `count` records starting at buf[pos] begins; return where the last ends.

    The hot loop of the reader: it only follows record lengths (a length is never negative, so its
    zig-zag value is even and `n >> 1` is the length). `record_starts` checks every length afterwards."""
    sa = starts.append
    for _ in repeat(None, count):
        sa(pos)
        b = buf[pos]
        if b < 0x80:
            pos += 1 + (b >> 1)
        else:
            b1 = buf[pos + 1]
            if b1 < 0x80:
                pos += 2 + (((b & 0x7F) | (b1 << 7)) >> 1)
            else:
                n, pos = _uvarint(buf, pos)
                pos += n >> 1
    return pos


def uvarints(arr: np.ndarray, pos: np.ndarray, strict: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Unsigned varints at each position of arr (uint8, padded): (values uint64, sizes int64).
    Not strict (checking a guess): a varint longer than 10 bytes gets size 11 instead of an error."""
    b = arr[pos]
    val = (b & 0x7F).astype(np.uint64)
    size = np.ones(len(pos), np.int64)
    more = np.flatnonzero(b & 0x80)
    shift = 7
    while more.size:
        if shift > 63:
            if strict:
                raise CorruptBatchError("varint longer than 10 bytes")
            size[more] = 11
            break
        b = arr[pos[more] + size[more]]
        val[more] |= (b & 0x7F).astype(np.uint64) << np.uint64(shift)
        size[more] += 1
        more = more[(b & 0x80) != 0]
        shift += 7
    return val, size


def varints(arr: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zig-zag varints: (values int64, sizes)."""
    u, size = uvarints(arr, pos)
    return (u >> np.uint64(1)).astype(np.int64) ^ -(u & np.uint64(1)).astype(np.int64), size


def words(arr: np.ndarray) -> np.ndarray:
    """w[i] = the little-endian uint32 of arr[i:i+4] (an overlapping, unaligned view; arr is padded)."""
    return np.ndarray(shape=(len(arr) - 3,), dtype="<u4", buffer=arr, strides=(1,))


_BYTE_MASK = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF, 0xFFFFFFFF], np.uint32)


def binary_column(arr: np.ndarray, w: np.ndarray, data: pa.Buffer, starts: np.ndarray,
                  lens: np.ndarray) -> pa.Array:
    """A binary array of arr[start:start+len] per row (len -1: null), through a binary_view array
    whose views point into `data` (arr's memory), cast to binary in one C++ pass.

    A view is 16 bytes: int32 length, then up to 12 inline bytes for a short value (zero padded), or
    a 4-byte prefix, buffer index 0 and the offset into `data` for a longer one (Arrow columnar format)."""
    n = len(starts)
    valid = lens >= 0
    nulls = n - int(np.count_nonzero(valid))
    lens32 = np.maximum(lens, 0).astype(np.int32)
    views = np.zeros((n, 4), np.uint32)
    views[:, 0] = lens32
    has_data = np.flatnonzero(lens32)
    if has_data.size:
        s = starts[has_data]
        ln = lens32[has_data]
        views[has_data, 1] = w[s] & _BYTE_MASK[np.minimum(ln, 4)]
        short = ln <= 12
        if short.any():
            idx = has_data[short]
            ss = s[short]
            ls = ln[short]
            views[idx, 2] = w[ss + 4] & _BYTE_MASK[np.clip(ls - 4, 0, 4)]
            views[idx, 3] = w[ss + 8] & _BYTE_MASK[np.clip(ls - 8, 0, 4)]
        long_ = ~short
        if long_.any():
            views[has_data[long_], 3] = s[long_]
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    view_array = pa.Array.from_buffers(pa.binary_view(), n, [bitmap, pa.py_buffer(views), data], nulls)
    return view_array.cast(pa.binary())


def constant_string(value: str, n: int) -> pa.Array:
    raw = value.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])


RUN_WINDOW_MAX = 8192
RUN_MIN = 16
SCAN_CHUNK = 256


def record_starts(arr: np.ndarray, buf, pos: int, end: int, count: int) -> np.ndarray:
    """Where each of the `count` records of the records section buf[pos:end] begins (unchecked:
    `decode` checks every length against these starts).

    Records come in runs of one encoded size (fixed-size payloads; the offset and timestamp deltas
    change size only at 64, 8192, ...), so: guess that the next records have the size of the current
    one and check the guess for a window of them at once with numpy; take the matching prefix. A short
    run (variable-size records) falls back to the Python loop for a chunk, then guesses again."""
    out = []
    left = count
    window = 64
    while left > 0:
        if pos >= end:
            raise CorruptBatchError(f"{left} records missing at the end of a batch")
        try:
            n, after = _uvarint(buf, pos)
        except IndexError:
            raise CorruptBatchError("record lengths run past the batch") from None
        stride = after - pos + (n >> 1)
        k = min(left, window, max(1, (end - pos) // max(stride, 1)))
        run = 0
        if stride > 0 and k >= RUN_MIN:
            cand = np.arange(k, dtype=np.int64) * stride + pos
            lens, sizes = uvarints(arr, cand, strict=False)
            ok = (lens >> np.uint64(1)).astype(np.int64) + sizes == stride
            run = k if ok.all() else int(np.argmin(ok))
            if run >= RUN_MIN:
                out.append(cand[:run])
                pos += run * stride
                left -= run
                window = min(window * 2, RUN_WINDOW_MAX) if run == k else 64
                continue
        found: list[int] = []
        n = min(left, SCAN_CHUNK)
        try:
            pos = scan_records(buf, pos, n, found)
        except IndexError:
            raise CorruptBatchError("record lengths run past the batch") from None
        out.append(np.array(found, np.int64))
        left -= n
        window = 64
    if pos != end:
        raise CorruptBatchError("record lengths do not fill the batch")
    return np.concatenate(out) if len(out) != 1 else out[0]


def _join(datas: Sequence, payloads: dict | None) -> tuple[bytes, list, dict]:
    """All batches (and decompressed sections) in one buffer: (buf, batch spans, section spans)."""
    pieces = list(datas)
    spans = []
    at = 0
    for d in datas:
        spans.append((at, len(d)))
        at += len(d)
    sections = {}
    for i, section in sorted((payloads or {}).items()):
        pieces.append(section)
        sections[i] = (at, at + len(section))
        at += len(section)
    pieces.append(bytes(_PAD))
    return b"".join(pieces), spans, sections


def _index(buf: bytes, arr: np.ndarray, spans: list, sections: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(where each record's body starts, where it ends, per-batch rows of base_offset,
    base_timestamp, max_timestamp, timestamp_type, count, records end); every length checked."""
    per_batch = []
    starts_list = []
    for i, (pos, size) in enumerate(spans):
        (base_offset, batch_length, _epoch, magic, _crc, attributes, _lod, base_ts, max_ts, _pid, _pe, _seq,
         count) = HEADER.unpack_from(buf, pos)
        if magic != 2:
            raise CorruptBatchError(f"magic {magic}: the client hands out v2 batches only")
        if batch_length + 12 != size:
            raise CorruptBatchError(f"batch length {batch_length} does not match its {size} bytes")
        p, e = sections[i] if attributes & 0x07 else (pos + HEADER_SIZE, pos + size)
        starts_list.append(record_starts(arr, buf, p, e, count))
        per_batch.append((base_offset, base_ts, max_ts, (attributes >> 3) & 1, count, e))
    starts = np.concatenate(starts_list) if starts_list else np.empty(0, np.int64)
    info = np.array(per_batch, np.int64).reshape(-1, 6)
    # each record ends where the next begins, the last of a batch where its records section ends
    lens, size = varints(arr, starts)
    next_start = np.empty_like(starts)
    next_start[:-1] = starts[1:]
    full = info[:, 4] > 0
    next_start[(np.cumsum(info[:, 4]) - 1)[full]] = info[full, 5]
    body = starts + size
    _check(body + lens == next_start)
    return body, next_start, info


def decode(datas: Sequence, start_offset: int, until_offset: int, topic: str, partition: int,
           include_headers: bool, schema: pa.Schema, payloads: dict | None = None) -> pa.RecordBatch:
    """One Arrow batch of the records with start_offset <= offset < until_offset in `datas`
    (raw v2 batches of one partition, in offset order). `payloads[i]`: the decompressed records
    section of datas[i] when that batch is compressed."""
    buf, spans, sections = _join(datas, payloads)
    arr = np.frombuffer(buf, np.uint8)
    body, rec_end, info = _index(buf, arr, spans, sections)
    if not len(body):
        return empty_batch(schema)
    batch_of = np.repeat(np.arange(len(info)), info[:, 4])
    # attributes (1 byte) | timestamp_delta | offset_delta | key_length | key | value_length | value | headers
    p = body + 1
    ts_delta, size = varints(arr, p)
    p += size
    off_delta, size = varints(arr, p)
    p += size
    offsets = info[batch_of, 0] + off_delta
    lo = int(np.searchsorted(offsets, start_offset, "left"))
    hi = int(np.searchsorted(offsets, until_offset, "left"))
    if hi <= lo:
        return empty_batch(schema)
    p, rec_end, offsets, ts_delta, batch_of = p[lo:hi], rec_end[lo:hi], offsets[lo:hi], ts_delta[lo:hi], \
        batch_of[lo:hi]
    _check(p <= rec_end)
    key_len, size = varints(arr, p)
    key_start = p + size
    p = key_start + np.maximum(key_len, 0)
    _check(p <= rec_end)
    value_len, size = varints(arr, p)
    value_start = p + size
    value_end = value_start + np.maximum(value_len, 0)
    _check(value_end <= rec_end)
    ts_type = info[batch_of, 3]
    timestamps = np.where(ts_type == LOG_APPEND_TIME, info[batch_of, 2], info[batch_of, 1] + ts_delta)
    m = hi - lo
    data = pa.py_buffer(buf)
    w = words(arr)
    columns = [
        binary_column(arr, w, data, key_start, key_len),
        binary_column(arr, w, data, value_start, value_len),
        constant_string(topic, m),
        pa.array(np.full(m, partition, np.int32)),
        pa.array(offsets),
        pa.array(timestamps * 1000, pa.timestamp("us", tz="UTC")),
        pa.array(ts_type.astype(np.int32)),
    ]
    if include_headers:
        columns.append(_headers(buf, arr, value_end, rec_end))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _check(ok: np.ndarray) -> None:
    if not ok.all():
        raise CorruptBatchError("a record field runs past the end of its record")


HEADERS_TYPE = pa.list_(pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())])))


def _headers(buf: bytes, arr: np.ndarray, pos: np.ndarray, rec_end: np.ndarray) -> pa.Array:
    """The headers column: array<struct<key string, value binary>>, null for a record without headers
    (as Kafka's source does). Records with headers are parsed one by one."""
    count, size = varints(arr, pos)
    pos = pos + size
    if (count < 0).any():
        raise CorruptBatchError("negative header count")
    list_offsets = np.zeros(len(pos) + 1, np.int32)
    np.cumsum(count, out=list_offsets[1:])
    keys: list = []
    values: list = []
    for i in np.flatnonzero(count).tolist():
        p = int(pos[i])
        end = int(rec_end[i])
        for _ in range(int(count[i])):
            kl, p = _uvarint(buf, p)
            kl = (kl >> 1) ^ -(kl & 1)
            if kl < 0 or p + kl > end:
                raise CorruptBatchError("header key runs past its record")
            keys.append(buf[p:p + kl].decode("utf-8", "surrogateescape"))
            p += kl
            vl, p = _uvarint(buf, p)
            vl = (vl >> 1) ^ -(vl & 1)
            if vl < 0:
                values.append(None)
            else:
                if p + vl > end:
                    raise CorruptBatchError("header value runs past its record")
                values.append(buf[p:p + vl])
                p += vl
    struct_type = HEADERS_TYPE.value_type
    items = pa.StructArray.from_arrays([pa.array(keys, pa.string()), pa.array(values, pa.binary())],
                                       fields=list(struct_type))
    has = count > 0
    nulls = len(has) - int(has.sum())
    bitmap = pa.py_buffer(np.packbits(has, bitorder="little")) if nulls else None
    return pa.ListArray.from_buffers(HEADERS_TYPE, len(has), [bitmap, pa.py_buffer(list_offsets)],
                                     null_count=nulls, children=[items])


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def records_to_batch(records: Sequence, topic: str, partition: int, include_headers: bool,
                     schema: pa.Schema) -> pa.RecordBatch:
    """The slow path, from client records (`ConsumerRecord`): for batches the bulk path cannot read."""
    cols = [
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        constant_string(topic, len(records)),
        pa.array([partition] * len(records), pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([r.timestamp * 1000 for r in records], pa.timestamp("us", tz="UTC")),
        pa.array([r.timestamp_type for r in records], pa.int32()),
    ]
    if include_headers:
        cols.append(pa.array([[{"key": k, "value": v} for k, v in r.headers] if r.headers else None
                              for r in records], HEADERS_TYPE))
    return pa.RecordBatch.from_arrays(cols, schema=schema)
