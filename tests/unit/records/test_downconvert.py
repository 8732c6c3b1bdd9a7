"""Down-conversion a bounded piece at a time (`downconvert.legacy_pieces`): pieces of one large batch read
the same as the whole conversion (by kafka-python's reader too), start at the fetch offset, stay within
their size, and the memory held while converting a large batch stays a few pieces, not the batch."""

from __future__ import annotations

import tracemalloc

import pytest
from kafka.record import MemoryRecords

from odradek.protocol.exceptions import ProtocolError
from odradek.records import (
    GZIP, LZ4, NONE, SNAPPY, ZSTD, RecordBatch, RecordBatchBuilder, codecs, iter_batches, iter_records,
    v2_to_legacy,
)
from odradek.records import downconvert
from odradek.records.downconvert import legacy_pieces

LEGACY = [NONE, GZIP, SNAPPY, LZ4]
T0 = 1_700_000_000_000


def big_batch(n: int, codec: int, *, base: int = 1_000, gaps: bool = False, log_append_time: int | None = None,
              value_size: int = 3) -> bytes:
    """n records of a few varied sizes (keys every third record, a header every fifth)."""
    b = RecordBatchBuilder(compression=codec, base_offset=base, timestamp_type=1 if log_append_time else 0,
                           log_append_time=log_append_time)
    for i in range(n):
        key = f"k{i}".encode() if i % 3 == 0 else None
        value = (b"%d:" % i) + b"v" * (value_size + i % 7)
        headers = [("h", b"x")] if i % 5 == 0 else []
        b.append(key, value, headers=headers, timestamp=T0 + i, offset=base + (3 * i if gaps else i))
    return b.build()


def fields(data: bytes) -> list[tuple]:
    """(offset, timestamp, key, value) of every message, as kafka-python reads them."""
    out = []
    records = MemoryRecords(bytes(data))
    while (batch := records.next_batch()) is not None:
        out.extend((r.offset, r.timestamp, r.key, r.value) for r in batch)
    return out


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", LEGACY + [ZSTD])
def test_pieces_of_a_large_batch_read_as_the_whole_conversion(codec, magic):
    data = big_batch(5_000, codec)
    whole = v2_to_legacy(data, magic)
    pieces = list(legacy_pieces(RecordBatch(data), magic, piece_bytes=4_000))
    joined = b"".join(pieces)
    assert len([p for p in pieces if p]) > 20
    assert fields(joined) == fields(whole)
    assert [r.offset for r in iter_records(joined)] == list(range(1_000, 6_000))
    for p in pieces:
        entries = list(iter_batches(p))
        if codec in (NONE, ZSTD):      # plain messages: a piece is about piece_bytes
            assert all(e.compression == NONE for e in entries) and len(p) < 4_000 + 200
        else:                          # one wrapper per piece, of the batch's codec
            assert len(entries) <= 1 and all(e.compression == codec for e in entries)
            assert all(len(codecs.decompress(codec, e.value)) < 4_000 + 200 for e in entries)


@pytest.mark.parametrize("gaps", [False, True], ids=["contiguous", "compacted"])
@pytest.mark.parametrize("codec", LEGACY)
def test_pieces_start_at_the_fetch_offset(codec, gaps):
    data = big_batch(3_000, codec, gaps=gaps)
    offsets = [1_000 + (3 * i if gaps else i) for i in range(3_000)]
    for fetch_offset in (0, 1_000, 1_001, 2_222, offsets[-1], offsets[-1] + 1):
        got = b"".join(legacy_pieces(RecordBatch(data), 1, piece_bytes=2_000, min_offset=fetch_offset))
        assert [r.offset for r in iter_records(got)] == [o for o in offsets if o >= fetch_offset]


def test_log_append_time_and_magic_0_timestamps():
    data = big_batch(500, GZIP, log_append_time=T0 + 99)
    v1 = b"".join(legacy_pieces(RecordBatch(data), 1, piece_bytes=1_000))
    assert {ts for _, ts, _, _ in fields(v1)} == {T0 + 99}
    assert all(b.timestamp_type == 1 for b in iter_batches(v1))
    v0 = b"".join(legacy_pieces(RecordBatch(data), 0, piece_bytes=1_000))
    assert {ts for _, ts, _, _ in fields(v0)} == {None}


