"""Delayed produce: acks=all answers waiting for the high watermark (seed 003, "Replication": "a
message is considered committed when all in sync replicas have applied it"; the producer "can choose to
wait for the message to be committed"; Kafka's DelayedProduce and its purgatory).

Each waiting request registers one entry per partition it wrote, at the offset its append ended, in
that partition's heap ordered by offset. Whenever something that can answer a waiter happens to a
partition (its high watermark moves, its ISR or leadership changes, it stops), the replica manager calls
`check(key)`: the entries at the top of the heap whose status is now known are popped and answered, and
the first one still waiting ends the pass, since every entry below it ended at a larger offset. So a
follower fetch that moves the high watermark costs the entries it answers plus one comparison, however
many requests wait (Kafka's `checkAndComplete` on the partition's key does the same work, per waiter).
A request waits on one future and one timer for all its partitions; when its timeout passes first, its
entries are taken out and the partitions still waiting answer REQUEST_TIMED_OUT.

Bounds: a connection has at most network.MAX_PENDING_ANSWERS requests waiting, each with one entry per
partition it wrote (a Produce request's partitions were bounded when it was decoded).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Hashable, Sequence
from typing import Callable, Generic, Protocol, TypeVar

from odradek.protocol.error_codes import ErrorCode


class Keyed(Protocol):
    @property
    def key(self) -> Hashable: ...


P = TypeVar("P", bound=Keyed)

# (partition, required offset) -> the answer, or None while the high watermark is below the offset
Status = Callable[[P, int], "ErrorCode | None"]


class _Waiter:
    __slots__ = ("codes", "left", "future")

    def __init__(self, codes: list[ErrorCode | None], future: asyncio.Future[None]) -> None:
        self.codes = codes
        self.left = sum(1 for c in codes if c is None)
        self.future = future

    def answer(self, index: int, code: ErrorCode) -> None:
        if self.codes[index] is None:
            self.codes[index] = code
            self.left -= 1
            if self.left == 0 and not self.future.done():
                self.future.set_result(None)


# heap entry: (required offset, sequence, waiter, index into its codes, partition)
_Entry = tuple[int, int, _Waiter, int, object]


class DelayedProduces(Generic[P]):
    """The acks=all requests waiting on this broker's partitions."""

    def __init__(self, status: Status[P]) -> None:
        self._status = status
        self._heaps: dict[Hashable, list[_Entry]] = {}
        self._seq = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def wait(self, required: Sequence[tuple[P, int]], codes: list[ErrorCode | None],
                   timeout_s: float) -> list[ErrorCode]:
        """Wait until every partition whose code is None has one (by `check`), or `timeout_s` passes
        (REQUEST_TIMED_OUT for those left). `codes` holds what was already known, by index."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        waiter = _Waiter(codes, loop.create_future())
        if waiter.left == 0 or timeout_s <= 0:
            return [c if c is not None else ErrorCode.REQUEST_TIMED_OUT for c in codes]
        entries: list[_Entry] = []
        for i, ((part, offset), code) in enumerate(zip(required, codes)):
            if code is None:
                entry: _Entry = (offset, next(self._seq), waiter, i, part)
                heapq.heappush(self._heaps.setdefault(part.key, []), entry)
                entries.append(entry)
        timer = loop.call_later(timeout_s, _expire, waiter.future)
        try:
            await waiter.future
        finally:
            timer.cancel()
            if waiter.left:
                self._forget(entries)
        return [c if c is not None else ErrorCode.REQUEST_TIMED_OUT for c in codes]

    def check(self, key: Hashable) -> None:
        """Answer the waiters on partition `key` whose answer is now known."""
        heap = self._heaps.get(key)
        while heap:
            offset, _, waiter, index, part = heap[0]
            if waiter.codes[index] is None:
                code = self._status(part, offset)   # type: ignore[arg-type]
                if code is None:
                    return
                waiter.answer(index, code)
            heapq.heappop(heap)
        if heap is not None:
            del self._heaps[key]

    def waiting(self) -> int:
        """Partitions' entries still held (answered ones are dropped as they surface)."""
        return sum(len(h) for h in self._heaps.values())

    def _forget(self, entries: list[_Entry]) -> None:
        """A waiter gone (timed out, cancelled): its entries leave their heaps."""
        for entry in entries:
            key = entry[4].key  # type: ignore[attr-defined]
            heap = self._heaps.get(key)
            if heap is None:
                continue
            try:
                heap.remove(entry)
            except ValueError:
                continue
            if heap:
                heapq.heapify(heap)
            else:
                del self._heaps[key]


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
