"""The exactly-once sink (`exactlyOnce=true`, or `kafka.transactional.id=<prefix>`): Kafka transactions
driven as a two-phase commit by the Spark driver (seed 003, "Message Delivery Semantics"; KIP-98; the
first phase is KIP-939's "prepare").

Tasks. Task p of a write takes the transactional id `<prefix>-<p>` (prefix: kafka.transactional.id,
else `odradek-spark-<query id>` for a streaming query, `odradek-spark-<random>` for a batch write), which
fences an earlier attempt of the same task (the coordinator aborts its open transaction at once),
writes every row in one transaction, flushes it and leaves it open ("prepared"), and reports its
transactional id, producer id and epoch in its commit message. A task of a streaming micro-batch first
reads the query's marker (below): if the batch is already decided, it writes nothing, so it fences
nothing.

Driver, streaming `commit(messages, batch_id)`:
1. read the marker: the consumer group named like the prefix, whose committed offset is the last
   decided batch id and whose metadata lists that batch's transactions. If it names this batch (a
   replay after a driver crash), commit its transactions again (a retried EndTxn of a committed
   transaction succeeds), abort whatever this run's tasks prepared, and stop;
2. otherwise check that every prepared transaction is still open at its producer id and epoch
   (DescribeTransactions; if one is not, abort them all and fail: nothing was decided), then commit the
   marker (batch id, and every task's id, producer id and epoch) - the decision;
3. end every task's transaction with EndTxn(commit), by id, producer id and epoch: Kafka's EndTxn names
   a transaction by those alone, so the driver can end transactions its tasks' producers began.
`abort(messages, batch_id)` aborts the prepared transactions and fences the ids of failed tasks.
A batch write does the same without the marker (there is no batch to replay).

A failed task can still be starting when the driver aborts: Spark calls `abort` as soon as one task
fails, while it cancels the others, and a cancelled task's Python worker may go on. A task that takes
its id after the driver fenced it would write a transaction that nobody ends, holding every partition
it wrote below its last stable offset for transaction.timeout.ms. So a batch write's driver first
takes a transactional id named for the write (`abort_mark_id`, the write's own random id) and then
fences the failed tasks' ids; each task, after taking its own id and before writing, looks that mark
up (DescribeTransactions) and fails if it exists. Either the task took its id before the fence (the
fence aborts whatever it writes, and its later requests are refused as fenced) or after it, and then
after the mark, which it sees. The mark expires with the broker's transactional.id.expiration.ms. A
streaming micro-batch has no such mark: its driver side is created afresh for each commit or abort,
with no id its tasks share; a late task's transaction there is fenced when the restarted query
replays the batch (or aborted on its timeout).

What is guaranteed. After a driver crash at any point, the restarted query replays the batch that was
not in Spark's commit log: before step 2 nothing was decided, and the replayed tasks fence the old
transactions (aborted, never visible) and write again; after step 2 the replay recognises the batch by
the marker and rolls it forward, writing nothing. So a read_committed reader sees every row of a
batch exactly once, provided that (a) the query comes back and replays within transaction.timeout.ms
of the tasks' prepare (this sink's default is 15 minutes, the broker's default maximum): otherwise the
coordinator has aborted the prepared transactions on its own, which the roll-forward detects and
reports as data loss (`DataLossError`), never silently; and (b) no two attempts of a task run at once
(spark.speculation off, Spark's default), since the later attempt's id would fence a prepared sibling:
the check of step 2 then fails the batch before anything is decided, unless the fencing falls between
that check and the sibling's EndTxn, whose loss is then reported. A read_uncommitted reader
also sees the rows of aborted attempts, as with any Kafka transaction. Kafka has no transaction spanning
producers, so the tasks' transactions become visible one after another within step 3, not at one
instant; readers never see a row twice or a row of an undecided batch.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
import zlib
from dataclasses import dataclass, field

from odradek.spark.planning import DataLossError

log = logging.getLogger("odradek.spark")

BATCH_ID_PROPERTY = "streaming.sql.batchId"      # Spark's local properties on a micro-batch's tasks
QUERY_ID_PROPERTY = "sql.streaming.queryId"
MAX_MARKER_METADATA_BYTES = 4000                 # under Kafka's offset.metadata.max.bytes (4096)


@dataclass(frozen=True)
class TaskTxn:
    """A task's prepared transaction, as the commit message carries it."""
    partition: int
    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass
class TaskContextInfo:
    partition: int
    attempt: int
    batch_id: int | None
    query_id: str | None


def task_context() -> TaskContextInfo:
    from pyspark import TaskContext
    tc = TaskContext.get()
    if tc is None:
        raise RuntimeError("the exactly-once sink writes only inside a Spark task")
    batch = tc.getLocalProperty(BATCH_ID_PROPERTY)
    return TaskContextInfo(tc.partitionId(), tc.attemptNumber(), int(batch) if batch is not None else None,
                           tc.getLocalProperty(QUERY_ID_PROPERTY))


def prefix_for(transactional_id: str | None, query_id: str | None) -> str:
    if transactional_id:
        return transactional_id
    if query_id:
        return f"odradek-spark-{query_id}"
    return f"odradek-spark-{uuid.uuid4().hex}"


def task_transactional_id(prefix: str, partition: int) -> str:
    return f"{prefix}-{partition}"


def abort_mark_id(prefix: str, write_id: str) -> str:
    """The transactional id whose existence says the batch write `write_id` was aborted."""
    return f"{prefix}-aborted-{write_id}"


class WriteAbortedError(RuntimeError):
    """The driver aborted the write before this task took its transactional id: the task writes nothing."""


