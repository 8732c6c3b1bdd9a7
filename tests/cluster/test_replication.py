"""Replication and failover on a real cluster: ZooKeeper and three `odradek serve` processes, killed
with SIGKILL and restarted (seed 003, "Replication"). One cluster serves the module; each test leaves
every broker running and every partition fully replicated for the next."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import KafkaError, Producer

from .cluster_support import Cluster, CountingProducer, read_all, wait_for

log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster"), zookeeper, 3)
    try:
        c.start()
        yield c
    finally:
        c.shutdown()


@pytest.fixture(autouse=True)
def _every_broker_back(cluster):
    """A test that fails after killing a broker leaves it down: it is started again here, so the next
    test still gets the whole cluster (the module's promise) and one failure does not become several."""
    yield
    down = [b for b in cluster.brokers if not b.running]
    for b in down:
        log.warning("restarting %s, left down by the test", b)
        b.start()
    if down:
        wait_for("every broker registered again", lambda: len(cluster.metadata().brokers) == len(cluster.brokers),
                 timeout=60)


def _all_in_sync(cluster: Cluster, topic: str, replicas: int = 3) -> bool:
    states = cluster.partition_states(topic)
    return bool(states) and all(p.leader >= 0 and len(p.isrs) == replicas for p in states.values())


def test_acks_all_writes_reach_every_replica_and_survive_the_loss_of_the_leader(cluster):
    cluster.create_topic("copied", 3, 3, {"min.insync.replicas": "2"})
    p = CountingProducer(cluster.bootstrap, "copied", rate_per_s=5000)
    p.start()
    wait_for("5,000 acknowledged writes", lambda: p.acked_count() >= 5000)
    p.stop()
    leader = cluster.leader_of("copied", 0)
    cluster.brokers[leader].kill()
    wait_for("a new leader of copied-0", lambda: cluster.leader_of("copied", 0) not in (-1, leader))
    read = read_all(cluster.bootstrap, "copied", 3)
    lost, duplicated = p.checker.report(read)
    assert p.acked_count() >= 5000 and not lost and not duplicated, (len(lost), len(duplicated))
    cluster.brokers[leader].start()
    wait_for("the old leader back in every ISR", lambda: _all_in_sync(cluster, "copied"))


def test_leader_chase_kill_9_five_times_loses_no_acknowledged_record(cluster):
    """An idempotent acks=all producer writes a counted sequence while the leader is killed with
    SIGKILL five times and restarted: nothing acknowledged is lost, nothing is written twice."""
    cluster.create_topic("chase", 1, 3, {"min.insync.replicas": "2"})
    p = CountingProducer(cluster.bootstrap, "chase", rate_per_s=2000)
    p.start()
    resumed_after = []
    try:
        for round_ in range(5):
            wait_for("writes acknowledged", lambda n=p.acked_count(): p.acked_count() >= n + 500)
            leader = cluster.leader_of("chase", 0)
            killed_at = time.monotonic()
            cluster.brokers[leader].kill()
            before = p.acked_count()
            wait_for("writes resuming after the kill", lambda: p.acked_count() > before + 100, timeout=90)
            resumed_after.append(time.monotonic() - killed_at)
            assert cluster.leader_of("chase", 0) != leader
            cluster.brokers[leader].start()
            wait_for("the killed broker back in the ISR", lambda: _all_in_sync(cluster, "chase"), timeout=90)
    finally:
        p.stop()
    log.info("writes resumed %s s after each kill", [round(t, 1) for t in resumed_after])
    read = read_all(cluster.bootstrap, "chase", 1)
    lost, duplicated = p.checker.report(read)
    assert not lost, f"{len(lost)} acknowledged record(s) lost, e.g. {sorted(lost)[:10]}"
    assert not duplicated, f"{len(duplicated)} record(s) duplicated, e.g. {sorted(duplicated.items())[:10]}"
    assert p.acked_count() > 2500
    # zookeeper.session.timeout.ms (6 s) + 2 s is the target for kill -9 to writes resuming.
    assert max(resumed_after) < 6 + 2 + 4, resumed_after


def _produce_one(bootstrap: str, topic: str, acks: str, value: int) -> KafkaError | None:
    result: list = []
    pr = Producer({"bootstrap.servers": bootstrap, "acks": acks, "message.timeout.ms": 8000,
                   "enable.idempotence": False, "retries": 0})
    pr.produce(topic, str(value).encode(), on_delivery=lambda err, msg: result.append(err))
    assert pr.flush(30) == 0
    return result[0]


def test_two_of_three_down_refuses_acks_all_and_takes_acks_1(cluster):
    cluster.create_topic("quorum", 1, 3, {"min.insync.replicas": "2"})
    leader = cluster.leader_of("quorum", 0)
    others = [b for b in range(3) if b != leader]
    for b in others:
        cluster.brokers[b].kill()
    wait_for("the ISR shrunk to the leader", lambda: [p.isrs for p in cluster.partition_states("quorum").values()]
             == [[leader]], timeout=60)
    err = _produce_one(cluster.bootstrap, "quorum", "all", 1)
    assert err is not None and err.code() == KafkaError.NOT_ENOUGH_REPLICAS, err
    assert _produce_one(cluster.bootstrap, "quorum", "1", 2) is None
    for b in others:
        cluster.brokers[b].start()
    wait_for("the ISR whole again", lambda: _all_in_sync(cluster, "quorum"), timeout=90)
    assert _produce_one(cluster.bootstrap, "quorum", "all", 3) is None
    # The refused write was never appended; the acks=1 write survived the returning replicas' truncation.
    assert read_all(cluster.bootstrap, "quorum", 1) == [2, 3]


def test_the_controller_killed_another_takes_over(cluster):
    old = cluster.controller_id()
    cluster.brokers[old].kill()
    try:
        new = wait_for("a new controller", lambda: (c := cluster.controller_id()) not in (-1, old) and c + 1,
                       timeout=60)
        assert new
        cluster.create_topic("after-failover", 2, 2)
    finally:
        cluster.brokers[old].start()
    wait_for("every broker back", lambda: len(cluster.metadata().brokers) == 3)
    for topic in ("copied", "chase", "quorum"):
        wait_for(f"{topic} whole", lambda t=topic: _all_in_sync(cluster, t), timeout=90)


def test_a_paused_leader_is_replaced_and_rejoins_after_truncating(cluster):
    """SIGSTOP of the leader past replica.lag.time.max.ms and its ZooKeeper session: another broker
    leads, writes go on; after SIGCONT the paused broker registers again, follows, and catches up."""
    import os
    import signal
    cluster.create_topic("paused", 1, 3, {"min.insync.replicas": "2"})
    p = CountingProducer(cluster.bootstrap, "paused", rate_per_s=2000)
    p.start()
    try:
        wait_for("writes acknowledged", lambda: p.acked_count() >= 1000)
        leader = cluster.leader_of("paused", 0)
        os.kill(cluster.brokers[leader].pid, signal.SIGSTOP)
        try:
            wait_for("another leader", lambda: cluster.leader_of("paused", 0) not in (-1, leader), timeout=60)
            before = p.acked_count()
            wait_for("writes going on without it", lambda: p.acked_count() > before + 1000, timeout=60)
            assert leader not in cluster.partition_states("paused")[0].isrs
        finally:
            os.kill(cluster.brokers[leader].pid, signal.SIGCONT)
        wait_for("the paused broker back in the ISR", lambda: _all_in_sync(cluster, "paused"), timeout=90)
        mark = p.acked_count()
        wait_for("writes after its return", lambda: p.acked_count() > mark + 500)
    finally:
        p.stop()
    lost, duplicated = p.checker.report(read_all(cluster.bootstrap, "paused", 1))
    assert not lost and not duplicated, (len(lost), len(duplicated))
    assert "registered again" in cluster.brokers[leader].log_text()


def _replicas(cluster: Cluster, topic: str) -> list[int]:
    return list(cluster.partition_states(topic)[0].replicas)


def _write(cluster: Cluster, topic: str, values: range, acks: str, partitions: int | None = None) -> None:
    """Write `values`; with `partitions`, value v goes to partition v % partitions (the sticky
    partitioner alone may put a quick burst in a single partition, leaving the others empty)."""
    pr = Producer({"bootstrap.servers": cluster.bootstrap, "acks": acks, "message.timeout.ms": 30000})
    errors: list = []
    for v in values:
        where = {} if partitions is None else {"partition": v % partitions}
        pr.produce(topic, str(v).encode(), on_delivery=lambda err, msg: err and errors.append(err), **where)
    assert pr.flush(60) == 0 and not errors, errors


@pytest.mark.parametrize("unclean", [False, True])
def test_every_isr_member_dead(cluster, unclean):
    """Unclean election off: the partition stays offline until an ISR member returns, and nothing is
    lost. On: a replica outside the ISR leads, and what only the old ISR had is lost and logged."""
    topic = f"unclean-{'on' if unclean else 'off'}"
    cluster.create_topic(topic, 1, 2, {"unclean.leader.election.enable": str(unclean).lower()})
    first, second = _replicas(cluster, topic)
    _write(cluster, topic, range(0, 100), "all")      # both replicas have these
    cluster.brokers[second].kill()                      # the follower: the ISR shrinks to the leader
    wait_for("the ISR down to the leader", lambda: cluster.partition_states(topic)[0].isrs == [first])
    _write(cluster, topic, range(100, 200), "1")        # only the leader has these
    cluster.brokers[first].kill()
    wait_for("the partition offline", lambda: cluster.partition_states(topic)[0].leader == -1)
    cluster.brokers[second].start()
    if not unclean:
        wait_for("the returning replica registered", lambda: second in [b for b in cluster.metadata().brokers])
        assert cluster.partition_states(topic)[0].leader == -1     # it is not in the ISR: no leader
        cluster.brokers[first].start()
        wait_for("the ISR member leading again", lambda: cluster.partition_states(topic)[0].leader == first)
        assert sorted(read_all(cluster.bootstrap, topic, 1)) == list(range(200))
    else:
        wait_for("the out-of-sync replica leading", lambda: cluster.partition_states(topic)[0].leader == second)
        assert sorted(read_all(cluster.bootstrap, topic, 1)) == list(range(100))
        controller = cluster.brokers[cluster.controller_id()]
        assert f"unclean leader election for {topic}-0" in controller.log_text()
        cluster.brokers[first].start()
    wait_for(f"{topic} whole again", lambda: _all_in_sync(cluster, topic, 2), timeout=90)
    expected = list(range(200)) if not unclean else list(range(100))
    assert sorted(read_all(cluster.bootstrap, topic, 1)) == expected


def _coordinator_of(cluster: Cluster, group: str) -> int:
    admin = cluster.admin()
    desc = admin.describe_consumer_groups([group])[group].result(30)
    return desc.coordinator.id


def test_a_consumer_group_goes_on_when_its_coordinator_dies(cluster):
    """confluent-kafka: the group's coordinator broker is killed; the group's offsets partition gets a
    new leader, which loads the group; committed offsets are intact and consumption goes on."""
    from confluent_kafka import Consumer, TopicPartition
    cluster.create_topic("grouped", 3, 3, {"min.insync.replicas": "2"})
    p = CountingProducer(cluster.bootstrap, "grouped", rate_per_s=20000)
    p.start()
    wait_for("3,000 records written", lambda: p.acked_count() >= 3000)
    p.stop()
    total = p.acked_count()
    config = {"bootstrap.servers": cluster.bootstrap, "group.id": "survivors", "auto.offset.reset": "earliest",
              "enable.auto.commit": False, "session.timeout.ms": 10000}
    c = Consumer(config)
    seen: set[int] = set()
    try:
        c.subscribe(["grouped"])
        wait_for("a first part consumed", lambda: [seen.add(int(m.value())) for m in c.consume(500, 0.5)
                                                   if not m.error()] is not None and len(seen) >= 1000)
        c.commit(asynchronous=False)
        committed = {tp.partition: tp.offset for tp in c.committed(
            [TopicPartition("grouped", i) for i in range(3)], timeout=10)}
        coordinator = _coordinator_of(cluster, "survivors")
        cluster.brokers[coordinator].kill()
        wait_for("every record consumed", lambda: [seen.add(int(m.value())) for m in c.consume(500, 0.5)
                                                   if not m.error()] is not None and len(seen) >= total, timeout=90)
        c.commit(asynchronous=False)
        assert _coordinator_of(cluster, "survivors") != coordinator
    finally:
        c.close()
    assert seen == p.checker.acked
    check = Consumer({**config, "group.id": "survivors"})
    try:
        after = {tp.partition: tp.offset for tp in check.committed(
            [TopicPartition("grouped", i) for i in range(3)], timeout=10)}
        ends = {i: check.get_watermark_offsets(TopicPartition("grouped", i), timeout=10)[1] for i in range(3)}
    finally:
        check.close()
    assert sum(ends.values()) == total, ends
    assert all(after[i] >= committed[i] for i in range(3)), (committed, after)
    # Every partition committed at its end (a partition the producer never picked has no commit: -1001).
    assert {i: max(after[i], 0) for i in range(3)} == ends, (after, ends)
    cluster.brokers[coordinator].start()
    wait_for("the killed coordinator back in every ISR", lambda: _all_in_sync(cluster, "grouped"), timeout=90)


def test_a_consumer_protocol_group_goes_on_when_its_coordinator_dies(cluster):
    """KIP-848 (seed 002) with librdkafka's `group.protocol=consumer`: two members share a topic; the
    group's coordinator broker is killed. The new leader of the group's offsets partition replays the
    group's records (group epoch, target assignment, member epochs) and the members go on heartbeating
    with their epochs: no sampled moment has a partition owned by both, every record is consumed, the
    committed offsets are intact, and the group is described by the new coordinator as a consumer group
    with both members."""
    from confluent_kafka import Consumer, TopicPartition
    cluster.create_topic("grouped-848", 4, 3, {"min.insync.replicas": "2"})
    _write(cluster, "grouped-848", range(4000), "all", partitions=4)     # 1,000 in each partition
    config = {"bootstrap.servers": cluster.bootstrap, "group.id": "survivors-848", "group.protocol": "consumer",
              "auto.offset.reset": "earliest", "enable.auto.commit": False}
    members = [Consumer({**config, "client.id": f"m{i}"}) for i in range(2)]
    seen: set[int] = set()
    overlaps: list = []

    def poll_all() -> int:
        for c in members:
            seen.update(int(m.value()) for m in c.consume(500, 0.2) if not m.error())
        owned = [{tp.partition for tp in c.assignment()} for c in members]
        if owned[0] & owned[1]:
            overlaps.append(owned)
        return len(seen)

    def both_assigned() -> bool:
        poll_all()
        return all(c.assignment() for c in members)

    def commit_positions() -> None:
        for c in members:   # explicit positions: sent even when unchanged since the last commit
            owned = [tp for tp in c.position(c.assignment()) if tp.offset >= 0]
            if owned:
                refused = [tp for tp in c.commit(offsets=owned, asynchronous=False) if tp.error is not None]
                assert not refused, refused

    def committed() -> dict[int, int]:
        return {tp.partition: tp.offset for tp in members[0].committed(
            [TopicPartition("grouped-848", i) for i in range(4)], timeout=10)}

    def group_state() -> dict:
        return {"committed": committed(),
                "members": [(c.memberid(), sorted((tp.partition, tp.offset) for tp in c.position(c.assignment())))
                            for c in members]}

    def all_committed_at_the_end() -> bool:
        # Partitions may still move between the members (the second one's share, taken from the first
        # after it joined); each owner goes on from the group's committed offset.
        poll_all()
        commit_positions()
        return all(offset == 1000 for offset in committed().values())

    try:
        for c in members:
            c.subscribe(["grouped-848"])
        wait_for("both members assigned", both_assigned, timeout=90)
        wait_for("a first part consumed", lambda: poll_all() >= 1000)
        commit_positions()
        before = committed()
        coordinator = _coordinator_of(cluster, "survivors-848")
        cluster.brokers[coordinator].kill()
        wait_for("every record consumed", lambda: poll_all() >= 4000, timeout=120)
        wait_for("every partition committed at its end through the new coordinator", all_committed_at_the_end,
                 timeout=90, state=group_state)
        after = committed()
        admin = cluster.admin()         # kept: a client destroyed first would leave the future unanswered
        described = admin.describe_consumer_groups(["survivors-848"])["survivors-848"].result(30)
    finally:
        for c in members:
            c.close()
    assert seen == set(range(4000))
    assert not overlaps, overlaps[:3]
    assert all(after[i] >= before[i] for i in range(4)), (before, after)   # nothing committed went back
    assert described.coordinator.id != coordinator
    assert described.type.name == "CONSUMER" and {m.client_id for m in described.members} == {"m0", "m1"}
    cluster.brokers[coordinator].start()
    wait_for("the killed coordinator back in every ISR", lambda: _all_in_sync(cluster, "grouped-848"), timeout=90)


def test_kafka_python_group_goes_on_when_its_coordinator_dies(cluster):
    from kafka import KafkaConsumer
    cluster.create_topic("grouped-kp", 2, 3)
    _write(cluster, "grouped-kp", range(2000), "all", partitions=2)
    c = KafkaConsumer("grouped-kp", bootstrap_servers=cluster.bootstrap.split(","), group_id="kp-survivors",
                      auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=1000)
    seen: set[int] = set()
    try:
        def poll() -> int:
            for records in c.poll(timeout_ms=500, max_records=500).values():
                seen.update(int(r.value) for r in records)
            return len(seen)
        wait_for("a first part consumed", lambda: poll() >= 500)
        c.commit()
        coordinator = _coordinator_of(cluster, "kp-survivors")
        cluster.brokers[coordinator].kill()
        wait_for("every record consumed", lambda: poll() >= 2000, timeout=90)
        wait_for("a commit accepted by the new coordinator", lambda: c.commit() is None, timeout=60)
    finally:
        c.close(autocommit=False)
    assert seen == set(range(2000))
    cluster.brokers[coordinator].start()
    wait_for("the killed coordinator back", lambda: _all_in_sync(cluster, "grouped-kp"), timeout=90)


def test_a_reassignment_moves_a_partition_under_load_with_nothing_lost(cluster):
    """kafka-python's admin (AlterPartitionReassignments to the controller): the partition moves off
    its first replica while an acks=all producer writes; the new replica catches up, the old one is
    dropped and its log deleted; nothing acknowledged is lost."""
    from kafka import KafkaAdminClient, TopicPartition as KTopicPartition
    cluster.create_topic("moving", 1, 2)
    old = _replicas(cluster, "moving")
    target = [old[1], next(b for b in range(3) if b not in old)]
    p = CountingProducer(cluster.bootstrap, "moving", rate_per_s=3000)
    p.start()
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap.split(","))
    try:
        wait_for("writes acknowledged", lambda: p.acked_count() >= 1000)
        admin.alter_partition_reassignments({KTopicPartition("moving", 0): target})
        wait_for("the reassignment complete", lambda: _replicas(cluster, "moving") == target
                 and not admin.list_partition_reassignments(), timeout=60)
        mark = p.acked_count()
        wait_for("writes going on", lambda: p.acked_count() > mark + 500)
    finally:
        p.stop()
        admin.close()
    lost, duplicated = p.checker.report(read_all(cluster.bootstrap, "moving", 1))
    assert not lost and not duplicated, (len(lost), len(duplicated))
    assert sorted(cluster.partition_states("moving")[0].isrs) == sorted(target)
    gone = cluster.brokers[old[0]].log_dir / "moving-0"
    wait_for("the old replica's log deleted", lambda: not gone.exists())


