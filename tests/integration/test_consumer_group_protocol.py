"""The consumer group protocol (seed 002, KIP-848) with librdkafka (confluent-kafka, `group.protocol=
consumer`): consumer processes join, leave cleanly, one is killed with kill -9 and comes back, while a
producer runs; the broker's view is sampled all along. No sampled moment shows a partition in two
members' assignments, every stable point has every partition owned, nothing acknowledged is skipped.
A regex subscription picks up a topic created later; the group and its offsets survive a broker
kill -9 and restart; the group is listed and described with Kafka's group type and state."""

from __future__ import annotations

import threading
import time

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from .cli_support import odradek
from .groups_support import (
    Member, ProducerThread, assert_no_two_owners, assert_nothing_skipped, ownership_intervals,
    wait_caught_up,
)
from .groups_support import describe as describe_view     # (state, partitions by client id)
from .groups_support import describe_group

SESSION_MS = 6000
BROKER_OVERRIDES = {
    "group.consumer.session.timeout.ms": SESSION_MS, "group.consumer.min.session.timeout.ms": 1000,
    "group.consumer.heartbeat.interval.ms": 500, "group.consumer.min.heartbeat.interval.ms": 100,
    # A new topic reaches a regex subscription within min(10 s, this) of the last resolution.
    "group.consumer.regex.refresh.interval.ms": 1000,
}
PARTITIONS = 6


