"""`Producer.send_batch`: a whole record batch built elsewhere goes to the broker through the producer's
queue (the Spark sink's write path), read back identically by confluent-kafka; with idempotence the
producer stamps its id and sequences into it; what is not one clean batch is refused before it is queued."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from odradek.client import Consumer, KafkaError, Producer, TopicPartition
from odradek.protocol.exceptions import ProtocolError
from odradek.records.builder import RecordBatchBuilder
from odradek.records.header import BatchHeader, CRC_OFFSET

from .clients import consume_confluent

BROKER_OVERRIDES = {"num.partitions": 2}
BASE_TS = 1_700_000_000_000


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def built(n: int, start: int = 0, **kwargs) -> bytes:
    b = RecordBatchBuilder(**kwargs)
    for i in range(start, start + n):
        b.append(f"k{i}".encode(), f"v{i}".encode(), headers=[("h", str(i).encode())], timestamp=BASE_TS + i)
    return b.build()


async def raw_batches(bootstrap: str, topic: str, partition: int, count: int) -> list:
    async with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition(topic, partition)])
        out = []
        while sum(b.records_count for b in out) < count:
            got = await c.fetch_batches(timeout_ms=5000)
            assert got, f"only {len(out)} batches arrived"
            out += [BatchHeader(bytes(b.data)) for b in got]
        return out


def test_batches_arrive_whole_and_confluent_reads_them(broker):
    topic = f"sendbatch-{uuid.uuid4().hex[:8]}"

    async def go():
        async with Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0}) as p:
            first = await (await p.send_batch(topic, 1, built(5)))
            second = await (await p.send_batch(topic, 1, memoryview(built(3, start=5))))
            rec = await (await p.send(topic, b"after", partition=1, timestamp_ms=BASE_TS + 99))
            return first, second, rec.offset
    assert run(go()) == (0, 5, 8)
    got = consume_confluent(broker.bootstrap, topic, [1])
    assert [(r.offset, r.key, r.value, r.headers, r.ts) for r in got] == [
        (i, f"k{i}".encode(), f"v{i}".encode(), (("h", str(i).encode()),), BASE_TS + i) for i in range(8)
    ] + [(8, None, b"after", (), BASE_TS + 99)]
    headers = run(raw_batches(broker.bootstrap, topic, 1, 9))
    assert [(h.base_offset, h.records_count, h.producer_id) for h in headers] == [(0, 5, -1), (5, 3, -1), (8, 1, -1)]


def test_idempotent_producer_stamps_its_id_and_sequences(broker):
    topic = f"sendbatch-idem-{uuid.uuid4().hex[:8]}"

    async def go():
        async with Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                             "linger.ms": 0}) as p:
            futures = [await p.send_batch(topic, 0, built(4)), await p.send_batch(topic, 0, built(6, start=4))]
            offsets = [await f for f in futures]
            rec = await (await p.send(topic, b"after", partition=0))
            return offsets, rec.offset
    assert run(go()) == ([0, 4], 10)
    h1, h2, h3 = run(raw_batches(broker.bootstrap, topic, 0, 11))
    assert h1.producer_id >= 0 and h1.producer_id == h2.producer_id == h3.producer_id
    assert [(h.base_sequence, h.records_count) for h in (h1, h2, h3)] == [(0, 4), (4, 6), (10, 1)]
    assert all(h.is_valid() for h in (h1, h2, h3))
    assert [r.value for r in consume_confluent(broker.bootstrap, topic, [0])] == \
        [f"v{i}".encode() for i in range(10)] + [b"after"]


def test_what_is_not_one_clean_batch_is_refused(broker):
    topic = f"sendbatch-bad-{uuid.uuid4().hex[:8]}"
    good = built(2)
    corrupt = bytearray(good)
    corrupt[CRC_OFFSET] ^= 0xFF

    async def go():
        async with Producer({"bootstrap.servers": broker.bootstrap}) as p:
            await p.partitions_for(topic)
            cases = {
                "two batches": good + good,
                "truncated": good[:-1],
                "corrupt": bytes(corrupt),
                "transactional": built(1, producer_id=7, producer_epoch=0, base_sequence=0, is_transactional=True),
                "producer id": built(1, producer_id=7, producer_epoch=0, base_sequence=0),
                "legacy": b"\x00" * 16 + b"\x01" + b"\x00" * 60,
            }
            errors = {}
            for name, data in cases.items():
                with pytest.raises((ValueError, ProtocolError)) as e:
                    await p.send_batch(topic, 0, data)
                errors[name] = str(e.value)
            with pytest.raises(KafkaError) as e:
                await p.send_batch(topic, 5, good)
            errors["partition"] = str(e.value)
            assert await (await p.send_batch(topic, 0, good)) == 0     # the producer still works
            return errors
    errors = run(go())
    assert "exactly one record batch" in errors["two batches"]
    assert "truncated" in errors["truncated"]
    assert "corrupt" in errors["corrupt"]
    assert "transactional" in errors["transactional"]
    assert "producer id 7" in errors["producer id"]
    assert "magic" in errors["legacy"]
    assert "no partition 5" in errors["partition"]
