"""The exactly-once sink (`exactlyOnce=true`): each task writes in a Kafka transaction that the driver
commits with the micro-batch, and a marker (the query's consumer group) lets a restarted query recognise
a batch it had already decided. A streaming query is killed with SIGKILL mid-batch (and once right after
it committed a batch's marker and only part of the batch's transactions), restarted from its checkpoint
each time; read with read_committed (confluent-kafka, and Spark with kafka.isolation.level), the output
holds every input row exactly once. A batch write commits too, and a failed one leaves nothing visible.
"""

import os
import signal
import time
from pathlib import Path

import pytest

from tests.integration.clients import wait_until
from tests.integration.txn_support import end_offsets, read_values
from tests.spark.conftest import ROOT, create_topic, produce, spark_subprocess, unique

TIMEOUT_S = 240
JOB = str(ROOT / "tests/spark/jobs/eos_stream.py")


def _entries(d: Path) -> list[int]:
    return sorted(int(p.name) for p in d.glob("*") if p.name.isdigit()) if d.exists() else []


def _log_tail(path: Path) -> str:
    return path.read_text(errors="replace")[-4000:] if path.exists() else "(no log)"


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def _kill_mid_transaction(proc, bs: str, target: str, log: Path, progress: int) -> int:
    """SIGKILL the job while a task's prepared transaction holds output the driver has not committed:
    the output's high watermark past its last stable offset, and past `progress` (the high watermark
    at the previous kill). The high watermark then."""
    from odradek.client import TopicPartition, sync
    tps = [TopicPartition(target, p) for p in range(2)]
    deadline = time.monotonic() + TIMEOUT_S
    with sync.Consumer({"bootstrap.servers": bs, "isolation.level": "read_committed"}) as committed, \
            sync.Consumer({"bootstrap.servers": bs}) as uncommitted:
        try:
            while True:
                lso = sum(committed.end_offsets(tps).values())      # first: read later, it could pass hw
                hw = sum(uncommitted.end_offsets(tps).values())
                if hw > lso and hw > progress:
                    os.killpg(proc.pid, signal.SIGKILL)
                    return hw
                assert proc.poll() is None, f"the job exited early:\n{_log_tail(log)}"
                assert time.monotonic() < deadline, f"no transaction caught open in time:\n{_log_tail(log)}"
                time.sleep(0.01)
        finally:
            _kill(proc)


def test_streaming_exactly_once_across_driver_kills(spark, odradek_broker, tmp_path):
    bs = odradek_broker.bootstrap
    source, target = unique("eos-in"), unique("eos-out")
    create_topic(bs, source, 2)
    create_topic(bs, target, 2)
    total = 3600
    produce(bs, source, [(i % 2, b"k%d" % i, b"v%05d" % i, [], None) for i in range(total)])
    ckpt, log = tmp_path / "ckpt", tmp_path / "job.log"

    # 1. The driver dies inside the commit of batch 2: marker committed, one task's transaction committed.
    proc = spark_subprocess(JOB, bs, source, target, ckpt, "crash-after-marker:2", log=log)
    try:
        assert proc.wait(TIMEOUT_S) != 0
    finally:
        _kill(proc)
    note = Path(str(ckpt) + ".crashed")
    assert note.exists() and note.read_text() == "crashing after the marker of batch 2", _log_tail(log)
    assert _entries(ckpt / "commits")[-1] == 1, "batch 2 must not be in Spark's commit log"
    partial = read_values(bs, target, 2, "read_committed")
    assert 600 < len(partial) < 900, f"{len(partial)} rows visible: batch 2 should be partly committed"

    # 2. Killed from outside, mid-batch (tasks' transactions prepared, not committed), three times.
    killed: list[int] = []
    for _ in range(3):
        proc = spark_subprocess(JOB, bs, source, target, ckpt, "run", log=log)
        killed.append(_kill_mid_transaction(proc, bs, target, log, killed[-1] if killed else 0))

    # 3. The last run reads to the end of the input and stops.
    proc = spark_subprocess(JOB, bs, source, target, ckpt, "available-now", log=log)
    try:
        assert proc.wait(TIMEOUT_S) == 0, _log_tail(log)
    finally:
        _kill(proc)

    expected = sorted(b"copied:v%05d" % i for i in range(total))
    committed = read_values(bs, target, 2, "read_committed")
    everything = read_values(bs, target, 2, "read_uncommitted")
    print(f"exactly-once sink: killed at output high watermarks {killed}; {len(everything)} rows in the log, "
          f"{len(committed)} committed")
    assert sorted(committed) == expected, (
        f"{len(committed)} rows, {len(set(committed))} distinct; killed at {killed}")
    assert len(everything) > total, "no kill left a prepared transaction behind"
    # Per partition, the output keeps the input's order.
    rows = (spark.read.format("odradek").option("kafka.bootstrap.servers", bs).option("subscribe", target)
            .option("kafka.isolation.level", "read_committed").load().select("partition", "offset", "value").collect())
    assert sorted(r.value for r in rows) == expected
    for p in range(2):
        values = [r.value for r in sorted((r for r in rows if r.partition == p), key=lambda r: r.offset)]
        assert values == sorted(values)


