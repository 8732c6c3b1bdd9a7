"""Lying and inflating produce traffic on a real broker: batches whose header does not match their
records (with a correct CRC), timestamps ten years ahead, keyless records on compacted topics, a legacy
gzip wrapper inflating to 1.9 M messages and a 6 KB zstd batch of 8 M records. Each is refused with
Kafka's error code (KIP-467 record errors in Produce v8+), the good partition of the same request is
written and read back by confluent-kafka, kafka-python and aiokafka, the broker's memory stays bounded
and an unrelated client is answered while the broker works on the bombs.

Requests are built with odradek's own encoder (what is tested is the broker's answer); the records
written are read back by the three real clients."""

from __future__ import annotations

import asyncio
import itertools
import struct
import threading
import time

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from odradek.protocol.api import decode_response, encode_request
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.headers import RequestHeader
from odradek.protocol.messages import produce as pr
from odradek.records import GZIP, ZSTD

from ..unit.records.lying_batches import gzip_bomb_wrapper, good_records, rec, v2_batch
from .clients import (
    Msg, api_versions_ok, api_versions_v0, confluent_config, connect, consume_aiokafka, consume_confluent,
    consume_kafka_python, produce_confluent, recv_frame, wait_until,
)

YEAR_MS = 365 * 24 * 3600 * 1000
MIB = 1024 * 1024


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Wire:
    """One connection; requests encoded by odradek's codec, answers decoded by it."""

    def __init__(self, broker) -> None:
        self.sock = connect(broker.host, broker.port, timeout=30)
        self.ids = itertools.count(1)

    def send_produce(self, version: int, partitions: dict[tuple[str, int], bytes], acks: int = -1) -> int:
        topics: dict[str, list] = {}
        for (topic, index), records in partitions.items():
            topics.setdefault(topic, []).append(pr.PartitionProduceData(index=index, records=records))
        body = pr.ProduceRequest(acks=acks, timeout_ms=30000, topic_data=[
            pr.TopicProduceData(name=t, partition_data=p) for t, p in topics.items()])
        cid = next(self.ids)
        w = encode_request(RequestHeader(pr.API_KEY, version, cid, "abuse-test"), body)
        frame = b"".join(bytes(c) for c in w.chunks())
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        return 4 + len(frame)

    def produce_response(self, version: int, timeout: float = 120) -> dict[tuple[str, int], object]:
        frame = recv_frame(self.sock, timeout)
        assert frame is not None, "the broker closed the connection instead of answering"
        _, response = decode_response(pr.API_KEY, version, frame)
        return {(t.name, p.index): p for t in response.responses for p in t.partition_responses}

    def produce(self, version: int, partitions: dict[tuple[str, int], bytes]) -> dict[tuple[str, int], object]:
        self.send_produce(version, partitions)
        return self.produce_response(version)

    def close(self) -> None:
        self.sock.close()


def create_topic(bootstrap: str, name: str, partitions: int = 2, **configs) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(confluent_config(bootstrap))
    futures = admin.create_topics([NewTopic(name, partitions, 1, config={k.replace("_", "."): str(v)
                                                                           for k, v in configs.items()})])
    futures[name].result(30)


