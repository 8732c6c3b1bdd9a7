"""Cleaning whole logs: what stays, which log is chosen, lags, passes, tombstones, checkpoints,
producer state, and the threads with their hand-off to the owner."""

import os
import threading
import time

import pytest

from odradek.storage.checkpoints import CLEANER_OFFSET_CHECKPOINT
from odradek.storage.cleaner_pass import Throttler
from odradek.storage.log import Log
from odradek.storage.producer_state import list_snapshot_offsets
from tests.unit.storage.cleanerutil import Written, append_keyed, check_compacted, open_manager, \
    random_workload, read_records

DAY = 86_400_000


def unique_keys(records) -> bool:
    keys = [r[1] for r in records]
    return len(keys) == len(set(keys))


def test_cleaning_keeps_the_last_value_of_every_key_at_its_offset_in_order(tmp_path):
    m = open_manager(tmp_path)
    log = m.get_or_create_log("t", 0, 0)
    written = Written()
    random_workload(log, written, batches=400, keys=60)
    before = log.size_bytes
    result = m.clean_now(10)
    assert result is not None and result.end_offset == log.active_segment.base_offset
    records = check_compacted(log, written)
    cleaned = [r for r in records if r[0] < result.end_offset]
    assert unique_keys(cleaned)                # below the end offset, one record per key
    assert log.size_bytes < before / 3
    assert m.cleaner_stats.passes == 1 and m.cleaner_stats.bytes_written > 0
    m.close(20)


def test_the_active_segment_and_data_past_the_high_watermark_are_never_cleaned(tmp_path):
    m = open_manager(tmp_path, segment_bytes=100_000)
    log = m.get_or_create_log("t", 0, 0)
    written = Written()
    for i in range(50):
        append_keyed(log, written, [(b"same", b"%d" % i)])
    assert len(log.segments) == 1
    assert m.clean_now(10) is None                    # everything is in the active segment
    log.roll(10)
    append_keyed(log, written, [(b"same", b"last")])
    log.update_high_watermark(30)                     # the first segment is past the HW
    assert m.clean_now(10) is None
    log.update_high_watermark(log.log_end_offset)
    assert m.clean_now(10) is not None
    assert [r[2] for r in read_records(log)] == [b"49", b"last"]
    m.close(20)


def test_reads_from_any_offset_start_at_the_next_record_that_stayed(tmp_path):
    m = open_manager(tmp_path)
    log = m.get_or_create_log("t", 0, 0)
    written = Written()
    random_workload(log, written, batches=200, keys=10, tombstone_share=0)
    m.clean_now(10)
    kept = [r[0] for r in read_records(log)]
    for start in range(0, log.log_end_offset, 7):
        first = read_records(log, start)[0][0]
        assert first == min(o for o in kept if o >= start) or first < start   # whole batches
        assert all(o in kept for o, *_ in read_records(log, start))
    m.close(20)


def test_the_dirtiest_log_above_the_ratio_goes_first(tmp_path):
    m = open_manager(tmp_path, min_cleanable_dirty_ratio=0.5)
    a, b = m.get_or_create_log("a", 0, 0), m.get_or_create_log("b", 0, 0)
    written = Written()
    random_workload(a, written, batches=100, keys=5, tombstone_share=0)
    random_workload(b, written, batches=200, keys=5, tombstone_share=0)
    assert m.clean_now(10) is not None and m.cleaner_stats.max_dirty_ratio == 1.0
    first_cleaned = [tp for tp in ("a", "b")
                     if (tmp_path / "d0" / CLEANER_OFFSET_CHECKPOINT).read_text().count(f"{tp} 0")]
    assert len(first_cleaned) == 1
    for log_ in (a, b):
        log_.roll(10)
    passes = 1
    while m.clean_now(10) is not None:
        passes += 1
        assert passes < 10
    assert passes >= 3
    # Both are clean now; a little new dirt is below the ratio.
    for log_ in (a, b):
        append_keyed(log_, written, [(b"key-0000", b"x")])
        log_.roll(10)
    assert m.clean_now(10) is None
    assert 0 < m.cleaner_stats.max_dirty_ratio < 0.5
    m.close(20)


