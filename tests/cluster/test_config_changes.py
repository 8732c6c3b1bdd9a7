"""Config changes across a cluster on ZooKeeper: a topic config, or the cluster-wide default broker
layer, altered through one broker is applied by every other one (seed 003, "AlterConfigs API";
Kafka's config change notifications under /config/changes). The changes go to one chosen broker with
kafka-python's IncrementalAlterConfigs request; the effect is checked on another: its DescribeConfigs,
its produce path (MESSAGE_TOO_LARGE, NOT_ENOUGH_REPLICAS through confluent-kafka) and its disk
(retention). One cluster serves the module."""

from __future__ import annotations

import os
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import DescribeConfigsRequest, IncrementalAlterConfigsRequest

from .cluster_support import Cluster, wait_for

TOPIC, BROKER = 2, 4
SET, DELETE = 0, 1


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster"), zookeeper, 3, {"log.retention.check.interval.ms": 300})
    try:
        c.start()
        yield c
    finally:
        c.shutdown()


@pytest.fixture(scope="module")
def kadmin(cluster):
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    yield admin
    admin.close()


def on_node(kadmin: KafkaAdminClient, node_id: int, request):
    async def call():
        return await kadmin._manager.send(request, node_id=node_id)
    return kadmin._manager.run(call)


def alter(kadmin: KafkaAdminClient, through: int, resource_type: int, name: str, configs: dict) -> None:
    entries = [(k, DELETE, None) if v is None else (k, SET, v) for k, v in configs.items()]
    response = on_node(kadmin, through, IncrementalAlterConfigsRequest(
        resources=[(resource_type, name, entries)], validate_only=False))
    assert [(r.error_code, r.error_message) for r in response.responses] == [(0, None)]


def described(kadmin: KafkaAdminClient, node: int, resource_type: int, name: str) -> dict[str, tuple[str, int]]:
    """name -> (value, config source) as `node` describes the resource."""
    response = on_node(kadmin, node, DescribeConfigsRequest(resources=[(resource_type, name, None)],
                                                            include_synonyms=False))
    (result,) = response.results
    assert result.error_code == 0, result
    return {c.name: (c.value, c.config_source) for c in result.configs}


def produce(bootstrap: str, topic: str, partition: int, value: bytes, acks: str = "all",
            timestamp: int = 0) -> KafkaError | None:
    result: list = []
    p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "enable.idempotence": False, "retries": 0,
                  "message.timeout.ms": 10000})
    p.produce(topic, value, partition=partition, timestamp=timestamp,
              on_delivery=lambda err, msg: result.append(err))
    assert p.flush(30) == 0
    return result[0]


def roles(cluster: Cluster, topic: str, partition: int) -> tuple[int, int, int]:
    """(the partition's leader B, another broker A to alter through, the third broker C)."""
    b = cluster.leader_of(topic, partition)
    a, c = [x for x in range(3) if x != b]
    return b, a, c


def test_topic_configs_altered_through_one_broker_are_enforced_by_the_leader_on_another(cluster, kadmin):
    cluster.create_topic("cfg", 1, 3, {"min.insync.replicas": "2"})
    b, a, c = roles(cluster, "cfg", 0)
    big = b"x" * 3000
    assert produce(cluster.bootstrap, "cfg", 0, big) is None
    alter(kadmin, a, TOPIC, "cfg", {"max.message.bytes": "1000"})
    wait_for(f"broker {b} describing max.message.bytes=1000",
             lambda: described(kadmin, b, TOPIC, "cfg")["max.message.bytes"][0] == "1000", timeout=15)
    err = produce(cluster.bootstrap, "cfg", 0, big)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
    assert produce(cluster.bootstrap, "cfg", 0, b"small") is None

    # min.insync.replicas raised through A while the ISR is short of C: B refuses acks=all.
    cluster.brokers[c].kill()
    try:
        wait_for("the ISR without the killed broker",
                 lambda: sorted(cluster.partition_states("cfg")[0].isrs) == sorted([a, b]), timeout=30)
        assert produce(cluster.bootstrap, "cfg", 0, b"two in sync") is None
        alter(kadmin, a, TOPIC, "cfg", {"min.insync.replicas": "3"})
        wait_for(f"broker {b} describing min.insync.replicas=3",
                 lambda: described(kadmin, b, TOPIC, "cfg")["min.insync.replicas"][0] == "3", timeout=15)
        err = produce(cluster.bootstrap, "cfg", 0, b"three wanted")
        assert err is not None and err.code() == KafkaError.NOT_ENOUGH_REPLICAS, err
        assert produce(cluster.bootstrap, "cfg", 0, b"acks=1", acks="1") is None
    finally:
        cluster.brokers[c].start()
    wait_for("the ISR whole again", lambda: len(cluster.partition_states("cfg")[0].isrs) == 3, timeout=60)
    assert produce(cluster.bootstrap, "cfg", 0, b"all three") is None
    # the restarted broker read the topic's configs afresh
    assert described(kadmin, c, TOPIC, "cfg")["max.message.bytes"][0] == "1000"


def _segments(cluster: Cluster, broker: int, topic: str, partition: int) -> list[str]:
    path = cluster.brokers[broker].log_dir / f"{topic}-{partition}"
    return sorted(f for f in os.listdir(path) if f.endswith(".log")) if path.is_dir() else []


def _earliest(bootstrap: str, topic: str, partition: int) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "earliest"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[0]
    finally:
        c.close()


