"""Retention by time and by size with small segments: old segments go, the log start offset moves
(ListOffsets earliest, across a restart too), and a consumer positioned behind it is told
OFFSET_OUT_OF_RANGE and follows auto.offset.reset (earliest: the new start; latest: the end)."""

from __future__ import annotations

import asyncio
import os
import time

from .clients import (
    Msg, assert_partition_valid, confluent_config, confluent_consumer, consume_confluent, partition_dir,
    produce_confluent,
    segment_files, wait_until,
)

SEGMENT_BYTES = 1048576          # Kafka's minimum for log.segment.bytes
HOUR_MS = 3_600_000
BROKER_OVERRIDES = {
    "log.segment.bytes": SEGMENT_BYTES,
    "log.retention.ms": HOUR_MS,
    "log.retention.check.interval.ms": 500,
    "log.segment.delete.delay.ms": 200,
}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def fill(bootstrap: str, topic: str, megabytes: float, ts: int | None) -> int:
    """About `megabytes` of 10 KB records; returns how many."""
    n = int(megabytes * 1024 * 1024 / 10_000)
    msgs = [Msg(f"k{i}".encode(), (f"{i:08d}" * 1250).encode(), (), None if ts is None else ts + i)
            for i in range(n)]
    acks = produce_confluent(bootstrap, topic, msgs, **{"linger.ms": 20})
    assert sorted(a.offset for a in acks) == list(range(n))
    return n


def watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    from confluent_kafka import TopicPartition

    c = confluent_consumer(bootstrap)
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        c.close()


def first_offset_after_reset(bootstrap: str, topic: str, reset: str, offset: int, keep_producing: bool = False) -> int:
    """Assign a confluent consumer at `offset` with auto.offset.reset=`reset`; the first offset it gets.
    With keep_producing, a record is produced every 0.3 s until one arrives (a consumer reset to the
    end sees only records written after its reset, whenever that happened)."""
    from confluent_kafka import Producer, TopicPartition

    c = confluent_consumer(bootstrap, **{"auto.offset.reset": reset})
    p = Producer(confluent_config(bootstrap)) if keep_producing else None
    try:
        c.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + 20
        last = 0.0
        while time.monotonic() < deadline:
            if p is not None and time.monotonic() - last > 0.3:
                p.produce(topic, key=b"late", value=b"late", partition=0)
                p.flush(10)
                last = time.monotonic()
            m = c.poll(0.1)
            if m is None:
                continue
            assert not m.error(), m.error()
            return m.offset()
        raise AssertionError(f"no message with auto.offset.reset={reset}")
    finally:
        c.close()
        if p is not None:
            p.flush(10)


