"""The purgatory's waits: woken by a notification of any key waited on (True), expired by the timeout
(False), and leaving no waiter behind either way, nor when the waiting request is cancelled."""

from __future__ import annotations

import asyncio

from odradek.server.purgatory import Purgatory


def test_a_notified_key_wakes_the_wait_and_a_timeout_expires_it():
    async def main():
        p = Purgatory()
        waiting = asyncio.ensure_future(p.wait_any([("t", 0), ("t", 1)], 5))
        await asyncio.sleep(0)
        assert p.waiting() == 2
        p.notify(("t", 1))
        assert await waiting is True
        assert p.waiting() == 0
        assert await p.wait_any([("t", 0)], 0.01) is False
        assert await p.wait_any([("t", 0)], 0) is False
        assert p.waiting() == 0

    asyncio.run(main())


def test_a_cancelled_wait_leaves_nothing_behind():
    async def main():
        p = Purgatory()
        waiting = asyncio.ensure_future(p.wait_any([("t", 0)], 5))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert waiting.cancelled() and p.waiting() == 0
        p.notify(("t", 0))                       # nobody left to wake: no error

    asyncio.run(main())


def test_one_purgatory_serves_a_new_loop_after_the_old_one_closed():
    p = Purgatory()
    assert asyncio.run(p.wait_any([("t", 0)], 0.001)) is False
    assert asyncio.run(p.wait_any([("t", 0)], 0.001)) is False
