"""A synchronous facade for scripts: the asyncio producer and consumer, run on an event loop in a
background thread that the facade object owns (started in the constructor, stopped by `close()` or by
leaving a `with` block).

    with Producer({"bootstrap.servers": "localhost:9092"}) as p:
        p.send("events", b"v", key=b"k").result()          # RecordFuture: concurrent.futures' methods
        p.flush()

    with Consumer({"bootstrap.servers": "localhost:9092", "auto.offset.reset": "earliest"}) as c:
        c.assign([("events", 0)])
        for record in c.poll(timeout_ms=1000): ...

Every call crosses to the loop thread and waits for its answer, except `Producer.send`, which queues
the record for the loop thread and returns a `RecordFuture` at once (its errors come through that
future). A consumer poll is one crossing for up to max.poll.records records, decoded in bulk on the loop
thread. `on_delivery` callbacks run on the loop thread. The transactional calls
(`init_transactions`, `begin_transaction`, `send_offsets_to_transaction`, `commit_transaction`,
`abort_transaction`, `prepare_transaction`) block, and apply after the records sent before them.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from typing import Iterator

from odradek.client.admin import ADMIN_CALLS, Admin as AsyncAdmin
from odradek.client.batch import RecordMetadata
from odradek.client.consumer import Consumer as AsyncConsumer, RecordColumns
from odradek.client.fetcher import ConsumerRecord, FetchedBatch, OffsetAndTimestamp, TopicPartition
from odradek.client.errors import BufferFullError, IllegalStateError
from odradek.client.producer import Producer as AsyncProducer, _NoMetadata
from odradek.client.transactions import ConsumerGroupMetadata, PreparedTransaction

__all__ = ["Admin", "Producer", "Consumer", "RecordMetadata", "RecordFuture", "ConsumerRecord", "FetchedBatch",
           "TopicPartition", "OffsetAndTimestamp", "RecordColumns"]

MAX_QUEUED_RECORDS = 16384    # records a sync send may queue ahead of the loop thread


class _LoopThread:
    """An event loop running in a thread owned by one facade object."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn, *args, **kwargs):
        async def wrapper():
            return fn(*args, **kwargs)
        return self.run(wrapper())

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class _Facade:
    _inner: object

    def __init__(self, inner, name: str) -> None:
        self._lt = _LoopThread(name)
        self._inner = inner
        self._closed = False
        try:
            self._lt.run(inner.start())
        except BaseException:
            self._lt.stop()
            raise

    def _aclose(self, timeout):
        return self._inner.aclose()

    def close(self, timeout: float | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._lt.run(self._aclose(timeout))
        finally:
            self._lt.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Producer(_Facade):
    """`send` queues the record for the loop thread and returns at once: no thread round trip per
    record. The loop thread hands queued records to the asyncio producer in order (waiting there, up
    to max.block.ms, only for metadata or buffer.memory); at most MAX_QUEUED_RECORDS wait in the queue,
    beyond which `send` blocks until the loop thread has caught up."""

    def __init__(self, config: dict | None = None, **kwargs) -> None:
        super().__init__(AsyncProducer(config, **kwargs), "odradek-producer-loop")
        self._queue: collections.deque = collections.deque()
        self._idle = True                    # no drain scheduled or running
        self._drain_task: asyncio.Task | None = None
        self._room = threading.Event()       # set when the queue has room again
        self._room.set()

    def send(self, topic: str, value=None, key=None, *, partition: int | None = None,
             timestamp_ms: int | None = None, headers=None, on_delivery=None) -> "RecordFuture":
        """Queue a record; a future of its RecordMetadata (errors, such as a record too large or
        max.block.ms passing, are raised by that future, as the Java client reports them)."""
        if self._closed:
            raise IllegalStateError("producer is closed")
        f = RecordFuture(self)
        q = self._queue
        q.append((f, topic, value, key, partition, timestamp_ms, headers, on_delivery))
        if self._idle:
            self._idle = False
            self._lt.loop.call_soon_threadsafe(self._start_drain)
        if len(q) >= MAX_QUEUED_RECORDS:
            self._room.clear()
            if len(q) >= MAX_QUEUED_RECORDS:   # the loop thread may have caught up meanwhile
                self._room.wait()
        return f

    def _start_drain(self) -> None:
        if self._drain_task is None or self._drain_task.done():
            self._drain_task = self._lt.loop.create_task(self._drain(), name="odradek-sync-producer-drain")

    async def _drain(self) -> None:
        """Hand queued records to the producer, in order (runs on the loop thread)."""
        inner = self._inner
        q = self._queue
        while True:
            while q:
                f, topic, value, key, partition, timestamp_ms, headers, on_delivery = q.popleft()
                try:
                    try:
                        f._delivery = inner.send_nowait(topic, value, key, partition=partition,
                                                        timestamp_ms=timestamp_ms, headers=headers,
                                                        on_delivery=on_delivery)
                    except (BufferFullError, _NoMetadata):
                        f._delivery = await inner.send(topic, value, key, partition=partition,
                                                       timestamp_ms=timestamp_ms, headers=headers,
                                                       on_delivery=on_delivery)
                except Exception as e:   # this record's failure, reported by its future
                    f._error = e
                f._handed = True
                if inner._batch_full:    # let the sender ship the full batch, as send() does
                    inner._batch_full = False
                    await asyncio.sleep(0)
                if not self._room.is_set() and len(q) < MAX_QUEUED_RECORDS // 2:
                    self._room.set()
            self._room.set()
            self._idle = True
            if not q:
                return
            self._idle = False           # a record came after the check: go on

    async def _drained(self) -> None:
        """Wait until every record queued before this call was handed to the producer."""
        while self._queue or (self._drain_task is not None and not self._drain_task.done()):
            self._start_drain()
            await asyncio.shield(self._drain_task)

    async def _aclose_all(self, timeout):
        try:
            async with asyncio.timeout(timeout):
                await self._drained()
        except TimeoutError:
            pass
        await self._inner.aclose(timeout)

    def _aclose(self, timeout):
        return self._aclose_all(timeout)

    def flush(self, timeout: float | None = None) -> None:
        async def flush():
            await self._drained()
            await self._inner.flush(timeout)
        self._lt.run(flush())

    def partitions_for(self, topic: str) -> list[int]:
        return self._lt.run(self._inner.partitions_for(topic))

    # Transactions (transactional.id): the asyncio producer's calls, each after the records queued
    # before it have been handed over, so a record sent inside a transaction belongs to it.
    def init_transactions(self, timeout: float | None = None) -> None:
        self._lt.run(self._inner.init_transactions(timeout))

    def begin_transaction(self) -> None:
        async def begin():
            await self._drained()
            self._inner.begin_transaction()
        self._lt.run(begin())

    def send_offsets_to_transaction(self, offsets: dict, group_metadata, timeout: float | None = None) -> None:
        async def send():
            await self._drained()
            await self._inner.send_offsets_to_transaction(offsets, group_metadata, timeout)
        self._lt.run(send())

    def prepare_transaction(self, timeout: float | None = None) -> PreparedTransaction:
        async def prepare():
            await self._drained()
            return await self._inner.prepare_transaction(timeout)
        return self._lt.run(prepare())

    def commit_transaction(self, timeout: float | None = None) -> None:
        async def commit():
            await self._drained()
            await self._inner.commit_transaction(timeout)
        self._lt.run(commit())

    def abort_transaction(self, timeout: float | None = None) -> None:
        async def abort():
            await self._drained()
            await self._inner.abort_transaction(timeout)
        self._lt.run(abort())


class RecordFuture:
    """The outcome of one record sent through the sync Producer, with concurrent.futures.Future's
    methods: result(timeout), exception(timeout), done(), add_done_callback(fn)."""

    __slots__ = ("_producer", "_delivery", "_error", "_handed")

    def __init__(self, producer: Producer) -> None:
        self._producer = producer
        self._delivery = None    # the asyncio producer's DeliveryFuture, once handed over
        self._error: BaseException | None = None
        self._handed = False

    async def _outcome(self) -> RecordMetadata:
        if not self._handed:
            await self._producer._drained()
        if self._error is not None:
            raise self._error
        return await self._delivery

    def result(self, timeout: float | None = None) -> RecordMetadata:
        try:
            return self._producer._lt.run(self._outcome(), timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"record not delivered within {timeout} s") from None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.result(timeout)
        except TimeoutError:
            raise
        except Exception as e:
            return e
        return None

    def done(self) -> bool:
        return self._handed and (self._error is not None or self._delivery.done())

    def add_done_callback(self, fn) -> None:
        """fn(self) once the record is delivered or failed (called on the loop thread)."""
        async def outcome():
            try:
                await self._outcome()
            except Exception:
                pass
        fut = asyncio.run_coroutine_threadsafe(outcome(), self._producer._lt.loop)
        fut.add_done_callback(lambda _f: fn(self))


class Consumer(_Facade):
    def __init__(self, config: dict | None = None, **kwargs) -> None:
        super().__init__(AsyncConsumer(config, **kwargs), "odradek-consumer-loop")

    def assign(self, partitions) -> None:
        self._lt.call(self._inner.assign, list(partitions))

    def assignment(self) -> set[TopicPartition]:
        return self._lt.call(self._inner.assignment)

    def subscribe(self, topics=None, pattern=None, listener=None) -> None:
        """Join group.id; the listener's callbacks run on the loop thread, inside poll()."""
        self._lt.call(self._inner.subscribe, topics, pattern, listener)

    def unsubscribe(self) -> None:
        self._lt.call(self._inner.unsubscribe)

    def subscription(self) -> set[str]:
        return self._lt.call(self._inner.subscription)

    def commit(self, offsets=None, timeout_ms: int | None = None) -> None:
        self._lt.run(self._inner.commit(offsets, timeout_ms))

    def commit_async(self, offsets=None, callback=None) -> None:
        """The callback runs on the loop thread."""
        self._lt.call(self._inner.commit_async, offsets, callback)

    def committed(self, partitions, timeout_ms: int | None = None) -> dict:
        return self._lt.run(self._inner.committed(list(partitions), timeout_ms))

    def seek(self, tp, offset: int) -> None:
        self._lt.call(self._inner.seek, tp, offset)

    def group_metadata(self) -> ConsumerGroupMetadata:
        return self._lt.call(self._inner.group_metadata)

    def seek_to_beginning(self, *partitions) -> None:
        self._lt.call(self._inner.seek_to_beginning, *partitions)

    def seek_to_end(self, *partitions) -> None:
        self._lt.call(self._inner.seek_to_end, *partitions)

    def position(self, tp) -> int:
        return self._lt.run(self._inner.position(tp))

    def pause(self, *partitions) -> None:
        self._lt.call(self._inner.pause, *partitions)

    def resume(self, *partitions) -> None:
        self._lt.call(self._inner.resume, *partitions)

    def paused(self) -> set[TopicPartition]:
        return self._lt.call(self._inner.paused)

    def highwater(self, tp) -> int:
        return self._lt.call(self._inner.highwater, tp)

    def offsets_for_times(self, timestamps: dict) -> dict:
        return self._lt.run(self._inner.offsets_for_times(timestamps))

    def beginning_offsets(self, partitions) -> dict:
        return self._lt.run(self._inner.beginning_offsets(list(partitions)))

    def end_offsets(self, partitions) -> dict:
        return self._lt.run(self._inner.end_offsets(list(partitions)))

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[ConsumerRecord]:
        return self._lt.run(self._inner.poll(timeout_ms, max_records))

    def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        return self._lt.run(self._inner.getmany(timeout_ms, max_records))

    def getmany_columns(self, timeout_ms: int = 0, max_records: int | None = None
                        ) -> dict[TopicPartition, RecordColumns]:
        return self._lt.run(self._inner.getmany_columns(timeout_ms, max_records))

    def fetch_batches(self, timeout_ms: int = 0, max_batches: int = 1000) -> list[FetchedBatch]:
        """Whole batches; each batch's `data` is copied to bytes, since the loop thread moves on."""
        async def fetch():
            out = await self._inner.fetch_batches(timeout_ms, max_batches)
            for b in out:
                b.data = memoryview(bytes(b.data))
            return out
        return self._lt.run(fetch())

    def batches(self, timeout_ms: int | None = None) -> Iterator[FetchedBatch]:
        while not self._closed:
            got = self.fetch_batches(1000 if timeout_ms is None else timeout_ms)
            if not got and timeout_ms is not None:
                return
            yield from got

    def __iter__(self) -> Iterator[ConsumerRecord]:
        while not self._closed:
            yield from self.poll(timeout_ms=1000)


class Admin(_Facade):
    """The asyncio `admin.Admin` with every call blocking: same names, arguments and results.

        with Admin({"bootstrap.servers": "localhost:9092"}) as admin:
            admin.create_topics([NewTopic("events", 6, 1)])
    """

    def __init__(self, config: dict | None = None, **kwargs) -> None:
        super().__init__(AsyncAdmin(config, **kwargs), "odradek-admin-loop")


def _blocking(name: str):
    def call(self, *args, **kwargs):
        return self._lt.run(getattr(self._inner, name)(*args, **kwargs))
    call.__name__ = call.__qualname__ = name
    call.__doc__ = getattr(AsyncAdmin, name).__doc__
    return call


for _name in ADMIN_CALLS:
    setattr(Admin, _name, _blocking(_name))
