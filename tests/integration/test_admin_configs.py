"""Configs on a real broker: DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics,
brokers (per broker and the cluster default) and broker loggers, through confluent-kafka's AdminClient
and kafka-python's KafkaAdminClient; changes take effect on the running broker and survive a restart."""

from __future__ import annotations

import kafka.errors as kerr
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, NewTopic, ResourceType,
)
from kafka.admin import AlterConfigOp, ConfigResourceType, KafkaAdminClient
from kafka.admin import ConfigResource as KConfigResource
from kafka.protocol.admin import DescribeConfigsRequest, IncrementalAlterConfigsRequest

from .clients import Msg, confluent_config, confluent_consumer, produce_confluent, wait_until

BROKER_OVERRIDES = {"log.retention.hours": "100", "log.retention.check.interval.ms": "200",
                    "log.segment.delete.delay.ms": "0"}
MS_100_HOURS = str(100 * 3_600_000)


def kp_send(kadmin, request):
    """Send one request with kafka-python's encoder (for what its admin API cannot ask, such as the
    cluster-default broker resource "")."""
    async def call():
        return await kadmin._manager.send(request, node_id=0)
    return kadmin._manager.run(call)


def create(admin, name: str, partitions: int = 1, **config) -> None:
    admin.create_topics([NewTopic(name, partitions, 1, config=config)])[name].result(timeout=10)


def describe(admin, kind, name: str) -> dict:
    return next(iter(admin.describe_configs([ConfigResource(kind, name)]).values())).result(timeout=10)


def outcome(future_map: dict):
    (f,) = future_map.values()
    try:
        f.result(timeout=20)
        return None
    except KafkaException as e:
        return e.args[0]


def incremental(admin, kind, name: str, *ops: tuple[str, str | None, AlterConfigOpType], validate_only=False):
    entries = [ConfigEntry(k, v, incremental_operation=op) for k, v, op in ops]
    return outcome(admin.incremental_alter_configs([ConfigResource(kind, name, incremental_configs=entries)],
                                                   validate_only=validate_only))


def produce_sizes(bootstrap: str, topic: str, sizes: list[int]) -> list:
    """One batch per record (max.message.bytes limits a batch), the error code of each."""
    acks = produce_confluent(bootstrap, topic, [Msg(None, b"x" * n) for n in sizes], raise_errors=False,
                             flush_each=True)
    return [a.error.code() if a.error is not None else None for a in acks]


