"""ListOffsets as Kafka answers it, and a timestamp search that stays bounded and off the event loop even
over a stored batch whose header lies about its max timestamp.

The lying batch is written into the segment file of a stopped broker (what an old producer, or a
validator that trusts headers, would have stored), so the test does not depend on what the produce
path accepts; the broker restarts without its clean-shutdown marker and rebuilds the indexes from the
file. Timestamps are looked up with confluent-kafka (offsets_for_times, AdminClient.list_offsets) and
with raw requests encoded by kafka-python's protocol classes."""

from __future__ import annotations

import os
import socket
import struct

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from crc32c import crc32c
from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from .abuse_support import answered_during
from .clients import Msg, confluent_config, confluent_consumer, produce_confluent, segment_files

NONE, UNKNOWN_TOPIC_OR_PARTITION, UNSUPPORTED_VERSION, INVALID_REQUEST = 0, 3, 35, 42
T0 = 1_700_000_000_000          # the real records' timestamps start here
LIE = 4_000_000_000_000         # what the lying batch claims as its max timestamp
PARTITIONS = 4


def call(bootstrap: str, request, response_cls, version: int):
    host, port = bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        request.with_header(correlation_id=1, client_id="lo")
        s.sendall(request.encode(version=version, header=True, framed=True))
        size = struct.unpack(">i", recv(s, 4))[0]
        return response_cls.decode(recv(s, size), version=version, header=True)


def recv(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "closed by the broker"
        buf += chunk
    return buf


def list_offsets(bootstrap: str, topic: str, asked, version: int = 11):
    """asked: [(partition, timestamp)]; {(partition): (error, timestamp, offset)} and the raw topics."""
    req = ListOffsetsRequest(replica_id=-1, isolation_level=0, timeout_ms=30_000, topics=[
        ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
            ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                partition_index=p, current_leader_epoch=-1, timestamp=ts, max_num_offsets=1)
            for p, ts in asked])])
    resp = call(bootstrap, req, ListOffsetsResponse, version)
    return [(p.partition_index, p.error_code, p.timestamp, p.offset) for t in resp.topics for p in t.partitions]