def test_preferred_leader_election_through_confluent_kafka(cluster):
    from confluent_kafka import TopicPartition
    from confluent_kafka import ElectionType
    cluster.create_topic("prefer", 1, 3)
    preferred = _replicas(cluster, "prefer")[0]
    cluster.brokers[preferred].kill()
    try:
        wait_for("another leader", lambda: cluster.leader_of("prefer", 0) not in (-1, preferred))
    finally:
        cluster.brokers[preferred].start()
    wait_for("the preferred replica back in the ISR", lambda: _all_in_sync(cluster, "prefer"), timeout=90)
    admin = cluster.admin()
    result = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition("prefer", 0)]).result(30)
    assert all(err is None for err in result.values()), result
    wait_for("the preferred replica leading", lambda: cluster.leader_of("prefer", 0) == preferred)


def test_zookeeper_restarted_the_cluster_goes_on_and_recovers(cluster):
    """Writes and replication do not need ZooKeeper from moment to moment; while it is down the
    cluster serves; when it returns the brokers reconnect and controller work (a new topic) resumes."""
    cluster.create_topic("through-zk-restart", 1, 3, {"min.insync.replicas": "2"})
    p = CountingProducer(cluster.bootstrap, "through-zk-restart", rate_per_s=2000)
    p.start()
    try:
        wait_for("writes acknowledged", lambda: p.acked_count() >= 500)
        cluster.zookeeper.stop()
        try:
            mark = p.acked_count()
            wait_for("writes going on without ZooKeeper", lambda: p.acked_count() > mark + 1000)
        finally:
            cluster.zookeeper.start()
        cluster.create_topic("after-zk-restart", 1, 3)
        mark = p.acked_count()
        wait_for("writes going on after", lambda: p.acked_count() > mark + 500)
    finally:
        p.stop()
    lost, duplicated = p.checker.report(read_all(cluster.bootstrap, "through-zk-restart", 1))
    assert not lost and not duplicated, (len(lost), len(duplicated))
    assert _all_in_sync(cluster, "through-zk-restart")


