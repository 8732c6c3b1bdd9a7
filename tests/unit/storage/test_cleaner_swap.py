"""Crash safety of a cleaning pass: a crash at every step (the cleaner's fault points), then a fresh
start from what is on disk, must lose nothing, duplicate nothing and leave a valid log."""

import os

import pytest

from odradek.storage import cleaner_swap
from odradek.storage.cleaner_swap import FAULT_STEPS, recover_swaps
from tests.unit.storage.cleanerutil import Written, append_keyed, check_compacted, open_manager, \
    random_workload, read_records


class Crash(BaseException):
    """A process death at a fault point: nothing after it runs, no clean-up."""


@pytest.fixture
def crash_at(monkeypatch):
    def arm(step: str) -> None:
        monkeypatch.setattr(cleaner_swap, "fault_step", step)
        monkeypatch.setattr(cleaner_swap, "_exit", lambda code: (_ for _ in ()).throw(Crash(step)))
    return arm


def leftovers(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap", ".deleted")))


def segment_ranges(log) -> list[tuple[int, int]]:
    return [(s.base_offset, s.next_offset) for s in log.segments]


@pytest.mark.parametrize("step", FAULT_STEPS)
def test_a_crash_at_any_step_of_a_pass_loses_and_duplicates_nothing(tmp_path, crash_at, step):
    m = open_manager(tmp_path, segment_bytes=3_000)
    log = m.get_or_create_log("t", 0, 0)
    written = Written()
    random_workload(log, written, batches=300, keys=30, tombstone_share=0.2)
    m.flush_all(0)
    m.checkpoint_high_watermarks()
    first_end = log.segments[1].base_offset
    before = len([r for r in read_records(log) if r[0] < first_end])
    crash_at(step)
    with pytest.raises(Crash):
        m.clean_now(10)
    crash_at("none")                                  # the restarted broker has no fault set

    again = open_manager(tmp_path, segment_bytes=3_000)   # no clean-shutdown marker: recovery
    log = again.get_log("t", 0)
    assert leftovers(log.dir) == []
    ranges = segment_ranges(log)
    assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:])), ranges
    assert log.log_end_offset == max(written.records) + 1
    check_compacted(log, written)
    after = len([r for r in read_records(log) if r[0] < first_end])
    committed = FAULT_STEPS.index(step) >= FAULT_STEPS.index("swap-committed")
    assert after < before if committed else after == before   # the first group's swap, or none
    while again.clean_now(20) is not None:            # and cleaning goes on from there
        pass
    records = check_compacted(log, written)
    assert len(records) < len(written.records) / 3
    again.close(30)


def test_a_committed_swap_of_an_emptied_group_keeps_later_old_segments_valid(tmp_path):
    """The cleaned segment holds nothing, so its end says nothing about the group: only the old
    segment at its own base offset can be removed; the others stay, all their offsets after it."""
    m = open_manager(tmp_path, segment_bytes=1_000)
    log = m.get_or_create_log("t", 0, 0)
    written = Written()
    for i in range(40):
        append_keyed(log, written, [(b"k%d" % (i % 3), b"old-%d" % i)])
    old = [s for s in log.segments[:-1]]
    assert len(old) >= 3
    for i in range(3):
        append_keyed(log, written, [(b"k%d" % i, b"new")])
    m.flush_all(0)
    # The state after "swap-committed" of a group [old...] whose records were all removed.
    base = old[0].base_offset
    swap = log.dir / f"{base:020d}.log.swap"
    swap.write_bytes(b"")
    for suffix in (".index.swap", ".timeindex.swap"):
        (log.dir / f"{base:020d}{suffix}").write_bytes(b"")
    recover_swaps(log.dir)
    assert not (log.dir / f"{base:020d}.log.swap").exists()
    assert os.path.getsize(log.dir / f"{base:020d}.log") == 0
    for segment in old[1:]:
        assert os.path.exists(log.dir / f"{segment.base_offset:020d}.log")
    again = open_manager(tmp_path, segment_bytes=1_000)
    log = again.get_log("t", 0)
    check_compacted(log, written)
    assert [r[2] for r in read_records(log)][-3:] == [b"new"] * 3
    again.close(10)


def test_files_of_an_uncommitted_swap_are_removed_and_the_old_segments_kept(tmp_path):
    m = open_manager(tmp_path, segment_bytes=1_000)
    log = m.get_or_create_log("t", 0, 0)
    written = Written()
    for i in range(30):
        append_keyed(log, written, [(b"k%d" % (i % 3), b"v%d" % i)])
    m.flush_all(0)
    base = log.segments[0].base_offset
    for name in (".log.cleaned", ".index.cleaned", ".index.swap", ".timeindex.swap"):
        (log.dir / f"{base:020d}{name}").write_bytes(b"garbage")
    again = open_manager(tmp_path, segment_bytes=1_000)
    assert leftovers(again.get_log("t", 0).dir) == []
    assert len(read_records(again.get_log("t", 0))) == 30
    again.close(10)
