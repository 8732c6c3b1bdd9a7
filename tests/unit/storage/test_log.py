import os

import pytest

from odradek.storage.config import LogConfig
from odradek.storage.errors import CorruptRecordError, OffsetOutOfRangeError, \
    RecordListTooLargeError, UnexpectedAppendOffsetError
from odradek.storage.log import Log
from odradek.storage.names import parse_partition_dir_name
from tests.unit.storage.batches import batch, split
from tests.unit.storage.logutil import SMALL, offsets, open_log, produce, read_all


def test_append_assigns_offsets_by_patching_and_returns_info(tmp_path):
    log = open_log(tmp_path)
    raw = bytearray(batch([b"a", b"b", b"c"], base_offset=555, base_timestamp=5_000,
                          timestamp_deltas=[0, 7, 3]))
    crc_before = raw[17:21]
    info = log.append(raw, 3, now_ms=1)
    assert (info.first_offset, info.last_offset) == (0, 2)
    assert (info.max_timestamp, info.offset_of_max_timestamp) == (5_007, 2)
    assert info.log_append_time_ms == -1 and info.batch_count == 1
    assert raw[:8] == (0).to_bytes(8, "big")  # patched in the caller's buffer
    assert raw[17:21] == crc_before  # CRC untouched: it does not cover offset and epoch
    info = log.append(bytearray(batch([b"d"], base_offset=0)), 3, now_ms=1)
    assert info.first_offset == info.last_offset == 3
    headers = read_all(log)
    assert offsets(headers) == [0, 3]
    assert [h["leader_epoch"] for h in headers] == [3, 3]
    assert all(h["crc_ok"] for h in headers)
    assert log.log_end_offset == 4


def test_several_batches_in_one_append_are_one_write(tmp_path, monkeypatch):
    log = open_log(tmp_path)
    writes = []
    real = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, pos: writes.append(len(data))
                        or real(fd, data, pos))
    raw = bytearray(batch([b"x"] * 2) + batch([b"y"] * 3) + batch([b"z"]))
    info = log.append(raw, 0, now_ms=0)
    assert writes == [len(raw)]
    assert (info.first_offset, info.last_offset, info.batch_count) == (0, 5, 3)
    assert offsets(read_all(log)) == [0, 2, 5]


def test_read_only_input_is_accepted(tmp_path):
    log = open_log(tmp_path)
    assert log.append(batch([b"x"], base_offset=9), 0, now_ms=0).first_offset == 0


def test_log_append_time_stamps_batches_and_fixes_crc(tmp_path):
    log = open_log(tmp_path)
    info = log.append(bytearray(batch([b"a", b"b"], base_timestamp=10)), 0, now_ms=77_000,
                      log_append_time=True)
    assert info.log_append_time_ms == 77_000 and info.max_timestamp == 77_000
    (h,) = read_all(log)
    assert h["attributes"] & 0x08 and h["max_timestamp"] == 77_000 and h["crc_ok"]
    found = log.offset_for_timestamp(50_000)
    assert (found.timestamp, found.offset) == (77_000, 0)


def test_rolls_by_segment_bytes_and_reads_across_segments(tmp_path):
    log = open_log(tmp_path)  # 2000-byte segments
    produce(log, 100, size=150)
    assert len(log.segments) > 5
    names = sorted(n for n in os.listdir(log.dir) if n.endswith(".log"))
    assert names == [f"{s.base_offset:020d}.log" for s in log.segments]
    assert all(s.size <= 2_000 for s in log.segments)
    assert offsets(read_all(log)) == list(range(100))
    slices = log.read(0, 10**9)
    assert len(slices) == len(log.segments)
    assert offsets(read_all(log, 37)) == list(range(37, 100))


def test_rolls_by_segment_ms_using_batch_timestamps(tmp_path):
    log = open_log(tmp_path, segment_bytes=10**6, segment_ms=1_000)
    produce(log, 5, ts0=0, step=300)  # 0, 300, 600, 900, 1200: the last one rolls
    assert [s.base_offset for s in log.segments] == [0, 4]


def test_rolls_when_index_is_full(tmp_path):
    log = open_log(tmp_path, segment_bytes=10**6, index_interval_bytes=0,
                   segment_index_bytes=8 * 4)
    produce(log, 12)
    assert len(log.segments) >= 2
    assert all(s.offset_index.entries <= 4 for s in log.segments)
    assert offsets(read_all(log)) == list(range(12))


def test_record_list_larger_than_segment_is_rejected(tmp_path):
    log = open_log(tmp_path, segment_bytes=500)
    with pytest.raises(RecordListTooLargeError) as e:
        log.append(bytearray(batch([b"x" * 600])), 0, now_ms=0)
    assert e.value.error_code == 18


