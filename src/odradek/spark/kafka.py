"""Everything the connector does over the network, through `odradek.client` only (DESIGN, "Layers").

- `Admin`: driver-side metadata and offsets (topics, partitions, earliest / latest / by-time offsets,
  offset commits for lag tools), on the client's `Admin`. Opened by the planner, never pickled.
- `read_range`: one Spark task's read of one topic-partition offset range, through the client's
  batch-level read path (`Consumer.fetch_batches`: whole v2 batches, raw bytes), decoded into Arrow by
  `decode`. The task opens its own client: nothing network-bound is ever pickled from the driver.
- `Sink`: one Spark task's writes, whole record batches built by `encode`.
- `TxnSink`, `TxnAdmin`: the exactly-once sink's task producer (one transaction, prepared and left
  open) and its driver side (the query's marker, ending the tasks' transactions); see `exactly_once`.

Each object owns a private asyncio event loop and drives the asyncio client on it from the calling
thread (`run_until_complete`): no extra thread, and the task's decode work runs while the kernel
buffers the next fetch.

Data loss, as Spark's Kafka source defines it (`KafkaDataConsumer`): the records of a range are gone
when the log start offset has moved past the position (retention, DeleteRecords) - the broker then
answers OFFSET_OUT_OF_RANGE - or when the log ends before the range does. Offset gaps inside the log
(compaction, transaction markers, aborted records under read_committed) are not data loss.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Iterator

import pyarrow as pa

from odradek.client import (
    Consumer, KafkaError, OffsetOutOfRangeError, PreparedTransaction, Producer, TopicPartition,
)
from odradek.client import admin as client_admin
from odradek.client.admin_types import AdminError, OffsetAndMetadata
from odradek.spark import decode as dec
from odradek.spark.planning import DataLossError, OffsetRange, TP, data_loss_message

log = logging.getLogger("odradek.spark")

FETCH_WAIT_MS = 500
MAX_BATCHES_PER_FETCH = 4096


class _Loop:
    """A private event loop driven from the calling thread (planner calls: nothing to overlap)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        if not self.loop.is_closed():
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()


class _LoopThread:
    """A private event loop in a thread of its own, so the client's network I/O (the next fetch, the
    produce requests in flight) goes on while the task's thread decodes or encodes (profiled: the two
    otherwise take turns)."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def call(self, fn, *args):
        async def call():
            return fn(*args)
        return self.run(call())

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def report_data_loss(problem: str, fail: bool) -> None:
    if fail:
        raise DataLossError(data_loss_message(problem, True))
    log.warning("%s", data_loss_message(problem, False))


# ------------------------------------------------------------------------------------------ admin
class Admin:
    """Metadata, offsets and group commits for the planner (driver side), through the client's Admin."""

    def __init__(self, config: dict) -> None:
        self._lp = _Loop()
        known = {d.name for d in client_admin.ADMIN}
        self.isolation_level = 1 if str(config.get("isolation.level", "")).lower() == "read_committed" else 0
        self.admin = client_admin.Admin({k: v for k, v in config.items() if k in known})
        try:
            self._lp.run(self.admin.start())
        except BaseException:
            self._lp.close()
            raise

    def close(self) -> None:
        try:
            self._lp.run(self.admin.aclose())
        finally:
            self._lp.close()

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def partition_counts(self, topics=None) -> dict[str, int]:
        """name -> number of partitions, of the given topics that exist, or of every topic."""
        listing = self._lp.run(self.admin.list_topics())
        wanted = None if topics is None else set(topics)
        return {name: t.partitions for name, t in listing.items() if wanted is None or name in wanted}

    def _list_offsets(self, specs: dict[TP, int]) -> dict[TP, int]:
        if not specs:
            return {}
        found = self._lp.run(self.admin.list_offsets({TopicPartition(*tp): ts for tp, ts in specs.items()},
                                                     isolation_level=self.isolation_level))
        return {(tp.topic, tp.partition): v.offset for tp, v in found.items()}

    def earliest(self, tps) -> dict[TP, int]:
        return self._list_offsets({tp: client_admin.EARLIEST for tp in tps})

    def latest(self, tps) -> dict[TP, int]:
        """The high watermark, or the last stable offset with kafka.isolation.level=read_committed."""
        return self._list_offsets({tp: client_admin.LATEST for tp in tps})

    def offsets_for_times(self, timestamps: dict[TP, int]) -> dict[TP, int | None]:
        """The earliest offset whose timestamp is >= the given one (None: no such record)."""
        return {tp: (o if o >= 0 else None) for tp, o in self._list_offsets(timestamps).items()}

    def commit(self, group: str, offsets: dict[TP, int]) -> None:
        """Commit offsets for `group` (a group without members) so lag tools see the query's progress."""
        self._lp.run(self.admin.alter_consumer_group_offsets(group, {TopicPartition(*tp): o
                                                                     for tp, o in offsets.items()}))