def kafka_python_batch(values: list[bytes], ts: int) -> bytes:
    """A good batch, built by kafka-python's own record builder."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    for i, value in enumerate(values):
        b.append(i, ts, b"key-%d" % i, value, [])
    return bytes(b.build())


def high_watermark(bootstrap: str, topic: str, partition: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(confluent_config(bootstrap, **{"group.id": "hw"}))
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
    finally:
        c.close()


def lie(kind: str, now: int) -> tuple[bytes, ErrorCode, list[int]]:
    """A lying batch with a correct CRC, the error Kafka gives it and the record indexes it lists."""
    if kind == "count 5 with 1 record":
        return v2_batch(rec(0), 5, base_timestamp=now), ErrorCode.INVALID_RECORD, []
    if kind == "count 1 with 3 records":
        return v2_batch(good_records(3), 1, base_timestamp=now), ErrorCode.INVALID_RECORD, []
    if kind == "record length past the batch":
        return v2_batch(good_records(4) + rec(4, length=4000), 5, base_timestamp=now), ErrorCode.INVALID_RECORD, []
    if kind == "key length past the record":
        return v2_batch(good_records(4) + rec(4, key_length=90), 5, base_timestamp=now), ErrorCode.INVALID_RECORD, []
    if kind == "timestamp 10 years ahead":
        deltas = [0, 1, 10 * YEAR_MS, 2, 3]
        return (v2_batch(good_records(5, deltas=deltas), 5, base_timestamp=now, max_timestamp=now),
                ErrorCode.INVALID_TIMESTAMP, [2])
    if kind == "keyless records on a compacted topic":
        records = b"".join(rec(i, key=None if i in (1, 3) else b"k") for i in range(5))
        return v2_batch(records, 5, base_timestamp=now), ErrorCode.INVALID_RECORD, [1, 3]
    raise AssertionError(kind)


LIES = ["count 5 with 1 record", "count 1 with 3 records", "record length past the batch",
        "key length past the record", "timestamp 10 years ahead", "keyless records on a compacted topic"]


@pytest.mark.parametrize("version", [8, 9])
@pytest.mark.parametrize("kind", LIES)
def test_a_lying_batch_is_refused_and_the_good_partition_is_written(broker, kind, version):
    topic = f"lie-{LIES.index(kind)}-v{version}"
    compacted = "compacted" in kind
    create_topic(broker.bootstrap, topic, 2, **({"cleanup.policy": "compact"} if compacted else {}))
    now = now_ms()
    values = [b"good %d" % i for i in range(7)]
    bad, code, indexes = lie(kind, now)
    wire = Wire(broker)
    try:
        answer = wire.produce(version, {(topic, 0): kafka_python_batch(values, now), (topic, 1): bad})
    finally:
        wire.close()
    good, refused = answer[(topic, 0)], answer[(topic, 1)]
    assert (good.error_code, good.base_offset, good.record_errors) == (ErrorCode.NONE, 0, [])
    assert refused.error_code == code, refused
    assert [e.batch_index for e in refused.record_errors] == indexes
    assert all(e.batch_index_error_message for e in refused.record_errors)
    assert refused.error_message

    expected = [(b"key-%d" % i, v) for i, v in enumerate(values)]
    for name, consume in (("confluent", consume_confluent), ("kafka-python", consume_kafka_python),
                          ("aiokafka", consume_aiokafka)):
        got = consume(broker.bootstrap, topic, (0, 1))
        assert [(r.partition, r.key, r.value) for r in got] == [(0, k, v) for k, v in expected], name
    assert high_watermark(broker.bootstrap, topic, 1) == 0
    s = connect(broker.host, broker.port)
    try:
        assert api_versions_ok(s, 99)
    finally:
        s.close()


def test_librdkafka_fails_only_the_listed_records(broker):
    topic = "kip467-confluent"
    create_topic(broker.bootstrap, topic, 1, cleanup_policy="compact")
    keyless = {2, 7}
    msgs = [Msg(None if i in keyless else b"k%d" % i, b"v%d" % i, (), None, 0) for i in range(10)]
    # One batch: the records are queued long before linger.ms sends them.
    acks = produce_confluent(broker.bootstrap, topic, msgs, raise_errors=False,
                             **{"linger.ms": 1000, "batch.num.messages": 1000})
    from confluent_kafka import KafkaError

    errors = {a.msg.value: a.error.code() if a.error is not None else None for a in acks}
    assert errors == {m.value: KafkaError.INVALID_RECORD if i in keyless else KafkaError._INVALID_DIFFERENT_RECORD
                      for i, m in enumerate(msgs)}
    assert high_watermark(broker.bootstrap, topic, 0) == 0


def test_kafka_python_fails_the_listed_records_and_aiokafka_the_batch(broker):
    topic = "kip467-python"
    create_topic(broker.bootstrap, topic, 1, cleanup_policy="compact")
    keys = [None if i in (2, 7) else b"k%d" % i for i in range(10)]
    from kafka import KafkaProducer
    from kafka.errors import InvalidRecordError

    p = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=500, retries=0)
    try:
        futures = [p.send(topic, key=k, value=b"v") for k in keys]
        p.flush(30)
    finally:
        p.close(10)
    failures = [f.exception for f in futures]
    assert all(f is not None for f in failures)
    assert [i for i, e in enumerate(failures) if isinstance(e, InvalidRecordError)] == [2, 7]

    async def aiokafka_send() -> list:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=500)
        await producer.start()
        try:
            sent = [await producer.send(topic, key=k, value=b"v") for k in keys]
            return await asyncio.gather(*sent, return_exceptions=True)
        finally:
            await producer.stop()

    outcomes = asyncio.run(aiokafka_send())
    assert all(isinstance(o, Exception) for o in outcomes), outcomes  # it knows no error 87
    assert high_watermark(broker.bootstrap, topic, 0) == 0


def test_big_compressed_batches_from_real_producers_are_checked_off_the_loop_and_stored(broker):
    topic = "big-compressed"
    create_topic(broker.bootstrap, topic, 1)
    msgs = [Msg(b"k%d" % i, b"value %d " % i * 10, (), None, 0) for i in range(30_000)]
    acks = produce_confluent(broker.bootstrap, topic, msgs, compression="zstd",
                             **{"linger.ms": 200, "batch.size": 4 * MIB})
    assert sorted(a.offset for a in acks) == list(range(len(msgs)))
    for consume in (consume_confluent, consume_kafka_python, consume_aiokafka):
        got = consume(broker.bootstrap, topic)
        assert [(r.key, r.value) for r in got] == [(m.key, m.value) for m in msgs]


# ------------------------------------------------------------------------------------------ bombs
class Watch:
    """While a request is outstanding on `wire`, an unrelated client sends ApiVersions over and over
    and the broker's RSS is sampled; `finish()` returns the produce answer."""

    def __init__(self, broker, wire: Wire, version: int) -> None:
        self.broker = broker
        self.wire = wire
        self.version = version
        self.answer: dict | None = None
        self.failure: BaseException | None = None
        self.done = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        try:
            self.answer = self.wire.produce_response(self.version)
        except BaseException as e:  # noqa: BLE001 - reported by finish()
            self.failure = e
        finally:
            self.done.set()

    def run(self) -> tuple[dict, int, int]:
        """(answer, ApiVersions answered before it, largest RSS sampled in KiB)."""
        self.reader.start()
        other = connect(self.broker.host, self.broker.port, timeout=30)
        answered = 0
        rss = self.broker.rss_kb()
        try:
            for cid in itertools.count(1):
                if self.done.is_set():
                    break
                other.sendall(api_versions_v0(cid))
                frame = recv_frame(other, 60)
                assert frame is not None and struct.unpack_from(">ih", frame) == (cid, 0)
                if not self.done.is_set():
                    answered += 1
                rss = max(rss, self.broker.rss_kb())
        finally:
            other.close()
        self.reader.join(60)
        if self.failure is not None:
            raise self.failure
        assert self.answer is not None
        return self.answer, answered, max(rss, self.broker.rss_kb())


