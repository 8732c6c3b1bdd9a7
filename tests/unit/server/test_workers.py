"""The worker pool's lanes (server/workers.py): a kind of work holds at most its share of the threads,
its calls take turns first come, first served, and other work still finds a free thread at once."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from odradek.server.workers import CONVERSION_LANE, WorkerPool, lane_threads


@pytest.mark.parametrize("threads, expected", [(1, 1), (2, 1), (8, 1), (16, 2), (32, 4)])
def test_a_lane_holds_a_share_of_the_threads(threads, expected):
    assert lane_threads(threads) == expected


def test_other_work_runs_at_once_while_a_lane_is_full():
    """Sixteen threads, 40 lane calls that each block until released: at most two run at once, and a
    call outside the lane (a producer's validation) is answered while all of them wait."""
    pool = WorkerPool(16, queue_max=500)
    release = threading.Event()
    running = []
    peak = []
    lock = threading.Lock()

    def blocking(i: int) -> int:
        with lock:
            running.append(i)
            peak.append(len(running))
        release.wait(30)
        with lock:
            running.remove(i)
        return i

    async def main() -> tuple[float, list[int]]:
        lane = pool.lane(CONVERSION_LANE)
        assert pool.lane(CONVERSION_LANE) is lane and lane.lane("other") is pool.lane("other")
        conversions = [asyncio.ensure_future(lane.run(blocking, i)) for i in range(40)]
        while len(running) < 2:
            await asyncio.sleep(0.01)
        t0 = time.monotonic()
        assert await asyncio.wait_for(pool.run(lambda: "validated"), 5) == "validated"
        waited = time.monotonic() - t0
        release.set()
        return waited, await asyncio.gather(*conversions)

    try:
        waited, done = asyncio.run(main())
    finally:
        release.set()
        pool.close()
    assert done == list(range(40))
    assert max(peak) == 2
    assert waited < 1.0


def test_lane_calls_take_turns_first_come_first_served():
    pool = WorkerPool(4)
    order: list[str] = []

    async def client(name: str, steps: int) -> None:
        lane = pool.lane(CONVERSION_LANE)
        for _ in range(steps):
            await lane.run(order.append, name)

    async def main() -> None:
        await asyncio.gather(client("a", 5), client("b", 5), client("c", 5))

    try:
        asyncio.run(main())
    finally:
        pool.close()
    # one lane place (4 threads): the three clients' steps alternate instead of one client's running on
    assert sorted(order) == sorted("abc" * 5)
    assert all(set(order[i:i + 3]) == {"a", "b", "c"} for i in range(0, 15, 3))
