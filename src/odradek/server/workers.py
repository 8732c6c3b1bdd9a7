"""The broker's bounded worker pool: where work whose cost grows with its input runs, off the event loop
(DESIGN, "Performance principles": "The event loop only moves bytes and state").

Decompression, legacy conversion, per-record validation of large batches, index scans, large topic
operations and metadata-store writes go through `WorkerPool.run`. The pool has `num.io.threads` threads
(Kafka's request handler threads) and admits at most `threads + queue_max` calls at once; a caller past
that waits on the loop (its connection is muted while it waits, so the bytes of further requests stay
in the kernel) instead of growing a queue.

The GIL still lets the loop thread run every `sys.getswitchinterval()` (5 ms) while a worker holds it,
and the heavy parts (zlib, cramjam, numpy, file I/O) release it, so an unrelated client's request is
answered while a worker grinds.

Lanes share the pool fairly: `lane(name)` is a view of the pool through which at most `LANE_SHARE` of
its threads (at least one, fewer than all when there are two or more; one of the default eight) run
that kind of work at once, admitted first come, first served. Down-conversion for old consumers (`CONVERSION_LANE`) goes through
one, a bounded step per call: any number of conversions, from any number of connections, take turns
on the lane's threads a step each, and the other threads stay free for everything else (a
producer's validation, index lookups), so one client's conversions never starve another's requests.
Conversion is Python work that holds the GIL, so more threads would not convert faster, only make
the event loop wait longer for the GIL. (Kafka shares its request handler threads and offers
`message.downconversion.enable` to turn conversion off.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
from typing import Any, Callable, Protocol, TypeVar

T = TypeVar("T")

CONVERSION_LANE = "down-conversion"
LANE_SHARE = 0.125     # of the threads, for one lane's work at once


class WorkerPool:
    """`threads` threads; at most `threads + queue_max` calls admitted at once (bounded, never a list
    that grows with the clients)."""

    def __init__(self, threads: int, queue_max: int = 0, name: str = "odradek-worker") -> None:
        if threads < 1:
            raise ValueError("a worker pool needs at least one thread")
        self.threads = threads
        self.queue_max = max(0, queue_max)
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        self._admitted: asyncio.Semaphore | None = None
        self._closed = False
        self._lanes: dict[str, Lane] = {}

    @property
    def admitted_max(self) -> int:
        return self.threads + self.queue_max

    async def run(self, fn: Callable[..., T], /, *args: object, **kwargs: object) -> T:
        """Run `fn(*args, **kwargs)` on a worker thread and return its result (or raise its exception).
        Waits, without queueing anything, while the pool is full."""
        if self._closed:
            raise RuntimeError("the worker pool is closed")
        if self._admitted is None:
            self._admitted = asyncio.Semaphore(self.admitted_max)
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        async with self._admitted:
            return await loop.run_in_executor(self._executor, call)

    def lane(self, name: str) -> "Lane":
        """The pool as seen by one kind of work: at most `lane_threads` of its calls at once."""
        lane = self._lanes.get(name)
        if lane is None:
            lane = self._lanes[name] = Lane(self, lane_threads(self.threads))
        return lane

    def close(self) -> None:
        """Stop admitting work; threads finish what they hold, without blocking the caller."""
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)


def lane_threads(threads: int) -> int:
    """How many of `threads` one lane may use at once: `LANE_SHARE` of them, at least one, and one
    less than all when there are two or more."""
    return max(1, min(threads - 1, int(threads * LANE_SHARE)))


class Lane:
    """A kind of work on a pool: its calls wait their turn (first come, first served) for one of
    `limit` places, then run on the pool as any call does."""

    def __init__(self, pool: WorkerPool, limit: int) -> None:
        self.pool = pool
        self.limit = limit
        self._places: asyncio.Semaphore | None = None

    async def run(self, fn: Callable[..., T], /, *args: object, **kwargs: object) -> T:
        if self._places is None:
            self._places = asyncio.Semaphore(self.limit)
        async with self._places:
            return await self.pool.run(fn, *args, **kwargs)

    def lane(self, name: str) -> "Lane":
        return self.pool.lane(name)


class Workers(Protocol):
    """What callers need of a pool: `WorkerPool`, or `InlinePool` in tests."""

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T: ...

    def lane(self, name: str) -> "Workers": ...


def inline_pool() -> "InlinePool":
    """A pool that runs calls on the caller's thread: for unit tests of handlers (no threads)."""
    return InlinePool()


class InlinePool:
    threads = 1
    queue_max = 0
    admitted_max = 1

    async def run(self, fn: Callable[..., T], /, *args: object, **kwargs: object) -> T:
        return fn(*args, **kwargs)

    def lane(self, name: str) -> "InlinePool":
        return self

    def close(self) -> None:
        pass