def test_retention_by_time(broker):
    old, fresh = "ret-old", "ret-fresh"
    n = fill(broker.bootstrap, old, 3.5, now_ms() - 2 * HOUR_MS)       # older than log.retention.ms
    # One current record last: the active segment is not expired (whether or not the broker would
    # roll an expired active segment, as Kafka does, this one stays).
    produce_confluent(broker.bootstrap, old, [Msg(b"current", b"current", (), now_ms())])
    n += 1
    n_fresh = fill(broker.bootstrap, fresh, 2.5, now_ms())
    assert len(segment_files(broker.log_dir, old, 0)) >= 4

    # Every segment but the active one was old enough: the log now starts where the active one does.
    wait_until(lambda: len(segment_files(broker.log_dir, old, 0)) == 1, 20, "old segments to be removed")
    [active] = segment_files(broker.log_dir, old, 0)
    start = int(os.path.basename(active).split(".")[0])
    assert 0 < start < n
    assert watermarks(broker.bootstrap, old) == (start, n)
    wait_until(lambda: not [f for f in os.listdir(partition_dir(broker.log_dir, old, 0)) if f.endswith(".deleted")],
               10, ".deleted files to go after log.segment.delete.delay.ms")
    assert_partition_valid(broker.log_dir, old, 0)
    # Records with current timestamps are kept.
    assert watermarks(broker.bootstrap, fresh) == (0, n_fresh)
    assert len(segment_files(broker.log_dir, fresh, 0)) >= 3

    # Readers: from the new start everything is there; behind it, the reset policy decides.
    got = consume_confluent(broker.bootstrap, old)
    assert [r.offset for r in got] == list(range(start, n))
    assert first_offset_after_reset(broker.bootstrap, old, "earliest", 0) == start
    assert first_offset_after_reset(broker.bootstrap, old, "earliest", start - 1) == start

    assert first_offset_after_reset(broker.bootstrap, old, "latest", 0, keep_producing=True) >= n
    n = watermarks(broker.bootstrap, old)[1]

    # auto.offset.reset=error: the consumer sees the broker's OFFSET_OUT_OF_RANGE instead of a record.
    from confluent_kafka import KafkaError, TopicPartition
    c = confluent_consumer(broker.bootstrap, **{"auto.offset.reset": "error"})
    try:
        c.assign([TopicPartition(old, 0, 1)])
        deadline = time.monotonic() + 20
        err = None
        while err is None and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None:
                assert m.error(), f"got a record at offset {m.offset()} below the log start offset"
                err = m.error()
        assert err is not None and err.code() == KafkaError._AUTO_OFFSET_RESET, err
        assert "out of range" in err.str().lower(), err.str()
    finally:
        c.close()

    # kafka-python and aiokafka follow their auto_offset_reset too.
    from kafka import KafkaConsumer, TopicPartition as KTP
    for reset, want in (("earliest", start), ("latest", n)):
        kc = KafkaConsumer(bootstrap_servers=broker.bootstrap, auto_offset_reset=reset, enable_auto_commit=False,
                           request_timeout_ms=20000)
        try:
            tp = KTP(old, 0)
            kc.assign([tp])
            kc.seek(tp, 0)
            if reset == "earliest":
                recs = []
                wait_until(lambda: recs.extend(r for b in kc.poll(200).values() for r in b) or recs, 20,
                           "kafka-python to reset and read")
                assert recs[0].offset == want
            else:
                wait_until(lambda: (kc.poll(200), kc.position(tp))[1] == want, 20, "kafka-python to reset to the end")
        finally:
            kc.close()

    from aiokafka import AIOKafkaConsumer, TopicPartition as ATP

    async def aio():
        ac = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                              enable_auto_commit=False, request_timeout_ms=20000)
        await ac.start()
        try:
            tp = ATP(old, 0)
            ac.assign([tp])
            ac.seek(tp, 0)
            m = await asyncio.wait_for(ac.getone(), 20)
            return m.offset
        finally:
            await ac.stop()

    assert asyncio.run(aio()) == start

    # The log start offset survives a restart (log-start-offset-checkpoint), so does the fresh topic.
    broker.restart()
    assert watermarks(broker.bootstrap, old) == (start, n)
    assert watermarks(broker.bootstrap, fresh) == (0, n_fresh)
    broker.restart(kill=True)
    assert watermarks(broker.bootstrap, old) == (start, n)


def test_retention_by_size(broker_factory):
    b = broker_factory(**{"log.segment.bytes": SEGMENT_BYTES, "log.retention.bytes": 2 * SEGMENT_BYTES,
                          "log.retention.check.interval.ms": 500, "log.segment.delete.delay.ms": 0})
    n = fill(b.bootstrap, "ret-size", 5.5, now_ms())

    def settled():
        sizes = [os.path.getsize(f) for f in segment_files(b.log_dir, "ret-size", 0)]
        # Kafka's rule: the oldest segment goes while the log would still hold retention.bytes without it.
        return sum(sizes) - sizes[0] < 2 * SEGMENT_BYTES and sizes
    sizes = wait_until(settled, 20, "retention.bytes to delete the oldest segments")
    start, end = watermarks(b.bootstrap, "ret-size")
    assert end == n and start > 0
    assert sum(sizes) >= 2 * SEGMENT_BYTES   # no more went than the rule allows
    first = int(os.path.basename(segment_files(b.log_dir, "ret-size", 0)[0]).split(".")[0])
    assert start == first
    got = consume_confluent(b.bootstrap, "ret-size")
    assert [r.offset for r in got] == list(range(start, n))
    assert [r.value for r in got] == [(f"{i:08d}" * 1250).encode() for i in range(start, n)]
