"""Arrow rows -> Kafka v2 record batches, per topic-partition, in bulk. Pure: no I/O.

The sink's rows (Spark's Kafka sink columns: topic, key, value, headers, partition) arrive as Arrow
batches. Building records one by one in Python costs microseconds each (profiled: ~4 us through the
client's per-record `send`), so records are assembled for a whole Arrow batch at once:

- every record is five segments, in order: `length | attributes 0 | timestamp_delta 0 | offset_delta |
  key_length` (at most 12 bytes), the key, `value_length`, the value, and the headers (`count` and
  each header). The small segments are encoded with numpy into Arrow *inline* views (up to 12
  bytes live in the view itself); the key and value segments are views into the Arrow input buffers;
  headers are encoded per record in Python, only for records that have them;
- one Arrow `binary_view` -> `binary` cast (C++, memcpy) lays every segment end to end: that is the
  records section of every batch, for all partitions at once (rows are ordered by partition first);
- per batch: the 61-byte header and the CRC-32C (C) over attributes..end, as in `records.builder`.

Partitioning follows the Java client's default partitioner: the `partition` column if set, else
murmur2 of the key (computed here with numpy for all keys of one length at a time; the unit tests
check it against `odradek.client.murmur2`), else one partition per batch for keyless records (sticky,
KIP-480). All records of a batch get the batch's timestamp (CreateTime), as the sink has no timestamp
column.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from odradek.records.crc import crc32c

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size
MAX_RECORDS_PER_BATCH = 1 << 16          # offset deltas stay within 3 varint bytes
MAX_INLINE_RECORD_BYTES = (1 << 20) - 64  # record lengths stay within 3 varint bytes

_M = np.uint32(0x5BD1E995)
_SEED = 0x9747B28C


class EncodeError(ValueError):
    """A row the sink cannot write (null value for a non-tombstone is fine; a null topic is not)."""


# ------------------------------------------------------------------------------------------ murmur2
def murmur2(keys: pa.Array) -> np.ndarray:
    """Kafka's Utils.murmur2 of every (non-null) key of a binary array, as int32 (nulls: 0)."""
    keys = keys.cast(pa.binary())
    n = len(keys)
    out = np.zeros(n, np.uint32)
    if n == 0:
        return out.view(np.int32)
    offsets = np.frombuffer(keys.buffers()[1], np.int32, n + 1, keys.offset * 4)
    data = keys.buffers()[2]
    raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    raw = np.concatenate([raw, np.zeros(8, np.uint8)])
    lens = np.diff(offsets)
    valid = np.asarray(keys.is_valid())
    with np.errstate(over="ignore"):
        for length in np.unique(lens[valid]).tolist():
            rows = np.flatnonzero((lens == length) & valid)
            starts = offsets[rows].astype(np.int64)
            h = np.full(len(rows), (_SEED ^ length) & 0xFFFFFFFF, np.uint32)
            n4 = length >> 2
            for j in range(n4):
                p = starts + 4 * j
                k = (raw[p].astype(np.uint32) | (raw[p + 1].astype(np.uint32) << 8)
                     | (raw[p + 2].astype(np.uint32) << 16) | (raw[p + 3].astype(np.uint32) << 24))
                k = k * _M
                k ^= k >> np.uint32(24)
                k = k * _M
                h = (h * _M) ^ k
            tail = length & 3
            base = starts + (length & ~3)
            if tail == 3:
                h ^= raw[base + 2].astype(np.uint32) << np.uint32(16)
            if tail >= 2:
                h ^= raw[base + 1].astype(np.uint32) << np.uint32(8)
            if tail >= 1:
                h ^= raw[base].astype(np.uint32)
                h = h * _M
            h ^= h >> np.uint32(13)
            h = h * _M
            h ^= h >> np.uint32(15)
            out[rows] = h
    return out.view(np.int32)


def key_partitions(keys: pa.Array, num_partitions: np.ndarray) -> np.ndarray:
    """toPositive(murmur2(key)) % numPartitions per row (num_partitions per row)."""
    h = murmur2(keys).view(np.uint32) & np.uint32(0x7FFFFFFF)
    return (h.astype(np.int64) % np.maximum(num_partitions, 1)).astype(np.int32)


# ------------------------------------------------------------------------------------------ varints
def _zigzag(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.int64)
    return ((v << 1) ^ (v >> 63)).astype(np.uint64)


_VARINT_LIMITS = np.array([1 << b for b in (7, 14, 21, 28, 35, 42, 49, 56, 63)], np.uint64)


