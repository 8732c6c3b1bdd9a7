"""The broker's one decode slack (server/dispatch.py, `DecodeSlack`; protocol/codec.py's decode budget):
large requests in progress share DECODE_SLACK_BYTES past 6x their size, first come first served, and
give back what they did not use as soon as they are decoded. A dispatcher over a fake handler shows a
large request holding only what its decoding was charged, and two dense requests taking turns."""

import asyncio

from odradek.protocol.api import decode_request_charged, encode_request
from odradek.protocol.codec import DECODE_MULTIPLE, DECODE_SLACK_BYTES
from odradek.protocol.headers import RequestHeader
from odradek.protocol.messages import metadata as m
from odradek.server.dispatch import DecodeSlack, Dispatcher
from odradek.server.workers import inline_pool


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def _until(predicate, what: str, turns: int = 1000) -> None:
    """Let the loop run until `predicate()` holds (everything here is on one loop: a bounded number of
    turns is the deadline)."""
    for _ in range(turns):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not reached within {turns} turns of the loop: {what}")


def test_the_slack_is_taken_in_order_and_a_cancelled_waiter_takes_nothing():
    async def main():
        slack = DecodeSlack(100)
        await slack.take(60)
        order = []

        async def want(n, name):
            await slack.take(n)
            order.append(name)

        big = asyncio.ensure_future(want(50, "big"))
        gone = asyncio.ensure_future(want(10, "gone"))
        small = asyncio.ensure_future(want(10, "small"))
        await _until(lambda: len(slack._waiters) == 3, "all three waiting")
        assert order == [] and slack.free == 40     # first come first served: small waits behind big
        gone.cancel()
        await _until(gone.done, "the cancelled waiter gone")
        assert len(slack._waiters) == 2
        slack.give(60)
        await asyncio.gather(big, small)
        assert order == ["big", "small"] and slack.free == 40
        assert gone.cancelled()
    _run(main())


def _metadata_frame(names: int) -> bytes:
    body = m.MetadataRequest(topics=[m.MetadataRequestTopic(name=f"t{i}") for i in range(names)],
                             allow_auto_topic_creation=False)
    return bytes(encode_request(RequestHeader(3, 1, 1, "slack"), body))


class _Conn:
    peer = ("127.0.0.1", 1)


def test_a_large_request_holds_only_what_its_decoding_was_charged_past_6x():
    frame = _metadata_frame(50_000)
    _, _, charged = decode_request_charged(frame)
    excess = charged - DECODE_MULTIPLE * len(frame)
    assert excess > 0
    seen = []

    async def main():
        async def handler(ctx, request):
            seen.append(dispatcher.slack.free)
            return m.MetadataResponse(topics=[])

        dispatcher = Dispatcher(lambda conn, header: None, {3: handler}, inline_pool())
        chunks = await dispatcher(_Conn(), frame)
        assert chunks
        return dispatcher.slack.free

    assert _run(main()) == DECODE_SLACK_BYTES            # all given back once answered
    assert seen == [DECODE_SLACK_BYTES - excess]          # while handled: only the excess is held


def test_dense_large_requests_take_turns_for_the_slack():
    frame = _metadata_frame(250_000)                      # charged about 45 MB for 2.2 MB
    holding = []

    async def main():
        release = asyncio.Event()

        async def handler(ctx, request):
            holding.append(len(request.topics))
            if len(holding) == 1:
                await release.wait()
            return m.MetadataResponse(topics=[])

        dispatcher = Dispatcher(lambda conn, header: None, {3: handler}, inline_pool())
        first = asyncio.ensure_future(dispatcher(_Conn(), frame))
        second = asyncio.ensure_future(dispatcher(_Conn(), frame))
        await _until(lambda: len(holding) == 1 and len(dispatcher.slack._waiters) == 1,
                     "the first handled while the second waits for the slack")
        assert len(holding) == 1, "the second was decoded while the first held the slack"
        release.set()
        await asyncio.gather(first, second)
        return dispatcher.slack.free

    assert _run(main()) == DECODE_SLACK_BYTES and holding == [250_000, 250_000]
