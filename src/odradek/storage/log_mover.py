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
- when the future has caught up with the current log's end offset, the owner swaps them at once,
  between two appends: the future log is closed, the current dir renamed `-delete` (its files stay
  readable for fetches in flight until file.delete.delay.ms), the future dir renamed to
  `<topic>-<partition>` and opened, and the partition's Log object takes it over (`Log.adopt`).
The copy starts again from the current log start offset when the current log was truncated (a
follower's truncation) or retention passed the future's end. A step that fails (a disk error in the
destination) abandons the move and removes the future log; the replica stays where it was.

A crash during a move leaves a future dir beside the current one: at start it is removed (the move is
not resumed, unlike Kafka's). A crash during the swap, after the current dir was renamed away, leaves a
complete future dir alone: at start it becomes the partition's dir.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path

from odradek.storage.fileslice import FileSlice
from odradek.storage.log import Log

log = logging.getLogger("odradek.storage")

STEP_BYTES = 4 * 1024 * 1024


@dataclass(eq=False)
class CopyStep:
    """One hand-over: reset the future at `start_at` (if set), then append these slices."""
    slices: list[FileSlice]
    start_at: int | None
    now_ms: int
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


@dataclass(eq=False)
class ReplicaMove:
    topic: str
    partition: int
    future: Log
    dest_dir: Path
    truncations: int          # the current log's truncation count the copy is based on
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
            except BaseException as e:      # handed to the owner, which abandons the move
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
    if step.slices:
        future.append_as_follower(b"".join(s.read() for s in step.slices), step.now_ms)
    future.flush(step.now_ms)
