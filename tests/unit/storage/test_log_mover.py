"""Moving a replica between log dirs (AlterReplicaLogDirs): a future log in the destination dir is
copied in bounded steps on the mover thread and swapped in at the log end, the partition's Log object
going on with the moved one; errors as Kafka names them; a copy that starts over after a truncation;
and what a crash leaves, resolved at the next start."""

from __future__ import annotations

import os
import time

import pytest

import odradek.storage.log_mover as mover_module
from odradek.storage.errors import InvalidTopicError, LogDirNotFoundError, LogDirOfflineError, \
    ReplicaNotHostedError
from odradek.storage.manager import LogManager
from tests.unit.storage.logutil import offsets, produce, read_all
from tests.unit.storage.test_manager import manager_config


def settle(manager: LogManager, now_ms: int, timeout_s: float = 20.0) -> int:
    """Run the owner's part until no move is under way; the number of rounds it took."""
    deadline = time.monotonic() + timeout_s
    rounds = 0
    while list(manager.future_logs()):
        assert time.monotonic() < deadline, "the move did not finish"
        manager.run_periodic(now_ms)
        rounds += 1
        for move in list(manager._moves.values()):
            if move.step is not None:
                move.step.done.wait(5)
    return rounds


def path_of(tmp_path, i: int) -> str:
    return os.path.abspath(tmp_path / f"d{i}")


def test_a_replica_moves_to_another_dir_in_steps_and_keeps_its_log_object(tmp_path, monkeypatch):
    monkeypatch.setattr("odradek.storage.manager.STEP_BYTES", 1_500)     # several steps for a small log
    manager = LogManager.open(manager_config(tmp_path, dirs=2), now_ms=0)
    lg = manager.get_or_create_log("t", 0, now_ms=0)
    produce(lg, 40, leader_epoch=3)
    lg.update_high_watermark(35)
    before = read_all(lg)
    assert manager.log_dir_of("t", 0).name == "d0"
    assert manager.alter_replica_log_dir("t", 0, path_of(tmp_path, 1), now_ms=0) is True
    assert manager.alter_replica_log_dir("t", 0, path_of(tmp_path, 1), now_ms=0) is False    # under way
    ((tp, future, dest),) = manager.future_logs()
    assert tp == ("t", 0) and dest.name == "d1" and future.dir.name.startswith("t-0.") \
        and future.dir.name.endswith("-future") and future.dir.parent == dest
    manager.run_periodic(0)
    produce(lg, 5, leader_epoch=4)                   # appends go on during the move
    rounds = settle(manager, now_ms=0)
    assert rounds >= 3
    assert manager.get_log("t", 0) is lg and manager.log_dir_of("t", 0).name == "d1"
    assert lg.dir == tmp_path / "d1" / "t-0" and not (tmp_path / "d0" / "t-0").exists()
    assert read_all(lg)[:len(before)] == before and lg.log_end_offset == 45
    assert offsets(read_all(lg)) == list(range(45)) and lg.high_watermark == 35
    assert lg.end_offset_for_epoch(3) == (3, 40)
    assert not [n for n in os.listdir(tmp_path / "d0") if n.startswith("t-0")]     # file.delete.delay.ms 0
    produce(lg, 1, leader_epoch=4)                   # the moved log takes appends
    manager.close(now_ms=0)
    again = LogManager.open(manager_config(tmp_path, dirs=2), now_ms=0)
    assert again.log_dir_of("t", 0).name == "d1" and again.get_log("t", 0).log_end_offset == 46
    again.close(now_ms=0)


def test_errors_as_kafka_names_them(tmp_path):
    manager = LogManager.open(manager_config(tmp_path, dirs=2), now_ms=0)
    produce(manager.get_or_create_log("t", 0, now_ms=0), 3)
    with pytest.raises(LogDirNotFoundError):
        manager.alter_replica_log_dir("t", 0, str(tmp_path / "elsewhere"), now_ms=0)
    with pytest.raises(LogDirNotFoundError):             # a relative path is not the log dir
        manager.alter_replica_log_dir("t", 0, os.path.relpath(tmp_path / "d1"), now_ms=0)
    with pytest.raises(ReplicaNotHostedError):           # remembered for when the replica comes
        manager.alter_replica_log_dir("t", 7, path_of(tmp_path, 1), now_ms=0)
    assert manager.get_or_create_log("t", 8, now_ms=0) and manager.log_dir_of("t", 8).name == "d1"
    assert manager.get_or_create_log("t", 7, now_ms=0) and manager.log_dir_of("t", 7).name == "d1"
    with pytest.raises(InvalidTopicError):
        manager.alter_replica_log_dir("x" * 249, 0, path_of(tmp_path, 1), now_ms=0)
    assert manager.alter_replica_log_dir("t", 0, path_of(tmp_path, 0), now_ms=0) is False    # already there
    manager.close(now_ms=0)
    offline = LogManager.open(manager_config(tmp_path, dirs=2), now_ms=0)
    for entry in (tmp_path / "d1").iterdir():
        if entry.is_dir():
            for f in entry.iterdir():
                f.unlink()
            entry.rmdir()
        else:
            entry.unlink()
    (tmp_path / "d1").rmdir()
    with pytest.raises(LogDirOfflineError):
        offline.alter_replica_log_dir("t", 0, path_of(tmp_path, 1), now_ms=0)
    (tmp_path / "d1").mkdir()
    offline.close(now_ms=0)