def test_retention_lowered_through_one_broker_deletes_old_segments_on_the_others(cluster, kadmin):
    cluster.create_topic("aged", 1, 3, {"segment.bytes": str(1024 * 1024)})
    b, a, c = roles(cluster, "aged", 0)
    hour_ago = int(time.time() * 1000) - 3600_000
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(320):                     # 3.2 MB: three full segments of 99 records and an active one
        p.produce("aged", bytes([i % 251]) * 10_000, partition=0, timestamp=hour_ago + i)
    assert p.flush(60) == 0
    for broker in range(3):
        wait_for(f"four segments on broker {broker}", lambda x=broker: len(_segments(cluster, x, "aged", 0)) >= 4,
                 timeout=30)
    assert _earliest(cluster.bootstrap, "aged", 0) == 0
    alter(kadmin, a, TOPIC, "aged", {"retention.ms": "60000"})
    for broker in (b, c, a):                 # the leader first, then the followers
        wait_for(f"broker {broker} down to its active segment",
                 lambda x=broker: len(_segments(cluster, x, "aged", 0)) == 1, timeout=20)
    assert _earliest(cluster.bootstrap, "aged", 0) > 0
    assert described(kadmin, b, TOPIC, "aged")["retention.ms"][0] == "60000"


def test_the_default_broker_layer_altered_through_one_broker_reaches_every_broker(cluster, kadmin):
    cluster.create_topic("plain", 1, 3)
    b, a, c = roles(cluster, "plain", 0)
    dynamic_default = 3       # DescribeConfigs' DYNAMIC_DEFAULT_BROKER_CONFIG
    alter(kadmin, a, BROKER, "", {"message.max.bytes": "2000"})
    try:
        for broker in range(3):
            wait_for(f"broker {broker} describing message.max.bytes=2000",
                     lambda x=broker: described(kadmin, x, BROKER, str(x))["message.max.bytes"]
                     == ("2000", dynamic_default), timeout=15)
        # a topic without its own max.message.bytes inherits the broker's on its leader B
        wait_for(f"broker {b} inheriting it for the topic",
                 lambda: described(kadmin, b, TOPIC, "plain")["max.message.bytes"][0] == "2000", timeout=15)
        err = produce(cluster.bootstrap, "plain", 0, b"y" * 5000)
        assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
    finally:
        alter(kadmin, a, BROKER, "", {"message.max.bytes": None})
    wait_for(f"broker {b} back to the static default",
             lambda: described(kadmin, b, BROKER, str(b))["message.max.bytes"][0] == "1048588", timeout=15)
    assert produce(cluster.bootstrap, "plain", 0, b"y" * 5000) is None


def test_a_recorded_value_that_cannot_apply_is_logged_and_defaulted_on_every_broker(cluster, kadmin):
    """Issue 26: config nodes written by another writer (an older broker, a tool) with values no log can
    take reach every broker through the notification: each logs a WARNING naming the key, value,
    entity and reason, uses the default for it and applies the rest; a restart reads them again and
    the broker starts."""
    from odradek.cluster.config_changes import broker_entity, topic_entity, write_configs

    cluster.create_topic("stored-bad", 1, 3)
    b, a, c = roles(cluster, "stored-bad", 0)
    store = cluster._zookeeper_store()
    marks = [broker.log_size() for broker in cluster.brokers]
    write_configs(store, {broker_entity(None): {"log.roll.ms": "-5", "message.max.bytes": "3000"},
                          topic_entity("stored-bad"): {"segment.index.bytes": "2", "max.message.bytes": "2500"}})
    try:
        for x in range(3):
            wait_for(f"broker {x} applying message.max.bytes=3000",
                     lambda x=x: described(kadmin, x, BROKER, str(x))["message.max.bytes"][0] == "3000", timeout=15)
        wait_for(f"broker {b} applying max.message.bytes=2500 to the topic",
                 lambda: described(kadmin, b, TOPIC, "stored-bad")["max.message.bytes"][0] == "2500", timeout=15)
        topic = described(kadmin, b, TOPIC, "stored-bad")
        assert topic["segment.index.bytes"][0] == "10485760"
        for x, broker in enumerate(cluster.brokers):
            assert described(kadmin, x, BROKER, str(x))["log.roll.ms"][0] is None
            lines = [line for line in broker.log_text(marks[x]).splitlines() if "ignoring the stored config" in line]
            (line,) = [line for line in lines if " log.roll.ms='-5'" in line]
            assert "WARNING" in line and "the cluster default broker" in line and "at least 1" in line
        leader_lines = cluster.brokers[b].log_text(marks[b])
        assert "segment.index.bytes='2' of topic stored-bad" in leader_lines
        err = produce(cluster.bootstrap, "stored-bad", 0, b"y" * 2600)
        assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
        assert produce(cluster.bootstrap, "stored-bad", 0, b"y" * 100) is None
        # the restarted leader reads the same nodes at start
        cluster.brokers[b].restart()
        wait_for("every broker registered again", lambda: len(cluster.metadata().brokers) == 3)
        wait_for(f"broker {b} describing the topic again",
                 lambda: described(kadmin, b, TOPIC, "stored-bad")["max.message.bytes"][0] == "2500", timeout=30)
    finally:
        write_configs(store, {broker_entity(None): {}, topic_entity("stored-bad"): {}})
    for x in range(3):
        wait_for(f"broker {x} back to message.max.bytes 1048588",
                 lambda x=x: described(kadmin, x, BROKER, str(x))["message.max.bytes"][0] == "1048588", timeout=15)