# ------------------------------------------------------------------------------------------ reading
def _payloads(fbs) -> dict | None:
    """Decompressed records sections of the compressed batches, if the client can give them."""
    out = {}
    for i, fb in enumerate(fbs):
        if fb.compression:
            get = getattr(fb, "records_payload", None)
            if get is None:
                return None
            out[i] = get()
    return out


def decode_fetched(fbs, start: int, until: int, topic: str, partition: int, include_headers: bool,
                   schema: pa.Schema) -> list[pa.RecordBatch]:
    """Arrow batches from whole fetched batches; compressed ones, while the client cannot hand out
    their decompressed section, go through its per-record path."""
    payloads = _payloads(fbs)
    if payloads is not None:
        return [dec.decode([fb.data for fb in fbs], start, until, topic, partition, include_headers, schema,
                           payloads)]
    out = []
    plain: list = []
    for fb in fbs:
        if not fb.compression:
            plain.append(fb.data)
            continue
        if plain:
            out.append(dec.decode(plain, start, until, topic, partition, include_headers, schema))
            plain = []
        records = [r for r in fb.records() if start <= r.offset < until]
        out.append(dec.records_to_batch(records, topic, partition, include_headers, schema))
    if plain:
        out.append(dec.decode(plain, start, until, topic, partition, include_headers, schema))
    return out


