import random
import struct
import zlib

import pytest
from crc32c import crc32c

from odradek.records import codecs
from odradek.storage.errors import CorruptRecordError
from odradek.storage.timestamps import SCAN_BUDGET_BYTES, offset_for_timestamp
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


# ------------------------------------------------------------------------------ bounded scans
def lying(raw: bytes, max_timestamp: int) -> bytearray:
    """The batch with its header's max_timestamp replaced (and the CRC made to match): what a client
    may send when nothing recomputes the maximum from the records."""
    buf = bytearray(raw)
    struct.pack_into(">q", buf, 35, max_timestamp)
    struct.pack_into(">I", buf, 17, crc32c(bytes(buf[21:])))
    return buf


def exact(appended: list[tuple[int, int]], target: int, min_offset: int = 0):
    """Brute force over (offset, timestamp) of every record appended."""
    return next(((ts, o) for o, ts in appended if ts >= target and o >= min_offset), None)


def append_records(log, timestamps: list[list[int]], lie: dict[int, int] | None = None):
    """One batch per list of record timestamps; batch i's header claims lie[i] when given."""
    appended = []
    for i, stamps in enumerate(timestamps):
        raw = batch([b"x" * 40] * len(stamps), base_timestamp=stamps[0],
                    timestamp_deltas=[t - stamps[0] for t in stamps])
        if lie and i in lie:
            raw = lying(raw, lie[i])
        info = log.append(bytearray(raw), 0, now_ms=0)
        appended += [(info.first_offset + j, t) for j, t in enumerate(stamps)]
    return appended


@pytest.mark.parametrize("seed", range(6))
def test_honest_headers_are_answered_inside_the_range_the_indexes_give(tmp_path, seed):
    """Timestamps going up and down: every answer equals brute force, and no scan ever walks past the
    batch the time index points at (work_bytes stays 0)."""
    rnd = random.Random(seed)
    log = open_log(tmp_path, segment_bytes=20_000, index_interval_bytes=rnd.choice([0, 150, 700]),
                   segment_ms=10**12)
    stamps = [[rnd.randint(0, 5_000) for _ in range(rnd.randint(1, 4))] for _ in range(300)]
    appended = append_records(log, stamps)
    assert len(log.segments) > 2
    for target in sorted({rnd.randint(-5, 5_100) for _ in range(150)} | {0, 5_000}):
        if target < 0:
            continue
        found = None
        for scan in log.timestamp_scans(target):
            found = scan.run()
            assert scan.work_bytes == 0, f"target {target}: walked past the indexed range"
            if found is not None:
                break
        assert found == exact(appended, target), target


def test_a_lying_header_is_walked_past_and_the_real_answer_found(tmp_path):
    log = open_log(tmp_path, segment_bytes=10**6, index_interval_bytes=200)
    stamps = [[1_000 + i] for i in range(20)] + [[1_020]] + [[1_021 + i] for i in range(40)] + [[5_000]]
    appended = append_records(log, stamps, lie={20: 10**15})
    hit = log.offset_for_timestamp(3_000)
    assert (hit.timestamp, hit.offset) == exact(appended, 3_000) == (5_000, 61)
    hit = log.offset_for_timestamp(1_030)
    assert (hit.timestamp, hit.offset) == exact(appended, 1_030)
    assert log.offset_for_timestamp(10**14) is None          # only the lie claims it
    # MAX_TIMESTAMP: the batch holding the claimed maximum has no such record; Kafka answers none
    assert log.max_timestamp_and_offset() is None


def test_walking_past_lies_is_bounded_and_answers_no_later_than_the_truth(tmp_path):
    """A lying batch, then about 750 KB of records older than the target: past its budget the scan
    gives up and answers with the first record where it stopped (a consumer starting there misses
    nothing); the work stays within the budget plus one batch."""
    log = open_log(tmp_path, segment_bytes=64 << 20, index_interval_bytes=4096)
    appended = append_records(log, [[1_000]] + [[1_000 + i] * 40 for i in range(1, 300)] + [[9_000]],
                              lie={0: 10**15})
    budget = 64 * 1024
    scan = log.segments[0].timestamp_scan(9_000, 0, None, budget_bytes=budget)
    found = scan.run()
    truth = exact(appended, 9_000)
    assert found is not None and found[1] < truth[1]
    assert budget <= scan.work_bytes <= budget + 4096
    assert found == next((ts, o) for o, ts in appended if o == found[1])   # a real record
    # with the whole default budget the same lookup reaches the real answer
    hit = log.offset_for_timestamp(9_000)
    assert (hit.timestamp, hit.offset) == truth and SCAN_BUDGET_BYTES > 750_000


def test_a_negative_record_length_is_corruption_not_a_hang():
    raw = bytearray(batch([b"abc", b"def"], base_timestamp=1_000, timestamp_deltas=[0, 5]))
    raw[61] = 0x05                      # first record length varint: -3
    struct.pack_into(">i", raw, 57, 2**31 - 1)   # and a records count that would loop for ever
    raw[17:21] = struct.pack(">I", crc32c(bytes(raw[21:])))
    with pytest.raises(CorruptRecordError):
        offset_for_timestamp(bytes(raw), 1_003, 0)


def test_a_scan_reads_its_own_descriptor(tmp_path):
    """Planned on one thread, run on another after the segment was closed and deleted."""
    log = open_log(tmp_path, segment_bytes=10**6)
    append_records(log, [[1_000 + i] for i in range(10)])
    [scan] = list(log.timestamp_scans(1_005))
    log.release()
    for segment in log.segments:
        segment.delete()
    assert scan.run() == (1_005, 5)
    assert scan.file.closed
