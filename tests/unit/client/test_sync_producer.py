"""The sync Producer's queue: records handed to the asyncio producer in the order they were sent, through
its fast path (send_nowait) or its waiting path (send) alike; a record's failure reaches its own
future; flush and close wait for the queue. The asyncio producer is a fake recording its calls, so the
thread hand-over is what is tested."""

from __future__ import annotations

import asyncio
import threading

import pytest

from odradek.client import sync
from odradek.client.batch import RecordMetadata
from odradek.client.errors import BufferFullError, IllegalStateError, KafkaError


class FakeProducer:
    def __init__(self, config=None, **kwargs) -> None:
        self.appended: list[tuple] = []
        self.threads: set[str] = set()
        self._batch_full = False
        self.flushed = self.closed = False

    async def start(self):
        return self

    def _append(self, topic, value):
        self.threads.add(threading.current_thread().name)
        if value == b"too large":
            raise KafkaError("record too large")
        self.appended.append((topic, value))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(RecordMetadata(topic, 0, len(self.appended) - 1, 0))
        self._batch_full = len(self.appended) % 100 == 0
        return fut

    def send_nowait(self, topic, value=None, key=None, **kw):
        if topic == "waits" or value.endswith(b"7"):
            raise BufferFullError("full")          # the facade must take send() and keep the order
        return self._append(topic, value)

    async def send(self, topic, value=None, key=None, **kw):
        await asyncio.sleep(0)                 # a send that yields to the loop, as a real one does
        return self._append(topic, value)

    async def flush(self, timeout=None):
        self.flushed = True

    async def aclose(self, timeout=None):
        self.closed = True


@pytest.fixture
def producer(monkeypatch):
    monkeypatch.setattr(sync, "AsyncProducer", FakeProducer)
    p = sync.Producer({"bootstrap.servers": "fake:9092"})
    yield p
    p.close()


def test_records_keep_their_order_through_both_paths(producer):
    futures = [producer.send("t" if i % 13 else "waits", b"v%d" % i) for i in range(3000)]
    producer.flush()
    inner = producer._inner
    assert inner.flushed
    assert [v for _, v in inner.appended] == [b"v%d" % i for i in range(3000)]
    assert [f.result(5).offset for f in futures[:50]] == list(range(50))
    assert all(f.done() for f in futures)
    assert inner.threads == {"odradek-producer-loop"}      # the asyncio producer is only used on its loop


def test_a_failure_reaches_its_own_future(producer):
    ok, bad, later = (producer.send("t", v) for v in (b"a", b"too large", b"b"))
    assert ok.result(5).offset == 0 and later.result(5).offset == 1
    assert isinstance(bad.exception(5), KafkaError)
    with pytest.raises(KafkaError, match="too large"):
        bad.result(5)
    called = threading.Event()
    bad.add_done_callback(lambda f: called.set())
    assert called.wait(5)


class CountingEvent(threading.Event):
    waits = 0

    def wait(self, timeout=None):
        CountingEvent.waits += 1
        return super().wait(timeout)


def test_the_queue_is_bounded(producer, monkeypatch):
    monkeypatch.setattr(sync, "MAX_QUEUED_RECORDS", 64)
    producer._room = CountingEvent()
    producer._room.set()
    futures = [producer.send("t", b"x%d" % i) for i in range(5000)]
    assert len(producer._queue) <= 64 and CountingEvent.waits > 0   # send() waited for the loop thread
    futures[-1].result(5)
    assert len(producer._inner.appended) == 5000


def test_close_hands_over_what_is_queued_then_refuses(producer):
    for i in range(500):
        producer.send("t", b"x%d" % i)
    producer.close()
    assert len(producer._inner.appended) == 500 and producer._inner.closed
    with pytest.raises(IllegalStateError):
        producer.send("t", b"after close")
