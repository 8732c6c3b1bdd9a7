"""Idempotent producers against a real broker (seed 003, "Message Delivery Semantics"; KIP-98).

- confluent-kafka (enable.idempotence=true) and kafka-python (idempotent by default) write through
  a proxy that drops the connection instead of delivering some Produce responses, so the clients
  resend batches the broker has already appended; the log must hold every record exactly once, in
  order. The same proxy with a non-idempotent producer shows the drops really cause duplicates.
- Raw Produce requests with a producer id: a resent batch is answered with its original base offset
  and stored once, across a clean restart (producer snapshot) and a kill -9 (state rebuilt from the
  log); sequence gaps and old epochs get Kafka's error codes.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import threading
import time

import pytest

from odradek.protocol.api import decode_response, encode_request
from odradek.protocol.headers import RequestHeader
from odradek.protocol.messages import init_producer_id as ipid
from odradek.protocol.messages import metadata as md
from odradek.protocol.messages import produce as pr
from odradek.records.builder import RecordBatchBuilder

from .clients import (
    Msg, assert_partition_valid, connect, consume_confluent, partition_dir, produce_confluent,
    produce_kafka_python, recv_exact, recv_frame,
)

NONE = 0
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
PRODUCE_KEY = 0


# ------------------------------------------------------------------------------------------ proxy
class DroppingProxy:
    """A TCP proxy in front of the broker that, while `dropping`, closes the client's connection in
    place of every `drop_every`-th Produce response (at most `max_drops` times). The broker has
    appended those batches; the client cannot know, and resends them."""

    def __init__(self, drop_every: int, max_drops: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target: tuple[str, int] | None = None
        self.drop_every = drop_every
        self.max_drops = max_drops
        self.dropping = True
        self.produce_responses = 0
        self.drops = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, upstream]
            api_keys: dict[int, int] = {}
            threading.Thread(target=self._requests, args=(client, upstream, api_keys),
                             daemon=True).start()
            threading.Thread(target=self._responses, args=(upstream, client, api_keys),
                             daemon=True).start()

    @staticmethod
    def _frame(sock: socket.socket) -> bytes | None:
        try:
            head = recv_exact(sock, 4, 3600)
            if head is None:
                return None
            body = recv_exact(sock, struct.unpack(">i", head)[0], 3600)
            return None if body is None else head + body
        except OSError:
            return None

    def _requests(self, client, upstream, api_keys) -> None:
        while (frame := self._frame(client)) is not None:
            api_key, _, correlation_id = struct.unpack_from(">hhi", frame, 4)
            api_keys[correlation_id] = api_key
            try:
                upstream.sendall(frame)
            except OSError:
                break
        self._close(client, upstream)

    def _responses(self, upstream, client, api_keys) -> None:
        while (frame := self._frame(upstream)) is not None:
            correlation_id = struct.unpack_from(">i", frame, 4)[0]
            if api_keys.pop(correlation_id, None) == PRODUCE_KEY:
                with self._lock:
                    self.produce_responses += 1
                    drop = self.dropping and self.drops < self.max_drops \
                        and self.produce_responses % self.drop_every == 0
                    self.drops += drop
                if drop:
                    break
            try:
                client.sendall(frame)
            except OSError:
                break
        self._close(client, upstream)

    @staticmethod
    def _close(*socks) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        with self._lock:
            self._close(*self._sockets)


@pytest.fixture
def proxied_broker(broker_factory):
    proxy = DroppingProxy(drop_every=4, max_drops=6)
    broker = broker_factory(**{"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}"})
    proxy.target = ("127.0.0.1", broker.port)
    try:
        yield broker, proxy
    finally:
        proxy.close()


def values(n: int, prefix: str) -> list[bytes]:
    return [f"{prefix}-{i:05d}".encode() * 4 for i in range(n)]


def assert_exactly_once(broker, proxy, topic: str, sent: list[bytes], acks) -> None:
    assert proxy.drops > 0, "no Produce response was dropped: the clients never had to retry"
    proxy.dropping = False
    records = consume_confluent(f"127.0.0.1:{proxy.port}", topic)
    assert [r.offset for r in records] == list(range(len(sent))), "gaps or extra records"
    got = [r.value for r in records]
    duplicated = len(got) - len(set(got))
    assert duplicated == 0, f"{duplicated} duplicates"
    assert got == sent, "records out of order or lost"
    assert sorted(a.offset for a in acks) == list(range(len(sent)))
    for a in acks:
        assert got[a.offset] == a.msg.value, f"acknowledged offset {a.offset} holds another record"
    stored = assert_partition_valid(broker.log_dir, topic, 0)
    assert sum(b.records_count for b in stored) == len(sent)


def msgs(vals: list[bytes]) -> list[Msg]:
    return [Msg(None, v) for v in vals]


def test_confluent_idempotent_producer_has_no_duplicates_under_retries(proxied_broker):
    broker, proxy = proxied_broker
    sent = values(3000, "c")
    acks = produce_confluent(
        f"127.0.0.1:{proxy.port}", "idem-confluent", msgs(sent), **{
            "enable.idempotence": True, "linger.ms": 2, "batch.num.messages": 40,
            "max.in.flight.requests.per.connection": 5, "message.timeout.ms": 60000,
            "reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 200})
    assert_exactly_once(broker, proxy, "idem-confluent", sent, acks)


def test_kafka_python_idempotent_producer_has_no_duplicates_under_retries(proxied_broker):
    broker, proxy = proxied_broker
    sent = values(2000, "k")
    acks = produce_kafka_python(
        f"127.0.0.1:{proxy.port}", "idem-kafka-python", msgs(sent), enable_idempotence=True,
        acks="all", batch_size=1024, reconnect_backoff_ms=20)
    assert_exactly_once(broker, proxy, "idem-kafka-python", sent, acks)


def test_the_proxy_makes_a_non_idempotent_producer_duplicate(proxied_broker):
    """The control experiment: without idempotence the same faults do duplicate records, so the two
    tests above show deduplication, not an absence of retries."""
    broker, proxy = proxied_broker
    sent = values(1000, "n")
    produce_confluent(f"127.0.0.1:{proxy.port}", "not-idem", msgs(sent), **{
        "enable.idempotence": False, "acks": "all", "linger.ms": 2, "batch.num.messages": 40,
        "reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 200})
    assert proxy.drops > 0
    proxy.dropping = False
    got = [r.value for r in consume_confluent(f"127.0.0.1:{proxy.port}", "not-idem")]
    assert set(got) == set(sent) and len(got) > len(sent)


# ----------------------------------------------------------------------------------------- raw wire
class Wire:
    """Requests built with odradek's own encoder on one connection (these tests check broker
    behaviour; the clients above check compatibility)."""

    def __init__(self, broker) -> None:
        self.sock = connect(broker.host, broker.port)
        self.ids = itertools.count(1)

    def call(self, module, version: int, body):
        cid = next(self.ids)
        w = encode_request(RequestHeader(module.API_KEY, version, cid, "idem-test"), body)
        frame = b"".join(bytes(c) if not hasattr(c, "read") else c.read() for c in w.chunks())
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        got_cid, response = decode_response(module.API_KEY, version, recv_frame(self.sock))
        assert got_cid == cid
        return response

    def create_topic(self, topic: str) -> None:
        r = self.call(md, 4, md.MetadataRequest(topics=[md.MetadataRequestTopic(name=topic)],
                                                allow_auto_topic_creation=True))
        assert r.topics[0].error_code == NONE, r

    def init_producer_id(self) -> tuple[int, int]:
        r = self.call(ipid, 3, ipid.InitProducerIdRequest(
            transactional_id=None, transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1))
        assert r.error_code == NONE, r
        return r.producer_id, r.producer_epoch

    def produce(self, topic: str, batch: bytes) -> tuple[int, int]:
        r = self.call(pr, 8, pr.ProduceRequest(acks=-1, timeout_ms=10000, topic_data=[
            pr.TopicProduceData(name=topic, partition_data=[
                pr.PartitionProduceData(index=0, records=batch)])]))
        p = r.responses[0].partition_responses[0]
        return p.error_code, p.base_offset

    def close(self) -> None:
        self.sock.close()


def idempotent_batch(pid: int, epoch: int, seq: int, count: int, tag: str) -> bytes:
    # Current timestamps: a producer whose last batch is older than producer.id.expiration.ms
    # (one day) is forgotten when the state is loaded, as in Kafka.
    now_ms = time.time_ns() // 1_000_000
    b = RecordBatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    for i in range(count):
        b.append(None, f"{tag}-{seq + i}".encode(), timestamp=now_ms + i)
    return b.build()


def stored_values(broker, topic: str) -> list[bytes]:
    return [r.value for r in consume_confluent(broker.bootstrap, topic)]


def test_resent_batch_gets_the_same_offset_and_is_stored_once(broker_factory):
    broker = broker_factory()
    wire = Wire(broker)
    topic = "idem-raw"
    wire.create_topic(topic)
    pid, epoch = wire.init_producer_id()
    first = idempotent_batch(pid, epoch, 0, 3, "a")
    assert wire.produce(topic, first) == (NONE, 0)
    assert wire.produce(topic, first) == (NONE, 0)
    second = idempotent_batch(pid, epoch, 3, 2, "a")
    assert wire.produce(topic, second) == (NONE, 3)
    assert wire.produce(topic, first) == (NONE, 0)    # an older batch, still among the last five
    assert wire.produce(topic, second) == (NONE, 3)
    assert wire.produce(topic, idempotent_batch(pid, epoch, 9, 1, "a"))[0] \
        == OUT_OF_ORDER_SEQUENCE_NUMBER
    # a newer epoch restarts the sequence at 0 and fences the old epoch
    assert wire.produce(topic, idempotent_batch(pid, epoch + 1, 1, 1, "b"))[0] \
        == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert wire.produce(topic, idempotent_batch(pid, epoch + 1, 0, 1, "b")) == (NONE, 5)
    assert wire.produce(topic, idempotent_batch(pid, epoch, 5, 1, "a"))[0] == INVALID_PRODUCER_EPOCH
    wire.close()
    assert stored_values(broker, topic) == [b"a-0", b"a-1", b"a-2", b"a-3", b"a-4", b"b-0"]
    assert len(assert_partition_valid(broker.log_dir, topic, 0)) == 3


def read_snapshot_file(path: str) -> list[tuple]:
    """Kafka's ProducerSnapshot v1, parsed here independently of odradek."""
    from crc32c import crc32c

    data = open(path, "rb").read()
    version, crc = struct.unpack_from(">hI", data, 0)
    assert version == 1 and crc32c(data[6:]) == crc
    (count,) = struct.unpack_from(">i", data, 6)
    assert len(data) == 10 + 46 * count
    return [struct.unpack_from(">qhiqiqiq", data, 10 + 46 * i) for i in range(count)]


