"""Consumer groups with librdkafka (confluent-kafka): consumer processes in one group on a six-partition
topic while a producer runs; clean leave, kill -9, static restart, cooperative-sticky, and committed
offsets across a broker restart (seed 000, seed 001, seed 003 "Consumer Position")."""

from __future__ import annotations

import time

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from .groups_support import (
    GROUP_REQUEST_LOGGERS, SESSION_TIMEOUT_MS, Member, ProducerThread, assert_no_two_owners, assert_nothing_skipped, describe,
    wait_caught_up, wait_stable,
)

BROKER_OVERRIDES = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 1000}
BROKER_LOGGERS = GROUP_REQUEST_LOGGERS
PARTITIONS = 6
SESSION_S = SESSION_TIMEOUT_MS / 1000


def admin_for(broker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def create_topic(admin: AdminClient, name: str, partitions: int = PARTITIONS) -> None:
    for f in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        f.result(30)


def moved_at(members: list[Member], partitions: set[int], after: float) -> float:
    """When the last of `partitions` was assigned to one of `members` after `after`."""
    latest = {}
    for m in members:
        for ev in m.events():
            if ev["e"] == "assigned" and ev["ts"] >= after:
                for p in ev["p"]:
                    if p in partitions:
                        latest[p] = max(latest.get(p, 0), ev["ts"])
    assert set(latest) == partitions, f"partitions {partitions - set(latest)} never moved"
    return max(latest.values())


def test_three_processes_leave_kill_and_static_restart(broker, tmp_path, record_property):
    admin = admin_for(broker)
    topic, group = "orders", "billing"
    create_topic(admin, topic)
    producer = ProducerThread(broker.bootstrap, topic, PARTITIONS)
    everyone: list[Member] = []
    killed: dict[str, float] = {}

    def start(name: str, **kw) -> Member:
        m = Member("confluent", broker.bootstrap, topic, group, name, tmp_path, **kw)
        everyone.append(m)
        return m

    try:
        a, b, c = start("a"), start("b"), start("c", instance_id="static-c")
        wait_stable(admin, group, [a, b, c], PARTITIONS, 30)

        # A clean close sends LeaveGroup: the others take over at their next heartbeat.
        t0 = time.time()
        a.close()
        leave_s = wait_stable(admin, group, [b, c], PARTITIONS, 15) - t0
        d = start("d")
        wait_stable(admin, group, [b, c, d], PARTITIONS, 30)

        # kill -9: b's partitions move once its session times out, plus one rebalance.
        lost = b.owned()
        t0 = time.time()
        b.kill()
        killed[b.label] = t0
        wait_stable(admin, group, [c, d], PARTITIONS, SESSION_S + 15)
        kill_s = moved_at([c, d], lost, t0) - t0
        assert kill_s <= SESSION_S + 5, f"b's partitions took {kill_s:.1f}s to move"

        # A static member restarts within its session timeout: same partitions, no rebalance.
        before = c.owned()
        d_events = len([e for e in d.events() if e["e"] in ("assigned", "revoked")])
        t0 = time.time()
        c.close()                                   # static members do not send LeaveGroup
        c2 = start("c", instance_id="static-c", run=2)
        wait_stable(admin, group, [c2, d], PARTITIONS, SESSION_S)
        restart_s = time.time() - t0
        assert c2.owned() == before
        assert len([e for e in d.events() if e["e"] in ("assigned", "revoked")]) == d_events, \
            "the static restart made the other member rebalance"

        acked = producer.stop()
        wait_caught_up(admin, group, topic, acked, 30)
        for m in (c2, d):
            m.close()
        assert_no_two_owners(everyone, killed)
        assert_nothing_skipped(acked, everyone)
        record_property("leave_rebalance_s", round(leave_s, 2))
        record_property("kill_rebalance_s", round(kill_s, 2))
        record_property("static_restart_s", round(restart_s, 2))
        print(f"rebalance after clean leave {leave_s:.2f}s, after kill -9 {kill_s:.2f}s "
              f"(session {SESSION_S:.0f}s), static restart {restart_s:.2f}s; "
              f"{sum(len(v) for v in acked.values())} records")
    finally:
        producer.abandon()
        for m in everyone:
            if m.alive:
                m.kill()


def test_cooperative_sticky_moves_only_what_must_move(broker, tmp_path):
    admin = admin_for(broker)
    topic, group = "sticky", "sticky-group"
    create_topic(admin, topic)
    producer = ProducerThread(broker.bootstrap, topic, PARTITIONS, rate_per_s=100)
    everyone: list[Member] = []

    def start(name: str) -> Member:
        m = Member("confluent", broker.bootstrap, topic, group, name, tmp_path, strategy="cooperative-sticky")
        everyone.append(m)
        return m

    try:
        a, b = start("a"), start("b")
        wait_stable(admin, group, [a, b], PARTITIONS, 30)
        before = {m.name: m.owned() for m in (a, b)}
        seen = {m.name: len(m.events()) for m in (a, b)}
        assert sorted(len(v) for v in before.values()) == [3, 3]
        c = start("c")
        wait_stable(admin, group, [a, b, c], PARTITIONS, 30)
        after = {m.name: m.owned() for m in (a, b, c)}
        assert sorted(len(v) for v in after.values()) == [2, 2, 2]
        for m in (a, b):
            assert after[m.name] <= before[m.name], "a member gained a partition it did not have"
            revoked = [set(e["p"]) for e in m.events()[seen[m.name]:] if e["e"] == "revoked"]
            assert all(r <= before[m.name] - after[m.name] for r in revoked), \
                f"{m.name} gave up partitions it kept: {revoked}"
            assert sum(len(r) for r in revoked) == 1
        acked = producer.stop()
        wait_caught_up(admin, group, topic, acked, 30)
        for m in everyone:
            m.close()
        assert_no_two_owners(everyone, {})
        assert_nothing_skipped(acked, everyone)
    finally:
        producer.abandon()
        for m in everyone:
            if m.alive:
                m.kill()


def _consume(bootstrap: str, topic: str, group: str, want: int, timeout: float = 30) -> list:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                     "auto.offset.reset": "earliest", "session.timeout.ms": SESSION_TIMEOUT_MS,
                     "heartbeat.interval.ms": 500})
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < want and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append((m.partition(), m.offset()))
        c.commit(asynchronous=False)
    finally:
        c.close()
    return got


