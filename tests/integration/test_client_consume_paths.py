"""Our consumer's per-record path against a real `odradek serve`, on records written by confluent-kafka
and kafka-python: every record once and in order for polls of 1, 7, 500 and 100000 records, across
batch and fetch-response boundaries, in batches of every codec, after seeks, and past transaction
markers (control batches, crafted into the log as a transactional producer's broker would write them,
and read the same way by confluent-kafka and kafka-python).
"""

from __future__ import annotations

import asyncio
import struct
import time

import pytest
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder

from odradek.client import Consumer, TopicPartition, sync

from .clients import (
    CODECS, CONSUMERS, Msg, assert_partition_valid, produce_confluent, produce_kafka_python, sample_messages,
    segment_files,
)

POLLS = [1, 7, 500, 100_000]
COUNT = 1500
SMALL_FETCH = {"max.partition.fetch.bytes": 32768}   # many Fetch responses, each cut inside a batch
PRODUCE = {
    "confluent": lambda b, t, msgs, codec: produce_confluent(b, t, msgs, compression=codec,
                                                             **{"batch.num.messages": 97}),
    "kafka-python": lambda b, t, msgs, codec: produce_kafka_python(b, t, msgs, compression=codec, batch_size=9000),
}


def messages(prefix: str) -> list[Msg]:
    base = int(time.time() * 1000) - 60_000
    return sample_messages(COUNT, base_ts=base, text=False, prefix=prefix)


def expected(msgs: list[Msg], start: int = 0) -> list[tuple]:
    return [(i, m.key, m.value, tuple(m.headers), m.timestamp) for i, m in enumerate(msgs) if i >= start]


def fields(records) -> list[tuple]:
    return [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in records]


async def read(bootstrap: str, topic: str, poll: int, *, start: int = 0, end: int = COUNT, **config) -> list:
    """Records from `start` until the position reaches `end`, `poll` records at most per getmany."""
    tp = TopicPartition(topic, 0)
    async with Consumer({"bootstrap.servers": bootstrap, "max.poll.records": poll, **SMALL_FETCH, **config}) as c:
        c.assign([tp])
        c.seek(tp, start)
        out = []
        deadline = time.monotonic() + 60
        while await c.position(tp) < end:
            assert time.monotonic() < deadline, f"read {len(out)} records, position {await c.position(tp)}"
            got = await c.getmany(timeout_ms=500)
            assert len(got.get(tp, [])) <= poll
            out += got.get(tp, [])
        return out


@pytest.fixture(scope="module")
def topics(broker):
    """(producer, codec) -> (topic, the messages it holds at offsets 0..COUNT-1)."""
    out = {}
    for who, produce in PRODUCE.items():
        for codec in CODECS:
            topic = f"paths-{who}-{codec}"
            msgs = messages(f"{who}-{codec}-")
            acks = produce(broker.bootstrap, topic, msgs, codec)
            assert sorted(a.offset for a in acks) == list(range(COUNT))
            out[who, codec] = (topic, msgs)
    return out


@pytest.mark.parametrize("poll", POLLS)
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("who", PRODUCE)
def test_every_record_once_and_in_order(broker, topics, who, codec, poll):
    topic, msgs = topics[who, codec]
    got = asyncio.run(read(broker.bootstrap, topic, poll))
    assert fields(got) == expected(msgs)
    assert all(r.timestamp_type == 0 and r.topic == topic and r.partition == 0 for r in got)


def runs_of_one_size(n_per_run: int) -> list[Msg]:
    """Records in runs of one key and value size (as a producer of fixed-size records writes them),
    with runs of null keys, null values and empty values, and values ending in zero bytes."""
    base = int(time.time() * 1000) - 60_000
    sizes = [(None, 100), (8, 100), (8, None), (None, 0), (3, 1000), (None, 100)]
    out = []
    for run, (key_size, value_size) in enumerate(sizes):
        for i in range(n_per_run):
            j = run * n_per_run + i
            key = None if key_size is None else (b"%08d" % j)[-key_size:]
            if value_size is None or value_size == 0:
                value = None if value_size is None else b""
            else:
                value = bytes([j % 251]) * (value_size - 2) + b"\0\0"
            out.append(Msg(key, value, (), base + j))
    return out


