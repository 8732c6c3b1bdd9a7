"""The producer's fast path: room charged to buffer.memory in advance, and the plain record encoding."""

from __future__ import annotations

import asyncio
import random

import pytest

from odradek.client.accumulator import RecordAccumulator
from odradek.records import RecordBatch, RecordBatchBuilder
from odradek.records.builder import encode_record


def _acc(loop, buffer_memory=10_000, batch_size=4096):
    return RecordAccumulator(batch_size=batch_size, buffer_memory=buffer_memory, linger_ms=5, compression=0,
                             delivery_timeout_ms=1000, retry_backoff_ms=10, guarantee_order=False, loop=loop)


def _charged(acc):
    return sum(b.size_bytes for b in acc.incomplete)


def test_room_is_charged_in_advance_and_given_back():
    async def main():
        acc = _acc(asyncio.get_running_loop())
        a = acc.new_batch("t", 0, 0)
        b = acc.new_batch("u", 0, 0)
        acc.grant(a)
        assert a.room == 4096 - 61 and a.size_bytes == 4096 and acc.used_bytes == _charged(acc)
        acc.grant(b)
        assert b.room == 4096 - 61 and acc.used_bytes == 2 * 4096
        acc.revoke(a)
        assert a.room == 0 and a.size_bytes == 61 and acc.used_bytes == _charged(acc) == 4096 + 61
        acc.close_batch(b)     # closing gives the rest back, and a closed batch gets no more
        acc.grant(b)
        assert b.room == 0 and acc.used_bytes == 2 * 61
        c = acc.new_batch("v", 0, 0)
        acc.grant(c)
        waiter = asyncio.ensure_future(acc.reserve(9900, 10**12, lambda: 0))
        await asyncio.sleep(0)  # someone waits for memory: what was charged in advance goes back
        assert c.room == 0 and acc.used_bytes == _charged(acc) == 3 * 61
        acc.grant(c)            # and none is charged while they wait
        assert c.room == 0 and not waiter.done()
        acc.completed(a)
        acc.completed(b)
        await waiter
    asyncio.run(main())


def test_grant_stays_within_the_buffer():
    async def main():
        acc = _acc(asyncio.get_running_loop(), buffer_memory=3000)
        a = acc.new_batch("t", 0, 0)
        acc.grant(a)
        assert a.room == 3000 - 61 and acc.used_bytes == 3000
        acc.completed(a)
        assert a.room == 0 and acc.used_bytes == 0
    asyncio.run(main())


@pytest.mark.parametrize("key,count", [(None, 9000), (b"", 9000), (b"k" * 200, 9000), (b"k" * 9000, 5)])
def test_append_plain_writes_what_encode_record_writes(key, count):
    r = random.Random(3)
    b = RecordBatchBuilder(base_offset=5)
    expected = bytearray()
    base = 1_700_000_000_000
    for i in range(count):   # offset deltas past the varint table
        ts = base + (r.choice([0, 1, 63, 64, 4095, 4096, 10**6, -1, -5000]) if i else 0)
        value = None if i % 97 == 1 else r.randbytes(r.choice([0, 1, 63, 64, 8191, 8192]) if i % 50 == 0 else 3)
        assert b.append_plain(key, value, ts) == 5 + i
        expected += encode_record(i, ts - base, key, value)
    data = b.build()
    assert data[61:] == expected
    assert bytes(b.build(copy=False)) == data
    assert [rec.offset for rec in RecordBatch(data)][-1] == 5 + count - 1
