"""Recovery after an unclean shutdown: no invalid batch is ever served afterwards."""

import os
import struct

from odradek.storage.config import LogConfig
from odradek.storage.log import Log
from tests.unit.storage.batches import split
from tests.unit.storage.logutil import SMALL, offsets, open_log, produce, read_all


def crash(log: Log) -> None:
    """Stop without flushing or writing indexes: only what reached the files remains."""
    log.release()


def reopen(root, recovery_point=0, **config) -> Log:
    return Log.open(root / "topic-0", LogConfig(**{**SMALL, **config}), now_ms=0,
                    recovery_point=recovery_point, needs_recovery=True)


def batch_positions(path) -> list[tuple[int, int]]:
    data = path.read_bytes()
    out, pos = [], 0
    for h in split(data):
        out.append((pos, h["size"]))
        pos += h["size"]
    return out


def assert_all_valid(log: Log, expected_offsets: list[int]) -> None:
    headers = read_all(log, log.log_start_offset)
    assert all(h["crc_ok"] for h in headers)
    assert offsets(headers) == expected_offsets
    assert log.log_end_offset == (expected_offsets[-1] + 1 if expected_offsets else 0)
    for segment in log.segments:
        assert os.path.getsize(segment.log_path) == segment.size


def test_garbage_after_the_last_batch_is_cut(tmp_path):
    log = open_log(tmp_path)
    produce(log, 30, size=150, leader_epoch=1)
    active = log.active_segment.log_path
    crash(log)
    with open(active, "ab") as f:
        f.write(os.urandom(333))
    log = reopen(tmp_path)
    assert_all_valid(log, list(range(30)))
    assert produce(log, 1, size=150)[0].first_offset == 30


def test_bits_flipped_in_the_last_batch(tmp_path):
    log = open_log(tmp_path, segment_bytes=10**6)
    produce(log, 20, size=150, leader_epoch=1, ts0=1_000, step=10)
    path = log.active_segment.log_path
    crash(log)
    pos, size = batch_positions(path)[-1]
    data = bytearray(path.read_bytes())
    data[pos + size - 5] ^= 0x10
    path.write_bytes(data)
    log = reopen(tmp_path, segment_bytes=10**6)
    assert_all_valid(log, list(range(19)))
    assert log.offset_for_timestamp(1_190) is None  # the lost batch's timestamp
    assert log.offset_for_timestamp(1_180).offset == 18
    assert log.max_timestamp_and_offset().offset == 18
    produce(log, 1, size=150, ts0=5_000)
    assert log.offset_for_timestamp(1_181).offset == 19


def test_batch_cut_in_half(tmp_path):
    log = open_log(tmp_path)
    produce(log, 30, size=150)
    path = log.active_segment.log_path
    crash(log)
    pos, size = batch_positions(path)[-1]
    with open(path, "r+b") as f:
        f.truncate(pos + size // 2)
    log = reopen(tmp_path)
    assert_all_valid(log, list(range(29)))


def test_truncated_header_and_absurd_length(tmp_path):
    log = open_log(tmp_path)
    produce(log, 5)
    path = log.active_segment.log_path
    crash(log)
    with open(path, "ab") as f:
        f.write(struct.pack(">qi", 5, 2**31 - 1) + b"\x00" * 40)  # claims a 2 GiB batch
    log = reopen(tmp_path)
    assert_all_valid(log, list(range(5)))


def test_corruption_in_an_older_unflushed_segment_drops_everything_after(tmp_path):
    log = open_log(tmp_path)
    produce(log, 60, size=150)
    second = log.segments[1]
    crash(log)
    pos, size = batch_positions(second.log_path)[2]
    data = bytearray(second.log_path.read_bytes())
    data[pos + 30] ^= 0xFF  # inside the CRC-covered part
    second.log_path.write_bytes(data)
    log = reopen(tmp_path, recovery_point=0)
    first_bad = second.base_offset + 2
    assert_all_valid(log, list(range(first_bad)))
    assert log.active_segment.base_offset == second.base_offset
    assert len([n for n in os.listdir(log.dir) if n.endswith(".log")]) == 2


def test_only_segments_from_the_recovery_point_are_revalidated(tmp_path):
    log = open_log(tmp_path)
    produce(log, 60, size=150)
    first, last = log.segments[0], log.segments[-1]
    first_size = first.size
    log.flush(now_ms=0, up_to_offset=last.base_offset)
    recovery_point = log.recovery_point
    crash(log)
    for path in (first.log_path, last.log_path):
        with open(path, "ab") as f:
            f.write(b"junk" * 10)
    log = reopen(tmp_path, recovery_point=recovery_point)
    assert os.path.getsize(last.log_path) == log.active_segment.size  # recovered
    assert log.segments[0].size == first_size + 40  # below the recovery point: trusted (Kafka)


def test_indexes_are_rebuilt_after_a_crash(tmp_path):
    log = open_log(tmp_path, segment_bytes=10**6, index_interval_bytes=300)
    produce(log, 200, size=150, records=2, ts0=0, step=5)
    entries = log.active_segment.offset_index.entries
    crash(log)  # indexes of the active segment never reached the disk
    index_file = tmp_path / "topic-0" / "00000000000000000000.index"
    assert index_file.stat().st_size == 0
    log = reopen(tmp_path, segment_bytes=10**6, index_interval_bytes=300)
    assert log.active_segment.offset_index.entries == entries
    for target in (0, 1, 57, 200, 399):
        assert read_all(log, target, max_bytes=1)[0]["base_offset"] == target - target % 2
    assert log.offset_for_timestamp(501).offset == 201
    log.flush(now_ms=0)
    log.close()
    assert index_file.stat().st_size == entries * 8


def test_missing_or_broken_index_files_are_rebuilt_on_clean_open(tmp_path):
    log = open_log(tmp_path)
    produce(log, 60, size=150)
    log.flush(now_ms=0)
    log.close()
    segments = sorted((tmp_path / "topic-0").glob("*.index"))
    segments[0].unlink()
    segments[-1].write_bytes(b"\x01" * 13)
    log = Log.open(tmp_path / "topic-0", LogConfig(**SMALL), now_ms=0, recovery_point=60)
    assert_all_valid(log, list(range(60)))
    assert log.offset_for_timestamp(1_300).offset == 30


def test_epoch_cache_follows_the_cut(tmp_path):
    log = open_log(tmp_path, segment_bytes=10**6)
    produce(log, 5, leader_epoch=1)
    produce(log, 5, leader_epoch=2)
    path = log.active_segment.log_path
    crash(log)
    pos, _ = batch_positions(path)[4]
    with open(path, "r+b") as f:
        f.truncate(pos + 10)
    log = reopen(tmp_path, segment_bytes=10**6)
    assert log.log_end_offset == 4
    assert log.leader_epoch_cache.entries() == [(1, 0)]
