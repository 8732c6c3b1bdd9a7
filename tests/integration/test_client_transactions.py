"""odradek.client's transactions against a real broker (seed 003, "Message Delivery Semantics"; KIP-98):
our transactional producer commits and aborts, as confluent-kafka (librdkafka) and our own consumer see
with isolation.level=read_committed; zombie fencing; errors as Kafka's client classifies them; a copier
written with odradek.client (read_committed consumer, transactional producer,
send_offsets_to_transaction) killed with SIGKILL again and again copies every input record exactly
once; our read_committed consumer, polled 1, 7, 500 and 100,000 records at a time, hands out every
committed record once and in order, no aborted record and no control record.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from odradek.client import (
    Consumer, ConsumerGroupMetadata, InvalidProducerEpochError, KafkaError, KafkaTimeoutError, Producer,
    ProducerFencedError, TopicPartition, TransactionAbortedError, TxnState,
)
from odradek.client import sync
from odradek.protocol.error_codes import ErrorCode
from odradek.client.errors import IllegalStateError

from .clients import wait_until
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


def _run(coro):
    return asyncio.run(coro)


async def _read_committed(bootstrap: str, topic: str, partitions: int, *, poll: int = 500,
                          isolation: str = "read_committed") -> dict[int, list]:
    """Every record our consumer hands out up to each partition's end (the last stable offset for
    read_committed), polled `poll` records at a time."""
    async with Consumer({"bootstrap.servers": bootstrap, "isolation.level": isolation,
                         "auto.offset.reset": "earliest"}) as c:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        ends = await c.end_offsets(tps)
        out: dict[int, list] = {p: [] for p in range(partitions)}
        deadline = asyncio.get_running_loop().time() + 60
        while any([await c.position(tp) < ends[tp] for tp in tps]):
            assert asyncio.get_running_loop().time() < deadline, "not read to the end in 60 s"
            for tp, records in (await c.getmany(timeout_ms=200, max_records=poll)).items():
                out[tp.partition] += records
        return out


def test_commit_and_abort_read_by_confluent_and_by_ours(broker, admin):
    topic = _topic(admin, "ctxn-commit-abort", 2)

    async def produce() -> None:
        async with Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "ours-1",
                             "linger.ms": 2}) as p:
            await p.init_transactions()
            assert p.transaction_state is TxnState.READY
            p.begin_transaction()
            for i in range(10):
                await p.send(topic, b"committed-%d" % i, partition=i % 2)
            await p.commit_transaction()
            p.begin_transaction()
            futures = [await p.send(topic, b"aborted-%d" % i, partition=i % 2) for i in range(7)]
            await p.flush()                    # on the broker, then aborted
            assert all(f.done() and f.exception() is None for f in futures)
            await p.abort_transaction()
            p.begin_transaction()
            unsent = await p.send(topic, b"never-sent", partition=0)
            await p.abort_transaction()        # before the sender took it: dropped
            with pytest.raises(TransactionAbortedError):
                await unsent
            p.begin_transaction()
            await p.send(topic, b"committed-last", partition=1)
            await p.commit_transaction()
            assert p.transaction_state is TxnState.READY
    _run(produce())

    expected = sorted([b"committed-%d" % i for i in range(10)] + [b"committed-last"])
    assert sorted(read_values(broker.bootstrap, topic, 2, "read_committed")) == expected
    everything = read_values(broker.bootstrap, topic, 2, "read_uncommitted")
    assert sorted(everything) == sorted(expected + [b"aborted-%d" % i for i in range(7)])
    ours = _run(_read_committed(broker.bootstrap, topic, 2))
    assert sorted(r.value for rs in ours.values() for r in rs) == expected
    # Offsets are the log's: markers and aborted records leave gaps, never reorderings.
    for records in ours.values():
        offsets = [r.offset for r in records]
        assert offsets == sorted(set(offsets))
    uncommitted = _run(_read_committed(broker.bootstrap, topic, 2, isolation="read_uncommitted"))
    assert sorted(r.value for rs in uncommitted.values() for r in rs) == sorted(everything)


def test_zombie_is_fenced(broker, admin):
    topic = _topic(admin, "ctxn-zombie")

    async def scenario() -> None:
        config = {"bootstrap.servers": broker.bootstrap, "transactional.id": "ours-zombie", "linger.ms": 1}
        async with Producer(config) as old, Producer(config) as new:
            await old.init_transactions()
            old.begin_transaction()
            await (await old.send(topic, b"zombie-1"))
            await new.init_transactions()      # bumps the epoch: the old producer's transaction is aborted
            new.begin_transaction()
            await new.send(topic, b"new-1")
            await new.commit_transaction()
            # KIP-588: the partition leader's INVALID_PRODUCER_EPOCH is abortable; the abort's EndTxn
            # then learns from the coordinator that the producer is fenced, which is fatal.
            with pytest.raises(InvalidProducerEpochError) as raised:
                await old.send(topic, b"zombie-2")
                await old.commit_transaction()
            assert raised.value.abortable and not raised.value.fatal
            assert old.transaction_state is TxnState.ABORTABLE_ERROR
            with pytest.raises(ProducerFencedError) as fenced:
                await old.abort_transaction()
            assert fenced.value.fatal
            assert old.transaction_state is TxnState.FATAL_ERROR
            with pytest.raises(ProducerFencedError):
                old.begin_transaction()
            with pytest.raises(ProducerFencedError):
                await old.send(topic, b"zombie-3")
    _run(scenario())
    assert read_values(broker.bootstrap, topic, 1, "read_committed") == [b"new-1"]
    assert b"zombie-2" not in read_values(broker.bootstrap, topic, 1, "read_uncommitted")


def test_send_outside_a_transaction_and_bad_calls(broker, admin):
    topic = _topic(admin, "ctxn-states")

    async def scenario() -> None:
        async with Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "ours-states"}) as p:
            with pytest.raises(IllegalStateError):
                p.begin_transaction()          # before init_transactions
            await p.init_transactions()
            with pytest.raises(IllegalStateError):
                await p.send(topic, b"x")      # outside a transaction
            with pytest.raises(IllegalStateError):
                await p.commit_transaction()
            p.begin_transaction()
            with pytest.raises(IllegalStateError):
                p.begin_transaction()
            await p.commit_transaction()       # nothing in it: no EndTxn
            # A call that times out goes on; calling it again waits for the same result (Java's way).
            p.begin_transaction()
            await p.send(topic, b"slow-commit")
            with pytest.raises(KafkaTimeoutError):
                await p.commit_transaction(timeout=0)
            with pytest.raises(IllegalStateError, match="in progress"):
                await p.abort_transaction()
            await p.commit_transaction()
            assert p.transaction_state is TxnState.READY
        async with Producer({"bootstrap.servers": broker.bootstrap}) as plain:
            with pytest.raises(IllegalStateError):
                await plain.init_transactions()
    _run(scenario())
    assert read_values(broker.bootstrap, topic, 1, "read_committed") == [b"slow-commit"]


def test_transaction_timed_out_by_the_coordinator_is_abortable_then_fenced(broker, admin):
    """KIP-588: the coordinator aborts a transaction past transaction.timeout.ms and bumps the epoch; the
    producer's next write gets INVALID_PRODUCER_EPOCH (abortable) and its next transactional request
    PRODUCER_FENCED (fatal), as Kafka's client reports them."""
    topic = _topic(admin, "ctxn-timeout")

    async def scenario() -> None:
        async with Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "ours-timeout",
                             "transaction.timeout.ms": 1000, "linger.ms": 1}) as p:
            await p.init_transactions()
            p.begin_transaction()
            await (await p.send(topic, b"left-open"))
            wait_until(lambda: end_offsets(broker.bootstrap, topic, 1, "read_committed") == [2], 20,
                       "the coordinator to abort the timed-out transaction")
            with pytest.raises(InvalidProducerEpochError):
                await (await p.send(topic, b"after-timeout"))
            assert p.transaction_state is TxnState.ABORTABLE_ERROR
            with pytest.raises(InvalidProducerEpochError):
                await p.commit_transaction()
            with pytest.raises(ProducerFencedError):
                await p.abort_transaction()
            assert p.transaction_state is TxnState.FATAL_ERROR
    _run(scenario())
    assert read_values(broker.bootstrap, topic, 1, "read_committed") == []