def test_delete_only_logs_are_never_cleaned_and_the_policy_can_change_at_run_time(tmp_path):
    m = open_manager(tmp_path, cleanup_policy=("delete",))
    log = m.get_or_create_log("t", 0, 0)
    written = Written()
    random_workload(log, written, batches=100, keys=5)
    assert m.clean_now(10) is None
    log.update_config(log.config.__class__(**{**_fields(log.config),
                                              "cleanup_policy": ("compact", "delete")}))
    assert m.clean_now(10) is not None
    check_compacted(log, written)
    m.close(20)


def _fields(config) -> dict:
    return {name: getattr(config, name) for name in config.__slots__}


def test_min_compaction_lag_keeps_young_segments_out(tmp_path):
    m = open_manager(tmp_path, min_compaction_lag_ms=60_000)
    log = m.get_or_create_log("t", 0, 0)
    written = Written()
    random_workload(log, written, batches=100, keys=5, ts=1_000)            # old records
    random_workload(log, written, batches=100, keys=5, ts=100_000, seed=2)  # young at now=120 s
    young = next(s for s in log.segments if s.max_timestamp > 120_000 - 60_000)
    result = m.clean_now(120_000)
    assert result.end_offset <= young.base_offset
    kept = {r[0] for r in read_records(log)}
    assert {o for o in written.records if o >= young.base_offset} <= kept   # nothing young went
    assert len([o for o in written.records if o < young.base_offset and o not in kept]) > 100
    m.close(200_000)


def test_max_compaction_lag_forces_cleaning_below_the_ratio_and_rolls_the_active_segment(tmp_path):
    m = open_manager(tmp_path, min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=60_000,
                     segment_bytes=1_000_000)
    log = m.get_or_create_log("t", 0, 0)
    written = Written()
    for i in range(20):
        append_keyed(log, written, [(b"k", b"%d" % i)], ts=1_000, now_ms=1_000)
    # The active segment rolls once its first record is older than the lag (segment.ms is 7 days).
    append_keyed(log, written, [(b"k", b"late")], ts=70_000, now_ms=70_000)
    assert len(log.segments) == 2
    assert m.clean_now(70_000) is not None          # ratio 1.0 > 0.99 anyway; now below it:
    append_keyed(log, written, [(b"k", b"later")], ts=140_000, now_ms=140_000)
    assert len(log.segments) == 3
    assert m.clean_now(140_000) is not None          # forced: a dirty record is past the lag
    assert m.cleaner_stats.max_dirty_ratio < 0.99 and m.cleaner_stats.max_compaction_delay_ms > 0
    assert [r[2] for r in read_records(log)] == [b"late", b"later"]   # "later" is in the active one
    m.close(200_000)


def test_a_full_map_cleans_in_passes_each_moving_the_checkpoint(tmp_path):
    m = open_manager(tmp_path, dedupe_buffer_size=64 * 1024)   # about 500 keys per pass
    log = m.get_or_create_log("t", 0, 0)
    written = Written()
    for round_ in range(3):
        for k in range(0, 1500, 5):
            append_keyed(log, written, [(f"key-{k + j:05d}".encode(), f"{round_}".encode())
                                        for j in range(5)])
    ends = []
    while (result := m.clean_now(10)) is not None:
        ends.append(result.end_offset)
        assert len(ends) < 20
    assert len(ends) >= 3 and ends == sorted(ends)
    assert ends[-1] == log.active_segment.base_offset
    records = check_compacted(log, written)
    assert unique_keys([r for r in records if r[0] < ends[-1]])
    assert (tmp_path / "d0" / CLEANER_OFFSET_CHECKPOINT).read_text().endswith(f"t 0 {ends[-1]}\n")
    m.close(20)


def test_tombstones_stay_for_delete_retention_then_go_without_new_writes(tmp_path):
    m = open_manager(tmp_path, delete_retention_ms=50_000)
    log = m.get_or_create_log("t", 0, 0)
    written = Written()
    random_workload(log, written, batches=300, keys=30, tombstone_share=0.3)
    assert any(v is None for v in written.expected_last_values().values())
    m.clean_now(1_000)
    check_compacted(log, written)                 # the tombstones are there
    assert m.clean_now(50_999) is None            # nothing dirty, horizon not reached
    assert m.clean_now(51_000) is not None        # the horizon has passed
    check_compacted(log, written, tombstones_gone=True)
    assert not any(r[2] is None for r in read_records(log) if r[0] < log.active_segment.base_offset)
    assert m.clean_now(60_000) is None
    m.close(70_000)


