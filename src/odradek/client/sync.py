"""A synchronous facade for scripts: the asyncio producer and consumer, run on an event loop in a
background thread that the facade object owns (started in the constructor, stopped by `close()` or by
leaving a `with` block).

    with Producer({"bootstrap.servers": "localhost:9092"}) as p:
        p.send("events", b"v", key=b"k").result()          # a concurrent.futures.Future
        p.flush()

    with Consumer({"bootstrap.servers": "localhost:9092", "auto.offset.reset": "earliest"}) as c:
        c.assign([("events", 0)])
        for record in c.poll(timeout_ms=1000): ...

Every call crosses to the loop thread and waits for its answer, so a `send` costs a thread round trip;
use the asyncio `Producer` for throughput. `on_delivery` callbacks run on the loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Iterator

from odradek.client.admin import ADMIN_CALLS, Admin as AsyncAdmin
from odradek.client.batch import RecordMetadata
from odradek.client.consumer import Consumer as AsyncConsumer
from odradek.client.fetcher import ConsumerRecord, FetchedBatch, OffsetAndTimestamp, TopicPartition
from odradek.client.producer import Producer as AsyncProducer

__all__ = ["Admin", "Producer", "Consumer", "RecordMetadata", "ConsumerRecord", "FetchedBatch", "TopicPartition",
           "OffsetAndTimestamp"]


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
    def __init__(self, config: dict | None = None, **kwargs) -> None:
        super().__init__(AsyncProducer(config, **kwargs), "odradek-producer-loop")

    def _aclose(self, timeout):
        return self._inner.aclose(timeout)

    def send(self, topic: str, value=None, key=None, *, partition: int | None = None,
             timestamp_ms: int | None = None, headers=None, on_delivery=None) -> concurrent.futures.Future:
        """Buffer a record (blocking at most max.block.ms); a Future of its RecordMetadata."""
        async def send():
            df = await self._inner.send(topic, value, key, partition=partition, timestamp_ms=timestamp_ms,
                                        headers=headers, on_delivery=on_delivery)
            out: concurrent.futures.Future = concurrent.futures.Future()

            def done(d) -> None:
                e = d.exception()
                if e is not None:
                    out.set_exception(e)
                else:
                    out.set_result(d.result())
            df.add_done_callback(done)
            return out
        return self._lt.run(send())

    def flush(self, timeout: float | None = None) -> None:
        self._lt.run(self._inner.flush(timeout))

    def partitions_for(self, topic: str) -> list[int]:
        return self._lt.run(self._inner.partitions_for(topic))


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
