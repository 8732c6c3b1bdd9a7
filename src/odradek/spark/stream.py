"""Structured Streaming reads: a `DataSourceStreamReader` with Spark's Kafka source behaviour.

Offsets are `{"topic": {"partition": offset}}` (the next offset to read per partition), written by
Spark to the checkpoint's offset log before a micro-batch runs and committed after its sink commits,
so a query restarted from its checkpoint re-plans the last uncommitted batch with the same offsets:
no record is skipped, and a sink that commits per batch id (file sink, foreachBatch) holds none twice.

- Each trigger: the current partitions (subscribePattern picks up new topics; new partitions of any
  subscribed topic are read from their earliest offset), their latest offsets, then the read limit:
  Spark passes `ReadMaxRows(maxOffsetsPerTrigger)` (from `getDefaultReadLimit`), or
  `ReadAllAvailable` when the trigger wants everything. `minOffsetsPerTrigger` and `maxTriggerDelay`
  hold a trigger back (Spark's Python API has no composite limit, so the reader applies them itself
  whenever the engine's limit is not ReadAllAvailable).
- Trigger.AvailableNow: `prepareForTriggerAvailableNow` fixes the target offsets; triggers stop there
  (still split by maxOffsetsPerTrigger), and partitions that appear later are left for the next run.
- Data loss (`planning.stream_ranges`, `kafka.read_range`) fails the query with failOnDataLoss=true,
  or is logged and skipped.
- `commitOffsetsToGroup=<group id>`: once a micro-batch is done, the offsets it ended at are committed
  to that consumer group (a group without members, as Kafka's AdminClient.alterConsumerGroupOffsets
  does), so lag tools show the query's progress. The checkpoint stays the source of truth.

The reader object lives in one long-running Python process on the driver, so it keeps a client
(`Admin`) between calls; it is opened lazily, because Spark also pickles the reader for `read()`.
"""

from __future__ import annotations

import logging
import time
from typing import Iterator

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable, ReadLimit, ReadMaxRows, ReadMinRows, SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from odradek.spark import planning
from odradek.spark.options import ReadOptions
from odradek.spark.source import RangePartition, current_partitions, read_partition, resolve_spec

log = logging.getLogger("odradek.spark")


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._admin = None
        self._target: dict | None = None           # Trigger.AvailableNow: where to stop
        self._latest: dict | None = None
        self._gate = (planning.TriggerGate(opts.min_offsets_per_trigger, opts.max_trigger_delay_ms)
                      if opts.min_offsets_per_trigger else None)
        self._commit_warned = False   # warn once about failing commits
        self._committed: dict | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_admin"] = None
        return state

    def _a(self):
        if self._admin is None:
            from odradek.spark.kafka import Admin
            self._admin = Admin(self.opts.client)
        return self._admin

    # ---------------------------------------------------------------------------------- offsets
    def initialOffset(self) -> dict:
        admin = self._a()
        tps = current_partitions(admin, self.opts)
        start = resolve_spec(admin, self.opts, self.opts.starting, tps, starting=True)
        return planning.offsets_to_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        admin = self._a()
        self._target = admin.latest(current_partitions(admin, self.opts))

    def _latest_offsets(self) -> dict[planning.TP, int]:
        if self._target is not None:
            return dict(self._target)
        admin = self._a()
        return admin.latest(current_partitions(admin, self.opts))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = planning.offsets_from_json(start)
        self._commit_to_group(begin)
        latest = self._latest_offsets()
        self._latest = latest
        if isinstance(limit, ReadAllAvailable):
            return planning.offsets_to_json(latest)
        if self._gate is not None and self._target is None and self._gate.hold(begin, latest, time.time() * 1000):
            return start
        if isinstance(limit, ReadMaxRows):
            new = [tp for tp in latest if tp not in begin]
            new_start = self._a().earliest(new) if new else {}
            return planning.offsets_to_json(planning.rate_limit(limit.max_rows, begin, latest, new_start))
        return planning.offsets_to_json(latest)

    def reportLatestOffset(self) -> dict | None:
        return None if self._latest is None else planning.offsets_to_json(self._latest)

    # ---------------------------------------------------------------------------------- planning
    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        from odradek.spark.kafka import report_data_loss
        begin = planning.offsets_from_json(start)
        until = planning.offsets_from_json(end)
        new = [tp for tp in until if tp not in begin]
        new_start = self._earliest_of_existing(new)
        ranges, problems = planning.stream_ranges(begin, until, new_start)
        for problem in problems:
            report_data_loss(problem, self.opts.fail_on_data_loss)
        ranges = planning.split_ranges(ranges, self.opts.min_partitions, self.opts.max_records_per_partition)
        return [RangePartition(r) for r in ranges]

    def _earliest_of_existing(self, tps) -> dict[planning.TP, int]:
        if not tps:
            return {}
        admin = self._a()
        existing = set(current_partitions(admin, self.opts))
        return admin.earliest([tp for tp in tps if tp in existing])

    def read(self, partition: InputPartition) -> Iterator:
        return read_partition(self.opts, self.schema, partition)

    # ---------------------------------------------------------------------------------- progress
    def _commit_to_group(self, done: dict[planning.TP, int]) -> None:
        """commitOffsetsToGroup: Spark asks for the next offsets only once the micro-batch that ended
        at `start` has run and is in the commit log, so `start` is the query's processed position.
        (Spark's own `commit(end)` comes only when the next batch with data is planned, which after
        the last batch of a run is never.)"""
        group = self.opts.commit_group
        if not group or not done or done == self._committed:
            return
        try:
            self._a().commit(group, done)
            self._committed = dict(done)
        except Exception as e:   # progress for lag tools only: the checkpoint is the truth
            if not self._commit_warned:
                log.warning("commitOffsetsToGroup=%s: commit failed (%s); the query goes on", group, e)
            self._commit_warned = True

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