def test_committed_offsets_and_groups_survive_a_broker_restart(broker_factory):
    b = broker_factory(group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=1000)
    admin = admin_for(b)
    topic, group = "durable", "resumer"
    create_topic(admin, topic, 3)
    p = ck.Producer({"bootstrap.servers": b.bootstrap})
    for i in range(30):
        p.produce(topic, value=b"%d" % i, partition=i % 3)
    p.flush(10)
    first = _consume(b.bootstrap, topic, group, 30)
    assert sorted(first) == [(pt, o) for pt in range(3) for o in range(10)]

    b.restart()
    admin = admin_for(b)
    state, _ = describe(admin, group)
    assert state == "EMPTY"
    listed = {g.group_id: g for g in admin.list_consumer_groups().result(10).valid}
    assert group in listed
    req = ck.ConsumerGroupTopicPartitions(group, [ck.TopicPartition(topic, pt) for pt in range(3)])
    offsets = {tp.partition: tp.offset for tp in admin.list_consumer_group_offsets([req])[group].result(10).topic_partitions}
    assert offsets == {0: 10, 1: 10, 2: 10}

    p = ck.Producer({"bootstrap.servers": b.bootstrap})
    for i in range(30, 36):
        p.produce(topic, value=b"%d" % i, partition=i % 3)
    p.flush(10)
    second = _consume(b.bootstrap, topic, group, 6)
    assert sorted(second) == [(pt, o) for pt in range(3) for o in (10, 11)], "did not resume from the commits"


@pytest.mark.parametrize("version_probe", ["describe"])
def test_admin_views_of_a_group(broker, tmp_path, version_probe):
    admin = admin_for(broker)
    topic, group = "viewed", "viewers"
    create_topic(admin, topic, 2)
    m = Member("confluent", broker.bootstrap, topic, group, "viewer", tmp_path)
    try:
        wait_stable(admin, group, [m], 2, 30)
        state, view = describe(admin, group)
        assert state == "STABLE" and view == {"viewer": [0, 1]}
        d = admin.describe_consumer_groups([group], include_authorized_operations=True)[group].result(10)
        assert d.partition_assignor == "range" and d.members[0].host
        assert {str(op) for op in d.authorized_operations} >= {"AclOperation.READ", "AclOperation.DESCRIBE"}
        listed = admin.list_consumer_groups(states={ck.ConsumerGroupState.STABLE}).result(10).valid
        assert group in {g.group_id for g in listed}
        assert group not in {g.group_id for g in
                             admin.list_consumer_groups(states={ck.ConsumerGroupState.EMPTY}).result(10).valid}
        fs = admin.delete_consumer_groups([group])
        with pytest.raises(ck.KafkaException, match="NON_EMPTY_GROUP"):
            fs[group].result(10)
        m.close()
        fs = admin.delete_consumer_groups([group])
        fs[group].result(10)
        assert describe(admin, group)[0] == "DEAD"
    finally:
        if m.alive:
            m.kill()


