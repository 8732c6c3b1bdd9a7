"""How an answer leaves the broker. One in several parts (a fetch's header, its records sent by
themselves, the rest) goes out with the TCP socket corked, and the socket is uncorked once the answer is
out; a one-part answer is not corked. A record set smaller than SENDFILE_MIN_BYTES is read into the
answer, so a fetch with a few records is one buffer. A real listener on loopback, on uvloop and on
asyncio's own loop, a raw socket client, real files, and a record set that notes whether the socket was
corked while it was sent."""

from __future__ import annotations

import asyncio
import os
import socket
import struct

import pytest
import uvloop

from odradek.protocol.framing import coalesced
from odradek.server.network import Connection, Listener, RequestPool
from odradek.server.record_slices import SENDFILE_MIN_BYTES, RecordSlices, inlined
from odradek.storage.fileslice import FileSlice

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


async def _connect(handler: Handler) -> tuple[Listener, asyncio.StreamReader, asyncio.StreamWriter]:
    listener = Listener(handler, max_request_bytes=1 << 20, pool=RequestPool(bytes_max=1 << 20, requests_max=10),
                        max_connections=10, max_connections_per_ip=10, idle_ms=60_000)
    port = await listener.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    return listener, reader, writer


@pytest.mark.parametrize("loop_name", sorted(RUNNERS))
def test_a_many_part_answer_is_sent_corked_then_uncorked(loop_name):
    async def main():
        handler = Handler()
        listener, reader, writer = await _connect(handler)
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


def _slices(tmp_path, sizes: list[int]) -> tuple[RecordSlices, bytes, object]:
    data = os.urandom(sum(sizes))
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(data)
    f = open(path, "rb", buffering=0)
    at, slices = 0, []
    for n in sizes:
        slices.append(FileSlice(f, at, n))
        at += n
    return RecordSlices(slices), data, f


def test_a_small_record_set_is_read_into_the_answer_and_a_large_one_is_not(tmp_path):
    small, data, f = _slices(tmp_path, [1000, 3000])
    try:
        large = RecordSlices([FileSlice(f, 0, SENDFILE_MIN_BYTES)])
        out = inlined([b"header", small, b"middle", large, b"tail"])
        assert out[1] == data and isinstance(out[1], bytes)
        assert out[3] is large                         # sent from the page cache when the answer goes out
        assert [out[0], out[2], out[4]] == [b"header", b"middle", b"tail"]
        # a header, a small record set and the rest: the answer is one buffer, sent in one write
        assert len(coalesced([b"\0\0\0\1", *inlined([b"header", small, b"tail"])])) == 1
        # what is read at once stays under SENDFILE_MIN_BYTES: the third set is left to be sent by itself
        (tmp_path / "big").mkdir()
        third = SENDFILE_MIN_BYTES // 3 + 1
        whole, _, g = _slices(tmp_path / "big", [third] * 3)
        try:
            sets = [RecordSlices([s]) for s in whole.slices]
            out = inlined(sets)
            assert [type(c) for c in out] == [bytes, bytes, RecordSlices] and out[2] is sets[2]
        finally:
            g.close()
    finally:
        f.close()


@pytest.mark.parametrize("loop_name", sorted(RUNNERS))
def test_a_fetch_answer_with_few_records_arrives_whole(loop_name, tmp_path):
    records, data, f = _slices(tmp_path, [700, 1300])

    async def main():
        handler = Handler()
        handler.records = records
        listener, reader, writer = await _connect(handler)
        try:
            writer.write(struct.pack(">i", 5) + b"fetch")
            assert await _read_answer(reader) == b"header" + data + b"tail"
            assert not _corked(handler.conn.transport)
        finally:
            writer.close()
            await listener.aclose()

    try:
        RUNNERS[loop_name](asyncio.wait_for(main(), 10))
    finally:
        f.close()
