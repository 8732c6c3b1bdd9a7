"""A producer batch: records for one partition, built with `RecordBatchBuilder`, and its outcome.

Records are encoded as they are appended (`RecordBatchBuilder.append_plain` for the common record) into
the builder's buffer, which is sent without another copy (`build(copy=False)`). `room` is what the
producer may still append without asking the accumulator: bytes charged to buffer.memory in advance
(see `RecordAccumulator.grant`), so appending a keyless record costs no accumulator bookkeeping.

Each record gets a `DeliveryFuture`: a small object that points at its batch and index, as the Java
client's FutureRecordMetadata does, so there is one asyncio future per batch, not per record.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from odradek.records.builder import RecordBatchBuilder

log = logging.getLogger("odradek.client.producer")

# The builder's fast path now lives in RecordBatchBuilder (`append_plain`); the old name stays.
FastRecordBatchBuilder = RecordBatchBuilder


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a record was written. offset is -1 with acks=0; timestamp is the broker's with
    LogAppendTime, else the record's."""
    topic: str
    partition: int
    offset: int
    timestamp: int
    serialized_key_size: int = -1
    serialized_value_size: int = -1


class ProducerBatch:
    """Records for one partition, from first append until the broker's answer (or failure)."""

    __slots__ = ("topic", "partition", "builder", "created_ms", "deadline_ms", "future", "callbacks",
                 "size_bytes", "room", "attempts", "retry_at_ms", "closed", "built", "base_offset",
                 "log_append_time", "error", "done", "record_count", "sequenced", "in_flight")

    def __init__(self, topic: str, partition: int, builder: RecordBatchBuilder, created_ms: float,
                 deadline_ms: float, loop: asyncio.AbstractEventLoop) -> None:
        self.topic = topic
        self.partition = partition
        self.builder = builder
        self.created_ms = created_ms
        self.deadline_ms = deadline_ms
        self.future: asyncio.Future = loop.create_future()
        self.callbacks: list | None = None
        self.size_bytes = 61           # accounted against buffer.memory (room included)
        self.room = 0                  # charged in advance, not appended yet
        self.attempts = 0
        self.retry_at_ms = 0.0
        self.closed = False            # no more appends
        self.built: bytes | None = None
        self.base_offset = -1
        self.log_append_time = -1
        self.error: BaseException | None = None
        self.done = False
        self.record_count = 0
        self.sequenced = False         # carries a producer id and sequence (idempotence)
        self.in_flight = False

    def add_callback(self, index: int, timestamp: int, key_size: int, value_size: int, cb) -> None:
        """cb(error, metadata) for record `index` once the batch is done."""
        if self.callbacks is None:
            self.callbacks = []
        self.callbacks.append((index, timestamp, key_size, value_size, cb))

    def build(self):
        """The batch's bytes (a view of the builder's buffer: no appends after this)."""
        if self.built is None:
            self.built = self.builder.build(copy=False)
        return self.built

    def complete(self, base_offset: int, log_append_time: int = -1,
                 error: BaseException | None = None) -> None:
        if self.done:
            return
        self.done = True
        self.base_offset = base_offset
        self.log_append_time = log_append_time
        self.error = error
        self.builder = None  # type: ignore[assignment]  # free the records
        self.built = None
        if error is None:
            self.future.set_result(None)
        else:
            self.future.set_exception(error)
            self.future.exception()  # reported here and to callbacks, not as "never retrieved"
            log.warning("delivery of %d records to %s-%d failed: %s", self.record_count, self.topic,
                        self.partition, error)
        if self.callbacks:
            for index, timestamp, ksize, vsize, cb in self.callbacks:
                md = None if error is not None else self._metadata(index, timestamp, ksize, vsize)
                try:
                    cb(error, md)
                except Exception:  # a user callback must not break the sender
                    log.exception("delivery callback raised")

    def _metadata(self, index: int, timestamp: int, ksize: int, vsize: int) -> RecordMetadata:
        return RecordMetadata(self.topic, self.partition,
                              self.base_offset + index if self.base_offset >= 0 else -1,
                              self.log_append_time if self.log_append_time >= 0 else timestamp,
                              ksize, vsize)


class DeliveryFuture:
    """The outcome of one record: `await` it for its RecordMetadata (or the error)."""

    __slots__ = ("batch", "index", "timestamp", "key_size", "value_size")

    def __init__(self, batch: ProducerBatch, index: int, timestamp: int, key_size: int,
                 value_size: int) -> None:
        self.batch = batch
        self.index = index
        self.timestamp = timestamp
        self.key_size = key_size
        self.value_size = value_size

    def __await__(self):
        yield from self.batch.future.__await__()
        return self.result()

    def done(self) -> bool:
        return self.batch.done

    def exception(self) -> BaseException | None:
        if not self.batch.done:
            raise asyncio.InvalidStateError("record not delivered yet")
        return self.batch.error

    def result(self) -> RecordMetadata:
        b = self.batch
        if not b.done:
            raise asyncio.InvalidStateError("record not delivered yet")
        if b.error is not None:
            raise b.error
        return b._metadata(self.index, self.timestamp, self.key_size, self.value_size)

    def add_done_callback(self, fn) -> None:
        """fn(self), in the event loop, once the record is delivered or failed."""
        self.batch.future.add_done_callback(lambda _f: fn(self))
