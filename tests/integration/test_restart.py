"""Durability: topics, records and offsets survive a clean stop and start, and every record acknowledged
(acks=1) before a kill -9 in the middle of a steady produce stream is readable after the restart."""

from __future__ import annotations

import threading
import time

from .clients import (
    CONSUMERS, Msg, assert_partition_valid, confluent_config, confluent_consumer, consume_confluent,
    produce_aiokafka, produce_confluent, produce_kafka_python, produce_kcat, sample_messages, segment_files, wait_until,
)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def snapshot(bootstrap: str, topics: dict[str, int]) -> dict:
    """Everything a consumer can see: cluster id, topics with their partition counts, watermarks
    and every record."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    out = {"cluster_id": md.cluster_id,
           "topics": {t: len(md.topics[t].partitions) for t in topics if t in md.topics}}
    from .clients import confluent_consumer
    c = confluent_consumer(bootstrap)
    try:
        out["watermarks"] = {(t, p): c.get_watermark_offsets(TopicPartition(t, p), timeout=10)
                             for t, n in topics.items() for p in range(n)}
    finally:
        c.close()
    out["records"] = {t: consume_confluent(bootstrap, t, range(n)) for t, n in topics.items()}
    return out


def test_everything_survives_stop_and_start(broker_factory):
    b = broker_factory(num_partitions=3)
    base = now_ms() - 60_000
    topics = {"keep-confluent": 3, "keep-kafka-python": 3, "keep-aiokafka": 3, "keep-kcat": 3}
    produce_confluent(b.bootstrap, "keep-confluent", sample_messages(90, base_ts=base, prefix="c"),
                      compression="zstd")
    produce_kafka_python(b.bootstrap, "keep-kafka-python", sample_messages(60, base_ts=base, prefix="k"),
                         compression="gzip")
    produce_aiokafka(b.bootstrap, "keep-aiokafka", sample_messages(60, base_ts=base, prefix="a"),
                     compression="snappy")
    for p in range(3):
        produce_kcat(b.bootstrap, "keep-kcat",
                     [Msg(f"k{p}-{i}".encode(), f"v{p}-{i}".encode(), (("p", str(p).encode()),), partition=p)
                      for i in range(10 + p)])
    before = snapshot(b.bootstrap, topics)
    assert sum(len(r) for r in before["records"].values()) == 90 + 60 + 60 + 33
    assert all(n == 3 for n in before["topics"].values()), before["topics"]

    assert b.stop() == 0
    assert b.clean_shutdown_marker.exists()
    b.start()
    assert not b.clean_shutdown_marker.exists(), "the marker must be removed while the broker runs"
    after = snapshot(b.bootstrap, topics)
    assert after == before

    # Appends continue at the old log end offsets, and every client reads old and new alike.
    acks = produce_confluent(b.bootstrap, "keep-confluent",
                             [Msg(b"new", b"after-restart", (), now_ms(), partition=1)])
    assert acks[0].offset == before["watermarks"][("keep-confluent", 1)][1]
    for name, consume in CONSUMERS.items():
        got = consume(b.bootstrap, "keep-confluent", [1])
        assert [(r.offset, r.key, r.value) for r in got] == \
            [(r.offset, r.key, r.value) for r in before["records"]["keep-confluent"] if r.partition == 1] \
            + [(acks[0].offset, b"new", b"after-restart")], name

    # A topic created with its own configuration keeps it: here LogAppendTime and 2 partitions.
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic("keep-configured", num_partitions=2, replication_factor=1,
                                  config={"message.timestamp.type": "LogAppendTime"})],
                        request_timeout=15)["keep-configured"].result(20)
    produce_confluent(b.bootstrap, "keep-configured", [Msg(b"a", b"1", (), now_ms() - 100_000, partition=1)])
    b.restart()
    t0 = now_ms()
    produce_confluent(b.bootstrap, "keep-configured", [Msg(b"b", b"2", (), now_ms() - 100_000, partition=1)])
    recs = consume_confluent(b.bootstrap, "keep-configured", [0, 1])
    assert [(r.partition, r.offset, r.value, r.ts_type) for r in recs] == \
        [(1, 0, b"1", "append"), (1, 1, b"2", "append")]
    assert recs[1].ts >= t0 - 5
    topics["keep-configured"] = 2

    # Committed consumer-group offsets survive too (the group coordinator's log), clean and unclean.
    from confluent_kafka import TopicPartition
    committed = [TopicPartition("keep-confluent", p, 3 + p) for p in range(3)]
    c = confluent_consumer(b.bootstrap, **{"group.id": "keep-group"})
    try:
        c.commit(offsets=committed, asynchronous=False)
    finally:
        c.close()

    def committed_offsets():
        c = confluent_consumer(b.bootstrap, **{"group.id": "keep-group"})
        try:
            return [(tp.partition, tp.offset) for tp in c.committed(
                [TopicPartition("keep-confluent", p) for p in range(3)], timeout=15)]
        finally:
            c.close()

    assert committed_offsets() == [(0, 3), (1, 4), (2, 5)]
    b.restart()
    assert committed_offsets() == [(0, 3), (1, 4), (2, 5)]
    b.restart(kill=True)
    assert committed_offsets() == [(0, 3), (1, 4), (2, 5)]

    # A few more cycles, clean and unclean, change nothing.
    expected = snapshot(b.bootstrap, topics)
    b.restart()
    b.restart(kill=True)
    b.restart()
    assert snapshot(b.bootstrap, topics) == expected
    for t, n in topics.items():
        for p in range(n):
            assert_partition_valid(b.log_dir, t, p)


class StreamProducer(threading.Thread):
    """Produces unique values as fast as librdkafka takes them, recording every acknowledgement."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        self.topic = topic
        self.producer = Producer(confluent_config(bootstrap, **{
            "acks": 1, "linger.ms": 2, "message.timeout.ms": 60000, "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 300, "retry.backoff.ms": 50, "retry.backoff.max.ms": 300,
            "queue.buffering.max.messages": 20000}))
        self.acked: dict[tuple[int, int], bytes] = {}
        self.errors: list = []
        self.sent = 0
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def _report(self, err, msg) -> None:
        with self.lock:
            if err is not None:
                self.errors.append(err)
            else:
                self.acked[(msg.partition(), msg.offset())] = msg.value()

    @property
    def acked_count(self) -> int:
        with self.lock:
            return len(self.acked)

    def run(self) -> None:
        while not self.stopping.is_set():
            for _ in range(20):
                value = f"stream-{self.sent:08d}-".encode() + b"x" * (self.sent % 1500)
                try:
                    self.producer.produce(self.topic, key=str(self.sent % 17).encode(), value=value,
                                          on_delivery=self._report)
                    self.sent += 1
                except BufferError:
                    break
            self.producer.poll(0.002)
        self.producer.flush(60)


