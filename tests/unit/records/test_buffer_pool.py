"""Builders writing into reused buffers (`buffer=`, `BufferPool`) build exactly what fresh ones do."""

from __future__ import annotations

import io
import random

import pytest

from odradek.records import GZIP, ZSTD, RecordBatch, RecordBatchBuilder
from odradek.records.buffer_pool import BufferPool


def _fill(builder: RecordBatchBuilder, r: random.Random, count: int) -> None:
    for i in range(count):
        key = None if r.random() < 0.5 else r.randbytes(r.randrange(0, 40))
        value = None if r.random() < 0.1 else r.randbytes(r.choice([0, 1, 100, 1024, 9000]))
        ts = 1_700_000_000_000 + r.randrange(-5000, 5000)
        if r.random() < 0.2:
            builder.append(key, value, headers=[("h", b"x")], timestamp=ts)
        else:
            builder.append_plain(key, value, ts)


@pytest.mark.parametrize("codec", [0, GZIP, ZSTD])
def test_a_reused_buffer_builds_the_bytes_a_fresh_one_does(codec):
    """Batches shrink and grow in turn, so a reused buffer holds an earlier, longer batch's tail."""
    pool = BufferPool(1 << 24)
    r = random.Random(codec)
    reused = 0
    for count in [200, 3, 0, 1, 150, 40, 400, 2, 60]:
        seed = r.random()
        buf = pool.take()
        reused += buf is not None
        mine = RecordBatchBuilder(compression=codec, buffer=buf, producer_id=7, base_sequence=3)
        ref = RecordBatchBuilder(compression=codec, producer_id=7, base_sequence=3)
        _fill(mine, random.Random(seed), count)
        _fill(ref, random.Random(seed), count)
        assert mine.uncompressed_size == ref.uncompressed_size
        expected = ref.build()
        assert mine.build() == expected
        view = mine.build(copy=False)
        assert bytes(view) == expected
        assert len(list(RecordBatch(expected))) == count
        del view
        assert pool.give(mine.detach_buffer(), 1 << 30)
    assert reused == 8


def test_a_buffer_with_a_live_view_is_refused():
    pool = BufferPool(1 << 20)
    b = RecordBatchBuilder()
    b.append_plain(None, b"v" * 100, 1)
    view = b.build(copy=False)
    buf = b.detach_buffer()
    assert not pool.give(buf, 1 << 30)          # the next batch would overwrite what `view` shows
    assert len(pool) == 0 and pool.idle_bytes == 0
    expected = bytes(view)
    del view
    assert pool.give(buf, 1 << 30)
    assert pool.take() is buf
    assert RecordBatchBuilder(buffer=buf).build() != expected


def test_the_pool_keeps_within_its_room_and_size_limit():
    pool = BufferPool(max_buffer_bytes=10_000)
    small = [io.BytesIO(bytes(1000)) for _ in range(3)]
    big = io.BytesIO(bytes(20_000))
    assert not pool.give(big, 1 << 30)                    # larger than any batch it serves
    size = small[0].__sizeof__()
    assert pool.give(small[0], 2 * size)
    assert pool.give(small[1], 2 * size)
    assert not pool.give(small[2], 2 * size)             # idle bytes would pass the room
    assert len(pool) == 2 and pool.idle_bytes == 2 * size
    assert pool.take() is small[1]                       # the one used last
    assert pool.idle_bytes == size
    pool.clear()
    assert pool.take() is None and pool.idle_bytes == 0


def test_a_view_handed_out_blocks_appends_until_released():
    """build(copy=False): the builder takes no appends while the view is alive (as before)."""
    b = RecordBatchBuilder()
    b.append_plain(None, b"a", 5)
    view = b.build(copy=False)
    with pytest.raises(BufferError):
        b.append_plain(None, b"b", 6)
    del view
    b.append_plain(None, b"b", 6)
    assert [rec.value for rec in RecordBatch(b.build())] == [b"a", b"b"]