def admin_for(broker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def create_topic(admin: AdminClient, name: str, partitions: int = PARTITIONS) -> None:
    for f in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        f.result(30)


class Sampler:
    """Samples the broker's assignment of the group every 50 ms and checks no partition is in two
    members' current assignments at any sampled moment."""

    def __init__(self, admin: AdminClient, group: str) -> None:
        self.admin, self.group = admin, group
        self.samples = 0
        self.violations: list = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                _, view = describe_view(self.admin, self.group)
            except ck.KafkaException:
                time.sleep(0.05)
                continue
            owned = [p for ps in view.values() for p in ps]
            if len(owned) != len(set(owned)):
                self.violations.append(view)
            self.samples += 1
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(30)
        assert not self.violations, f"a partition in two assignments: {self.violations[:3]}"


def wait_stable(admin, group, members: list[Member], timeout: float, partitions: int = PARTITIONS) -> float:
    """Until the broker says Stable with exactly `members`, every member's own view (its callbacks)
    equals the broker's, and every partition has exactly one owner; the time it was seen."""
    deadline = time.monotonic() + timeout
    while True:
        for m in members:
            assert m.alive, f"{m.name} died: {m.stderr()}"
        state, view = describe_view(admin, group)
        mine = {m.name: sorted(m.owned()) for m in members}
        if state == "STABLE" and view == mine:
            owned = sorted(p for ps in view.values() for p in ps)
            assert len(owned) == len(set(owned)), view
            if owned == list(range(partitions)):
                return time.time()
        if time.monotonic() > deadline:
            tails = "".join(f"\n--- {m.label} ---\n{m.stderr(30)}" for m in members)
            raise AssertionError(f"not stable after {timeout}s: broker {state} {view}, members {mine}{tails}")
        time.sleep(0.1)


def test_join_leave_kill_and_return_with_the_broker_sampled(broker, tmp_path, record_property):
    admin = admin_for(broker)
    topic, group = "kip848-orders", "kip848-billing"
    create_topic(admin, topic)
    producer = ProducerThread(broker.bootstrap, topic, PARTITIONS, rate_per_s=300)
    everyone: list[Member] = []
    killed: dict[str, float] = {}
    sampler = None

    def start(name: str, run: int = 1) -> Member:
        m = Member("confluent", broker.bootstrap, topic, group, name, tmp_path, run=run, group_protocol="consumer")
        everyone.append(m)
        return m

    try:
        a, b, c = start("a"), start("b"), start("c")
        t0 = time.time()
        wait_stable(admin, group, [a, b, c], 30)
        join_s = time.time() - t0
        sampler = Sampler(admin, group)
        assert sorted(len(m.owned()) for m in (a, b, c)) == [2, 2, 2]

        t0 = time.time()
        b.close()                                   # epoch -1: its partitions are free at once
        leave_s = wait_stable(admin, group, [a, c], 20) - t0

        lost = c.owned()
        t0 = time.time()
        c.kill()
        killed[c.label] = t0
        kill_s = wait_stable(admin, group, [a], SESSION_MS / 1000 + 15) - t0
        assert kill_s >= SESSION_MS / 1000 - 1, "the killed member's partitions moved before its session expired"
        assert lost <= a.owned()

        c2 = start("c", run=2)
        wait_stable(admin, group, [a, c2], 30)
        acked = producer.stop()
        wait_caught_up(admin, group, topic, acked, 30, [a, c2])
        sampler.stop()
        for m in (a, c2):
            m.close()
        assert_no_two_owners(everyone, killed)
        assert_nothing_skipped(acked, everyone)
        record_property("join_s", round(join_s, 2))
        record_property("leave_rebalance_s", round(leave_s, 2))
        record_property("kill_rebalance_s", round(kill_s, 2))
        print(f"join {join_s:.2f}s, rebalance after clean leave {leave_s:.2f}s, after kill -9 {kill_s:.2f}s "
              f"(session {SESSION_MS / 1000:.0f}s); {sampler.samples} samples of the broker's view; "
              f"{sum(len(v) for v in acked.values())} records")
    finally:
        producer.abandon()
        if sampler is not None:
            sampler._stop.set()
        for m in everyone:
            if m.alive:
                m.kill()


def test_regex_subscription_picks_up_a_new_topic(broker):
    admin = admin_for(broker)
    create_topic(admin, "rx-first", 2)
    c = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "kip848-regex", "group.protocol": "consumer",
                     "topic.metadata.refresh.interval.ms": 1000})
    try:
        c.subscribe(["^rx-.*"])

        def wait_for(wanted: set, timeout: float) -> None:
            deadline = time.monotonic() + timeout
            while {(tp.topic, tp.partition) for tp in c.assignment()} != wanted:
                assert time.monotonic() < deadline, f"assignment {c.assignment()} never became {wanted}"
                c.poll(0.1)

        wait_for({("rx-first", 0), ("rx-first", 1)}, 30)
        create_topic(admin, "rx-second", 3)
        create_topic(admin, "other-topic", 1)
        wait_for({("rx-first", 0), ("rx-first", 1), ("rx-second", 0), ("rx-second", 1), ("rx-second", 2)}, 30)
        d = describe_group(admin, "kip848-regex")
        (m,) = d.members
        assert {tp.topic for tp in m.target_assignment.topic_partitions} == {"rx-first", "rx-second"}
    finally:
        c.close()


def test_group_and_offsets_survive_a_broker_kill_and_restart(broker_factory):
    """A member keeps consuming across a broker kill -9: the replayed group still knows it at its
    epoch (it is not made to rejoin), and the committed offsets are what they were."""
    b = broker_factory(**BROKER_OVERRIDES)
    admin = admin_for(b)
    topic, group = "kip848-restart", "kip848-restart-group"
    create_topic(admin, topic, 4)
    p = ck.Producer({"bootstrap.servers": b.bootstrap})

    def produce(n: int) -> None:
        for i in range(n):
            p.produce(topic, b"%d" % i, partition=i % 4)
        assert p.flush(30) == 0

    def consume(c: ck.Consumer, n: int) -> list:
        out: list = []
        deadline = time.monotonic() + 60
        while len(out) < n:
            assert time.monotonic() < deadline, f"only {len(out)} of {n} records"
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                out.append((m.partition(), m.offset()))
        return out

    def committed_offsets(admin: AdminClient) -> dict[int, int]:
        req = ck.ConsumerGroupTopicPartitions(group, [ck.TopicPartition(topic, i) for i in range(4)])
        return {tp.partition: tp.offset for tp in admin.list_consumer_group_offsets([req])[group].result().topic_partitions
                if tp.offset >= 0}

    produce(40)
    c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "group.protocol": "consumer",
                     "enable.auto.commit": False, "auto.offset.reset": "earliest", "client.id": "survivor"})
    try:
        c.subscribe([topic])
        first = consume(c, 40)
        c.commit(asynchronous=False)
        before = committed_offsets(admin)
        assert before == {i: 10 for i in range(4)}
        member_before = [m.member_id for m in describe_group(admin, group).members]

        log_at = b.log_size()
        b.restart(kill=True)
        admin = admin_for(b)
        assert committed_offsets(admin) == before
        produce(20)
        second = consume(c, 20)
        c.commit(asynchronous=False)
        d = describe_group(admin, group)
        assert d.state.name == "STABLE" and [m.member_id for m in d.members] == member_before
        assert sorted(tp.partition for tp in d.members[0].assignment.topic_partitions) == [0, 1, 2, 3]
        after_restart = b.log_text(log_at)
        assert f"group {group}: member" not in after_restart, "the member had to join again after the restart"
        assert "bumped the group epoch" not in after_restart
        assert committed_offsets(admin) == {i: 15 for i in range(4)}
        assert len(set(first) | set(second)) == 60
    finally:
        c.close()


