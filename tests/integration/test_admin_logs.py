"""Partition logs on a real broker: DescribeLogDirs, DeleteRecords and OffsetForLeaderEpoch, through
confluent-kafka (AdminClient.delete_records, consumers), kafka-python (KafkaAdminClient, consumer, and
its request classes for OffsetForLeaderEpoch at every version) and kcat."""

from __future__ import annotations

import os
import subprocess
import time

import kafka.errors as kerr
import pytest
from confluent_kafka import OFFSET_END, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import TopicPartition as KTopicPartition
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import DeleteRecordsRequest
from kafka.protocol.consumer import OffsetForLeaderEpochRequest

from .clients import (
    Msg, confluent_config, confluent_consumer, consume_confluent, kafka_python_consumer, kcat_path,
    produce_confluent, segment_files,
)


def create(admin, name: str, partitions: int = 1, **config) -> None:
    admin.create_topics([NewTopic(name, partitions, 1, config=config)])[name].result(timeout=10)


def produce(broker, topic: str, n: int, partition: int = 0) -> None:
    produce_confluent(broker.bootstrap, topic, [Msg(f"k{i}".encode(), f"v{i}".encode(), partition=partition)
                                                for i in range(n)], flush_each=True)


def delete_records(admin, topic: str, offset: int, partition: int = 0):
    (f,) = admin.delete_records([TopicPartition(topic, partition, offset)]).values()
    try:
        return f.result(timeout=20).low_watermark
    except KafkaException as e:
        return e.args[0]


def kp_send(kadmin, request):
    async def call():
        return await kadmin._manager.send(request, node_id=0)
    return kadmin._manager.run(call)


# ------------------------------------------------------------------------------------------ DescribeLogDirs
def test_describe_log_dirs_kafka_python(broker, admin, kadmin):
    create(admin, "ld-a", 2)
    produce(broker, "ld-a", 20, partition=1)
    (answer,) = kadmin.describe_log_dirs()
    assert answer["broker"] == 0
    (d,) = answer["log_dirs"]
    assert d["error_code"] == 0 and d["log_dir"] == os.path.abspath(broker.log_dir)
    assert 0 < d["usable_bytes"] <= d["total_bytes"]
    parts = {(t["name"], p["partition_index"]): p for t in d["topics"] for p in t["partitions"]}
    on_disk = sum(os.path.getsize(f) for f in segment_files(broker.log_dir, "ld-a", 1) if f.endswith(".log"))
    assert parts[("ld-a", 1)]["partition_size"] == on_disk > 0
    assert parts[("ld-a", 0)]["partition_size"] == 0
    assert all(p["offset_lag"] == 0 and not p["is_future_key"] for p in parts.values())
    (only,) = kadmin.describe_log_dirs({"ld-a": [1]})[0]["log_dirs"]
    assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in only["topics"]] == [("ld-a", [1])]


# ------------------------------------------------------------------------------------------ DeleteRecords
def test_delete_records_moves_the_log_start_offset(broker, admin):
    create(admin, "dr-a")
    produce(broker, "dr-a", 10)
    assert delete_records(admin, "dr-a", 4) == 4
    c = confluent_consumer(broker.bootstrap)
    try:
        assert c.get_watermark_offsets(TopicPartition("dr-a", 0), timeout=10) == (4, 10)
    finally:
        c.close()
    assert [r.offset for r in consume_confluent(broker.bootstrap, "dr-a", [0])] == list(range(4, 10))
    # Below the new start: OFFSET_OUT_OF_RANGE (librdkafka reports it when it may not reset).
    c = confluent_consumer(broker.bootstrap, **{"auto.offset.reset": "error"})
    try:
        c.assign([TopicPartition("dr-a", 0, 2)])
        deadline, err = time.monotonic() + 15, None
        while err is None and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is not None, f"read offset {m.offset()} below the log start offset"
                err = m.error()
        assert err is not None and err.code() == KafkaError._AUTO_OFFSET_RESET
        assert "Offset out of range" in err.str()
    finally:
        c.close()
    # -1 is the high watermark; beyond it is OFFSET_OUT_OF_RANGE.
    assert delete_records(admin, "dr-a", OFFSET_END) == 10
    assert delete_records(admin, "dr-a", 11).code() == KafkaError.OFFSET_OUT_OF_RANGE
    assert delete_records(admin, "dr-a", 3) == 10  # never moves back