class StreamConsumer(threading.Thread):
    """Reads the partitions from offset 0 for as long as it runs, across the broker's death."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import TopicPartition

        self.consumer = confluent_consumer(bootstrap, **{
            "fetch.wait.max.ms": 100, "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 300})
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self.records: dict[int, list] = {p: [] for p in range(partitions)}
        self.errors: list = []
        self.stopping = threading.Event()

    def run(self) -> None:
        from confluent_kafka import KafkaError

        try:
            while not self.stopping.is_set():
                m = self.consumer.poll(0.05)
                if m is None:
                    continue
                if m.error():
                    if m.error().code() not in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
                        self.errors.append(m.error())
                    continue
                self.records[m.partition()].append((m.offset(), m.value()))
        finally:
            self.consumer.close()

    def count(self) -> int:
        return sum(len(r) for r in self.records.values())


def test_kill_minus_9_during_produce_stream(broker_factory):
    """Segments of 1 MiB roll during the stream, so recovery (from the last checkpointed recovery
    point, here the start) re-validates several segments per partition."""
    b = broker_factory(num_partitions=3, **{"log.segment.bytes": 1048576})
    topic = "stream"
    stream = StreamProducer(b.bootstrap, topic)
    stream.start()
    reader = StreamConsumer(b.bootstrap, topic, 3)
    reader.start()
    try:
        wait_until(lambda: stream.acked_count >= 6000, 60, "6000 acknowledged records")
        b.kill()
        acked_before_kill = stream.acked_count
        b.start()
        # The producer reconnects to the restarted broker and goes on.
        wait_until(lambda: stream.acked_count >= acked_before_kill + 2000, 60,
                   "2000 more acknowledged records after the restart")
    finally:
        stream.stopping.set()
        stream.join(90)
    assert not stream.is_alive()
    assert not stream.errors, stream.errors[:5]
    assert len(stream.acked) == stream.sent, "every record produced was acknowledged in the end"

    got = {(r.partition, r.offset): r.value for r in consume_confluent(b.bootstrap, topic, range(3))}
    missing = [k for k in stream.acked if k not in got]
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:5]}"
    wrong = [k for k, v in stream.acked.items() if got[k] != v]
    assert not wrong, f"{len(wrong)} acknowledged offsets hold other records, e.g. {sorted(wrong)[:5]}"
    # A retried request whose first try was written may duplicate a record; nothing else may be there.
    assert set(got.values()) == set(stream.acked.values())
    assert max(len(segment_files(b.log_dir, topic, p)) for p in range(3)) >= 2
    for p in range(3):
        batches = assert_partition_valid(b.log_dir, topic, p)
        assert batches[-1].last_offset + 1 == max(o for q, o in got if q == p) + 1

    # A consumer that read all along, across the crash, saw every record once, in order, no gaps.
    try:
        wait_until(lambda: reader.count() >= len(got), 30, "the live consumer to catch up")
    finally:
        reader.stopping.set()
        reader.join(30)
    assert not reader.errors, reader.errors[:5]
    for p, recs in reader.records.items():
        assert [o for o, _ in recs] == list(range(len(recs))), f"partition {p}: gaps or repeats"
        assert all(got[(p, o)] == v for o, v in recs)
    assert reader.count() == len(got)

    # After a second crash with nothing in flight, the log tail is still whole.
    b.restart(kill=True)
    again = {(r.partition, r.offset): r.value for r in consume_confluent(b.bootstrap, topic, range(3))}
    assert again == got
