"""The consumer's per-record read path with fake Fetch responses: every record handed out once and in
order across polls of any size, across batch and response boundaries, through compressed batches of
every codec, past control batches (transaction markers) and aborted transactions, and after seek.

Batches are built by kafka-python (an encoder written by others) except control batches, which no
client builds (they are crafted here with our marker builder, in the layout of seed 004). Responses go
through the consumer's own fetch callback (`_on_fetch`), so positions, epochs and buffering are the
consumer's; only the socket is missing.
"""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from odradek.client.consumer import Consumer
from odradek.client.errors import CorruptRecordError
from odradek.client.fetcher import (
    GC_PAUSE_MIN_RECORDS, MAX_BUFFERED_FETCHES, CompletedFetch, ConsumerRecord, PartitionState, TopicPartition,
    records_of, to_fetched_batch,
)
from odradek.protocol.exceptions import ProtocolError
from odradek.protocol.messages import fetch as fm
from odradek.records import (
    ABORT, COMMIT, GZIP, LZ4, NONE, SNAPPY, ZSTD, EndTransactionMarker, RecordBatchBuilder,
    build_end_txn_marker_batch, iter_batches,
)

TP = TopicPartition("t", 0)
T0 = 1_700_000_000_000
CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]


def batch(base: int, n: int, *, codec: int = NONE, pid: int = -1, txn: bool = False, size: int = 0) -> bytes:
    """n records at offsets base.. with values b"v<offset>" (padded to `size`), built by kafka-python."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=txn, producer_id=pid,
                                  producer_epoch=0 if pid >= 0 else -1, base_sequence=0 if pid >= 0 else -1,
                                  batch_size=1 << 30)
    for i in range(n):
        key = None if i % 3 else b"k%d" % (base + i)
        headers = [("i", b"%d" % i)] if i % 5 == 1 else []
        assert b.append(i, T0 + base + i, key, value(base + i, size), headers) is not None
    data = bytearray(b.build())
    data[0:8] = base.to_bytes(8, "big")
    return bytes(data)


def value(offset: int, size: int = 0) -> bytes:
    v = b"v%d" % offset
    return v + b"." * (size - len(v))


def marker(offset: int, pid: int, kind: int) -> bytes:
    return build_end_txn_marker_batch(EndTransactionMarker(kind, 0), producer_id=pid, producer_epoch=0,
                                      timestamp=5, base_offset=offset)


# ------------------------------------------------------------------------------------------ CompletedFetch
def completed(data: bytes, fetch_offset: int, *, read_committed: bool = False, aborted=()) -> CompletedFetch:
    st = PartitionState(TP)
    st.seek(fetch_offset)
    return CompletedFetch(st, memoryview(data), fetch_offset, 100,
                          [SimpleNamespace(producer_id=p, first_offset=o) for p, o in aborted],
                          read_committed, True)


def drain(cf: CompletedFetch, limit: int) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    position = cf.fetch_offset
    while records := cf.take_records(position, limit):
        assert len(records) <= limit
        out += records
        position = records[-1].offset + 1
    return out


def test_read_committed_skips_aborted_transactions_and_markers():
    data = (batch(0, 2) + batch(2, 2, pid=7, txn=True) + batch(4, 1, pid=8, txn=True)
            + marker(5, 7, ABORT) + marker(6, 8, COMMIT) + batch(7, 2, pid=7, txn=True) + marker(9, 7, COMMIT))
    cf = completed(data, 0, read_committed=True, aborted=[(7, 2)])
    assert [r.offset for r in drain(cf, 3)] == [0, 1, 4, 7, 8]
    assert cf.next_offset == 10          # the position moves past the markers
    cf = completed(data, 0, read_committed=False, aborted=[(7, 2)])
    assert [r.offset for r in drain(cf, 3)] == [0, 1, 2, 3, 4, 7, 8]


def test_fetch_offset_inside_a_batch_and_partial_tail():
    data = batch(0, 5) + batch(5, 5)
    cf = completed(data + data[:30], 3)
    assert [r.offset for r in drain(cf, 2)] == [3, 4, 5, 6, 7, 8, 9]
    assert cf.scan_end() == 10
    cf = completed(data, 3)
    fb = to_fetched_batch(TP, cf.take_batch(3), 3, 10)
    assert (fb.base_offset, fb.first_offset, fb.next_offset, fb.records_count) == (0, 3, 5, 5)
    assert bytes(fb.data) == data[:len(batch(0, 5))]
    assert [r.offset for r in fb.records()] == [3, 4]


def test_records_and_batches_mix_on_one_fetch():
    data = batch(0, 4) + batch(4, 4) + batch(8, 4)
    cf = completed(data, 0)
    assert [r.offset for r in cf.take_records(0, 2)] == [0, 1]
    first = cf.take_batch(2)             # the rest of the chunk, batch by batch, from the position
    assert (first.base_offset, to_fetched_batch(TP, first, 2, 12).first_offset) == (0, 2)
    assert cf.take_batch(4).base_offset == 4
    assert [r.offset for r in cf.take_records(8, 100)] == [8, 9, 10, 11]
    assert cf.take_records(12, 100) == [] and cf.take_batch(12) is None


def test_corrupt_batch_fails_its_crc_when_read():
    data = bytearray(batch(0, 3))
    data[-1] ^= 0xFF
    with pytest.raises(ProtocolError):
        completed(bytes(data), 0).take_records(0, 10)


@pytest.mark.parametrize("limit", [1, 7, 500])
def test_records_before_a_corrupt_batch_then_an_error_until_seek(limit):
    """As Kafka's consumer: what precedes the corrupt batch is handed out, then every poll raises
    CorruptRecordError and the position stays; a seek past the batch goes on."""
    bad = bytearray(batch(40, 10))
    bad[-1] ^= 0xFF
    data = batch(0, 40) + bytes(bad) + batch(50, 10)

    async def main():
        f = FakeFetches()
        f.seek(0)
        f.respond(data, 60)
        got = []
        while len(got) < 40:
            got += await f.poll(limit)
        assert [r.offset for r in got] == list(range(40))
        for _ in range(2):
            with pytest.raises(CorruptRecordError):
                await f.poll(limit)
            assert f.st.position == 40
        f.seek(50)
        got = await read_all(f, [(data, 60)], limit)
        assert [r.offset for r in got] == list(range(50, 60))
    asyncio.run(main())


def test_malformed_records_with_a_good_crc_are_refused_every_time():
    b = RecordBatchBuilder(base_offset=5)
    b.append(None, b"x" * 10, timestamp=T0)
    data = bytearray(b.build())
    data[61] = 0x7F          # record length past the batch; CRC recomputed so only the parser notices
    from crc32c import crc32c
    data[17:21] = crc32c(bytes(data[21:])).to_bytes(4, "big")
    cf = completed(batch(0, 5) + bytes(data), 0)
    for _ in range(2):
        with pytest.raises(ProtocolError):
            cf.take_records(0, 100)


def test_legacy_entries_keep_their_place_between_v2_batches():
    legacy = LegacyRecordBatchBuilder(magic=1, compression_type=GZIP, batch_size=1 << 30)
    for i in range(3):
        legacy.append(i, T0 + 100 + i, None, value(100 + i))
    raw = bytearray(legacy.build())
    raw[0:8] = (102).to_bytes(8, "big")       # a magic 1 wrapper carries its last inner offset
    data = batch(90, 10) + bytes(raw) + batch(103, 5)
    got = drain(completed(data, 90), 4)
    assert [(r.offset, r.value) for r in got] == [(o, value(o)) for o in range(90, 108)]
    assert [r.timestamp_type for r in got] == [0] * 18
    assert got == records_of(TP, next(iter_batches(data)), 90, True) + got[10:]


def test_record_fields_and_repr():
    [r] = drain(completed(batch(0, 2), 1), 10)
    assert r == ConsumerRecord("t", 0, 1, T0 + 1, 0, None, b"v1", (("i", b"1"),))
    assert (r.topic, r.partition, r.offset, r.key, r.headers) == ("t", 0, 1, None, (("i", b"1"),))
    assert "t-0@1" in repr(r)


@pytest.mark.parametrize("enabled", [True, False])
def test_large_polls_leave_the_cyclic_gc_as_they_found_it(enabled):
    """Many records at once are made with the cyclic GC paused; it is on again afterwards (off if the
    application had turned it off), and every record is right."""
    n = GC_PAUSE_MIN_RECORDS + 10
    data = batch(0, n // 2) + batch(n // 2, n - n // 2)
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        records = completed(data, 0).take_records(0, n)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert [r.offset for r in records] == list(range(n))
    assert [r.value for r in records] == [value(i) for i in range(n)]
    assert records[-1] == records_of(TP, list(iter_batches(data))[-1], n - 1, True)[0]


def test_partition_state_epochs_and_prefetch():
    st = PartitionState(TP)
    assert not st.fetchable(0)
    st.seek(5)
    e = st.epoch
    assert st.fetchable(0) and st.position == st.fetch_offset == 5
    st.buffered = MAX_BUFFERED_FETCHES - 1
    assert st.fetchable(0)               # the next response is fetched while one is read
    st.buffered = MAX_BUFFERED_FETCHES
    assert not st.fetchable(0)
    st.buffered = 0
    st.paused = True
    assert not st.fetchable(0)
    st.paused = False
    st.request_reset("earliest")
    assert st.epoch == e + 1 and st.position is None and not st.fetchable(0)


# ------------------------------------------------------------------------------------------ Consumer
class FakeFetches:
    """A started-looking Consumer fed Fetch responses by hand through its fetch callback."""

    def __init__(self, **config) -> None:
        self.c = Consumer({"bootstrap.servers": "fake:9092", **config})
        self.c.assign([TP])
        self.c._wake = asyncio.Event()
        self.c._data = asyncio.Event()
        self.c._task = SimpleNamespace()
        self.c.cluster = SimpleNamespace(request_update=lambda: None)
        self.st = self.c._state(TP)

    def seek(self, offset: int) -> None:
        self.c.seek(TP, offset)

    def respond(self, data: bytes, high_watermark: int, aborted=()) -> None:
        """Answer a Fetch for the partition at its fetch offset with `data`."""
        st = self.st
        assert st.fetchable(0), "the consumer would not fetch now"
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(fm.FetchResponse(error_code=0, responses=[fm.FetchableTopicResponse(
            topic=TP.topic, partitions=[fm.PartitionData(
                partition_index=0, error_code=0, high_watermark=high_watermark,
                last_stable_offset=high_watermark, log_start_offset=0,
                aborted_transactions=[fm.AbortedTransaction(producer_id=p, first_offset=o) for p, o in aborted],
                records=memoryview(data))])]))
        st.in_flight = True
        self.c._on_fetch(fut, 0, [(st, st.epoch, st.fetch_offset)])

    async def poll(self, limit: int) -> list[ConsumerRecord]:
        got = await self.c.getmany(timeout_ms=0, max_records=limit)
        assert set(got) <= {TP}
        return got.get(TP, [])


def responses(codec: int = NONE) -> list[tuple[bytes, int]]:
    """Three responses of several batches each, with control batches between and at the ends."""
    r1 = batch(0, 300, codec=codec) + marker(300, 9, COMMIT) + batch(301, 1, codec=codec) + batch(302, 700, codec=codec)
    r2 = marker(1002, 9, ABORT) + batch(1003, 5, codec=codec) + batch(1008, 992, codec=codec, size=120)
    r3 = batch(2000, 17, codec=codec) + marker(2017, 9, COMMIT)
    return [(r1, 1002), (r2, 2000), (r3, 2018)]


EXPECTED = [o for o in range(2018) if o not in (300, 1002, 2017)]


async def read_all(f: FakeFetches, parts: list[tuple[bytes, int]], limit: int, start: int = 0) -> list:
    """Poll with `limit` until the last response is read, answering each Fetch as the consumer sends it."""
    got: list[ConsumerRecord] = []
    pending = list(parts)
    for _ in range(10_000):
        while pending and f.st.fetchable(0):
            f.respond(*pending.pop(0))
        records = await f.poll(limit)
        assert len(records) <= limit
        got += records
        if records:   # after the last record handed out, at most past the control batches that follow
            assert records[-1].offset < f.st.position <= next((o for o in EXPECTED if o > records[-1].offset), 2018)
        if not pending and not records and not f.c._completed and f.c._current is None:
            return got
    raise AssertionError("did not finish")


@pytest.mark.parametrize("limit", [1, 7, 500, 100_000])
@pytest.mark.parametrize("codec", CODECS)
def test_every_record_once_and_in_order_for_any_poll_size(limit, codec):
    async def main():
        f = FakeFetches(**{"max.poll.records": limit})
        f.seek(0)
        got = await read_all(f, responses(codec), limit)
        assert [r.offset for r in got] == EXPECTED
        assert [r.value for r in got] == [value(o, 120 if 1008 <= o < 2000 else 0) for o in EXPECTED]
        assert [r.key for r in got] == [b"k%d" % o if (o - base(o)) % 3 == 0 else None for o in EXPECTED]
        assert [r.timestamp for r in got] == [T0 + o for o in EXPECTED]
        assert f.st.position == 2018          # past the closing marker
    asyncio.run(main())


def base(offset: int) -> int:
    return max(b for b in (0, 301, 302, 1003, 1008, 2000) if b <= offset)


@pytest.mark.parametrize("limit", [1, 7, 500, 100_000])
def test_seek_drops_what_was_fetched_and_reads_from_the_new_position(limit):
    async def main():
        f = FakeFetches()
        f.seek(0)
        parts = responses()
        f.respond(*parts[0])
        f.respond(*parts[1])                 # prefetched: two responses buffered
        assert not f.st.fetchable(0)
        first = await f.poll(min(limit, 40))
        assert [r.offset for r in first] == list(range(min(limit, 40)))
        f.seek(1500)                         # inside a batch of the second response
        assert f.st.fetchable(0) and f.st.fetch_offset == 1500
        got = await read_all(f, [(parts[1][0], 2000), parts[2]], limit)
        assert [r.offset for r in got] == [o for o in EXPECTED if o >= 1500]
        f.seek(5)                            # back, into the first batch
        got = await read_all(f, parts, limit)
        assert [r.offset for r in got] == [o for o in EXPECTED if o >= 5]
    asyncio.run(main())


def test_read_committed_through_the_consumer():
    async def main():
        f = FakeFetches(**{"isolation.level": "read_committed"})
        f.seek(0)
        data = (batch(0, 2) + batch(2, 3, pid=7, txn=True) + batch(5, 2, pid=8, txn=True) + marker(7, 7, ABORT)
                + marker(8, 8, COMMIT) + batch(9, 2))
        got = await read_all(f, [(data, 11, [(7, 2)])], 2)
        assert [r.offset for r in got] == [0, 1, 5, 6, 9, 10]
    asyncio.run(main())


def test_columns_and_poll_hand_out_the_same():
    async def main():
        f = FakeFetches()
        f.seek(0)
        parts = responses(LZ4)
        f.respond(*parts[0])
        cols = (await f.c.getmany_columns(max_records=650))[TP]
        assert cols.offsets == EXPECTED[:650]
        records = await f.c.poll(max_records=10)
        assert [r.offset for r in records] == EXPECTED[650:660]
        assert f.st.position == EXPECTED[659] + 1
    asyncio.run(main())