def test_list_and_describe_with_group_types(broker):
    admin = admin_for(broker)
    create_topic(admin, "kip848-types", 2)
    c = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "kip848-typed", "group.protocol": "consumer"})
    try:
        c.subscribe(["kip848-types"])
        deadline = time.monotonic() + 30
        while len(c.assignment()) < 2:
            assert time.monotonic() < deadline
            c.poll(0.1)
        listed = admin.list_consumer_groups(types={ck.ConsumerGroupType.CONSUMER}, request_timeout=10).result()
        ids = {g.group_id: g for g in listed.valid}
        assert "kip848-typed" in ids and ids["kip848-typed"].type == ck.ConsumerGroupType.CONSUMER
        classic = admin.list_consumer_groups(types={ck.ConsumerGroupType.CLASSIC}, request_timeout=10).result()
        assert "kip848-typed" not in {g.group_id for g in classic.valid}
        d = describe_group(admin, "kip848-typed")
        assert d.type == ck.ConsumerGroupType.CONSUMER and d.state.name == "STABLE"
        (m,) = d.members
        assert sorted(tp.partition for tp in m.assignment.topic_partitions) == [0, 1]
    finally:
        c.close()


@pytest.mark.parametrize("assignor", ["range", "uniform"])
def test_member_chosen_server_assignor(broker, assignor):
    admin = admin_for(broker)
    topic = f"kip848-{assignor}"
    create_topic(admin, topic, 5)
    group = f"kip848-{assignor}-group"
    cs = [ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "group.protocol": "consumer",
                       "group.remote.assignor": assignor, "client.id": f"m{i}"}) for i in range(2)]
    try:
        for c in cs:
            c.subscribe([topic])
        deadline = time.monotonic() + 30
        while sum(len(c.assignment()) for c in cs) != 5 or not all(c.assignment() for c in cs):
            assert time.monotonic() < deadline, [c.assignment() for c in cs]
            for c in cs:
                c.poll(0.05)
        parts = sorted(sorted(tp.partition for tp in c.assignment()) for c in cs)
        assert [len(p) for p in parts] in ([2, 3], [3, 2])
        if assignor == "range":
            assert all(p == list(range(p[0], p[0] + len(p))) for p in parts), parts   # contiguous ranges
    finally:
        for c in cs:
            c.close()


