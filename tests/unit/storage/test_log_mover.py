"""Moving a replica between log dirs (AlterReplicaLogDirs): a future log in the destination dir is
copied in bounded steps on the mover thread and swapped in at the log end, the partition's Log object
going on with the moved one; errors as Kafka names them; after a truncation of the current log, a
future cut back where the two agree by leader epochs (copied afresh without epochs); a copy that starts
over when retention passed it; a step redone when its source went away; and what a
crash or a restart leaves: a move resumed where its copy stood (after recovery, cut back where the
logs diverged), a swap cut short finished."""

from __future__ import annotations

import os
import threading
import time

import pytest

import odradek.storage.log as log_module
import odradek.storage.log_mover as mover_module
from odradek.storage.errors import InvalidTopicError, LogDirNotFoundError, LogDirOfflineError, \
    ReplicaNotHostedError
from odradek.storage.manager import LogManager
from tests.unit.storage.logutil import offsets, produce, read_all
from tests.unit.storage.test_manager import manager_config


def settle(manager: LogManager, now_ms: int, timeout_s: float = 20.0) -> int:
    """Run the owner's part until no move is under way, and the sync thread until it has removed what
    the moves left; the number of rounds it took."""
    deadline = time.monotonic() + timeout_s
    rounds = 0
    while list(manager.future_logs()):
        assert time.monotonic() < deadline, "the move did not finish"
        manager.run_periodic(now_ms)
        rounds += 1
        for move in list(manager._moves.values()):
            if move.step is not None:
                move.step.done.wait(5)
    assert manager.sync_background(max(0.0, deadline - time.monotonic())), "the sync thread did not finish"
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


def test_a_move_catches_up_with_a_log_that_takes_appends_between_every_two_rounds(tmp_path, monkeypatch):
    """A step lands after the appends made while it ran: the last few batches are copied by the owner,
    between two appends, and the swap follows at once (else the copy would chase the log end forever)."""
    monkeypatch.setattr("odradek.storage.manager.STEP_BYTES", 1_500)
    manager = LogManager.open(manager_config(tmp_path, dirs=2), now_ms=0)
    lg = manager.get_or_create_log("t", 0, now_ms=0)
    produce(lg, 40, leader_epoch=1)
    manager.alter_replica_log_dir("t", 0, path_of(tmp_path, 1), now_ms=0)
    for _ in range(30):
        if not list(manager.future_logs()):
            break
        rounds(manager, 1)
        produce(lg, 1, leader_epoch=1)              # a follower's fetch lands between two rounds
    assert list(manager.future_logs()) == [] and manager.log_dir_of("t", 0).name == "d1"
    assert offsets(read_all(lg)) == list(range(lg.log_end_offset))
    manager.close(now_ms=0)


def test_a_small_segment_end_before_a_batch_too_large_for_the_rest_of_the_step_is_copied_on(tmp_path, monkeypatch):
    """The last bytes of a segment, fewer than a final copy's, then a batch that does not fit in what is
    left of the step: the read stops before the log end, so those bytes are no final copy. They are
    handed over as a step and the move goes on (it once waited for a read that never grew)."""
    monkeypatch.setattr("odradek.storage.manager.STEP_BYTES", 4_000)     # a final copy: at most 1,000
    manager = LogManager.open(manager_config(tmp_path, dirs=2, segment_bytes=10_000), now_ms=0)
    lg = manager.get_or_create_log("t", 0, now_ms=0)
    produce(lg, 50, size=100, leader_epoch=1)        # a little over one step: its end is a few batches
    lg.roll(now_ms=0)
    produce(lg, 1, size=3_800, leader_epoch=1)       # does not fit after them
    produce(lg, 2, size=100, leader_epoch=1)
    before = read_all(lg)
    manager.alter_replica_log_dir("t", 0, path_of(tmp_path, 1), now_ms=0)
    rounds(manager, 1)
    ((_, future, _),) = manager.future_logs()
    tail = lg.read(future.log_end_offset, 4_000)
    assert 0 < sum(s.length for s in tail) <= 1_000 and tail[-1].file is not lg.active_segment.file, \
        "not the layout this test is about"
    settle(manager, now_ms=0, timeout_s=5)
    assert manager.log_dir_of("t", 0).name == "d1" and read_all(lg) == before
    manager.close(now_ms=0)


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
    assert manager.sync_background(10)              # the cancelled futures' dirs go on the sync thread
    assert not [n for d in ("d1", "d2") for n in os.listdir(tmp_path / d) if n.startswith("t-0")]
    manager.close(now_ms=0)


