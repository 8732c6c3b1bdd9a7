"""Helpers for the transaction tests: reading a topic to its end with each isolation level, and the
end offsets a read_committed or read_uncommitted reader sees (ListOffsets with an isolation level)."""

from __future__ import annotations

import time

from .clients import confluent_config

ISOLATION = ("read_committed", "read_uncommitted")


def read_values(bootstrap: str, topic: str, partitions: int, isolation: str, timeout: float = 30.0) -> list[bytes]:
    """Every value of the topic a reader with `isolation` sees, read until each partition's end (the
    last stable offset for read_committed: librdkafka's partition EOF)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer(confluent_config(bootstrap, **{"group.id": f"reader-{time.monotonic_ns()}",
                                                "isolation.level": isolation, "enable.partition.eof": True,
                                                "enable.auto.commit": False}))
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: list[bytes] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"{topic} not read to its end in {timeout}s ({isolation})"
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                at_end.add(m.partition())
                continue
            at_end.discard(m.partition())
            out.append(m.value())
        return out
    finally:
        c.close()


def end_offsets(bootstrap: str, topic: str, partitions: int, isolation: str) -> list[int]:
    """ListOffsets latest with the isolation level (kafka-python): the last stable offset for
    read_committed, the high watermark for read_uncommitted."""
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, request_timeout_ms=15000)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = c.end_offsets(tps)
        return [ends[tp] for tp in tps]
    finally:
        c.close()

