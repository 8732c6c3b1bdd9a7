"""The log cleaner: compaction of the logs whose `cleanup.policy` contains `compact` (seed 003, "Log
Compaction"; Kafka's LogCleaner and LogCleanerManager, whose choices and names this follows).

Guarantees (seed 003, "What guarantees does log compaction provide?"): at least the last record of
every key is kept; offsets never change and order is kept (records are only removed); a tombstone is
kept for `delete.retention.ms` after the cleaning that first sees it (its batch's delete horizon,
cleaner_records.py); the active segment is never cleaned, nor anything at or past the high watermark,
nor a segment whose newest record is younger than `min.compaction.lag.ms`; cleaning never blocks
reads or appends.

Which log: among compacted logs not being cleaned, the one with the largest dirty ratio, dirty bytes
/ (clean + dirty bytes), counting whole segments from the first dirty offset (the log's entry in
`cleaner-offset-checkpoint`, else its log start) to the first uncleanable segment; it must exceed
`min.cleanable.dirty.ratio`, unless a dirty record is older than `max.compaction.lag.ms` or a kept
tombstone's delete horizon has passed (Kafka waits for the log to be dirty again there; here the
tombstones go on time). With nothing to clean a thread waits `log.cleaner.backoff.ms`.

Threads and the swap. The cleaner's threads (`log.cleaner.threads`) only read old segment files and
write new ones (cleaner_pass.py). Everything that touches a `Log` runs on the log's owner thread (the
broker's event loop, through `LogManager.run_periodic`): choosing a log and taking its `CleanPlan`
(which pins the segments it will read, so their files stay open even if retention deletes them),
swapping each cleaned group in (`Log.replace_segments`, a few renames and two directory fsyncs,
cleaner_swap.py), and finishing the pass (checkpoint, unpin, statistics). A thread keeps at most
`MAX_PENDING_SWAPS` cleaned groups waiting for the owner, so a pass needs at most two segments of
extra disk. A swap is refused, and the rest of the pass dropped, if the log changed under it (its
segments were deleted or truncated, the partition was deleted); nothing is lost, the log just stays
dirtier. A pass that fails (a corrupt segment) marks the partition uncleanable until restart, as in
Kafka. Unit tests drive the same steps in one thread with `clean_now`.

Pausing (Kafka's abortAndPauseCleaning / resumeCleaning): while a partition's replica moves to another
log dir (log_mover.py) its cleaning is paused: `pause` drops the pass under way before its next swap
(swaps happen on the owner thread, the caller's, so none can follow) and no pass starts until as many
`resume` calls came; `move_checkpoint` carries the first dirty offset to the dir the replica moved to.

`cleaner-offset-checkpoint` (each log dir's root, checkpoints.py format): per partition the first
dirty offset, written after each pass (partition gone: entry dropped).

Statistics (`CleanerStats`, plain attributes for a metrics exporter): passes, bytes and records read
and written, CPU seconds of the cleaner threads, the last pass's end time and duration, the dirtiest
log's ratio at the last check (Kafka's max-dirty-percent), the largest compaction delay, the map's
utilization, uncleanable partitions, aborted and failed passes.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from odradek.storage.checkpoints import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile, \
    TopicPartition
from odradek.storage.cleaner_pass import CleanedGroup, CleaningAborted, CleanPlan, PassResult, \
    SegmentSource, Throttler, run_clean
from odradek.storage.cleaner_records import OffsetMap
from odradek.storage.cleaner_swap import fault_point
from odradek.storage.config import LONG_MAX, CleanerConfig
from odradek.storage.errors import StorageError
from odradek.storage.log import Log

if TYPE_CHECKING:
    from odradek.storage.manager import LogManager

log = logging.getLogger("odradek.storage.cleaner")

MAX_PENDING_SWAPS = 1
_IDLE_WAIT_S = 0.05


@dataclass(slots=True)
class CleanerStats:
    passes: int = 0
    aborted_passes: int = 0
    failed_passes: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_written: int = 0
    cpu_s: float = 0.0
    last_pass_end_ms: int = -1
    last_pass_duration_ms: int = 0
    last_pass_bytes_read: int = 0
    last_pass_bytes_written: int = 0
    max_dirty_ratio: float = 0.0
    max_compaction_delay_ms: int = 0
    max_buffer_utilization: float = 0.0
    uncleanable_partitions: int = 0
    dead_threads: int = 0


@dataclass(slots=True)
class LogToClean:
    topic_partition: TopicPartition
    log: Log
    log_dir: Path
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    compaction_delay_ms: int
    horizon_due: bool

    @property
    def cleanable_ratio(self) -> float:
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0

    def eligible(self) -> bool:
        return (self.compaction_delay_ms > 0 and self.cleanable_bytes > 0) or self.horizon_due \
            or self.cleanable_ratio > self.log.config.min_cleanable_dirty_ratio


@dataclass(slots=True)
class _Task:
    """A pass in progress, as the owner thread tracks it."""

    plan: CleanPlan
    worker: _Worker | None
    started_ms: int
    pending_swaps: int = 0


class LogCleaner:
    def __init__(self, manager: LogManager, config: CleanerConfig) -> None:
        self.manager = manager
        self.config = config
        self.stats = CleanerStats()
        self._checkpoints = {d: _read_checkpoint(d) for d in manager.log_dirs}
        self._tasks: dict[int, _Task] = {}        # id(log) -> its pass
        self._uncleanable: set[TopicPartition] = set()
        self._paused: dict[TopicPartition, int] = {}   # partition -> pause calls not yet resumed
        self._horizons: dict[int, int] = {}      # id(log) -> earliest delete horizon kept
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._swapped = threading.Condition()
        self._stop = threading.Event()
        self._workers: list[_Worker] = []
        self._next_check_ms = 0

    # ---- owner thread ------------------------------------------------------------------------------

    def run_owner_tasks(self, now_ms: int) -> None:
        """Swap in what the threads cleaned, finish their passes, hand out new ones."""
        if not self._workers and self.config.running_threads and not self._stop.is_set():
            self._start_threads()
        while True:
            try:
                kind, plan, payload = self._results.get_nowait()
            except queue.Empty:
                break
            self._on_result(kind, plan, payload, now_ms)
        self.stats.dead_threads = sum(1 for w in self._workers if not w.is_alive())
        idle = [w for w in self._workers if w.is_alive() and w.task is None]
        if idle and now_ms >= self._next_check_ms:
            for worker in idle:
                task = self._grab(now_ms, worker)
                if task is None:
                    self._next_check_ms = now_ms + self.config.backoff_ms
                    break
                worker.task = task
                worker.tasks.put(task)

    def clean_now(self, now_ms: int) -> PassResult | None:
        """Clean the filthiest log now, in this thread (tests and tools); None if none qualifies."""
        task = self._grab(now_ms, None)
        if task is None:
            return None
        offset_map = OffsetMap(self._map_memory_bytes())
        throttler = Throttler(self.config.io_max_bytes_per_second, self._stop.wait)
        passing = run_clean(task.plan, offset_map, io_buffer_size=self.config.io_buffer_size,
                            throttler=throttler, stopped=self._stop.is_set)
        try:
            while True:
                self._on_result("group", task.plan, next(passing), now_ms)
        except StopIteration as done:
            self._on_result("done", task.plan, done.value, now_ms)
            return done.value
        except CleaningAborted:
            self._on_result("aborted", task.plan, None, now_ms)
        except Exception as e:  # noqa: BLE001 - a corrupt log marks the partition, as in Kafka
            self._on_result("failed", task.plan, e, now_ms)
        return None

    def is_cleaning(self, log_: Log) -> bool:
        return id(log_) in self._tasks

    def pause(self, tp: TopicPartition) -> None:
        """Stop cleaning the partition's log until `resume`: a pass under way swaps nothing more."""
        self._paused[tp] = self._paused.get(tp, 0) + 1
        log_ = self.manager.get_log(*tp)
        task = self._tasks.get(id(log_)) if log_ is not None else None
        if task is not None and not task.plan.aborted:
            log.info("%s-%d: the pass under way stops (cleaning paused)", *tp)
            task.plan.aborted = True

    def resume(self, tp: TopicPartition) -> None:
        """Undo one `pause`; the log is cleaned again once every pause was undone."""
        left = self._paused.get(tp, 0) - 1
        if left > 0:
            self._paused[tp] = left
        else:
            self._paused.pop(tp, None)

    def is_paused(self, tp: TopicPartition) -> bool:
        return tp in self._paused

    def move_checkpoint(self, tp: TopicPartition, source_dir: Path, dest_dir: Path) -> None:
        """The partition's log moved from `source_dir` to `dest_dir` (same records, same offsets): its
        first dirty offset goes with it (Kafka's alterCheckpointDir)."""
        offset = self._checkpoints.get(source_dir, {}).pop(tp, None)
        if offset is None:
            return
        self._checkpoints.setdefault(dest_dir, {})[tp] = offset
        self._write_checkpoint(dest_dir)
        self._write_checkpoint(source_dir)

    def on_log_deleted(self, tp: TopicPartition, log_: Log, log_dir: Path) -> None:
        task = self._tasks.get(id(log_))
        if task is not None:
            task.plan.aborted = True
        self._horizons.pop(id(log_), None)
        self._uncleanable.discard(tp)
        if self._checkpoints.get(log_dir, {}).pop(tp, None) is not None:
            self._write_checkpoint(log_dir)

    def update_config(self, config: CleanerConfig) -> None:
        """New `log.cleaner.*` settings: the threads restart with them (passes under way stop)."""
        if config == self.config:
            return
        self.shutdown()
        self.config = config
        self._stop = threading.Event()
        self._next_check_ms = 0

    def shutdown(self) -> None:
        """Stop the threads (a pass stops within one read) and drop what they had not swapped in."""
        self._stop.set()
        with self._swapped:
            self._swapped.notify_all()
        for worker in self._workers:
            worker.tasks.put(None)
        for worker in self._workers:
            worker.join()
        self._workers = []
        while True:
            try:
                kind, plan, payload = self._results.get_nowait()
            except queue.Empty:
                break
            if kind == "group":
                payload.cleaned.delete()
        for task in list(self._tasks.values()):
            self._end(task, aborted=True)

    # ---- choosing a log ----------------------------------------------------------------------------

    def _grab(self, now_ms: int, worker: _Worker | None) -> _Task | None:
        candidates = []
        for tp, log_ in self.manager.logs():
            if not log_.config.compact or id(log_) in self._tasks or tp in self._uncleanable \
                    or tp in self._paused:
                continue
            candidate = self._to_clean(tp, log_, now_ms)
            if candidate.clean_bytes + candidate.cleanable_bytes > 0:
                candidates.append(candidate)
        self.stats.max_dirty_ratio = max((c.cleanable_ratio for c in candidates), default=0.0)
        self.stats.max_compaction_delay_ms = max((c.compaction_delay_ms for c in candidates),
                                                 default=0)
        eligible = [c for c in candidates if c.eligible()]
        if not eligible:
            return None
        chosen = max(eligible, key=lambda c: c.cleanable_ratio)
        task = _Task(self._plan(chosen, now_ms), worker, now_ms)
        self._tasks[id(chosen.log)] = task
        return task

    def _to_clean(self, tp: TopicPartition, log_: Log, now_ms: int) -> LogToClean:
        log_dir = self.manager.log_dir_of(*tp)
        assert log_dir is not None
        segments = log_.segments
        start, end = log_.log_start_offset, log_.log_end_offset
        first_dirty = self._checkpoints.get(log_dir, {}).get(tp, start)
        if not start <= first_dirty <= end:
            log.info("%s-%d: first dirty offset %d outside [%d, %d]; cleaning from the log start",
                     *tp, first_dirty, start, end)
            first_dirty = start
            self._checkpoints.setdefault(log_dir, {})[tp] = start
            self._write_checkpoint(log_dir)
        config = log_.config
        bound = min(log_.high_watermark, segments[-1].base_offset)
        if config.min_compaction_lag_ms > 0:
            for segment in _non_active_from(segments, first_dirty):
                if _largest_timestamp(segment) > now_ms - config.min_compaction_lag_ms:
                    bound = min(bound, segment.base_offset)
                    break
        # The first uncleanable offset is the base of the segment holding the bound.
        first_uncleanable = _from_offset(segments, max(first_dirty, bound))[0].base_offset
        clean_bytes = sum(s.size for s in segments if s.base_offset < first_dirty)
        cleanable_bytes = sum(s.size for s in _from_offset(segments, first_dirty)
                              if s.base_offset < max(first_dirty, first_uncleanable))
        delay = 0
        if config.max_compaction_lag_ms < LONG_MAX:
            firsts = [t for s in _non_active_from(segments, first_dirty)
                      if (t := s.first_batch_timestamp) > 0]
            if firsts and min(firsts) < now_ms - config.max_compaction_lag_ms:
                delay = now_ms - config.max_compaction_lag_ms - min(firsts)
        horizon = self._horizons.get(id(log_))
        return LogToClean(tp, log_, log_dir, first_dirty, first_uncleanable, clean_bytes,
                          cleanable_bytes, delay, horizon is not None and horizon <= now_ms)

    def _plan(self, c: LogToClean, now_ms: int) -> CleanPlan:
        log_, config = c.log, c.log.config
        segments = log_.segments
        sources = []
        for i, segment in enumerate(segments[:-1]):
            if segment.base_offset >= c.first_uncleanable_offset:
                break
            next_base = segments[i + 1].base_offset
            position = 0
            if segment.base_offset <= c.first_dirty_offset < next_base:
                position = segment.offset_index.lookup(c.first_dirty_offset)[1]
            segment.pins += 1
            sources.append(SegmentSource(segment, segment.base_offset, segment.size, next_base,
                                         segment.last_modified_ms, position))
        producers = {pid: (e.last_data_offset, e.producer_epoch)
                     for pid, e in log_.producer_state.producers.items()}
        return CleanPlan(c.topic_partition, log_.dir, c.first_dirty_offset,
                         c.first_uncleanable_offset, now_ms, sources, producers,
                         config.segment_bytes, config.segment_index_bytes,
                         config.index_interval_bytes, config.delete_retention_ms,
                         log_.truncations, log=log_)

    # ---- results (owner thread) --------------------------------------------------------------------

    def _on_result(self, kind: str, plan: CleanPlan, payload, now_ms: int) -> None:
        task = self._tasks.get(id(plan.log))
        if task is None or task.plan is not plan:
            if kind == "group":
                payload.cleaned.delete()
            return
        if kind == "group":
            self._swap(task, payload, now_ms)
        elif kind == "done":
            self._finish(task, payload, now_ms)
        elif kind == "aborted" or plan.aborted:  # a failure after an abort is the abort's doing
            self._end(task, aborted=True)
        else:
            log.error("%s-%d: cleaning failed; the partition stays uncleanable until restart",
                      *plan.topic_partition, exc_info=payload)
            self._uncleanable.add(plan.topic_partition)
            self.stats.uncleanable_partitions = len(self._uncleanable)
            self.stats.failed_passes += 1
            self._end(task, aborted=False)

    def _swap(self, task: _Task, group: CleanedGroup, now_ms: int) -> None:
        plan = task.plan
        log_ = plan.log
        assert log_ is not None
        with self._swapped:
            task.pending_swaps -= 1 if task.worker is not None else 0
            self._swapped.notify_all()
        current = self.manager.get_log(*plan.topic_partition)
        try:
            if not plan.aborted and current is log_ and log_.truncations == plan.truncations \
                    and all(s.segment.size == s.size for s in group.sources) \
                    and log_.replace_segments(group.cleaned, [s.segment for s in group.sources],
                                              now_ms):
                return
        except (OSError, StorageError):
            # A rename or fsync failed: the files are left as they are for the recovery at the
            # next start (cleaner_swap.py); this log is not cleaned again until then.
            log.exception("%s-%d: swapping a cleaned segment in failed", *plan.topic_partition)
            plan.aborted = True
            self._uncleanable.add(plan.topic_partition)
            self.stats.uncleanable_partitions = len(self._uncleanable)
            return
        if not plan.aborted:
            log.info("%s-%d: the log changed while it was cleaned; this pass stops",
                     *plan.topic_partition)
        plan.aborted = True
        group.cleaned.delete()

    def _finish(self, task: _Task, result: PassResult, now_ms: int) -> None:
        plan = task.plan
        if plan.aborted:
            self._end(task, aborted=True)
            return
        log_dir = self.manager.log_dir_of(*plan.topic_partition)
        if log_dir is not None:
            self._checkpoints.setdefault(log_dir, {})[plan.topic_partition] = result.end_offset
            try:
                self._write_checkpoint(log_dir)
            except (OSError, StorageError):  # the next pass redoes this one's work: no harm
                log.exception("%s: writing %s failed", log_dir, CLEANER_OFFSET_CHECKPOINT)
            fault_point("checkpoint-written")
        s, stats = result.stats, self.stats
        if s.earliest_horizon_ms is None:
            self._horizons.pop(id(plan.log), None)
        else:
            self._horizons[id(plan.log)] = s.earliest_horizon_ms
        stats.passes += 1
        stats.bytes_read += s.bytes_read
        stats.bytes_written += s.bytes_written
        stats.records_read += s.records_read
        stats.records_written += s.records_written
        stats.cpu_s += s.cpu_s
        stats.last_pass_end_ms = now_ms
        stats.last_pass_duration_ms = now_ms - task.started_ms
        stats.last_pass_bytes_read, stats.last_pass_bytes_written = s.bytes_read, s.bytes_written
        stats.max_buffer_utilization = max(stats.max_buffer_utilization, s.buffer_utilization)
        log.info("%s-%d: cleaned [%d, %d) up to %d in %d ms (%.1f s CPU): read %d bytes and %d "
                 "records, wrote %d bytes and %d records (%.1f%% of the bytes kept)",
                 *plan.topic_partition, plan.first_dirty_offset, result.end_offset,
                 plan.first_uncleanable_offset, stats.last_pass_duration_ms, s.cpu_s,
                 s.bytes_read - s.map_bytes_read, s.records_read, s.bytes_written,
                 s.records_written,
                 100.0 * s.bytes_written / max(s.bytes_read - s.map_bytes_read, 1))
        self._end(task, aborted=False)
        self._next_check_ms = now_ms  # there may be more to clean: look again at once

    def _end(self, task: _Task, *, aborted: bool) -> None:
        for source in task.plan.sources:
            source.segment.pins -= 1
        self._tasks.pop(id(task.plan.log), None)
        if task.worker is not None:
            task.worker.task = None
        if aborted:
            self.stats.aborted_passes += 1

    def _write_checkpoint(self, log_dir: Path) -> None:
        OffsetCheckpointFile(log_dir / CLEANER_OFFSET_CHECKPOINT).write(
            self._checkpoints.get(log_dir, {}))

    # ---- threads -----------------------------------------------------------------------------------

    def _map_memory_bytes(self) -> int:
        threads = max(self.config.threads, 1)
        return int(self.config.dedupe_buffer_size / threads * self.config.io_buffer_load_factor)

    def _start_threads(self) -> None:
        self._workers = [_Worker(self, i) for i in range(self.config.running_threads)]
        for worker in self._workers:
            worker.start()

    def post(self, kind: str, plan: CleanPlan, payload) -> None:
        """From a cleaner thread: hand a result to the owner thread."""
        self._results.put((kind, plan, payload))

    def wait_for_swaps(self, task: _Task) -> None:
        """From a cleaner thread: wait while too many of its cleaned groups await their swap."""
        with self._swapped:
            task.pending_swaps += 1
            while task.pending_swaps > MAX_PENDING_SWAPS and not self._stop.is_set() \
                    and not task.plan.aborted:
                self._swapped.wait(_IDLE_WAIT_S)


