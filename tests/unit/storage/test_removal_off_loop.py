"""Files leave the disk on the log-sync thread, not on the thread that owns the logs (the broker's
event loop): removing a file whose pages are cached frees every page, about a quarter of a second
per cached GiB. Kafka runs these deletions as scheduler tasks for the same reason. What is checked:
the segments retention removes and the directories of deleted partitions are unlinked on the sync
thread, after file.delete.delay.ms, and the files are gone once that thread is drained; a manager
being closed removes what is due itself."""

from __future__ import annotations

import shutil
import threading

import odradek.storage.manager as manager_module
from odradek.storage.manager import LogManager
from tests.unit.storage.logutil import produce
from tests.unit.storage.test_manager import manager_config

HOUR = 3_600_000


def record_threads(monkeypatch) -> list[str]:
    """The names of the threads that removed something, in order."""
    seen: list[str] = []
    real_unlink, real_rmtree = manager_module.unlink_files, shutil.rmtree

    def unlink(paths):
        seen.append(threading.current_thread().name)
        real_unlink(paths)

    def rmtree(path, *args, **kwargs):
        seen.append(threading.current_thread().name)
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(manager_module, "unlink_files", unlink)
    monkeypatch.setattr(manager_module.shutil, "rmtree", rmtree)
    return seen


def test_segments_past_retention_are_unlinked_on_the_sync_thread(tmp_path, monkeypatch):
    seen = record_threads(monkeypatch)
    manager = LogManager.open(manager_config(tmp_path, retention_ms=HOUR, file_delete_delay_ms=1_000), now_ms=0)
    log = manager.get_or_create_log("t", 0, now_ms=0)
    produce(log, 40, size=150, ts0=0, step=1_000)
    log.update_high_watermark(40)
    rolled = [s.log_path for s in log.segments[:-1]]
    assert len(rolled) >= 2
    manager.run_periodic(2 * HOUR)                  # retention: renamed to .deleted, kept for the delay
    assert manager.sync_background(10)
    deleted = sorted(p for p in (tmp_path / "d0" / "t-0").iterdir() if p.name.endswith(".log.deleted"))
    assert len(deleted) == len(rolled) and seen == []
    manager.run_periodic(2 * HOUR + 1_000)          # the delay has passed
    assert manager.sync_background(10)
    assert not [p for p in deleted if p.exists()]
    assert not [p for p in (tmp_path / "d0" / "t-0").iterdir() if p.name.endswith(".deleted")]
    assert seen and set(seen) == {"log-sync"}
    assert log.log_start_offset == log.active_segment.base_offset
    manager.close(now_ms=2 * HOUR + 1_000)


def test_a_deleted_partition_directory_is_removed_on_the_sync_thread(tmp_path, monkeypatch):
    seen = record_threads(monkeypatch)
    manager = LogManager.open(manager_config(tmp_path, file_delete_delay_ms=5_000), now_ms=0)
    produce(manager.get_or_create_log("gone", 0, now_ms=0), 20, size=150)
    assert manager.delete_log("gone", 0, now_ms=0)
    (doomed,) = [p for p in (tmp_path / "d0").iterdir() if p.name.endswith("-delete")]
    manager.run_periodic(5_000)
    assert manager.sync_background(10)
    assert not doomed.exists()
    assert seen == ["log-sync"]
    manager.close(now_ms=5_000)


def test_close_removes_what_is_due_on_its_own_thread(tmp_path, monkeypatch):
    seen = record_threads(monkeypatch)
    manager = LogManager.open(manager_config(tmp_path, file_delete_delay_ms=60_000), now_ms=0)
    produce(manager.get_or_create_log("gone", 0, now_ms=0), 5)
    assert manager.delete_log("gone", 0, now_ms=0)
    (doomed,) = [p for p in (tmp_path / "d0").iterdir() if p.name.endswith("-delete")]
    manager.close(now_ms=0)                        # the sync thread is closed first: no one else to do it
    assert not doomed.exists()
    assert seen == [threading.current_thread().name]
