"""The abuse suite, large legal requests and forged follower fetches (hardening round two, "What it must
contain" 5). A legal request naming a great many items is answered item by item, as Kafka answers it,
instead of closing the connection: AddPartitionsToTxn naming 200,000 partitions (v3, and the brokers'
batched v4), Metadata naming 400,000 topics that do not exist (v1 and v12; auto-creation is off, so
each is UNKNOWN_TOPIC_OR_PARTITION). While each runs another client's round trips stay under 250 ms, the
broker's RSS grows by at most 8x the bytes sent + 64 MiB, and records written before and after are read
back by confluent-kafka, kafka-python and aiokafka.

A Fetch claiming to be a follower (replica id >= 0, in `replica_id` before v15 and in `ReplicaState`
from v15) from a broker that is no replica of the partition, or from the broker's own id, is answered
NOT_LEADER_OR_FOLLOWER (UNKNOWN_LEADER_EPOCH when it names the current leader epoch: Kafka's
followerReplicaOrThrow) with no records, and the high watermark stays where it was."""

from __future__ import annotations

import struct
import uuid

import pytest

from odradek.protocol.api import decode_response, encode_request
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.headers import RequestHeader
from odradek.protocol.messages import add_partitions_to_txn as ap
from odradek.protocol.messages import fetch as f
from odradek.protocol.messages import metadata as m

from .abuse_support import assert_all_read_back, assert_rss_bounded, pinging, three_client_round_trip
from .clients import connect, recv_exact
from .test_abuse_produce import create_topic, high_watermark

BROKER_OVERRIDES = {"auto.create.topics.enable": "false"}
TOPIC = "abuse-large"
MAX_PING_WAIT_S = 0.25


@pytest.fixture(scope="module")
def before(broker):
    """Records written before any abuse; every test checks they are still read back afterwards."""
    create_topic(broker.bootstrap, TOPIC, partitions=1)
    return three_client_round_trip(broker.bootstrap, TOPIC, "before")


def after_abuse(broker, before, tag: str) -> None:
    assert broker.running, "the broker died"
    before += three_client_round_trip(broker.bootstrap, TOPIC, tag)
    assert_all_read_back(broker.bootstrap, TOPIC, before)


def request_wire(api_key: int, version: int, body) -> bytes:
    """A request encoded by the project's codec, with its size prefix."""
    frame = bytes(encode_request(RequestHeader(api_key, version, 7, "abuse-large"), body))
    return struct.pack(">i", len(frame)) + frame


def send_and_receive(broker, wire: bytes, timeout: float = 180.0) -> bytearray:
    """Send one request on a new connection and return its answer's frame. Fails if the broker closes
    the connection instead of answering. Light on this process's GIL, so that the pinger thread's own
    waits are the broker's."""
    s = connect(broker.host, broker.port)
    try:
        s.sendall(wire)
        head = recv_exact(s, 4, timeout)
        assert head is not None, "the broker closed the connection instead of answering"
        (size,) = struct.unpack(">i", head)
        answer = bytearray()
        s.settimeout(timeout)
        while len(answer) < size:
            chunk = s.recv(min(size - len(answer), 1 << 20))
            assert chunk, "the broker closed the connection mid-answer"
            answer += chunk
    finally:
        s.close()
    return answer


def decoded(api_key: int, version: int, answer: bytearray):
    cid, body = decode_response(api_key, version, answer)
    assert cid == 7
    return body


def exchange(broker, api_key: int, version: int, body, timeout: float = 180.0):
    return decoded(api_key, version, send_and_receive(broker, request_wire(api_key, version, body), timeout))


def abuse(broker, api_key: int, version: int, body, what: str):
    """Send a large request while a pinger runs; its answer, once the pinger has stopped. The request
    is encoded and the answer decoded outside the pinger's time (this process's own work would delay
    the pinger thread)."""
    wire = request_wire(api_key, version, body)
    rss0 = broker.rss_kb()
    with pinging(broker) as pinger:
        answer = send_and_receive(broker, wire)
        assert_rss_bounded(broker, rss0, len(wire), what)
    assert max(pinger.waits) < MAX_PING_WAIT_S, f"another client waited {max(pinger.waits) * 1000:.0f} ms"
    return decoded(api_key, version, answer)


def partition_codes(topic_results) -> dict[int, int]:
    """{error code: how many partitions} over AddPartitionsToTxn topic results."""
    counts: dict[int, int] = {}
    for t in topic_results:
        for p in t.results_by_partition:
            counts[p.partition_error_code] = counts.get(p.partition_error_code, 0) + 1
    return counts


def test_add_partitions_to_txn_naming_200k_partitions_is_answered_per_partition(broker, before):
    """v3: partition 0 of the topic exists, 1..199,999 do not: UNKNOWN_TOPIC_OR_PARTITION for those and
    OPERATION_NOT_ATTEMPTED for partition 0, without asking the transaction coordinator."""
    n = 200_000
    body = ap.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id="abuse-txn", v3_and_below_producer_id=4242, v3_and_below_producer_epoch=0,
        v3_and_below_topics=[ap.AddPartitionsToTxnTopic(name=TOPIC, partitions=list(range(n)))])
    answer = abuse(broker, 24, 3, body, f"AddPartitionsToTxn v3 naming {n} partitions")
    assert [t.name for t in answer.results_by_topic_v3_and_below] == [TOPIC]
    assert partition_codes(answer.results_by_topic_v3_and_below) == {
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: n - 1, ErrorCode.OPERATION_NOT_ATTEMPTED: 1}
    assert answer.results_by_topic_v3_and_below[0].results_by_partition[0].partition_index == 0
    after_abuse(broker, before, "after-txn-v3")


