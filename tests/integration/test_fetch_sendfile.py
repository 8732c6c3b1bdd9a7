"""Fetched records go from the page cache to the socket with sendfile on both event loops the broker
runs on (record_slices.py): uvloop (the default), where the broker calls sendfile on the connection's
own socket, and asyncio's own loop (`loop.sendfile`). Each loop's broker serves about 24 MiB of 1 MB
batches to confluent-kafka, kcat and a raw Fetch read by kafka-python's decoder through a small
receive buffer (so the broker's socket fills and the send resumes), each getting every record intact."""

from __future__ import annotations

import hashlib
import os
import socket

import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.record import MemoryRecords

from .clients import Msg, RawClient, consume_confluent, consume_kcat, produce_confluent
from .conftest import Broker, live

MIB = 1024 * 1024
RECORDS = 240
VALUE_BYTES = 100 * 1024


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def loop_broker(request, tmp_path_factory):
    b = Broker(tmp_path_factory.mktemp(f"sendfile-{request.param}"),
               {"num.partitions": "1", "message.max.bytes": "2000000"}, name=f"sendfile-{request.param}",
               event_loop=request.param)
    with live(b):
        b.start()
        assert f"event loop: {request.param}" in b.log_text()
        yield b


@pytest.fixture(scope="module")
def topic(loop_broker):
    # text values (hex), so kcat's JSON output carries them exactly
    msgs = [Msg(f"k{i}".encode(), f"{i}:{os.urandom(VALUE_BYTES // 2).hex()}".encode(), (), None)
            for i in range(RECORDS)]
    acks = produce_confluent(loop_broker.bootstrap, "pages", msgs, **{"batch.size": 1_000_000, "linger.ms": 50})
    assert [a.offset for a in acks] == list(range(RECORDS))
    return "pages", {m.key: hashlib.sha256(m.value).hexdigest() for m in msgs}


def _digests(recs) -> dict:
    return {r.key: hashlib.sha256(r.value).hexdigest() for r in recs}


def test_confluent_kafka_reads_every_record_intact(loop_broker, topic):
    name, want = topic
    recs = consume_confluent(loop_broker.bootstrap, name, **{"fetch.max.bytes": 16 * MIB,
                                                              "max.partition.fetch.bytes": 16 * MIB})
    assert [r.offset for r in recs] == list(range(RECORDS))
    assert _digests(recs) == want


def test_kcat_reads_every_record_intact(loop_broker, topic):
    name, want = topic
    recs = consume_kcat(loop_broker.bootstrap, name, extra=["-X", "fetch.message.max.bytes=16777216"])
    assert [r.offset for r in recs] == list(range(RECORDS))
    assert _digests(recs) == want


def test_a_raw_fetch_through_a_small_receive_buffer_gets_the_whole_response(loop_broker, topic):
    name, want = topic
    with RawClient(loop_broker.bootstrap) as raw:
        raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
        part = FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=24 * MIB,
                                                      log_start_offset=-1, current_leader_epoch=-1)
        req = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=32 * MIB, isolation_level=0,
                           session_id=0, session_epoch=-1,
                           topics=[FetchRequest.FetchTopic(topic=name, partitions=[part])], forgotten_topics_data=[])
        resp = raw.call(req, FetchResponse, 11)
    p = resp.responses[0].partitions[0]
    assert p.error_code == 0 and p.high_watermark == RECORDS
    records = MemoryRecords(p.records)
    got = {}
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc()
        for r in batch:
            got[r.key] = hashlib.sha256(r.value).hexdigest()
    assert got == want