def test_sync_facade_and_offsets_in_the_transaction(broker, admin):
    """The synchronous facade: send_offsets_to_transaction commits the group's offsets only with the
    transaction (read back by confluent-kafka's committed())."""
    from confluent_kafka import Consumer as CKConsumer, TopicPartition as CKTP
    source = _topic(admin, "ctxn-sync-in")
    target = _topic(admin, "ctxn-sync-out")
    group = "ctxn-sync-group"
    with sync.Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "ours-sync"}) as p, \
            sync.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                           "isolation.level": "read_committed"}) as c:
        p.init_transactions()
        meta = c.group_metadata()
        assert meta == ConsumerGroupMetadata(group, -1, "", None)
        p.begin_transaction()
        p.send(target, b"aborted")
        p.send_offsets_to_transaction({(source, 0): 5}, meta)
        p.abort_transaction()
        p.begin_transaction()
        f = p.send(target, b"committed")
        p.send_offsets_to_transaction({(source, 0): (9, "batch-9")}, meta)
        p.commit_transaction()
        assert f.result(10).offset >= 0
        assert c.committed([(source, 0)]) == {TopicPartition(source, 0): 9}
    ck = CKConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        (tp,) = ck.committed([CKTP(source, 0)], timeout=10)
        assert (tp.offset, tp.metadata) == (9, "batch-9")
    finally:
        ck.close()
    assert read_values(broker.bootstrap, target, 1, "read_committed") == [b"committed"]