def test_a_move_back_or_elsewhere_replaces_the_one_under_way(tmp_path):
    manager = LogManager.open(manager_config(tmp_path, dirs=3), now_ms=0)
    produce(manager.get_or_create_log("t", 0, now_ms=0), 10)
    manager.alter_replica_log_dir("t", 0, path_of(tmp_path, 1), now_ms=0)
    manager.alter_replica_log_dir("t", 0, path_of(tmp_path, 2), now_ms=0)
    assert [d.name for _, _, d in manager.future_logs()] == ["d2"]
    assert manager.alter_replica_log_dir("t", 0, path_of(tmp_path, 0), now_ms=0) is False     # cancelled
    assert list(manager.future_logs()) == []
    manager.run_periodic(0)
    assert not [n for d in ("d1", "d2") for n in os.listdir(tmp_path / d) if n.startswith("t-0")]
    manager.close(now_ms=0)


def test_a_truncation_of_the_current_log_starts_the_copy_over(tmp_path, monkeypatch):
    monkeypatch.setattr("odradek.storage.manager.STEP_BYTES", 500)
    manager = LogManager.open(manager_config(tmp_path, dirs=2), now_ms=0)
    lg = manager.get_or_create_log("t", 0, now_ms=0)
    produce(lg, 30, leader_epoch=1)
    manager.alter_replica_log_dir("t", 0, path_of(tmp_path, 1), now_ms=0)
    for _ in range(4):
        manager.run_periodic(0)
        for move in manager._moves.values():
            move.step is not None and move.step.done.wait(5)
    ((_, future, _),) = manager.future_logs()
    assert future.log_end_offset > 10
    lg.truncate_to(10, now_ms=0)                    # a follower's truncation to its new leader
    produce(lg, 5, leader_epoch=2, size=120)        # different bytes at the same offsets
    expected = read_all(lg)
    settle(manager, now_ms=0)
    assert lg.dir.parent.name == "d1" and lg.log_end_offset == 15
    assert read_all(lg) == expected and lg.end_offset_for_epoch(1) == (1, 10)
    manager.close(now_ms=0)


def test_a_failed_step_abandons_the_move(tmp_path, monkeypatch):
    manager = LogManager.open(manager_config(tmp_path, dirs=2), now_ms=0)
    lg = manager.get_or_create_log("t", 0, now_ms=0)
    produce(lg, 5)

    def broken(future, step):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(mover_module, "copy", broken)
    manager.alter_replica_log_dir("t", 0, path_of(tmp_path, 1), now_ms=0)
    settle(manager, now_ms=0)
    assert manager.log_dir_of("t", 0).name == "d0" and lg.log_end_offset == 5
    assert not [n for n in os.listdir(tmp_path / "d1") if n.startswith("t-0")]
    manager.close(now_ms=0)


def test_a_crash_during_a_move_or_its_swap_is_resolved_at_start(tmp_path):
    config = manager_config(tmp_path, dirs=2)
    manager = LogManager.open(config, now_ms=0)
    produce(manager.get_or_create_log("a", 0, now_ms=0), 8)
    produce(manager.get_or_create_log("b", 0, now_ms=0), 6)
    manager.alter_replica_log_dir("a", 0, path_of(tmp_path, 1), now_ms=0)
    manager.alter_replica_log_dir("b", 0, path_of(tmp_path, 1), now_ms=0)
    settle(manager, now_ms=0)
    manager.close(now_ms=0)
    # Put things as a crash leaves them: a-0 moving (its future beside it), b-0 in its swap (the
    # current dir renamed away, the complete future alone).
    (tmp_path / "d1" / "a-0").rename(tmp_path / "d1" / ("a-0." + "0" * 32 + "-future"))
    import shutil
    shutil.copytree(tmp_path / "d1" / ("a-0." + "0" * 32 + "-future"), tmp_path / "d0" / "a-0")
    (tmp_path / "d1" / "b-0").rename(tmp_path / "d1" / ("b-0." + "1" * 32 + "-future"))
    again = LogManager.open(config, now_ms=0)
    assert again.log_dir_of("a", 0).name == "d0" and again.get_log("a", 0).log_end_offset == 8
    assert again.log_dir_of("b", 0).name == "d1" and again.get_log("b", 0).log_end_offset == 6
    assert sorted(n for n in os.listdir(tmp_path / "d1") if n[0] in "ab") == ["b-0"]
    again.close(now_ms=0)
