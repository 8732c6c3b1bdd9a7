"""The log cleaner and a replica moving between log dirs (Kafka's abortAndPauseCleaning around a
future replica): cleaning of the partition is paused for the whole move, a pass under way stops before
its next swap, the future is never cleaned, so the moved log is byte for byte the current one; cleaning
resumes after the swap (with the first dirty offset carried to the new dir), after a cancelled move,
and a move resumed at start is paused again."""

from __future__ import annotations

import os
import time
from pathlib import Path

from odradek.storage.checkpoints import CLEANER_OFFSET_CHECKPOINT
from odradek.storage.config import CleanerConfig, LogConfig, LogManagerConfig
from odradek.storage.manager import LogManager
from tests.unit.storage.cleanerutil import COMPACT, Written, check_compacted, random_workload
from tests.unit.storage.test_log_mover import rounds, settle

TP = ("t", 0)


def open_two_dirs(root: Path, threads: int = 0) -> LogManager:
    config = LogManagerConfig(log_dirs=(str(root / "d0"), str(root / "d1")),
                              log_defaults=LogConfig(**COMPACT),
                              cleaner=CleanerConfig(threads=threads, backoff_ms=0))
    return LogManager.open(config, now_ms=0)


def whole(log) -> bytes:
    return bytes(log.read_bytes(log.log_start_offset, 1 << 30))


def test_cleaning_pauses_for_the_move_and_resumes_after_the_swap_in_the_new_dir(tmp_path, monkeypatch):
    monkeypatch.setattr("odradek.storage.manager.STEP_BYTES", 3_000)
    m = open_two_dirs(tmp_path)
    log = m.get_or_create_log(*TP, now_ms=0)
    written = Written()
    random_workload(log, written, batches=120, keys=30)
    assert m.clean_now(0) is not None
    first_dirty = m.cleaner._checkpoints[tmp_path / "d0"][TP]
    random_workload(log, written, batches=120, keys=30, seed=2)      # dirty again, above the ratio
    before = whole(log)
    assert m.alter_replica_log_dir(*TP, os.path.abspath(tmp_path / "d1"), now_ms=0)
    assert m.cleaner.is_paused(TP)
    rounds(m, 2)
    assert list(m.future_logs())                    # still moving
    assert m.clean_now(0) is None                   # the only dirty log is paused
    settle(m, now_ms=0)
    assert m.log_dir_of(*TP).name == "d1" and not m.cleaner.is_paused(TP)
    assert whole(log) == before                     # byte for byte what the current log held
    # the first dirty offset went with the replica
    assert TP not in m.cleaner._checkpoints.get(tmp_path / "d0", {})
    assert m.cleaner._checkpoints[tmp_path / "d1"][TP] == first_dirty
    assert f"t 0 {first_dirty}" in (tmp_path / "d1" / CLEANER_OFFSET_CHECKPOINT).read_text()
    assert "t 0" not in (tmp_path / "d0" / CLEANER_OFFSET_CHECKPOINT).read_text()
    result = m.clean_now(0)                         # cleaning goes on in the new dir
    assert result is not None and m.cleaner.stats.passes == 2
    assert whole(log) != before
    check_compacted(log, written)
    m.close(now_ms=0)


def test_a_pass_under_way_stops_before_its_next_swap_when_the_move_starts(tmp_path, monkeypatch):
    monkeypatch.setattr("odradek.storage.manager.STEP_BYTES", 4_000)
    m = open_two_dirs(tmp_path, threads=1)
    log = m.get_or_create_log(*TP, now_ms=0)
    written = Written()
    random_workload(log, written, batches=400, keys=40)
    m.run_periodic(1)                               # a pass starts on the cleaner thread
    assert m.cleaner.is_cleaning(log)
    (task,) = m.cleaner._tasks.values()
    before = whole(log)
    m.alter_replica_log_dir(*TP, os.path.abspath(tmp_path / "d1"), now_ms=1)
    assert task.plan.aborted
    deadline = time.monotonic() + 30
    while list(m.future_logs()):
        assert time.monotonic() < deadline
        m.run_periodic(2)                           # the thread's groups come back and are refused
        assert whole(log) == before                 # nothing swapped in under the copy
        time.sleep(0.005)
    assert m.log_dir_of(*TP).name == "d1" and whole(log) == before
    while m.cleaner.is_cleaning(log):
        assert time.monotonic() < deadline
        m.run_periodic(3)
        time.sleep(0.005)
    assert m.cleaner.stats.aborted_passes == 1 and m.cleaner.stats.failed_passes == 0
    assert not [n for n in os.listdir(tmp_path / "d1" / "t-0") if n.endswith((".cleaned", ".swap"))]
    while m.cleaner.stats.passes == 0:              # resumed: the moved log is cleaned
        assert time.monotonic() < deadline
        m.run_periodic(4)
        time.sleep(0.005)
    check_compacted(log, written)
    m.close(now_ms=5)


def test_a_cancelled_move_resumes_cleaning_and_a_resumed_move_pauses_it(tmp_path, monkeypatch):
    monkeypatch.setattr("odradek.storage.manager.STEP_BYTES", 3_000)
    m = open_two_dirs(tmp_path)
    log = m.get_or_create_log(*TP, now_ms=0)
    written = Written()
    random_workload(log, written, batches=200, keys=30)
    m.alter_replica_log_dir(*TP, os.path.abspath(tmp_path / "d1"), now_ms=0)
    assert m.cleaner.is_paused(TP) and m.clean_now(0) is None
    assert m.alter_replica_log_dir(*TP, os.path.abspath(tmp_path / "d0"), now_ms=0) is False   # cancelled
    assert not m.cleaner.is_paused(TP) and list(m.future_logs()) == []
    m.alter_replica_log_dir(*TP, os.path.abspath(tmp_path / "d1"), now_ms=0)
    rounds(m, 1)
    m.close(now_ms=0)
    again = open_two_dirs(tmp_path)
    assert [tp for tp, _, _ in again.future_logs()] == [TP] and again.cleaner.is_paused(TP)
    assert again.clean_now(0) is None
    settle(again, now_ms=0)
    assert again.log_dir_of(*TP).name == "d1" and not again.cleaner.is_paused(TP)
    assert again.clean_now(0) is not None
    check_compacted(again.get_log(*TP), written)
    again.close(now_ms=0)