def _start_copier(broker, source: str, target: str, partitions: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.integration.ctxn_copier", broker.bootstrap, source, target,
                             str(partitions), "ours-copier-group", "ours-copier", "1000", "1000"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ},
                            start_new_session=True)


def test_our_copier_killed_repeatedly_copies_exactly_once(broker, admin):
    source, target, partitions, total = "ctxn-copy-in", "ctxn-copy-out", 3, 10000
    _topic(admin, source, partitions)
    _topic(admin, target, partitions)
    seed_input(broker.bootstrap, source, partitions, total)
    kills = run_copier_killed(broker.bootstrap, target, partitions, total,
                              lambda: _start_copier(broker, source, target, partitions))
    expected = [b"copied:record-%05d" % i for i in range(total)]
    copied = read_values(broker.bootstrap, target, partitions, "read_committed")
    uncommitted = read_values(broker.bootstrap, target, partitions, "read_uncommitted")
    print(f"our copier: {kills} kills, {len(uncommitted)} records in the output log, {len(copied)} committed")
    assert len(uncommitted) > total, "no kill left an open transaction behind"
    assert sorted(copied) == expected, f"{len(copied)} copied, {len(set(copied))} distinct, after {kills} kills"
    ours = _run(_read_committed(broker.bootstrap, target, partitions))
    assert sorted(r.value for rs in ours.values() for r in rs) == expected
    # Per partition, the copies keep the input's order.
    for partition, records in ours.items():
        values = [r.value for r in records]
        assert values == sorted(values), f"partition {partition} out of order"


def _whole_log(bootstrap: str, topic: str, partitions: int) -> dict[int, list[tuple[int, bytes]]]:
    """(offset, value) of every record, aborted ones included, read by confluent-kafka to each
    partition's end."""
    import time

    from confluent_kafka import Consumer as CKConsumer, KafkaError as CKError, TopicPartition as CKTP

    from .clients import confluent_config
    c = CKConsumer(confluent_config(bootstrap, **{"group.id": f"log-{time.monotonic_ns()}", "enable.auto.commit": False,
                                                 "isolation.level": "read_uncommitted", "enable.partition.eof": True}))
    out: dict[int, list] = {p: [] for p in range(partitions)}
    try:
        c.assign([CKTP(topic, p, 0) for p in range(partitions)])
        at_end: set[int] = set()
        deadline = time.monotonic() + 60
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, "log not read to its end in 60 s"
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                assert m.error().code() == CKError._PARTITION_EOF, m.error()
                at_end.add(m.partition())
                continue
            at_end.discard(m.partition())
            out[m.partition()].append((m.offset(), m.value()))
    finally:
        c.close()
    return out


