"""An answer in several parts (a fetch's header, its records sent by themselves, the rest) goes out
with the TCP socket corked, and the socket is uncorked once the answer is out; a one-part answer is
not corked. A real listener on loopback, on uvloop and on asyncio's own loop, a raw socket client, and
a record set that notes whether the socket was corked while it was sent."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest
import uvloop

from odradek.server.network import Connection, Listener, RequestPool

RUNNERS = {"uvloop": uvloop.run, "asyncio": asyncio.run}


def _corked(transport: asyncio.BaseTransport) -> bool:
    return transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 1


class Records:
    """A record set as the fetch handler answers it: it sends itself on the transport."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.size = len(data)
        self.corked_while_sent: bool | None = None

    async def send(self, transport: asyncio.WriteTransport, loop, use_sendfile: bool) -> None:
        self.corked_while_sent = _corked(transport)
        transport.write(self.data)


class Handler:
    def __init__(self) -> None:
        self.records = Records(bytes(range(256)) * 512)
        self.conn: Connection | None = None

    async def __call__(self, conn: Connection, frame: bytes) -> list:
        self.conn = conn
        if bytes(frame) == b"fetch":
            return [b"header", self.records, b"tail"]
        return [b"small"]


async def _read_answer(reader: asyncio.StreamReader) -> bytes:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


@pytest.mark.parametrize("loop_name", sorted(RUNNERS))
def test_a_many_part_answer_is_sent_corked_then_uncorked(loop_name):
    async def main():
        handler = Handler()
        listener = Listener(handler, max_request_bytes=1 << 20, pool=RequestPool(bytes_max=1 << 20, requests_max=10),
                            max_connections=10, max_connections_per_ip=10, idle_ms=60_000)
        port = await listener.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(struct.pack(">i", 5) + b"fetch")
            assert await _read_answer(reader) == b"header" + handler.records.data + b"tail"
            assert handler.records.corked_while_sent is True
            assert not _corked(handler.conn.transport)
            writer.write(struct.pack(">i", 5) + b"small")
            assert await _read_answer(reader) == b"small"
            assert not _corked(handler.conn.transport)
        finally:
            writer.close()
            await listener.aclose()

    RUNNERS[loop_name](asyncio.wait_for(main(), 10))
