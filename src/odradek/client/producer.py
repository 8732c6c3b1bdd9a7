"""The asyncio producer (seed 003, "The Producer": load balancing, asynchronous send).

    async with Producer({"bootstrap.servers": "localhost:9092", "linger.ms": 5}) as p:
        fut = await p.send("events", b"value", key=b"user-1", headers=[("trace", b"x")])
        md = await fut                      # RecordMetadata(topic, partition, offset, timestamp)
        p.send_nowait("events", b"v2", on_delivery=lambda err, md: ...)   # no await; BufferFullError
        await p.flush()

`send()` partitions the record (`partitioner`: murmur2 for keys, sticky for keyless, or the record's
own `partition`), appends it to its partition's open batch and returns a `DeliveryFuture` at once; it
only waits for metadata of a topic it has not seen and for `buffer.memory` space, both bounded by
`max.block.ms`. One sender task, owned by the producer (`start()` / `aclose()`), drains sendable
batches per broker into Produce requests, up to `max.in.flight.requests.per.connection` per connection,
and completes each batch from its partition's answer.

`send_batch(topic, partition, batch)` queues a whole v2 record batch built elsewhere (the Spark sink's
Arrow-encoded batches) in the same queues, with the same accounting, retries and idempotence stamping;
`await (await p.send_batch(...))` is the base offset the broker gave it.

Retries: a retriable error (or a lost connection) puts the batch back at the front of its queue after
`retry.backoff.ms`, up to `retries` times and while `delivery.timeout.ms` since the batch was created has
not passed; errors that say the metadata is stale trigger a metadata refresh. Without idempotence and
with more than one request in flight, a retry may reorder records, as in Kafka.

Idempotence (`enable.idempotence=true`, off by default here; Kafka's Java client defaults it on): the
producer gets a producer id and epoch (InitProducerId) and numbers each partition's batches; the broker
drops duplicates of retried batches. Partitions keep one batch in flight at a time, so a retry always
resends the oldest unacknowledged sequence and order holds. DUPLICATE_SEQUENCE_NUMBER counts as
success. When a numbered batch fails for good (its fate unknown to us), the producer takes a new
producer id before sending more, as Kafka's producer bumps its epoch, so later sequences stay valid.
Transactions (`transactional.id`, which implies idempotence): see `producer_txn` for the calls and
`transactions` for the state machine. The sender holds a partition's batches back until
AddPartitionsToTxn has added the partition to the transaction, marks batches transactional, and
fails the batches not sent yet once the transaction can only be aborted.
Not supported yet: splitting a batch on MESSAGE_TOO_LARGE.
"""

from __future__ import annotations

import asyncio
import logging
from time import time_ns

from odradek.client.accumulator import RECORD_OVERHEAD, RecordAccumulator, record_size
from odradek.client.batch import DeliveryFuture, ProducerBatch, RecordMetadata
from odradek.client.cluster import STALE_METADATA_ERRORS, Cluster, now_ms
from odradek.client.config import producer_config
from odradek.client.errors import (
    BrokerResponseError, BufferFullError, IllegalStateError, KafkaConnectionError, KafkaError,
    KafkaTimeoutError, TransactionAbortableError,
)
from odradek.client.partitioner import DefaultPartitioner, partition_for_key
from odradek.client.producer_txn import TransactionalProducer
from odradek.client.transactions import TransactionManager, TxnState
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import init_producer_id as ipi, produce as pm
from odradek.records.header import (
    ATTRIBUTES_OFFSET, NO_PRODUCER_ID, TRANSACTIONAL_MASK, BatchHeader, set_producer_state,
)

log = logging.getLogger("odradek.client.producer")

PRODUCE_KEY = 0
INIT_PRODUCER_ID_KEY = 22
_new = object.__new__

__all__ = ["Producer", "RecordMetadata", "DeliveryFuture"]


class _NoMetadata(KafkaError):
    """send_nowait: the topic's partitions are not known yet."""


