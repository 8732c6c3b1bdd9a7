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
    new = wait_for("a new controller", lambda: (c := cluster.controller_id()) not in (-1, old) and c + 1, timeout=60)
    assert new
    cluster.create_topic("after-failover", 2, 2)
    cluster.brokers[old].start()
    wait_for("every broker back", lambda: len(cluster.metadata().brokers) == 3)
    for topic in ("copied", "chase", "quorum"):
        wait_for(f"{topic} whole", lambda t=topic: _all_in_sync(cluster, t), timeout=90)