def batch(base_offset: int, timestamps: list[int], claim: int | None = None) -> bytes:
    """A v2 batch built by kafka-python; with `claim`, its header's max_timestamp says so instead
    (the CRC made to match, as a client that lies would make it)."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    for i, ts in enumerate(timestamps):
        b.append(i, timestamp=ts, key=None, value=b"x", headers=[])
    buf = bytearray(b.build())
    struct.pack_into(">q", buf, 0, base_offset)
    if claim is not None:
        struct.pack_into(">q", buf, 35, claim)
        struct.pack_into(">I", buf, 17, crc32c(bytes(buf[21:])))
    return bytes(buf)


@pytest.fixture(scope="module")
def lying(tmp_path_factory):
    """A broker whose topic `lies` has, in each of 4 partitions: 100 honest records, a batch of 50,000
    records (timestamp T0+100) whose header claims LIE, 25,000 small honest batches (T0+200), and one
    record at T0+10^6 produced after the restart."""
    from .conftest import Broker, live
    b = Broker(tmp_path_factory.mktemp("lying"), {"num.partitions": str(PARTITIONS)}, name="lying")
    with live(b):
        b.start()
        admin = AdminClient(confluent_config(b.bootstrap))
        admin.create_topics([NewTopic("lies", PARTITIONS, 1)])["lies"].result(20)
        for p in range(PARTITIONS):
            produce_confluent(b.bootstrap, "lies", [Msg(None, b"honest", (), T0 + i, p) for i in range(100)])
        assert b.stop() == 0
        filler = batch(0, [T0 + 200])
        for p in range(PARTITIONS):
            [path] = segment_files(b.log_dir, "lies", p)
            body = bytearray(batch(100, [T0 + 100] * 50_000, claim=LIE))
            for i in range(25_000):
                struct.pack_into(">q", filler_buf := bytearray(filler), 0, 50_100 + i)
                body += filler_buf
            with open(path, "ab") as f:
                f.write(body)
        b.clean_shutdown_marker.unlink()            # recovery rebuilds the indexes from the file
        b.start()
        for p in range(PARTITIONS):
            acks = produce_confluent(b.bootstrap, "lies", [Msg(None, b"last", (), T0 + 10**6, p)])
            assert acks[0].offset == 75_100
        yield b


def test_a_lying_header_does_not_hide_the_answer(lying):
    c = confluent_consumer(lying.bootstrap)
    try:
        for target, want in [(T0 + 50, (T0 + 50, 50)), (T0 + 150, (T0 + 200, 50_100)),
                             (T0 + 5_000, (T0 + 10**6, 75_100)), (T0 + 2 * 10**6, (-1, -1))]:
            got = c.offsets_for_times([TopicPartition("lies", p, target) for p in range(PARTITIONS)], 30)
            assert {tp.offset for tp in got} == {want[1]}, target
        got = list_offsets(lying.bootstrap, "lies", [(p, T0 + 5_000) for p in range(PARTITIONS)])
        assert sorted(got) == [(p, NONE, T0 + 10**6, 75_100) for p in range(PARTITIONS)]
    finally:
        c.close()
    # MAX_TIMESTAMP: the batch holding the claimed maximum has no record with it; Kafka answers no offset
    admin = AdminClient(confluent_config(lying.bootstrap))
    futures = admin.list_offsets({TopicPartition("lies", 0): OffsetSpec.max_timestamp()})
    assert futures[TopicPartition("lies", 0)].result(20).offset == -1


def test_the_search_runs_off_the_event_loop(lying):
    """Four partitions searched past 50,000-record lying batches in one request: another client's
    ApiVersions requests are answered while the searches are in flight (on the loop, the same request
    held every other client for about a second)."""
    def search() -> None:
        for _ in range(3):
            got = list_offsets(lying.bootstrap, "lies", [(p, T0 + 5_000) for p in range(PARTITIONS)])
            assert sorted(got) == [(p, NONE, T0 + 10**6, 75_100) for p in range(PARTITIONS)]
    assert answered_during(lying.host, lying.port, search) > 0


def test_special_timestamps_as_kafka_answers_them(broker):
    admin = AdminClient(confluent_config(broker.bootstrap))
    admin.create_topics([NewTopic("specials", 1, 1)])["specials"].result(20)
    produce_confluent(broker.bootstrap, "specials", [Msg(None, b"v%d" % i, (), T0 + i) for i in range(10)])
    got = {}
    for ts in (-1, -2, -3, -4, -5, -6):
        [(_, code, timestamp, offset)] = list_offsets(broker.bootstrap, "specials", [(0, ts)])
        got[ts] = (code, timestamp, offset)
    assert got == {-1: (NONE, -1, 10), -2: (NONE, -1, 0), -3: (NONE, T0 + 9, 9),
                   -4: (NONE, -1, 0),                   # earliest local: the log start, nothing is tiered
                   -5: (NONE, -1, -1), -6: (NONE, -1, -1)}   # latest tiered, earliest pending upload: none
    # a timestamp the request's version does not know, or no sentinel at all: UNSUPPORTED_VERSION
    for version, ts in [(6, -3), (7, -4), (8, -5), (10, -6), (11, -7), (11, -100)]:
        [(_, code, _, _)] = list_offsets(broker.bootstrap, "specials", [(0, ts)], version)
        assert code == UNSUPPORTED_VERSION, (version, ts)
    # a partition asked for twice is answered once, with INVALID_REQUEST; the others as usual
    got = list_offsets(broker.bootstrap, "specials", [(0, -2), (0, T0 + 3), (1, -1)])
    assert got == [(0, INVALID_REQUEST, -1, -1), (1, UNKNOWN_TOPIC_OR_PARTITION, -1, -1)]


def test_unknown_partition_and_a_timestamp_past_the_end(broker):
    admin = AdminClient(confluent_config(broker.bootstrap))
    admin.create_topics([NewTopic("plain", 1, 1)])["plain"].result(20)
    produce_confluent(broker.bootstrap, "plain", [Msg(None, os.urandom(10), (), T0 + i) for i in range(5)])
    got = list_offsets(broker.bootstrap, "plain", [(0, T0 + 2), (1, T0)])
    assert got == [(0, NONE, T0 + 2, 2), (1, UNKNOWN_TOPIC_OR_PARTITION, -1, -1)]
    assert list_offsets(broker.bootstrap, "plain", [(0, T0 + 99)]) == [(0, NONE, -1, -1)]
