"""`odradek configs` as a subprocess against a real broker, cross-checked with confluent-kafka's
AdminClient: topic and broker configs, described and altered; error paths."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from .cli_support import new_name, odradek, unreachable
from .clients import confluent_config


def theirs(admin, kind: str, name: str) -> dict:
    res = ConfigResource(kind, name)
    return admin.describe_configs([res])[res].result(timeout=20)


@pytest.fixture
def topic(broker, admin):
    t = new_name("cli-cfg")
    admin.create_topics([NewTopic(t, 1, 1, config={"retention.ms": "3600000"})])[t].result(timeout=20)
    return t


def test_describe_topic_overrides_and_all(broker, admin, topic):
    [d] = odradek("configs", "describe", "--entity-type", "topics", "--entity-name", topic, "--json",
                  bootstrap=broker.bootstrap).ok().json()
    assert d["entity_name"] == topic
    assert [(c["name"], c["value"], c["source"]) for c in d["configs"]] == [
        ("retention.ms", "3600000", "DYNAMIC_TOPIC_CONFIG")]
    [full] = odradek("configs", "describe", "--entity-type", "topics", "--entity-name", topic, "--all", "--json",
                     bootstrap=broker.bootstrap).ok().json()
    assert {c["name"]: c["value"] for c in full["configs"]} == {k: v.value for k, v in theirs(admin, "TOPIC", topic).items()}
    text = odradek("configs", "describe", "--entity-type", "topics", "--entity-name", topic,
                   bootstrap=broker.bootstrap).ok().stdout
    assert "retention.ms" in text and "3600000" in text


def test_describe_every_topic(broker, topic):
    out = odradek("configs", "describe", "--entity-type", "topics", "--json", bootstrap=broker.bootstrap).ok().json()
    assert topic in {d["entity_name"] for d in out}


def test_alter_topic_set_and_delete(broker, admin, topic):
    odradek("configs", "alter", "--entity-type", "topics", "--entity-name", topic,
            "--add-config", "cleanup.policy=[compact,delete],segment.ms=600000", "--delete-config", "retention.ms",
            bootstrap=broker.bootstrap).ok()
    cfg = theirs(admin, "TOPIC", topic)
    assert cfg["cleanup.policy"].value == "compact,delete" and cfg["segment.ms"].value == "600000"
    assert cfg["retention.ms"].is_default


def test_alter_topic_invalid_value_changes_nothing(broker, admin, topic):
    odradek("configs", "alter", "--entity-type", "topics", "--entity-name", topic, "--add-config",
            "segment.ms=600000,retention.ms=forever", bootstrap=broker.bootstrap).fails("INVALID_CONFIG", "retention.ms")
    cfg = theirs(admin, "TOPIC", topic)
    assert cfg["retention.ms"].value == "3600000" and cfg["segment.ms"].is_default


def test_alter_broker_and_broker_default(broker, admin):
    odradek("configs", "alter", "--entity-type", "brokers", "--entity-name", "0", "--add-config",
            "log.retention.ms=7200000", bootstrap=broker.bootstrap).ok()
    assert theirs(admin, "BROKER", "0")["log.retention.ms"].value == "7200000"
    [d] = odradek("configs", "describe", "--entity-type", "brokers", "--entity-name", "0", "--json",
                  bootstrap=broker.bootstrap).ok().json()
    assert {c["name"]: c["source"] for c in d["configs"]}["log.retention.ms"] == "DYNAMIC_BROKER_CONFIG"
    odradek("configs", "alter", "--entity-type", "brokers", "--entity-name", "0", "--delete-config",
            "log.retention.ms", bootstrap=broker.bootstrap).ok()
    assert theirs(admin, "BROKER", "0")["log.retention.ms"].source != 1   # no longer a dynamic broker config
    odradek("configs", "alter", "--entity-type", "brokers", "--entity-default", "--add-config",
            "log.cleaner.backoff.ms=20000", bootstrap=broker.bootstrap).ok()
    [dflt] = odradek("configs", "describe", "--entity-type", "brokers", "--entity-default", "--json",
                     bootstrap=broker.bootstrap).ok().json()
    assert {c["name"]: c["value"] for c in dflt["configs"]}["log.cleaner.backoff.ms"] == "20000"
    odradek("configs", "alter", "--entity-type", "brokers", "--entity-default", "--delete-config",
            "log.cleaner.backoff.ms", bootstrap=broker.bootstrap).ok()


def test_errors(broker, topic):
    missing = new_name("cli-nosuch")
    odradek("configs", "describe", "--entity-type", "topics", "--entity-name", missing,
            bootstrap=broker.bootstrap).fails("UNKNOWN_TOPIC_OR_PARTITION", missing)
    odradek("configs", "alter", "--entity-type", "topics", "--entity-name", missing, "--add-config", "retention.ms=1",
            bootstrap=broker.bootstrap).fails("UNKNOWN_TOPIC_OR_PARTITION", missing)
    odradek("configs", "alter", "--entity-type", "brokers", "--entity-name", "0", "--add-config", "no.such.key=1",
            bootstrap=broker.bootstrap).fails("no.such.key")
    odradek("configs", "alter", "--entity-type", "brokers", "--entity-name", "zero", "--add-config", "a=1",
            bootstrap=broker.bootstrap).fails("broker is its id", status=2)
    odradek("configs", "alter", "--entity-type", "topics", "--entity-name", topic,
            bootstrap=broker.bootstrap).fails("nothing to alter", status=2)
    odradek("configs", "alter", "--entity-type", "topics", "--entity-name", topic, "--add-config", "retention.ms",
            bootstrap=broker.bootstrap).fails("KEY=VALUE", status=2)
    addr = unreachable()
    odradek("configs", "describe", "--entity-type", "brokers", "--entity-name", "0", "--timeout", "1",
            bootstrap=addr).fails(f"cannot reach the cluster at {addr}")