def test_deduplication_survives_clean_restart_and_kill(broker_factory):
    broker = broker_factory()
    topic = "idem-restart"
    wire = Wire(broker)
    wire.create_topic(topic)
    pid, epoch = wire.init_producer_id()
    batches = [idempotent_batch(pid, epoch, 2 * i, 2, "r") for i in range(3)]
    for i, b in enumerate(batches):
        assert wire.produce(topic, b) == (NONE, 2 * i)
    wire.close()

    broker.restart()  # clean: the producer state is written to a snapshot at the log end
    part_dir = partition_dir(broker.log_dir, topic, 0)
    snapshots = sorted(n for n in os.listdir(part_dir) if n.endswith(".snapshot"))
    assert snapshots[-1] == f"{6:020d}.snapshot"
    entries = read_snapshot_file(os.path.join(part_dir, snapshots[-1]))
    assert [(e[0], e[1], e[2], e[3], e[4]) for e in entries] == [(pid, epoch, 5, 5, 1)]
    wire = Wire(broker)
    assert wire.produce(topic, batches[-1]) == (NONE, 4)
    last = idempotent_batch(pid, epoch, 6, 2, "r")
    assert wire.produce(topic, last) == (NONE, 6)
    wire.close()

    broker.restart(kill=True)  # crash: the state after the last snapshot is rebuilt from the log
    wire = Wire(broker)
    assert wire.produce(topic, last) == (NONE, 6)
    assert wire.produce(topic, batches[-1]) == (NONE, 4)
    assert wire.produce(topic, idempotent_batch(pid, epoch, 8, 1, "r")) == (NONE, 8)
    wire.close()
    assert stored_values(broker, topic) == [f"r-{i}".encode() for i in range(9)]
