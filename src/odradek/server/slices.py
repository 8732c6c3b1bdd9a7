"""Bounded slices of event-loop work (DESIGN, "Performance principles": work that grows with its
input runs on the worker pool or in bounded slices, so no client can freeze the others).

Work that must stay on the event loop (it touches state that is not thread-safe, such as the log
manager) runs as a loop over items that calls `await slices.pause()` after each one: the loop is
given back once SLICE_S of work has run since the last pause. A request on another connection needs a
few loop turns to be read, handled and answered, so a slice is kept to a few milliseconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

SLICE_S = 0.005


class Slices:
    def __init__(self, slice_s: float = SLICE_S) -> None:
        self.slice_s = slice_s
        self._deadline = time.monotonic() + slice_s

    async def pause(self) -> None:
        """Give the loop back if this slice has run its time."""
        now = time.monotonic()
        if now >= self._deadline:
            await asyncio.sleep(0)
            self._deadline = time.monotonic() + self.slice_s


async def run_sliced(steps: Iterator[None], slices: Slices | None = None) -> None:
    """Run a generator that yields after each item, in slices."""
    slices = slices or Slices()
    for _ in steps:
        await slices.pause()


def run_now(steps: Iterator[None]) -> None:
    """Run the same generator without giving the loop back (at start, or for small internal work)."""
    for _ in steps:
        pass
