"""Parked requests (`network.Parked`): a request whose handler waits for something outside the broker
(a long poll in the purgatory, a JoinGroup waiting for the other members) does not count in
`queued.max.requests` while it waits, so waiting requests cannot fill the budget and stop the broker
reading other connections; it counts again once it resumes, its bytes stay charged, its connection stays
muted (one request at a time, answers in order), and only the connection's own task parks it. A real
listener on loopback and raw socket clients; the handler's waits are futures the test completes."""

from __future__ import annotations

import asyncio
import struct

from odradek.server.network import Connection, Listener, Parked, RequestPool
from tests.unit.server.fakes import until


class Handler:
    """b"now:<x>" answers x at once; b"park:<x>" waits, parked, for a future the test completes;
    b"hold:<x>" waits for one without parking (as every wait did before); b"park-work:<x>" waits parked,
    then waits unparked for a second future (its work once resumed); b"spawn:<x>" waits for a task it
    started, which enters Parked itself."""

    def __init__(self) -> None:
        self.handled: list[bytes] = []
        self.waits: dict[bytes, asyncio.Future] = {}

    def _future(self, name: bytes) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.waits[name] = fut
        return fut

    async def __call__(self, conn: Connection, frame: bytes) -> list:
        kind, _, name = bytes(frame).partition(b":")
        self.handled.append(name)
        if kind == b"park":
            with Parked():
                await self._future(name)
        elif kind == b"hold":
            await self._future(name)
        elif kind == b"park-work":
            with Parked():
                await self._future(name)
            await self._future(name + b"-work")
        elif kind == b"spawn":
            await asyncio.get_running_loop().create_task(self._parked_in_a_task(name))
        return [name]

    async def _parked_in_a_task(self, name: bytes) -> None:
        with Parked():
            await self._future(name)


async def _serve(handler: Handler, pool: RequestPool) -> tuple[Listener, int]:
    listener = Listener(handler, max_request_bytes=1 << 20, pool=pool, max_connections=100,
                        max_connections_per_ip=100, idle_ms=60_000)
    return listener, await listener.start("127.0.0.1", 0)