# ------------------------------------------------------------------------------------------ DescribeConfigs
def test_describe_topic_configs_sources_and_synonyms(admin):
    create(admin, "dc-a", **{"retention.ms": "60000"})
    create(admin, "dc-b")
    a = describe(admin, ResourceType.TOPIC, "dc-a")
    assert a["retention.ms"].value == "60000" and a["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert list(a["retention.ms"].synonyms) == ["retention.ms", "log.retention.hours"]  # a dict: by name
    b = describe(admin, ResourceType.TOPIC, "dc-b")
    assert b["retention.ms"].value == MS_100_HOURS
    assert b["retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert b["cleanup.policy"].value == "delete" and b["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
    assert not b["retention.ms"].is_read_only
    missing = admin.describe_configs([ConfigResource(ResourceType.TOPIC, "dc-missing")])
    with pytest.raises(KafkaException) as e:
        next(iter(missing.values())).result(timeout=10)
    assert e.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_describe_broker_configs(admin):
    cfg = describe(admin, ResourceType.BROKER, "0")
    assert cfg["log.retention.hours"].value == "100"
    assert cfg["log.retention.hours"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert cfg["num.partitions"].source == ConfigSource.DEFAULT_CONFIG.value
    assert cfg["log.dirs"].is_read_only and not cfg["log.retention.ms"].is_read_only
    assert cfg["ssl.keystore.password"].is_sensitive and cfg["ssl.keystore.password"].value is None


def test_describe_configs_kafka_python(kadmin):
    kadmin.create_topics({"dc-kp": {"num_partitions": 1, "configs": {"retention.ms": "60000"}}})
    result = kadmin.describe_configs([KConfigResource(ConfigResourceType.TOPIC, "dc-kp")], include_synonyms=True,
                                     config_filter="all")
    configs = result["topic"]["dc-kp"]
    assert configs["retention.ms"]["value"] == "60000"
    assert configs["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    assert [(s["name"], s["value"], s["source"]) for s in configs["retention.ms"]["synonyms"]] == [
        ("retention.ms", "60000", "DYNAMIC_TOPIC_CONFIG"),
        ("log.retention.hours", "100", "STATIC_BROKER_CONFIG"),
        ("log.retention.hours", "168", "DEFAULT_CONFIG")]
    assert configs["segment.ms"]["config_source"] == "DEFAULT_CONFIG"
    # Another broker's id is refused by this one (librdkafka would send it to broker 7 itself).
    (other,) = kp_send(kadmin, DescribeConfigsRequest(resources=[(4, "7", None)])).results
    assert other.error_code == kerr.InvalidRequestError.errno
    assert other.error_message == "Unexpected broker id, expected 0 or empty string, but received 7"
    # Version 0 has no sources: is_default says whether the topic overrides the value.
    (v0,) = kp_send(kadmin, DescribeConfigsRequest(resources=[(2, "dc-kp", ["retention.ms", "segment.ms"])],
                                                   min_version=0, max_version=0)).results
    assert {c.name: (c.value, c.is_default) for c in v0.configs} == {
        "retention.ms": ("60000", False), "segment.ms": ("604800000", True)}
    everything = kadmin.describe_configs([KConfigResource(ConfigResourceType.BROKER, "0", {"num.partitions": None})],
                                         config_filter="all")
    assert everything["broker"]["0"]["num.partitions"]["value"] == "1"
    assert set(everything["broker"]["0"]) == {"num.partitions"}


# ------------------------------------------------------------------------------------------ topic changes
def test_alter_topic_config_takes_effect_without_restart(broker, admin):
    create(admin, "ac-size", **{"retention.ms": "60000"})
    assert produce_sizes(broker.bootstrap, "ac-size", [5000]) == [None]
    # AlterConfigs replaces the whole set: retention.ms goes back to the broker's value.
    res = outcome(admin.alter_configs([ConfigResource(ResourceType.TOPIC, "ac-size",
                                                      set_config={"max.message.bytes": "2000"})]))
    assert res is None
    cfg = describe(admin, ResourceType.TOPIC, "ac-size")
    assert cfg["max.message.bytes"].value == "2000" and cfg["retention.ms"].value == MS_100_HOURS
    assert produce_sizes(broker.bootstrap, "ac-size", [5000, 500]) == [KafkaError.MSG_SIZE_TOO_LARGE, None]
    assert incremental(admin, ResourceType.TOPIC, "ac-size", ("max.message.bytes", None, AlterConfigOpType.DELETE)) \
        is None
    assert produce_sizes(broker.bootstrap, "ac-size", [5000]) == [None]


def test_retention_change_takes_effect_without_restart(broker, admin):
    create(admin, "ac-retention", **{"segment.bytes": str(1024 * 1024)})
    produce_confluent(broker.bootstrap, "ac-retention", [Msg(None, bytes(100_000)) for _ in range(35)])
    c = confluent_consumer(broker.bootstrap)
    try:
        low, high = c.get_watermark_offsets(TopicPartition("ac-retention", 0), timeout=10)
        assert (low, high) == (0, 35)
        assert incremental(admin, ResourceType.TOPIC, "ac-retention",
                           ("retention.bytes", "1", AlterConfigOpType.SET)) is None
        low = wait_until(lambda: c.get_watermark_offsets(TopicPartition("ac-retention", 0), timeout=10)[0],
                         10, "retention to delete the old segments")
        assert 0 < low < 35
    finally:
        c.close()


def test_incremental_alter_configs_list_operations(admin):
    create(admin, "iac-a")
    topic = ResourceType.TOPIC
    assert incremental(admin, topic, "iac-a", ("cleanup.policy", "compact", AlterConfigOpType.APPEND)) is None
    assert describe(admin, topic, "iac-a")["cleanup.policy"].value == "delete,compact"
    assert incremental(admin, topic, "iac-a", ("cleanup.policy", "delete", AlterConfigOpType.SUBTRACT)) is None
    assert describe(admin, topic, "iac-a")["cleanup.policy"].value == "compact"
    err = incremental(admin, topic, "iac-a", ("retention.ms", "5", AlterConfigOpType.APPEND))
    assert err.code() == KafkaError.INVALID_CONFIG and "not LIST" in err.str()
    assert incremental(admin, topic, "iac-a", ("retention.ms", "5000", AlterConfigOpType.SET),
                       validate_only=True) is None
    assert describe(admin, topic, "iac-a")["retention.ms"].value == MS_100_HOURS
    err = incremental(admin, topic, "iac-a", ("retention.ms", "soon", AlterConfigOpType.SET))
    assert err.code() == KafkaError.INVALID_CONFIG and "retention.ms" in err.str()
    err = incremental(admin, topic, "iac-a", ("no.such.key", "1", AlterConfigOpType.SET))
    assert err.code() == KafkaError.INVALID_CONFIG and "Unknown topic config name: no.such.key" in err.str()
    err = incremental(admin, topic, "iac-missing", ("retention.ms", "1000", AlterConfigOpType.SET))
    assert err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_alter_topic_configs_kafka_python(kadmin):
    kadmin.create_topics({"ac-kp": {"num_partitions": 1}})
    resource = KConfigResource(ConfigResourceType.TOPIC, "ac-kp", {"retention.ms": "7200000"})
    assert kadmin.alter_configs([resource], incremental=False) == {"topic": {"ac-kp": "OK"}}
    resource = KConfigResource(ConfigResourceType.TOPIC, "ac-kp", {"segment.ms": (AlterConfigOp.SET, "600000")})
    assert kadmin.alter_configs([resource], incremental=True) == {"topic": {"ac-kp": "OK"}}
    configs = kadmin.describe_configs([KConfigResource(ConfigResourceType.TOPIC, "ac-kp")])["topic"]["ac-kp"]
    assert configs["retention.ms"]["value"] == "7200000" and configs["segment.ms"]["value"] == "600000"
    bad = KConfigResource(ConfigResourceType.TOPIC, "ac-kp", {"retention.ms": "later"})
    result = kadmin.alter_configs([bad], incremental=False, raise_on_unknown=False)
    assert result["topic"]["ac-kp"].endswith("Not a number of type LONG")


# ------------------------------------------------------------------------------------------ broker changes
def set_cluster_default(kadmin, name: str, value: str | None, op: int = 0) -> tuple[int, str | None]:
    """IncrementalAlterConfigs on the cluster-default broker resource ("")."""
    (r,) = kp_send(kadmin, IncrementalAlterConfigsRequest(resources=[(4, "", [(name, op, value)])],
                                                          validate_only=False)).responses
    return r.error_code, r.error_message


def describe_cluster_default(kadmin) -> dict:
    (r,) = kp_send(kadmin, DescribeConfigsRequest(resources=[(4, "", None)], include_synonyms=True)).results
    assert r.error_code == 0
    return {c.name: (c.value, c.config_source, [(s.name, s.source) for s in c.synonyms]) for c in r.configs}


def test_dynamic_broker_configs_apply_and_persist(broker_factory):
    b = broker_factory(log_retention_hours="100")
    a = AdminClient(confluent_config(b.bootstrap))
    k = KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=15000)
    try:
        create(a, "dyn")
        # Cluster-wide default: every broker, and every topic that does not override it.
        assert set_cluster_default(k, "log.retention.ms", "123456") == (0, None)
        assert describe_cluster_default(k) == {"log.retention.ms": ("123456", 3, [("log.retention.ms", 3)])}
        cfg = describe(a, ResourceType.BROKER, "0")
        assert cfg["log.retention.ms"].value == "123456"
        assert cfg["log.retention.ms"].source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
        topic = describe(a, ResourceType.TOPIC, "dyn")
        assert topic["retention.ms"].value == "123456"
        assert topic["retention.ms"].source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
        code, message = set_cluster_default(k, "listeners", "PLAINTEXT://:1")
        assert code == kerr.InvalidRequestError.errno and "Cannot update these configs" in message
        # Per broker: message.max.bytes is the default max.message.bytes of every topic, at once.
        assert produce_sizes(b.bootstrap, "dyn", [5000]) == [None]
        assert incremental(a, ResourceType.BROKER, "0", ("message.max.bytes", "3000", AlterConfigOpType.SET)) is None
        assert describe(a, ResourceType.BROKER, "0")["message.max.bytes"].source == \
            ConfigSource.DYNAMIC_BROKER_CONFIG.value
        assert produce_sizes(b.bootstrap, "dyn", [5000, 100]) == [KafkaError.MSG_SIZE_TOO_LARGE, None]
        # Kafka refuses what cannot change at run time, other brokers' ids and bad values.
        err = incremental(a, ResourceType.BROKER, "0", ("log.dirs", "/elsewhere", AlterConfigOpType.SET))
        assert err.code() == KafkaError.INVALID_REQUEST and "Cannot update these configs dynamically" in err.str()
        (r,) = kp_send(k, IncrementalAlterConfigsRequest(resources=[(4, "3", [("message.max.bytes", 0, "1")])],
                                                         validate_only=False)).responses
        assert (r.error_code, r.error_message) == (kerr.InvalidRequestError.errno,
                                                   "Unexpected broker id, expected 0, but received 3")
        err = incremental(a, ResourceType.BROKER, "0", ("log.cleaner.threads", "two", AlterConfigOpType.SET))
        assert err.code() == KafkaError.INVALID_REQUEST
    finally:
        k.close()
    # Both layers are in the metadata store: a restart keeps them.
    b.restart()
    a = AdminClient(confluent_config(b.bootstrap))
    cfg = describe(a, ResourceType.BROKER, "0")
    assert cfg["log.retention.ms"].value == "123456" and cfg["message.max.bytes"].value == "3000"
    assert produce_sizes(b.bootstrap, "dyn", [5000]) == [KafkaError.MSG_SIZE_TOO_LARGE]
    # Legacy AlterConfigs replaces the per-broker layer as a whole.
    assert outcome(a.alter_configs([ConfigResource(ResourceType.BROKER, "0", set_config={})])) is None
    assert describe(a, ResourceType.BROKER, "0")["message.max.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert produce_sizes(b.bootstrap, "dyn", [5000]) == [None]


def test_broker_configs_kafka_python(kadmin):
    resource = KConfigResource(ConfigResourceType.BROKER, "0", {"log.cleaner.backoff.ms": "20000"})
    assert kadmin.alter_configs([resource], incremental=False) == {"broker": {"0": "OK"}}
    configs = kadmin.describe_configs([KConfigResource(ConfigResourceType.BROKER, "0")])["broker"]["0"]
    assert configs["log.cleaner.backoff.ms"]["value"] == "20000"
    assert configs["log.cleaner.backoff.ms"]["config_source"] == "DYNAMIC_BROKER_CONFIG"
    reset = KConfigResource(ConfigResourceType.BROKER, "0", {"log.cleaner.backoff.ms": (AlterConfigOp.DELETE, None)})
    assert kadmin.alter_configs([reset], incremental=True) == {"broker": {"0": "OK"}}
    configs = kadmin.describe_configs([KConfigResource(ConfigResourceType.BROKER, "0")])["broker"]["0"]
    assert "log.cleaner.backoff.ms" not in configs


def test_broker_loggers_kafka_python(kadmin):
    logger = KConfigResource(ConfigResourceType.BROKER_LOGGER, "0")
    levels = kadmin.describe_configs([logger], config_filter="all")["broker_logger"]["0"]
    assert levels["root"]["value"] == "INFO" and levels["odradek.requests"]["value"] == "INFO"
    change = KConfigResource(ConfigResourceType.BROKER_LOGGER, "0", {"odradek.requests": (AlterConfigOp.SET, "DEBUG")})
    assert kadmin.alter_configs([change], incremental=True) == {"broker_logger": {"0": "OK"}}
    levels = kadmin.describe_configs([logger], config_filter="all")["broker_logger"]["0"]
    assert levels["odradek.requests"]["value"] == "DEBUG" and levels["root"]["value"] == "INFO"
    unset = KConfigResource(ConfigResourceType.BROKER_LOGGER, "0", {"odradek.requests": (AlterConfigOp.DELETE, None)})
    assert kadmin.alter_configs([unset], incremental=True) == {"broker_logger": {"0": "OK"}}
    levels = kadmin.describe_configs([logger], config_filter="all")["broker_logger"]["0"]
    assert levels["odradek.requests"]["value"] == "INFO"
    bad = KConfigResource(ConfigResourceType.BROKER_LOGGER, "0", {"odradek.requests": (AlterConfigOp.SET, "LOUD")})
    result = kadmin.alter_configs([bad], incremental=True)["broker_logger"]["0"]
    assert "InvalidConfigurationError" in result and "not a supported log level" in result
    root = KConfigResource(ConfigResourceType.BROKER_LOGGER, "0", {"root": (AlterConfigOp.DELETE, None)})
    assert "InvalidRequestError" in kadmin.alter_configs([root], incremental=True)["broker_logger"]["0"]
    # Only IncrementalAlterConfigs changes loggers, as in Kafka.
    legacy = KConfigResource(ConfigResourceType.BROKER_LOGGER, "0", {"odradek.requests": "DEBUG"})
    assert "Unknown resource type 8" in kadmin.alter_configs([legacy], incremental=False)["broker_logger"]["0"]
