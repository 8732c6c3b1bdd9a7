"""Delayed produce (server/delayed_produce.py): acks=all waiters answered in offset order as the high
watermark moves, across partitions, on leadership loss and on timeout, with the work of a check
bounded by what it answers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from odradek.protocol.error_codes import ErrorCode
from odradek.server.delayed_produce import DelayedProduces


@dataclass(eq=False)
class Part:
    key: tuple[str, int]
    high_watermark: int = 0
    leader: bool = True
    isr_ok: bool = True


class Status:
    """_acks_status of the replica manager, over fake partitions; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, part: Part, offset: int) -> ErrorCode | None:
        self.calls += 1
        if not part.leader:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if part.high_watermark < offset:
            return None
        return ErrorCode.NONE if part.isr_ok else ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND


def run(coro):
    return asyncio.run(coro)


async def _registered(dp: DelayedProduces, entries: int, timeout: float = 5.0) -> None:
    """Wait until the waiting tasks have registered `entries` entries (they run once the test yields)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while dp.waiting() != entries:
        assert asyncio.get_running_loop().time() < deadline, f"{dp.waiting()} entries, not {entries}"
        await asyncio.sleep(0)


def test_waiters_are_answered_in_offset_order_as_the_high_watermark_moves():
    async def go():
        status = Status()
        dp: DelayedProduces[Part] = DelayedProduces(status)
        p = Part(("t", 0))
        tasks = [asyncio.ensure_future(dp.wait([(p, end)], [None], 30)) for end in (10, 20, 30)]
        await _registered(dp, 3)
        p.high_watermark = 20
        dp.check(p.key)
        assert dp.waiting() == 1
        await asyncio.wait(tasks[:2])
        assert not tasks[2].done()
        assert tasks[0].result() == [ErrorCode.NONE] and tasks[1].result() == [ErrorCode.NONE]
        p.high_watermark, p.isr_ok = 30, False
        dp.check(p.key)
        assert await tasks[2] == [ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND]
        assert dp.waiting() == 0
    run(go())


def test_a_check_looks_at_the_answered_waiters_and_one_more_however_many_wait():
    async def go():
        status = Status()
        dp: DelayedProduces[Part] = DelayedProduces(status)
        p = Part(("t", 0))
        tasks = [asyncio.ensure_future(dp.wait([(p, 100 + i)], [None], 30)) for i in range(32)]
        await _registered(dp, 32)
        status.calls = 0
        for _ in range(10):               # follower fetches that do not move the high watermark
            dp.check(p.key)
        assert status.calls == 10
        status.calls = 0
        p.high_watermark = 102            # answers the waiters at 100, 101 and 102
        dp.check(p.key)
        assert status.calls == 4 and dp.waiting() == 29
        await asyncio.wait(tasks[:3])
        assert sum(t.done() for t in tasks) == 3
        p.high_watermark = 10_000
        dp.check(p.key)
        await asyncio.gather(*tasks)
    run(go())


def test_a_request_over_several_partitions_waits_for_all_of_them():
    async def go():
        dp: DelayedProduces[Part] = DelayedProduces(Status())
        a, b, c = Part(("t", 0)), Part(("t", 1)), Part(("u", 0))
        task = asyncio.ensure_future(dp.wait([(a, 5), (b, 7), (c, 3)], [None, None, ErrorCode.NONE], 30))
        await _registered(dp, 2)
        a.high_watermark = 5
        dp.check(a.key)
        assert dp.waiting() == 1 and not task.done()   # b's entry still waits
        b.leader = False                  # leadership of one partition moved away
        dp.check(b.key)
        assert await task == [ErrorCode.NONE, ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NONE]
        assert dp.waiting() == 0
    run(go())


def test_leadership_lost_answers_every_waiter_of_the_partition():
    async def go():
        dp: DelayedProduces[Part] = DelayedProduces(Status())
        p = Part(("t", 0))
        tasks = [asyncio.ensure_future(dp.wait([(p, end)], [None], 30)) for end in (10, 20, 30)]
        await _registered(dp, 3)
        p.leader = False
        dp.check(p.key)
        assert await asyncio.gather(*tasks) == [[ErrorCode.NOT_LEADER_OR_FOLLOWER]] * 3
    run(go())


def test_a_timeout_answers_request_timed_out_for_what_is_left_and_forgets_the_entries():
    async def go():
        dp: DelayedProduces[Part] = DelayedProduces(Status())
        a, b = Part(("t", 0)), Part(("t", 1))
        early = asyncio.ensure_future(dp.wait([(a, 5), (b, 5)], [None, None], 0.05))
        late = asyncio.ensure_future(dp.wait([(a, 6)], [None], 30))
        await _registered(dp, 3)
        a.high_watermark = 5
        dp.check(a.key)
        assert await early == [ErrorCode.NONE, ErrorCode.REQUEST_TIMED_OUT]
        assert dp.waiting() == 1          # only `late`'s entry is left
        a.high_watermark = 6
        dp.check(a.key)
        assert await late == [ErrorCode.NONE]
        assert dp.waiting() == 0
    run(go())


def test_a_cancelled_waiter_leaves_nothing_behind():
    async def go():
        dp: DelayedProduces[Part] = DelayedProduces(Status())
        p = Part(("t", 0))
        task = asyncio.ensure_future(dp.wait([(p, 10)], [None], 30))
        await _registered(dp, 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert dp.waiting() == 0
    run(go())


def test_nothing_to_wait_for_or_no_time_answers_at_once():
    async def go():
        dp: DelayedProduces[Part] = DelayedProduces(Status())
        p = Part(("t", 0))
        assert await dp.wait([(p, 10)], [ErrorCode.NONE], 30) == [ErrorCode.NONE]
        assert await dp.wait([(p, 10)], [None], 0) == [ErrorCode.REQUEST_TIMED_OUT]
        assert dp.waiting() == 0
    run(go())
