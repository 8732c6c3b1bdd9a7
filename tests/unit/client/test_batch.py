"""The producer's batch builder writes exactly what RecordBatchBuilder writes; futures; config."""

from __future__ import annotations

import asyncio
import random

import pytest

from odradek.client.batch import DeliveryFuture, FastRecordBatchBuilder, ProducerBatch
from odradek.client.config import consumer_config, producer_config
from odradek.client.errors import ConfigError, KafkaError
from odradek.records import GZIP, ZSTD, RecordBatch, RecordBatchBuilder


def _value(r: random.Random):
    if r.random() < 0.15:
        return None
    return r.randbytes(r.choice([0, 1, 63, 64, 100, 8191, 8192, 20000, 70000]))


@pytest.mark.parametrize("codec", [0, GZIP, ZSTD])
def test_fast_builder_matches_record_batch_builder(codec):
    r = random.Random(codec)
    for _ in range(100):
        fast, ref = FastRecordBatchBuilder(compression=codec), RecordBatchBuilder(compression=codec)
        for _ in range(r.randrange(1, 40)):
            key = _value(r)
            value = _value(r)
            headers = [] if r.random() < 0.7 else [("a", b"1"), ("b", None), ("ü", b"")]
            ts = 1_700_000_000_000 + r.randrange(-10**9, 10**9)
            if r.random() < 0.5 and not headers:
                fast.append_plain(key, value, ts)
            else:
                fast.append(key, value, headers=headers, timestamp=ts)
            ref.append(key, value, headers=headers, timestamp=ts)
        assert fast.build() == ref.build()


def test_fast_builder_many_records_large_offset_deltas():
    fast, ref = FastRecordBatchBuilder(), RecordBatchBuilder()
    for i in range(40000):
        fast.append_plain(None, b"v", 1000 + i)
        ref.append(None, b"v", timestamp=1000 + i)
    data = fast.build()
    assert data == ref.build()
    assert [rec.offset for rec in RecordBatch(data)][-1] == 39999


def test_delivery_future_reports_offset_and_log_append_time():
    async def main():
        loop = asyncio.get_running_loop()
        b = ProducerBatch("t", 3, FastRecordBatchBuilder(), 0, 1000, loop)
        calls = []
        b.callbacks = [(1, 55, 1, 2, lambda err, md: calls.append((err, md)))]
        f0 = DeliveryFuture(b, 0, 50, -1, 2)
        f1 = DeliveryFuture(b, 1, 55, 1, 2)
        assert not f1.done()
        b.complete(100, -1)
        md0, md1 = await f0, await f1
        assert (md0.partition, md0.offset, md0.timestamp) == (3, 100, 50)
        assert (md1.offset, md1.timestamp, md1.serialized_key_size) == (101, 55, 1)
        assert calls == [(None, md1)]
        b2 = ProducerBatch("t", 0, FastRecordBatchBuilder(), 0, 1000, loop)
        f2 = DeliveryFuture(b2, 0, 1, -1, -1)
        b2.complete(7, 999)
        assert (await f2).timestamp == 999      # LogAppendTime from the broker
        b3 = ProducerBatch("t", 0, FastRecordBatchBuilder(), 0, 1000, loop)
        f3 = DeliveryFuture(b3, 0, 1, -1, -1)
        b3.complete(-1, -1, KafkaError("boom"))
        with pytest.raises(KafkaError):
            await f3
        assert isinstance(f3.exception(), KafkaError)
    asyncio.run(main())


def test_config_defaults_names_and_validation():
    c = producer_config({"bootstrap.servers": "a:1,b:2"}, linger_ms="7")
    assert c["bootstrap.servers"] == [("a", 1), ("b", 2)]
    assert c["linger.ms"] == 7 and c["acks"] == -1 and c["batch.size"] == 16384
    assert c["enable.idempotence"] is False
    assert producer_config({"bootstrap.servers": "x:1", "acks": "1", "compression.type": "zstd"})["compression.type"] == 4
    with pytest.raises(ConfigError):
        producer_config({"bootstrap.servers": "x:1", "linger.msec": 1})
    with pytest.raises(ConfigError):
        producer_config({"bootstrap.servers": "x:1", "acks": "2"})
    with pytest.raises(ConfigError):
        producer_config({"bootstrap.servers": "x:1", "enable.idempotence": True, "acks": 1})
    with pytest.raises(ConfigError):
        producer_config({})
    cc = consumer_config({"bootstrap.servers": "PLAINTEXT://h:9"})
    assert cc["bootstrap.servers"] == [("h", 9)]
    assert (cc["auto.offset.reset"], cc["fetch.max.wait.ms"], cc["max.partition.fetch.bytes"]) == \
        ("latest", 500, 1048576)
    with pytest.raises(ConfigError):
        consumer_config({"bootstrap.servers": "h:9", "isolation.level": "dirty"})