def _varint_size(u: np.ndarray) -> np.ndarray:
    size = np.ones(len(u), np.int64)
    top = u.max() if len(u) else 0
    for limit in _VARINT_LIMITS:            # only the sizes that occur: usually one or two passes
        if top < limit:
            break
        size += u >= limit
    return size


def _put_varint(dst: np.ndarray, col: np.ndarray, u: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Write varint u into each row of dst (n, width) at column col; return the column after it."""
    flat = dst.reshape(-1)
    at = np.arange(len(u), dtype=np.int64) * dst.shape[1] + col
    for j in range(int(size.max()) if len(size) else 0):
        byte = ((u >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8)
        more = size > j + 1
        byte[more] |= 0x80
        if j == 0:
            flat[at] = byte
        else:
            live = size > j
            flat[at[live] + j] = byte[live]
    return col + size


# ------------------------------------------------------------------------------------------ batches
@dataclass
class EncodedBatch:
    topic: str
    partition: int
    data: bytes          # a whole v2 batch
    records: int


def _binary_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, pa.Buffer | None]:
    """(start offsets, lengths with -1 for null, data buffer) of a binary array."""
    arr = arr.cast(pa.binary())
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], np.int32, n + 1, arr.offset * 4).astype(np.int64)
    lens = np.diff(offsets)
    if arr.null_count:
        lens = np.where(np.asarray(arr.is_valid()), lens, -1)
    return offsets[:-1], lens, arr.buffers()[2]


_MASKS = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF, 0xFFFFFFFF], np.uint32)


def _words_at(raw: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The little-endian uint32 of raw[p:p+4] per position (zero past the end of raw)."""
    out = np.zeros(len(pos), np.uint32)
    if len(raw) >= 4:
        w = np.ndarray(shape=(len(raw) - 3,), dtype="<u4", buffer=raw, strides=(1,))
        inside = pos < len(raw) - 3
        out[inside] = w[pos[inside]]
        rest = np.flatnonzero(~inside)
    else:
        rest = np.arange(len(pos))
    for i in rest.tolist():
        tail = bytes(raw[int(pos[i]):int(pos[i]) + 4])
        out[i] = int.from_bytes(tail.ljust(4, b"\0"), "little")
    return out


def _ref_views(views: np.ndarray, starts: np.ndarray, lens: np.ndarray, raw: np.ndarray,
               buffer_index: int) -> None:
    """Fill views (n, 4 uint32) for the segments raw[start:start+len] of buffer `buffer_index`."""
    ln = np.maximum(lens, 0)
    views[:, 0] = ln
    has = np.flatnonzero(ln)
    if not has.size:
        return
    s = starts[has]
    n = ln[has]
    views[has, 1] = _words_at(raw, s) & _MASKS[np.minimum(n, 4)]
    short = n <= 12
    if short.any():
        idx = has[short]
        views[idx, 2] = _words_at(raw, s[short] + 4) & _MASKS[np.clip(n[short] - 4, 0, 4)]
        views[idx, 3] = _words_at(raw, s[short] + 8) & _MASKS[np.clip(n[short] - 8, 0, 4)]
    long_ = ~short
    if long_.any():
        views[has[long_], 2] = buffer_index
        views[has[long_], 3] = s[long_]


def _inline_views(views: np.ndarray, data: np.ndarray, lens: np.ndarray) -> None:
    """Inline views from rows of data (n, 12 uint8) holding lens (<= 12) bytes each."""
    views[:, 0] = lens
    views[:, 1:4] = data.view(np.uint32).reshape(len(lens), 3)


def _headers_blob(headers: pa.Array | None, n: int) -> tuple[np.ndarray, np.ndarray, bytes]:
    """Per row (start, length) of its encoded `headers_count | headers` in one blob."""
    if headers is None or headers.null_count == n:
        return np.zeros(n, np.int64), np.ones(n, np.int64), b"\x00"
    parts = [b"\x00"]
    starts = np.zeros(n, np.int64)
    lens = np.ones(n, np.int64)
    at = 1
    for i, row in enumerate(headers.to_pylist()):
        if not row:
            continue
        enc = [_zz(len(row))]
        for h in row:
            k, v = h["key"], h["value"]
            if k is None:
                raise EncodeError("a header key is null")
            kb = k.encode("utf-8", "surrogateescape")
            enc.append(_zz(len(kb)))
            enc.append(kb)
            if v is None:
                enc.append(b"\x01")
            else:
                enc.append(_zz(len(v)))
                enc.append(bytes(v))
        blob = b"".join(enc)
        parts.append(blob)
        starts[i] = at
        lens[i] = len(blob)
        at += len(blob)
    return starts, lens, b"".join(parts)


def _zz(n: int) -> bytes:
    u = (n << 1) ^ (n >> 63)
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def _runs(starts: np.ndarray, n: int) -> np.ndarray:
    """Index of each row within its run (runs start at `starts`)."""
    return np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))