def test_batched_add_partitions_to_txn_naming_200k_partitions_is_answered_per_transaction(broker, before):
    """v4 (the brokers' batched form, verify_only): two transactions of 100,000 partitions each, one of
    them of a topic that does not exist."""
    n = 100_000
    txns = [ap.AddPartitionsToTxnTransaction(transactional_id=f"abuse-txn-{i}", producer_id=4243 + i,
                                             producer_epoch=0, verify_only=True,
                                             topics=[ap.AddPartitionsToTxnTopic(name=name, partitions=list(range(n)))])
            for i, name in enumerate((TOPIC, "abuse-large-missing"))]
    answer = abuse(broker, 24, 4, ap.AddPartitionsToTxnRequest(transactions=txns),
                   f"AddPartitionsToTxn v4 naming {2 * n} partitions")
    assert answer.error_code == ErrorCode.NONE
    assert [r.transactional_id for r in answer.results_by_transaction] == ["abuse-txn-0", "abuse-txn-1"]
    assert partition_codes(answer.results_by_transaction[0].topic_results) == {
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: n - 1, ErrorCode.OPERATION_NOT_ATTEMPTED: 1}
    assert partition_codes(answer.results_by_transaction[1].topic_results) == {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: n}
    after_abuse(broker, before, "after-txn-v4")


@pytest.mark.parametrize("version", [1, 12])
def test_metadata_naming_400k_topics_is_answered_per_topic(broker, before, version):
    """400,000 names that are no topic, and the one that is: each missing one UNKNOWN_TOPIC_OR_PARTITION
    (auto-creation is off), the existing one with its partition."""
    n = 400_000
    names = [f"missing-{i:06d}" for i in range(n)]
    names.insert(n // 2, TOPIC)
    body = m.MetadataRequest(topics=[m.MetadataRequestTopic(name=name) for name in names],
                             allow_auto_topic_creation=False)
    answer = abuse(broker, 3, version, body, f"Metadata v{version} naming {n} topics")
    del body
    assert len(answer.topics) == n + 1
    assert [t.name for t in answer.topics] == names
    codes: dict[int, int] = {}
    for t in answer.topics:
        codes[t.error_code] = codes.get(t.error_code, 0) + 1
    assert codes == {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: n, ErrorCode.NONE: 1}
    found = answer.topics[n // 2]
    assert found.name == TOPIC and [p.partition_index for p in found.partitions] == [0]
    del answer
    after_abuse(broker, before, f"after-metadata-v{version}")


# ------------------------------------------------------------------------------------ forged followers
def topic_state(broker) -> tuple[int, uuid.UUID, int]:
    """(this broker's id, the topic's id, partition 0's leader epoch) from Metadata v12."""
    answer = exchange(broker, 3, 12, m.MetadataRequest(topics=[m.MetadataRequestTopic(name=TOPIC)]))
    (t,) = answer.topics
    (p,) = t.partitions
    return p.leader_id, t.topic_id, p.leader_epoch


def forged_fetch(broker, version: int, replica_id: int, epoch: int, topic_id: uuid.UUID) -> f.PartitionData:
    part = f.FetchPartition(partition=0, current_leader_epoch=epoch, fetch_offset=0, partition_max_bytes=1 << 20)
    topic = f.FetchTopic(topic=TOPIC, topic_id=topic_id, partitions=[part])
    body = f.FetchRequest(max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, topics=[topic], session_epoch=-1)
    if version >= 15:
        body.replica_state = f.ReplicaState(replica_id=replica_id, replica_epoch=-1)
    else:
        body.replica_id = replica_id
    answer = exchange(broker, 1, version, body, timeout=30)
    assert answer.error_code == ErrorCode.NONE
    (r,) = answer.responses
    (p,) = r.partitions
    return p


@pytest.mark.parametrize("version", [12, 15])
def test_a_fetch_from_a_broker_that_is_no_replica_is_refused(broker, before, version):
    own_id, topic_id, epoch = topic_state(broker)
    hw = high_watermark(broker.bootstrap, TOPIC, 0)
    assert hw == len(before)
    for forged in (own_id + 1000, own_id):      # no replica of the partition; the broker's own id
        p = forged_fetch(broker, version, forged, -1, topic_id)
        assert p.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER and not p.records, (forged, p)
        p = forged_fetch(broker, version, forged, epoch, topic_id)
        assert p.error_code == ErrorCode.UNKNOWN_LEADER_EPOCH and not p.records, (forged, p)
    # A consumer's fetch (replica id -1) of the same partition is served as before.
    p = forged_fetch(broker, version, -1, epoch, topic_id)
    assert p.error_code == ErrorCode.NONE and p.high_watermark == hw and p.records
    assert high_watermark(broker.bootstrap, TOPIC, 0) == hw
    after_abuse(broker, before, f"after-forged-v{version}")
