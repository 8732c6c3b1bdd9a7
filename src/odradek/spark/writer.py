"""Writing to topics, batch and streaming: Spark's Kafka sink on Arrow writers.

Columns (Spark's Kafka sink): `value` (binary or string, required; null is a tombstone), `key`
(binary or string, optional), `topic` (string; the `topic` option overrides it), `partition` (int,
optional: else murmur2 of the key, else sticky for keyless rows), `headers`
(array<struct<key string, value binary>>, optional). Every `kafka.*` option goes to the producer.

Each task opens its own producer, writes its rows as whole record batches (`encode`), and reports
success only after every batch is acknowledged (acks=all by default): at-least-once. A task that
fails and is retried may write some records twice; nothing is lost. `commit`/`abort` have nothing to
do: Kafka has no staged writes outside transactions. With `exactlyOnce=true` (or
`kafka.transactional.id`) each task writes in a transaction that the driver commits or aborts with
the batch (`exactly_once`).

Whole batches go through the client's `Producer.send_batch` (which stamps producer id and sequences
when idempotence is on); when compression is asked for, or for records of 1 MiB and more, rows go
through the client's per-record `send`.
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from odradek.spark import encode as enc
from odradek.spark import exactly_once as eo
from odradek.spark.exactly_once import TaskTxn
from odradek.spark.options import OptionError, WriteOptions


def check_mode(overwrite: bool) -> None:
    if overwrite:
        raise OptionError("Save mode Overwrite not allowed for Kafka. Allowed save modes are Append and "
                          "ErrorIfExists (default).")


@dataclass
class WriteResult(WriterCommitMessage):
    records: int
    batches: int
    txn: TaskTxn | None = None          # exactly once: the task's prepared transaction
    prefix: str | None = None           # exactly once: the transactional id prefix (and marker group)
    topics: tuple[str, ...] = ()        # the topics written (the marker is committed on one of them)
    skipped: bool = False               # exactly once: the batch was decided before; nothing written


class _TaskWriter:
    """One task's writes (with `transactional_id`, in one transaction: the exactly-once sink)."""

    def __init__(self, opts: WriteOptions, transactional_id: str | None = None) -> None:
        from odradek.spark.kafka import Sink, TxnSink
        self.opts = opts
        self.sink = Sink(opts.client) if transactional_id is None else TxnSink(opts.client, transactional_id)
        self.topics: set[str] = set()
        self.raw = self.sink.raw and not _asks_for_client_path(self.sink.producer)
        self.sticky: dict[str, int] = {}
        self.rng = random.Random()
        self.records = 0
        self.batches = 0

    def write(self, batch: pa.RecordBatch) -> None:
        n = batch.num_rows
        if n == 0:
            return
        topic, key, value, headers, partition = enc.normalize(batch, self.opts.topic)
        names, codes = enc.topic_codes(topic, self.opts.topic, n)
        self.topics.update(names)
        counts = np.array([self.sink.partition_count(t) for t in names], np.int64)
        parts = self._partitions(names, codes, counts, key, partition)
        if self.raw:
            try:
                out = enc.encode(names, codes, parts, key, value, headers, int(time.time() * 1000),
                                 self.sink.batch_size)
            except enc.EncodeError:
                out = None
            if out is not None:
                for b in out:
                    self.sink.send_batch(b.topic, b.partition, b.data, b.records)
                self.records += n
                self.batches += len(out)
                return
        rows = zip((names[c] for c in codes.tolist()), parts.tolist(), key.to_pylist(), value.to_pylist(),
                   headers.to_pylist() if headers is not None else [None] * n)
        self.sink.send_records((t, p, k, v, [(h["key"], h["value"]) for h in hs] if hs else None)
                               for t, p, k, v, hs in rows)
        self.records += n

    def _partitions(self, names, codes, counts, key: pa.Array, partition) -> np.ndarray:
        n = len(codes)
        per_row = counts[codes]
        if partition is not None:
            parts = np.asarray(partition.cast(pa.int64()).fill_null(-1))
        else:
            parts = np.full(n, -1, np.int64)
        todo = parts < 0
        if todo.any():
            keyed = todo & np.asarray(key.is_valid())
            if keyed.any():
                parts = np.where(keyed, enc.key_partitions(key, per_row), parts)
            keyless = todo & ~keyed
            if keyless.any():
                for code in np.unique(codes[keyless]).tolist():
                    rows = keyless & (codes == code)
                    parts[rows] = self._sticky(names[code], int(counts[code]))
        bad = (parts < 0) | (parts >= per_row)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise enc.EncodeError(f"partition {int(parts[i])} of topic {names[codes[i]]} does not exist "
                                  f"({int(per_row[i])} partitions)")
        return parts.astype(np.int32)

    def _sticky(self, topic: str, count: int) -> int:
        """KIP-480: keyless rows of one Arrow batch go to one partition, the next batch to another."""
        p = self.sticky.get(topic)
        p = self.rng.randrange(count) if p is None else (p + 1) % count
        self.sticky[topic] = p
        return p

    def finish(self) -> WriteResult:
        try:
            self.sink.flush()
        finally:
            self.sink.close()
        return WriteResult(self.records, self.batches)

    def fail(self) -> None:
        try:
            self.sink.close()
        except Exception:   # the task's own error matters more
            pass


