"""Fetch answers stay bounded, whatever the request: old readers get a multi-MiB partition down-converted
lazily (KIP-283) with the broker's memory flat, a partition named several times is answered once, and
the limits of each version hold (v0-2 hard, v3+ at least one batch).

The readers are kafka-python pinned to old protocol versions (0.9: Fetch v1, magic 0; 0.10: Fetch v2,
magic 1; 0.10.1: Fetch v3) and raw requests encoded and decoded by kafka-python's protocol classes."""

from __future__ import annotations

import os
import threading
import time

import pytest
from kafka.consumer.fetcher import RecordTooLargeError
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.record import MemoryRecords

from .abuse_support import answered_during
from .clients import Msg, RawClient, consume_kafka_python, kafka_python_consumer, produce_confluent

FETCH_MAX_BYTES = 12 * 1024 * 1024
BROKER_OVERRIDES = {"num.partitions": "1", "fetch.max.bytes": str(FETCH_MAX_BYTES),
                    "message.max.bytes": "2000000"}
MIB = 1024 * 1024
NONE, UNSUPPORTED_VERSION = 0, 35


class Raw(RawClient):
    def fetch(self, version: int, topic: str, partitions, *, max_bytes: int = 2**31 - 1, max_wait_ms: int = 0):
        """partitions: [(partition, fetch_offset, partition_max_bytes)]; returns (frame size, response)."""
        parts = [FetchRequest.FetchTopic.FetchPartition(partition=p, fetch_offset=o, partition_max_bytes=n,
                                                        log_start_offset=-1, current_leader_epoch=-1)
                 for p, o, n in partitions]
        req = FetchRequest(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes,
                           isolation_level=0, session_id=0, session_epoch=-1,
                           topics=[FetchRequest.FetchTopic(topic=topic, partitions=parts)], forgotten_topics_data=[])
        frame = self.call_raw(req, version)
        return len(frame), FetchResponse.decode(frame, version=version, header=True)


class RssWatch:
    """The broker's peak RSS while the block runs, sampled every 10 ms."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.base = self.peak = broker.rss_kb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.broker.rss_kb())
            self._stop.wait(0.01)

    def __enter__(self) -> "RssWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.broker.rss_kb())

    @property
    def growth_bytes(self) -> int:
        return (self.peak - self.base) * 1024


def big_messages(n: int, seed: int) -> list[Msg]:
    """Values of 200 B to 40 KB, random (incompressible), each naming its index, 1 ms timestamps apart."""
    base = int(time.time() * 1000) - 3_600_000
    out = []
    for i in range(n):
        size = 200 + (i * 7919 + seed) % 40_000
        out.append(Msg(f"key-{i}".encode(), f"{i}:".encode() + os.urandom(size), (), base + i))
    return out


@pytest.fixture(scope="module")
def big_topic(broker):
    """About 30 MiB in one partition: 1,200 large records in uncompressed batches of up to 1 MB, then
    30,000 small ones in gzip batches (converted to compressed wrapper messages)."""
    big = big_messages(1_200, 1)
    base = big[-1].timestamp + 1
    small = [Msg(f"s{i}".encode(), f"{i}:".encode() + os.urandom(100 + i % 200), (), base + i)
             for i in range(30_000)]
    acks = produce_confluent(broker.bootstrap, "big", big, **{"batch.size": 1_000_000, "linger.ms": 20})
    acks += produce_confluent(broker.bootstrap, "big", small, compression="gzip",
                              **{"batch.size": 1_000_000, "linger.ms": 20})
    msgs = big + small
    assert [a.offset for a in acks] == list(range(len(msgs)))
    assert sum(len(m.value) for m in msgs) > 28 * MIB
    return "big", msgs


@pytest.mark.parametrize("api_version", [(0, 9), (0, 10), (0, 10, 1)], ids=["v1-magic0", "v2-magic1", "v3-magic1"])
def test_old_readers_get_a_multi_mib_partition_down_converted_intact(broker, big_topic, api_version):
    topic, msgs = big_topic
    fetch_bytes = 4 * MIB
    with RssWatch(broker) as rss:
        got = consume_kafka_python(broker.bootstrap, topic, api_version=api_version, timeout=120,
                                   max_partition_fetch_bytes=fetch_bytes, fetch_max_bytes=fetch_bytes)
    assert [(r.offset, r.key, r.value) for r in got] == [(i, m.key, m.value) for i, m in enumerate(msgs)]
    if api_version >= (0, 10):
        assert [r.ts for r in got] == [m.timestamp for m in msgs]
    assert rss.growth_bytes <= 8 * fetch_bytes + 64 * MIB, f"RSS grew by {rss.growth_bytes / MIB:.0f} MiB"


@pytest.mark.parametrize("version", [2, 4, 11])
def test_a_partition_named_four_times_is_answered_once_and_bounded(broker, big_topic, version):
    """Kafka keeps a fetch's partitions in a map: the last entry's position wins, in the first one's place.
    The limits are fetch.max.bytes and partition_max_bytes, not the request's 2 GiB."""
    topic, msgs = big_topic
    raw = Raw(broker.bootstrap)
    try:
        asked = [(0, 0, 2**31 - 1), (0, 5, 2**31 - 1), (0, 9, 2**31 - 1), (0, 100, 2**31 - 1)]
        with RssWatch(broker) as rss:
            size, resp = raw.fetch(version, topic, asked)
    finally:
        raw.close()
    assert [(t.topic, [p.partition_index for p in t.partitions]) for t in resp.responses] == [(topic, [0])]
    part = resp.responses[0].partitions[0]
    assert part.error_code == NONE
    records = list(iter_records(part.records))
    # a v2 batch comes whole; converted, the messages of uncompressed batches start at the offset asked
    # for, as Kafka's RecordsUtil.downConvert makes them
    first = [r.offset for r in records if version < 4 or r.offset >= 100][0]
    assert first == 100 and records[0].offset <= 100 and len(records) > 10
    for r in records:
        assert r.key == msgs[r.offset].key and r.value == msgs[r.offset].value
    assert FETCH_MAX_BYTES // 2 < size <= FETCH_MAX_BYTES + 2 * MIB
    assert rss.growth_bytes <= 64 * MIB, f"RSS grew by {rss.growth_bytes / MIB:.0f} MiB for {size} bytes"


