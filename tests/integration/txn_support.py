"""Helpers for the transaction tests: reading a topic to its end with each isolation level, and the
end offsets a read_committed or read_uncommitted reader sees (ListOffsets with an isolation level)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Callable

from .clients import confluent_config

ISOLATION = ("read_committed", "read_uncommitted")


def read_values(bootstrap: str, topic: str, partitions: int, isolation: str, timeout: float = 30.0) -> list[bytes]:
    """Every value of the topic a reader with `isolation` sees, read until each partition's end (the
    last stable offset for read_committed: librdkafka's partition EOF)."""
    return [value for _, _, value in read_records(bootstrap, topic, partitions, isolation, timeout)]


def read_records(bootstrap: str, topic: str, partitions: int, isolation: str,
                 timeout: float = 30.0) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record a reader with `isolation` sees, as `read_values`."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer(confluent_config(bootstrap, **{"group.id": f"reader-{time.monotonic_ns()}",
                                                "isolation.level": isolation, "enable.partition.eof": True,
                                                "enable.auto.commit": False}))
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: list[tuple[int, int, bytes]] = []
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
            out.append((m.partition(), m.offset(), m.value()))
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



def seed_input(bootstrap: str, topic: str, partitions: int, total: int) -> None:
    """`total` records b"record-NNNNN", round-robin over the partitions, written idempotently."""
    from confluent_kafka import Producer
    p = Producer(confluent_config(bootstrap, **{"enable.idempotence": True}))
    for i in range(total):
        p.produce(topic, b"record-%05d" % i, partition=i % partitions)
    assert p.flush(60) == 0


def run_copier_killed(bootstrap: str, target: str, partitions: int, total: int,
                      start_copier: Callable[[], subprocess.Popen], kills: int = 5,
                      commit_between_kills: bool = False) -> int:
    """Start a copier, kill it (SIGKILL to its process group) while one of its transactions holds
    output written since the previous kill, `kills` times; then let a last one finish the `total`
    records. With `commit_between_kills`, each copier first commits output of its own (the last
    stable offset passes the previous kill's high watermark by more than the abort markers the
    restart writes, one a partition), so the kills are spread over the copy instead of all landing
    in its first transaction. Returns how many kills were made."""
    from .clients import wait_until
    made = 0
    progress = 0

    def mid_transaction() -> bool:
        # Output on the broker past the last stable offset: a transaction holds records right now.
        # (The last stable offset first: read later, it could pass a high watermark read earlier.)
        lso = sum(end_offsets(bootstrap, target, partitions, "read_committed"))
        hw = sum(end_offsets(bootstrap, target, partitions, "read_uncommitted"))
        committed = lso > progress + partitions if commit_between_kills else True
        return committed and hw > progress and hw > lso

    while made < kills:
        proc = start_copier()
        try:
            wait_until(lambda: mid_transaction() or proc.poll() is not None, 60, "the copier to make progress")
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace")  # type: ignore[union-attr]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            proc.stdout.close()  # type: ignore[union-attr]
        progress = sum(end_offsets(bootstrap, target, partitions, "read_uncommitted"))
        made += 1
    proc = start_copier()
    try:
        wait_until(lambda: len(read_values(bootstrap, target, partitions, "read_committed")) >= total,
                   120, "the last copier to finish")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]
    return made