def test_the_checkpoint_survives_a_restart_and_is_reset_when_out_of_range(tmp_path):
    m = open_manager(tmp_path)
    log = m.get_or_create_log("t", 0, 0)
    written = Written()
    random_workload(log, written, batches=100, keys=5)
    end = m.clean_now(10).end_offset
    m.close(20)
    m = open_manager(tmp_path)
    assert m.clean_now(30) is None                # clean, as the checkpoint says
    log = m.get_log("t", 0)
    random_workload(log, written, batches=100, keys=5, seed=3)
    assert m.clean_now(40).end_offset > end
    m.close(50)
    path = tmp_path / "d0" / CLEANER_OFFSET_CHECKPOINT
    path.write_text("0\n1\nt 0 999999\n")
    m = open_manager(tmp_path)
    assert m.clean_now(60) is not None            # past the log end: the whole log is dirty
    check_compacted(m.get_log("t", 0), written)
    m.close(70)


def test_compact_and_delete_logs_are_cleaned_and_retained(tmp_path):
    # Real times: a segment the cleaner emptied has no timestamp, and retention then goes by the
    # file's modification time (the last old segment's), as Kafka does.
    now = time.time_ns() // 1_000_000
    m = open_manager(tmp_path, cleanup_policy=("compact", "delete"), retention_ms=3_600_000)
    log = m.get_or_create_log("t", 0, 0)
    written = Written()
    random_workload(log, written, batches=200, keys=20, ts=now - DAY, now_ms=now)
    m.clean_now(now)
    check_compacted(log, written)
    assert m.run_retention(now + 2 * 3_600_000) > 0          # every closed segment is too old
    assert len(log.segments) == 1 and log.log_start_offset == log.active_segment.base_offset
    m.close(now)


def test_the_last_batch_of_a_live_producer_stays_so_its_sequence_survives_a_rebuild(tmp_path):
    m = open_manager(tmp_path)
    log = m.get_or_create_log("t", 0, 0)
    written = Written()
    for seq in range(0, 40, 2):
        append_keyed(log, written, [(b"a", b"%d" % seq), (b"b", b"x")], producer=(7, 0, seq))
    append_keyed(log, written, [(b"a", b"other")])      # supersedes producer 7's last "a"
    append_keyed(log, written, [(b"b", b"other")])
    log.roll(10)
    m.clean_now(10)
    headers = read_records(log)
    assert [r[2] for r in headers] == [b"other", b"other"]
    # Rebuild producer state from the log alone: the empty batch kept for producer 7 holds it.
    m.close(20)
    for offset in list_snapshot_offsets(log.dir):
        os.remove(log.dir / f"{offset:020d}.snapshot")
    again = Log.open(log.dir, log.config, now_ms=30, needs_recovery=True)
    entry = again.producer_state.last_entry(7)
    assert entry is not None and entry.last_seq == 39 and entry.producer_epoch == 0
    again.close()


def test_cleaner_threads_clean_while_the_owner_appends_and_reads(tmp_path):
    m = open_manager(tmp_path, threads=1, backoff_ms=10, file_delete_delay_ms=60_000)
    log = m.get_or_create_log("t", 0, 0)
    written = Written()
    deadline = time.monotonic() + 30
    batch = 0
    old_slice = None
    while m.cleaner_stats.passes < 3:
        assert time.monotonic() < deadline, m.cleaner_stats
        random_workload(log, written, batches=20, keys=40, seed=batch)
        batch += 1
        if old_slice is None:
            old_slice = log.read(0, 1 << 20)[0]
            old_bytes = old_slice.read()
        m.run_periodic(batch)
        check_compacted(log, written)            # consistent between any two owner steps
        time.sleep(0.01)
    # A slice taken before the first swap still reads the bytes it pointed at.
    assert old_slice.read() == old_bytes
    m.close(10_000)
    assert not [t for t in threading.enumerate() if t.name.startswith("odradek-log-cleaner")]


def test_a_swap_is_refused_when_the_log_changed_under_the_pass(tmp_path):
    m = open_manager(tmp_path, threads=1)
    log = m.get_or_create_log("t", 0, 0)
    written = Written()
    random_workload(log, written, batches=300, keys=40)
    last = append_keyed(log, Written(), [(b"key-0001", b"truncated")])
    m.run_periodic(1)                            # a pass starts on the thread
    task = next(iter(m.cleaner._tasks.values()))
    log.truncate_to(last, 2)                     # a replica truncation voids the plan
    deadline = time.monotonic() + 20
    while m.cleaner.is_cleaning(log):
        assert time.monotonic() < deadline
        m.run_periodic(3)
        time.sleep(0.01)
    assert task.plan.aborted and m.cleaner_stats.aborted_passes == 1
    assert not [n for n in os.listdir(log.dir) if n.endswith((".cleaned", ".swap"))]
    check_compacted(log, written)
    m.close(10)


