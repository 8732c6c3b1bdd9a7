import zlib

import pytest

from odradek.records import codecs
from odradek.storage.timestamps import offset_for_timestamp
from tests.unit.storage.batches import batch
from tests.unit.storage.logutil import open_log


def test_timestamp_search_in_compressed_batches_uses_the_decompressor():
    # codec 1 (gzip) bits; the stand-in codec is zlib, the storage layer only calls the hook
    raw = batch([b"a", b"b", b"c"], base_timestamp=1_000, timestamp_deltas=[0, 5, 9],
                attributes=1, compress=zlib.compress)
    exact = offset_for_timestamp(raw, 1_004, 0, lambda codec, data: zlib.decompress(data))
    assert exact == (1_005, 1)
    # without a decompressor: the batch start, never later than the exact answer
    assert offset_for_timestamp(raw, 1_004, 0) == (1_009, 0)
    assert offset_for_timestamp(raw, 1_010, 0) is None


@pytest.mark.parametrize("codec", [1, 2, 3, 4])  # gzip, snappy, lz4, zstd
def test_log_finds_records_inside_compressed_batches(tmp_path, codec):
    log = open_log(tmp_path, segment_bytes=10**6)
    for i in range(5):
        raw = batch([b"value-%d" % j for j in range(4)], base_timestamp=1_000 * (i + 1),
                    timestamp_deltas=[0, 10, 20, 30], attributes=codec,
                    compress=lambda data: codecs.compress(codec, data))
        log.append(bytearray(raw), 0, now_ms=0)
    hit = log.offset_for_timestamp(3_015)
    assert (hit.timestamp, hit.offset) == (3_020, 10)
    top = log.max_timestamp_and_offset()
    assert (top.timestamp, top.offset) == (5_030, 19)