def test_batch_write_exactly_once(spark, odradek_broker):
    bs = odradek_broker.bootstrap
    target = unique("eos-batch")
    create_topic(bs, target, 3)
    df = spark.range(0, 5000, numPartitions=4).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
    (df.write.mode("append").format("odradek").option("kafka.bootstrap.servers", bs).option("topic", target)
     .option("kafka.transactional.id", unique("batch-writer")).save())
    got = read_values(bs, target, 3, "read_committed")
    assert sorted(got) == sorted(str(i).encode() for i in range(5000))

    def explode(i):
        if i == 9999:   # the last row of the last task: the others have written by then
            raise ValueError("a row the job cannot process")
        return str(i)

    from pyspark.sql import functions as F
    failing = spark.range(5000, 10000, numPartitions=4).select(
        F.udf(explode, "string")("id").alias("value"))
    with pytest.raises(Exception, match="a row the job cannot process"):   # local mode: no task retries
        (failing.write.mode("append").format("odradek").option("kafka.bootstrap.servers", bs).option("topic", target)
         .option("exactlyOnce", "true").save())
    # Nothing of the failed write is visible, and its tasks' transactions were ended (aborted by the
    # driver, or fenced, or never begun by a task that found the write's abort mark): the last stable
    # offsets catch up with the high watermarks once the abort markers are written, which the
    # coordinator does after answering EndTxn (as Kafka's does).
    wait_until(lambda: end_offsets(bs, target, 3, "read_committed") == end_offsets(bs, target, 3, "read_uncommitted"),
               30, "the last stable offsets at the high watermarks")
    assert sorted(read_values(bs, target, 3, "read_committed")) == sorted(got)
    assert len(read_values(bs, target, 3, "read_uncommitted")) > len(got), "no task of the failed write wrote"


def _prepared_tasks(bs: str, prefix: str, topic: str, batch: int, tasks: int) -> list:
    """Each task's transaction, written and prepared by our producer as the sink's tasks do."""
    import asyncio

    from odradek.client import Producer
    from odradek.spark.exactly_once import TaskTxn, task_transactional_id

    async def prepare(p: int):
        tid = task_transactional_id(prefix, p)
        async with Producer({"bootstrap.servers": bs, "transactional.id": tid}) as producer:
            await producer.init_transactions()
            producer.begin_transaction()
            for i in range(10):
                await producer.send(topic, b"b%d-t%d-%d" % (batch, p, i), partition=p % 2)
            prepared = await producer.prepare_transaction()
        return TaskTxn(p, tid, prepared.producer_id, prepared.producer_epoch)

    async def all_tasks():
        return await asyncio.gather(*(prepare(p) for p in range(tasks)))
    return asyncio.run(all_tasks())