def test_read_committed_across_poll_sizes(broker, admin):
    """Two transactional producers interleave committed and aborted transactions on the same partitions,
    with non-transactional records between them; our read_committed consumer, polled 1, 7, 500 and
    100,000 records at a time, hands out exactly the committed and non-transactional records, each
    once, in offset order (checked against the whole log read by confluent-kafka)."""
    topic = _topic(admin, "ctxn-poll-sizes", 2)

    async def produce() -> None:
        base = {"bootstrap.servers": broker.bootstrap, "linger.ms": 1, "batch.size": 4096}
        async with Producer({**base, "transactional.id": "poll-a"}) as a, \
                Producer({**base, "transactional.id": "poll-b"}) as b, Producer(base) as plain:
            await asyncio.gather(a.init_transactions(), b.init_transactions())
            for t in range(40):
                commit_a, commit_b = t % 3 != 1, t % 4 != 2
                a.begin_transaction()
                b.begin_transaction()
                for i in range(50 + t * 7):
                    part = i % 2
                    await a.send(topic, b"a-%03d-%04d-%s" % (t, i, b"c" if commit_a else b"x"), partition=part)
                    await b.send(topic, b"b-%03d-%04d-%s" % (t, i, b"c" if commit_b else b"x"), partition=part)
                    if i % 25 == 0:
                        await plain.send(topic, b"p-%03d-%04d-c" % (t, i), partition=part)
                await asyncio.gather(a.flush(), b.flush(), plain.flush())   # aborted records reach the log too
                await asyncio.gather(a.commit_transaction() if commit_a else a.abort_transaction(),
                                     b.commit_transaction() if commit_b else b.abort_transaction())
    _run(produce())

    log = _whole_log(broker.bootstrap, topic, 2)
    expected = {p: [(o, v) for o, v in log[p] if v.endswith(b"-c")] for p in range(2)}
    aborted = sum(v.endswith(b"-x") for p in range(2) for _, v in log[p])
    assert aborted > 1000 and sum(map(len, expected.values())) > 5000
    for poll in (1, 7, 500, 100_000):
        got = _run(_read_committed(broker.bootstrap, topic, 2, poll=poll))
        for p in range(2):
            assert [(r.offset, r.value) for r in got[p]] == expected[p], f"poll size {poll}, partition {p}"


def test_prepared_transaction_ended_by_another_client(broker, admin):
    """KIP-939's first phase: prepare_transaction flushes and leaves the transaction open; the admin
    client, given its id, producer id and epoch, commits it after the producer is gone (a repeat of
    the commit succeeds); DescribeTransactions shows it Ongoing, then CompleteCommit. Another is aborted
    that way, and one fenced by a newer producer of its id can no longer be committed."""
    from odradek.client import Admin
    topic = _topic(admin, "ctxn-prepared")

    async def scenario() -> None:
        base = {"bootstrap.servers": broker.bootstrap, "linger.ms": 1}
        prepared = {}
        for tid in ("prep-commit", "prep-abort", "prep-fenced"):
            async with Producer({**base, "transactional.id": tid}) as p:
                await p.init_transactions()
                p.begin_transaction()
                for i in range(3):
                    await p.send(topic, b"%s-%d" % (tid.encode(), i))
                prepared[tid] = await p.prepare_transaction()
                assert p.transaction_state is TxnState.PREPARED
        async with Producer({**base, "transactional.id": "prep-fenced"}) as newer:
            await newer.init_transactions()
        async with Admin({"bootstrap.servers": broker.bootstrap}) as a:
            described = await a.describe_transactions(["prep-commit", "prep-fenced"])
            assert described["prep-commit"].state == "Ongoing"
            assert described["prep-commit"].producer_id == prepared["prep-commit"].producer_id
            assert described["prep-commit"].partitions == (TopicPartition(topic, 0),)
            assert described["prep-fenced"].producer_epoch > prepared["prep-fenced"].producer_epoch
            await a.end_transaction(prepared["prep-commit"], commit=True)
            await a.end_transaction(prepared["prep-commit"], commit=True)     # a retry succeeds
            await a.end_transaction(prepared["prep-abort"], commit=False)
            with pytest.raises(ProducerFencedError):
                await a.end_transaction(prepared["prep-fenced"], commit=True)
            assert (await a.describe_transactions(["prep-commit"]))["prep-commit"].state == "CompleteCommit"
    _run(scenario())
    assert read_values(broker.bootstrap, topic, 1, "read_committed") == [b"prep-commit-%d" % i for i in range(3)]
    assert len(read_values(broker.bootstrap, topic, 1, "read_uncommitted")) == 9


