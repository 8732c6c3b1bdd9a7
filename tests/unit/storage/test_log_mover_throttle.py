"""The throttle of replica moves between log dirs (`replica.alter.log.dirs.io.max.bytes.per.second`,
log_mover.py): on real disk, with a fake clock driven by the test (one owner round every 100 ms), the
steps of a move are handed over only while the bytes counted stay within the rate as Kafka measures it
(storage/quota.py); without a rate nothing waits; a changed rate applies at the next step; the owner's
last copy before the swap is never held back; a cut of the future is made even while the copy waits.

The logs are built so one step copies exactly one segment: batches of 4 KiB, segments of 8 batches
(32 KiB, which bounds a step), and the last copy the owner makes itself is at most 8 KiB (a quarter)."""

from __future__ import annotations

import os

from odradek.storage.config import LogConfig, LogManagerConfig
from odradek.storage.log import Log
from odradek.storage.manager import LogManager
from odradek.storage.quota import UNBOUNDED
from tests.unit.storage.logutil import SMALL, offsets, produce, read_all

BATCH = 4096
SEGMENT = 8 * BATCH          # one step
ROUND_MS = 100


def config(tmp_path, **throttle) -> LogManagerConfig:
    return LogManagerConfig(log_dirs=(str(tmp_path / "d0"), str(tmp_path / "d1")),
                            log_defaults=LogConfig(**{**SMALL, "segment_bytes": SEGMENT}), **throttle)


def fill(manager: LogManager, batches: int, leader_epoch: int = 0) -> Log:
    lg = manager.get_or_create_log("t", 0, now_ms=0)
    produce(lg, batches, size=BATCH + 10, leader_epoch=leader_epoch)   # produce's size less 10 is the batch
    assert lg.size_bytes == batches * BATCH
    return lg


class Mover:
    """Owner rounds at fake times; remembers when each step was handed over, and its size."""

    def __init__(self, manager: LogManager) -> None:
        self.manager = manager
        self.now_ms = 0
        self.handed: list[tuple[int, int]] = []      # (time, bytes)
        self.rounds = 0

    @property
    def moving(self) -> bool:
        return bool(list(self.manager.future_logs()))

    def round(self) -> None:
        before = {tp: m.step for tp, m in self.manager._moves.items()}
        self.manager.run_periodic(self.now_ms)
        for tp, move in list(self.manager._moves.items()):
            if move.step is not None and move.step is not before.get(tp):
                self.handed.append((self.now_ms, sum(s.length for s in move.step.slices)))
                assert move.step.done.wait(5)
        self.rounds += 1
        self.now_ms += ROUND_MS

    def until_done(self, max_rounds: int = 1_000) -> int:
        """Rounds until the move is over; the fake time of the round that swapped."""
        while self.moving:
            assert self.rounds < max_rounds, "the move did not finish"
            self.round()
        return self.now_ms - ROUND_MS


def move(manager: LogManager) -> Mover:
    assert manager.alter_replica_log_dir("t", 0, os.path.abspath(manager.log_dirs[1]), now_ms=0)
    return Mover(manager)


def test_without_a_rate_no_step_waits(tmp_path):
    manager = LogManager.open(config(tmp_path), now_ms=0)
    assert manager.move_quota.bytes_per_second == UNBOUNDED          # Kafka's Long.MAX_VALUE: none
    lg = fill(manager, 5 * 8)
    mover = move(manager)
    swapped_at = mover.until_done()
    assert mover.handed == [(i * ROUND_MS, SEGMENT) for i in range(5)]      # a step every round
    assert swapped_at == 5 * ROUND_MS and manager.move_quota.throttled_checks == 0
    assert manager.log_dir_of("t", 0).name == "d1" and offsets(read_all(lg)) == list(range(40))
    manager.close(now_ms=0)


def test_a_move_at_a_rate_goes_no_faster_than_kafkas_windows_allow(tmp_path):
    """Rate: one segment a second over 2 windows of 1 s. A step is handed over at an empty rate (t=0),
    the second at one segment over 1.1 s (the oldest window counts as at least one whole window), the
    third would make two segments over 1.2 s and waits; the two stay counted, over at most 2 s, until
    their window is forgotten 2 windows after it opened (t=2 s), and so on."""
    manager = LogManager.open(config(tmp_path, move_max_bytes_per_second=SEGMENT, move_quota_window_num=2,
                                     move_quota_window_size_seconds=1), now_ms=0)
    lg = fill(manager, 5 * 8)
    expected = read_all(lg)
    mover = move(manager)
    swapped_at = mover.until_done()
    assert mover.handed == [(0, SEGMENT), (100, SEGMENT), (2_000, SEGMENT), (2_100, SEGMENT), (4_000, SEGMENT)]
    assert swapped_at == 4_100                       # the round after the last step: nothing left to copy
    held = (mover.rounds - 1) - len(mover.handed)    # rounds that neither handed over nor swapped
    assert held == manager.move_quota.throttled_checks == 2 * 18
    assert manager.move_quota.recorded_bytes == 5 * SEGMENT
    assert lg.dir.parent.name == "d1" and read_all(lg) == expected
    manager.close(now_ms=0)


