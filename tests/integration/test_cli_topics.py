"""`odradek topics` and `odradek cluster` as subprocesses against a real broker, cross-checked with
confluent-kafka's AdminClient; error paths: unknown topic, invalid config, broker unreachable, bad
arguments."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from .cli_support import new_name, odradek, unreachable
from .clients import confluent_config, wait_until

BROKER_OVERRIDES = {"num.partitions": "2"}


def topic_configs(admin, topic: str) -> dict:
    res = ConfigResource("TOPIC", topic)
    return {k: v.value for k, v in admin.describe_configs([res])[res].result(timeout=20).items()}


def test_create_with_partitions_replication_and_configs(broker, admin):
    t = new_name("cli-create")
    r = odradek("topics", "create", "--topic", t, "--partitions", "3", "--replication-factor", "1",
                "--config", "retention.ms=123456", "--config", "cleanup.policy=compact", bootstrap=broker.bootstrap)
    assert r.ok().stdout.strip() == f"Created topic {t}."
    md = admin.list_topics(topic=t, timeout=10).topics[t]
    assert len(md.partitions) == 3 and all(len(p.replicas) == 1 for p in md.partitions.values())
    cfg = topic_configs(admin, t)
    assert cfg["retention.ms"] == "123456" and cfg["cleanup.policy"] == "compact"


def test_create_takes_the_broker_defaults_and_reports_json(broker, admin):
    t = new_name("cli-defaults")
    out = odradek("topics", "create", "--topic", t, "--json", bootstrap=broker.bootstrap).ok().json()
    assert out["created"] is True and out["partitions"] == 2 and out["replication_factor"] == 1
    assert len(admin.list_topics(topic=t, timeout=10).topics[t].partitions) == 2


def test_validate_only_creates_nothing(broker, admin):
    t = new_name("cli-validate")
    r = odradek("topics", "create", "--topic", t, "--partitions", "4", "--validate-only", bootstrap=broker.bootstrap)
    assert "nothing was created" in r.ok().stdout
    assert t not in admin.list_topics(timeout=10).topics


def test_create_existing_fails_unless_if_not_exists(broker):
    t = new_name("cli-exists")
    odradek("topics", "create", "--topic", t, bootstrap=broker.bootstrap).ok()
    odradek("topics", "create", "--topic", t, bootstrap=broker.bootstrap).fails("TOPIC_ALREADY_EXISTS", t)
    assert "already exists" in odradek("topics", "create", "--topic", t, "--if-not-exists",
                                       bootstrap=broker.bootstrap).ok().stdout


def test_create_with_an_invalid_config_value(broker, admin):
    t = new_name("cli-badcfg")
    odradek("topics", "create", "--topic", t, "--config", "retention.ms=soon",
            bootstrap=broker.bootstrap).fails("INVALID_CONFIG", "retention.ms")
    odradek("topics", "create", "--topic", t, "--config", "no.such.config=1",
            bootstrap=broker.bootstrap).fails("INVALID_CONFIG", "no.such.config")
    odradek("topics", "create", "--topic", t, "--config", "retention.ms",
            bootstrap=broker.bootstrap).fails("--config expects KEY=VALUE", status=2)
    assert t not in admin.list_topics(timeout=10).topics


def test_list_matches_confluent(broker, admin):
    names = [new_name("cli-list") for _ in range(3)]
    for n in names:
        odradek("topics", "create", "--topic", n, "--partitions", "1", bootstrap=broker.bootstrap).ok()
    listed = {t["name"]: t for t in odradek("topics", "list", "--json", bootstrap=broker.bootstrap).ok().json()}
    theirs = admin.list_topics(timeout=10).topics
    assert set(listed) == set(theirs)
    assert {n: t["partitions"] for n, t in listed.items()} == {n: len(t.partitions) for n, t in theirs.items()}
    piped = odradek("topics", "list", bootstrap=broker.bootstrap).ok().stdout.splitlines()
    assert set(piped) == set(theirs), "piped: one name per line (the table is for a terminal)"


def test_describe_matches_confluent(broker, admin):
    t = new_name("cli-describe")
    odradek("topics", "create", "--topic", t, "--partitions", "3", "--config", "segment.ms=3600000",
            bootstrap=broker.bootstrap).ok()
    [d] = odradek("topics", "describe", "--topic", t, "--json", bootstrap=broker.bootstrap).ok().json()
    md = admin.list_topics(topic=t, timeout=10).topics[t]
    assert d["name"] == t and d["partition_count"] == 3 and d["replication_factor"] == 1
    assert d["configs"] == {"segment.ms": "3600000"}
    assert {p["partition"]: (p["leader"], p["replicas"], p["isr"]) for p in d["partitions"]} == {
        p.id: (p.leader, list(p.replicas), list(p.isrs)) for p in md.partitions.values()}
    text = odradek("topics", "describe", "--topic", t, bootstrap=broker.bootstrap).ok().stdout
    assert f"Topic: {t}" in text and "PartitionCount: 3" in text and "segment.ms=3600000" in text


def test_alter_adds_partitions_and_changes_configs(broker, admin):
    t = new_name("cli-alter")
    odradek("topics", "create", "--topic", t, "--partitions", "1", "--config", "retention.ms=1000",
            bootstrap=broker.bootstrap).ok()
    odradek("topics", "alter", "--topic", t, "--partitions", "4", "--add-config", "segment.bytes=1048576",
            "--delete-config", "retention.ms", bootstrap=broker.bootstrap).ok()
    wait_until(lambda: len(admin.list_topics(topic=t, timeout=10).topics[t].partitions) == 4, 10, "4 partitions")
    cfg = topic_configs(admin, t)
    assert cfg["segment.bytes"] == "1048576" and cfg["retention.ms"] == "604800000"
    odradek("topics", "alter", "--topic", t, "--partitions", "2",
            bootstrap=broker.bootstrap).fails("INVALID_PARTITIONS")
    odradek("topics", "alter", "--topic", t, "--add-config", "segment.bytes=tiny",
            bootstrap=broker.bootstrap).fails("INVALID_CONFIG", "segment.bytes")
    odradek("topics", "alter", "--topic", t, bootstrap=broker.bootstrap).fails("nothing to alter", status=2)


def test_delete(broker, admin):
    a, b = new_name("cli-del"), new_name("cli-del")
    for t in (a, b):
        odradek("topics", "create", "--topic", t, bootstrap=broker.bootstrap).ok()
    out = odradek("topics", "delete", "--topic", a, "--topic", b, "--json", bootstrap=broker.bootstrap).ok().json()
    assert out == {"deleted": [a, b], "missing": []}
    wait_until(lambda: not {a, b} & set(admin.list_topics(timeout=10).topics), 10, "topics gone")
    odradek("topics", "delete", "--topic", a, bootstrap=broker.bootstrap).fails("UNKNOWN_TOPIC_OR_PARTITION", a)
    odradek("topics", "delete", "--topic", a, "--if-exists", bootstrap=broker.bootstrap).ok()


@pytest.mark.parametrize("action", [["describe", "--topic"], ["alter", "--partitions", "3", "--topic"],
                                    ["delete", "--topic"]])
def test_unknown_topic(broker, action):
    t = new_name("cli-missing")
    odradek("topics", *action, t, bootstrap=broker.bootstrap).fails("UNKNOWN_TOPIC_OR_PARTITION", t)


@pytest.mark.parametrize("command", [["topics", "list"], ["topics", "describe", "--topic", "x"],
                                     ["topics", "create", "--topic", "x"], ["cluster"]])
def test_broker_unreachable(command):
    addr = unreachable()
    r = odradek(*command, "--timeout", "1", bootstrap=addr, timeout=20)
    r.fails(f"cannot reach the cluster at {addr}", "connection refused")


def test_cluster_matches_confluent(broker, admin):
    out = odradek("cluster", "--json", bootstrap=broker.bootstrap).ok().json()
    md = admin.list_topics(timeout=10)
    assert out["cluster_id"] == md.cluster_id and out["controller_id"] == md.controller_id
    assert [(b["id"], b["host"], b["port"]) for b in out["brokers"]] == sorted(
        (b.id, b.host, b.port) for b in md.brokers.values())
    text = odradek("cluster", "describe", bootstrap=broker.bootstrap).ok().stdout
    assert md.cluster_id in text and str(broker.port) in text


def test_command_config(broker, tmp_path):
    good = tmp_path / "client.properties"
    good.write_text("# client settings\nclient.id=from-file\nrequest.timeout.ms = 20000\n")
    out = odradek("topics", "list", "--json", "--command-config", good, bootstrap=broker.bootstrap).ok().json()
    assert isinstance(out, list)
    bad = tmp_path / "bad.properties"
    bad.write_text("security.protocol=SASL_SSL\n")
    odradek("topics", "list", "--command-config", bad, bootstrap=broker.bootstrap).fails(
        "invalid client configuration", "security.protocol", status=2)
    odradek("topics", "list", "--command-config", tmp_path / "missing.properties",
            bootstrap=broker.bootstrap).fails("cannot read")