@pytest.mark.parametrize("epochs", [True, False])
def test_a_truncation_of_the_current_log_cuts_the_future_back_where_they_agree(tmp_path, monkeypatch, epochs):
    monkeypatch.setattr("odradek.storage.manager.STEP_BYTES", 500)
    manager = LogManager.open(manager_config(tmp_path, dirs=2), now_ms=0)
    lg = manager.get_or_create_log("t", 0, now_ms=0)
    produce(lg, 30, leader_epoch=1 if epochs else -1)
    manager.alter_replica_log_dir("t", 0, path_of(tmp_path, 1), now_ms=0)
    rounds(manager, 4)
    ((_, future, _),) = manager.future_logs()
    copied = future.log_end_offset
    assert copied > 10
    lg.truncate_to(10, now_ms=0)                    # a follower's truncation to its new leader
    produce(lg, 5, leader_epoch=2 if epochs else -1, size=120)     # different bytes at the same offsets
    expected = read_all(lg)
    steps = steps_of(monkeypatch)
    settle(manager, now_ms=0)
    # With leader epochs the future keeps what agrees; without, nothing tells: it starts over.
    assert steps[0] == ((copied, None, 10) if epochs else (copied, 0, None))
    assert lg.dir.parent.name == "d1" and lg.log_end_offset == 15
    assert read_all(lg) == expected
    assert lg.end_offset_for_epoch(1) == ((1, 10) if epochs else None)
    manager.close(now_ms=0)


def test_a_failed_step_abandons_the_move(tmp_path, monkeypatch):
    monkeypatch.setattr("odradek.storage.manager.STEP_BYTES", 300)
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


def steps_of(monkeypatch) -> list[tuple[int, int | None, int | None]]:
    """Record each copy step as the mover thread meets it: (future end, start_at, truncate_to)."""
    seen = []
    real = mover_module.copy

    def recording(future, step):
        seen.append((future.log_end_offset, step.start_at, step.truncate_to))
        real(future, step)
    monkeypatch.setattr(mover_module, "copy", recording)
    return seen


def rounds(manager: LogManager, count: int, now_ms: int = 0) -> None:
    """`count` owner rounds, each waiting for the step it handed over."""
    for _ in range(count):
        manager.run_periodic(now_ms)
        for move in list(manager._moves.values()):
            if move.step is not None:
                assert move.step.done.wait(5)


def crash(manager: LogManager) -> None:
    """Leave the dirs as a killed process would: no close, no clean-shutdown marker, no flush."""
    if manager._mover is not None:
        manager._mover.stop()
    for _, future, _ in manager.future_logs():
        future.release()
    for _, each in manager.logs():
        each.release()


def test_a_move_cut_short_by_a_clean_restart_resumes_where_its_copy_stood(tmp_path, monkeypatch):
    monkeypatch.setattr("odradek.storage.manager.STEP_BYTES", 1_500)
    recovered = []
    real_recover = log_module.recover_segment
    monkeypatch.setattr(log_module, "recover_segment", lambda s: recovered.append(s) or real_recover(s))
    config = manager_config(tmp_path, dirs=2)
    manager = LogManager.open(config, now_ms=0)
    lg = manager.get_or_create_log("t", 0, now_ms=0)
    produce(lg, 40, leader_epoch=3)
    lg.update_high_watermark(40)
    manager.alter_replica_log_dir("t", 0, path_of(tmp_path, 1), now_ms=0)
    rounds(manager, 2)
    ((_, future, _),) = manager.future_logs()
    copied = future.log_end_offset
    assert 0 < copied < 40
    manager.close(now_ms=0)
    # The future's recovery point is checkpointed in its own dir, beside the logs that live there.
    assert f"t 0 {copied}" in (tmp_path / "d1" / "recovery-point-offset-checkpoint").read_text()
    assert f"t 0 40" in (tmp_path / "d0" / "recovery-point-offset-checkpoint").read_text()
    steps = steps_of(monkeypatch)
    again = LogManager.open(config, now_ms=0)
    assert recovered == []                                  # both dirs were shut down cleanly
    ((tp, future, dest),) = again.future_logs()             # DescribeLogDirs shows it at once
    assert tp == ("t", 0) and dest.name == "d1" and future.log_end_offset == copied
    assert again.cleaner.is_paused(("t", 0))
    lg = again.get_log("t", 0)
    expected = read_all(lg)
    settle(again, now_ms=0)
    assert steps[0] == (copied, None, None)                 # went on from where it stood
    assert again.log_dir_of("t", 0).name == "d1" and read_all(lg) == expected
    assert lg.end_offset_for_epoch(3) == (3, 40) and not again.cleaner.is_paused(("t", 0))
    again.close(now_ms=0)


