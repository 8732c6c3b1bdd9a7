"""Topic administration on a real broker: CreateTopics, DeleteTopics, CreatePartitions,
DescribeTopicPartitions and DescribeCluster, driven by confluent-kafka's AdminClient, kafka-python's
KafkaAdminClient and kcat."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import kafka.errors as kerr
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic, ResourceType
from kafka.admin import KafkaAdminClient

from .clients import Msg, confluent_config, consume_confluent, kcat_path, produce_confluent, wait_until

BROKER_OVERRIDES = {"num.partitions": "2"}


def outcome(futures: dict) -> dict:
    """{key: None on success, else the KafkaError}."""
    out = {}
    for key, f in futures.items():
        try:
            f.result(timeout=20)
            out[key] = None
        except KafkaException as e:
            out[key] = e.args[0]
    return out


def partition_count(admin, topic: str) -> int | None:
    t = admin.list_topics(topic=None, timeout=10).topics.get(topic)
    return None if t is None else len(t.partitions)


def kcat_metadata(bootstrap: str) -> dict:
    r = subprocess.run([kcat_path(), "-b", bootstrap, "-L", "-J"], capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return json.loads(r.stdout)


# ------------------------------------------------------------------------------------------ CreateTopics
def test_create_topics_with_configs_and_broker_defaults(broker, admin):
    res = outcome(admin.create_topics([
        NewTopic("ct-a", 3, 1, config={"retention.ms": "3600000", "cleanup.policy": "compact,delete"}),
        NewTopic("ct-b"),                       # -1 / -1: num.partitions (2) and default.replication.factor
    ]))
    assert res == {"ct-a": None, "ct-b": None}
    assert partition_count(admin, "ct-a") == 3
    assert partition_count(admin, "ct-b") == 2
    cfg = admin.describe_configs([ConfigResource(ResourceType.TOPIC, "ct-a")])
    entries = next(iter(cfg.values())).result(timeout=10)
    assert entries["retention.ms"].value == "3600000"
    assert entries["retention.ms"].source == 1                        # DYNAMIC_TOPIC_CONFIG
    assert entries["cleanup.policy"].value == "compact,delete"
    assert entries["segment.bytes"].source in (4, 5)                  # from the broker
    # The partitions exist on disk and take records at once.
    produce_confluent(broker.bootstrap, "ct-a", [Msg(b"k", b"v", partition=2)])
    assert [r.value for r in consume_confluent(broker.bootstrap, "ct-a", [2])] == [b"v"]


def test_create_topics_v7_response_with_configs_kafka_python(kadmin):
    result = kadmin.create_topics({"ct-kp": {"num_partitions": 2, "replication_factor": 1,
                                             "configs": {"max.message.bytes": "12345"}}})
    (topic,) = result["topics"]
    assert topic["name"] == "ct-kp" and topic["error_code"] == 0
    assert topic["num_partitions"] == 2 and topic["replication_factor"] == 1
    assert uuid.UUID(str(topic["topic_id"])).int != 0
    assert topic["configs"]["max.message.bytes"]["value"] == "12345"
    assert topic["configs"]["max.message.bytes"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    assert topic["configs"]["retention.ms"]["config_source"] in ("DEFAULT_CONFIG", "STATIC_BROKER_CONFIG")
    described = {t["name"]: t for t in kadmin.describe_topics(["ct-kp"])}
    assert str(described["ct-kp"]["topic_id"]) == str(topic["topic_id"])


def test_create_topics_validate_only(admin, kadmin):
    assert outcome(admin.create_topics([NewTopic("ct-v", 4, 1)], validate_only=True)) == {"ct-v": None}
    assert partition_count(admin, "ct-v") is None
    bad = outcome(admin.create_topics([NewTopic("ct-v", 1, 1, config={"retention.ms": "soon"})],
                                      validate_only=True))
    assert bad["ct-v"].code() == KafkaError.INVALID_CONFIG
    # v5+: a validated topic still reports its partitions, replication factor and configs.
    result = kadmin.create_topics({"ct-v2": {"num_partitions": 5}}, validate_only=True)
    (topic,) = result["topics"]
    assert (topic["error_code"], topic["num_partitions"], topic["replication_factor"]) == (0, 5, 1)
    assert "retention.ms" in topic["configs"]
    assert "ct-v2" not in kadmin.list_topics()


def test_create_topics_errors(admin):
    admin.create_topics([NewTopic("ct-exists", 1, 1)])["ct-exists"].result(timeout=10)
    admin.create_topics([NewTopic("ct_dot", 1, 1)])["ct_dot"].result(timeout=10)
    res = outcome(admin.create_topics([
        NewTopic("ct-exists", 1, 1),
        NewTopic("ct bad", 1, 1),
        NewTopic("ct.dot", 1, 1),
        NewTopic("ct-badcfg", 1, 1, config={"retention.ms": "x"}),
        NewTopic("ct-unknowncfg", 1, 1, config={"no.such.config": "1"}),
        NewTopic("ct-rf", 1, 3),
    ]))
    assert res["ct-exists"].code() == KafkaError.TOPIC_ALREADY_EXISTS
    assert "already exists" in res["ct-exists"].str()
    assert res["ct bad"].code() == KafkaError.TOPIC_EXCEPTION
    assert res["ct.dot"].code() == KafkaError.TOPIC_EXCEPTION and "collides" in res["ct.dot"].str()
    assert res["ct-badcfg"].code() == KafkaError.INVALID_CONFIG and "retention.ms" in res["ct-badcfg"].str()
    assert res["ct-unknowncfg"].code() == KafkaError.INVALID_CONFIG
    assert "Unknown topic config name: no.such.config" in res["ct-unknowncfg"].str()
    assert res["ct-rf"].code() == KafkaError.INVALID_REPLICATION_FACTOR
    assert "only 1 broker(s) are registered" in res["ct-rf"].str()
    for name in ("ct bad", "ct.dot", "ct-badcfg", "ct-unknowncfg", "ct-rf"):
        assert partition_count(admin, name) is None


def test_create_topics_with_replica_assignment(admin):
    # librdkafka wants the partition count next to an assignment but sends -1 / -1 on the wire, as Kafka requires.
    res = outcome(admin.create_topics([
        NewTopic("ct-assigned", 3, replica_assignment=[[0], [0], [0]]),
        NewTopic("ct-unknown-broker", 2, replica_assignment=[[0], [7]]),
        NewTopic("ct-twice", 1, replica_assignment=[[0, 0]]),
    ]))
    assert res["ct-assigned"] is None
    assert partition_count(admin, "ct-assigned") == 3
    assert res["ct-unknown-broker"].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert "broker 7" in res["ct-unknown-broker"].str()
    assert res["ct-twice"].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert "more than once" in res["ct-twice"].str()


def test_create_topics_errors_kafka_python(kadmin):
    kadmin.create_topics(["ct-kp-dup"])
    with pytest.raises(kerr.TopicAlreadyExistsError):
        kadmin.create_topics(["ct-kp-dup"])
    result = kadmin.create_topics({"ct-kp-gap": {"assignments": {0: [0], 2: [0]}}}, raise_errors=False)
    (topic,) = result["topics"]
    assert topic["error_code"] == kerr.InvalidReplicationAssignmentError.errno
    assert topic["error_message"] == "partitions should be a consecutive 0-based integer sequence"
    result = kadmin.create_topics({"ct-kp-both": {"num_partitions": 2, "assignments": {0: [0]}}},
                                  raise_errors=False)
    assert result["topics"][0]["error_code"] == kerr.InvalidRequestError.errno


# ------------------------------------------------------------------------------------------ DeleteTopics
def test_delete_topics_by_name(broker, admin):
    admin.create_topics([NewTopic("dt-a", 2, 1)])["dt-a"].result(timeout=10)
    produce_confluent(broker.bootstrap, "dt-a", [Msg(b"k", b"old", partition=0)])
    assert os.path.isdir(broker.log_dir / "dt-a-0")
    res = outcome(admin.delete_topics(["dt-a", "dt-missing"]))
    assert res["dt-a"] is None
    assert res["dt-missing"].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert partition_count(admin, "dt-a") is None
    assert not os.path.exists(broker.log_dir / "dt-a-0") and not os.path.exists(broker.log_dir / "dt-a-1")
    # The name can be used again, for a new and empty topic.
    admin.create_topics([NewTopic("dt-a", 1, 1)])["dt-a"].result(timeout=10)
    assert consume_confluent(broker.bootstrap, "dt-a", [0]) == []


def test_delete_topics_by_id_kafka_python(kadmin):
    kadmin.create_topics({"dt-id": {"num_partitions": 1}})
    (info,) = kadmin.describe_topics(["dt-id"])
    topic_id = uuid.UUID(str(info["topic_id"]))
    result = kadmin.delete_topics([topic_id])
    (deleted,) = result["topics"]
    assert (deleted["name"], str(deleted["topic_id"]), deleted["error_code"]) == ("dt-id", str(topic_id), 0)
    assert "dt-id" not in kadmin.list_topics()
    with pytest.raises(kerr.UnknownTopicIdError):
        kadmin.delete_topics([uuid.uuid4()])
    with pytest.raises(kerr.UnknownTopicOrPartitionError):
        kadmin.delete_topics(["dt-id"])


def test_delete_topics_disabled(broker_factory):
    b = broker_factory(delete_topic_enable="false")
    a = AdminClient(confluent_config(b.bootstrap))
    a.create_topics([NewTopic("keep", 1, 1)])["keep"].result(timeout=10)
    res = outcome(a.delete_topics(["keep"]))
    assert res["keep"].code() == KafkaError.TOPIC_DELETION_DISABLED
    assert partition_count(a, "keep") == 1


# ------------------------------------------------------------------------------------------ CreatePartitions
def test_create_partitions(broker, admin):
    admin.create_topics([NewTopic("cp-a", 2, 1)])["cp-a"].result(timeout=10)
    assert outcome(admin.create_partitions([NewPartitions("cp-a", 6)], validate_only=True)) == {"cp-a": None}
    assert partition_count(admin, "cp-a") == 2
    assert outcome(admin.create_partitions([NewPartitions("cp-a", 4)])) == {"cp-a": None}
    assert partition_count(admin, "cp-a") == 4
    produce_confluent(broker.bootstrap, "cp-a", [Msg(b"k", b"in-3", partition=3)])
    assert [r.value for r in consume_confluent(broker.bootstrap, "cp-a", [3])] == [b"in-3"]
    assert outcome(admin.create_partitions([NewPartitions("cp-a", 5, replica_assignment=[[0]])])) == {"cp-a": None}
    assert partition_count(admin, "cp-a") == 5
    res = outcome(admin.create_partitions([NewPartitions("cp-a", 3)]))
    assert res["cp-a"].code() == KafkaError.INVALID_PARTITIONS and "would not be an increase" in res["cp-a"].str()
    res = outcome(admin.create_partitions([NewPartitions("cp-a", 5)]))
    assert res["cp-a"].code() == KafkaError.INVALID_PARTITIONS and "already has 5" in res["cp-a"].str()
    res = outcome(admin.create_partitions([NewPartitions("cp-a", 7, replica_assignment=[[0]])]))
    assert res["cp-a"].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    res = outcome(admin.create_partitions([NewPartitions("cp-a", 6, replica_assignment=[[3]])]))
    assert res["cp-a"].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT and "broker 3" in res["cp-a"].str()
    res = outcome(admin.create_partitions([NewPartitions("cp-missing", 3)]))
    assert res["cp-missing"].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert partition_count(admin, "cp-a") == 5


def test_create_partitions_kafka_python_and_kcat(broker, kadmin):
    kadmin.create_topics({"cp-kp": {"num_partitions": 1}})
    kadmin.create_partitions({"cp-kp": 3})
    kadmin.create_partitions({"cp-kp": {"count": 4, "assignments": [[0]]}})
    with pytest.raises(kerr.InvalidPartitionsError):
        kadmin.create_partitions({"cp-kp": 2})
    topics = {t["topic"]: t for t in kcat_metadata(broker.bootstrap)["topics"]}
    assert sorted(p["partition"] for p in topics["cp-kp"]["partitions"]) == [0, 1, 2, 3]
    assert all(p["leader"] == 0 for p in topics["cp-kp"]["partitions"])


# ------------------------------------------------------------------------------------------ describe
def test_describe_topics_confluent(admin):
    admin.create_topics([NewTopic("desc-a", 3, 1)])["desc-a"].result(timeout=10)
    fut = admin.describe_topics(TopicCollection(["desc-a"]), include_authorized_operations=True)
    desc = fut["desc-a"].result(timeout=10)
    assert desc.name == "desc-a" and not desc.is_internal
    assert [p.id for p in desc.partitions] == [0, 1, 2]
    assert all(p.leader.id == 0 and [r.id for r in p.isr] == [0] for p in desc.partitions)


def test_describe_topic_partitions_pages_with_a_cursor(kadmin):
    kadmin.create_topics({"dtp-a": {"num_partitions": 3}, "dtp-b": {"num_partitions": 2}})
    seen, cursor, pages = [], None, 0
    while True:
        page = kadmin.describe_topic_partitions(["dtp-b", "dtp-a"], response_partition_limit=2, cursor=cursor)
        pages += 1
        for t in page["topics"]:
            assert t["error_code"] == 0 and t["topic_authorized_operations"] > 0
            seen += [(t["name"], p["partition_index"], p["leader_id"]) for p in t["partitions"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
        assert pages < 10
    assert seen == [("dtp-a", 0, 0), ("dtp-a", 1, 0), ("dtp-a", 2, 0), ("dtp-b", 0, 0), ("dtp-b", 1, 0)]
    assert pages == 3
    first = kadmin.describe_topic_partitions(["dtp-a", "dtp-b"], response_partition_limit=2)
    assert first["next_cursor"] == {"topic_name": "dtp-a", "partition_index": 2}
    missing = kadmin.describe_topic_partitions(["dtp-missing"])
    assert [(t["name"], t["error_code"]) for t in missing["topics"]] == [("dtp-missing", 3)]


def test_describe_cluster(broker, admin, kadmin):
    # kafka-python sends DescribeCluster (v2, with authorized operations); librdkafka answers
    # describe_cluster from a Metadata request, so it checks that both agree.
    kp = kadmin.describe_cluster()
    assert kp["controller_id"] == 0 and len(kp["cluster_id"]) == 22
    assert [(b["broker_id"], b["host"], b["port"], b["is_fenced"]) for b in kp["brokers"]] == \
        [(0, "127.0.0.1", broker.port, False)]
    assert set(kp["authorized_operations"]) == {"CREATE", "ALTER", "DESCRIBE", "CLUSTER_ACTION",
                                                "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE"}
    desc = admin.describe_cluster().result(timeout=10)
    assert desc.controller.id == 0 and desc.cluster_id == kp["cluster_id"]
    assert [(n.id, n.host, n.port) for n in desc.nodes] == [(0, "127.0.0.1", broker.port)]
    assert kcat_metadata(broker.bootstrap)["controllerid"] == 0


def test_kcat_sees_admin_changes(broker, admin):
    admin.create_topics([NewTopic("kc-a", 2, 1)])["kc-a"].result(timeout=10)
    admin.create_partitions([NewPartitions("kc-a", 3)])["kc-a"].result(timeout=10)
    wait_until(lambda: {t["topic"]: len(t["partitions"]) for t in kcat_metadata(broker.bootstrap)["topics"]}
               .get("kc-a") == 3, 10, "kcat to see 3 partitions of kc-a")
    admin.delete_topics(["kc-a"])["kc-a"].result(timeout=10)
    assert "kc-a" not in {t["topic"] for t in kcat_metadata(broker.bootstrap)["topics"]}