class _Worker(threading.Thread):
    def __init__(self, cleaner: LogCleaner, index: int) -> None:
        super().__init__(name=f"odradek-log-cleaner-{index}", daemon=True)
        self.cleaner = cleaner
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.task: _Task | None = None   # changed on the owner thread only
        self.offset_map = OffsetMap(cleaner._map_memory_bytes())

    def run(self) -> None:
        cleaner = self.cleaner
        config = cleaner.config
        stop = cleaner._stop
        while (task := self.tasks.get()) is not None:
            plan = task.plan
            try:
                throttler = Throttler(config.io_max_bytes_per_second, stop.wait)
                passing = run_clean(plan, self.offset_map, io_buffer_size=config.io_buffer_size,
                                    throttler=throttler, stopped=stop.is_set)
                for _ in _groups(passing, cleaner, plan):
                    cleaner.wait_for_swaps(task)
            except CleaningAborted:
                cleaner.post("aborted", plan, None)
            except Exception as e:  # noqa: BLE001 - reported and handled on the owner thread
                cleaner.post("failed", plan, e)


def _groups(passing, cleaner: LogCleaner, plan: CleanPlan) -> Iterator[CleanedGroup]:
    """Post each cleaned group, then the pass's result, to the owner thread."""
    while True:
        try:
            group = next(passing)
        except StopIteration as done:
            cleaner.post("done", plan, done.value)
            return
        cleaner.post("group", plan, group)
        yield group


def _read_checkpoint(log_dir: Path) -> dict[TopicPartition, int]:
    """A dir's first dirty offsets; an unreadable file only means cleaning from the log starts."""
    try:
        return OffsetCheckpointFile(log_dir / CLEANER_OFFSET_CHECKPOINT).read()
    except (OSError, StorageError) as e:
        log.warning("%s: ignoring %s: %s", log_dir, CLEANER_OFFSET_CHECKPOINT, e)
        return {}


def _from_offset(segments, offset: int) -> list:
    """The segments from the one holding `offset` on (the first one for smaller offsets)."""
    i = 0
    while i + 1 < len(segments) and segments[i + 1].base_offset <= offset:
        i += 1
    return list(segments[i:])


def _non_active_from(segments, offset: int) -> list:
    return [s for s in _from_offset(segments, offset) if s is not segments[-1]]


def _largest_timestamp(segment) -> int:
    return segment.max_timestamp if segment.max_timestamp >= 0 else segment.last_modified_ms
