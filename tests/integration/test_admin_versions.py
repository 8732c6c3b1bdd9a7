"""Every version of the admin APIs, encoded and decoded by kafka-python's own protocol classes (not
ours), against a real broker: the fields each version adds are there and mean what Kafka says."""

from __future__ import annotations

import uuid

import kafka.errors as kerr
import pytest
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import (
    AlterConfigsRequest, CreatePartitionsRequest, CreateTopicsRequest, DeleteRecordsRequest, DeleteTopicsRequest,
    DescribeClusterRequest, DescribeConfigsRequest, DescribeLogDirsRequest, IncrementalAlterConfigsRequest,
)

from .clients import Msg, produce_confluent

TOPIC, BROKER = 2, 4
TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5
LONG = 5


def send(kadmin, request_class, version: int, **fields):
    request = request_class(**fields, min_version=version, max_version=version)

    async def call():
        return await kadmin._manager.send(request, node_id=0)
    return kadmin._manager.run(call)


def create_topic(kadmin, name: str, partitions: int = 1) -> None:
    kadmin.create_topics({name: {"num_partitions": partitions}})


@pytest.mark.parametrize("version", range(8))
def test_create_topics(kadmin, version):
    T = CreateTopicsRequest.CreatableTopic
    topic = T(name=f"v-ct-{version}", num_partitions=2, replication_factor=1,
              configs=[T.CreatableTopicConfig(name="retention.ms", value="90000")])
    extra = {"validate_only": False} if version >= 1 else {}
    (r,) = send(kadmin, CreateTopicsRequest, version, topics=[topic], timeout_ms=10000, **extra).topics
    assert (r.name, r.error_code) == (f"v-ct-{version}", 0)
    if version >= 1:
        assert r.error_message is None
    if version >= 5:
        assert (r.num_partitions, r.replication_factor) == (2, 1)
        configs = {c.name: (c.value, c.config_source, c.read_only, c.is_sensitive) for c in r.configs}
        assert configs["retention.ms"] == ("90000", TOPIC_CONFIG, False, False)
        assert configs["segment.ms"][1] == DEFAULT_CONFIG
    if version >= 7:
        assert r.topic_id != uuid.UUID(int=0)
    (again,) = send(kadmin, CreateTopicsRequest, version, topics=[topic], timeout_ms=10000, **extra).topics
    assert again.error_code == kerr.TopicAlreadyExistsError.errno
    if version >= 1:
        assert again.error_message == f"Topic 'v-ct-{version}' already exists."
        (checked,) = send(kadmin, CreateTopicsRequest, version, topics=[T(name=f"v-ct-{version}-vo", num_partitions=3,
                                                                          replication_factor=1)],
                          timeout_ms=10000, validate_only=True).topics
        assert checked.error_code == 0
        assert f"v-ct-{version}-vo" not in kadmin.list_topics()


@pytest.mark.parametrize("version", range(7))
def test_delete_topics(kadmin, version):
    name = f"v-dt-{version}"
    create_topic(kadmin, name)
    if version >= 6:
        fields = {"topics": [DeleteTopicsRequest.DeleteTopicState(name=name), DeleteTopicsRequest.DeleteTopicState(
            topic_id=uuid.uuid4())]}
    else:
        fields = {"topic_names": [name, f"{name}-missing"]}
    results = send(kadmin, DeleteTopicsRequest, version, timeout_ms=10000, **fields).responses
    assert [r.error_code for r in results] == [0, kerr.UnknownTopicIdError.errno if version >= 6
                                               else kerr.UnknownTopicOrPartitionError.errno]
    assert results[0].name == name
    if version >= 5:
        assert results[0].error_message is None and results[1].error_message
    assert name not in kadmin.list_topics()


@pytest.mark.parametrize("version", range(4))
def test_create_partitions(kadmin, version):
    name = f"v-cp-{version}"
    create_topic(kadmin, name)
    P = CreatePartitionsRequest.CreatePartitionsTopic
    results = send(kadmin, CreatePartitionsRequest, version, timeout_ms=10000, validate_only=False,
                   topics=[P(name=name, count=3, assignments=None), P(name=f"{name}-x", count=2, assignments=None)]
                   ).results
    assert [(r.name, r.error_code) for r in results] == [
        (name, 0), (f"{name}-x", kerr.UnknownTopicOrPartitionError.errno)]
    (t,) = kadmin.describe_topics([name])
    assert len(t["partitions"]) == 3


