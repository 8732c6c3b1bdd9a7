"""LegacyRecords (Fetch v0-3, KIP-283): converted a chunk at a time while sent, cut or padded to the size
fixed before sending; what it writes is read back by kafka-python's record reader."""

from __future__ import annotations

import asyncio

import pytest
from kafka.record import MemoryRecords

from odradek.records.control import COMMIT, EndTransactionMarker, build_end_txn_marker_batch
from odradek.server import record_slices
from odradek.server.record_slices import LegacyRecords
from odradek.server.workers import inline_pool
from tests.unit.storage.batches import batch
from tests.unit.storage.logutil import open_log


class Transport:
    """Collects what is written; its protocol's `drained` is cleared after every write and set again
    by the next loop turn, so the sender must wait for it between pieces."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.writes = 0
        self.drained = asyncio.Event()
        self.drained.set()

    def get_protocol(self):
        return self

    def write(self, data) -> None:
        self.data += data
        self.writes += 1
        self.drained.clear()
        asyncio.get_running_loop().call_soon(self.drained.set)


def send(records) -> Transport:
    t = Transport()

    async def run():
        await records.send(t, asyncio.get_running_loop(), False)
    asyncio.run(run())
    return t


def messages(data: bytes) -> list:
    out = []
    records = MemoryRecords(bytes(data))
    while (b := records.next_batch()) is not None:
        out.extend(b)
    return out


def legacy(log, fetch_offset: int, max_bytes: int, magic: int = 1):
    slices = log.read(fetch_offset, max_bytes)
    return asyncio.run(LegacyRecords.convert_first(slices, magic, fetch_offset, inline_pool())), slices


def fill(log, count: int, values_per_batch: int, size: int, **kw) -> None:
    for i in range(count):
        raw = batch([bytes([65 + i % 26]) * size] * values_per_batch, base_timestamp=1_000 + i,
                    timestamp_deltas=list(range(values_per_batch)), **kw)
        log.append(bytearray(raw), 0, now_ms=0)


@pytest.mark.parametrize("magic", [0, 1])
def test_converted_stream_is_cut_at_the_size_and_read_as_whole_messages(tmp_path, monkeypatch, magic):
    monkeypatch.setattr(record_slices, "CONVERT_CHUNK_BYTES", 2_000)   # many chunks
    log = open_log(tmp_path, segment_bytes=10**7, index_interval_bytes=500)
    fill(log, 60, 10, 30)                       # small records: legacy messages are larger than v2's
    rec, slices = legacy(log, 7, 10**7, magic)
    stored = sum(s.length for s in slices)
    assert rec.size == stored
    t = send(rec)
    assert len(t.data) == rec.size and t.writes > 10
    got = messages(t.data)
    assert [m.offset for m in got] == list(range(7, 7 + len(got))) and 400 < len(got) < 593
    assert all(m.magic == magic for m in got)


def test_a_short_conversion_is_padded_with_an_overflow_entry(tmp_path):
    """Headers are dropped: the messages are smaller than the batches, the rest is an entry head that
    announces more than there is, which readers skip as a partial message."""
    log = open_log(tmp_path, segment_bytes=10**7)
    for i in range(5):
        raw = bytearray(batch([b"v%d" % i], base_timestamp=1_000 + i))
        log.append(raw, 0, now_ms=0)
    slices = log.read(0, 10**7)
    rec = asyncio.run(LegacyRecords.convert_first(slices, 1, 0, inline_pool()))
    t = send(rec)
    assert len(t.data) == rec.size == sum(s.length for s in slices)
    got = messages(t.data)
    assert [(m.offset, m.value) for m in got] == [(i, b"v%d" % i) for i in range(5)]


def test_the_first_batch_is_whole_even_beyond_the_stored_size(tmp_path):
    log = open_log(tmp_path, segment_bytes=10**7)
    fill(log, 1, 200, 1)                        # 200 one-byte records: 3x larger as v1 messages
    rec, slices = legacy(log, 0, 10**7)
    assert rec.size > sum(s.length for s in slices)
    assert [m.offset for m in messages(send(rec).data)] == list(range(200))


def test_control_batches_convert_to_nothing(tmp_path):
    log = open_log(tmp_path, segment_bytes=10**7)
    marker = build_end_txn_marker_batch(EndTransactionMarker(COMMIT, 7), producer_id=7, producer_epoch=0,
                                        timestamp=1_000)
    log.append_as_follower(bytearray(marker), now_ms=0)
    only_control, _ = legacy(log, 0, 10**7)
    assert only_control is None
    fill(log, 2, 3, 10)
    rec, _ = legacy(log, 0, 10**7)
    assert [m.offset for m in messages(send(rec).data)] == [1, 2, 3, 4, 5, 6]


def test_a_batch_that_fails_mid_response_ends_it_with_padding(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(record_slices, "CONVERT_CHUNK_BYTES", 500)
    log = open_log(tmp_path, segment_bytes=10**7)
    fill(log, 6, 2, 100)
    rec, slices = legacy(log, 0, 10**7)
    # corrupt the fourth batch on disk (its CRC no longer matches) after the response was sized
    s = slices[0]
    data = s.read()
    pos = 0
    for _ in range(3):
        pos += 12 + int.from_bytes(data[pos + 8:pos + 12], "big")
    log.active_segment.file.seek(s.position + pos + 70)
    log.active_segment.file.write(b"\xff")
    t = send(rec)
    assert len(t.data) == rec.size
    assert [m.offset for m in messages(t.data)] == [0, 1, 2, 3, 4, 5]
    assert "down-conversion stopped" in caplog.text


def append_built(log, data: bytes) -> None:
    log.append(bytearray(data), 0, now_ms=0)


def test_a_zstd_batch_is_refused_first_and_ends_the_response_later(tmp_path):
    """Kafka's RecordsUtil.downConvert refuses zstd batches (UNSUPPORTED_COMPRESSION_TYPE): a response
    that starts with one is refused; one after convertible batches ends the conversion there (the rest
    is padding), so the reader gets what came before and then the error from that batch."""
    from odradek.records import GZIP, ZSTD, RecordBatchBuilder
    from odradek.server.record_slices import UnsupportedCompressionForLegacy

    log = open_log(tmp_path, segment_bytes=10**7)
    for codec, n in ((GZIP, 3), (ZSTD, 4), (GZIP, 2)):
        b = RecordBatchBuilder(compression=codec)
        for i in range(n):
            b.append(None, b"%d" % i, timestamp=1_000)
        append_built(log, b.build())
    rec, slices = legacy(log, 0, 10**7)
    t = send(rec)
    assert len(t.data) == rec.size == sum(s.length for s in slices)
    assert [m.offset for m in messages(t.data)] == [0, 1, 2]
    with pytest.raises(UnsupportedCompressionForLegacy):
        legacy(log, 3, 10**7)
    rec, _ = legacy(log, 7, 10**7)
    assert [m.offset for m in messages(send(rec).data)] == [7, 8]


class CountingPool:
    """Runs calls inline; counts them and the largest result."""

    def __init__(self) -> None:
        self.calls = 0
        self.largest = 0

    async def run(self, fn, *args, **kwargs):
        self.calls += 1
        out = fn(*args, **kwargs)
        self.largest = max(self.largest, len(out or b""))
        return out

    def lane(self, name: str):
        return self


@pytest.mark.parametrize("codec_name", ["none", "gzip", "lz4"])
def test_one_large_batch_is_converted_in_bounded_steps_from_the_fetch_offset(tmp_path, monkeypatch, codec_name):
    """One stored batch of 60,000 records: each worker call converts about CONVERT_CHUNK_BYTES (at most a piece more),
    the answer is the stored size (plain messages are larger than the records: the stream is cut
    there), and a fetch from inside the batch starts at its offset."""
    from odradek.records import GZIP, LZ4, NONE, RecordBatchBuilder

    monkeypatch.setattr(record_slices, "CONVERT_CHUNK_BYTES", 16 * 1024)
    log = open_log(tmp_path, segment_bytes=10**8)
    b = RecordBatchBuilder(compression={"none": NONE, "gzip": GZIP, "lz4": LZ4}[codec_name])
    for i in range(60_000):
        b.append(None, b"value-%d" % i, timestamp=1_000 + i)
    append_built(log, b.build())
    for fetch_offset in (0, 31_000):
        pool = CountingPool()
        slices = log.read(fetch_offset, 10**8)
        rec = asyncio.run(LegacyRecords.convert_first(slices, 1, fetch_offset, pool))
        stored = sum(s.length for s in slices)
        assert rec.size == stored
        got = messages(send(rec).data)
        offsets = [m.offset for m in got]
        assert offsets == list(range(fetch_offset, fetch_offset + len(offsets))) and len(offsets) > 1_000
        assert [m.value for m in got[:3]] == [b"value-%d" % o for o in offsets[:3]]
        assert pool.calls > 3 and pool.largest < 2 * 16 * 1024    # a step: what it wants and one piece more


def test_an_answer_makes_at_most_twice_its_size_in_messages(tmp_path):
    """A gzip batch of 100,000 alike records is a small fraction of its messages: the answer (the stored
    size) carries messages of at most CONVERTED_PER_SENT times its size, then padding, and the next
    fetch, from the first offset it lacks, goes on from there."""
    from odradek.records import GZIP, RecordBatchBuilder

    log = open_log(tmp_path, segment_bytes=10**8)
    b = RecordBatchBuilder(compression=GZIP)
    for i in range(100_000):
        b.append(None, b"x" * 20, timestamp=1_000)
    append_built(log, b.build())
    rec, slices = legacy(log, 0, 10**8)
    data = send(rec).data
    assert len(data) == rec.size == sum(s.length for s in slices)
    got = messages(data)
    made = sum(34 + 20 for _ in got)
    # the first piece (made before the size is known) and the piece that passes the limit come on top
    assert 0 < made <= record_slices.CONVERTED_PER_SENT * rec.size + 2 * record_slices.CONVERT_CHUNK_BYTES
    assert [m.offset for m in got] == list(range(len(got))) and len(got) < 100_000
    rec, _ = legacy(log, len(got), 10**8)
    assert messages(send(rec).data)[0].offset == len(got)
