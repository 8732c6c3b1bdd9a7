"""Transactions with real clients (seed 003, "Message Delivery Semantics"; KIP-98): a confluent-kafka
(librdkafka) transactional producer commits and aborts, read_committed readers see only committed
records and read_uncommitted readers see the aborted ones too; the last stable offset holds
read_committed readers and ListOffsets behind an open transaction; zombie fencing; a transaction left
open past its timeout is aborted; a transactional copier killed with SIGKILL again and again still
copies every input record exactly once; the same commit and abort with kafka-python.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .clients import confluent_config, wait_until
from .conftest import ROOT
from .txn_support import end_offsets, read_values, run_copier_killed, seed_input

BROKER_OVERRIDES = {
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 200,
    "group.initial.rebalance.delay.ms": 0,
    "transaction.state.log.num.partitions": 5,
}


def _topic(admin, name: str, partitions: int = 1) -> str:
    from confluent_kafka.admin import NewTopic
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def _producer(broker, transactional_id: str, **extra):
    from confluent_kafka import Producer
    p = Producer(confluent_config(broker.bootstrap, **{"transactional.id": transactional_id, "linger.ms": 5},
                                  **extra))
    p.init_transactions(30)
    return p


def test_commit_and_abort_confluent(broker, admin):
    topic = _topic(admin, "txn-commit-abort", 2)
    p = _producer(broker, "commit-abort")
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, b"committed-%d" % i, partition=i % 2)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(7):
        p.produce(topic, b"aborted-%d" % i, partition=i % 2)
    p.flush(30)                      # on the broker before the abort (librdkafka purges unsent records)
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(topic, b"committed-last", partition=1)
    p.commit_transaction(30)

    committed = read_values(broker.bootstrap, topic, 2, "read_committed")
    everything = read_values(broker.bootstrap, topic, 2, "read_uncommitted")
    assert sorted(committed) == sorted([b"committed-%d" % i for i in range(10)] + [b"committed-last"])
    assert sorted(everything) == sorted(committed + [b"aborted-%d" % i for i in range(7)])
    # Every partition ends at its high watermark once nothing is open, for both isolation levels.
    assert end_offsets(broker.bootstrap, topic, 2, "read_committed") == \
        end_offsets(broker.bootstrap, topic, 2, "read_uncommitted")
    txnindex = list(Path(broker.log_dir).glob(f"{topic}-*/*.txnindex"))
    assert txnindex and all(f.stat().st_size % 34 == 0 and f.stat().st_size > 0 for f in txnindex)


def test_open_transaction_holds_the_last_stable_offset(broker, admin):
    topic = _topic(admin, "txn-lso")
    p = _producer(broker, "lso")
    p.begin_transaction()
    p.produce(topic, b"before")
    p.commit_transaction(30)
    stable = end_offsets(broker.bootstrap, topic, 1, "read_committed")[0]
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, b"open-%d" % i)
    p.flush(30)
    hw = end_offsets(broker.bootstrap, topic, 1, "read_uncommitted")[0]
    assert hw == stable + 5
    assert end_offsets(broker.bootstrap, topic, 1, "read_committed")[0] == stable
    assert read_values(broker.bootstrap, topic, 1, "read_committed") == [b"before"]
    p.commit_transaction(30)
    assert end_offsets(broker.bootstrap, topic, 1, "read_committed")[0] == hw + 1   # past the COMMIT marker
    assert read_values(broker.bootstrap, topic, 1, "read_committed") == [b"before"] + [b"open-%d" % i for i in range(5)]


def test_zombie_is_fenced(broker, admin):
    from confluent_kafka import KafkaException
    topic = _topic(admin, "txn-zombie")
    old = _producer(broker, "zombie")
    old.begin_transaction()
    old.produce(topic, b"zombie-1")
    old.flush(30)
    new = _producer(broker, "zombie")          # bumps the epoch; the old producer's transaction is aborted
    new.begin_transaction()
    new.produce(topic, b"new-1")
    new.commit_transaction(30)
    with pytest.raises(KafkaException) as raised:
        old.produce(topic, b"zombie-2")
        old.commit_transaction(30)
    err = raised.value.args[0]
    assert err.fatal() or "fenced" in str(err).lower(), err
    assert read_values(broker.bootstrap, topic, 1, "read_committed") == [b"new-1"]
    assert b"zombie-2" not in read_values(broker.bootstrap, topic, 1, "read_uncommitted")


def test_transaction_timeout_aborts(broker, admin):
    topic = _topic(admin, "txn-timeout")
    p = _producer(broker, "timeout", **{"transaction.timeout.ms": 1500, "socket.timeout.ms": 1500,
                                        "message.timeout.ms": 1500})
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, b"left-open-%d" % i)
    p.flush(30)
    assert end_offsets(broker.bootstrap, topic, 1, "read_committed") == [0]
    # The coordinator aborts it: an ABORT marker moves the last stable offset past the records.
    wait_until(lambda: end_offsets(broker.bootstrap, topic, 1, "read_committed") == [4], 20,
               "the timed-out transaction to be aborted")
    assert read_values(broker.bootstrap, topic, 1, "read_committed") == []
    assert len(read_values(broker.bootstrap, topic, 1, "read_uncommitted")) == 3
    from confluent_kafka import KafkaException
    with pytest.raises(KafkaException):
        p.commit_transaction(30)


def test_invalid_transaction_timeout(broker):
    from confluent_kafka import KafkaException, Producer
    p = Producer(confluent_config(broker.bootstrap, **{"transactional.id": "too-long",
                                                       "transaction.timeout.ms": 900_001}))
    with pytest.raises(KafkaException) as raised:
        p.init_transactions(30)
    assert "timeout" in str(raised.value).lower()


def _start_copier(broker, source: str, target: str, partitions: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tests.integration.txn_copier", broker.bootstrap, source, target,
                             str(partitions), "copier-group", "copier", "5000", "200"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ}, start_new_session=True)
    return proc


def test_copier_killed_repeatedly_copies_exactly_once(broker, admin):
    """The issue's figure: 100,000 records, copied in transactions of 5,000 (each holding its output
    for 200 ms of work before the commit), the copier killed with SIGKILL five times, each time in the
    middle of a transaction after it has committed output of its own."""
    source, target, partitions, total = "copy-in", "copy-out", 3, 100_000
    _topic(admin, source, partitions)
    _topic(admin, target, partitions)
    seed_input(broker.bootstrap, source, partitions, total)
    kills = run_copier_killed(broker.bootstrap, target, partitions, total,
                              lambda: _start_copier(broker, source, target, partitions), commit_between_kills=True)
    copied = read_values(broker.bootstrap, target, partitions, "read_committed")
    uncommitted = read_values(broker.bootstrap, target, partitions, "read_uncommitted")
    print(f"copier: {kills} kills, {len(uncommitted)} records in the output log, {len(copied)} committed")
    assert kills >= 3, "the copier finished before it was killed three times"
    assert len(uncommitted) > total, "no kill left an open transaction behind"
    assert sorted(copied) == [b"copied:record-%05d" % i for i in range(total)], \
        f"{len(copied)} copied, {len(set(copied))} distinct, after {kills} kills"
    # The killed copiers' uncommitted output is in the log but not in the read_committed view.
    assert len(uncommitted) >= total


def test_commit_and_abort_kafka_python(broker, admin):
    from kafka import KafkaProducer
    topic = _topic(admin, "txn-kafka-python")
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kafka-python-txn")
    try:
        p.init_transactions()
        p.begin_transaction()
        for i in range(4):
            p.send(topic, b"kp-committed-%d" % i)
        p.commit_transaction()
        p.begin_transaction()
        for i in range(3):
            p.send(topic, b"kp-aborted-%d" % i)
        p.flush()
        p.abort_transaction()
    finally:
        p.close()
    assert read_values(broker.bootstrap, topic, 1, "read_committed") == [b"kp-committed-%d" % i for i in range(4)]
    assert len(read_values(broker.bootstrap, topic, 1, "read_uncommitted")) == 7


def test_broker_restart_mid_transactions_leaves_none_hanging(broker_factory, tmp_path):
    """kill -9 the broker while a producer commits and aborts transactions in a loop: after the restart
    every transaction is either completed from __transaction_state or aborted by its timeout, so the
    last stable offset catches up with the high watermark and read_committed sees only whole
    committed transactions."""
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import AdminClient
    b = broker_factory(transaction_abort_timed_out_transaction_cleanup_interval_ms=200,
                       transaction_state_log_num_partitions=3)
    admin = AdminClient(confluent_config(b.bootstrap))
    topic = _topic(admin, "txn-restart", 2)
    p = Producer(confluent_config(b.bootstrap, **{"transactional.id": "restart", "transaction.timeout.ms": 3000,
                                                 "socket.timeout.ms": 3000, "message.timeout.ms": 3000, "linger.ms": 1}))
    p.init_transactions(30)
    n = 0
    while sum(end_offsets(b.bootstrap, topic, 2, "read_uncommitted")) < 200:
        p.begin_transaction()
        for _ in range(5):
            p.produce(topic, b"t%04d-" % n + (b"c" if n % 3 else b"a"), partition=n % 2)
        p.flush(10)
        if n % 3:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)
        n += 1
    p.begin_transaction()
    for _ in range(5):
        p.produce(topic, b"t%04d-open" % n, partition=n % 2)
    p.flush(10)
    try:
        p.commit_transaction(0.001)   # begins the commit; the broker dies under it
    except KafkaException:
        pass
    b.kill()
    b.start()
    wait_until(lambda: end_offsets(b.bootstrap, topic, 2, "read_committed")
               == end_offsets(b.bootstrap, topic, 2, "read_uncommitted"), 30,
               "every transaction to be completed or aborted after the restart")
    committed = read_values(b.bootstrap, topic, 2, "read_committed")
    assert committed and all(v.endswith(b"c") or v.endswith(b"open") for v in committed)
    by_txn: dict[bytes, int] = {}
    for v in committed:
        by_txn[v[:5]] = by_txn.get(v[:5], 0) + 1
    assert all(c == 5 for c in by_txn.values()), "a transaction is visible in part"


def test_admin_describes_lists_and_aborts(broker, admin, kadmin):
    """kafka-python's admin (what kafka-transactions.sh does): ListTransactions, DescribeTransactions,
    DescribeProducers on an open transaction, and an administrative abort (WriteTxnMarkers to the
    partition leader) that moves the last stable offset past it."""
    from kafka.admin import AbortTransactionSpec
    from kafka.structs import TopicPartition
    topic = _topic(admin, "txn-admin")
    p = _producer(broker, "admin-txn")
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, b"open-%d" % i)
    p.flush(30)
    def listing(**filters) -> dict:
        return {t.transactional_id: t for per_broker in kadmin.list_transactions(**filters).values()
                for t in per_broker}

    listed = listing()
    assert "admin-txn" in listed and str(listed["admin-txn"].state).lower().endswith("ongoing")
    assert "admin-txn" in listing(state_filters=["Ongoing"])
    assert "admin-txn" not in listing(state_filters=["Empty"])
    described = kadmin.describe_transactions(["admin-txn"])["admin-txn"]
    assert described.producer_id == listed["admin-txn"].producer_id
    assert {(tp.topic, tp.partition) for tp in described.topic_partitions} == {(topic, 0)}
    tp = TopicPartition(topic, 0)
    producers = kadmin.describe_producers([tp])[tp]
    (active,) = [s for s in producers.active_producers if s.producer_id == described.producer_id]
    assert active.current_transaction_start_offset == 0
    assert end_offsets(broker.bootstrap, topic, 1, "read_committed") == [0]
    kadmin.abort_transaction(AbortTransactionSpec(tp, active.producer_id, active.producer_epoch,
                                                  active.coordinator_epoch))
    assert end_offsets(broker.bootstrap, topic, 1, "read_committed") == [4]
    assert read_values(broker.bootstrap, topic, 1, "read_committed") == []


def test_pending_transactional_offsets_are_unstable_until_commit(broker, admin):
    """KIP-447: offsets sent in an open transaction are not committed; a read_committed consumer's
    OffsetFetch (require_stable) is answered UNSTABLE_OFFSET_COMMIT until the COMMIT marker, then
    gets them; aborted offsets never appear."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    topic = _topic(admin, "txn-offsets")
    consumer = Consumer(confluent_config(broker.bootstrap, **{"group.id": "txn-offsets-group",
                                                             "isolation.level": "read_committed"}))
    p = _producer(broker, "offsets-txn")
    try:
        tp = TopicPartition(topic, 0)
        p.begin_transaction()
        p.produce(topic, b"x")
        p.send_offsets_to_transaction([TopicPartition(topic, 0, 17)], consumer.consumer_group_metadata(), 30)
        with pytest.raises(KafkaException):
            consumer.committed([tp], timeout=2)     # retried while unstable, until the timeout
        p.abort_transaction(30)
        assert consumer.committed([tp], timeout=10)[0].offset < 0
        p.begin_transaction()
        p.produce(topic, b"y")
        p.send_offsets_to_transaction([TopicPartition(topic, 0, 42)], consumer.consumer_group_metadata(), 30)
        p.commit_transaction(30)
        assert consumer.committed([tp], timeout=10)[0].offset == 42
    finally:
        consumer.close()
