"""The transactional copier of `test_transactions.py` (seed 003, "Message Delivery Semantics"; KIP-98,
KIP-447) written with kafka-python (`kp_txn_copier`) and with aiokafka (`aio_txn_copier`):
read-process-write with send_offsets_to_transaction, killed with SIGKILL five times and restarted,
still copies every input record exactly once for a read_committed reader, while a read_uncommitted
reader also sees the records of the killed copiers' aborted transactions. The output is read by
confluent-kafka and by the copier's own client, with each isolation level, and both see the same.

Each test copies 100,000 records in chunks of 5,000 with 200 ms of work a chunk (about 20 committed
transactions; the confluent-kafka test copies 10,000 in chunks of 1,000 with 1 s of work). Every
kill lands after the running copier committed a transaction of its own and while its next one holds
copied records (`commit_between_kills`), so the kills are spread over the copy; half of each chunk's
work comes after send_offsets_to_transaction, so some kills leave pending group offsets behind that
the restart must abort. About 20-25 s with kafka-python and 13 s with aiokafka on two cores.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Callable

from .conftest import ROOT
from .txn_support import read_records, run_copier_killed, seed_input

BROKER_OVERRIDES = {
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 200,
    "group.initial.rebalance.delay.ms": 0,
    "transaction.state.log.num.partitions": 5,
}
# The transaction and offset APIs' request log (API, version, client), attached to a failure's report.
BROKER_LOGGERS = {f"odradek.requests.completed.{api}": "DEBUG" for api in (
    "InitProducerId", "AddPartitionsToTxn", "AddOffsetsToTxn", "TxnOffsetCommit", "EndTxn", "OffsetFetch")}


def _topic(admin, name: str, partitions: int) -> str:
    from confluent_kafka.admin import NewTopic
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def _start(module: str, broker, source: str, target: str, partitions: int, name: str, chunk: int,
           process_ms: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", f"tests.integration.{module}", broker.bootstrap, source, target,
                             str(partitions), f"{name}-group", name, str(chunk), str(process_ms)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ},
                            start_new_session=True)


def _read_kafka_python(bootstrap: str, topic: str, partitions: int, isolation: str) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record kafka-python's consumer with `isolation` hands out up to
    each partition's end as it asks for it (the last stable offset for read_committed)."""
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False,
                      request_timeout_ms=15000)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning()
        ends = c.end_offsets(tps)
        out: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + 60
        while any(c.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"kafka-python did not read {topic} to its end ({isolation})"
            for tp, records in c.poll(timeout_ms=200).items():
                out += [(tp.partition, r.offset, r.value) for r in records]
        return out
    finally:
        c.close()


def _read_aiokafka(bootstrap: str, topic: str, partitions: int, isolation: str) -> list[tuple[int, int, bytes]]:
    """As `_read_kafka_python`, with aiokafka's consumer."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def read() -> list[tuple[int, int, bytes]]:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False)
        await c.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(partitions)]
            c.assign(tps)
            await c.seek_to_beginning()
            ends = await c.end_offsets(tps)
            out: list[tuple[int, int, bytes]] = []
            deadline = time.monotonic() + 60
            while any([await c.position(tp) < ends[tp] for tp in tps]):
                assert time.monotonic() < deadline, f"aiokafka did not read {topic} to its end ({isolation})"
                for tp, records in (await c.getmany(timeout_ms=200)).items():
                    out += [(tp.partition, r.offset, r.value) for r in records]
            return out
        finally:
            await c.stop()
    return asyncio.run(read())


def _copy_killed_repeatedly(broker, admin, module: str, name: str, total: int, chunk: int, process_ms: int,
                            read_own: Callable[[str, str, int, str], list[tuple[int, int, bytes]]]) -> None:
    source, target, partitions = f"{name}-in", f"{name}-out", 3
    _topic(admin, source, partitions)
    _topic(admin, target, partitions)
    seed_input(broker.bootstrap, source, partitions, total)
    kills = run_copier_killed(broker.bootstrap, target, partitions, total,
                              lambda: _start(module, broker, source, target, partitions, name, chunk, process_ms),
                              commit_between_kills=True)
    committed = read_records(broker.bootstrap, target, partitions, "read_committed")
    everything = read_records(broker.bootstrap, target, partitions, "read_uncommitted")
    copied = [value for _, _, value in committed]
    print(f"{name}: {kills} kills, {len(everything)} records in the output log, {len(copied)} committed")
    assert kills >= 3, "the copier finished before it was killed three times"
    assert sorted(copied) == [b"copied:record-%05d" % i for i in range(total)], \
        f"{len(copied)} copied, {len(set(copied))} distinct, after {kills} kills"
    # The killed copiers' open transactions were aborted: their records are in the log, a
    # read_uncommitted reader sees them, a read_committed reader none of them.
    committed_at = {(p, o) for p, o, _ in committed}
    aborted = [(p, o, v) for p, o, v in everything if (p, o) not in committed_at]
    assert committed_at <= {(p, o) for p, o, _ in everything}
    assert aborted, "no kill left an open transaction behind"
    assert len(everything) == len(committed) + len(aborted)
    assert {v for _, _, v in aborted} <= set(copied), "an aborted record is not a copy of an input record"
    # The copier's own client reads the output as confluent-kafka does, with each isolation level.
    assert sorted(read_own(broker.bootstrap, target, partitions, "read_committed")) == sorted(committed)
    assert sorted(read_own(broker.bootstrap, target, partitions, "read_uncommitted")) == sorted(everything)
    # Per partition, the committed copies keep the input's order.
    for partition in range(partitions):
        values = [v for _, _, v in sorted(r for r in committed if r[0] == partition)]
        assert values == sorted(values), f"partition {partition} out of order"


def test_kafka_python_copier_killed_repeatedly_copies_exactly_once(broker, admin):
    _copy_killed_repeatedly(broker, admin, "kp_txn_copier", "kp-copier", 100_000, 5000, 200,
                            _read_kafka_python)


def test_aiokafka_copier_killed_repeatedly_copies_exactly_once(broker, admin):
    _copy_killed_repeatedly(broker, admin, "aio_txn_copier", "aio-copier", 100_000, 5000, 200,
                            _read_aiokafka)
