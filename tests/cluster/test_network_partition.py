"""A network partition isolating a partition's leader (seed 003, "Replication"): every broker reaches
ZooKeeper and the other brokers' replication listener through a proxy of its own (`tcp_proxy.py`);
clients reach each broker directly. Cutting the leader's two proxies leaves it serving clients but
unable to reach ZooKeeper or be fetched from: another replica is elected once its session expires,
and the old leader, healed, registers again, truncates what it took but never committed, and follows.
No acknowledged record is lost."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse

from odradek.cluster.local_zookeeper import free_port

from tests.integration.clients import RawClient

from .cluster_support import Cluster, CountingProducer, read_all, wait_for
from .tcp_proxy import TcpProxy


@pytest.fixture(scope="module")
def proxied_cluster(zookeeper, tmp_path_factory):
    zk_proxies, replication_proxies, extra = [], [], []
    for i in range(3):
        zk_proxies.append(TcpProxy(zookeeper.port))
        port = free_port()
        replication_proxies.append(TcpProxy(port))
        extra.append({
            "zookeeper.connect": f"127.0.0.1:{zk_proxies[i].port}",
            "listeners": f"PLAINTEXT://127.0.0.1:0,REPLICATION://127.0.0.1:{port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:0,REPLICATION://127.0.0.1:{replication_proxies[i].port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,REPLICATION:PLAINTEXT",
            "inter.broker.listener.name": "REPLICATION",
        })
    c = Cluster(tmp_path_factory.mktemp("partitioned"), zookeeper, 3)
    for b, overrides in zip(c.brokers, extra):
        b.overrides.update({k: str(v) for k, v in overrides.items()})
    try:
        c.start()
        yield c, zk_proxies, replication_proxies
    finally:
        for p in zk_proxies + replication_proxies:
            p.heal()
        try:
            c.shutdown()
        finally:
            for p in zk_proxies + replication_proxies:
                p.close()


def test_an_isolated_leader_loses_no_acknowledged_record(proxied_cluster):
    cluster, zk_proxies, replication_proxies = proxied_cluster
    cluster.create_topic("split", 1, 3, {"min.insync.replicas": "2"})
    p = CountingProducer(cluster.bootstrap, "split", rate_per_s=2000)
    p.start()
    try:
        wait_for("writes acknowledged", lambda: p.acked_count() >= 1000)
        leader = cluster.leader_of("split", 0)
        zk_proxies[leader].cut()
        replication_proxies[leader].cut()
        try:
            wait_for("another leader", lambda: cluster.leader_of("split", 0) not in (-1, leader), timeout=60)
            mark = p.acked_count()
            wait_for(f"writes going on at the new leader (producer errors so far: {p.errors})",
                     lambda: p.acked_count() > mark + 1000, timeout=60)
        finally:
            zk_proxies[leader].heal()
            replication_proxies[leader].heal()
        wait_for("the isolated broker back in the ISR", lambda: sorted(
            cluster.partition_states("split")[0].isrs) == [0, 1, 2], timeout=90)
        mark = p.acked_count()
        wait_for("writes after healing", lambda: p.acked_count() > mark + 500)
    finally:
        p.stop()
    lost, duplicated = p.checker.report(read_all(cluster.bootstrap, "split", 1))
    assert not lost, f"{len(lost)} acknowledged record(s) lost, e.g. {sorted(lost)[:10]}"
    assert not duplicated, f"{len(duplicated)} duplicated"
    wait_for("the isolated broker registered again", lambda: "registered again" in cluster.brokers[leader].log_text())


def test_what_the_controller_could_not_deliver_reaches_the_broker_once_healed(proxied_cluster):
    """The controller reaches a broker through its replication listener. With that path cut and its
    ZooKeeper path intact (still registered, so no re-registration will resend anything), a new topic's
    LeaderAndIsr and UpdateMetadata fail to reach it; once healed, the controller sends them again
    (Kafka's controller retries a request until its broker answers or leaves), and the broker leads
    and follows its replicas of the topic."""
    cluster, _, replication_proxies = proxied_cluster
    controller = cluster.controller_id()
    cut = next(i for i in range(3) if i != controller)
    mark = cluster.brokers[controller].log_size()
    replication_proxies[cut].cut()
    try:
        cluster.create_topic("missed", 3, 3)
        wait_for("the controller's request to the cut-off broker failed",
                 lambda: f"to broker {cut} failed" in cluster.brokers[controller].log_text(mark), timeout=30)
    finally:
        replication_proxies[cut].heal()
    led_there = [p for p, st in cluster.partition_states("missed").items() if st.leader == cut]
    assert led_there, "round-robin placement gives every broker one partition to lead"
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "message.timeout.ms": 60_000})
    errors: list = []
    for partition in range(3):
        p.produce("missed", str(partition).encode(), partition=partition,
                  on_delivery=lambda err, msg: err is not None and errors.append((msg.partition(), err)))
    assert p.flush(70) == 0 and not errors, errors
    wait_for("every replica of the topic in sync", lambda: all(
        sorted(st.isrs) == [0, 1, 2] for st in cluster.partition_states("missed").values()), timeout=60)
    assert sorted(read_all(cluster.bootstrap, "missed", 3)) == [0, 1, 2]
    assert f"broker(s) [{cut}] the whole metadata" in cluster.brokers[controller].log_text(mark)


def test_a_broker_that_missed_a_deletion_drops_the_topic_and_sets_its_logs_aside(proxied_cluster):
    """A topic deleted while one of its replicas' brokers is cut off from the controller: that broker
    misses the UpdateMetadata and StopReplica of the deletion. Once healed it is sent everything again,
    marked FULL (KIP-516): it drops the topic from its metadata and renames its logs `-stray` (kept, as
    Kafka keeps strays), so it neither lists nor serves a topic the cluster no longer has."""
    cluster, _, replication_proxies = proxied_cluster
    cluster.create_topic("doomed", 2, 3)
    controller = cluster.controller_id()
    cut = next(i for i in range(3) if i != controller)
    broker = cluster.brokers[cut]
    data = broker.log_dir
    wait_for("the replicas of doomed on the broker to be cut off",
             lambda: {"doomed-0", "doomed-1"} <= {d.name for d in data.iterdir()})
    mark = broker.log_size()
    replication_proxies[cut].cut()
    try:
        admin = AdminClient({"bootstrap.servers": cluster.brokers[controller].bootstrap})
        admin.delete_topics(["doomed"])["doomed"].result(30)
        wait_for("the deletion done", lambda: not cluster.partition_states("doomed"))
        assert "doomed" in _topics_of(broker)
    finally:
        replication_proxies[cut].heal()
    wait_for("the cut-off broker no longer lists doomed", lambda: "doomed" not in _topics_of(broker))
    wait_for("its logs of doomed set aside", lambda: "set aside 2 stray log(s)" in broker.log_text(mark))
    names = {d.name for d in data.iterdir()}
    assert not {"doomed-0", "doomed-1"} & names
    assert sorted(n.split(".")[0] for n in names if n.endswith("-stray")) == ["doomed-0", "doomed-1"]


def _topics_of(broker) -> set[str]:
    """The topics one broker's Metadata names (kafka-python's codec, that broker alone: a client
    library would ask whichever broker it likes)."""
    with RawClient(broker.bootstrap, timeout=10) as raw:
        answer = raw.call(MetadataRequest(topics=None, allow_auto_topic_creation=False), MetadataResponse, 12)
    return {t.name for t in answer.topics}
