"""Down-conversion abuse on a real broker: a batch of a million small records is stored once, then twelve
Fetch v2 requests of about 100 bytes each ask for it at the same time (magic 1 messages, so the broker
must down-convert). Before, each such request cost about 400 MiB and 11 CPU-seconds, and an ordinary
producer waited up to 94 s for the worker pool.

- zstd: refused with UNSUPPORTED_COMPRESSION_TYPE, as Kafka refuses it (RecordsUtil.downConvert).
- gzip: converted a bounded piece at a time (record_slices, records/downconvert): every answer holds
  whole messages from the offset asked for, and the broker's memory stays bounded.

While the fetches run, an unrelated client's ApiVersions round trips stay under 250 ms and an ordinary
confluent-kafka producer (acks=all, gzip, a batch validated on the worker pool) is answered promptly,
the conversions holding only their lane of the pool. Records written before and after (by the three
clients, on a topic of their own) are read back by confluent-kafka, kafka-python and aiokafka. Requests are raw frames (no client sends Fetch v2 for a
zstd topic on purpose); the batch is built by odradek's record builder and produced with a raw frame.
"""

from __future__ import annotations

import struct
import threading
import time

import pytest
from crc32c import crc32c
from kafka.protocol.consumer import FetchResponse
from kafka.record import MemoryRecords

from odradek.protocol.api import decode_response, encode_request
from odradek.protocol.headers import RequestHeader
from odradek.protocol.messages import produce as pr
from odradek.records import GZIP, ZSTD, codecs
from odradek.records.varint import encode_varint

from .abuse_support import assert_all_read_back, assert_rss_bounded, pinging, three_client_round_trip
from .clients import Msg, confluent_config, connect, consume_confluent, produce_confluent, recv_frame, request_frame

BROKER_OVERRIDES = {"num.partitions": "1", "message.max.bytes": "4000000"}
RECORDS = 1_000_000
FETCHES = 12
NONE, UNSUPPORTED_COMPRESSION_TYPE = 0, 76
PING_MAX_S = 0.25
PRODUCE_MAX_S = 5.0


def million_record_batch(codec: int, n: int = RECORDS) -> bytes:
    """One v2 batch of n records: no key, value b"x", all at one timestamp (offset deltas 0..n-1)."""
    records = b"".join(bytes((2 * (6 + len(d)),)) + b"\x00\x00" + d + b"\x01\x02x\x00"
                       for d in map(encode_varint, range(n)))
    body = codecs.compress(codec, records)
    ts = int(time.time() * 1000)
    after_crc = struct.pack(">hiqqqhii", codec, n - 1, ts, ts, -1, -1, -1, n) + body
    head = struct.pack(">qiib", 0, 4 + 1 + 4 + len(after_crc), -1, 2)
    return head + struct.pack(">I", crc32c(after_crc)) + after_crc


def create_topic(bootstrap: str, name: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(confluent_config(bootstrap))
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)


def produce_raw(broker, topic: str, batch: bytes) -> int:
    """Produce v7 acks=all of one batch to partition 0; returns the bytes sent, checks the answer."""
    body = pr.ProduceRequest(acks=-1, timeout_ms=60_000, topic_data=[
        pr.TopicProduceData(name=topic, partition_data=[pr.PartitionProduceData(index=0, records=batch)])])
    w = encode_request(RequestHeader(pr.API_KEY, 7, 1, "downconvert-abuse"), body)
    frame = b"".join(bytes(c) for c in w.chunks())
    sock = connect(broker.host, broker.port, timeout=60)
    try:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        answer = recv_frame(sock, 120)
    finally:
        sock.close()
    assert answer is not None, "the broker closed the connection instead of answering the produce"
    _, response = decode_response(pr.API_KEY, 7, answer)
    [p] = [p for t in response.responses for p in t.partition_responses]
    assert p.error_code == NONE, p
    return 4 + len(frame)


def fetch_v2(correlation_id: int, topic: str, offset: int, partition_max_bytes: int) -> bytes:
    """A whole Fetch v2 request frame for partition 0 (replica -1, no wait)."""
    t = topic.encode()
    body = struct.pack(">iiii", -1, 0, 1, 1) + struct.pack(">h", len(t)) + t
    body += struct.pack(">iiqi", 1, 0, offset, partition_max_bytes)
    return request_frame(1, 2, correlation_id, body, client_id="old-reader")