class Producer(TransactionalProducer):
    def __init__(self, config: dict | None = None, **kwargs) -> None:
        self.config = c = producer_config(config, **kwargs)
        self.acks = c["acks"]
        self.max_block_ms = c["max.block.ms"]
        self.max_request_size = c["max.request.size"]
        self.idempotent = c["enable.idempotence"]
        part = c["partitioner"]
        self.partitioner = DefaultPartitioner(ignore_keys=c["partitioner.ignore.keys"])
        self._sticky = self.partitioner.sticky
        self._keyless: dict[str, ProducerBatch] = {}   # topic -> open batch its keyless records join
        self._topics: dict = {}
        self._custom_partitioner = part
        self.cluster: Cluster | None = None
        self.acc: RecordAccumulator | None = None
        self.producer_id = -1
        self.producer_epoch = -1
        self._sequences: dict[tuple[str, int], int] = {}
        self._txn: TransactionManager | None = None
        self._need_producer_id = self.idempotent and c["transactional.id"] is None
        self._sender: asyncio.Task | None = None
        self._wakeup: asyncio.Event | None = None
        self._in_flight_batches = 0
        self._closed = False
        self._fatal: BaseException | None = None
        self._batch_full = False

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> "Producer":
        if self._sender is not None:
            return self
        loop = asyncio.get_running_loop()
        c = self.config
        self.cluster = Cluster(c)
        self._topics = self.cluster.metadata.topics
        self.acc = RecordAccumulator(
            batch_size=c["batch.size"], buffer_memory=c["buffer.memory"], linger_ms=c["linger.ms"],
            compression=c["compression.type"], delivery_timeout_ms=c["delivery.timeout.ms"],
            retry_backoff_ms=c["retry.backoff.ms"], guarantee_order=self.idempotent, loop=loop)
        self._wakeup = asyncio.Event()
        if c["transactional.id"] is not None:
            self._txn = TransactionManager(self.cluster, c)
            self._txn.epoch_changed = self._txn_epoch_changed
            self.acc.blocked = self._txn.pending     # batches wait for AddPartitionsToTxn
        try:
            await self.cluster.start(self.max_block_ms)
            if self._need_producer_id:
                await self._init_producer_id()
        except BaseException:
            await self.cluster.aclose()
            raise
        self._sender = loop.create_task(self._run(), name="odradek-producer-sender")
        return self

    async def __aenter__(self) -> "Producer":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self, timeout: float | None = None) -> None:
        """Send what is buffered (for at most `timeout` seconds), then stop the sender and connections."""
        if self._closed:
            return
        self._closed = True
        self._keyless.clear()
        if self._sender is None:
            return
        if self._txn is not None:
            await self._txn.cancel()   # a call that timed out and still retries; an open transaction stays
        self.acc.closing = True
        self._wakeup.set()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._sender)
        except TimeoutError:
            pass
        except Exception:
            pass
        finally:
            if not self._sender.done():
                self._sender.cancel()
                try:
                    await self._sender
                except (asyncio.CancelledError, Exception):
                    pass
            err = KafkaError("producer closed before the record was delivered")
            for b in list(self.acc.incomplete):
                self._finish(b, -1, -1, err)
            await self.cluster.aclose()

    # ------------------------------------------------------------------------------------ sending
    async def send(self, topic: str, value=None, key=None, *, partition: int | None = None,
                   timestamp_ms: int | None = None, headers=None, on_delivery=None) -> DeliveryFuture:
        """Buffer a record; wait (at most max.block.ms) only for metadata or buffer space.

        When the record filled a batch, yield to the event loop once, so the sender task ships full
        batches while the application keeps producing (the Java producer wakes its sender thread)."""
        b = self._keyless.get(topic)
        if b is not None and key is None and partition is None and not headers and type(value) is bytes:
            # send_nowait's common case, repeated here: a call with keyword arguments costs as much.
            vsize = len(value)
            room = b.room - vsize - RECORD_OVERHEAD
            if room >= 0:
                if timestamp_ms is None:
                    timestamp_ms = time_ns() // 1_000_000
                index = b.builder.append_plain(None, value, timestamp_ms)
                b.room = room
                b.record_count = index + 1
                if on_delivery is not None:
                    b.add_callback(index, timestamp_ms, -1, vsize, on_delivery)
                f = _new(DeliveryFuture)   # DeliveryFuture(b, index, ...) without __init__'s frame
                f.batch = b
                f.index = index
                f.timestamp = timestamp_ms
                f.key_size = -1
                f.value_size = vsize
                return f
        try:
            fut = self.send_nowait(topic, value, key, partition=partition, timestamp_ms=timestamp_ms,
                                   headers=headers, on_delivery=on_delivery)
        except (BufferFullError, _NoMetadata):
            fut = await self._send_slow(topic, value, key, partition, timestamp_ms, headers, on_delivery)
        if self._batch_full:
            self._batch_full = False
            await asyncio.sleep(0)
        return fut

    async def _send_slow(self, topic, value, key, partition, timestamp_ms, headers, on_delivery):
        self._check_open()
        md = self.cluster.metadata.topics.get(topic)
        if md is None or not md.partitions:
            self._wakeup.set()
            md = await self.cluster.wait_for_topic(topic, self.max_block_ms)
        size = record_size(key, value, headers)
        if not self.acc.has_room(size):
            self._check_size(size)
            self._wakeup.set()
            await self.acc.reserve(size, now_ms() + self.max_block_ms, now_ms)
            self._check_open()
        return self._append(topic, md, value, key, partition, timestamp_ms, headers, on_delivery, size)

    def send_nowait(self, topic: str, value=None, key=None, *, partition: int | None = None,
                    timestamp_ms: int | None = None, headers=None, on_delivery=None) -> DeliveryFuture:
        """`send` without waiting: BufferFullError when buffer.memory is full, KafkaError when the
        topic's metadata is not known yet (`await partitions_for(topic)` first)."""
        b = self._keyless.get(topic)
        if b is not None and key is None and partition is None and not headers and type(value) is bytes:
            # The common case, flat: a keyless record joining its topic's sticky batch, whose room
            # (buffer.memory charged in advance, within batch.size) it spends.
            vsize = len(value)
            room = b.room - vsize - RECORD_OVERHEAD
            if room >= 0:
                if timestamp_ms is None:
                    timestamp_ms = time_ns() // 1_000_000
                index = b.builder.append_plain(None, value, timestamp_ms)
                b.room = room
                b.record_count = index + 1
                if on_delivery is not None:
                    b.add_callback(index, timestamp_ms, -1, vsize, on_delivery)
                f = _new(DeliveryFuture)   # DeliveryFuture(b, index, ...) without __init__'s frame
                f.batch = b
                f.index = index
                f.timestamp = timestamp_ms
                f.key_size = -1
                f.value_size = vsize
                return f
        md = self._topics.get(topic)
        if md is None or not md.partitions or self._closed or self._fatal is not None:
            self._check_open()
            self.cluster.add_topics([topic])
            self._wakeup.set()
            raise _NoMetadata(f"no metadata for topic {topic} yet; use send() or partitions_for() first")
        size = record_size(key, value, headers)
        acc = self.acc
        if not acc.has_room(size):
            acc.revoke_all()    # what the open batches were charged in advance
            if not acc.has_room(size):
                self._check_size(size)
                raise BufferFullError(f"buffer.memory ({acc.buffer_memory} bytes) is full")
        return self._append(topic, md, value, key, partition, timestamp_ms, headers, on_delivery, size)

    def _append(self, topic, md, value, key, partition, timestamp_ms, headers, on_delivery,
                size: int) -> DeliveryFuture:
        """Append to the partition's open batch (the hot path: keep it flat)."""
        acc = self.acc
        if timestamp_ms is None:
            timestamp_ms = time_ns() // 1_000_000
        keyless = False
        if partition is None:
            if self._custom_partitioner is not None:
                partition = self._custom_partitioner(topic, key, len(md.partitions), md.available)
            elif key is None or self.partitioner.ignore_keys:
                keyless = True
                partition = self._sticky.get(topic)
                if partition is None or partition >= len(md.partitions):
                    partition = self.partitioner.partition(topic, None, len(md.partitions), md.available)
            else:
                partition = partition_for_key(key, len(md.partitions))
        elif not 0 <= partition < len(md.partitions):
            raise KafkaError(f"partition {partition} of topic {topic} does not exist "
                             f"({len(md.partitions)} partitions)")
        if self._txn is not None:
            self._txn.check_send(topic, partition)
        batch = acc.open_batch(topic, partition)
        if batch is not None:
            acc.revoke(batch)
            if batch.size_bytes + size > acc.batch_size and batch.record_count:
                acc.close_batch(batch)
                self._wakeup.set()
                self._batch_full = True
                batch = None
        if batch is None:
            if keyless:   # KIP-480: a new batch moves the sticky partition on
                n = len(md.partitions)
                self.partitioner.on_new_batch(topic, partition, n, md.available)
                partition = self.partitioner.partition(topic, None, n, md.available)
                batch = acc.open_batch(topic, partition)
                if batch is not None:
                    acc.revoke(batch)
                    if batch.size_bytes + size > acc.batch_size and batch.record_count:
                        acc.close_batch(batch)
                        batch = None
            if batch is None:
                self._check_size(size)
                if self._txn is not None:
                    self._txn.check_send(topic, partition)
                batch = acc.new_batch(topic, partition, now_ms())
                self._wakeup.set()
        index = batch.record_count
        batch.builder.append(key, value, headers=headers or (), timestamp=timestamp_ms)
        batch.record_count = index + 1
        batch.size_bytes += size
        acc.used_bytes += size
        if keyless:   # later keyless records take send's fast path, paid for in advance
            self._keyless[topic] = batch
            acc.grant(batch)
        fut = DeliveryFuture(batch, index, timestamp_ms, -1 if key is None else len(key),
                             -1 if value is None else len(value))
        if on_delivery is not None:
            batch.add_callback(index, timestamp_ms, fut.key_size, fut.value_size, on_delivery)
        return fut

    def _check_size(self, size: int) -> None:
        limit = min(self.max_request_size, self.acc.buffer_memory)
        if size > limit:
            raise KafkaError(f"a record of about {size} bytes exceeds max.request.size or buffer.memory "
                             f"({limit} bytes)", ErrorCode.MESSAGE_TOO_LARGE)

    def _check_open(self) -> None:
        if self._sender is None:
            raise IllegalStateError("producer not started: await start() or use `async with`")
        if self._closed:
            raise IllegalStateError("producer is closed")
        if self._fatal is not None:
            raise IllegalStateError(f"producer failed: {self._fatal}") from self._fatal

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now, ignoring linger.ms, and wait until it is delivered or failed."""
        self._check_open()
        pending = [b.future for b in self.acc.incomplete]
        if not pending:
            return
        self.acc.flushing += 1
        self._wakeup.set()
        try:
            done, not_done = await asyncio.wait(pending, timeout=timeout)
            if not_done:
                raise KafkaTimeoutError(f"{len(not_done)} batches not delivered within {timeout} s")
        finally:
            self.acc.flushing -= 1

    async def send_batch(self, topic: str, partition: int, batch) -> asyncio.Future:
        """Queue one whole v2 record batch, built elsewhere (`odradek.records.RecordBatchBuilder`, or
        read from another topic), for a topic-partition; a future of the base offset the broker gave
        it. The batch goes through the same queue as `send()`'s records: buffer.memory, retries,
        delivery.timeout.ms and ordering per partition apply, and with enable.idempotence the
        producer stamps its producer id, epoch and sequence into it. Its own base offset is ignored
        (the broker assigns offsets). Control and transactional batches, and batches that carry a
        producer id, are refused, as are bytes that are not exactly one batch with a valid CRC."""
        self._check_open()
        header = BatchHeader(batch)     # ProtocolError unless a complete v2 batch starts here
        if header.size != len(batch):
            raise ValueError(f"expected exactly one record batch, got {len(batch)} bytes for a batch of "
                             f"{header.size}")
        header.ensure_valid()
        if header.is_control or header.is_transactional:
            raise ValueError("control and transactional batches cannot be sent with send_batch")
        if header.producer_id != NO_PRODUCER_ID:
            raise ValueError(f"the batch carries producer id {header.producer_id}; send batches without one")
        partitions = await self.partitions_for(topic)
        if partition not in partitions:
            raise KafkaError(f"{topic} has no partition {partition} (it has {len(partitions)})",
                             ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if self._txn is not None:
            self._txn.check_send(topic, partition)
        size = len(batch)
        self._check_size(size)
        acc = self.acc
        if not acc.has_room(size):
            self._wakeup.set()
            await acc.reserve(size, now_ms() + self.max_block_ms, now_ms)
            self._check_open()
        b = acc.new_batch(topic, partition, now_ms())
        b.builder = None
        b.built = batch
        b.record_count = header.records_count
        b.size_bytes += size
        acc.used_bytes += size
        acc.close_batch(b)
        self._wakeup.set()
        out = asyncio.get_running_loop().create_future()

        def done(_f, b=b) -> None:
            if out.done():
                return
            if b.error is not None:
                out.set_exception(b.error)
            else:
                out.set_result(b.base_offset)
        b.future.add_done_callback(done)
        return out

    async def partitions_for(self, topic: str) -> list[int]:
        self._check_open()
        md = self.cluster.metadata.topics.get(topic)
        if md is None or not md.partitions:
            md = await self.cluster.wait_for_topic(topic, self.max_block_ms)
        return sorted(md.partitions)

    # ------------------------------------------------------------------------------------ sender task
    async def _run(self) -> None:
        acc = self.acc
        cluster = self.cluster
        meta = cluster.metadata
        backoff_ms = self.config["retry.backoff.ms"]
        try:
            while True:
                if acc.closing and not acc.incomplete:
                    return
                self._wakeup.clear()
                await cluster.maybe_refresh()
                if self._need_producer_id and self._in_flight_batches == 0:
                    try:
                        await self._init_producer_id()
                    except KafkaError as e:
                        log.warning("InitProducerId failed: %s", e)
                        await asyncio.sleep(backoff_ms / 1000)
                        continue
                if self._txn is not None and not await self._txn_step():
                    continue
                now = now_ms()
                for b in acc.expire(now):
                    self._fail_batch(b, KafkaTimeoutError(
                        f"batch for {b.topic}-{b.partition} expired after delivery.timeout.ms"))
                nodes, next_ms, unknown = acc.ready(meta.leader_for, now)
                if unknown:
                    cluster.request_update()
                    next_ms = min(next_ms, backoff_ms)
                if not self._need_producer_id:
                    for node in nodes:
                        await self._send_to(node, now)
                if acc.closing and not acc.incomplete:
                    return
                if self._wakeup.is_set():
                    continue
                wait_ms = min(next_ms, self.config["metadata.max.age.ms"], 1000)
                if cluster.stale():
                    wait_ms = min(wait_ms, backoff_ms)
                try:
                    async with asyncio.timeout(max(wait_ms, 0) / 1000):
                        await self._wakeup.wait()
                except TimeoutError:
                    pass
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            log.exception("producer sender failed")
            self._fatal = e
            self._keyless.clear()
            for b in list(acc.incomplete):
                self._finish(b, -1, -1, KafkaError(f"producer sender failed: {e}"))
            raise

    async def _send_to(self, node: int, now: float) -> None:
        cluster = self.cluster
        conn = cluster.connection_nowait(node)
        if conn is None:
            if cluster.connection_failed_recently(node):
                return
            try:
                conn = await cluster.connection(node)
            except KafkaConnectionError as e:
                log.info("cannot connect to broker %d: %s", node, e)
                cluster.request_update()
                return
        acc = self.acc
        while conn.can_send():
            batches = acc.drain(node, cluster.metadata.leader_for, self.max_request_size, now)
            if not batches:
                return
            request = self._produce_request(batches)
            try:
                fut = conn.send_nowait(PRODUCE_KEY, request, expect_response=self.acks != 0)
            except KafkaError as e:
                for b in batches:
                    self._retry_or_fail(b, e)
                return
            for b in batches:
                b.in_flight = True
            self._in_flight_batches += len(batches)
            if self.acks == 0:
                for b in batches:
                    self._finish(b, -1, -1, None)
            else:
                fut.add_done_callback(lambda f, bs=batches: self._on_response(f, bs))

    def _produce_request(self, batches: list[ProducerBatch]) -> pm.ProduceRequest:
        topics: dict[str, list] = {}
        for b in batches:
            if self.idempotent and not b.sequenced:
                tp = (b.topic, b.partition)
                seq = self._sequences.get(tp, 0)
                bl = b.builder
                if bl is None:      # a whole batch from send_batch: stamped in a copy of its bytes
                    stamped = bytearray(b.built)
                    if self._txn is not None:
                        stamped[ATTRIBUTES_OFFSET + 1] |= TRANSACTIONAL_MASK
                    set_producer_state(stamped, 0, self.producer_id, self.producer_epoch, seq)
                    b.built = stamped
                else:
                    bl.producer_id = self.producer_id
                    bl.producer_epoch = self.producer_epoch
                    bl.base_sequence = seq
                    bl.is_transactional = self._txn is not None
                    b.built = None
                self._sequences[tp] = (seq + b.record_count) & 0x7FFFFFFF
                b.sequenced = True
            topics.setdefault(b.topic, []).append(pm.PartitionProduceData(index=b.partition, records=b.build()))
        return pm.ProduceRequest(
            transactional_id=self._txn.transactional_id if self._txn is not None else None,
            acks=self.acks, timeout_ms=self.config["request.timeout.ms"],
            topic_data=[pm.TopicProduceData(name=t, partition_data=ps) for t, ps in topics.items()])

    def _on_response(self, fut: asyncio.Future, batches: list[ProducerBatch]) -> None:
        self._in_flight_batches -= len(batches)
        for b in batches:
            b.in_flight = False
        self._wakeup.set()
        if fut.cancelled():
            exc: BaseException | None = KafkaConnectionError("request cancelled")
        else:
            exc = fut.exception()
        if exc is not None:
            self.cluster.request_update()
            for b in batches:
                self._retry_or_fail(b, exc)
            return
        by_tp = {(b.topic, b.partition): b for b in batches}
        for t in fut.result().responses:
            for p in t.partition_responses:
                b = by_tp.pop((t.name, p.index), None)
                if b is None:
                    continue
                err = p.error_code
                if err == 0 or err == ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
                    builder = b.builder
                    self._finish(b, p.base_offset, p.log_append_time_ms, None)
                    self.acc.recycle(builder)   # answered: the request's bytes are all sent
                    continue
                if err in STALE_METADATA_ERRORS:
                    self.cluster.request_update()
                self._retry_or_fail(b, BrokerResponseError(err, p.error_message))
        for b in by_tp.values():
            self._retry_or_fail(b, KafkaError("partition missing from the Produce response"))

    def _retry_or_fail(self, b: ProducerBatch, exc: BaseException) -> None:
        now = now_ms()
        retriable = isinstance(exc, KafkaError) and exc.retriable
        if retriable and b.attempts < self.config["retries"] and now < b.deadline_ms and not self._closed_hard():
            self.acc.reenqueue(b, now)
            return
        if retriable and now >= b.deadline_ms:
            exc = KafkaTimeoutError(f"delivery.timeout.ms passed for {b.topic}-{b.partition}: {exc}")
        self._fail_batch(b, exc)

    def _closed_hard(self) -> bool:
        return self._sender is not None and self._sender.done()

    def _fail_batch(self, b: ProducerBatch, exc: BaseException) -> None:
        if self._txn is not None:
            exc = self._txn_batch_failed(b.sequenced, exc)
        elif b.sequenced:
            # The broker may or may not have this sequence: start over with a new producer id.
            self._need_producer_id = True
        self._finish(b, -1, -1, exc)

    def _finish(self, b: ProducerBatch, base_offset: int, log_append_time: int, exc) -> None:
        if b.done:
            return
        b.complete(base_offset, log_append_time, exc)
        self.acc.completed(b)

    async def _txn_step(self) -> bool:
        """The sender's transactional step: fail what cannot be sent any more, add the partitions written
        to since the last step (AddPartitionsToTxn). False: nothing may be sent now."""
        txn = self._txn
        if txn.state in (TxnState.ABORTABLE_ERROR, TxnState.FATAL_ERROR, TxnState.ABORTING):
            if self.acc.has_queued():
                err = txn.last_error if txn.state is not TxnState.ABORTING else None
                self._abort_undrained(err or TransactionAbortableError("the transaction is being aborted"))
            return True
        if txn.pending and txn.sending_allowed:
            try:
                async with asyncio.timeout(self.config["delivery.timeout.ms"] / 1000):
                    await txn.add_pending_partitions()
            except TimeoutError:
                txn.fail(TransactionAbortableError("AddPartitionsToTxn not answered within delivery.timeout.ms"))
                return False
            except KafkaError as e:
                txn.fail(e)
                return False
        return True

    def _txn_epoch_changed(self) -> None:
        self.producer_id = self._txn.producer_id
        self.producer_epoch = self._txn.producer_epoch
        self._sequences.clear()
        self.acc.unsequence(b for q in self.acc.queues.values() for b in q)

    async def _init_producer_id(self) -> None:
        response = await self.cluster.request_any(
            INIT_PRODUCER_ID_KEY, ipi.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=0))
        if response.error_code:
            raise BrokerResponseError(response.error_code, "InitProducerId")
        self.producer_id = response.producer_id
        self.producer_epoch = response.producer_epoch
        self._sequences.clear()
        self.acc.unsequence(b for q in self.acc.queues.values() for b in q)
        self._need_producer_id = False
        log.info("producer id %d epoch %d", self.producer_id, self.producer_epoch)
