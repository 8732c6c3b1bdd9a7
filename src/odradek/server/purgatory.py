"""Waiting rooms for requests that cannot be answered yet (Kafka's purgatory).

A delayed Fetch waits until enough bytes arrive (`min_bytes`) or `max_wait_ms` passes; a delayed
Produce with acks=all waits until the high watermark passes its last offset or its timeout fires.
Waiters register on partition keys and are woken by `notify(key)` when that partition's log end
offset or high watermark moves. Every waiting list is bounded by the connections that feed it: a
connection handles one request at a time, so there is at most one waiter per connection.

A request waiting here is parked (`network.Parked`): it does not count in `queued.max.requests`
meanwhile, so idle long polls never hold the budget other connections need (Kafka's handler threads
leave a delayed fetch in its purgatory the same way). How long a fetch may wait is capped by the
broker (`fetch.purgatory.max.wait.ms`, see `apis/fetch.py`).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Hashable, Sequence

from odradek.server.network import Parked


class Purgatory:
    def __init__(self) -> None:
        self._waiters: dict[Hashable, set[asyncio.Future[Hashable]]] = defaultdict(set)
        # The loop, held once known: asyncio.get_running_loop() costs a getpid() system call on
        # every call (CPython 3.11), and a busy leader waits here thousands of times a second.
        self._loop: asyncio.AbstractEventLoop | None = None

    def notify(self, key: Hashable) -> None:
        waiters = self._waiters.pop(key, None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(key)

    async def wait_any(self, keys: Sequence[Hashable], timeout_s: float) -> bool:
        """Wait until one of keys is notified (True) or the timeout passes (False)."""
        if timeout_s <= 0:
            return False
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        fut: asyncio.Future[Hashable] = loop.create_future()
        for k in keys:
            self._waiters[k].add(fut)
        timer = loop.call_later(timeout_s, _expire, fut)
        try:
            with Parked():
                return await fut is not _EXPIRED
        finally:
            timer.cancel()
            for k in keys:
                s = self._waiters.get(k)
                if s is not None:
                    s.discard(fut)
                    if not s:
                        del self._waiters[k]

    def waiting(self) -> int:
        return sum(len(s) for s in self._waiters.values())


_EXPIRED = object()


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(_EXPIRED)