def check_not_aborted(admin, prefix: str, write_id: str) -> None:
    """A batch write's task, after taking its transactional id and before writing (module docstring)."""
    mark = abort_mark_id(prefix, write_id)
    if admin.exists(mark):
        raise WriteAbortedError(f"the write was aborted before this task began ({mark} exists): nothing written")


def mark_aborted(admin, prefix: str, write_id: str | None, failed: list[str]) -> None:
    """The driver's abort of the failed tasks' ids: the write's abort mark first (a batch write's),
    then the fence (module docstring)."""
    if write_id is not None:
        admin.fence([abort_mark_id(prefix, write_id)])
    admin.fence(failed)


# ------------------------------------------------------------------------------------------ marker
def encode_marker(txns: list[TaskTxn]) -> str:
    """The marker's offset metadata: [[partition, producer id, epoch], ...] as JSON, compressed (zlib,
    base64, prefix "z:") when it would not fit the broker's limit."""
    raw = json.dumps([[t.partition, t.producer_id, t.producer_epoch] for t in sorted(txns, key=lambda t: t.partition)],
                     separators=(",", ":"))
    if len(raw) <= MAX_MARKER_METADATA_BYTES:
        return raw
    packed = "z:" + base64.b64encode(zlib.compress(raw.encode(), 9)).decode()
    if len(packed) > MAX_MARKER_METADATA_BYTES:
        raise ValueError(f"{len(txns)} task transactions do not fit the marker ({len(packed)} bytes > "
                         f"{MAX_MARKER_METADATA_BYTES}): write with fewer partitions (coalesce)")
    return packed


def decode_marker(prefix: str, metadata: str) -> list[TaskTxn]:
    raw = zlib.decompress(base64.b64decode(metadata[2:])).decode() if metadata.startswith("z:") else metadata
    return [TaskTxn(int(p), task_transactional_id(prefix, int(p)), int(pid), int(epoch))
            for p, pid, epoch in json.loads(raw or "[]")]


@dataclass
class Marker:
    batch_id: int
    txns: list[TaskTxn] = field(default_factory=list)


def latest_marker(prefix: str, committed: dict) -> Marker | None:
    """The marker with the highest batch id among the group's committed offsets ({tp: (offset,
    metadata)}; a batch's marker is committed on a partition it wrote to, so there may be several)."""
    best = None
    for offset, metadata in committed.values():
        if best is None or offset > best[0]:
            best = (offset, metadata)
    if best is None:
        return None
    return Marker(best[0], decode_marker(prefix, best[1]))


# ------------------------------------------------------------------------------------------ driver
def _prepared(txns: list[TaskTxn]):
    from odradek.client import PreparedTransaction
    return [PreparedTransaction(t.transactional_id, t.producer_id, t.producer_epoch) for t in txns]


def commit_all(admin, txns: list[TaskTxn]) -> None:
    """EndTxn(commit) for each; a transaction the coordinator no longer has at its epoch was aborted
    (its timeout, or a fencing attempt): its rows are lost, which is reported, not hidden."""
    errors = admin.end(_prepared(txns), commit=True)
    failed = [(t, e) for t, e in zip(txns, errors) if e is not None]
    if failed:
        t, e = failed[0]
        raise DataLossError(f"{len(failed)} of {len(txns)} prepared transactions could not be committed, "
                            f"their rows are lost (first: {t.transactional_id}, producer {t.producer_id} "
                            f"epoch {t.producer_epoch}: {e}); was the query down longer than "
                            f"transaction.timeout.ms, or is spark.speculation on?")


class TransactionLostError(RuntimeError):
    """A task's prepared transaction is no longer open at its epoch (aborted on its timeout, or fenced
    by another attempt of the task) before the batch was decided: the batch is not committed; the
    query fails and, restarted, writes the batch again."""


def check_open(admin, txns: list[TaskTxn]) -> None:
    """Before deciding: every prepared transaction is still open (Ongoing) at its producer id and epoch,
    so the decision cannot name a transaction that can no longer commit."""
    states = admin.describe([t.transactional_id for t in txns])
    for t in txns:
        state, pid, epoch = states[t.transactional_id]
        if (state, pid, epoch) != ("Ongoing", t.producer_id, t.producer_epoch):
            abort_all(admin, txns)
            raise TransactionLostError(
                f"the transaction of task {t.partition} ({t.transactional_id}, producer {t.producer_id} epoch "
                f"{t.producer_epoch}) is {state} at producer {pid} epoch {epoch}: the batch was not committed")


def abort_all(admin, txns: list[TaskTxn]) -> None:
    for t, e in zip(txns, admin.end(_prepared(txns), commit=False)):
        if e is not None:
            log.info("aborting %s: %s (already ended or fenced)", t.transactional_id, e)


def commit_batch(admin, prefix: str, batch_id: int, txns: list[TaskTxn], marker_tp) -> None:
    """Streaming commit (steps 1-3 of the module docstring)."""
    marker = latest_marker(prefix, admin.committed(prefix))
    if marker is not None and marker.batch_id >= batch_id:
        if marker.batch_id == batch_id:
            log.info("batch %d of %s was decided before a restart: committing its %d transactions",
                     batch_id, prefix, len(marker.txns))
            commit_all(admin, marker.txns)
        else:
            log.warning("batch %d of %s is older than the last decided batch %d: nothing written",
                        batch_id, prefix, marker.batch_id)
        if txns:
            abort_all(admin, txns)
        return
    if not txns:
        return
    check_open(admin, txns)
    admin.commit_marker(prefix, marker_tp, batch_id, encode_marker(txns))
    commit_all(admin, txns)


def already_decided(admin, prefix: str, batch_id: int) -> bool:
    """A task's check: was this micro-batch decided by an earlier run of the query?"""
    marker = latest_marker(prefix, admin.committed(prefix))
    return marker is not None and marker.batch_id >= batch_id
