import os

from odradek.storage.retention import apply_retention, deletable_segment_count
from tests.unit.storage.logutil import offsets, open_log, produce, read_all

HOUR = 3_600_000


class FakeClock:
    def __init__(self, now_ms: int = 0) -> None:
        self.now_ms = now_ms

    def advance(self, ms: int) -> int:
        self.now_ms += ms
        return self.now_ms


def test_retention_by_time_uses_each_segments_largest_timestamp(tmp_path):
    clock = FakeClock(10 * HOUR)
    log = open_log(tmp_path, retention_ms=HOUR)
    # batch timestamps one minute apart, starting 10 hours ago
    produce(log, 60, size=150, ts0=0, step=60_000, now_ms=clock.now_ms)
    log.update_high_watermark(log.log_end_offset)
    segments = len(log.segments)
    # every batch is older than an hour: everything but the active segment goes
    assert apply_retention(log, clock.now_ms) == segments - 1
    assert len(log.segments) == 1
    assert log.log_start_offset == log.active_segment.base_offset
    assert offsets(read_all(log, log.log_start_offset))[-1] == 59


def test_retention_by_time_stops_at_the_first_young_segment(tmp_path):
    clock = FakeClock(0)
    log = open_log(tmp_path, retention_ms=HOUR)
    produce(log, 60, size=150, ts0=0, step=60_000)  # minute i holds offset i
    log.update_high_watermark(60)
    clock.advance(HOUR + 30 * 60_000)  # offsets up to ~29 are older than an hour
    deleted = apply_retention(log, clock.now_ms)
    assert deleted > 0
    first = log.segments[0]
    assert clock.now_ms - first.max_timestamp <= HOUR
    assert log.log_start_offset == first.base_offset
    assert 10 < log.log_start_offset <= 31
    assert apply_retention(log, clock.now_ms) == 0
    clock.advance(10 * HOUR)
    apply_retention(log, clock.now_ms)
    assert len(log.segments) == 1  # never the active segment


def test_retention_by_size(tmp_path):
    log = open_log(tmp_path, retention_ms=-1, retention_bytes=5_000)
    produce(log, 100, size=150)
    log.update_high_watermark(100)
    total = log.size_bytes
    apply_retention(log, 0)
    assert log.size_bytes <= 5_000 + 2_000
    assert log.size_bytes < total
    # deleting one more segment would go below retention.bytes
    assert log.size_bytes - log.segments[0].size < 5_000
    assert offsets(read_all(log, log.log_start_offset)) == \
        list(range(log.log_start_offset, 100))


def test_retention_never_deletes_above_the_high_watermark(tmp_path):
    log = open_log(tmp_path, retention_ms=0)
    produce(log, 60, size=150, ts0=0)
    assert deletable_segment_count(log, 10**12) == 0  # high watermark still 0
    log.update_high_watermark(log.segments[2].base_offset)
    assert apply_retention(log, 10**12) == 2


def test_compact_policy_is_not_deleted_by_time_or_size(tmp_path):
    log = open_log(tmp_path, retention_ms=0, retention_bytes=0, cleanup_policy=("compact",))
    produce(log, 60, size=150, ts0=0)
    log.update_high_watermark(60)
    assert apply_retention(log, 10**12) == 0


def test_segments_below_the_log_start_offset_are_deleted(tmp_path):
    log = open_log(tmp_path, retention_ms=-1)
    produce(log, 60, size=150)
    log.update_high_watermark(60)
    third = log.segments[2].base_offset
    log.delete_records_before(third, now_ms=0)  # deletes the first two at once
    assert log.segments[0].base_offset == third
    assert apply_retention(log, 0) == 0


def test_deleted_segments_are_renamed_then_removed_after_the_delay(tmp_path):
    clock = FakeClock(100 * HOUR)
    log = open_log(tmp_path, retention_ms=HOUR, file_delete_delay_ms=60_000)
    produce(log, 40, size=150, ts0=0)
    log.update_high_watermark(40)
    old = log.segments[0]
    slice_of_old = log.read(0, 100)[0]
    apply_retention(log, clock.now_ms)
    names = os.listdir(log.dir)
    assert f"{old.base_offset:020d}.log.deleted" in names
    assert f"{old.base_offset:020d}.index.deleted" in names
    assert f"{old.base_offset:020d}.log" not in names
    assert slice_of_old.read()  # a fetch in flight still reads the renamed file
    assert log.delete_expired_files(clock.advance(59_999)) == 0
    assert log.delete_expired_files(clock.advance(1)) > 0
    assert not any(n.endswith(".deleted") for n in os.listdir(log.dir))