def test_malformed_append_is_rejected(tmp_path):
    log = open_log(tmp_path)
    with pytest.raises(CorruptRecordError):
        log.append(bytearray(batch([b"x"])[:-3]), 0, now_ms=0)
    assert log.log_end_offset == 0 and log.active_segment.size == 0


def test_read_never_returns_a_partial_batch(tmp_path):
    log = open_log(tmp_path)
    produce(log, 60, size=130, records=2)
    for start in range(0, 120, 7):
        for max_bytes in (0, 1, 100, 129, 130, 131, 500, 1_999, 2_000, 5_000, 10**6):
            data = log.read_bytes(start, max_bytes)
            headers = split(data)
            assert headers[0]["base_offset"] <= start <= headers[0]["last_offset"]
            assert len(data) <= max(max_bytes, headers[0]["size"])
            assert offsets(headers) == sorted(offsets(headers))
            if max_bytes < headers[0]["size"]:
                assert len(headers) == 1


def test_read_respects_max_offset_and_log_end(tmp_path):
    log = open_log(tmp_path)
    produce(log, 30, size=150)
    assert offsets(read_all(log, 0, max_offset=12)) == list(range(12))
    assert log.read(12, 1000, max_offset=12) == []
    assert log.read(30, 1000) == []  # at the log end: empty, not out of range
    assert log.read(5, 1000, max_offset=3) == []


def test_offset_out_of_range(tmp_path):
    log = open_log(tmp_path)
    produce(log, 10)
    for bad in (-1, 11, 1_000):
        with pytest.raises(OffsetOutOfRangeError) as e:
            log.read(bad, 1000)
        assert e.value.error_code == 1
        assert (e.value.log_start_offset, e.value.log_end_offset) == (0, 10)
    log.update_high_watermark(10)
    log.delete_records_before(4, now_ms=0)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(3, 1000)
    assert offsets(read_all(log, 4))[0] == 4


def test_timestamp_lookup_across_segments(tmp_path):
    log = open_log(tmp_path)
    produce(log, 60, records=3, size=200, ts0=10_000, step=100)  # batch i: 10000+100i (+0,1,2)
    assert len(log.segments) > 3
    hit = log.offset_for_timestamp(0)
    assert (hit.timestamp, hit.offset, hit.leader_epoch) == (10_000, 0, 0)
    hit = log.offset_for_timestamp(12_001)
    assert (hit.timestamp, hit.offset) == (12_001, 61)
    hit = log.offset_for_timestamp(12_003)
    assert (hit.timestamp, hit.offset) == (12_100, 63)
    assert log.offset_for_timestamp(20_000) is None
    top = log.max_timestamp_and_offset()
    assert (top.timestamp, top.offset) == (15_902, 179)


def test_max_timestamp_is_first_record_reaching_it(tmp_path):
    log = open_log(tmp_path)
    produce(log, 3, ts0=5_000, step=0)
    assert log.max_timestamp_and_offset().offset == 0
    empty = open_log(tmp_path, name="empty-0")
    assert empty.max_timestamp_and_offset() is None
    assert empty.offset_for_timestamp(0) is None


def test_reopen_after_clean_close(tmp_path):
    log = open_log(tmp_path)
    produce(log, 50, size=150, leader_epoch=2)
    log.update_high_watermark(40)
    before = [(s.base_offset, s.size) for s in log.segments]
    log.flush(now_ms=0)
    log.close()
    again = Log.open(tmp_path / "topic-0", LogConfig(**SMALL), now_ms=0,
                     recovery_point=50, high_watermark=40)
    assert [(s.base_offset, s.size) for s in again.segments] == before
    assert (again.log_end_offset, again.high_watermark) == (50, 40)
    assert again.leader_epoch_cache.entries() == [(2, 0)]
    assert offsets(read_all(again)) == list(range(50))
    assert again.offset_for_timestamp(1_255).offset == 26
    produce(again, 2, size=150, leader_epoch=3)
    assert offsets(read_all(again, 49)) == [49, 50, 51]
    assert again.leader_epoch_cache.entries() == [(2, 0), (3, 50)]