def settled_rss_kb(broker) -> int:
    """The broker's RSS once it stops changing much (after start-up and topic creation)."""
    samples = [broker.rss_kb()]

    def steady() -> bool:
        samples.append(broker.rss_kb())
        return abs(samples[-1] - samples[-2]) < 512

    wait_until(steady, 10, "broker RSS to settle", interval=0.2)
    return samples[-1]


def test_legacy_gzip_bombs_are_refused_with_bounded_memory_while_others_are_served(broker_factory):
    broker = broker_factory()
    topic = "gzip-bombs"
    create_topic(broker.bootstrap, topic, 3)
    bomb = gzip_bomb_wrapper(1_900_000)
    before = settled_rss_kb(broker)
    wire = Wire(broker)
    try:
        sent = wire.send_produce(2, {(topic, p): bomb for p in range(3)})
        answer, answered, peak = Watch(broker, wire, 2).run()
    finally:
        wire.close()
    assert [answer[(topic, p)].error_code for p in range(3)] == [ErrorCode.MESSAGE_TOO_LARGE] * 3
    assert answered >= 1, "no ApiVersions was answered while the bombs were being checked"
    assert peak - before <= 8 * sent // 1024 + 64 * 1024, (before, peak, sent)
    assert high_watermark(broker.bootstrap, topic, 0) == 0
    values = [b"after the bombs %d" % i for i in range(5)]
    produce_confluent(broker.bootstrap, topic, [Msg(None, v, (), None, 0) for v in values])
    assert [r.value for r in consume_confluent(broker.bootstrap, topic, (0,))] == values


def test_zstd_batch_of_8m_keyed_records_to_a_compacted_topic(broker_factory):
    broker = broker_factory()
    topic = "zstd-bomb"
    create_topic(broker.bootstrap, topic, 1, cleanup_policy="compact")
    n = 8_000_000
    bomb = v2_batch(rec(0, key=b"k", value=b"") * n, n, base_timestamp=now_ms(), codec=ZSTD)
    assert len(bomb) < 16 * 1024
    before = settled_rss_kb(broker)
    wire = Wire(broker)
    try:
        sent = wire.send_produce(9, {(topic, 0): bomb})
        answer, _, peak = Watch(broker, wire, 9).run()
    finally:
        wire.close()
    assert answer[(topic, 0)].error_code == ErrorCode.MESSAGE_TOO_LARGE
    assert "8000000" in answer[(topic, 0)].error_message
    assert peak - before <= 8 * sent // 1024 + 64 * 1024, (before, peak, sent)
    s = connect(broker.host, broker.port)
    try:
        assert api_versions_ok(s, 7)
    finally:
        s.close()


def test_compressed_batch_inflating_past_its_bound_is_refused(broker):
    topic = "inflating"
    create_topic(broker.bootstrap, topic, 1)
    n = 200
    records = b"".join(rec(i, key=b"k", value=b"\0" * 100_000) for i in range(n))  # 20 MB inflated
    bomb = v2_batch(records, n, base_timestamp=now_ms(), codec=GZIP)
    assert len(bomb) < 1024 * 1024
    wire = Wire(broker)
    try:
        answer = wire.produce(9, {(topic, 0): bomb})
    finally:
        wire.close()
    assert answer[(topic, 0)].error_code == ErrorCode.MESSAGE_TOO_LARGE
    assert high_watermark(broker.bootstrap, topic, 0) == 0


def test_acks_0_lie_closes_the_connection(broker):
    topic = "acks0-lie"
    create_topic(broker.bootstrap, topic, 1)
    wire = Wire(broker)
    try:
        wire.send_produce(9, {(topic, 0): lie("count 1 with 3 records", now_ms())[0]}, acks=0)
        wire.sock.settimeout(10)
        try:
            assert wire.sock.recv(1) == b""
        except ConnectionResetError:
            pass
    finally:
        wire.close()
