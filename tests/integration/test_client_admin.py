"""odradek.client.admin.Admin against a real broker, every call compared with what confluent-kafka's
AdminClient (librdkafka) says on the same broker: topics, partitions, configs, cluster, offsets,
records, groups and group offsets, and the error each refusal carries. Log dirs and OffsetDelete, which
confluent-kafka does not offer, are compared with kafka-python's KafkaAdminClient."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from confluent_kafka import KafkaException, TopicCollection, TopicPartition as CTP
from confluent_kafka.admin import (
    AdminClient, AlterConfigOpType as CAlterOp, ConfigEntry as CConfigEntry, ConfigResource as CResource,
    NewPartitions, NewTopic as CNewTopic, OffsetSpec,
)
from confluent_kafka import ConsumerGroupTopicPartitions
from kafka.admin import KafkaAdminClient

from odradek.client import sync
from odradek.client.admin import EARLIEST, LATEST, MAX_TIMESTAMP, Admin
from odradek.client.admin_types import (
    AdminError, AlterConfigOp, AlterConfigOpType, ConfigResource, ConfigSource, NewTopic, OffsetAndMetadata,
)
from odradek.client.errors import KafkaTimeoutError
from odradek.client.fetcher import TopicPartition as TP
from odradek.protocol.error_codes import ErrorCode

from .cli_support import new_name, unreachable
from .clients import Msg, confluent_config, confluent_consumer, produce_confluent, wait_until

BROKER_OVERRIDES = {"num.partitions": "2", "group.initial.rebalance.delay.ms": "0"}


@pytest.fixture(scope="module")
def theirs(broker):
    return AdminClient(confluent_config(broker.bootstrap))


@pytest.fixture(scope="module")
def ours(broker):
    with sync.Admin({"bootstrap.servers": broker.bootstrap, "default.api.timeout.ms": 20000}) as a:
        yield a


def their_error(future) -> str | None:
    """The Kafka error name of a confluent future's failure (or of its first failed partition), None on
    success. librdkafka has its own names for some codes (TOPIC_EXCEPTION, UNKNOWN_TOPIC_OR_PART), so
    the name comes from the numeric code."""
    try:
        result = future.result(timeout=20)
    except KafkaException as e:
        return ErrorCode(e.args[0].code()).name
    for tp in getattr(result, "topic_partitions", None) or ():
        if tp.error is not None:
            return ErrorCode(tp.error.code()).name
    return None


def our_error(fn, *args, **kwargs) -> str | None:
    try:
        fn(*args, **kwargs)
        return None
    except AdminError as e:
        return e.code.name


def uuid_of(confluent_uuid) -> uuid.UUID:
    msb = confluent_uuid.get_most_significant_bits() & (2**64 - 1)
    lsb = confluent_uuid.get_least_significant_bits() & (2**64 - 1)
    return uuid.UUID(int=(msb << 64) | lsb)


# ------------------------------------------------------------------------------------------ topics
def test_topics_created_by_either_look_the_same_to_both(ours, theirs):
    a, b = new_name("adm-a"), new_name("adm-b")
    created = ours.create_topics([NewTopic(a, 3, 1, {"retention.ms": "3600000"})])
    assert created[a].num_partitions == 3 and created[a].replication_factor == 1
    assert created[a].configs["retention.ms"] == "3600000"
    theirs.create_topics([CNewTopic(b, 2, 1, config={"cleanup.policy": "compact"})])[b].result(timeout=20)
    mine = ours.describe_topics([a, b])
    described = theirs.describe_topics(TopicCollection([a, b]))
    for name in (a, b):
        t = described[name].result(timeout=20)
        assert mine[name].topic_id == uuid_of(t.topic_id)
        assert [(p.partition, p.leader, p.replicas, p.isr) for p in mine[name].partitions] == [
            (p.id, p.leader.id, [n.id for n in p.replicas], [n.id for n in p.isr]) for p in t.partitions]
    listed = ours.list_topics(include_internal=True)
    assert set(listed) == set(theirs.list_topics(timeout=10).topics)
    assert listed[a].partitions == 3 and not listed[a].is_internal


@pytest.mark.parametrize("topic, config", [
    (NewTopic("", 1, 1), None),                                          # invalid name
    (NewTopic("adm-bad-config", 1, 1, {"retention.ms": "soon"}), None),
    (NewTopic("adm-bad-key", 1, 1, {"no.such.config": "1"}), None),
    (NewTopic("adm-zero", 0, 1), None),
    (NewTopic("adm-rf", 1, 3), None),                                   # more replicas than brokers
])
def test_create_topic_refusals_match(ours, theirs, topic, config):
    mine = our_error(ours.create_topics, [topic], validate_only=True)
    cfg = {k: v for k, v in topic.configs.items()}
    theirs_ = their_error(theirs.create_topics([CNewTopic(topic.name, topic.num_partitions, topic.replication_factor,
                                                          config=cfg)], validate_only=True)[topic.name])
    assert mine is not None and mine == theirs_


def test_existing_and_unknown_topics(ours, theirs):
    t = new_name("adm-dup")
    ours.create_topics([t])
    assert our_error(ours.create_topics, [t]) == their_error(theirs.create_topics([CNewTopic(t, 1, 1)])[t]) \
        == "TOPIC_ALREADY_EXISTS"
    missing = new_name("adm-missing")
    assert our_error(ours.delete_topics, [missing]) == their_error(theirs.delete_topics([missing])[missing]) \
        == "UNKNOWN_TOPIC_OR_PARTITION"
    assert our_error(ours.describe_topics, [missing]) == "UNKNOWN_TOPIC_OR_PARTITION"
    assert their_error(theirs.describe_topics(TopicCollection([missing]))[missing]) == "UNKNOWN_TOPIC_OR_PARTITION"


def test_a_batch_reports_every_outcome(ours):
    good, missing = new_name("adm-ok"), new_name("adm-missing")
    ours.create_topics([good])
    with pytest.raises(AdminError) as e:
        ours.delete_topics([good, missing])
    assert e.value.resource == f"topic {missing!r}" and e.value.results[good] is None
    assert isinstance(e.value.results[missing], AdminError)
    assert good not in ours.list_topics()


def test_delete_and_validate_only(ours, theirs):
    t = new_name("adm-del")
    assert ours.create_topics([NewTopic(t, 4, 1)], validate_only=True)[t].num_partitions == 4
    assert t not in theirs.list_topics(timeout=10).topics
    ours.create_topics([t])
    ours.delete_topics([t])
    wait_until(lambda: t not in theirs.list_topics(timeout=10).topics, 10, "the topic to go")


def test_create_partitions_matches(ours, theirs):
    t = new_name("adm-parts")
    ours.create_topics([NewTopic(t, 1, 1)])
    ours.create_partitions({t: 3})
    wait_until(lambda: len(theirs.list_topics(topic=t, timeout=10).topics[t].partitions) == 3, 10, "3 partitions")
    assert our_error(ours.create_partitions, {t: 2}) == their_error(
        theirs.create_partitions([NewPartitions(t, 2)])[t]) == "INVALID_PARTITIONS"
    assert our_error(ours.create_partitions, {t: 5}, validate_only=True) is None
    assert len(ours.describe_topics([t])[t].partitions) == 3


# ------------------------------------------------------------------------------------------ configs
def their_configs(theirs, kind: str, name: str) -> dict:
    res = CResource(kind, name)
    return theirs.describe_configs([res])[res].result(timeout=20)


@pytest.mark.parametrize("kind", ["TOPIC", "BROKER"])
def test_describe_configs_matches(ours, theirs, kind):
    name = "0"
    if kind == "TOPIC":
        name = new_name("adm-cfg")
        ours.create_topics([NewTopic(name, 1, 1, {"retention.ms": "3600000", "segment.bytes": "1048576"})])
    mine = ours.describe_configs([ConfigResource(kind == "TOPIC" and 2 or 4, name)])[
        ConfigResource.topic(name) if kind == "TOPIC" else ConfigResource.broker(name)]
    their = their_configs(theirs, kind, name)
    assert set(mine) == set(their)
    for k, e in their.items():
        m = mine[k]
        assert (m.value, int(m.source), m.is_read_only, m.is_sensitive, m.is_default) == (
            e.value, e.source, e.is_read_only, e.is_sensitive, e.is_default), k
    if kind == "TOPIC":
        assert mine["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG


def test_incremental_alter_configs_both_ways(ours, theirs):
    t = new_name("adm-iac")
    ours.create_topics([NewTopic(t, 1, 1, {"retention.ms": "1000"})])
    ours.incremental_alter_configs({ConfigResource.topic(t): [
        AlterConfigOp("segment.ms", "600000"), AlterConfigOp("retention.ms", op=AlterConfigOpType.DELETE),
        AlterConfigOp("cleanup.policy", "compact", AlterConfigOpType.APPEND)]})
    cfg = their_configs(theirs, "TOPIC", t)
    assert cfg["segment.ms"].value == "600000" and cfg["retention.ms"].is_default
    assert cfg["cleanup.policy"].value == "delete,compact"
    res = CResource("TOPIC", t, incremental_configs=[CConfigEntry("max.message.bytes", "2000000",
                                                                  incremental_operation=CAlterOp.SET)])
    theirs.incremental_alter_configs([res])[res].result(timeout=20)
    assert ours.describe_configs([ConfigResource.topic(t)], keys=["max.message.bytes"])[
        ConfigResource.topic(t)]["max.message.bytes"].value == "2000000"
    bad = CResource("TOPIC", t, incremental_configs=[CConfigEntry("segment.ms", "often",
                                                                  incremental_operation=CAlterOp.SET)])
    assert our_error(ours.incremental_alter_configs, {ConfigResource.topic(t): {"segment.ms": "often"}}) == \
        their_error(theirs.incremental_alter_configs([bad])[bad]) == "INVALID_CONFIG"


def test_alter_configs_replaces_the_set(ours, theirs):
    t = new_name("adm-ac")
    ours.create_topics([NewTopic(t, 1, 1, {"retention.ms": "1000", "segment.ms": "600000"})])
    ours.alter_configs({ConfigResource.topic(t): {"retention.ms": "2000"}})
    cfg = their_configs(theirs, "TOPIC", t)
    assert cfg["retention.ms"].value == "2000" and cfg["segment.ms"].is_default


def test_broker_configs_altered_and_refused(ours, theirs):
    ours.incremental_alter_configs({ConfigResource.broker(0): {"log.retention.ms": "7200000"}})
    assert their_configs(theirs, "BROKER", "0")["log.retention.ms"].value == "7200000"
    ours.incremental_alter_configs({ConfigResource.broker(0): {"log.retention.ms": None}})
    assert their_configs(theirs, "BROKER", "0")["log.retention.ms"].value != "7200000"
    bad = CResource("BROKER", "0", incremental_configs=[CConfigEntry("no.such.key", "1",
                                                                     incremental_operation=CAlterOp.SET)])
    assert our_error(ours.incremental_alter_configs, {ConfigResource.broker(0): {"no.such.key": "1"}}) == \
        their_error(theirs.incremental_alter_configs([bad])[bad])


# ------------------------------------------------------------------------------------------ cluster, logs
def test_describe_cluster_matches(ours, theirs):
    mine = ours.describe_cluster()
    t = theirs.describe_cluster().result(timeout=20)
    assert mine.cluster_id == t.cluster_id and mine.controller_id == t.controller.id
    assert [(n.id, n.host, n.port) for n in mine.brokers] == sorted((n.id, n.host, n.port) for n in t.nodes)


def test_describe_log_dirs_matches_kafka_python(broker, ours, kadmin):
    t = new_name("adm-logs")
    ours.create_topics([NewTopic(t, 2, 1)])
    produce_confluent(broker.bootstrap, t, [Msg(None, b"x" * 100, (), None, 0) for _ in range(10)])
    [k] = kadmin.describe_log_dirs()
    mine = ours.describe_log_dirs()[k["broker"]]
    for d in k["log_dirs"]:
        m = mine[d["log_dir"]]
        assert int(m.error) == d["error_code"] and m.total_bytes == d["total_bytes"]
        assert {(tp.topic, tp.partition): r.size for tp, r in m.replicas.items()} == {
            (topic["name"], p["partition_index"]): p["partition_size"] for topic in d["topics"] for p in topic["partitions"]}
    assert mine[k["log_dirs"][0]["log_dir"]].replicas[TP(t, 0)].size > 1000


# ------------------------------------------------------------------------------------------ offsets, records
@pytest.fixture(scope="module")
def records_topic(broker, ours):
    t = new_name("adm-recs")
    ours.create_topics([NewTopic(t, 2, 1)])
    produce_confluent(broker.bootstrap, t, [Msg(None, f"v{i}".encode(), (), 1_700_000_000_000 + i * 1000, i % 2)
                                            for i in range(20)])
    return t


@pytest.mark.parametrize("spec, their_spec", [
    (EARLIEST, OffsetSpec.earliest()), (LATEST, OffsetSpec.latest()), (MAX_TIMESTAMP, OffsetSpec.max_timestamp()),
    (1_700_000_007_500, OffsetSpec.for_timestamp(1_700_000_007_500)),
    (1_800_000_000_000, OffsetSpec.for_timestamp(1_800_000_000_000)),
])
def test_list_offsets_matches(ours, theirs, records_topic, spec, their_spec):
    tps = [TP(records_topic, p) for p in (0, 1)]
    mine = ours.list_offsets({tp: spec for tp in tps})
    t = theirs.list_offsets({CTP(tp.topic, tp.partition): their_spec for tp in tps})
    for tp in tps:
        r = t[CTP(tp.topic, tp.partition)].result(timeout=20)
        assert (mine[tp].offset, mine[tp].timestamp) == (r.offset, r.timestamp), tp


def test_delete_records_matches(broker, ours, theirs):
    t = new_name("adm-delrec")
    ours.create_topics([NewTopic(t, 2, 1)])
    produce_confluent(broker.bootstrap, t, [Msg(None, b"v", (), None, i % 2) for i in range(20)])
    assert ours.delete_records({TP(t, 0): 4}) == {TP(t, 0): 4}
    r = theirs.delete_records([CTP(t, 1, 6)])[CTP(t, 1, 6)].result(timeout=20)
    assert r.low_watermark == 6
    assert ours.list_offsets({TP(t, 1): EARLIEST})[TP(t, 1)].offset == 6
    assert ours.delete_records({TP(t, 1): -1}) == {TP(t, 1): 10}
    assert our_error(ours.delete_records, {TP(t, 0): 99}) == their_error(
        theirs.delete_records([CTP(t, 0, 99)])[CTP(t, 0, 99)]) == "OFFSET_OUT_OF_RANGE"
    assert our_error(ours.delete_records, {TP(t, 7): 1}) == "UNKNOWN_TOPIC_OR_PARTITION"


# ------------------------------------------------------------------------------------------ groups
def commit(bootstrap: str, group: str, offsets: list) -> None:
    c = confluent_consumer(bootstrap, **{"group.id": group})
    try:
        c.commit(offsets=[CTP(t, p, o) for t, p, o in offsets], asynchronous=False)
    finally:
        c.close()


@pytest.fixture
def live_group(broker, records_topic):
    g = new_name("adm-live")
    c = confluent_consumer(broker.bootstrap, **{"group.id": g, "client.id": "their-client"})
    c.subscribe([records_topic])
    deadline = time.monotonic() + 30
    while not c.assignment():
        assert time.monotonic() < deadline
        c.poll(0.2)
    yield g, c
    c.close()


def test_list_and_describe_groups_match(broker, ours, theirs, records_topic, live_group):
    g, _ = live_group
    empty = new_name("adm-empty")
    commit(broker.bootstrap, empty, [(records_topic, 0, 3)])
    mine = {x.group_id: x for x in ours.list_groups()}
    their = {x.group_id: x for x in theirs.list_consumer_groups().result(timeout=20).valid}
    assert set(mine) == set(their)
    assert mine[g].state == their[g].state.name.title() == "Stable"
    assert mine[empty].state == "Empty"
    d = ours.describe_groups([g, empty])
    t = theirs.describe_consumer_groups([g, empty])
    for gid in (g, empty):
        td = t[gid].result(timeout=20)
        assert d[gid].state.upper() == td.state.name and d[gid].protocol == td.partition_assignor
        assert d[gid].coordinator == td.coordinator.id
        assert sorted((m.member_id, m.client_id, m.client_host, tuple(m.assignment)) for m in d[gid].members) == sorted(
            (m.member_id, m.client_id, m.host, tuple(TP(x.topic, x.partition) for x in m.assignment.topic_partitions))
            for m in td.members)
    assert d[g].members[0].client_id == "their-client" and len(d[g].members[0].assignment) == 2
    missing = new_name("adm-nogroup")
    assert our_error(ours.describe_groups, [missing]) == "GROUP_ID_NOT_FOUND"


def test_group_offsets_alter_list_delete_match(ours, theirs, kadmin, records_topic):
    g = new_name("adm-offsets")
    ours.alter_consumer_group_offsets(g, {TP(records_topic, 0): OffsetAndMetadata(4, "meta"), TP(records_topic, 1): 7})
    mine = ours.list_consumer_group_offsets(g)
    their = theirs.list_consumer_group_offsets([ConsumerGroupTopicPartitions(g)])[g].result(timeout=20)
    assert {tp: o.offset for tp, o in mine.items()} == {TP(x.topic, x.partition): x.offset for x in their.topic_partitions}
    # confluent-kafka's Python binding reads the metadata string past its end (no NUL in librdkafka's
    # buffer), so the metadata is compared with kafka-python's answer.
    k = kadmin.list_group_offsets(g)[g]
    assert {tp: (o.offset, o.metadata) for tp, o in mine.items()} == {
        TP(tp.topic, tp.partition): (o.offset, o.metadata) for tp, o in k.items()}
    assert mine[TP(records_topic, 0)] == OffsetAndMetadata(4, "meta", -1)
    req = ConsumerGroupTopicPartitions(g, [CTP(records_topic, 1, 2)])
    theirs.alter_consumer_group_offsets([req])[g].result(timeout=20)
    assert ours.list_consumer_group_offsets(g, [TP(records_topic, 1)])[TP(records_topic, 1)].offset == 2
    ours.delete_consumer_group_offsets(g, [TP(records_topic, 0)])
    assert list(ours.list_consumer_group_offsets(g)) == [TP(records_topic, 1)]
    kadmin.delete_group_offsets(g, [kafka_tp(records_topic, 1)])
    assert ours.list_consumer_group_offsets(g) == {}
    assert ours.list_consumer_group_offsets(g, [TP(records_topic, 0)]) == {TP(records_topic, 0): None}


def kafka_tp(topic: str, partition: int):
    from kafka.structs import TopicPartition as KTP
    return KTP(topic, partition)


def test_group_refusals_match(ours, theirs, records_topic, live_group):
    g, _ = live_group
    assert our_error(ours.delete_consumer_groups, [g]) == their_error(
        theirs.delete_consumer_groups([g])[g]) == "NON_EMPTY_GROUP"
    req = ConsumerGroupTopicPartitions(g, [CTP(records_topic, 0, 1)])
    assert our_error(ours.alter_consumer_group_offsets, g, {TP(records_topic, 0): 1}) == their_error(
        theirs.alter_consumer_group_offsets([req])[g])
    assert our_error(ours.delete_consumer_group_offsets, g, [TP(records_topic, 0)]) == "GROUP_SUBSCRIBED_TO_TOPIC"
    missing = new_name("adm-nogroup")
    assert our_error(ours.delete_consumer_groups, [missing]) == their_error(
        theirs.delete_consumer_groups([missing])[missing]) == "GROUP_ID_NOT_FOUND"


def test_delete_groups(ours, theirs, records_topic):
    g = new_name("adm-gone")
    ours.alter_consumer_group_offsets(g, {TP(records_topic, 0): 1})
    assert ours.delete_consumer_groups([g]) == {g: None}
    assert g not in {x.group_id for x in theirs.list_consumer_groups().result(timeout=20).valid}


# ------------------------------------------------------------------------------------------ the client itself
def test_async_admin_and_unreachable_brokers(broker):
    async def main():
        async with Admin({"bootstrap.servers": broker.bootstrap}) as a:
            assert (await a.describe_cluster()).brokers[0].port == broker.port
        with pytest.raises(KafkaTimeoutError, match="could not bootstrap"):
            async with Admin({"bootstrap.servers": unreachable(), "default.api.timeout.ms": 1000}):
                pass
    asyncio.run(asyncio.wait_for(main(), 30))


def test_deleting_a_topic_removes_its_committed_offsets(broker_factory):
    """Kafka removes a deleted topic's committed offsets from every group (and a group left Empty with
    none is gone): a topic created again under the same name starts without them, after a restart too."""
    b = broker_factory(num_partitions=2)
    t, keep = new_name("adm-deltopic"), new_name("adm-keeptopic")
    g1, g2 = new_name("adm-both"), new_name("adm-only")
    with sync.Admin({"bootstrap.servers": b.bootstrap, "default.api.timeout.ms": 20000}) as a:
        a.create_topics([NewTopic(t, 2, 1), NewTopic(keep, 1, 1)])
        a.alter_consumer_group_offsets(g1, {TP(t, 0): 5, TP(t, 1): 6, TP(keep, 0): 7})
        a.alter_consumer_group_offsets(g2, {TP(t, 0): 3})
        a.delete_topics([t])
        wait_until(lambda: t not in a.list_topics(), 10, f"{t} to go")
        assert {tp: o.offset for tp, o in a.list_consumer_group_offsets(g1).items()} == {TP(keep, 0): 7}
        assert g2 not in {x.group_id for x in a.list_groups()}
        a.create_topics([NewTopic(t, 2, 1)])
    theirs = AdminClient(confluent_config(b.bootstrap))
    their = theirs.list_consumer_group_offsets([ConsumerGroupTopicPartitions(g1)])[g1].result(timeout=20)
    assert {(x.topic, x.partition): x.offset for x in their.topic_partitions} == {(keep, 0): 7}
    b.restart()
    with sync.Admin({"bootstrap.servers": b.bootstrap, "default.api.timeout.ms": 20000}) as a:
        assert a.list_consumer_group_offsets(g1, [TP(t, 0), TP(keep, 0)]) == {
            TP(t, 0): None, TP(keep, 0): OffsetAndMetadata(7, "", -1)}
        assert g2 not in {x.group_id for x in a.list_groups()}