@pytest.mark.parametrize("poll", [500, 100_000])
def test_records_in_runs_of_one_size(broker, poll):
    """The decoder's gather of values of one size (numpy), on records written by confluent-kafka."""
    topic = f"paths-runs-{poll}"
    msgs = runs_of_one_size(700)
    acks = produce_confluent(broker.bootstrap, topic, msgs, **{"batch.num.messages": 1000})
    assert sorted(a.offset for a in acks) == list(range(len(msgs)))
    got = asyncio.run(read(broker.bootstrap, topic, poll, end=len(msgs), **{"max.partition.fetch.bytes": 1 << 20}))
    assert fields(got) == expected(msgs)


@pytest.mark.parametrize("poll", POLLS)
def test_seek_inside_batches(broker, topics, poll):
    topic, msgs = topics["confluent", "lz4"]

    async def main():
        tp = TopicPartition(topic, 0)
        async with Consumer({"bootstrap.servers": broker.bootstrap, **SMALL_FETCH}) as c:
            c.assign([tp])
            for start, count in ((0, 120), (1001, 50), (7, 300), (COUNT - 3, 3), (450, 1)):
                c.seek(tp, start)
                out = []
                while len(out) < count:
                    out += (await c.getmany(timeout_ms=2000, max_records=min(poll, count - len(out)))).get(tp, [])
                assert fields(out) == expected(msgs, start)[:count], start
                assert await c.position(tp) == start + count
    asyncio.run(main())


def test_columns_sync_facade_and_batches_agree(broker, topics):
    topic, msgs = topics["kafka-python", "zstd"]
    with sync.Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest", **SMALL_FETCH}) as c:
        c.assign([(topic, 0)])
        offsets, values = [], []
        while len(offsets) < COUNT:
            for cols in c.getmany_columns(timeout_ms=1000, max_records=333).values():
                offsets += cols.offsets
                values += cols.values
        assert (offsets, values) == ([i for i, *_ in expected(msgs)], [m.value for m in msgs])
        c.seek((topic, 0), 10)
        records = []
        while len(records) < COUNT - 10:
            records += c.poll(timeout_ms=1000, max_records=77)
        assert fields(records) == expected(msgs, 10)


# ------------------------------------------------------------------------------------------ control batches
V2_HEADER = struct.Struct(">qiiBIhiqqqhii")
COMMIT, ABORT = 1, 0


def crafted_batch(base_offset: int, records: bytes, count: int, *, attributes: int, producer_id: int,
                  timestamp: int, last_offset_delta: int) -> bytes:
    """A v2 batch assembled by hand (seed 004 "Record Batch"), CRC-32C over attributes..end."""
    length = V2_HEADER.size - 12 + len(records)
    head = bytearray(V2_HEADER.pack(base_offset, length, 0, 2, 0, attributes, last_offset_delta, timestamp,
                                    timestamp, producer_id, 0, -1 if attributes & 0x20 else 0, count))
    data = head + records
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    return bytes(data)


def marker(offset: int, producer_id: int, kind: int, timestamp: int) -> bytes:
    """An end-transaction marker: one control record, key (version 0, type), value (version 0,
    coordinator epoch)."""
    key = struct.pack(">hh", 0, kind)
    value = struct.pack(">hi", 0, 5)
    body = b"\x00\x00\x00" + bytes([len(key) * 2]) + key + bytes([len(value) * 2]) + value + b"\x00"
    record = bytes([len(body) * 2]) + body
    return crafted_batch(offset, record, 1, attributes=0x30, producer_id=producer_id, timestamp=timestamp,
                         last_offset_delta=0)