def _plan(tcode, part, key_l, val_l, hdr_l, batch_size: int):
    """Cut rows (ordered by topic-partition) into batches: (first row of each batch, record body
    sizes, offset deltas as zig-zag)."""
    n = len(tcode)
    group_start = np.flatnonzero(np.r_[True, (tcode[1:] != tcode[:-1]) | (part[1:] != part[:-1])])
    fixed = (2 + _varint_size(_zigzag(key_l)) + np.maximum(key_l, 0) + _varint_size(_zigzag(val_l))
             + np.maximum(val_l, 0) + hdr_l)
    # sizes as if one batch per group (offset deltas only get smaller), cut so that a batch plus its
    # last record still fits batch_size (a broker's message.max.bytes)
    body = fixed + _varint_size(_zigzag(_runs(group_start, n)))
    approx = body + _varint_size(_zigzag(body))
    batch_of = _cut(group_start, approx, n, max(batch_size - HEADER_SIZE - int(approx.max()), 1))
    first = np.flatnonzero(np.r_[True, batch_of[1:] != batch_of[:-1]])
    od_zz = _zigzag(_runs(first, n))
    body = fixed + _varint_size(od_zz)
    if int(body.max()) > MAX_INLINE_RECORD_BYTES:
        raise EncodeError("a record of 1 MiB or more: use the per-record path")
    return first, body, od_zz


def _segment_views(body, od_zz, key_s, key_l, key_buf, val_s, val_l, val_buf, hdr_s, hdr_l, hdr_blob) -> pa.Array:
    """Five binary_view segments per record (see the module's docstring)."""
    n = len(body)
    body_zz, key_zz, val_zz = _zigzag(body), _zigzag(key_l), _zigzag(val_l)
    a = np.zeros((n, 16), np.uint8)              # length | attributes 0 | timestamp delta 0 | offset delta | key length
    col = _put_varint(a, np.zeros(n, np.int64), body_zz, _varint_size(body_zz)) + 2
    col = _put_varint(a, col, od_zz, _varint_size(od_zz))
    col = _put_varint(a, col, key_zz, _varint_size(key_zz))
    c = np.zeros((n, 16), np.uint8)              # value length
    c_len = _put_varint(c, np.zeros(n, np.int64), val_zz, _varint_size(val_zz))
    views = np.zeros((n, 5, 4), np.uint32)
    _inline_views(views[:, 0], a[:, :12].copy(), col)
    _ref_views(views[:, 1], key_s, key_l, _u8(key_buf), 0)
    _inline_views(views[:, 2], c[:, :12].copy(), c_len)
    _ref_views(views[:, 3], val_s, val_l, _u8(val_buf), 1)
    if len(hdr_blob) == 1:                       # no headers: every record ends with count 0
        views[:, 4, 0] = 1
    else:
        _ref_views(views[:, 4], hdr_s, hdr_l, np.frombuffer(hdr_blob, np.uint8), 2)
    empty = pa.py_buffer(b"")
    buffers = [None, pa.py_buffer(views), key_buf or empty, val_buf or empty, pa.py_buffer(hdr_blob)]
    return pa.Array.from_buffers(pa.binary_view(), n * 5, buffers, 0)


def _u8(buf: pa.Buffer | None) -> np.ndarray:
    return np.frombuffer(buf, np.uint8) if buf is not None else np.zeros(0, np.uint8)


