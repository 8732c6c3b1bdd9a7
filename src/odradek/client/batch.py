"""A producer batch: records for one partition, built with `RecordBatchBuilder`, and its outcome.

`FastRecordBatchBuilder` is `odradek.records.builder.RecordBatchBuilder` with a faster `append` for the
producer's common case (no explicit offset): varints come from a table instead of being computed, and
each record is one join. It writes exactly the bytes the base class writes (tests compare them) and
falls back to the base class for anything unusual. It relies on the builder's private state
(`_records`, `_count`, `_last_offset_delta`, `_base_timestamp`, `_max_timestamp`); the fast path
belongs in `odradek.records` eventually.

Each record gets a `DeliveryFuture`: a small object that points at its batch and index, as the Java
client's FutureRecordMetadata does, so there is one asyncio future per batch, not per record.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from odradek.records.builder import RecordBatchBuilder

log = logging.getLogger("odradek.client.producer")

_TABLE_SIZE = 1 << 14


def _uvarint(u: int) -> bytes:
    if u < 0x200000:
        if u < 0x4000:
            return bytes((u & 0x7F | 0x80, u >> 7)) if u >= 0x80 else bytes((u,))
        return bytes((u & 0x7F | 0x80, (u >> 7) & 0x7F | 0x80, u >> 14))
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


_UV = [_uvarint(i) for i in range(_TABLE_SIZE)]


_BYTES = (bytes, bytearray)


class FastRecordBatchBuilder(RecordBatchBuilder):
    __slots__ = ()

    def append(self, key, value, *, headers=(), timestamp: int = -1, offset: int | None = None) -> int:
        if (offset is not None or headers or (key is not None and type(key) not in _BYTES)
                or (value is not None and type(value) not in _BYTES)):
            return super().append(key, value, headers=headers, timestamp=timestamp, offset=offset)
        return self.append_plain(key, value, timestamp)

    def append_plain(self, key, value, timestamp: int) -> int:
        """append() for a record without headers whose key and value are bytes, bytearray or None."""
        od = self._last_offset_delta + 1
        base = self._base_timestamp
        if base is None:
            base = self._base_timestamp = timestamp
        td = timestamp - base
        u = td << 1 if td >= 0 else ((-td) << 1) - 1
        o = od << 1
        if key is None:
            kb = b"\x01"
        else:
            ksize = len(key) << 1
            kb = (_UV[ksize] if ksize < _TABLE_SIZE else _uvarint(ksize)) + key
        if value is None:
            rec = b"".join((b"\x00", _UV[u] if u < _TABLE_SIZE else _uvarint(u),
                            _UV[o] if o < _TABLE_SIZE else _uvarint(o), kb, b"\x01\x00"))
        else:
            vsize = len(value) << 1
            rec = b"".join((b"\x00", _UV[u] if u < _TABLE_SIZE else _uvarint(u),
                            _UV[o] if o < _TABLE_SIZE else _uvarint(o), kb,
                            _UV[vsize] if vsize < _TABLE_SIZE else _uvarint(vsize), value, b"\x00"))
        n = len(rec) << 1
        records = self._records
        records += _UV[n] if n < _TABLE_SIZE else _uvarint(n)
        records += rec
        self._count += 1
        self._last_offset_delta = od
        if timestamp > self._max_timestamp:
            self._max_timestamp = timestamp
        return self.base_offset + od


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
                 "size_bytes", "attempts", "retry_at_ms", "closed", "built", "base_offset",
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
        self.size_bytes = 61           # accounted against buffer.memory
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

    def build(self) -> bytes:
        if self.built is None:
            self.built = self.builder.build()
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
