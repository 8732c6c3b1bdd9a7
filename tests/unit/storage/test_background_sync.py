"""The periodic flush and the checkpoints are synced on the sync thread, never on the caller's
(the broker's event loop): real files, a fake clock, and an fsync held at a gate to see who waits."""

import os
import threading

import pytest

from odradek.storage.background_sync import BackgroundSyncer
from odradek.storage.config import LogConfig, LogManagerConfig
from odradek.storage.log import Log
from odradek.storage.manager import LogManager
from tests.unit.storage.logutil import SMALL, produce

HB_INTERVAL = 5_000


@pytest.fixture
def held_fsync(monkeypatch):
    """os.fsync that records the calling thread (in `callers` when called; with the file's name in
    `synced` when done) and, on the sync thread, waits for `gate`."""
    gate = threading.Event()
    callers: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        callers.append(threading.current_thread().name)
        if threading.current_thread().name == "log-sync":
            assert gate.wait(10), "the gate was never opened"
        real(fd)
        synced.append((threading.current_thread().name, os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
    synced: list[tuple[str, str]] = []
    monkeypatch.setattr(os, "fsync", fsync)
    yield gate, callers, synced
    gate.set()


def manager_with_a_log(tmp_path, batches: int) -> tuple[LogManager, Log]:
    """A log manager on one dir, holding partition t-0 with `batches` batches of 150 bytes."""
    config = LogManagerConfig(log_dirs=(str(tmp_path / "d0"),), log_defaults=LogConfig(**SMALL),
                              high_watermark_checkpoint_interval_ms=HB_INTERVAL)
    manager = LogManager.open(config, now_ms=0)
    log = manager.get_or_create_log("t", 0, now_ms=0)
    produce(log, batches, size=150)
    return manager, log


def test_rolled_segments_are_synced_off_the_calling_thread(tmp_path, held_fsync):
    gate, callers, _ = held_fsync
    manager, log = manager_with_a_log(tmp_path, 40)
    assert len(log.segments) > 2
    callers.clear()
    manager.run_periodic(0)                 # returns with the sync thread held at the gate
    manager.run_periodic(100)               # the flush still under way: not asked for twice
    assert log.recovery_point == 0          # nothing counts as synced before the sync is done
    assert "MainThread" not in callers
    gate.set()
    assert manager.sync_background(10)
    assert log.recovery_point == log.active_segment.base_offset > 0
    rolled = len(log.segments) - 1
    # each rolled segment's log and index files, then the partition dir, once
    assert callers.count("log-sync") >= 3 * rolled + 1
    assert "MainThread" not in callers
    manager.close(now_ms=200)


def test_checkpoints_are_written_off_the_calling_thread_and_the_latest_wins(tmp_path, held_fsync):
    gate, callers, _ = held_fsync
    manager, log = manager_with_a_log(tmp_path, 5)
    path = tmp_path / "d0" / "replication-offset-checkpoint"
    log.update_high_watermark(2)
    callers.clear()
    manager.run_periodic(HB_INTERVAL)       # the sync thread holds on the first job
    log.update_high_watermark(4)
    manager.run_periodic(2 * HB_INTERVAL)   # queued behind it
    log.update_high_watermark(5)
    manager.run_periodic(3 * HB_INTERVAL)   # replaces the one still queued
    assert "MainThread" not in callers
    gate.set()
    assert manager.sync_background(10)
    assert path.read_text() == "0\n1\nt 0 5\n"
    manager.close(now_ms=4 * HB_INTERVAL)


def test_a_truncation_during_the_sync_keeps_the_recovery_point_back(tmp_path, held_fsync):
    gate, *_ = held_fsync
    manager, log = manager_with_a_log(tmp_path, 40)
    synced_to = log.active_segment.base_offset
    manager.run_periodic(0)
    log.truncate_to(3, now_ms=0)            # a follower truncating while the flush is under way
    produce(log, 40, size=150)
    gate.set()
    assert manager.sync_background(10)
    assert log.recovery_point <= 3 < synced_to
    manager.run_periodic(100)               # a new flush of what is there now
    assert manager.sync_background(10)
    assert log.recovery_point == log.active_segment.base_offset
    manager.close(now_ms=200)


def test_close_waits_for_the_sync_thread_then_writes_the_last_checkpoints(tmp_path, held_fsync, monkeypatch):
    gate, _, synced = held_fsync
    manager, log = manager_with_a_log(tmp_path, 5)
    log.update_high_watermark(2)
    manager.run_periodic(HB_INTERVAL)       # an old high watermark checkpoint, held at the gate
    log.update_high_watermark(5)
    syncer = manager._syncer
    closing = syncer.close

    def close_opening_the_gate(timeout: float | None = None) -> None:
        gate.set()                          # the held job goes on only once close waits for it
        closing(timeout)
    monkeypatch.setattr(syncer, "close", close_opening_the_gate)
    manager.close(now_ms=2 * HB_INTERVAL)
    # the old checkpoint was written by the sync thread before close wrote the last one itself
    writers = [thread for thread, name in synced if name == "replication-offset-checkpoint.tmp"]
    assert writers == ["log-sync", "MainThread"], synced
    assert (tmp_path / "d0" / "replication-offset-checkpoint").read_text() == "0\n1\nt 0 5\n"
    assert (tmp_path / "d0" / "recovery-point-offset-checkpoint").read_text() == "0\n1\nt 0 5\n"


def test_a_failed_job_is_reported_to_its_owner_and_the_thread_goes_on():
    syncer = BackgroundSyncer("test-sync")
    seen: list = []

    def fail() -> None:
        raise OSError(5, "Input/output error")
    syncer.submit("a", fail, lambda result, error: seen.append(("a", result, error)))
    syncer.submit("b", lambda: 42, lambda result, error: seen.append(("b", result, error)))
    assert syncer.drain(10)
    assert [(k, r) for k, r, _ in seen] == [("a", None), ("b", 42)]
    assert isinstance(seen[0][2], OSError) and seen[1][2] is None
    syncer.close(10)
    with pytest.raises(RuntimeError):
        syncer.submit("c", lambda: None)
