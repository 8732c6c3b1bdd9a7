"""Moving a replica between the log dirs of one broker (AlterReplicaLogDirs; seed 003,
"AlterReplicaLogDirs API"; Kafka's future replica and ReplicaAlterLogDirsThread).

A move builds a future log in the destination dir, `<topic>-<partition>.<uuid>-future/`, and copies
the current log into it batch for batch (offsets, leader epochs, producer state and transaction index
as the current log has them, the way a follower appends). The log manager's owner thread (the event
loop, through `LogManager.run_periodic`) and one mover thread share the work, as with the cleaner:
- the owner reads at most `STEP_BYTES` of slices of the current log from the future's end offset (an
  index lookup; the current log is only ever touched by its owner) and hands them over;
- the mover thread reads those bytes, appends them to the future log (which only it touches while a
  step is in flight) and fsyncs it;
- when the future is only a few batches short of the current log's end offset (at most
  `FINAL_STEP_BYTES` of the manager), the owner copies those itself and swaps at once, between two
  appends (a step handed over would land after the appends made meanwhile, and a log that takes a
  follower's fetch every round would never be caught; Kafka swaps under the partition's lock once its
  alter-log-dirs fetch reached the log end): the future log is closed, the current dir renamed `-delete` (its files stay
  readable for fetches in flight until file.delete.delay.ms), the future dir renamed to
  `<topic>-<partition>` and opened, and the partition's Log object takes it over (`Log.adopt`).

The steps handed over are throttled by the broker's `replica.alter.log.dirs.io.max.bytes.per.second`
(dynamic; unset is Kafka's Long.MAX_VALUE, no throttle), one rate over every move of the broker as
Kafka's alter-log-dirs threads share one quota, measured over
`alter.log.dirs.replication.quota.window.num` windows of `...window.size.seconds` (quota.py): while
the bytes counted are over the rate the owner hands no step over and looks again the next round (the
event loop is never held), so a changed rate applies from the next step. The owner's own last copy
before the swap is never held back, since holding it would let the appends run ahead again; its bytes
count towards the rate. A cut of the future (below) is made at once; only its copy waits.

When the current log was truncated (a follower's truncation to its leader), the future is cut back to
where the two agree, found by their leader epochs as a follower finds where it leaves its leader
(`agreed_offset`, Kafka's OffsetsForLeaderEpoch truncation); without epochs to tell, the copy starts
again from the current log start offset, as it does when retention or DeleteRecords moved the current
log start past the future's end. A step whose source bytes went away under it (a segment deleted or
cut after its slices were handed over) is only redone; a step that fails in the destination (a disk
error) abandons the move and removes the future log; the replica stays where it was.

The log cleaner leaves a partition alone while it moves (Kafka's abortAndPauseCleaning and
resumeCleaning): a pass under way is dropped before its next swap, none starts until the move ends,
and the future log is never cleaned, so the copy ends byte for byte what the current log holds; the
first dirty offset (cleaner-offset-checkpoint) goes with the replica to its new dir. Retention keeps
running on the current log.

A crash or restart during a move leaves a future dir beside the current one; at start it becomes a
move under way again, as Kafka resumes its future replica: the future log is opened like any log
(recovered from its recovery point, checkpointed in its own dir, when the dir was not shut down
cleanly), checked against the current log by leader epochs and copied on from where it stands. A crash
during the swap, after the current dir was renamed away, leaves a complete future dir alone: at start
it becomes the partition's dir.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path

from odradek.storage.errors import StorageError
from odradek.storage.fileslice import FileSlice
from odradek.storage.log import Log

log = logging.getLogger("odradek.storage")

STEP_BYTES = 4 * 1024 * 1024


class SourceChanged(StorageError):
    """The current log's bytes a step was to copy went away under it: the step is redone, the move
    goes on."""


@dataclass(eq=False)
class CopyStep:
    """One hand-over: reset the future at `start_at` or cut it back to `truncate_to` (if set), then
    append these slices."""
    slices: list[FileSlice]
    start_at: int | None
    now_ms: int
    truncate_to: int | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


@dataclass(eq=False)
class ReplicaMove:
    topic: str
    partition: int
    future: Log
    dest_dir: Path
    truncations: int          # the current log's truncation count the copy is based on (-1: check it)
    recovery_point: int = 0   # the future's, as of its last finished step (checkpointed in dest_dir)
    step: CopyStep | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)


class MoverThread(threading.Thread):
    """Runs the copy steps of every move, one at a time, in the order handed over."""

    def __init__(self) -> None:
        super().__init__(name="odradek-log-mover", daemon=True)
        # At most one step per move is in flight, so this holds at most one per partition.
        self.steps: queue.SimpleQueue[tuple[ReplicaMove, CopyStep] | None] = queue.SimpleQueue()

    def submit(self, move: ReplicaMove, step: CopyStep) -> None:
        if not self.is_alive():
            self.start()
        self.steps.put((move, step))

    def run(self) -> None:
        while True:
            item = self.steps.get()
            if item is None:
                return
            move, step = item
            try:
                copy(move.future, step)
            except BaseException as e:      # handed to the owner, which redoes the step or abandons the move
                step.error = e
            finally:
                step.done.set()

    def stop(self) -> None:
        """Finish the step in hand and stop (the owner then closes the future logs)."""
        if self.is_alive():
            self.steps.put(None)
            self.join()


def copy(future: Log, step: CopyStep) -> None:
    """One step on the mover thread: bounded by the slices' bytes (STEP_BYTES)."""
    if step.start_at is not None:
        future.truncate_fully_and_start_at(step.start_at, step.now_ms)
    elif step.truncate_to is not None:
        future.truncate_to(step.truncate_to, step.now_ms)
    if step.slices:
        try:
            data = b"".join(s.read() for s in step.slices)
        except (OSError, ValueError, StorageError) as e:   # ValueError: the segment file was closed
            raise SourceChanged(f"the current log changed under the copy: {e}") from e
        future.append_as_follower(data, step.now_ms)
    future.flush(step.now_ms)
    future.delete_expired_files(step.now_ms)


def agreed_offset(current: Log, future: Log) -> int | None:
    """The offset below which the future log holds what the current log holds, found by their leader
    epochs (Kafka's follower truncation by OffsetsForLeaderEpoch): the newest epoch both logs know ends
    at the smaller of its two ends, since one leader wrote each epoch's records and both logs hold a
    prefix of them. None when they share no epoch (nothing tells where they agree)."""
    in_current = {epoch for epoch, _ in current.leader_epoch_cache.entries()}
    entries = future.leader_epoch_cache.entries()
    for i in range(len(entries) - 1, -1, -1):
        epoch = entries[i][0]
        if epoch not in in_current:
            continue
        future_end = entries[i + 1][1] if i + 1 < len(entries) else future.log_end_offset
        _, current_end = current.leader_epoch_cache.end_offset_for(epoch, current.log_end_offset)
        return min(future_end, current_end)
    return None