def test_a_move_cut_short_by_a_crash_resumes_from_its_recovered_future(tmp_path, monkeypatch):
    monkeypatch.setattr("odradek.storage.manager.STEP_BYTES", 1_500)
    config = manager_config(tmp_path, dirs=2)
    manager = LogManager.open(config, now_ms=0)
    lg = manager.get_or_create_log("t", 0, now_ms=0)
    produce(lg, 40, leader_epoch=3)
    manager.alter_replica_log_dir("t", 0, path_of(tmp_path, 1), now_ms=0)
    rounds(manager, 2)
    ((_, future, _),) = manager.future_logs()
    copied = future.log_end_offset
    torn = future.active_segment.log_path
    produce(lg, 4, leader_epoch=3)                          # writes go on until the crash
    crash(manager)
    with open(torn, "ab") as f:                             # a torn write at the future's tail
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x07\xff\xff")
    steps = steps_of(monkeypatch)
    again = LogManager.open(config, now_ms=0)
    ((_, future, _),) = again.future_logs()
    assert future.log_end_offset == copied and os.path.getsize(torn) == future.active_segment.size
    lg = again.get_log("t", 0)
    assert lg.log_end_offset == 44
    # A follower's truncation after the restart (its new leader never had the last records): the
    # future is cut back to where the two logs agree by their leader epochs, not copied afresh.
    lg.truncate_to(copied - 3, now_ms=0)
    produce(lg, 6, leader_epoch=5, size=130)
    expected = read_all(lg)
    settle(again, now_ms=0)
    assert steps[0] == (copied, None, copied - 3)
    assert again.log_dir_of("t", 0).name == "d1" and read_all(lg) == expected
    assert offsets(read_all(lg)) == list(range(copied + 3))
    assert lg.end_offset_for_epoch(3) == (3, copied - 3) and lg.end_offset_for_epoch(5) == (5, copied + 3)
    again.close(now_ms=0)


def test_a_future_that_cannot_be_opened_at_start_is_dropped_and_the_replica_stays(tmp_path, monkeypatch):
    monkeypatch.setattr("odradek.storage.manager.STEP_BYTES", 1_500)
    config = manager_config(tmp_path, dirs=2)
    manager = LogManager.open(config, now_ms=0)
    produce(manager.get_or_create_log("t", 0, now_ms=0), 40, leader_epoch=2)
    manager.alter_replica_log_dir("t", 0, path_of(tmp_path, 1), now_ms=0)
    rounds(manager, 1)
    ((_, future, _),) = manager.future_logs()
    future_dir = future.dir
    crash(manager)
    segment = future_dir / "00000000000000000000.log"       # a directory where a segment should be
    segment.unlink()
    segment.mkdir()
    again = LogManager.open(config, now_ms=0)
    assert list(again.future_logs()) == [] and not future_dir.exists()
    assert again.log_dir_of("t", 0).name == "d0" and again.get_log("t", 0).log_end_offset == 40
    assert not again.cleaner.is_paused(("t", 0))
    again.close(now_ms=0)


