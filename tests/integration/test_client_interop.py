"""odradek.client against a real broker, cross-checked by clients written by others.

Our producer -> confluent-kafka and kafka-python consumers; confluent-kafka producer -> our consumer
(per record and per batch); every codec both ways; keys land where librdkafka's murmur2_random puts
them; seek, offsets_for_times, pause/resume, auto.offset.reset; the sync facade.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from odradek.client import (
    Consumer, KafkaError, OffsetOutOfRangeError, Producer, TopicPartition, partition_for_key,
)
from odradek.client import sync

from .clients import (
    CODECS, Msg, consume_confluent, consume_kafka_python, produce_confluent, sample_messages,
)

BROKER_OVERRIDES = {"num.partitions": 6}


def new_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def produce_ours(bootstrap: str, topic: str, msgs, **config):
    async with Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, **config}) as p:
        futs = [await p.send(topic, m.value, m.key, partition=m.partition, timestamp_ms=m.timestamp,
                             headers=list(m.headers) or None) for m in msgs]
        await p.flush(30)
        return [f.result() for f in futs]


async def consume_ours(bootstrap: str, topic: str, partitions=(0,), *, batches: bool = False, **config):
    """Every record from the beginning up to the end offsets, as comparable tuples."""
    async with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest", **config}) as c:
        tps = [TopicPartition(topic, p) for p in partitions]
        c.assign(tps)
        ends = await c.end_offsets(tps)
        out = []
        deadline = time.monotonic() + 30
        async def behind():
            return [tp for tp in tps if await c.position(tp) < ends[tp]]
        while await behind():
            assert time.monotonic() < deadline, "our consumer did not reach the end offsets"
            if batches:
                for b in await c.fetch_batches(timeout_ms=500):
                    out.extend(b.records())
            else:
                out.extend(await c.poll(timeout_ms=500))
        return [(r.partition, r.offset, r.key, r.value, tuple((k, v) for k, v in r.headers),
                 "create" if r.timestamp_type == 0 else "append", r.timestamp) for r in out]


def as_tuples(recs):
    return [(r.partition, r.offset, r.key, r.value, r.headers, r.ts_type, r.ts) for r in recs]


def test_keys_land_where_librdkafka_murmur2_random_puts_them(broker):
    topic = new_topic("murmur")
    keys = [f"user-{i}".encode() for i in range(150)] + [b"", b"\x00\xff", bytes(range(256))]
    acks = produce_confluent(broker.bootstrap, topic, [Msg(k, b"v") for k in keys],
                             partitioner="murmur2_random")
    theirs = {a.msg.key: a.partition for a in acks}
    assert len(set(theirs.values())) == 6, "the topic should have 6 partitions"
    assert {k: partition_for_key(k, 6) for k in keys} == theirs
    ours = run(produce_ours(broker.bootstrap, topic, [Msg(k, b"w") for k in keys]))
    assert {k: md.partition for k, md in zip(keys, ours)} == theirs


def test_our_producer_to_confluent_and_kafka_python(broker):
    topic = new_topic("ours-to-them")
    base = int(time.time() * 1000) - 60_000
    msgs = [Msg(m.key, m.value, m.headers, m.timestamp, 0) for m in sample_messages(120, base_ts=base)]
    mds = run(produce_ours(broker.bootstrap, topic, msgs))
    assert [md.offset for md in mds] == list(range(120))
    expected = [(m.key, m.value, tuple(m.headers), m.timestamp) for m in msgs]
    for consume in (consume_confluent, consume_kafka_python):
        got = consume(broker.bootstrap, topic, [0])
        assert [(r.key, r.value, r.headers, r.ts) for r in got] == expected, consume.__name__
        assert {r.ts_type for r in got} == {"create"}


def test_confluent_producer_to_our_consumer(broker):
    topic = new_topic("them-to-ours")
    base = int(time.time() * 1000) - 60_000
    msgs = [Msg(m.key, m.value, m.headers, m.timestamp, 0) for m in sample_messages(150, base_ts=base)]
    produce_confluent(broker.bootstrap, topic, msgs)
    theirs = as_tuples(consume_confluent(broker.bootstrap, topic, [0]))
    assert len(theirs) == 150
    assert run(consume_ours(broker.bootstrap, topic)) == theirs
    assert run(consume_ours(broker.bootstrap, topic, batches=True)) == theirs


@pytest.mark.parametrize("codec", CODECS)
def test_every_codec_both_ways(broker, codec):
    base = int(time.time() * 1000) - 60_000
    msgs = [Msg(m.key, m.value, m.headers, m.timestamp, 0) for m in sample_messages(60, base_ts=base)]
    expected = [(m.key, m.value, tuple(m.headers), m.timestamp) for m in msgs]
    ours_topic = new_topic(f"ours-{codec}")
    run(produce_ours(broker.bootstrap, ours_topic, msgs, **{"compression.type": codec}))
    got = consume_confluent(broker.bootstrap, ours_topic, [0])
    assert [(r.key, r.value, r.headers, r.ts) for r in got] == expected
    got = consume_kafka_python(broker.bootstrap, ours_topic, [0])
    assert [(r.key, r.value, r.headers, r.ts) for r in got] == expected
    their_topic = new_topic(f"them-{codec}")
    produce_confluent(broker.bootstrap, their_topic, msgs, compression=codec)
    for batches in (False, True):
        got = run(consume_ours(broker.bootstrap, their_topic, batches=batches))
        assert [(k, v, h, ts) for _, _, k, v, h, _, ts in got] == expected


def test_seek_offsets_for_times_pause_resume(broker):
    topic = new_topic("positions")
    base = 1_700_000_000_000
    msgs = [Msg(f"k{i}".encode(), f"v{i}".encode(), (), base + i * 1000, p) for p in (0, 1) for i in range(50)]
    run(produce_ours(broker.bootstrap, topic, msgs, **{"batch.size": 200}))

    async def main():
        async with Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest",
                             "fetch.max.wait.ms": 100}) as c:
            tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
            c.assign([tp0, tp1])
            assert await c.beginning_offsets([tp0, tp1]) == {tp0: 0, tp1: 0}
            assert await c.end_offsets([tp0, tp1]) == {tp0: 50, tp1: 50}
            found = await c.offsets_for_times({tp0: base + 10_500, tp1: base + 99_999_999})
            assert found[tp0].offset == 11 and found[tp0].timestamp == base + 11_000
            assert found[tp1] is None
            c.seek(tp0, 40)
            c.seek(tp1, 45)
            c.pause(tp1)
            assert c.paused() == {tp1}
            got = []
            while len(got) < 10:
                got += await c.poll(timeout_ms=1000)
            await asyncio.sleep(0.3)
            got += await c.poll(timeout_ms=300)
            assert [(r.partition, r.offset) for r in got] == [(0, o) for o in range(40, 50)]
            assert await c.position(tp0) == 50 and await c.position(tp1) == 45
            c.resume(tp1)
            more = []
            while len(more) < 5:
                more += await c.poll(timeout_ms=1000)
            assert [(r.partition, r.offset, r.value) for r in more] == \
                [(1, o, f"v{o}".encode()) for o in range(45, 50)]
            c.seek_to_beginning(tp0)
            assert await c.position(tp0) == 0
            first = await c.poll(timeout_ms=2000)
            assert first[0].offset == 0 and first[0].partition == 0
            c.seek_to_end(tp0)
            assert await c.position(tp0) == 50
            # the batch path starts mid-batch after a seek: records before first_offset are skipped
            c.seek(tp0, 7)
            bs = []
            while not bs:
                bs = await c.fetch_batches(timeout_ms=1000)
            assert bs[0].first_offset == 7 and bs[0].base_offset <= 7
            assert bs[0].records()[0].offset == 7
            assert bytes(bs[0].data[:8]) == bs[0].base_offset.to_bytes(8, "big")
    run(main())


def test_auto_offset_reset(broker):
    topic = new_topic("reset")
    run(produce_ours(broker.bootstrap, topic, [Msg(None, b"x", (), None, 0)] * 5))

    async def main():
        tp = TopicPartition(topic, 0)
        async with Consumer({"bootstrap.servers": broker.bootstrap}) as c:   # latest
            c.assign([tp])
            assert await c.position(tp) == 5
        async with Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest"}) as c:
            c.assign([tp])
            c.seek(tp, 1000)        # out of range -> reset to earliest
            got = await c.poll(timeout_ms=5000)
            assert got and got[0].offset == 0
        async with Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "none"}) as c:
            c.assign([tp])
            c.seek(tp, 1000)
            with pytest.raises(OffsetOutOfRangeError):
                for _ in range(50):
                    await c.poll(timeout_ms=200)
    run(main())


def test_acks_and_idempotence(broker):
    topic = new_topic("acks")
    msgs = [Msg(f"k{i}".encode(), f"v{i}".encode(), (), None, 0) for i in range(100)]
    zero = run(produce_ours(broker.bootstrap, topic, msgs, acks=0))
    assert all(md.offset == -1 for md in zero)
    one = run(produce_ours(broker.bootstrap, topic, msgs, acks=1))
    idem = run(produce_ours(broker.bootstrap, topic, msgs, **{"enable.idempotence": True,
                                                               "batch.size": 300}))
    assert [md.offset for md in idem] == [md.offset + 100 for md in one]
    got = consume_confluent(broker.bootstrap, topic, [0])
    assert [r.value for r in got] == [m.value for m in msgs] * 3


def test_buffer_memory_back_pressure(broker):
    topic = new_topic("backpressure")

    async def main():
        async with Producer({"bootstrap.servers": broker.bootstrap, "buffer.memory": 20_000,
                             "batch.size": 4096, "max.block.ms": 20_000}) as p:
            futs = [await p.send(topic, b"x" * 500, partition=0) for _ in range(400)]
            assert p.acc.used_bytes <= 20_000
            await p.flush(30)
            return [f.result().offset for f in futs]
    assert run(main()) == list(range(400))


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_batches_in_reused_buffers_carry_only_their_own_records(broker, codec):
    """Once a batch's request is answered its buffer serves the next batch: a long batch, then short
    ones written over its bytes, read back by librdkafka and kafka-python. With acks=0 nothing tells
    the producer the bytes left the socket, so no buffer is reused."""
    topic = new_topic(f"reuse-{codec}")
    rounds = [[Msg(None, f"long-{i}-".encode() * 40) for i in range(300)],
              [Msg(b"k", b"short-a"), Msg(None, None)],
              [Msg(None, b"short-b", (("h", b"1"),))],
              [Msg(None, bytes(range(256)) * 4) for _ in range(20)]]

    async def main():
        async with Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 1, "batch.size": 1 << 20,
                             "compression.type": codec}) as p:
            pool = p.acc.buffers
            offset = 0
            for i, msgs in enumerate(rounds):
                futs = [await p.send(topic, m.value, m.key, partition=0, headers=list(m.headers) or None)
                        for m in msgs]
                await p.flush(30)
                assert [f.result().offset for f in futs] == list(range(offset, offset + len(msgs)))
                offset += len(msgs)
                assert len(pool) == 1, f"round {i}: the answered batch's buffer is kept for the next one"
        async with Producer({"bootstrap.servers": broker.bootstrap, "acks": 0}) as p:
            for _ in range(3):
                await p.send(topic, b"unacked", partition=1)
                await p.flush(30)
            assert len(p.acc.buffers) == 0
    run(main())
    expected = [(m.key, m.value, tuple(m.headers)) for msgs in rounds for m in msgs]
    for consume in (consume_confluent, consume_kafka_python):
        got = consume(broker.bootstrap, topic, [0])
        assert [(r.key, r.value, r.headers) for r in got] == expected, consume.__name__
        assert [r.offset for r in got] == list(range(len(expected)))


def test_send_to_missing_partition_fails(broker):
    async def main():
        async with Producer({"bootstrap.servers": broker.bootstrap}) as p:
            with pytest.raises(KafkaError):
                await p.send(new_topic("nopart"), b"x", partition=99)
    run(main())


def test_sync_facade(broker):
    topic = new_topic("sync")
    with sync.Producer({"bootstrap.servers": broker.bootstrap}) as p:
        futs = [p.send(topic, f"v{i}".encode(), partition=2, headers=[("h", b"1")]) for i in range(20)]
        p.flush(30)
        assert [f.result(10).offset for f in futs] == list(range(20))
        assert p.partitions_for(topic) == list(range(6))
    with sync.Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([(topic, 2)])
        got = []
        while len(got) < 20:
            got += c.poll(timeout_ms=1000)
        assert [(r.value, r.headers) for r in got] == [(f"v{i}".encode(), (("h", b"1"),)) for i in range(20)]
        assert c.position((topic, 2)) == 20
        c.seek((topic, 2), 0)
        batches = c.fetch_batches(timeout_ms=2000)
        assert sum(b.records_count for b in batches) == 20


def test_orderly_shutdown(broker):
    """aclose() sends what is buffered (ignoring linger.ms) and ends the owned tasks; a consumer in a
    long poll closes at once."""
    topic = new_topic("shutdown")

    async def main():
        p = await Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 60_000}).start()
        futs = [await p.send(topic, b"x", partition=0) for _ in range(10)]
        sender = p._sender
        await asyncio.wait_for(p.aclose(), 10)
        assert sender.done() and [f.result().offset for f in futs] == list(range(10))
        with pytest.raises(KafkaError):
            await p.send(topic, b"late")
        c = await Consumer({"bootstrap.servers": broker.bootstrap, "fetch.max.wait.ms": 30_000}).start()
        c.assign([TopicPartition(topic, 0)])
        await c.position(TopicPartition(topic, 0))
        await asyncio.sleep(0.2)          # a Fetch is now waiting on the broker
        t0 = time.monotonic()
        await c.aclose()
        assert time.monotonic() - t0 < 2 and c._task.done()
    run(main())