class Fetches:
    """FETCHES Fetch v2 requests, each on its own connection, sent at once; their answers decoded."""

    def __init__(self, broker, topic: str, offsets: list[int], partition_max_bytes: int) -> None:
        self.broker = broker
        self.frames = [fetch_v2(i + 1, topic, offset, partition_max_bytes) for i, offset in enumerate(offsets)]
        self.sent = sum(len(f) for f in self.frames)
        self.answers: dict[int, object] = {}
        self.sizes: dict[int, int] = {}
        self.errors: list[str] = []
        self._threads = [threading.Thread(target=self._one, args=(i,), daemon=True) for i in range(len(offsets))]

    def _one(self, i: int) -> None:
        frame = self.frames[i]
        sock = connect(self.broker.host, self.broker.port, timeout=120)
        try:
            sock.sendall(frame)
            answer = recv_frame(sock, 120)
            if answer is None:
                self.errors.append(f"fetch {i}: no answer")
                return
            self.sizes[i] = len(answer)
            self.answers[i] = FetchResponse.decode(answer, version=2, header=True)
        except Exception as e:      # reported by the test, from its own thread
            self.errors.append(f"fetch {i}: {e!r}")
        finally:
            sock.close()

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def join(self) -> None:
        for t in self._threads:
            t.join(300)
        assert not self.running(), "a Fetch v2 was not answered within 300 s"
        assert not self.errors, self.errors


def ordinary_produce(broker, topic: str, tag: str) -> tuple[float, list[bytes]]:
    """An ordinary confluent-kafka producer: acks=all, gzip, 5,000 records in one batch (inflating past
    the inline validation budget, so validated on the worker pool). Returns (seconds, values)."""
    msgs = [Msg(f"{tag}-{i}".encode(), f"{tag}-value-{i}".encode() * 4) for i in range(5_000)]
    t0 = time.monotonic()
    produce_confluent(broker.bootstrap, topic, msgs, compression="gzip", acks="all",
                      **{"linger.ms": 50, "batch.size": 1_000_000})
    return time.monotonic() - t0, [m.value for m in msgs]


@pytest.mark.parametrize("codec", [ZSTD, GZIP], ids=["zstd", "gzip"])
def test_twelve_fetch_v2_of_a_million_record_batch(broker, codec):
    name = codecs.CODEC_NAMES[codec]
    topic, ordinary, round_trip = f"dc-{name}", f"dc-{name}-ordinary", f"dc-{name}-round-trip"
    before = three_client_round_trip(broker.bootstrap, round_trip, "before")
    batch = million_record_batch(codec)
    create_topic(broker.bootstrap, topic)
    rss_before = broker.rss_kb()
    sent = produce_raw(broker, topic, batch)
    # each reader asks from another place in the batch; its limit lets the whole stored batch through
    offsets = [i * (RECORDS // FETCHES) for i in range(FETCHES)]
    fetches = Fetches(broker, topic, offsets, partition_max_bytes=2 * len(batch))

    with pinging(broker) as pinger:
        fetches.start()
        produce_s, produced = ordinary_produce(broker, ordinary, name)
        overlapped = fetches.running()
        fetches.join()
    sent += fetches.sent

    assert_rss_bounded(broker, rss_before, sent, f"{FETCHES} Fetch v2 of a {len(batch)}-byte {name} batch")
    assert max(pinger.waits) < PING_MAX_S, f"longest ApiVersions round trip {max(pinger.waits):.3f} s"
    assert produce_s < PRODUCE_MAX_S, f"the ordinary producer waited {produce_s:.1f} s"
    for i, offset in enumerate(offsets):
        [part] = [p for t in fetches.answers[i].responses for p in t.partitions]
        if codec == ZSTD:
            assert part.error_code == UNSUPPORTED_COMPRESSION_TYPE and not part.records, part
            continue
        assert part.error_code == NONE
        assert fetches.sizes[i] <= len(batch) + 1024      # the answer's size: the stored batch
        records = MemoryRecords(bytes(part.records))
        got = []
        while (b := records.next_batch()) is not None:
            assert b.magic == 1 and b.compression_type == GZIP
            got.extend((r.offset, r.value) for r in b)
        assert len(got) > 10_000
        assert got == [(offset + j, b"x") for j in range(len(got))]
    if codec == GZIP:
        assert overlapped, "the ordinary produce finished after every fetch: nothing was shown"

    after = three_client_round_trip(broker.bootstrap, round_trip, "after")
    assert_all_read_back(broker.bootstrap, round_trip, before + after)
    assert [r.value for r in consume_confluent(broker.bootstrap, ordinary, (0,))] == produced