def test_offsets_of_a_group_member_and_a_stale_generation(broker, admin):
    """KIP-447: a subscribed consumer's group_metadata() carries its generation and member id; offsets
    sent with it commit with the transaction, and offsets sent with a generation the group has left
    behind are refused (ILLEGAL_GENERATION): an abortable error, after which the producer aborts and
    goes on."""
    from dataclasses import replace

    from odradek.client import TransactionAbortableError
    source = _topic(admin, "ctxn-member-in")
    target = _topic(admin, "ctxn-member-out")
    group = "ctxn-member-group"

    async def scenario() -> None:
        async with Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "ours-member"}) as p, \
                Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                          "isolation.level": "read_committed", "auto.offset.reset": "earliest"}) as c:
            await p.init_transactions()
            c.subscribe([source])
            deadline = asyncio.get_running_loop().time() + 30
            while not c.assignment():
                assert asyncio.get_running_loop().time() < deadline, "no assignment in 30 s"
                await c.getmany(timeout_ms=200)
            meta = c.group_metadata()
            assert meta.group_id == group and meta.generation_id >= 1 and meta.member_id
            p.begin_transaction()
            await p.send(target, b"with-offsets")
            await p.send_offsets_to_transaction({(source, 0): 3}, meta)
            await p.commit_transaction()
            assert await c.committed([(source, 0)]) == {TopicPartition(source, 0): 3}
            p.begin_transaction()
            await p.send(target, b"stale")
            with pytest.raises(TransactionAbortableError) as raised:
                await p.send_offsets_to_transaction({(source, 0): 4}, replace(meta, generation_id=meta.generation_id + 7))
            assert raised.value.code == ErrorCode.ILLEGAL_GENERATION
            assert raised.value.abortable and p.transaction_state is TxnState.ABORTABLE_ERROR
            with pytest.raises(TransactionAbortableError):
                await p.commit_transaction()
            await p.abort_transaction()
            assert await c.committed([(source, 0)]) == {TopicPartition(source, 0): 3}
            p.begin_transaction()
            await p.send(target, b"after-abort")
            await p.commit_transaction()
    _run(scenario())
    assert read_values(broker.bootstrap, target, 1, "read_committed") == [b"with-offsets", b"after-abort"]


def test_failed_batch_makes_the_transaction_abortable_and_the_abort_bumps_the_epoch(broker, admin):
    """A numbered batch refused for good (MESSAGE_TOO_LARGE for the topic's max.message.bytes) leaves the
    broker's sequence for the partition unknown to us: the transaction becomes abortable, and the abort
    bumps the epoch with InitProducerId naming the current producer id and epoch (KIP-360), after which
    the next transaction's sequences start over and commit."""
    from confluent_kafka.admin import NewTopic

    from odradek.client import TransactionAbortableError
    topic = "ctxn-too-large"
    admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": "2000"})])[topic].result(30)

    async def scenario() -> None:
        async with Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "ours-bump",
                             "linger.ms": 1}) as p:
            await p.init_transactions()
            p.begin_transaction()
            await (await p.send(topic, b"small-1"))
            await p.commit_transaction()
            pid, epoch = p.producer_id, p.producer_epoch
            p.begin_transaction()
            await (await p.send(topic, b"small-2"))
            big = await p.send(topic, b"x" * 5000)
            with pytest.raises(KafkaError):
                await big
            assert p.transaction_state is TxnState.ABORTABLE_ERROR
            with pytest.raises(TransactionAbortableError):
                await p.commit_transaction()
            await p.abort_transaction()
            assert (p.producer_id, p.producer_epoch) == (pid, epoch + 1)
            for i in range(3):
                p.begin_transaction()
                await p.send(topic, b"after-%d" % i)
                await p.commit_transaction()
    _run(scenario())
    assert read_values(broker.bootstrap, topic, 1, "read_committed") == [b"small-1"] + [b"after-%d" % i for i in range(3)]