def test_a_running_group_carries_on_across_a_broker_restart(broker_factory, tmp_path):
    b = broker_factory(group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=1000)
    admin = admin_for(b)
    topic, group = "through-restart", "steady"
    create_topic(admin, topic)
    producer = ProducerThread(b.bootstrap, topic, PARTITIONS, rate_per_s=100)
    members = [Member("confluent", b.bootstrap, topic, group, name, tmp_path) for name in ("a", "b")]
    try:
        wait_stable(admin, group, members, PARTITIONS, 30)
        owned = {m.name: m.owned() for m in members}
        b.restart()
        admin = admin_for(b)
        # The reloaded group is Stable with the same members: their heartbeats carry on.
        wait_stable(admin, group, members, PARTITIONS, SESSION_S + 10)
        assert {m.name: m.owned() for m in members} == owned
        acked = producer.stop()
        wait_caught_up(admin, group, topic, acked, 30)
        for m in members:
            m.close()
        assert_no_two_owners(members, {})
        assert_nothing_skipped(acked, members)
    finally:
        producer.abandon()
        for m in members:
            if m.alive:
                m.kill()


def _java_hash(s: str) -> int:
    """Java's String.hashCode (UTF-16 code units, int32 overflow)."""
    h, data = 0, s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def _string(buf: bytes, pos: int) -> tuple[str | None, int]:
    n = int.from_bytes(buf[pos:pos + 2], "big", signed=True)
    if n < 0:
        return None, pos + 2
    return buf[pos + 2:pos + 2 + n].decode(), pos + 2 + n


def test_consumer_offsets_holds_kafkas_records(broker, tmp_path):
    """A client reads __consumer_offsets like any topic and finds Kafka's key and value layouts."""
    from confluent_kafka.admin import ConfigResource, ResourceType
    admin = admin_for(broker)
    topic, group = "audited", "auditors"
    create_topic(admin, topic, 2)
    m = Member("confluent", broker.bootstrap, topic, group, "auditor", tmp_path)
    try:
        wait_stable(admin, group, [m], 2, 30)
        p = ck.Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(4):
            p.produce(topic, value=b"x", partition=i % 2)
        p.flush(10)
        wait_caught_up(admin, group, topic, {0: {1}, 1: {1}}, 30)
    finally:
        m.close()
    res = ConfigResource(ResourceType.TOPIC, "__consumer_offsets")
    assert admin.describe_configs([res])[res].result(10)["cleanup.policy"].value == "compact"
    md = admin.list_topics("__consumer_offsets", timeout=10).topics["__consumer_offsets"]
    assert md.partitions[0].leader == 0
    partition = abs(_java_hash(group)) % len(md.partitions)
    c = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "reader", "enable.auto.commit": False})
    tp = ck.TopicPartition("__consumer_offsets", partition, 0)
    _, end = c.get_watermark_offsets(tp, timeout=10)
    c.assign([tp])
    offsets, groups = {}, []
    deadline = time.monotonic() + 20
    position = 0
    while position < end and time.monotonic() < deadline:
        msg = c.poll(0.5)
        if msg is None or msg.error() is not None:
            continue
        position = msg.offset() + 1
        key, value = msg.key(), msg.value()
        version = int.from_bytes(key[:2], "big")
        name, pos = _string(key, 2)
        if name != group or value is None:
            continue
        assert int.from_bytes(value[:2], "big") == 3                # OffsetCommitValue / GroupMetadataValue v3
        if version == 1:                                            # OffsetCommitKey
            t, pos = _string(key, pos)
            offsets[(t, int.from_bytes(key[pos:pos + 4], "big"))] = int.from_bytes(value[2:10], "big")
        elif version == 2:                                          # GroupMetadataKey
            protocol_type, pos = _string(value, 2)
            generation = int.from_bytes(value[pos:pos + 4], "big")
            protocol, _ = _string(value, pos + 4)
            groups.append((protocol_type, generation, protocol))
    c.close()
    assert position == end
    assert offsets == {(topic, 0): 2, (topic, 1): 2}
    assert groups == [("consumer", 1, "range"), ("consumer", 2, None)]   # Stable, then Empty after the leave
