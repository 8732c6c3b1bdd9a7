"""A connection's answers that come later (`network.Later`, an acks=all Produce waiting for its
followers): the connection goes on with the requests behind one, sends every answer in request order
whatever order they complete in, holds at most MAX_PENDING_ANSWERS, and gives a request's pool share
back when it is handed over, so waiting answers cannot fill the pool. A real listener on loopback and a
raw socket client."""

from __future__ import annotations

import asyncio
import struct

from odradek.server.network import MAX_PENDING_ANSWERS, Connection, Later, Listener, RequestPool
from tests.unit.server.fakes import until


class Handler:
    """Answers b"now:<x>" at once with x, and b"later:<x>" with a future the test completes."""

    def __init__(self) -> None:
        self.handled: list[bytes] = []
        self.later: dict[bytes, asyncio.Future] = {}

    async def __call__(self, conn: Connection, frame: bytes) -> list | Later | None:
        kind, _, name = bytes(frame).partition(b":")
        self.handled.append(name)
        if kind == b"later":
            fut = asyncio.get_running_loop().create_future()
            self.later[name] = fut
            return Later(fut)
        return [name]


async def _serve(handler: Handler, pool: RequestPool) -> tuple[Listener, int]:
    listener = Listener(handler, max_request_bytes=1 << 20, pool=pool, max_connections=10,
                        max_connections_per_ip=10, idle_ms=60_000)
    return listener, await listener.start("127.0.0.1", 0)


def _request(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


async def _read_answer(reader: asyncio.StreamReader) -> bytes:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


def test_answers_go_out_in_request_order_whatever_order_they_complete_in():
    async def main():
        handler, pool = Handler(), RequestPool(bytes_max=1 << 20, requests_max=100)
        listener, port = await _serve(handler, pool)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request(b"later:a") + _request(b"now:b") + _request(b"later:c") + _request(b"now:d"))
        await until(lambda: handler.handled == [b"a", b"b", b"c", b"d"])   # none waited for a's answer
        await until(lambda: pool.requests == 0 and pool.bytes_used == 0)    # handed over: shares back
        handler.later[b"c"].set_result([b"c"])
        handler.later[b"a"].set_result([b"a"])
        assert [await _read_answer(reader) for _ in range(4)] == [b"a", b"b", b"c", b"d"]
        await until(lambda: pool.requests == 0 and pool.bytes_used == 0)
        writer.close()
        await listener.aclose()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_at_most_max_pending_answers_then_the_connection_waits():
    async def main():
        handler, pool = Handler(), RequestPool(bytes_max=1 << 20, requests_max=100)
        listener, port = await _serve(handler, pool)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        names = [f"r{i}".encode() for i in range(MAX_PENDING_ANSWERS + 3)]
        writer.write(b"".join(_request(b"later:" + n) for n in names))
        await until(lambda: len(handler.handled) == MAX_PENDING_ANSWERS)
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(handler.handled) == MAX_PENDING_ANSWERS   # the rest wait for room
        handler.later[names[0]].set_result([names[0]])
        assert await _read_answer(reader) == names[0]
        await until(lambda: len(handler.handled) == MAX_PENDING_ANSWERS + 1)
        for n in names[1:]:
            await until(lambda: n in handler.later)
            handler.later[n].set_result([n])
        assert [await _read_answer(reader) for _ in names[1:]] == names[1:]
        await until(lambda: pool.requests == 0 and pool.bytes_used == 0)
        writer.close()
        await listener.aclose()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_waiting_answers_do_not_hold_the_pool():
    async def main():
        handler, pool = Handler(), RequestPool(bytes_max=1 << 20, requests_max=2)
        listener, port = await _serve(handler, pool)
        waiting, others = [], []
        for i in range(3):          # three connections, each with an answer pending: more than the pool holds
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_request(b"later:w%d" % i))
            waiting.append((reader, writer))
        await until(lambda: len(handler.later) == 3)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request(b"now:fetch"))          # another connection is still served
        assert await _read_answer(reader) == b"fetch"
        others.append(writer)
        for i, (r, _) in enumerate(waiting):
            handler.later[b"w%d" % i].set_result([b"w%d" % i])
            assert await _read_answer(r) == b"w%d" % i
        for _, w in waiting:
            w.close()
        for w in others:
            w.close()
        await listener.aclose()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_client_gone_with_answers_pending_gives_everything_back():
    async def main():
        handler, pool = Handler(), RequestPool(bytes_max=1 << 20, requests_max=100)
        listener, port = await _serve(handler, pool)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request(b"later:x") + _request(b"now:y") + _request(b"later:z"))
        await until(lambda: len(handler.handled) == 3)
        writer.transport.abort()
        await until(lambda: pool.requests == 0 and pool.bytes_used == 0 and not listener.connections)
        await until(lambda: handler.later[b"x"].cancelled() and handler.later[b"z"].cancelled())
        await listener.aclose()

    asyncio.run(asyncio.wait_for(main(), 10))