def iter_records(data: bytes):
    """Every whole record of a fetched record set (magic 0, 1 or 2), as kafka-python reads it."""
    records = MemoryRecords(data)
    while (batch := records.next_batch()) is not None:
        yield from batch


def test_the_loop_answers_others_while_a_large_response_is_converted(broker, big_topic):
    """Fetch v2 responses of 12 MiB are converted on the worker pool while they are sent: another
    client's ApiVersions requests are answered while the fetches are still in flight (converted on
    the loop, they were answered only after each response)."""
    topic, _ = big_topic
    raw = Raw(broker.bootstrap)
    try:
        answered = answered_during(broker.host, broker.port,
                                   lambda: [raw.fetch(2, topic, [(0, 0, 2**31 - 1)]) for _ in range(3)])
    finally:
        raw.close()
    assert answered > 0


def test_v0_to_v2_limits_are_hard_and_v3_returns_a_larger_first_batch(broker):
    """A 300 KB batch and max_partition_fetch_bytes of 100 KB: before KIP-74 (0.10.0) kafka-python sees a
    partial message and reports it too large for its fetch size, as against Kafka; from Fetch v3 (0.10.1)
    the batch comes back whole."""
    topic = "one-big-batch"
    value = os.urandom(300_000)
    produce_confluent(broker.bootstrap, topic, [Msg(b"k", value)])
    c = kafka_python_consumer(broker.bootstrap, api_version=(0, 10), max_partition_fetch_bytes=100_000,
                              fetch_max_bytes=100_000)
    try:
        from kafka import TopicPartition
        c.assign([TopicPartition(topic, 0)])
        c.seek_to_beginning()
        deadline = time.monotonic() + 20
        with pytest.raises(RecordTooLargeError):
            while time.monotonic() < deadline:
                c.poll(timeout_ms=200)
    finally:
        c.close()
    got = consume_kafka_python(broker.bootstrap, topic, api_version=(0, 10, 1), max_partition_fetch_bytes=100_000,
                               fetch_max_bytes=100_000)
    assert [r.value for r in got] == [value]


def test_v3_max_bytes_bounds_the_response_across_partitions(broker, admin):
    from confluent_kafka.admin import NewTopic
    topic = "three-parts"
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(20)
    msgs = [Msg(f"k{i}".encode(), os.urandom(50_000), partition=i % 3) for i in range(90)]
    produce_confluent(broker.bootstrap, topic, msgs)
    raw = Raw(broker.bootstrap)
    try:
        size, resp = raw.fetch(3, topic, [(p, 0, 2**31 - 1) for p in range(3)], max_bytes=MIB)
        sizes = [len(p.records or b"") for p in resp.responses[0].partitions]
        assert MIB // 2 < sum(sizes) <= MIB and size <= MIB + 1024, sizes
        # the first partition with data gets one whole batch even past max_bytes (KIP-74)
        size, resp = raw.fetch(3, topic, [(p, 0, 2**31 - 1) for p in range(3)], max_bytes=1)
        records = [list(iter_records(p.records or b"")) for p in resp.responses[0].partitions]
        assert len(records[0]) >= 1 and records[1:] == [[], []]
    finally:
        raw.close()


def test_downconversion_disabled_answers_unsupported_version(broker, admin):
    from confluent_kafka.admin import NewTopic
    topic = "no-downconversion"
    admin.create_topics([NewTopic(topic, 1, 1, config={"message.downconversion.enable": "false"})])[topic].result(20)
    produce_confluent(broker.bootstrap, topic, [Msg(b"k", b"v")])
    raw = Raw(broker.bootstrap)
    try:
        _, old = raw.fetch(2, topic, [(0, 0, MIB)])
        _, new = raw.fetch(4, topic, [(0, 0, MIB)])
    finally:
        raw.close()
    assert old.responses[0].partitions[0].error_code == UNSUPPORTED_VERSION
    assert new.responses[0].partitions[0].error_code == NONE
    assert [r.value for r in iter_records(new.responses[0].partitions[0].records)] == [b"v"]
