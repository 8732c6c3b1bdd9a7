"""Transactions on a real cluster: ZooKeeper and three `odradek serve` processes (seed 003, "Message
Delivery Semantics" and "WriteTxnMarkers API"; KIP-98). The transaction coordinator writes its COMMIT
and ABORT markers to partitions led by other brokers with WriteTxnMarkers; `__transaction_state` takes
transaction.state.log.replication.factor (3) replicas; the coordinator moves with the leadership of its
partition, so a transactional copier whose coordinator is killed with SIGKILL (and restarted) still
copies every input record exactly once. One cluster serves the module."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from confluent_kafka import Producer

from odradek.coordinator.transactions_records import TRANSACTION_STATE_TOPIC, partition_for
from tests.integration.conftest import ROOT
from tests.integration.txn_support import end_offsets, read_values

from .cluster_support import Cluster, wait_for

TXN_PARTITIONS = 5
OVERRIDES = {
    "transaction.state.log.num.partitions": TXN_PARTITIONS,
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 500,
    "group.initial.rebalance.delay.ms": 0,
}


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster"), zookeeper, 3, OVERRIDES)
    try:
        c.start()
        yield c
    finally:
        c.shutdown()


def _all_in_sync(cluster: Cluster, topic: str, replicas: int = 3) -> bool:
    states = cluster.partition_states(topic)
    return bool(states) and all(p.leader >= 0 and len(p.isrs) == replicas for p in states.values())


def _spread_topic(cluster: Cluster, name: str, partitions: int = 3) -> dict[int, int]:
    """A topic with RF 3 whose partitions are led by different brokers: partition -> leader."""
    cluster.create_topic(name, partitions, 3, {"min.insync.replicas": "2"})
    leaders = {p: s.leader for p, s in cluster.partition_states(name).items()}
    assert len(set(leaders.values())) == min(partitions, 3), leaders
    return leaders


def test_commit_and_abort_across_partitions_led_by_different_brokers(cluster):
    leaders = _spread_topic(cluster, "txn-spread")
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "spread", "linger.ms": 5})
    p.init_transactions(60)
    # __transaction_state was created on first need with the configured replication factor, not 1.
    states = cluster.partition_states(TRANSACTION_STATE_TOPIC)
    assert len(states) == TXN_PARTITIONS and all(len(s.replicas) == 3 for s in states.values()), states
    coordinator = states[partition_for("spread", TXN_PARTITIONS)].leader
    assert any(leader != coordinator for leader in leaders.values())   # markers must travel
    p.begin_transaction()
    for i in range(30):
        p.produce("txn-spread", b"committed-%d" % i, partition=i % 3)
    p.commit_transaction(60)
    p.begin_transaction()
    for i in range(12):
        p.produce("txn-spread", b"aborted-%d" % i, partition=i % 3)
    p.flush(60)               # on the brokers before the abort (librdkafka purges unsent records)
    p.abort_transaction(60)
    p.begin_transaction()
    for i in range(3):
        p.produce("txn-spread", b"last-%d" % i, partition=i)
    p.commit_transaction(60)

    committed = read_values(cluster.bootstrap, "txn-spread", 3, "read_committed")
    everything = read_values(cluster.bootstrap, "txn-spread", 3, "read_uncommitted")
    assert sorted(committed) == sorted([b"committed-%d" % i for i in range(30)] + [b"last-%d" % i for i in range(3)])
    assert sorted(everything) == sorted(committed + [b"aborted-%d" % i for i in range(12)])
    # Every marker is written: the last stable offset is the high watermark on each partition.
    assert end_offsets(cluster.bootstrap, "txn-spread", 3, "read_committed") == \
        end_offsets(cluster.bootstrap, "txn-spread", 3, "read_uncommitted")


def _start_copier(bootstrap: str, source: str, target: str, partitions: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.integration.txn_copier", bootstrap, source, target,
                             str(partitions), "cluster-copier-group", "cluster-copier", "200", "200"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ},
                            start_new_session=True)


def _stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    if proc.stdout:
        proc.stdout.close()
    return out


def test_copier_exactly_once_while_its_coordinator_is_killed(cluster):
    source, target, partitions, total = "ccopy-in", "ccopy-out", 3, 10000
    _spread_topic(cluster, source, partitions)
    _spread_topic(cluster, target, partitions)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(total):
        p.produce(source, b"record-%05d" % i, partition=i % partitions)
    assert p.flush(60) == 0

    txn_partition = partition_for("cluster-copier", TXN_PARTITIONS)
    proc = _start_copier(cluster.bootstrap, source, target, partitions)
    restarts = 0
    try:
        wait_for("the copier to commit some output", lambda: sum(
            end_offsets(cluster.bootstrap, target, partitions, "read_committed")) >= 2000, timeout=90)
        coordinator = cluster.leader_of(TRANSACTION_STATE_TOPIC, txn_partition)
        cluster.brokers[coordinator].kill()
        at_kill = end_offsets(cluster.bootstrap, target, partitions, "read_uncommitted")
        assert sum(at_kill) < total, "the copier finished before its coordinator was killed"
        wait_for("a new transaction coordinator", lambda: cluster.leader_of(TRANSACTION_STATE_TOPIC, txn_partition)
                 not in (-1, coordinator), timeout=60)
        cluster.brokers[coordinator].start()

        def done() -> bool:
            nonlocal proc, restarts
            if proc.poll() is not None:     # a copier that gave up on an error starts again, as a job would
                print(_stop(proc)[-2000:])
                restarts += 1
                assert restarts <= 5, "the copier keeps failing"
                proc = _start_copier(cluster.bootstrap, source, target, partitions)
            return len(read_values(cluster.bootstrap, target, partitions, "read_committed")) >= total
        wait_for("every input copied", done, timeout=180, interval=1.0)
    finally:
        _stop(proc)
    wait_for("the killed broker back in every ISR", lambda: _all_in_sync(cluster, TRANSACTION_STATE_TOPIC)
             and _all_in_sync(cluster, target), timeout=90)
    copied = read_values(cluster.bootstrap, target, partitions, "read_committed")
    print(f"copier: {restarts} restart(s), {len(copied)} committed")
    assert sorted(copied) == [b"copied:record-%05d" % i for i in range(total)], \
        f"{len(copied)} copied, {len(set(copied))} distinct"
    assert end_offsets(cluster.bootstrap, target, partitions, "read_committed") == \
        end_offsets(cluster.bootstrap, target, partitions, "read_uncommitted")


def test_leaders_verify_and_add_with_a_coordinator_on_another_broker(cluster):
    """KIP-890 over the inter-broker path: a partition led by a broker that is not the transactional
    id's coordinator asks that coordinator with AddPartitionsToTxn v5 (verify_only below Produce v12;
    an add from v12)."""
    from odradek.protocol.messages import find_coordinator as fc
    from tests.integration.test_txn_verification import INVALID_TXN_STATE, NONE, Txn, Wire

    leaders = _spread_topic(cluster, "txn-remote")
    txn_id = "remote-verify"
    wire = Wire(cluster.brokers[0])
    found = wait_for("the coordinator", lambda: (r := wire.call(fc, 1, fc.FindCoordinatorRequest(
        key=txn_id, key_type=1))).error_code == NONE and r, 60)
    wire.close()
    coordinator = found.node_id
    t = Txn(Wire(cluster.brokers[coordinator]), txn_id)
    partition, leader = next((p, b) for p, b in leaders.items() if b != coordinator)
    t.wire = Wire(cluster.brokers[leader])
    assert t.produce("txn-remote", b"unadded", version=10, partition=partition)[0] == INVALID_TXN_STATE
    assert t.produce("txn-remote", b"added-by-leader", version=12, partition=partition) == (NONE, None)
    t.wire = Wire(cluster.brokers[coordinator])
    assert [(x.topic, list(x.partitions)) for x in t.describe().topics] == [("txn-remote", [partition])]
    r = t.end(True, version=5)
    assert (r.error_code, r.producer_epoch) == (NONE, t.epoch + 1)
    wait_for("the commit", lambda: read_values(cluster.bootstrap, "txn-remote", 3, "read_committed")
             == [b"added-by-leader"], 60)