def test_delete_records_errors(broker, admin, kadmin):
    create(admin, "dr-compact", **{"cleanup.policy": "compact"})
    produce(broker, "dr-compact", 3)
    assert delete_records(admin, "dr-compact", 1).code() == KafkaError.POLICY_VIOLATION
    create(admin, "dr-one")
    produce(broker, "dr-one", 2)
    # librdkafka finds no leader for a partition that does not exist, so ask the broker with kafka-python.
    request = DeleteRecordsRequest(topics=[("dr-one", [(5, 0), (0, 1)]), ("__consumer_offsets", [(0, 0)])],
                                   timeout_ms=10000)
    response = kp_send(kadmin, request)
    got = {(t.name, p.partition_index): (p.error_code, p.low_watermark) for t in response.topics for p in t.partitions}
    # Records of an internal topic are never deleted (the group coordinator may not have made it yet).
    internal = kerr.InvalidTopicError if "__consumer_offsets" in kadmin.list_topics() \
        else kerr.UnknownTopicOrPartitionError
    assert got == {("dr-one", 5): (kerr.UnknownTopicOrPartitionError.errno, -1), ("dr-one", 0): (0, 1),
                   ("__consumer_offsets", 0): (internal.errno, -1)}


def test_delete_records_kafka_python_and_its_consumer(broker, admin, kadmin):
    create(admin, "dr-kp")
    produce(broker, "dr-kp", 8)
    result = kadmin.delete_records({KTopicPartition("dr-kp", 0): 5})
    assert [(tp.partition, v["low_watermark"]) for tp, v in result.items()] == [(0, 5)]
    consumer = kafka_python_consumer(broker.bootstrap, auto_offset_reset="none")
    try:
        tp = KTopicPartition("dr-kp", 0)
        consumer.assign([tp])
        assert consumer.beginning_offsets([tp]) == {tp: 5}
        consumer.seek(tp, 1)
        with pytest.raises(kerr.OffsetOutOfRangeError):
            for _ in range(30):
                consumer.poll(timeout_ms=500)
    finally:
        consumer.close()
    r = subprocess.run([kcat_path(), "-b", broker.bootstrap, "-C", "-t", "dr-kp", "-p", "0", "-o", "beginning",
                        "-e", "-q", "-f", "%o\\n"], capture_output=True, timeout=30)
    assert r.returncode == 0 and r.stdout.decode().split() == ["5", "6", "7"]


# ------------------------------------------------------------------------------------------ OffsetForLeaderEpoch
def epoch_request(version: int, topic: str, partitions: list[tuple[int, int, int]]):
    """partitions: (partition, current_leader_epoch, leader_epoch)."""
    _Topic = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    _Partition = _Topic.OffsetForLeaderPartition
    return OffsetForLeaderEpochRequest(
        replica_id=-1, topics=[_Topic(topic=topic, partitions=[
            _Partition(partition=p, current_leader_epoch=cur, leader_epoch=ep) for p, cur, ep in partitions])],
        min_version=version, max_version=version)


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_offset_for_leader_epoch_every_version(broker, admin, kadmin, version):
    topic = f"ofle-{version}"
    create(admin, topic, 2)
    produce(broker, topic, 7)
    response = kp_send(kadmin, epoch_request(version, topic, [(0, -1, 0), (1, -1, 0), (0, -1, 3), (9, -1, 0)]))
    # v0 has no leader epoch in the answer (kafka-python shows its default, -1).
    got = [(p.partition, p.error_code, p.leader_epoch if version >= 1 else "-", p.end_offset)
           for p in response.topics[0].partitions]
    epoch, undefined = (0, -1) if version >= 1 else ("-", "-")
    assert got == [
        (0, 0, epoch, 7),               # the current epoch ends at the log end offset
        (1, 0, epoch, 0),               # an empty partition of the current epoch too
        (0, 0, undefined, -1),          # an epoch the leader has not reached
        (9, kerr.UnknownTopicOrPartitionError.errno, undefined, -1),
    ]


def test_offset_for_leader_epoch_fences_the_current_epoch(broker, admin, kadmin):
    create(admin, "ofle-fence")
    produce(broker, "ofle-fence", 3)
    response = kp_send(kadmin, epoch_request(2, "ofle-fence", [(0, 0, 0), (0, 1, 0)]))
    assert [(p.error_code, p.end_offset) for p in response.topics[0].partitions] == [
        (0, 3), (kerr.UnknownLeaderEpochError.errno, -1)]
    response = kp_send(kadmin, epoch_request(4, "ofle-missing", [(0, -1, 0)]))
    assert response.topics[0].partitions[0].error_code == kerr.UnknownTopicOrPartitionError.errno