def test_a_future_left_without_its_current_log_by_a_crash_in_the_swap_becomes_the_log(tmp_path):
    config = manager_config(tmp_path, dirs=2)
    manager = LogManager.open(config, now_ms=0)
    produce(manager.get_or_create_log("b", 0, now_ms=0), 6)
    manager.alter_replica_log_dir("b", 0, path_of(tmp_path, 1), now_ms=0)
    settle(manager, now_ms=0)
    manager.close(now_ms=0)
    # As a crash in the swap leaves it: the current dir renamed away, the complete future alone.
    (tmp_path / "d1" / "b-0").rename(tmp_path / "d1" / ("b-0." + "1" * 32 + "-future"))
    again = LogManager.open(config, now_ms=0)
    assert again.log_dir_of("b", 0).name == "d1" and again.get_log("b", 0).log_end_offset == 6
    assert list(again.future_logs()) == []
    assert sorted(n for n in os.listdir(tmp_path / "d1") if n[0] == "b") == ["b-0"]
    again.close(now_ms=0)


def test_a_deleted_topics_future_is_removed_with_it_before_start(tmp_path, monkeypatch):
    monkeypatch.setattr("odradek.storage.manager.STEP_BYTES", 1_500)
    config = manager_config(tmp_path, dirs=2)
    manager = LogManager.open(config, now_ms=0)
    produce(manager.get_or_create_log("gone", 0, now_ms=0), 40)
    manager.alter_replica_log_dir("gone", 0, path_of(tmp_path, 1), now_ms=0)
    rounds(manager, 1)
    manager.close(now_ms=0)
    assert LogManager.delete_topic_dirs(config.log_dirs, {"gone"}) == 2
    again = LogManager.open(config, now_ms=0)
    assert again.get_log("gone", 0) is None and list(again.future_logs()) == []
    assert not [n for d in ("d0", "d1") for n in os.listdir(tmp_path / d) if n.startswith("gone")]
    again.close(now_ms=0)


def test_retention_passing_the_futures_end_starts_the_copy_over(tmp_path, monkeypatch):
    monkeypatch.setattr("odradek.storage.manager.STEP_BYTES", 1_000)
    config = manager_config(tmp_path, dirs=2, retention_bytes=2_000)
    manager = LogManager.open(config, now_ms=0)
    lg = manager.get_or_create_log("t", 0, now_ms=0)
    produce(lg, 50, leader_epoch=1)
    lg.update_high_watermark(50)
    manager.alter_replica_log_dir("t", 0, path_of(tmp_path, 1), now_ms=0)
    rounds(manager, 1)
    ((_, future, _),) = manager.future_logs()
    copied = future.log_end_offset
    assert manager.run_retention(now_ms=0) >= 1
    assert lg.log_start_offset > copied                     # the head the copy stood in is gone
    steps = steps_of(monkeypatch)
    expected = read_all(lg, lg.log_start_offset)
    settle(manager, now_ms=0)
    assert steps[0] == (copied, lg.log_start_offset, None)
    assert manager.log_dir_of("t", 0).name == "d1" and read_all(lg, lg.log_start_offset) == expected
    assert offsets(expected)[0] == lg.log_start_offset and lg.segments[0].base_offset == lg.log_start_offset
    manager.close(now_ms=0)


def test_a_step_whose_source_segment_went_away_is_redone(tmp_path, monkeypatch):
    monkeypatch.setattr("odradek.storage.manager.STEP_BYTES", 1_000)
    manager = LogManager.open(manager_config(tmp_path, dirs=2, retention_bytes=2_000), now_ms=0)
    lg = manager.get_or_create_log("t", 0, now_ms=0)
    produce(lg, 50, leader_epoch=1)
    lg.update_high_watermark(50)
    go = threading.Event()
    real = mover_module.copy
    outcomes = []

    def held(future, step):
        go.wait(5)                                          # the owner goes on meanwhile
        try:
            real(future, step)
        except BaseException as e:
            outcomes.append(type(e).__name__)
            raise
        outcomes.append("ok")
    monkeypatch.setattr(mover_module, "copy", held)
    manager.alter_replica_log_dir("t", 0, path_of(tmp_path, 1), now_ms=0)
    manager.run_periodic(0)                                 # the first step: slices of segment 0
    assert manager.run_retention(now_ms=0) >= 1             # deleted at once (file.delete.delay.ms 0)
    go.set()
    expected = read_all(lg, lg.log_start_offset)
    settle(manager, now_ms=0)
    assert outcomes[0] == "SourceChanged" and outcomes[1:] and set(outcomes[1:]) == {"ok"}
    assert manager.log_dir_of("t", 0).name == "d1" and read_all(lg, lg.log_start_offset) == expected
    manager.close(now_ms=0)