def _asks_for_client_path(producer) -> bool:
    return bool(producer.config.get("compression.type"))


def write_all(opts: WriteOptions, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
    w = _TaskWriter(opts)
    try:
        for batch in iterator:
            w.write(batch)
    except BaseException:
        w.fail()
        raise
    return w.finish()


def write_transactional(opts: WriteOptions, iterator: Iterator[pa.RecordBatch], prefix: str | None,
                        streaming: bool, write_id: str | None = None) -> WriteResult:
    """The exactly-once sink's task: every row in one transaction, prepared and handed to the driver.
    `write_id`: a batch write's id, whose abort mark the task looks for once it holds its id."""
    from odradek.spark.kafka import TxnAdmin
    ctx = eo.task_context()
    prefix = eo.prefix_for(prefix, ctx.query_id)
    if streaming:
        if ctx.batch_id is None:
            raise RuntimeError("the exactly-once streaming sink found no micro-batch id in its task")
        with TxnAdmin(opts.client) as admin:
            if eo.already_decided(admin, prefix, ctx.batch_id):
                return WriteResult(0, 0, prefix=prefix, skipped=True)
    tid = eo.task_transactional_id(prefix, ctx.partition)
    w = _TaskWriter(opts, tid)
    try:
        if write_id is not None:
            with TxnAdmin(opts.client) as admin:
                eo.check_not_aborted(admin, prefix, write_id)
        for batch in iterator:
            w.write(batch)
        prepared = w.sink.prepare()
    except BaseException:
        w.sink.abort()
        w.fail()
        raise
    w.sink.close()
    txn = None if prepared is None else eo.TaskTxn(ctx.partition, prepared.transactional_id, prepared.producer_id,
                                                   prepared.producer_epoch)
    return WriteResult(w.records, w.batches, txn=txn, prefix=prefix, topics=tuple(sorted(w.topics)))


class _ExactlyOnce:
    """The driver's side of the exactly-once sink, shared by the batch and the streaming writer."""

    opts: WriteOptions
    prefix: str | None
    write_id: str | None = None     # a batch write's own id (its abort mark): pickled to its tasks

    def _results(self, messages) -> list[WriteResult]:
        return [m for m in messages if isinstance(m, WriteResult)]

    def _prefix(self, results: list[WriteResult]) -> str | None:
        return next((r.prefix for r in results if r.prefix), self.prefix)

    def _end(self, messages, batch_id: int | None) -> None:
        from odradek.spark.kafka import TxnAdmin
        results = self._results(messages)
        prefix = self._prefix(results)
        txns = [r.txn for r in results if r.txn is not None]
        if prefix is None or (batch_id is None and not txns):
            return
        with TxnAdmin(self.opts.client) as admin:
            if batch_id is None:
                eo.check_open(admin, txns)
                eo.commit_all(admin, txns)
                return
            topics = sorted({t for r in results for t in r.topics})
            eo.commit_batch(admin, prefix, batch_id, txns, (topics[0], 0) if topics else None)

    def _abort(self, messages) -> None:
        from odradek.spark.kafka import TxnAdmin
        results = self._results(messages)
        prefix = self._prefix(results)
        if prefix is None:
            return
        txns = [r.txn for r in results if r.txn is not None]
        failed = [eo.task_transactional_id(prefix, i) for i, m in enumerate(messages) if not isinstance(m, WriteResult)]
        with TxnAdmin(self.opts.client) as admin:
            if txns:
                eo.abort_all(admin, txns)
            if failed:      # a failed task's transaction would hold the last stable offset back
                eo.mark_aborted(admin, prefix, self.write_id, failed)


class BatchWriter(DataSourceArrowWriter, _ExactlyOnce):
    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        self.opts = opts
        # Batch writes have no query id: one prefix per write, chosen here and pickled to the tasks.
        self.prefix = eo.prefix_for(opts.transactional_id, None) if opts.exactly_once else None
        self.write_id = uuid.uuid4().hex if opts.exactly_once else None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        if self.opts.exactly_once:
            return write_transactional(self.opts, iterator, self.prefix, streaming=False, write_id=self.write_id)
        return write_all(self.opts, iterator)

    def commit(self, messages) -> None:
        if self.opts.exactly_once:
            self._end(messages, None)

    def abort(self, messages) -> None:
        if self.opts.exactly_once:
            self._abort(messages)


class StreamWriter(DataSourceStreamArrowWriter, _ExactlyOnce):
    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        self.opts = opts
        self.prefix = opts.transactional_id     # else odradek-spark-<query id>, known in the tasks

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        if self.opts.exactly_once:
            return write_transactional(self.opts, iterator, self.prefix, streaming=True)
        return write_all(self.opts, iterator)

    def commit(self, messages, batchId: int) -> None:
        if self.opts.exactly_once:
            self._end(messages, batchId)

    def abort(self, messages, batchId: int) -> None:
        if self.opts.exactly_once:
            self._abort(messages)