def read_range(config: dict, r: OffsetRange, *, include_headers: bool, fail_on_data_loss: bool,
               poll_timeout_ms: int, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The records of one offset range as Arrow batches; restartable: it always begins at
    r.from_offset and ends before r.until_offset, so a retried task yields exactly the same rows."""
    if r.size <= 0:
        return
    lp = _LoopThread("odradek-spark-reader")
    consumer = Consumer(dict(config))
    tp = TopicPartition(r.topic, r.partition)
    try:
        lp.run(consumer.start())
        lp.call(_assign_at, consumer, tp, r.from_offset)    # one step: the fetcher runs meanwhile
        pos = r.from_offset
        last_progress = time.monotonic()
        while pos < r.until_offset:
            try:
                fbs = lp.run(consumer.fetch_batches(timeout_ms=FETCH_WAIT_MS, max_batches=MAX_BATCHES_PER_FETCH))
            except OffsetOutOfRangeError:
                pos = _out_of_range(lp, consumer, tp, pos, r, fail_on_data_loss)
                if pos >= r.until_offset:
                    return
                lp.call(consumer.seek, tp, pos)
                last_progress = time.monotonic()
                continue
            if fbs:
                for rb in decode_fetched(fbs, pos, r.until_offset, r.topic, r.partition, include_headers, schema):
                    if rb.num_rows:
                        yield rb
            new_pos = lp.run(consumer.position(tp))
            if new_pos > pos:
                pos = new_pos
                last_progress = time.monotonic()
            elif (time.monotonic() - last_progress) * 1000 > poll_timeout_ms:
                latest = lp.run(consumer.end_offsets([tp]))[tp]
                if latest < r.until_offset and latest <= pos:
                    report_data_loss(f"Cannot fetch records in [{pos}, {r.until_offset}) of {r.topic}-"
                                     f"{r.partition}: the log ends at {latest}", fail_on_data_loss)
                    return
                raise KafkaError(f"no records from {r.topic}-{r.partition} at offset {pos} for "
                                 f"{poll_timeout_ms} ms (kafkaConsumer.pollTimeoutMs)")
    finally:
        try:
            lp.run(consumer.aclose())
        finally:
            lp.close()


def _assign_at(consumer: Consumer, tp: TopicPartition, offset: int) -> None:
    consumer.assign([tp])
    consumer.seek(tp, offset)


def _out_of_range(lp: _LoopThread, consumer: Consumer, tp: TopicPartition, pos: int, r: OffsetRange,
                  fail: bool) -> int:
    earliest = lp.run(consumer.beginning_offsets([tp]))[tp]
    latest = lp.run(consumer.end_offsets([tp]))[tp]
    if earliest > pos:
        stop = min(earliest, r.until_offset)
        report_data_loss(f"Cannot fetch offset {pos} of {r.topic}-{r.partition}: records in [{pos}, {stop}) "
                         f"are gone (the log starts at {earliest})", fail)
        return stop
    report_data_loss(f"Cannot fetch offset {pos} of {r.topic}-{r.partition}: the log ends at {latest}", fail)
    return r.until_offset


# ------------------------------------------------------------------------------------------ writing
class Sink:
    """A task's producer: whole record batches in, at-least-once (every batch acknowledged by
    `flush()` before the task reports success; a failed task's retry may write some again)."""

    def __init__(self, config: dict) -> None:
        self._lp = _LoopThread("odradek-spark-writer")
        self.producer = Producer(dict(config))
        self.batch_size = int(self.producer.config["batch.size"])
        self._pending: list = []
        self._counts: dict[str, int] = {}
        try:
            self._lp.run(self.producer.start())
        except BaseException:
            self._lp.close()
            raise
        self.raw = True   # whole batches (Producer.send_batch); writer.py decides when not to

    def partition_count(self, topic: str) -> int:
        n = self._counts.get(topic)
        if n is None:
            n = self._counts[topic] = len(self._lp.run(self.producer.partitions_for(topic)))
        return n

    def send_batch(self, topic: str, partition: int, data: bytes, records: int) -> None:
        self._pending.append(self._lp.run(self.producer.send_batch(topic, partition, data)))
        if len(self._pending) > 256:
            self._settle()

    def send_records(self, rows) -> None:
        """The per-record path: (topic, partition or None, key, value, headers) tuples."""
        async def send():
            out = []
            for topic, partition, key, value, headers in rows:
                out.append(await self.producer.send(topic, value, key, partition=partition, headers=headers))
            return out
        self._pending.extend(self._lp.run(send()))
        if len(self._pending) > 100_000:
            self._settle()

    def _settle(self, all_done: bool = False) -> None:
        """Raise the first delivery error; forget delivered futures (checked on the loop's thread).
        Every failed future's error is retrieved, not only the first: asyncio would log the others
        when they are collected."""
        def check():
            left, first = [], None
            for f in self._pending:
                if not f.done():
                    assert not all_done, "flush() returned with a batch in flight"
                    left.append(f)
                elif f.exception() is not None and first is None:
                    first = f.exception()
            if first is not None:
                self._pending = left
                raise first
            return left
        self._pending = self._lp.call(check)

    def flush(self) -> None:
        self._lp.run(self.producer.flush())
        self._settle(all_done=True)

    def close(self) -> None:
        try:
            self._lp.run(self.producer.aclose())
            self._lp.call(self._forget)
        finally:
            self._lp.close()

    def _forget(self) -> None:
        """After the producer closed: the errors of undelivered batches (the task's own error, or none,
        is what it reports)."""
        for f in self._pending:
            if f.done() and not f.cancelled():
                f.exception()
        self._pending = []


# ------------------------------------------------------------------------------------------ exactly once
class TxnSink(Sink):
    """A task's transactional producer (the exactly-once sink): `transactional_id` is the task's own;
    taking it fences the producer of a failed earlier attempt, whose open transaction the coordinator
    aborts. The task's records go into one transaction, which `prepare()` flushes and leaves open for
    the driver to commit or abort (`TxnAdmin.end`)."""

    def __init__(self, config: dict, transactional_id: str) -> None:
        super().__init__({**config, "transactional.id": transactional_id})
        self._sent = False
        try:
            self._lp.run(self.producer.init_transactions())
            self._lp.call(self.producer.begin_transaction)
        except BaseException:
            self.close()
            raise

    def prepare(self) -> PreparedTransaction | None:
        """Flush; the open transaction to hand to the driver, or None when the task wrote nothing (the
        empty transaction is committed here: the coordinator never heard of it)."""
        self._settle()
        if self._written():
            prepared = self._lp.run(self.producer.prepare_transaction())
            self._settle(all_done=True)
            return prepared
        self._lp.run(self.producer.commit_transaction())
        return None

    def _written(self) -> bool:
        return self._sent

    def send_batch(self, topic: str, partition: int, data: bytes, records: int) -> None:
        self._sent = True
        super().send_batch(topic, partition, data, records)

    def send_records(self, rows) -> None:
        self._sent = True
        super().send_records(rows)

    def abort(self) -> None:
        try:
            self._lp.run(self.producer.abort_transaction(10))
        except Exception as e:    # the task's own error matters more; the next attempt fences it anyway
            log.info("aborting the task's transaction failed: %s", e)


class TxnAdmin:
    """The exactly-once sink's driver side: the query's marker (the last batch id whose transactions
    were decided, committed to a consumer group named after the query) and the tasks' prepared
    transactions, ended with EndTxn by id, producer id and epoch (the client Admin's `end_transaction`)."""

    def __init__(self, config: dict) -> None:
        self._lp = _Loop()
        known = {d.name for d in client_admin.ADMIN}
        self.admin = client_admin.Admin({k: v for k, v in config.items() if k in known})
        self._producer_config = dict(config)
        try:
            self._lp.run(self.admin.start())
        except BaseException:
            self._lp.close()
            raise

    def close(self) -> None:
        try:
            self._lp.run(self.admin.aclose())
        finally:
            self._lp.close()

    def __enter__(self) -> "TxnAdmin":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def committed(self, group: str) -> dict[TP, tuple[int, str]]:
        """Every offset the group has committed: {(topic, partition): (offset, metadata)}."""
        found = self._lp.run(self.admin.list_consumer_group_offsets(group))
        return {(tp.topic, tp.partition): (o.offset, o.metadata) for tp, o in found.items() if o is not None}

    def describe(self, transactional_ids: list[str]) -> dict[str, tuple[str, int, int]]:
        """{id: (state, producer id, epoch)} from the ids' coordinators (DescribeTransactions)."""
        found = self._lp.run(self.admin.describe_transactions(transactional_ids))
        return {t: (d.state, d.producer_id, d.producer_epoch) for t, d in found.items()}

    def exists(self, transactional_id: str) -> bool:
        """Whether the id's coordinator knows the transactional id (DescribeTransactions)."""
        try:
            self._lp.run(self.admin.describe_transactions([transactional_id]))
        except AdminError as e:
            if e.name == "TRANSACTIONAL_ID_NOT_FOUND":
                return False
            raise
        return True

    def commit_marker(self, group: str, tp: TP, batch_id: int, metadata: str) -> None:
        self._lp.run(self.admin.alter_consumer_group_offsets(
            group, {TopicPartition(*tp): OffsetAndMetadata(batch_id, metadata)}))

    def end(self, prepared: list[PreparedTransaction], commit: bool) -> list[BaseException | None]:
        """End each transaction (concurrently); the error of each, None where it ended as asked."""
        async def end_all():
            return await asyncio.gather(*(self.admin.end_transaction(t, commit) for t in prepared),
                                        return_exceptions=True)
        return list(self._lp.run(end_all()))

    def fence(self, transactional_ids: list[str]) -> None:
        """Take each transactional id once (InitProducerId): the coordinator aborts its open transaction."""
        async def fence_one(tid: str) -> None:
            p = Producer({**self._producer_config, "transactional.id": tid})
            await p.start()
            try:
                await p.init_transactions(30)
            finally:
                await p.aclose()

        async def fence_all():
            return await asyncio.gather(*(fence_one(t) for t in transactional_ids), return_exceptions=True)
        for tid, err in zip(transactional_ids, self._lp.run(fence_all())):
            if err is not None:
                log.warning("could not fence transactional id %s: %s", tid, err)