def _request(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


async def _read_answer(reader: asyncio.StreamReader) -> bytes:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


def test_parked_requests_do_not_count_and_others_are_read_and_served():
    async def main():
        handler, pool = Handler(), RequestPool(bytes_max=1 << 20, requests_max=2)
        listener, port = await _serve(handler, pool)
        parked = []
        for i in range(10):            # five times what queued.max.requests allows, all waiting
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_request(b"park:p%d" % i))
            parked.append((reader, writer))
        await until(lambda: len(handler.waits) == 10, "every parked request handled")
        assert pool.requests == 0 and not pool.full
        assert pool.bytes_used == 10 * len(b"park:p0")      # their bytes are still held, and charged
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request(b"now:other"))
        assert await _read_answer(reader) == b"other"
        writer.close()
        for i, (r, _) in enumerate(parked):
            handler.waits[b"p%d" % i].set_result(None)
            assert await _read_answer(r) == b"p%d" % i
        await until(lambda: pool.requests == 0 and pool.bytes_used == 0, "everything given back")
        for _, w in parked:
            w.close()
        await listener.aclose()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_waits_that_do_not_park_still_hold_the_budget():
    """queued.max.requests is otherwise unchanged: requests in progress count until answered."""
    async def main():
        handler, pool = Handler(), RequestPool(bytes_max=1 << 20, requests_max=2)
        listener, port = await _serve(handler, pool)
        held = []
        for i in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_request(b"hold:h%d" % i))
            held.append((reader, writer))
        await until(lambda: len(handler.waits) == 2)
        assert pool.requests == 2 and pool.full
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request(b"now:third"))
        await until(lambda: any("pool" in c.paused_for for c in listener.connections), "the third stops reading")
        handler.waits[b"h0"].set_result(None)
        assert await _read_answer(held[0][0]) == b"h0"
        assert await _read_answer(reader) == b"third"      # resumed once a request was answered
        handler.waits[b"h1"].set_result(None)
        assert await _read_answer(held[1][0]) == b"h1"
        await until(lambda: pool.requests == 0 and pool.bytes_used == 0)
        for _, w in held:
            w.close()
        writer.close()
        await listener.aclose()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_parked_connection_stays_muted_and_answers_in_order():
    async def main():
        handler, pool = Handler(), RequestPool(bytes_max=1 << 20, requests_max=100)
        listener, port = await _serve(handler, pool)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request(b"park:first"))
        await until(lambda: b"first" in handler.waits)
        (conn,) = listener.connections
        assert "muted" in conn.paused_for                    # nothing more is read while it waits
        writer.write(_request(b"now:second"))
        handler.waits[b"first"].set_result(None)
        assert await _read_answer(reader) == b"first"
        assert await _read_answer(reader) == b"second"
        assert handler.handled == [b"first", b"second"]
        writer.close()
        await listener.aclose()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_resumed_request_counts_again():
    async def main():
        handler, pool = Handler(), RequestPool(bytes_max=1 << 20, requests_max=100)
        listener, port = await _serve(handler, pool)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request(b"park-work:r"))
        await until(lambda: b"r" in handler.waits)
        assert pool.requests == 0
        handler.waits[b"r"].set_result(None)
        await until(lambda: b"r-work" in handler.waits)
        assert pool.requests == 1                           # work in progress again
        handler.waits[b"r-work"].set_result(None)
        assert await _read_answer(reader) == b"r"
        await until(lambda: pool.requests == 0 and pool.bytes_used == 0)
        writer.close()
        await listener.aclose()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_only_the_connections_own_task_parks_its_request():
    """A task the request started may outlive it (the next request would lose its count): it parks
    nothing."""
    async def main():
        handler, pool = Handler(), RequestPool(bytes_max=1 << 20, requests_max=100)
        listener, port = await _serve(handler, pool)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request(b"spawn:s"))
        await until(lambda: b"s" in handler.waits)
        assert pool.requests == 1
        handler.waits[b"s"].set_result(None)
        assert await _read_answer(reader) == b"s"
        await until(lambda: pool.requests == 0 and pool.bytes_used == 0)
        writer.close()
        await listener.aclose()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_parked_outside_a_connection_does_nothing():
    async def main():
        parked = Parked()
        with parked:
            await asyncio.sleep(0)
        assert parked.conn is None

    asyncio.run(main())


def test_a_client_gone_while_parked_gives_everything_back_at_the_answer():
    """A muted connection reads nothing, so it learns the client is gone when it answers (as Kafka's
    muted channels do); the wait is bounded (fetch.purgatory.max.wait.ms, the rebalance timeout)."""
    async def main():
        handler, pool = Handler(), RequestPool(bytes_max=1 << 20, requests_max=100)
        listener, port = await _serve(handler, pool)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request(b"park:gone"))
        await until(lambda: b"gone" in handler.waits)
        writer.transport.abort()
        handler.waits[b"gone"].set_result(None)
        await until(lambda: not listener.connections, "the connection closed")
        await until(lambda: pool.requests == 0 and pool.bytes_used == 0, "everything given back")
        await listener.aclose()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_connection_closed_while_parked_gives_its_share_back_once():
    """Closed by the broker (shutdown, a reaper) while its request is parked: the request's bytes come
    back with the connection, its count is not given back a second time, the wait is cancelled."""
    async def main():
        handler, pool = Handler(), RequestPool(bytes_max=1 << 20, requests_max=100)
        listener, port = await _serve(handler, pool)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request(b"park:closed"))
        await until(lambda: b"closed" in handler.waits)
        (conn,) = listener.connections
        conn.abort()
        await until(lambda: handler.waits[b"closed"].cancelled(), "the parked wait cancelled")
        await until(lambda: not conn.busy, "the worker done")
        assert pool.requests == 0 and pool.bytes_used == 0
        writer.close()
        await listener.aclose()

    asyncio.run(asyncio.wait_for(main(), 10))