def test_a_changed_rate_applies_at_the_next_step(tmp_path):
    manager = LogManager.open(config(tmp_path, move_max_bytes_per_second=SEGMENT, move_quota_window_num=2,
                                     move_quota_window_size_seconds=1), now_ms=0)
    fill(manager, 6 * 8)
    mover = move(manager)
    for _ in range(4):
        mover.round()
    assert [t for t, _ in mover.handed] == [0, 100] and mover.moving         # held at 200 and 300
    manager.update_move_throttle(UNBOUNDED)
    mover.round()
    mover.round()
    assert [t for t, _ in mover.handed] == [0, 100, 400, 500]
    manager.update_move_throttle(1)                  # 1 byte/s: over it at once
    for _ in range(5):
        mover.round()
    assert [t for t, _ in mover.handed] == [0, 100, 400, 500] and mover.moving
    manager.update_move_throttle(0)                  # Kafka allows 0: nothing until the windows are forgotten
    while mover.now_ms < 2_000:
        mover.round()
    assert [t for t, _ in mover.handed] == [0, 100, 400, 500] and mover.moving
    mover.round()                                    # 2 s: the window opened at 0 (all four steps) is forgotten
    assert [t for t, _ in mover.handed] == [0, 100, 400, 500, 2_000]
    mover.round()
    assert [t for t, _ in mover.handed] == [0, 100, 400, 500, 2_000] and mover.moving
    manager.update_move_throttle(UNBOUNDED)
    mover.until_done()
    assert [t for t, _ in mover.handed] == [0, 100, 400, 500, 2_000, 2_200]
    assert manager.log_dir_of("t", 0).name == "d1"
    manager.close(now_ms=0)


def test_the_last_copy_before_the_swap_is_not_held_back(tmp_path):
    """A bulk step goes over a rate of 1 byte/s; the tail (one batch) is copied by the owner and the
    replica swapped in the next round all the same, while the rate stays exceeded."""
    manager = LogManager.open(config(tmp_path, move_max_bytes_per_second=1), now_ms=0)
    lg = fill(manager, 8 + 1)
    mover = move(manager)
    mover.round()
    assert mover.handed == [(0, SEGMENT)] and mover.moving
    mover.round()
    assert not mover.moving and lg.dir.parent.name == "d1" and lg.log_end_offset == 9
    assert manager.move_quota.recorded_bytes == 9 * BATCH      # the tail counts towards the rate
    assert manager.move_quota.exceeded(mover.now_ms)
    manager.close(now_ms=0)


def test_a_cut_of_the_future_is_made_while_its_copy_waits(tmp_path):
    """The current log is truncated (a follower's truncation) while the copy is over the rate: the
    future is cut back where the two agree in that round, and copied on once the rate allows."""
    manager = LogManager.open(config(tmp_path, move_max_bytes_per_second=SEGMENT, move_quota_window_num=2,
                                     move_quota_window_size_seconds=1), now_ms=0)
    lg = fill(manager, 3 * 8, leader_epoch=1)
    mover = move(manager)
    mover.round()
    mover.round()
    ((_, future, _),) = manager.future_logs()
    assert future.log_end_offset == 16
    lg.truncate_to(12, now_ms=0)
    produce(lg, 20, size=BATCH + 10, leader_epoch=2)
    expected = read_all(lg)
    mover.round()                                    # 200 ms: over the rate, the cut is made
    assert future.log_end_offset == 12 and [n for _, n in mover.handed] == [SEGMENT, SEGMENT, 0]
    mover.round()
    assert future.log_end_offset == 12               # and the copy waits
    mover.until_done()
    assert [t for t, n in mover.handed if n] == [0, 100, 2_000, 2_100, 4_000]
    assert lg.dir.parent.name == "d1" and read_all(lg) == expected
    manager.close(now_ms=0)
