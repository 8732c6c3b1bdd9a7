"""No fsync where the event loop waits (epoch_cache.py, "Durability"): the leader-epoch checkpoint is
rewritten without an fsync when an epoch starts, and made durable by the log's flush before the
recovery point passes it; a new partition directory's entry in its log dir is synced with the log's
first flush, not when it is created. After an unclean shutdown the epochs the checkpoint may have
lost are assigned again from the recovered batches, and a torn checkpoint is rebuilt from the whole
log; after a clean shutdown a checkpoint that cannot be read is still an error."""

from __future__ import annotations

import os

import pytest

import odradek.storage.checkpoints as checkpoints
import odradek.storage.log as log_module
from odradek.storage.epoch_cache import LEADER_EPOCH_CHECKPOINT
from odradek.storage.errors import StorageError
from odradek.storage.log import Log
from odradek.storage.manager import LogManager
from tests.unit.storage.logutil import open_log, produce
from tests.unit.storage.test_manager import manager_config


def count_fsyncs(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def fsync(fd):
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(checkpoints.os, "fsync", fsync)
    return calls


def written_entries(log: Log) -> str:
    return (log.dir / LEADER_EPOCH_CHECKPOINT).read_text()


def test_a_new_epoch_is_written_without_an_fsync_and_synced_by_the_flush(tmp_path, monkeypatch):
    log = open_log(tmp_path)
    produce(log, 3, leader_epoch=1)
    fsyncs = count_fsyncs(monkeypatch)
    produce(log, 2, leader_epoch=2)                 # the first append of epoch 2 rewrites the checkpoint
    assert fsyncs == []
    assert written_entries(log) == "0\n2\n1 0\n2 3\n"
    synced: list[str] = []
    real_sync_file = log_module.sync_file
    monkeypatch.setattr(log_module, "sync_file", lambda p: synced.append(p.name) or real_sync_file(p))
    job = log.flush_job(log.log_end_offset)
    assert job is not None and (log.dir / LEADER_EPOCH_CHECKPOINT) in job.paths
    job.run()
    assert LEADER_EPOCH_CHECKPOINT in synced
    log.flushed(job, now_ms=0)
    assert log.recovery_point == 5
    synced.clear()
    produce(log, 1, leader_epoch=3)
    log.flush(now_ms=0)                             # the flush done in place syncs it as well
    assert LEADER_EPOCH_CHECKPOINT in synced
    log.close()


def test_an_unclean_open_assigns_again_the_epochs_the_checkpoint_lost(tmp_path):
    log = open_log(tmp_path)
    produce(log, 30, leader_epoch=1, size=150)
    log.flush(now_ms=0)
    flushed = log.recovery_point
    assert flushed == 30 and log.active_segment.base_offset > 0     # recovery starts past segment 0
    produce(log, 10, leader_epoch=4, size=150)
    produce(log, 10, leader_epoch=6, size=150)
    expected = log.leader_epoch_cache.entries()
    assert expected == [(1, 0), (4, 30), (6, 40)]
    for segment in log.segments:
        segment.flush()
    # A crash loses the rewrites made since the flush: the file still says what it said then.
    (log.dir / LEADER_EPOCH_CHECKPOINT).write_text("0\n1\n1 0\n")
    again = Log.open(log.dir, log.config, now_ms=0, recovery_point=flushed, needs_recovery=True)
    assert again.leader_epoch_cache.entries() == expected
    assert again.end_offset_for_epoch(4) == (4, 40) and again.end_offset_for_epoch(6) == (6, 50)
    again.close()


def count_rewrites(monkeypatch) -> list[str]:
    """The leader-epoch checkpoint's rewrites, as the text each one wrote."""
    import odradek.storage.epoch_cache as epoch_cache
    rewrites: list[str] = []
    real = epoch_cache.write_checkpoint_lines

    def write(path, entries, **kw):
        lines = list(entries)
        rewrites.append(" | ".join(lines))
        real(path, lines, **kw)

    monkeypatch.setattr(epoch_cache, "write_checkpoint_lines", write)
    return rewrites


def test_an_unclean_open_leaves_a_checkpoint_that_already_holds_the_recovered_epochs_alone(
        tmp_path, monkeypatch):
    log = open_log(tmp_path)
    produce(log, 30, leader_epoch=1, size=150)
    log.flush(now_ms=0)
    flushed = log.recovery_point
    produce(log, 10, leader_epoch=4, size=150)
    for segment in log.segments:
        segment.flush()
    before = written_entries(log)
    assert before == "0\n2\n1 0\n4 30\n"
    rewrites = count_rewrites(monkeypatch)
    again = Log.open(log.dir, log.config, now_ms=0, recovery_point=flushed, needs_recovery=True)
    # The rebuild dropped epoch 4 and assigned it again from the recovered batches: same entries.
    assert again.leader_epoch_cache.entries() == [(1, 0), (4, 30)]
    assert rewrites == [] and written_entries(again) == before
    again.close()


def test_an_unclean_open_rewrites_a_checkpoint_that_lost_epochs_once(tmp_path, monkeypatch):
    log = open_log(tmp_path)
    produce(log, 30, leader_epoch=1, size=150)
    log.flush(now_ms=0)
    flushed = log.recovery_point
    produce(log, 10, leader_epoch=4, size=150)
    produce(log, 10, leader_epoch=6, size=150)
    for segment in log.segments:
        segment.flush()
    (log.dir / LEADER_EPOCH_CHECKPOINT).write_text("0\n1\n1 0\n")   # the rewrites since the flush lost
    rewrites = count_rewrites(monkeypatch)
    again = Log.open(log.dir, log.config, now_ms=0, recovery_point=flushed, needs_recovery=True)
    assert rewrites == ["1 0 | 4 30 | 6 40"]        # one rewrite, with every epoch assigned again
    assert written_entries(again) == "0\n3\n1 0\n4 30\n6 40\n"
    again.close()


def test_a_torn_checkpoint_is_rebuilt_after_an_unclean_shutdown_and_refused_after_a_clean_one(tmp_path):
    log = open_log(tmp_path)
    produce(log, 6, leader_epoch=2)
    produce(log, 6, leader_epoch=5)
    expected = log.leader_epoch_cache.entries()
    log.flush(now_ms=0)
    log.close()
    (log.dir / LEADER_EPOCH_CHECKPOINT).write_text("0\n2\n2 0\n")      # torn: two entries announced, one there
    with pytest.raises(StorageError):
        Log.open(log.dir, log.config, now_ms=0, recovery_point=12)
    again = Log.open(log.dir, log.config, now_ms=0, recovery_point=12, needs_recovery=True)
    assert again.leader_epoch_cache.entries() == expected
    assert written_entries(again) == "0\n2\n2 0\n5 6\n"
    again.close()


def test_a_new_partition_directory_is_synced_into_its_log_dir_by_the_first_flush(tmp_path, monkeypatch):
    manager = LogManager.open(manager_config(tmp_path), now_ms=0)
    synced: list[str] = []
    real = log_module.fsync_dir
    monkeypatch.setattr(log_module, "fsync_dir", lambda d: synced.append(d.name) or real(d))
    monkeypatch.setattr("odradek.storage.manager.fsync_dir", lambda d: synced.append(d.name) or real(d))
    fsyncs = count_fsyncs(monkeypatch)
    log = manager.get_or_create_log("fresh", 0, now_ms=0)
    assert synced == [] and fsyncs == []            # creating it waited for no disk
    produce(log, 4, leader_epoch=0)
    job = log.flush_job(log.log_end_offset)
    assert job is not None and job.parent == tmp_path / "d0"
    job.run()
    assert synced == ["fresh-0", "d0"]
    log.flushed(job, now_ms=0)
    produce(log, 1, leader_epoch=0)
    later = log.flush_job(log.log_end_offset)
    assert later is not None and later.parent is None   # once is enough
    manager.close(now_ms=0)