@pytest.mark.parametrize("version", range(5))
def test_describe_configs(kadmin, version):
    name = f"v-dc-{version}"
    kadmin.create_topics({name: {"num_partitions": 1, "configs": {"retention.ms": "90000"}}})
    extra = {}
    if version >= 1:
        extra["include_synonyms"] = True
    if version >= 3:
        extra["include_documentation"] = True
    (r,) = send(kadmin, DescribeConfigsRequest, version, resources=[(TOPIC, name, ["retention.ms", "segment.ms"])],
                **extra).results
    assert (r.error_code, r.resource_name) == (0, name)
    configs = {c.name: c for c in r.configs}
    assert set(configs) == {"retention.ms", "segment.ms"} and configs["retention.ms"].value == "90000"
    if version == 0:
        assert not configs["retention.ms"].is_default and configs["segment.ms"].is_default
    else:
        assert (configs["retention.ms"].config_source, configs["segment.ms"].config_source) == (TOPIC_CONFIG,
                                                                                               DEFAULT_CONFIG)
        assert [s.name for s in configs["retention.ms"].synonyms][:1] == ["retention.ms"]
    if version >= 3:
        assert configs["retention.ms"].config_type == LONG and configs["retention.ms"].documentation


@pytest.mark.parametrize("version", range(3))
def test_alter_configs(kadmin, version):
    name = f"v-ac-{version}"
    create_topic(kadmin, name)
    results = send(kadmin, AlterConfigsRequest, version, validate_only=False,
                   resources=[(TOPIC, name, [("retention.ms", "70000")]), (TOPIC, "v-ac-missing", [])]).responses
    assert [(r.resource_name, r.error_code) for r in results] == [
        (name, 0), ("v-ac-missing", kerr.UnknownTopicOrPartitionError.errno)]
    assert results[1].error_message == "The topic 'v-ac-missing' does not exist."
    configs = kadmin.describe_configs([_topic_resource(name)])["topic"][name]
    assert configs["retention.ms"]["value"] == "70000"
    results = send(kadmin, AlterConfigsRequest, version, validate_only=False, resources=[
        (TOPIC, name, [("retention.ms", None)]), (TOPIC, "v-ac-other", [("a", "1"), ("a", "2")])]).responses
    assert [(r.error_code, r.error_message) for r in results] == [
        (kerr.InvalidRequestError.errno, "Null value not supported for : retention.ms"),
        (kerr.InvalidRequestError.errno, "Error due to duplicate config keys")]


@pytest.mark.parametrize("version", range(2))
def test_incremental_alter_configs(kadmin, version):
    name = f"v-iac-{version}"
    create_topic(kadmin, name)
    results = send(kadmin, IncrementalAlterConfigsRequest, version, validate_only=False, resources=[
        (TOPIC, name, [("cleanup.policy", 2, "compact"), ("retention.ms", 0, "80000")]),
        (TOPIC, name, [("retention.ms", 1, None)]),
    ]).responses
    assert [(r.error_code, r.error_message) for r in results] == [
        (kerr.InvalidRequestError.errno, "Each resource must appear at most once.")] * 2
    (r,) = send(kadmin, IncrementalAlterConfigsRequest, version, validate_only=False, resources=[
        (TOPIC, name, [("cleanup.policy", 2, "compact"), ("retention.ms", 0, "80000")])]).responses
    assert r.error_code == 0
    configs = kadmin.describe_configs([_topic_resource(name)])["topic"][name]
    assert configs["cleanup.policy"]["value"] == "delete,compact" and configs["retention.ms"]["value"] == "80000"


@pytest.mark.parametrize("version", range(3))
def test_delete_records(broker, kadmin, version):
    name = f"v-dr-{version}"
    create_topic(kadmin, name)
    produce_confluent(broker.bootstrap, name, [Msg(None, b"x", partition=0)] * 5)
    (t,) = send(kadmin, DeleteRecordsRequest, version, timeout_ms=10000, topics=[(name, [(0, 3)])]).topics
    (p,) = t.partitions
    assert (p.partition_index, p.error_code, p.low_watermark) == (0, 0, 3)


@pytest.mark.parametrize("version", range(6))
def test_describe_log_dirs(broker, kadmin, version):
    name = f"v-ld-{version}"
    create_topic(kadmin, name, 2)
    response = send(kadmin, DescribeLogDirsRequest, version, topics=[(name, [1])])
    if version >= 3:
        assert response.error_code == 0
    (d,) = response.results
    assert d.error_code == 0 and [(t.name, [p.partition_index for p in t.partitions]) for t in d.topics] == [
        (name, [1])]
    if version >= 4:
        assert 0 < d.usable_bytes <= d.total_bytes
    if version >= 5:
        assert d.is_cordoned is False


@pytest.mark.parametrize("version", range(3))
def test_describe_cluster(broker, kadmin, version):
    r = send(kadmin, DescribeClusterRequest, version, include_cluster_authorized_operations=False)
    assert (r.error_code, r.controller_id, [(b.broker_id, b.port) for b in r.brokers]) == (0, 0, [(0, broker.port)])
    assert r.to_dict()["authorized_operations"] in (-2147483648, None, [], set())  # not asked for
    if version >= 1:
        assert r.endpoint_type == 1
        wrong = send(kadmin, DescribeClusterRequest, version, include_cluster_authorized_operations=False,
                     endpoint_type=2)
        assert wrong.error_code == kerr.for_code(114).errno and "CONTROLLER" in wrong.error_message


def _topic_resource(name: str):
    from kafka.admin import ConfigResource, ConfigResourceType
    return ConfigResource(ConfigResourceType.TOPIC, name)