def encode(topics: list[str], topic_codes: np.ndarray, partitions: np.ndarray, key: pa.Array,
           value: pa.Array, headers: pa.Array | None, timestamp_ms: int, batch_size: int) -> list[EncodedBatch]:
    """Record batches for rows whose topic is topics[topic_codes[i]] and partition partitions[i];
    each batch holds one topic-partition's rows in their order, at most `batch_size` bytes (or one
    record)."""
    n = len(value)
    if n == 0:
        return []
    order = np.lexsort((np.arange(n), partitions, topic_codes))
    key_s, key_l, key_buf = _binary_parts(key)
    val_s, val_l, val_buf = _binary_parts(value)
    hdr_s, hdr_l, hdr_blob = _headers_blob(headers, n)
    key_s, key_l, val_s, val_l, hdr_s, hdr_l = (x[order] for x in (key_s, key_l, val_s, val_l, hdr_s, hdr_l))
    tcode, part = topic_codes[order], partitions[order]
    first, body, od_zz = _plan(tcode, part, key_l, val_l, hdr_l, batch_size)
    segments = _segment_views(body, od_zz, key_s, key_l, key_buf, val_s, val_l, val_buf, hdr_s, hdr_l, hdr_blob)
    records = memoryview(segments.cast(pa.binary()).buffers()[2])   # every record, end to end
    record_end = np.cumsum(body + _varint_size(_zigzag(body)))
    out = []
    for b_first, b_end in zip(first.tolist(), np.r_[first[1:], n].tolist()):
        lo = int(record_end[b_first - 1]) if b_first else 0
        hi = int(record_end[b_end - 1])
        count = b_end - b_first
        payload = records[lo:hi]
        tail = struct.pack(">hiqqqhii", 0, count - 1, timestamp_ms, timestamp_ms, -1, -1, -1, count)
        crc = crc32c(payload, crc32c(tail))
        head = struct.pack(">qiibI", 0, HEADER_SIZE - 12 + (hi - lo), -1, 2, crc)
        out.append(EncodedBatch(topics[int(tcode[b_first])], int(part[b_first]), b"".join((head, tail, payload)),
                                count))
    return out


def _cut(group_start: np.ndarray, size: np.ndarray, n: int, limit: int) -> np.ndarray:
    """A batch number per row: rows of one group, cut when the running size passes `limit` or the
    batch reaches MAX_RECORDS_PER_BATCH rows."""
    cum = np.cumsum(size)
    group_of = np.repeat(np.arange(len(group_start)), np.diff(np.r_[group_start, n]))
    base = np.r_[0, cum][group_start][group_of]
    within = cum - base                                     # bytes from the group's start, inclusive
    idx = np.arange(n) - group_start[group_of]
    chunk = np.maximum((within - 1) // max(limit, 1), idx // MAX_RECORDS_PER_BATCH)
    # a running cut: a chunk number that never decreases within a group
    chunk = np.maximum.accumulate(chunk + group_of * (n + 1))
    return chunk


def normalize(batch: pa.RecordBatch, topic_option: str | None) -> tuple:
    """(topic per row or None, key, value, headers, partition) from a sink batch, with Spark's checks."""
    names = batch.schema.names
    if "value" not in names:
        raise EncodeError("Required attribute 'value' not found")
    value = _as_binary(batch.column("value"), "value")
    key = _as_binary(batch.column("key"), "key") if "key" in names else pa.nulls(len(value), pa.binary())
    headers = batch.column("headers") if "headers" in names else None
    partition = batch.column("partition") if "partition" in names else None
    if partition is not None and not pa.types.is_integer(partition.type):
        raise EncodeError(f"partition attribute type must be an int, not {partition.type}")
    if topic_option is not None:
        topic = None
    elif "topic" in names:
        topic = batch.column("topic")
        if not (pa.types.is_string(topic.type) or pa.types.is_large_string(topic.type)):
            raise EncodeError(f"Topic type must be a String, not {topic.type}")
        if topic.null_count:
            raise EncodeError("null topic present in the data. Use the topic option for setting a topic.")
    else:
        raise EncodeError("topic option required when no 'topic' attribute is present. Use the topic option "
                          "for setting a topic.")
    return topic, key, value, headers, partition


def _as_binary(col: pa.Array, name: str) -> pa.Array:
    t = col.type
    if pa.types.is_binary(t) or pa.types.is_string(t):
        return col.cast(pa.binary())
    if pa.types.is_large_binary(t) or pa.types.is_large_string(t) or pa.types.is_null(t):
        return col.cast(pa.binary())
    raise EncodeError(f"{name} attribute type must be a string or binary, not {t}")


def topic_codes(topic: pa.Array | None, topic_option: str | None, n: int) -> tuple[list[str], np.ndarray]:
    if topic is None:
        return [topic_option], np.zeros(n, np.int32)
    enc = pc.dictionary_encode(topic)
    return enc.dictionary.to_pylist(), np.asarray(enc.indices.fill_null(0)).astype(np.int32)