def test_skipped_records_are_passed_over_in_bounded_stretches(monkeypatch):
    """Records below the fetch offset give b"" after each decompressed chunk and every STEP_RECORDS
    records, so a caller can stop between them. In a contiguous batch they are passed over by their
    lengths (uniform ones many at once, varied ones one by one); in a compacted one, record by record."""
    monkeypatch.setattr(downconvert, "STEP_RECORDS", 100)
    uniform = RecordBatchBuilder(compression=LZ4)
    for i in range(20_000):
        uniform.append(None, b"xy", timestamp=T0)
    cases = [(uniform.build(), range(20_000), 2), (big_batch(20_000, LZ4, base=0), range(20_000), 2),
             (big_batch(20_000, LZ4, base=0, gaps=True), range(0, 60_000, 3), 19_990 // 3 // 100)]
    for data, offsets, ticks in cases:
        pieces = list(legacy_pieces(RecordBatch(data), 1, piece_bytes=10**6, min_offset=19_990))
        assert pieces.count(b"") >= ticks
        assert [r.offset for r in iter_records(b"".join(pieces))] == [o for o in offsets if o >= 19_990]


def test_memory_held_while_converting_a_large_batch_is_a_few_pieces():
    """A gzip batch of 20,000 records (about 20 MB decompressed, as messages too): the conversion
    holds a decompressed piece, a partial record and one piece of messages at a time."""
    b = RecordBatchBuilder(compression=GZIP)
    for i in range(20_000):
        b.append(None, b"%d" % i + b"v" * 1_000, timestamp=T0)
    batch = RecordBatch(b.build())
    assert len(batch.records_bytes()) > 20_000_000
    batch = RecordBatch(bytes(batch.buf))           # a fresh view: nothing decompressed yet
    tracemalloc.start()
    try:
        count = 0
        for piece in legacy_pieces(batch, 1, piece_bytes=128 * 1024):
            count += len(piece)
            del piece
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count > 100_000          # gzip wrappers of 128 KiB of messages each
    assert peak < 3 * 1024 * 1024, f"peak {peak} bytes"


@pytest.mark.parametrize("codec", LEGACY + [ZSTD])
def test_iter_decompress_gives_the_bytes_of_decompress(codec):
    raw = b"".join(b"%08d" % i for i in range(200_000))
    packed = codecs.compress(codec, raw)
    pieces = list(codecs.iter_decompress(codec, packed, piece_bytes=64 * 1024))
    assert b"".join(bytes(p) for p in pieces) == raw
    if codec in (GZIP, NONE, ZSTD):
        assert max(len(p) for p in pieces) <= 64 * 1024 and len(pieces) >= len(raw) // (64 * 1024)
    if codec != NONE:
        with pytest.raises(ProtocolError):
            list(codecs.iter_decompress(codec, packed, piece_bytes=64 * 1024, max_bytes=len(raw) - 1))


@pytest.mark.parametrize("codec", LEGACY)
def test_a_batch_cut_or_miscounted_is_refused(codec):
    b = RecordBatchBuilder(compression=codec)
    for i in range(1_000):
        b.append(None, b"v%d" % i, timestamp=T0)
    good = RecordBatch(b.build())
    body = good.records_bytes()
    for bad_body, count in ((body[:-3], 1_000), (body, 1_001), (body, 999)):
        data = _with_records(good, bytes(bad_body), count, codec)
        with pytest.raises(ProtocolError):
            list(legacy_pieces(RecordBatch(data), 1, piece_bytes=1_000, check_crc=False))


def _with_records(batch: RecordBatch, records: bytes, count: int, codec: int) -> bytes:
    """`batch`'s header over other records (compressed with `codec`) and another count; CRC not redone."""
    head = bytearray(bytes(batch.buf[batch.pos:batch.pos + 61]))
    body = codecs.compress(codec, records)
    head[8:12] = (61 - 12 + len(body)).to_bytes(4, "big")
    head[57:61] = count.to_bytes(4, "big")
    return bytes(head) + body