def test_cli_describe_shows_member_epochs_and_target_assignment(broker):
    admin = admin_for(broker)
    topic, group = "kip848-cli", "kip848-cli-group"
    create_topic(admin, topic, 4)
    cs = [ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "group.protocol": "consumer",
                       "client.id": f"cli-{i}"}) for i in range(2)]
    try:
        for c in cs:
            c.subscribe([topic])
        deadline = time.monotonic() + 30
        while True:
            for c in cs:
                c.poll(0.05)
            (g,) = odradek("groups", "describe", "--group", group, "--json", bootstrap=broker.bootstrap).ok().json()
            if g["state"] == "Stable" and len(g["members"]) == 2:
                break
            assert time.monotonic() < deadline, g
        assert g["type"] == "consumer" and g["assignor"] == "uniform"
        assert g["group_epoch"] == g["assignment_epoch"] >= 2
        owned = []
        for m in g["members"]:
            assert m["member_epoch"] == g["assignment_epoch"]
            assert m["assignment"] == m["target_assignment"] and len(m["assignment"]) == 2
            assert m["subscribed_topics"] == [topic]
            owned += [p for _, p in m["assignment"]]
        assert sorted(owned) == [0, 1, 2, 3]
        text = odradek("groups", "describe", "--group", group, bootstrap=broker.bootstrap).ok().stdout
        assert "MEMBER-EPOCH" in text and "TARGET-ASSIGNMENT" in text and "Assignment epoch" in text
        listed = odradek("groups", "list", "--json", bootstrap=broker.bootstrap).ok().json()
        assert {"group": group, "state": "Stable", "type": "consumer", "protocol_type": "consumer"} in listed
    finally:
        for c in cs:
            c.close()


def test_paused_member_loses_its_partitions_and_rejoins(broker, tmp_path):
    """SIGSTOP past the session timeout: the coordinator removes the member and the other takes its
    partitions; after SIGCONT the member finds itself unknown, gives its partitions up and joins again."""
    import signal
    admin = admin_for(broker)
    topic, group = "kip848-paused", "kip848-paused-group"
    create_topic(admin, topic)
    producer = ProducerThread(broker.bootstrap, topic, PARTITIONS, rate_per_s=200)
    everyone: list[Member] = []
    paused: dict[str, float] = {}
    try:
        a = Member("confluent", broker.bootstrap, topic, group, "a", tmp_path, group_protocol="consumer")
        b = Member("confluent", broker.bootstrap, topic, group, "b", tmp_path, group_protocol="consumer")
        everyone += [a, b]
        wait_stable(admin, group, [a, b], 30)
        b.proc.send_signal(signal.SIGSTOP)
        paused[b.label] = time.time()
        deadline = time.monotonic() + SESSION_MS / 1000 + 15
        while describe_view(admin, group)[1] != {"a": list(range(PARTITIONS))}:
            assert time.monotonic() < deadline, describe_view(admin, group)
            time.sleep(0.2)
        b.proc.send_signal(signal.SIGCONT)
        wait_stable(admin, group, [a, b], 30)
        acked = producer.stop()
        wait_caught_up(admin, group, topic, acked, 30, [a, b])
        for m in (a, b):
            m.close()
        # A stopped process is a zombie until it runs again and hears it was removed: it processes
        # nothing meanwhile (and its commits would be refused), so its ownership ends at the stop.
        stopped_at = paused[b.label]
        for p_, spans in ownership_intervals(everyone).items():
            spans = sorted((start, min(end, stopped_at) if name == b.label and start < stopped_at else end, name)
                           for start, end, name in spans)
            for (s1, e1, n1), (s2, e2, n2) in zip(spans, spans[1:]):
                assert s2 >= e1 or n1 == n2, f"partition {p_} owned by {n1} until {e1} and by {n2} from {s2}"
        assert_nothing_skipped(acked, everyone)
    finally:
        producer.abandon()
        for m in everyone:
            if m.alive:
                m.proc.send_signal(signal.SIGCONT)
                m.kill()


def test_consumer_protocol_can_be_switched_off(broker_factory):
    """group.coordinator.rebalance.protocols without "consumer": the broker offers neither
    ConsumerGroupHeartbeat nor ConsumerGroupDescribe (read by kafka-python's ApiVersions)."""
    from kafka import KafkaAdminClient

    def offered(b) -> set[int]:
        k = KafkaAdminClient(bootstrap_servers=b.bootstrap)
        try:
            return {int(key) for key in k.api_versions()}
        finally:
            k.close()

    on = broker_factory()
    assert {68, 69} <= offered(on)
    off = broker_factory(**{"group.coordinator.rebalance.protocols": "classic"})
    assert not {68, 69} & offered(off)