def test_a_broker_just_started_answers_metadata_with_the_controllers_view(cluster):
    """Until the controller's first UpdateMetadata, a broker knows only itself. A client that asks it
    then must get the cluster, not that one broker: librdkafka drops the brokers an answer does not
    name, and an admin request then waits for a controller it cannot reach (CreateTopics timed out so
    once in a few cluster starts). The controller is paused (SIGSTOP) while the broker starts, so the
    client's Metadata meets the broker before any UpdateMetadata does."""
    import os
    import signal
    import threading
    from confluent_kafka.admin import AdminClient
    controller = cluster.controller_id()
    restarted = cluster.brokers[next(i for i in range(3) if i != controller)]
    assert restarted.stop() == 0
    wait_for("the stopped broker unregistered", lambda: len(cluster.metadata().brokers) == 2)
    mark = restarted.log_size()
    answers: list = []
    os.kill(cluster.brokers[controller].pid, signal.SIGSTOP)
    try:
        restarted.start()
        asker = threading.Thread(target=lambda: answers.append(
            AdminClient({"bootstrap.servers": restarted.bootstrap}).list_topics(timeout=30)))
        asker.start()
        wait_for("the client's Metadata answered or held for the controller's view",
                 lambda: answers or "wait for the controller's first UpdateMetadata" in restarted.log_text(mark),
                 timeout=20)
    finally:
        os.kill(cluster.brokers[controller].pid, signal.SIGCONT)
    asker.join(40)
    assert answers, "no Metadata answer"
    assert sorted(answers[0].brokers) == [0, 1, 2]
    assert answers[0].controller_id in answers[0].brokers    # the paused one, unless its session ran out
    for name in [t for t in cluster.metadata().topics if not t.startswith("__")]:
        wait_for(f"{name} whole again", lambda t=name: _all_in_sync(cluster, t, len(_replicas(cluster, t))),
                 timeout=90)
