"""Disk syncs off the broker's event loop (seed 003, "Persistence": the log is written to the page
cache and flushed to disk later; Kafka's `kafka-scheduler` threads run the "flush-log" task after a
segment roll and write the offset checkpoints, so no request thread ever waits for an fsync).

An fsync waits for the disk, and under heavy writes much longer than the bytes it covers: with ext4's
ordered mode, syncing a 100-byte checkpoint file commits the journal, which first writes out every
dirty data block the commit covers. Measured on a 3-broker cluster taking 1 KiB acks=all writes at
RF 3: a checkpoint took 100-230 ms to sync and a rolled 1 GiB segment 400-450 ms, on the event loop,
so every request on the broker stood still meanwhile.

`BackgroundSyncer` is one thread and a queue of jobs by key. A job submitted under the key of one still
waiting replaces it (the newer checkpoint contents or the longer flush cover the older), so the queue
holds at most one job per checkpoint file and per log: it is bounded by what the broker hosts. Jobs
run in submission order. A job's result (what it returns, or the OSError it raised) goes to a
completion list the owner collects with `completed()` on its own thread, so the state the owner keeps
(a log's recovery point) only ever changes there. `drain()` waits for every job submitted so far;
`close()` drains and stops the thread.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

log = logging.getLogger("odradek.storage")

Job = Callable[[], Any]
Done = Callable[[Any, BaseException | None], None]


class BackgroundSyncer:
    def __init__(self, name: str = "log-sync") -> None:
        self.name = name
        self._jobs: OrderedDict[Hashable, tuple[Job, Done | None]] = OrderedDict()
        self._done: list[tuple[Done, Any, BaseException | None]] = []
        self._cond = threading.Condition()
        self._running = False           # a job taken off the queue and not finished
        self._stopping = False
        self._thread: threading.Thread | None = None

    def submit(self, key: Hashable, job: Job, done: Done | None = None) -> None:
        """Run `job` on the sync thread, after the jobs before it; `done(result, error)` is handed to
        the owner through `completed()`. Replaces a job still waiting under the same key."""
        with self._cond:
            if self._stopping:
                raise RuntimeError(f"{self.name} is closed")
            self._jobs.pop(key, None)
            self._jobs[key] = (job, done)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def pending(self, key: Hashable) -> bool:
        """A job under `key` is waiting (not yet started)."""
        with self._cond:
            return key in self._jobs

    def completed(self) -> list[tuple[Done, Any, BaseException | None]]:
        """The completions of finished jobs since the last call, in order: (done, result, error)."""
        with self._cond:
            out, self._done = self._done, []
        return out

    def run_completions(self) -> int:
        """Call the finished jobs' `done` callbacks here, on the owner's thread; how many ran."""
        done = self.completed()
        for callback, result, error in done:
            callback(result, error)
        return len(done)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every job submitted so far has run (then run their completions here)."""
        with self._cond:
            finished = self._cond.wait_for(lambda: not self._jobs and not self._running, timeout)
        self.run_completions()
        return finished

    def close(self, timeout: float | None = None) -> None:
        """Run what is queued, then stop the thread."""
        self.drain(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        self.run_completions()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._jobs or self._stopping)
                if not self._jobs:
                    return
                _, (job, done) = self._jobs.popitem(last=False)
                self._running = True
            result: Any = None
            error: BaseException | None = None
            try:
                result = job()
            except OSError as e:
                error = e
            except Exception as e:          # a bug in a job: reported, the thread goes on
                log.exception("background sync job failed")
                error = e
            with self._cond:
                self._running = False
                if done is not None:
                    self._done.append((done, result, error))
                self._cond.notify_all()