def test_follower_append_keeps_offsets_and_epochs(tmp_path):
    log = open_log(tmp_path)
    raw = bytearray(batch([b"a", b"b"], base_offset=0, leader_epoch=1)
                    + batch([b"c"], base_offset=2, leader_epoch=1)
                    + batch([b"d"], base_offset=5, leader_epoch=4))
    info = log.append_as_follower(raw, now_ms=0)
    assert (info.first_offset, info.last_offset) == (0, 5)
    assert log.log_end_offset == 6
    assert log.leader_epoch_cache.entries() == [(1, 0), (4, 5)]
    assert offsets(read_all(log)) == [0, 2, 5]
    with pytest.raises(UnexpectedAppendOffsetError):
        log.append_as_follower(bytearray(batch([b"x"], base_offset=5)), now_ms=0)
    broken = bytearray(batch([b"x"], base_offset=6))
    broken[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        log.append_as_follower(broken, now_ms=0)
    assert log.log_end_offset == 6


def test_follower_append_rolls_when_offsets_overflow_the_segment(tmp_path):
    log = open_log(tmp_path)
    log.append_as_follower(bytearray(batch([b"a"], base_offset=0)), now_ms=0)
    log.append_as_follower(bytearray(batch([b"b"], base_offset=2**31 + 10)), now_ms=0)
    assert [s.base_offset for s in log.segments] == [0, 2**31 + 10]
    assert offsets(read_all(log)) == [0, 2**31 + 10]


def test_truncate_to_for_replication(tmp_path):
    log = open_log(tmp_path)
    produce(log, 40, size=150, leader_epoch=1)
    produce(log, 20, size=150, leader_epoch=2)
    log.update_high_watermark(60)
    segments_before = len(log.segments)
    assert log.truncate_to(25, now_ms=0)
    assert log.log_end_offset == 25 and log.high_watermark == 25
    assert len(log.segments) < segments_before
    assert offsets(read_all(log)) == list(range(25))
    assert log.leader_epoch_cache.entries() == [(1, 0)]
    assert not any(n.endswith(".deleted") for n in os.listdir(log.dir))
    produce(log, 3, size=150, leader_epoch=3)
    assert offsets(read_all(log, 20)) == list(range(20, 28))
    assert log.leader_epoch_cache.entries() == [(1, 0), (3, 25)]
    assert not log.truncate_to(100, now_ms=0)


def test_truncate_fully_and_start_at(tmp_path):
    log = open_log(tmp_path)
    produce(log, 30, size=150)
    log.truncate_fully_and_start_at(1_000, now_ms=0)
    assert (log.log_start_offset, log.log_end_offset) == (1_000, 1_000)
    assert [s.base_offset for s in log.segments] == [1_000]
    assert produce(log, 1)[0].first_offset == 1_000
    assert sorted(n for n in os.listdir(log.dir) if n.endswith(".log")) == \
        ["00000000000000001000.log"]


def test_delete_records_moves_log_start_and_deletes_whole_segments(tmp_path):
    log = open_log(tmp_path)
    produce(log, 100, size=150)
    log.update_high_watermark(80)
    bases = [s.base_offset for s in log.segments]
    target = bases[3] + 2
    assert log.delete_records_before(target, now_ms=0) == target
    assert log.log_start_offset == target
    assert log.segments[0].base_offset == bases[3]
    assert read_all(log, target)[0]["base_offset"] == target
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records_before(81, now_ms=0)  # beyond the high watermark
    assert log.delete_records_before(5, now_ms=0) == target  # never moves back


def record_segment_fsyncs(monkeypatch) -> list[str]:
    """Names of .log files fsynced from now on (checkpoint files are fsynced by design)."""
    synced: list[str] = []
    real = os.fsync

    def fsync(fd):
        name = os.readlink(f"/proc/self/fd/{fd}")
        if name.endswith(".log"):
            synced.append(name)
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_flush_messages_fsyncs_and_moves_recovery_point(tmp_path, monkeypatch):
    synced = record_segment_fsyncs(monkeypatch)
    log = open_log(tmp_path, flush_messages=3)
    produce(log, 2)
    assert log.recovery_point == 0 and not synced
    produce(log, 1)
    assert log.recovery_point == 3 and synced


def test_default_never_fsyncs_per_write_but_flushes_rolled_segments(tmp_path, monkeypatch):
    synced = record_segment_fsyncs(monkeypatch)
    log = open_log(tmp_path)
    produce(log, 40, size=150)
    assert not synced and log.recovery_point == 0
    assert log.maybe_flush(now_ms=1)
    assert log.recovery_point == log.active_segment.base_offset
    assert len(synced) == len(log.segments) - 1  # every rolled segment, not the active one
    assert not log.maybe_flush(now_ms=2)


def test_flush_ms(tmp_path):
    log = open_log(tmp_path, flush_ms=1_000, segment_bytes=10**6)
    produce(log, 3)
    assert not log.maybe_flush(now_ms=999)
    assert log.maybe_flush(now_ms=1_000)
    assert log.recovery_point == 3


def test_partition_directory_names():
    assert parse_partition_dir_name("my.topic-with-dashes-12") == ("my.topic-with-dashes", 12)
    for bad in ("nodash", "topic-x", "..-0", "a/b-0", "-3"):
        with pytest.raises(Exception):
            parse_partition_dir_name(bad)
