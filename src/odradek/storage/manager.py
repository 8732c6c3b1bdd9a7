"""LogManager: every partition log of the broker, across `log.dirs`, and the periodic disk tasks.

Each log dir holds partition directories (`<topic>-<partition>/`, see log.py) and, at its root:

    meta.properties                     broker.id / cluster.id (checkpoints.py)
    recovery-point-offset-checkpoint    per partition: offsets below this are fsynced
    replication-offset-checkpoint       per partition: the high watermark
    log-start-offset-checkpoint         per partition: the log start offset
    cleaner-offset-checkpoint           per partition: the first dirty offset (cleaner.py)
    .kafka_cleanshutdown                present only after a clean close
    <topic>-<partition>.<uuid>-delete/  a deleted partition waiting for file.delete.delay.ms
                                        (the topic shortened to keep the name within 255 bytes)
    <topic>-<partition>.<uuid>-future/  a replica being moved here from another log dir
                                        (AlterReplicaLogDirs, see log_mover.py); its recovery point
                                        is in this dir's recovery-point-offset-checkpoint
    <topic>-<partition>.<uuid>-stray/   a replica the cluster no longer places here, set aside and
                                        kept for an operator to remove (never loaded again)

At start every partition is loaded; in a dir without the clean-shutdown marker each log is recovered
from its recovery point (CRC re-validation, truncation of torn tails, index rebuild). The marker is
removed once loading is done and written again by `close`, after every log is flushed and every
checkpoint written. A new partition goes to the dir AlterReplicaLogDirs named for it (before it
existed), else to the dir holding the fewest partitions. A replica moves to another dir through a future
log copied in the background (`alter_replica_log_dir`, log_mover.py); its steps are handed over and
its swap made by `run_periodic`, the partition's cleaning paused meanwhile and its steps held back
while they go over `replica.alter.log.dirs.io.max.bytes.per.second` (`update_move_throttle`). A
future dir found at start beside its current log is a move under way again (resumed where its copy
stood); alone, a swap cut short (it becomes the partition's dir).

No timers live here: the server calls `run_periodic(now_ms)` from its own timer and it runs whatever
is due (the log cleaner's hand-offs: swaps of cleaned segments and new passes, retention every
log.retention.check.interval.ms, checkpoints at their intervals, removal of `.deleted` files) and
returns when it next wants to be called. The threads are the cleaner's (`log.cleaner.threads`,
started by the first `run_periodic`, stopped by `close`); they never call into a Log (cleaner.py);
the mover's, which appends to future logs only (log_mover.py); and the sync thread
(background_sync.py), which runs the fsyncs of the periodic tasks: the caller is the broker's event
loop, and an fsync under heavy writes takes hundreds of milliseconds. The checkpoints' entries and a
flush's files are taken by the caller; a flush moves the log's recovery point in a later call, once
its sync is done (`sync_background` waits for them). `close` waits for the sync thread, then flushes
and closes the logs of each dir on num.recovery.threads.per.data.dir threads (as Kafka's
LogManager.shutdown) and writes every checkpoint itself. With `log.drop.behind.bytes` the same
thread drops what each log no longer needs from the page cache (page_cache.py).
Flushing of rolled segments and the `flush.ms` check run on every call (Kafka checks flush.ms only
every log.flush.scheduler.interval.ms, which defaults to never, so a topic's flush.ms silently does
nothing there). Not thread-safe: one caller at a time.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from odradek.protocol.exceptions import ProtocolError
from odradek.records.header import iter_headers
from odradek.storage import retention
from odradek.storage.background_sync import BackgroundSyncer
from odradek.storage.checkpoints import LOG_START_OFFSET_CHECKPOINT, \
    RECOVERY_POINT_CHECKPOINT, REPLICATION_CHECKPOINT, MetaProperties, OffsetCheckpointFile, \
    TopicPartition, fsync_dir, has_clean_shutdown_marker, read_meta_properties, \
    remove_clean_shutdown_marker, write_clean_shutdown_marker, write_meta_properties
from odradek.storage.cleaner import CleanerStats, LogCleaner
from odradek.storage.config import CleanerConfig, LogConfig, LogManagerConfig
from odradek.storage.errors import InconsistentMetaPropertiesError, InvalidTopicError, \
    LogDirNotFoundError, LogDirOfflineError, OffsetOutOfRangeError, ReplicaNotHostedError, StorageError
from odradek.storage.log import Log
from odradek.storage.log_mover import STEP_BYTES, CopyStep, MoverThread, ReplicaMove, SourceChanged, \
    agreed_offset
from odradek.storage.names import MAX_DIR_NAME_BYTES, future_dir_name, is_future_dir_name, \
    parse_log_dir_name, parse_partition_dir_name, partition_dir_name
from odradek.storage.page_cache import drop_cached
from odradek.storage.quota import ByteRateQuota
from odradek.storage.segment import unlink_files
from odradek.storage.timestamps import Decompress

logger = logging.getLogger("odradek.storage")

DELETE_DIR_SUFFIX = "-delete"
STRAY_DIR_SUFFIX = "-stray"
FINAL_STEP_BYTES = 256 * 1024    # a move's last bytes, copied on the owner thread right before its swap


def _flush_and_close(log: Log, now_ms: int) -> None:
    log.flush(now_ms)
    log.close()


def delete_dir_name(topic: str, partition: int, kind: str = DELETE_DIR_SUFFIX) -> str:
    """`<topic>-<partition>.<uuid>-delete` (or `-stray`), the topic shortened so the name fits a
    file-name component (255 bytes), as Kafka's LocalLog.logDeleteDirName does for topics of up to
    249 characters. Only the suffix matters when the dir is found at start; the rest is for people."""
    suffix = f"-{partition}.{uuid.uuid4().hex}{kind}"
    return topic[:MAX_DIR_NAME_BYTES - len(suffix)] + suffix


@dataclass(frozen=True)
class _FoundFuture:
    """A future dir found at start, with what its log dir knows of it."""
    path: Path
    clean: bool                 # its log dir was shut down cleanly
    recovery_point: int         # from its log dir's checkpoint


class LogManager:
    def __init__(self, config: LogManagerConfig, *, decompress: Decompress | None = None,
                 config_for_topic: Callable[[str], LogConfig] | None = None) -> None:
        self.config = config
        self.log_dirs = [Path(d) for d in config.log_dirs]
        self.decompress = decompress
        self._config_for_topic = config_for_topic or (lambda topic: config.log_defaults)
        self._logs: dict[TopicPartition, Log] = {}
        self._dir_of: dict[TopicPartition, Path] = {}
        self._deleting: list[tuple[int, Log, Path | None]] = []     # None: a stray's dir, kept
        self._due: dict[str, int] = {}
        self._closed = False
        self.cleaner: LogCleaner | None = None
        self._moves: dict[TopicPartition, ReplicaMove] = {}
        self._preferred_dir: dict[TopicPartition, Path] = {}
        self._mover: MoverThread | None = None
        self._futures_found: list[_FoundFuture] = []
        self._syncer = BackgroundSyncer("log-sync")
        self._flushing: set[Log] = set()      # logs with a flush job on the sync thread
        self._now_ms = 0                       # of the run_periodic under way, for completions
        # replica.alter.log.dirs.io.max.bytes.per.second: one rate over the bulk steps of every move
        self.move_quota = ByteRateQuota(config.move_max_bytes_per_second, config.move_quota_window_num,
                                        config.move_quota_window_size_seconds * 1000)

    @classmethod
    def open(cls, config: LogManagerConfig, *, now_ms: int, decompress: Decompress | None = None,
             config_for_topic: Callable[[str], LogConfig] | None = None) -> LogManager:
        """Load every partition of every log dir, recovering those not cleanly shut down."""
        manager = cls(config, decompress=decompress, config_for_topic=config_for_topic)
        for log_dir in manager.log_dirs:
            manager._load_dir(log_dir, now_ms)
        manager._resolve_futures(now_ms)
        for log_dir in manager.log_dirs:
            remove_clean_shutdown_marker(log_dir)
        manager.cleaner = LogCleaner(manager, config.cleaner)
        for tp in manager._moves:
            manager.cleaner.pause(tp)
        manager._due = {
            "retention": now_ms + config.retention_check_interval_ms,
            "recovery_points": now_ms + config.recovery_point_checkpoint_interval_ms,
            "log_start_offsets": now_ms + config.log_start_offset_checkpoint_interval_ms,
            "high_watermarks": now_ms + config.high_watermark_checkpoint_interval_ms,
        }
        return manager

    def _load_dir(self, log_dir: Path, now_ms: int) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        clean = has_clean_shutdown_marker(log_dir)
        recovery_points = OffsetCheckpointFile(log_dir / RECOVERY_POINT_CHECKPOINT).read()
        start_offsets = OffsetCheckpointFile(log_dir / LOG_START_OFFSET_CHECKPOINT).read()
        high_watermarks = OffsetCheckpointFile(log_dir / REPLICATION_CHECKPOINT).read()
        for entry in sorted(log_dir.iterdir()):
            if not entry.is_dir() or entry.name.startswith("."):
                continue
            if entry.name.endswith(DELETE_DIR_SUFFIX):
                shutil.rmtree(entry, ignore_errors=True)
                continue
            if is_future_dir_name(entry.name):
                try:
                    tp = parse_log_dir_name(entry.name)
                except InvalidTopicError:
                    continue                      # not one of ours: left alone
                self._futures_found.append(_FoundFuture(entry, clean, recovery_points.get(tp, 0)))
                continue
            try:
                tp = parse_partition_dir_name(entry.name)
            except InvalidTopicError:
                continue  # -future, -stray and foreign directories are left alone
            if tp in self._logs:
                raise StorageError(f"{tp} found in both {self._dir_of[tp]} and {log_dir}")
            self._logs[tp] = Log.open(
                entry, self._config_for_topic(tp[0]), now_ms=now_ms,
                recovery_point=recovery_points.get(tp, 0),
                log_start_offset=start_offsets.get(tp, 0),
                high_watermark=high_watermarks.get(tp, 0),
                needs_recovery=not clean, decompress=self.decompress)
            self._dir_of[tp] = log_dir

    def _resolve_futures(self, now_ms: int) -> None:
        """Future dirs found at start: beside their current log, a move under way (resumed); alone,
        a swap cut short after the current log was renamed away (the future becomes the log)."""
        for found in self._futures_found:
            entry = found.path
            tp = parse_log_dir_name(entry.name)
            if tp in self._logs:
                self._resume_move(tp, found, now_ms)
                continue
            final = entry.parent / partition_dir_name(*tp)
            entry.rename(final)
            fsync_dir(entry.parent)
            logger.info("%s-%d: finishing its move to %s", tp[0], tp[1], entry.parent)
            self._logs[tp] = Log.open(final, self._config_for_topic(tp[0]), now_ms=now_ms, needs_recovery=True,
                                      decompress=self.decompress)
            self._dir_of[tp] = entry.parent
        self._futures_found = []

    def _resume_move(self, tp: TopicPartition, found: _FoundFuture, now_ms: int) -> None:
        """A move that a crash or a restart interrupted goes on (Kafka resumes its future replica):
        the future log is opened like any log, recovered when its dir was not shut down cleanly, and
        its first round checks it against the current log (truncations -1) before the copy goes on."""
        entry, dest = found.path, found.path.parent
        current = self._logs[tp]
        if dest == self._dir_of[tp] or tp in self._moves:
            logger.warning("removing %s: %s-%d is already in that dir or moving elsewhere", entry, *tp)
            shutil.rmtree(entry, ignore_errors=True)
            return
        try:
            future = Log.open(entry, current.config, now_ms=now_ms, recovery_point=found.recovery_point,
                              log_start_offset=current.log_start_offset, high_watermark=current.high_watermark,
                              needs_recovery=not found.clean, decompress=self.decompress)
        except (OSError, StorageError) as e:     # the replica stays where it is; the move is dropped
            logger.error("removing %s: its move of %s-%d cannot go on: %s", entry, tp[0], tp[1], e)
            shutil.rmtree(entry, ignore_errors=True)
            return
        self._moves[tp] = ReplicaMove(tp[0], tp[1], future, dest, truncations=-1,
                                      recovery_point=future.recovery_point)
        logger.info("%s-%d: resuming its move from %s to %s at offset %d of [%d, %d)", tp[0], tp[1],
                    self._dir_of[tp], dest, future.log_end_offset, current.log_start_offset,
                    current.log_end_offset)

    def ensure_meta_properties(self, broker_id: int, cluster_id: str | None = None) -> str | None:
        """Check meta.properties in every dir against broker_id (and cluster_id when known), write
        it where missing; return the cluster id found on disk (or the one given)."""
        found = [m for m in (read_meta_properties(d) for d in self.log_dirs) if m is not None]
        for meta in found:
            if meta.broker_id != broker_id:
                raise InconsistentMetaPropertiesError(
                    f"broker.id {meta.broker_id} on disk, {broker_id} configured")
        cluster_ids = {m.cluster_id for m in found if m.cluster_id is not None}
        if cluster_id is not None:
            cluster_ids.add(cluster_id)
        if len(cluster_ids) > 1:
            raise InconsistentMetaPropertiesError(f"cluster ids {sorted(cluster_ids)} disagree")
        cluster = next(iter(cluster_ids), None)
        for log_dir in self.log_dirs:
            meta = read_meta_properties(log_dir)
            if meta is None or (meta.cluster_id is None and cluster is not None):
                write_meta_properties(log_dir, MetaProperties(broker_id, cluster))
        return cluster

    # ---- partitions ------------------------------------------------------------------------------

    def get_log(self, topic: str, partition: int) -> Log | None:
        return self._logs.get((topic, partition))

    def logs(self) -> Iterator[tuple[TopicPartition, Log]]:
        return iter(list(self._logs.items()))

    def log_dir_of(self, topic: str, partition: int) -> Path | None:
        return self._dir_of.get((topic, partition))

    def get_or_create_log(self, topic: str, partition: int, now_ms: int,
                          config: LogConfig | None = None) -> Log:
        tp = (topic, partition)
        log = self._logs.get(tp)
        if log is not None:
            return log
        name = partition_dir_name(topic, partition)
        counts = {d: 0 for d in self.log_dirs}
        for d in self._dir_of.values():
            counts[d] += 1
        log_dir = self._preferred_dir.pop(tp, None) or min(self.log_dirs, key=lambda d: counts[d])
        # No fsync of log_dir here, on the event loop: the new directory's entry is synced with the log's
        # first flush, on the sync thread (Log._parent_unsynced).
        log = Log.open(log_dir / name, config or self._config_for_topic(topic), now_ms=now_ms,
                       decompress=self.decompress)
        self._logs[tp] = log
        self._dir_of[tp] = log_dir
        return log

    def delete_log(self, topic: str, partition: int, now_ms: int, *, sync: bool = True, stray: bool = False) -> bool:
        """Remove a partition: its directory is renamed `<name>.<uuid>-delete` at once (so a restart
        never loads it) and removed after file.delete.delay.ms (open file slices stay readable).
        With sync=False the log dir is not fsynced here: a caller removing many logs fsyncs each
        log dir (`log_dir_of` before the call) once, before it relies on the renames. With stray=True
        the directory is renamed `<name>.<uuid>-stray` instead and kept (Kafka's stray logs: what the
        cluster no longer places here is set aside, never deleted by the broker); its files are
        closed after the same delay."""
        tp = (topic, partition)
        self._preferred_dir.pop(tp, None)
        if tp in self._moves:
            self.cancel_move(topic, partition, now_ms)
        log = self._logs.pop(tp, None)
        if log is None:
            return False
        log_dir = self._dir_of.pop(tp)
        doomed = log_dir / delete_dir_name(topic, partition, STRAY_DIR_SUFFIX if stray else DELETE_DIR_SUFFIX)
        try:
            log.dir.rename(doomed)
        except OSError:
            self._logs[tp] = log
            self._dir_of[tp] = log_dir
            raise
        if self.cleaner is not None:
            self.cleaner.on_log_deleted(tp, log, log_dir)
        if sync:
            fsync_dir(log_dir)
        self._deleting.append((now_ms + log.config.file_delete_delay_ms, log, None if stray else doomed))
        if log.config.file_delete_delay_ms == 0:
            self._remove_deleted_dirs(now_ms)
        return True

    # ---- moves between log dirs (AlterReplicaLogDirs) -------------------------------------------------

    def alter_replica_log_dir(self, topic: str, partition: int, path: str, now_ms: int) -> bool:
        """Move the partition's replica to the log dir `path` (Kafka's ReplicaManager.alterReplicaLogDirs):
        True if a move started, False if there is nothing to do (already there, or moving there).
        A move to another dir replaces one under way; a move back to the current dir cancels it.
        Raises InvalidTopicError (the future dir's name would be too long), LogDirNotFoundError (not
        one of log.dirs, by absolute path), LogDirOfflineError (the dir is gone or unwritable),
        ReplicaNotHostedError (no log here: the dir is remembered for when it is created)."""
        tp = (topic, partition)
        if len(future_dir_name(topic, partition).encode()) > MAX_DIR_NAME_BYTES:
            raise InvalidTopicError("The topic name is too long.")
        dest = next((d for d in self.log_dirs if os.path.abspath(d) == path), None)
        if dest is None:
            raise LogDirNotFoundError(f"Failed to find log dir {path}.")
        if not dest.is_dir() or not os.access(dest, os.W_OK | os.X_OK):
            raise LogDirOfflineError(f"Log directory {path} is offline")
        move = self._moves.get(tp)
        if move is not None and move.dest_dir != dest:
            self.cancel_move(topic, partition, now_ms)
        current = self._logs.get(tp)
        if current is None:
            self._preferred_dir[tp] = dest
            raise ReplicaNotHostedError(f"{topic}-{partition} has no replica on this broker")
        if self._dir_of[tp] == dest or tp in self._moves:
            return False
        future_dir = dest / future_dir_name(topic, partition)
        future = Log.open(future_dir, current.config, now_ms=now_ms, log_start_offset=current.log_start_offset,
                          high_watermark=current.high_watermark, decompress=self.decompress)
        fsync_dir(dest)
        self._moves[tp] = ReplicaMove(topic, partition, future, dest, current.truncations,
                                      recovery_point=future.recovery_point)
        if self.cleaner is not None:
            self.cleaner.pause(tp)
        logger.info("moving %s-%d from %s to %s", topic, partition, self._dir_of[tp], dest)
        return True

    def update_move_throttle(self, bytes_per_second: int) -> None:
        """Dynamic `replica.alter.log.dirs.io.max.bytes.per.second`: the next step of every move obeys it."""
        self.move_quota.update(bytes_per_second)

    def future_logs(self) -> Iterator[tuple[TopicPartition, Log, Path]]:
        """The future logs of the moves under way: (partition, future log, its destination dir)."""
        return iter([(tp, m.future, m.dest_dir) for tp, m in self._moves.items()])

    def cancel_move(self, topic: str, partition: int, now_ms: int) -> bool:
        """Stop a move under way and remove its future log (after the step in flight)."""
        move = self._moves.pop((topic, partition), None)
        if move is None:
            return False
        if move.step is not None:
            move.step.done.wait()
        if self.cleaner is not None:
            self.cleaner.resume((topic, partition))
        doomed = move.dest_dir / delete_dir_name(topic, partition)
        move.future.dir.rename(doomed)
        self._deleting.append((now_ms, move.future, doomed))
        logger.info("move of %s-%d to %s stopped", topic, partition, move.dest_dir)
        return True

    def _advance_moves(self, now_ms: int) -> None:
        """The owner's part of each move: take a finished step, hand over the next or swap."""
        for tp, move in list(self._moves.items()):
            current = self._logs.get(tp)
            if current is None:
                self.cancel_move(*tp, now_ms)
                continue
            step = move.step
            if step is not None:
                if not step.done.is_set():
                    continue
                move.step = None
                move.recovery_point = move.future.recovery_point
                if step.error is not None:
                    if not self._redo(move, current, step):
                        logger.error("moving %s-%d to %s failed: %s", tp[0], tp[1], move.dest_dir, step.error)
                        self.cancel_move(*tp, now_ms)
                        continue
                    logger.info("moving %s-%d: a step is redone: %s", tp[0], tp[1], step.error)
            self._next_step(move, current, now_ms)

    @staticmethod
    def _redo(move: ReplicaMove, current: Log, step: CopyStep) -> bool:
        """A failed step to be redone: its source went away, or the current log was truncated after
        the step was handed over (the bytes read may be a mix of old and new). Nothing was appended:
        an append parses and checks its whole buffer first."""
        if isinstance(step.error, SourceChanged):
            return True
        return current.truncations != move.truncations and isinstance(step.error, StorageError)

    def _next_step(self, move: ReplicaMove, current: Log, now_ms: int) -> None:
        future = move.future
        end = future.log_end_offset
        start_at = truncate_to = None
        if current.truncations != move.truncations:        # truncated, or resumed after a restart
            move.truncations = current.truncations
            agreed = agreed_offset(current, future)
            if agreed is None:
                start_at = current.log_start_offset
            elif agreed < end:
                truncate_to = end = agreed
        if start_at is None and not current.log_start_offset <= end <= current.log_end_offset:
            start_at = current.log_start_offset              # passed by retention: start over
        if start_at is not None:
            end, truncate_to = start_at, None
        elif truncate_to is None and end == current.log_end_offset:
            self._swap(move, current, now_ms)
            return
        try:
            # One step appends at most a segment's worth: a follower append may not be larger.
            step_bytes = min(STEP_BYTES, current.config.segment_bytes, future.config.segment_bytes)
            slices = current.read(end, step_bytes) if end < current.log_end_offset else []
        except OffsetOutOfRangeError:
            return                                          # retention moved the start: next round
        nbytes = sum(s.length for s in slices)
        if start_at is None and truncate_to is None and nbytes <= min(FINAL_STEP_BYTES, step_bytes // 4) \
                and self._finish_move(move, current, slices, now_ms):     # never throttled: see _finish_move
            return
        if slices and self.move_quota.exceeded(now_ms):
            if start_at is None and truncate_to is None:
                return                                      # over the rate: a later round copies
            slices, nbytes = [], 0                          # the cut is made now, the copy later
        self.move_quota.record(nbytes, now_ms)
        if self._mover is None:
            self._mover = MoverThread()
        move.step = CopyStep(slices, start_at, now_ms, truncate_to)
        if start_at is not None or truncate_to is not None:      # what the step cuts is not flushed
            move.recovery_point = min(move.recovery_point, end)
        self._mover.submit(move, move.step)

    def _finish_move(self, move: ReplicaMove, current: Log, slices: list, now_ms: int) -> bool:
        """The future is a few batches short of a current log that keeps taking appends: copy those here,
        between two appends (no step is in flight), and swap at once, as Kafka's alter-log-dirs thread
        swaps under the partition's lock once its fetch reached the log end. A step handed over instead
        would land after more appends, and the copy might never catch up. So this copy is not
        throttled (its bytes count towards the rate all the same), unlike the steps before it.
        False, with nothing done, when the slices are not the whole tail: the read stopped at a batch
        that did not fit in what was left of the step (a segment's small end, then a batch of about a
        segment's size); the caller hands them over as an ordinary step, so the move goes on."""
        tp = move.key
        try:
            data = b"".join(s.read() for s in slices)
            headers = list(iter_headers(data))
            if not headers or headers[-1].next_offset != current.log_end_offset:
                return False
            move.future.append_as_follower(data, now_ms)
            move.future.flush(now_ms)
            self.move_quota.record(len(data), now_ms)
        except (OSError, StorageError, ProtocolError) as e:
            logger.error("moving %s-%d to %s failed: %s", tp[0], tp[1], move.dest_dir, e)
            self.cancel_move(*tp, now_ms)
            return True
        self._swap(move, current, now_ms)
        return True

    def _swap(self, move: ReplicaMove, current: Log, now_ms: int) -> None:
        """The future log has caught up: it becomes the partition's log, in the destination dir."""
        tp = move.key
        source_dir = self._dir_of[tp]
        future = move.future
        future.close()
        doomed = source_dir / delete_dir_name(*tp)
        final = move.dest_dir / partition_dir_name(*tp)
        try:
            current.dir.rename(doomed)
            fsync_dir(source_dir)
            future.dir.rename(final)
            fsync_dir(move.dest_dir)
            moved = Log.open(final, current.config, now_ms=now_ms, recovery_point=future.log_end_offset,
                             log_start_offset=current.log_start_offset, high_watermark=current.high_watermark,
                             decompress=self.decompress)
        except (OSError, StorageError) as e:
            logger.error("moving %s-%d to %s failed in its last step: %s", tp[0], tp[1], move.dest_dir, e)
            if doomed.exists() and not current.dir.exists():
                doomed.rename(current.dir)
            del self._moves[tp]
            if self.cleaner is not None:
                self.cleaner.resume(tp)
            target = final if final.exists() and not future.dir.exists() else future.dir
            shutil.rmtree(target, ignore_errors=True)
            return
        del self._moves[tp]
        moved.producer_state.producer_id_expiration_ms = current.producer_state.producer_id_expiration_ms
        previous = current.adopt(moved)
        self._dir_of[tp] = move.dest_dir
        if self.cleaner is not None:
            self.cleaner.move_checkpoint(tp, source_dir, move.dest_dir)
            self.cleaner.resume(tp)
        self._deleting.append((now_ms + previous.config.file_delete_delay_ms, previous, doomed))
        logger.info("%s-%d moved from %s to %s", tp[0], tp[1], source_dir, move.dest_dir)

    @staticmethod
    def delete_topic_dirs(log_dirs: Iterable[str | Path], topics: set[str]) -> int:
        """Before `open`: rename every partition directory of these topics to a `-delete` name and
        fsync each log dir, so `open` never loads (or recovers) them and removes them instead.
        Returns how many were renamed."""
        renamed = 0
        for log_dir in map(Path, log_dirs):
            if not log_dir.is_dir():
                continue
            touched = False
            for entry in log_dir.iterdir():
                if not entry.is_dir() or entry.name.endswith(DELETE_DIR_SUFFIX):
                    continue
                try:
                    topic, partition = parse_log_dir_name(entry.name)   # current or future
                except InvalidTopicError:
                    continue
                if topic in topics:
                    entry.rename(log_dir / delete_dir_name(topic, partition))
                    touched = True
                    renamed += 1
            if touched:
                fsync_dir(log_dir)
        return renamed

    def _remove_deleted_dirs(self, now_ms: int, *, here: bool = False) -> None:
        """Remove the deleted partitions' directories that are due: their files are closed here and the
        directory removed on the sync thread (or `here`, once that thread is closed)."""
        keep = []
        for due, log, path in self._deleting:
            if due <= now_ms and not (self.cleaner is not None and self.cleaner.is_cleaning(log)):
                log.release()
                if path is None:
                    continue                # a stray: its files closed, its dir kept
                if here:
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    self._syncer.submit(("remove", path),
                                        functools.partial(shutil.rmtree, path, ignore_errors=True))
            else:
                keep.append((due, log, path))
        self._deleting = keep

    def _unlink_in_background(self, paths: list[Path]) -> None:
        """Segment.delete's unlink, on the sync thread: freeing a cached GiB takes about 250 ms."""
        self._syncer.submit(("remove", paths[0]), functools.partial(unlink_files, paths),
                            lambda _result, error, p=paths[0]: error and logger.warning(
                                "cannot remove %s: %s", p.name, error))

    # ---- periodic tasks --------------------------------------------------------------------------

    def run_periodic(self, now_ms: int) -> int:
        """Run the disk tasks that are due; return the time (ms) they next want to run."""
        self._now_ms = now_ms
        self._syncer.run_completions()
        if self.cleaner is not None:
            self.cleaner.run_owner_tasks(now_ms)
        if self._moves:
            self._advance_moves(now_ms)
        self._remove_deleted_dirs(now_ms)
        default_keep = self.config.drop_behind_bytes
        pending = [t for t, _, _ in self._deleting]
        # Every log is visited on every call (10 a second): a quiet one costs two checks, so 2,000
        # idle partitions no longer take 8% of a core (a list, three calls and a generator each).
        for log in list(self._logs.values()):
            if log.has_pending_deletes:
                log.delete_expired_files(now_ms, self._unlink_in_background)
                if (t := log.next_file_delete_ms) is not None:
                    pending.append(t)
            if log not in self._flushing and log.flush_due(now_ms) is not None:
                self._flush_in_background(log, now_ms)
            keep = default_keep if log.cache_keep_bytes is None else log.cache_keep_bytes
            if keep:
                self._drop_behind(log, keep)
        c = self.config
        if now_ms >= self._due["retention"]:
            self.run_retention(now_ms)
            self._due["retention"] = now_ms + c.retention_check_interval_ms
            pending = [t for t, _, _ in self._deleting]       # retention set segments aside: ask again
            pending += [t for _, log in self.logs() if (t := log.next_file_delete_ms) is not None]
        if now_ms >= self._due["recovery_points"]:
            self.checkpoint_recovery_points(background=True)
            self._due["recovery_points"] = now_ms + c.recovery_point_checkpoint_interval_ms
        if now_ms >= self._due["log_start_offsets"]:
            self.checkpoint_log_start_offsets(background=True)
            self._due["log_start_offsets"] = now_ms + c.log_start_offset_checkpoint_interval_ms
        if now_ms >= self._due["high_watermarks"]:
            self.checkpoint_high_watermarks(background=True)
            self._due["high_watermarks"] = now_ms + c.high_watermark_checkpoint_interval_ms
        return min([*self._due.values(), *pending])

    def run_retention(self, now_ms: int) -> int:
        """Apply retention to every log now; return how many segments were deleted."""
        return sum(retention.apply_retention(log, now_ms) for _, log in self.logs())

    def clean_now(self, now_ms: int):
        """One cleaning pass over the filthiest compacted log, in this thread (see cleaner.py)."""
        return self.cleaner.clean_now(now_ms) if self.cleaner is not None else None

    @property
    def cleaner_stats(self) -> CleanerStats | None:
        return self.cleaner.stats if self.cleaner is not None else None

    def update_cleaner_config(self, config: CleanerConfig) -> None:
        """Dynamic `log.cleaner.*` changes: the cleaner's threads restart with them."""
        if self.cleaner is not None:
            self.cleaner.update_config(config)

    def flush_all(self, now_ms: int) -> None:
        for _, log in self.logs():
            log.flush(now_ms)

    def checkpoint_recovery_points(self, *, background: bool = False) -> None:
        self._write_checkpoints(RECOVERY_POINT_CHECKPOINT, lambda log: log.recovery_point,
                                lambda move: move.recovery_point, background=background)

    def checkpoint_log_start_offsets(self, *, background: bool = False) -> None:
        self._write_checkpoints(LOG_START_OFFSET_CHECKPOINT, lambda log: log.log_start_offset,
                                background=background)

    def checkpoint_high_watermarks(self, *, background: bool = False) -> None:
        self._write_checkpoints(REPLICATION_CHECKPOINT, lambda log: log.high_watermark, background=background)

    def _write_checkpoints(self, name: str, value: Callable[[Log], int],
                           future_value: Callable[[ReplicaMove], int] | None = None, *,
                           background: bool = False) -> None:
        """Each dir's entries: its current logs and, given `future_value`, the future logs moving to it
        (from what the owner knows of them: the mover thread may be changing the logs themselves).
        The entries are taken now; with `background`, the file is written and synced on the sync
        thread (after the writes of it submitted before, replacing one still waiting)."""
        for log_dir in self.log_dirs:
            offsets = {tp: value(log) for tp, log in self._logs.items()
                       if self._dir_of[tp] == log_dir}
            if future_value is not None:
                offsets.update((tp, future_value(m)) for tp, m in self._moves.items() if m.dest_dir == log_dir)
            checkpoint = OffsetCheckpointFile(log_dir / name)
            if background:
                self._syncer.submit(("checkpoint", checkpoint.path), lambda c=checkpoint, o=offsets: c.write(o),
                                    lambda _result, error, c=checkpoint: error and logger.error(
                                        "cannot write %s: %s", c.path, error))
            else:
                checkpoint.write(offsets)

    def _flush_in_background(self, log: Log, now_ms: int) -> None:
        """The periodic flush of `log` (rolled segments; everything after flush.ms), synced on the sync
        thread; its recovery point moves when the sync is done (a later run_periodic)."""
        if log in self._flushing:
            return
        up_to = log.flush_due(now_ms)
        job = log.flush_job(up_to) if up_to is not None else None
        if job is None:
            return
        self._flushing.add(log)

        def done(_result: object, error: BaseException | None) -> None:
            self._flushing.discard(log)
            if error is not None:
                logger.error("cannot flush %s up to offset %d: %s", log.dir.name, job.up_to, error)
            else:
                log.flushed(job, self._now_ms)
        self._syncer.submit(("flush", log), job.run, done)

    def _drop_behind(self, log: Log, keep_bytes: int) -> None:
        """Drop what `log` no longer needs cached (page_cache.py), on the sync thread: after the syncs
        submitted before, a newer drop of a file replacing one still waiting."""
        for path, length in log.cache_drops(keep_bytes):
            self._syncer.submit(("drop-cache", path), functools.partial(drop_cached, path, length),
                                lambda _result, error, p=path: error and logger.warning(
                                    "cannot drop %s from the page cache: %s", p.name, error))

    def _close_logs(self, now_ms: int, threads_per_dir: int) -> None:
        """Each log flushed then closed (its fsyncs: segment, indexes, leader epochs, producer snapshot,
        directory), the logs of a dir on `threads_per_dir` threads, every dir at once; the first error
        is raised once all are done, so no checkpoint or marker follows it.

        One thread syncing 2,000 logs one after the other waited for a journal commit at almost every
        fsync (about 16,000 of them, 4-5 ms each on a virtual disk: 6-7 s of SIGTERM); fsyncs release
        the GIL, and the filesystem commits those of concurrent threads together: with 2 threads the
        same syncs took a tenth of the time. Each log's own order of writes and syncs is unchanged."""
        logs = list(self._logs.values())
        if threads_per_dir <= 1 or len(logs) <= 1:
            for log in logs:
                _flush_and_close(log, now_ms)
            return
        pools = {d: ThreadPoolExecutor(threads_per_dir, thread_name_prefix=f"log-close-{i}")
                 for i, d in enumerate(self.log_dirs)}
        try:
            futures = [pools[self._dir_of[tp]].submit(_flush_and_close, log, now_ms)
                       for tp, log in self._logs.items()]
        finally:
            for pool in pools.values():
                pool.shutdown(wait=True)
        for future in futures:
            future.result()

    def sync_background(self, timeout: float | None = None) -> bool:
        """Wait for the flushes and checkpoint writes on the sync thread, and apply what they did."""
        return self._syncer.drain(timeout)

    def close(self, now_ms: int, threads_per_dir: int = 1) -> None:
        """Clean shutdown: flush and close every log, write every checkpoint, then the markers. The
        logs of each dir are flushed and closed on `threads_per_dir` threads (Kafka's
        num.recovery.threads.per.data.dir, as its LogManager.shutdown), see `_close_logs`."""
        if self._closed:
            return
        self._closed = True
        if self.cleaner is not None:
            self.cleaner.shutdown()
        if self._mover is not None:
            self._mover.stop()
        self._now_ms = now_ms
        self._syncer.close()    # what it was writing done first: the checkpoints below are the last word
        for move in self._moves.values():      # resumed at the next start
            move.step = None
            move.future.flush(now_ms)
            move.recovery_point = move.future.recovery_point
            move.future.close()
        self._close_logs(now_ms, threads_per_dir)
        self.checkpoint_recovery_points()
        self.checkpoint_log_start_offsets()
        self.checkpoint_high_watermarks()
        self._moves.clear()
        self._remove_deleted_dirs(2**63 - 1, here=True)
        for log_dir in self.log_dirs:
            write_clean_shutdown_marker(log_dir)