def transactional(base_offset: int, msgs: list[Msg], producer_id: int) -> bytes:
    """Records of a transaction, built by kafka-python, moved to base_offset."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True, producer_id=producer_id,
                                  producer_epoch=0, base_sequence=0, batch_size=1 << 30)
    for i, m in enumerate(msgs):
        assert b.append(i, m.timestamp, m.key, m.value, list(m.headers)) is not None
    data = bytearray(b.build())
    data[0:8] = base_offset.to_bytes(8, "big")
    return bytes(data)


@pytest.mark.parametrize("poll", POLLS)
def test_transaction_markers_are_skipped(broker_factory, poll):
    """The log: 40 plain records, a committed transaction (pid 77) and its COMMIT marker, an aborted one
    (pid 78) and its ABORT marker, 30 plain records, a marker ending the log. Markers are never handed
    out; read_uncommitted hands out both transactions' records, as confluent-kafka and kafka-python do."""
    b = broker_factory(**{"log.segment.bytes": 1 << 20})
    topic = "markers"
    now = int(time.time() * 1000)
    plain = [Msg(b"k%d" % i, b"plain-%d" % i, (), now + i) for i in range(40)]
    produce_confluent(b.bootstrap, topic, plain)
    assert b.stop() == 0
    committed = [Msg(None, b"committed-%d" % i, (("t", b"77"),), now + 100 + i) for i in range(6)]
    aborted = [Msg(b"a", b"aborted-%d" % i, (), now + 200 + i) for i in range(4)]
    tail = [Msg(b"t%d" % i, b"tail-%d" % i, (), now + 300 + i) for i in range(30)]
    crafted = (transactional(40, committed, 77) + marker(46, 77, COMMIT, now + 110)
               + transactional(47, aborted, 78) + marker(51, 78, ABORT, now + 210))
    b.clean_shutdown_marker.unlink()       # recovery re-reads (and checks) what we appended
    with open(segment_files(b.log_dir, topic, 0)[-1], "ab") as f:
        f.write(crafted)
    b.start()
    produce_confluent(b.bootstrap, topic, tail)
    on_disk = assert_partition_valid(b.log_dir, topic, 0)
    assert [x.base_offset for x in on_disk if x.attributes & 0x20] == [46, 51]    # the markers were kept
    assert on_disk[-1].last_offset == 81

    want = [(i, m.key, m.value, tuple(m.headers), m.timestamp) for i, m in enumerate(plain + committed)]
    want += [(47 + i, m.key, m.value, (), m.timestamp) for i, m in enumerate(aborted)]
    want += [(52 + i, m.key, m.value, (), m.timestamp) for i, m in enumerate(tail)]
    got = asyncio.run(read(b.bootstrap, topic, poll, end=82))
    assert fields(got) == want
    for name in ("confluent", "kafka-python"):
        # librdkafka defaults to read_committed; the broker's transaction index (rebuilt by recovery)
        # names pid 78's records aborted, so ask it for read_uncommitted explicitly.
        theirs = CONSUMERS[name](b.bootstrap, topic, **({"isolation.level": "read_uncommitted"}
                                                         if name == "confluent" else {}))
        assert [(r.offset, r.value) for r in theirs] == [(o, v) for o, _, v, _, _ in want], name
    # read_committed: the aborted transaction's records are dropped too, as librdkafka drops them.
    committed_only = [w for w in want if not w[2].startswith(b"aborted-")]
    got = asyncio.run(read(b.bootstrap, topic, poll, end=82, **{"isolation.level": "read_committed"}))
    assert fields(got) == committed_only
    theirs = CONSUMERS["confluent"](b.bootstrap, topic, **{"isolation.level": "read_committed"})
    assert [(r.offset, r.value) for r in theirs] == [(o, v) for o, _, v, _, _ in committed_only]