def test_deleting_a_partition_while_it_is_cleaned(tmp_path):
    m = open_manager(tmp_path, threads=1)
    log = m.get_or_create_log("t", 0, 0)
    random_workload(log, Written(), batches=100, keys=40)
    assert m.clean_now(0) is not None
    assert "t 0" in (tmp_path / "d0" / CLEANER_OFFSET_CHECKPOINT).read_text()
    random_workload(log, Written(), batches=300, keys=40, seed=2)
    m.run_periodic(1)
    assert m.cleaner.is_cleaning(log)
    assert m.delete_log("t", 0, 2)
    deadline = time.monotonic() + 20
    # The directory is renamed "t-0.<id>-delete" at once and removed on another thread: wait for that too.
    while m.cleaner.is_cleaning(log) or [n for n in os.listdir(tmp_path / "d0") if n.startswith("t-0")]:
        assert time.monotonic() < deadline
        m.run_periodic(100_000)
        time.sleep(0.01)
    assert not [n for n in os.listdir(tmp_path / "d0") if n.startswith("t-0")]
    assert "t 0" not in (tmp_path / "d0" / CLEANER_OFFSET_CHECKPOINT).read_text()
    assert m.cleaner_stats.aborted_passes == 1 and m.cleaner_stats.failed_passes == 0
    m.close(200_000)


def test_throttler_sleeps_to_hold_the_rate():
    now = [0.0]
    waits = []
    throttler = Throttler(1000.0, lambda s: waits.append(s) or False, clock=lambda: now[0],
                          check_interval_s=0.3)
    throttler.maybe_throttle(100)
    assert waits == []
    now[0] = 0.5
    throttler.maybe_throttle(900)               # 1000 bytes in 0.5 s: half a second too fast
    assert waits == [pytest.approx(0.5)]


def test_two_threads_clean_several_logs_never_the_same_one_at_once(tmp_path):
    m = open_manager(tmp_path, threads=2, backoff_ms=10)
    logs = [m.get_or_create_log(f"t{i}", 0, 0) for i in range(4)]
    written = [Written() for _ in logs]
    for log_, w in zip(logs, written):
        random_workload(log_, w, batches=200, keys=30)
    seen_busy = 0
    deadline = time.monotonic() + 60
    while m.cleaner_stats.passes < 4 or m.cleaner._tasks:
        assert time.monotonic() < deadline, m.cleaner_stats
        m.run_periodic(1)
        busy = [t.plan.log for t in m.cleaner._tasks.values()]
        assert len(busy) == len({id(b) for b in busy}) <= 2
        seen_busy = max(seen_busy, len(busy))
        time.sleep(0.005)
    assert seen_busy == 2
    for log_, w in zip(logs, written):
        records = check_compacted(log_, w)
        assert unique_keys([r for r in records if r[0] < log_.active_segment.base_offset])
    m.close(10)


def test_snapshots_of_merged_segments_go_with_them(tmp_path):
    m = open_manager(tmp_path)
    log = m.get_or_create_log("t", 0, 0)
    random_workload(log, Written(), batches=300, keys=5)
    m.clean_now(10)                     # every segment shrinks, each on its own
    random_workload(log, Written(), batches=100, keys=5, seed=2)
    segments, snapshots = len(log.segments), len(list_snapshot_offsets(log.dir))
    m.clean_now(20)                     # now the small ones are merged into a few
    assert len(log.segments) < segments / 2
    assert len(list_snapshot_offsets(log.dir)) < snapshots / 2
    assert set(list_snapshot_offsets(log.dir)) <= {s.base_offset for s in log.segments}
    m.close(30)


def test_an_unreadable_checkpoint_means_cleaning_from_the_start(tmp_path):
    m = open_manager(tmp_path)
    log = m.get_or_create_log("t", 0, 0)
    written = Written()
    random_workload(log, written, batches=100, keys=5)
    m.close(10)
    (tmp_path / "d0" / CLEANER_OFFSET_CHECKPOINT).write_text("garbage\n")
    m = open_manager(tmp_path)
    assert m.clean_now(20) is not None
    check_compacted(m.get_log("t", 0), written)
    m.close(30)
