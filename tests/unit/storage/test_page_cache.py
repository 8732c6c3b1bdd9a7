"""Drop-behind (`log.drop.behind.bytes`, storage/page_cache.py): which virtual machines turn it on, what a
log asks to drop and when, and, on real files, that the pages before a log's newest bytes leave the
page cache while the newest stay (residency read back with mincore)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from odradek.storage.config import LogConfig, LogManagerConfig
from odradek.storage.manager import LogManager
from odradek.storage.page_cache import AUTO, AUTO_KEEP_BYTES, MIN_STEP_BYTES, hypervisor_reclaims_free_memory, \
    resolve_keep_bytes
from tests.page_cache_residency import resident
from tests.unit.storage.logutil import open_log, produce, read_all

MiB = 1024 * 1024
RECORD = 64 * 1024        # one 64 KiB record per batch: 16 batches to the MiB


def fake_device(root: Path, name: str, driver: str, features: str) -> None:
    device = root / name
    device.mkdir(parents=True)
    (root / "drivers" / driver).mkdir(parents=True, exist_ok=True)
    (device / "driver").symlink_to(root / "drivers" / driver)
    (device / "features").write_text(features + "\n")


BALLOON_REPORTING = "0110010100000000000000000000000010000000"   # as read on a Firecracker guest
BALLOON_PLAIN = "0110000100000000000000000000000010000000"


def test_a_balloon_with_free_page_reporting_is_detected(tmp_path):
    fake_device(tmp_path, "virtio0", "virtio_balloon", BALLOON_REPORTING)
    fake_device(tmp_path, "virtio1", "virtio_blk", "0010001001100100")
    assert hypervisor_reclaims_free_memory(tmp_path)


@pytest.mark.parametrize("devices", [
    [("virtio0", "virtio_balloon", BALLOON_PLAIN)],               # a balloon without reporting
    [("virtio0", "virtio_net", BALLOON_REPORTING)],               # bit 5 of another device
    [],                                                            # no virtio device at all
])
def test_no_reporting_balloon_is_not_detected(tmp_path, devices):
    for name, driver, features in devices:
        fake_device(tmp_path, name, driver, features)
    assert not hypervisor_reclaims_free_memory(tmp_path)
    assert not hypervisor_reclaims_free_memory(tmp_path / "missing")


def test_auto_keeps_64_mib_only_where_the_hypervisor_reclaims(tmp_path):
    fake_device(tmp_path / "vm", "virtio0", "virtio_balloon", BALLOON_REPORTING)
    (tmp_path / "metal").mkdir()
    assert resolve_keep_bytes(AUTO, tmp_path / "vm") == AUTO_KEEP_BYTES
    assert resolve_keep_bytes(AUTO, tmp_path / "metal") == 0
    assert resolve_keep_bytes(0, tmp_path / "vm") == 0                    # off stays off
    assert resolve_keep_bytes(5 * MiB, tmp_path / "metal") == 5 * MiB    # a size is used as given
    with pytest.raises(ValueError):
        LogManagerConfig(drop_behind_bytes=-1)


def grow(log, nbytes: int) -> None:
    """Append 64 KiB batches until at least `nbytes` more are in the log."""
    appended = 0
    while appended < nbytes:
        appended += produce(log, 1, size=RECORD)[0].size_bytes


def test_the_active_segment_is_dropped_behind_its_newest_bytes_each_step(tmp_path):
    log = open_log(tmp_path, segment_bytes=64 * MiB, index_interval_bytes=4096)
    keep = 2 * MiB                                       # step: 1 MiB
    grow(log, 2 * MiB + 512 * 1024)                      # the bytes before the newest 2 MiB: under a step
    assert log.cache_drops(keep) == []
    grow(log, 512 * 1024)                                # a step of them
    size = log.active_segment.size
    assert log.cache_drops(keep) == [(log.active_segment.log_path, size - keep)]
    grow(log, 512 * 1024)                                # half a step more: not yet
    assert log.cache_drops(keep) == []
    grow(log, 512 * 1024)                                # a whole step since the last drop
    assert log.cache_drops(keep) == [(log.active_segment.log_path, log.active_segment.size - keep)]
    assert log.cache_drops(keep) == []                   # asked once per step


def test_a_rolled_segment_is_dropped_whole_once_flushed_and_followed_by_the_kept_bytes(tmp_path):
    log = open_log(tmp_path, segment_bytes=4 * MiB, index_interval_bytes=4096)
    keep = MIN_STEP_BYTES
    first = log.active_segment
    assert log.cache_drops(keep) == []                   # the files found at open are left alone
    while len(log.segments) == 1:
        grow(log, 1)
    drops = log.cache_drops(keep)
    assert (first.log_path, 0) not in drops              # not flushed yet: its pages are dirty
    log.flush(0, log.active_segment.base_offset)
    assert (first.log_path, 0) not in log.cache_drops(keep)    # flushed, but the active one is small
    grow(log, keep)
    drops = log.cache_drops(keep)
    assert (first.log_path, 0) in drops
    assert (first.log_path, 0) not in log.cache_drops(keep) + log.cache_drops(keep)    # once


def test_the_manager_drops_written_pages_and_keeps_the_newest(tmp_path):
    keep = 2 * MiB
    config = LogManagerConfig(log_dirs=(str(tmp_path / "d0"),), drop_behind_bytes=keep,
                              log_defaults=LogConfig(segment_bytes=64 * MiB, index_interval_bytes=4096))
    manager = LogManager.open(config, now_ms=0)
    try:
        log = manager.get_or_create_log("t", 0, now_ms=0)
        produce(log, 16 * 8, size=RECORD)                # ~8 MiB written: in the page cache
        path = log.active_segment.log_path
        assert resident(path, 0, log.active_segment.size) >= log.active_segment.size
        os.sync()                                       # clean, so DONTNEED can drop them
        written = log.active_segment.size
        produce(log, 16 * 3, size=RECORD)               # 3 MiB more, dirty
        manager.run_periodic(0)
        assert manager.sync_background(10)
        size = log.active_segment.size
        assert resident(path, 0, written - 4096) == 0                   # dropped
        assert resident(path, size - keep, size) >= keep - 4096           # the newest kept
        assert len(read_all(log)) == 16 * 11                              # and all of it still read
    finally:
        manager.close(0)


def test_a_log_s_own_keep_overrides_the_manager_s_setting(tmp_path):
    """A follower replica's log (replica.drop.behind.bytes) is dropped behind while its neighbour on
    the broker's default (here off) keeps everything it wrote."""
    keep = 2 * MiB
    config = LogManagerConfig(log_dirs=(str(tmp_path / "d0"),), drop_behind_bytes=0,
                              log_defaults=LogConfig(segment_bytes=64 * MiB, index_interval_bytes=4096))
    manager = LogManager.open(config, now_ms=0)
    try:
        follower = manager.get_or_create_log("t", 0, now_ms=0)
        leader = manager.get_or_create_log("t", 1, now_ms=0)
        follower.cache_keep_bytes = keep
        for log in (follower, leader):
            produce(log, 16 * 8, size=RECORD)
        os.sync()
        for log in (follower, leader):
            produce(log, 16 * 3, size=RECORD)
        manager.run_periodic(0)
        assert manager.sync_background(10)
        f, lead = follower.active_segment, leader.active_segment
        assert resident(f.log_path, 0, 8 * MiB - 4096) == 0                      # dropped
        assert resident(f.log_path, f.size - keep, f.size) >= keep - 4096         # the newest kept
        assert resident(lead.log_path, 0, lead.size) >= lead.size                  # all of it cached
    finally:
        manager.close(0)