def test_driver_commit_decides_rolls_forward_and_refuses_lost_transactions(odradek_broker):
    """The driver's side without Spark: a batch is decided (marker) and committed; the same batch id
    again (a replay) rolls the recorded transactions forward and aborts the new ones; a batch with a
    transaction fenced after its prepare fails before its marker, aborting the others."""
    from odradek.spark.exactly_once import TransactionLostError, commit_batch, latest_marker
    from odradek.spark.kafka import TxnAdmin
    bs = odradek_broker.bootstrap
    topic, prefix = unique("eos-driver"), unique("eos-driver-query")
    create_topic(bs, topic, 2)
    with TxnAdmin({"bootstrap.servers": bs}) as admin:
        first = _prepared_tasks(bs, prefix, topic, 0, 3)
        commit_batch(admin, prefix, 0, first, (topic, 0))
        assert latest_marker(prefix, admin.committed(prefix)).txns == first
        replayed = _prepared_tasks(bs, prefix + "-replay", topic, 0, 2)   # written again by a replay
        commit_batch(admin, prefix, 0, replayed, (topic, 0))
        assert sorted(read_values(bs, topic, 2, "read_committed")) == sorted(
            b"b0-t%d-%d" % (p, i) for p in range(3) for i in range(10))

        second = _prepared_tasks(bs, prefix, topic, 1, 3)
        _prepared_tasks(bs, prefix, topic, 99, 1)      # task 0's id taken again: its transaction is fenced
        with pytest.raises(TransactionLostError):
            commit_batch(admin, prefix, 1, second, (topic, 1))
        assert latest_marker(prefix, admin.committed(prefix)).batch_id == 0
        states = admin.describe([t.transactional_id for t in second[1:]])
        assert {s for s, _, _ in states.values()} == {"CompleteAbort"}


def _task_rows(start: int, n: int):
    import pyarrow as pa
    return pa.RecordBatch.from_pydict({"value": [str(i) for i in range(start, start + n)]})


def test_a_batch_write_task_that_starts_or_goes_on_after_the_driver_aborted_leaves_nothing_open(
        odradek_broker, monkeypatch):
    """The driver's abort and a task that Spark has not stopped yet, in both orders and without Spark
    (the race is timing-dependent there). Task 1 takes its transactional id only after the driver
    aborted the write: it finds the write's abort mark and writes nothing. Task 2 took its id before and
    writes on after the abort: the fence refuses it. Nothing is left open: the last stable offsets
    equal the high watermarks at once, with no wait for transaction.timeout.ms."""
    from pyspark.sql.types import StringType, StructField, StructType

    from odradek.spark import exactly_once as eo
    from odradek.spark.options import parse_write_options
    from odradek.spark.writer import BatchWriter, WriteResult, write_transactional
    bs = odradek_broker.bootstrap
    topic = unique("eos-late-task")
    create_topic(bs, topic, 3)
    opts = parse_write_options({"kafka.bootstrap.servers": bs, "topic": topic, "exactlyOnce": "true"})
    writer = BatchWriter(opts, StructType([StructField("value", StringType())]))

    def in_task(partition: int):
        monkeypatch.setattr(eo, "task_context", lambda: eo.TaskContextInfo(partition, 0, None, None))

    in_task(0)
    done = writer.write(iter([_task_rows(0, 50)]))          # task 0 prepared before task 2 failed
    assert isinstance(done, WriteResult) and done.txn is not None
    messages = [done, None, None]

    def abort_after_first_batch():
        yield _task_rows(100, 50)
        writer.abort(messages)                               # the job failed meanwhile
        yield _task_rows(150, 50)

    in_task(2)
    with pytest.raises(Exception) as fenced:
        write_transactional(opts, abort_after_first_batch(), writer.prefix, streaming=False,
                            write_id=writer.write_id)
    assert not isinstance(fenced.value, eo.WriteAbortedError), fenced.value

    in_task(1)
    before = end_offsets(bs, topic, 3, "read_uncommitted")
    with pytest.raises(eo.WriteAbortedError):
        write_transactional(opts, iter([_task_rows(50, 50)]), writer.prefix, streaming=False,
                            write_id=writer.write_id)
    assert end_offsets(bs, topic, 3, "read_uncommitted") == before, "the late task wrote"
    assert end_offsets(bs, topic, 3, "read_committed") == end_offsets(bs, topic, 3, "read_uncommitted")
    assert read_values(bs, topic, 3, "read_committed") == []
    assert len(read_values(bs, topic, 3, "read_uncommitted")) >= 50   # task 0's aborted rows at least
