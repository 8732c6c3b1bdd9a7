"""Workloads driven through confluent-kafka (librdkafka) against any broker.

Every workload returns a plain dict of figures; the broker's CPU time over the
workload is added by the caller.  MB means 10**6 bytes of record values.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

QUIET = {"log_level": 3}  # librdkafka: errors only


class WorkloadError(RuntimeError):
    pass


def new_topic(bootstrap: str, prefix: str, partitions: int) -> str:
    """Create a fresh topic; fall back to broker auto-creation if CreateTopics fails."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    try:
        admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=15)[name].result(20)
        probe = admin
    except Exception:
        # A producer's Metadata request for the topic asks the broker to auto-create it.
        probe = Producer({"bootstrap.servers": bootstrap, "allow.auto.create.topics": True, **QUIET})
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            meta = probe.list_topics(name, timeout=5).topics.get(name)
        except KafkaException:
            meta = None
        if meta is not None and meta.error is None and meta.partitions and all(
            p.leader >= 0 for p in meta.partitions.values()
        ):
            return name
        time.sleep(0.2)
    raise WorkloadError(f"topic {name} not available (CreateTopics and auto-create both failed)")


def delete_topic(bootstrap: str, name: str) -> None:
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
        admin.delete_topics([name], operation_timeout=10)[name].result(15)
    except Exception:
        pass  # best effort: only frees broker memory/disk


def _producer(bootstrap: str, acks: str, **extra) -> Producer:
    conf = {
        "bootstrap.servers": bootstrap,
        "acks": acks,
        "linger.ms": 5,
        "batch.size": 1 << 20,
        "compression.type": "none",
        "enable.idempotence": False,
        "queue.buffering.max.messages": 500_000,
        "queue.buffering.max.kbytes": 512 * 1024,
        "delivery.report.only.error": True,
        **QUIET,
        **extra,
    }
    p = Producer(conf)
    p.list_topics(timeout=10)  # connect before the clock starts
    return p


def _consumer(bootstrap: str, **extra) -> Consumer:
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-{uuid.uuid4().hex[:8]}",  # required by the client; never joined
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        **QUIET,
        **extra,
    }
    c = Consumer(conf)
    c.list_topics(timeout=10)
    return c


def produce(bootstrap: str, topic: str, size: int, acks: str,
            records: int, duration: float | None, timeout: float = 300.0) -> dict:
    """One producer, as fast as it goes; clock stops when every record is acked."""
    errors: list[str] = []

    def on_error(err, _msg):
        if err is not None and len(errors) < 5:
            errors.append(str(err))

    p = _producer(bootstrap, acks, on_delivery=on_error)
    value = os.urandom(size)
    send, poll = p.produce, p.poll
    limit = records if duration is None else 1 << 62
    sent = 0
    start = time.perf_counter()
    stop_at = start + duration if duration is not None else None
    while sent < limit:
        try:
            send(topic, value)
        except BufferError:
            poll(0.001)
            continue
        sent += 1
        if sent & 0x3FF == 0:
            poll(0)
            if stop_at is not None and time.perf_counter() >= stop_at:
                break
    left = p.flush(timeout)
    elapsed = time.perf_counter() - start
    if left:
        raise WorkloadError(f"{left} records unacknowledged after {timeout}s")
    if errors:
        raise WorkloadError(f"delivery failed: {errors[0]}")
    return {"records": sent, "seconds": elapsed, "records_per_s": sent / elapsed,
            "mb_per_s": sent * size / elapsed / 1e6, "mb": sent * size / 1e6}


def consume(bootstrap: str, topic: str, size: int, expected: int, stall: float = 15.0) -> dict:
    """Read ``expected`` records (all of the pre-produced topic) from the beginning
    with assign(); no group commits.  The count comes from the producer, not from
    ListOffsets, which some brokers answer inexactly."""
    c = _consumer(bootstrap, **{"fetch.queue.backoff.ms": 1})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        tps = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts]
        got = 0
        start = last = time.perf_counter()
        c.assign(tps)
        while got < expected:
            # consume() waits for the full count or the timeout: never ask past the end
            batch = c.consume(min(10_000, expected - got), 0.5)
            now = time.perf_counter()
            for m in batch:
                if m.error() is None:
                    got += 1
                else:
                    raise WorkloadError(f"consume error: {m.error()}")
            if batch:
                last = now
            elif now - last > stall:
                raise WorkloadError(f"stalled at {got}/{expected} records")
        elapsed = time.perf_counter() - start
    finally:
        c.close()
    return {"records": got, "seconds": elapsed, "records_per_s": got / elapsed,
            "mb_per_s": got * size / elapsed / 1e6, "mb": got * size / 1e6}


_STAMP = struct.Struct(">q")


def latency(bootstrap: str, topic: str, size: int, rate: int, duration: float,
            warmup: float = 1.0, drain: float = 5.0, linger_ms: int = 1) -> dict:
    """Produce at a steady rate (acks=all, ``linger_ms``); the consumer (default
    fetch.wait.max.ms=500) timestamps arrival.  Samples are records sent after the warm-up."""
    samples: list[int] = []
    received = threading.Event()
    done = threading.Event()
    errors: list[str] = []
    c = _consumer(bootstrap)
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
              for p in c.list_topics(topic, timeout=10).topics[topic].partitions])
    measure_from = [1 << 62]  # monotonic ns; set once warm-up ends

    def reader():
        unpack, clock, poll = _STAMP.unpack_from, time.monotonic_ns, c.poll
        while not done.is_set():
            # poll() returns on the first record; consume(n, t) would wait for n records
            m = poll(0.1)
            if m is not None:
                now = clock()
                if m.error() is not None:
                    errors.append(str(m.error()))
                    continue
                sent_ns = unpack(m.value())[0]
                if sent_ns >= measure_from[0]:
                    samples.append(now - sent_ns)
                received.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    p = _producer(bootstrap, "all", **{"linger.ms": linger_ms})
    pad = os.urandom(size - _STAMP.size)
    sent = measured = 0
    start = time.monotonic()
    phase_end = start + warmup
    warming = True
    try:
        while True:
            now = time.monotonic()
            if warming and now >= phase_end and (received.is_set() or now - start > 30):
                if not received.is_set():
                    raise WorkloadError("no record came back during warm-up")
                warming = False
                measure_from[0] = time.monotonic_ns()
                measured_from_sent = sent
                phase_end = now + duration
            elif not warming and now >= phase_end:
                break
            due = int((now - start) * rate)
            while sent < due:
                p.produce(topic, _STAMP.pack(time.monotonic_ns()) + pad)
                sent += 1
            p.poll(0)
            time.sleep(0.0005)
        measured = sent - measured_from_sent
        if p.flush(30):
            raise WorkloadError("producer could not flush")
        deadline = time.monotonic() + drain
        while len(samples) < measured and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        done.set()
        thread.join(5)
        c.close()
    if errors:
        raise WorkloadError(f"consume error: {errors[0]}")
    if not samples:
        raise WorkloadError("no samples")
    lat = sorted(samples)

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] / 1e6  # ms

    return {"records": sent, "sampled": len(lat), "lost": measured - len(lat),
            "rate": rate, "p50_ms": pct(0.50), "p99_ms": pct(0.99), "p999_ms": pct(0.999),
            "max_ms": lat[-1] / 1e6, "mb": sent * size / 1e6}
