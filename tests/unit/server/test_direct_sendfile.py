"""Fetched records sent with sendfile straight to the transport's socket (record_slices.direct_sendfile),
on uvloop and on asyncio's own loop: real sockets, a real file, the socket filled so the path that
copies a piece through the transport and then goes back to sendfile runs."""

from __future__ import annotations

import asyncio
import errno
import os
import socket

import pytest
import uvloop

from odradek.server import record_slices
from odradek.server.record_slices import RecordSlices, direct_sendfile
from odradek.storage.fileslice import FileSlice
from tests.unit.server.fakes import until

LOOPS = {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}


class Sender(asyncio.Protocol):
    """What direct_sendfile needs of network.Connection: the `drained` event of its writes."""

    def __init__(self) -> None:
        self.drained = asyncio.Event()
        self.drained.set()

    def pause_writing(self) -> None:
        self.drained.clear()

    def resume_writing(self) -> None:
        self.drained.set()

    def connection_lost(self, exc) -> None:
        self.drained.set()


@pytest.fixture(params=sorted(LOOPS))
def loop(request):
    lp = LOOPS[request.param]()
    yield lp
    lp.close()


@pytest.fixture
def data_file(tmp_path):
    data = os.urandom(6 * 1024 * 1024)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(data)
    f = open(path, "rb", buffering=0)
    yield f, data
    f.close()


async def _pair(loop):
    a, b = socket.socketpair()
    for s in (a, b):
        s.setblocking(False)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    transport, protocol = await loop.connect_accepted_socket(Sender, a)
    return transport, protocol, b


async def _read(loop, sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = await loop.sock_recv(sock, min(256 * 1024, n - len(out)))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def _count_sendfile(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = os.sendfile

    def counting(out_fd, in_fd, offset, count):
        n = real(out_fd, in_fd, offset, count)
        calls.append(n)
        return n
    monkeypatch.setattr(record_slices.os, "sendfile", counting)
    return calls


def test_a_slice_larger_than_the_socket_arrives_whole_and_in_order(loop, data_file, monkeypatch):
    f, data = data_file
    calls = _count_sendfile(monkeypatch)
    start, length = 12345, 5 * 1024 * 1024

    async def run():
        transport, _, reader = await _pair(loop)
        transport.write(b"HEAD")
        send = loop.create_task(direct_sendfile(transport, FileSlice(f, start, length)))
        # nobody reads yet: the socket fills, and the rest waits in a piece held by the transport
        await until(lambda: transport.get_write_buffer_size() > 0, "the socket to fill")
        got = await _read(loop, reader, 4 + length)
        assert await send == length
        transport.write(b"TAIL")
        assert await _read(loop, reader, 4) == b"TAIL"
        transport.close()
        reader.close()
        return got

    got = loop.run_until_complete(run())
    assert got == b"HEAD" + data[start:start + length]
    assert len(calls) >= 2 and sum(calls) > length // 2, calls   # sendfile before and after the piece


def test_records_behind_unsent_bytes_wait_for_them(loop, data_file, monkeypatch):
    """Bytes already held by the transport go first: sendfile starts only once they have left."""
    f, data = data_file
    _count_sendfile(monkeypatch)

    async def run():
        transport, _, reader = await _pair(loop)
        head = os.urandom(2 * 1024 * 1024)           # more than the socket holds: the transport keeps some
        transport.write(head)
        assert transport.get_write_buffer_size() > 0
        slices = RecordSlices([FileSlice(f, 0, 3 * 1024 * 1024), FileSlice(f, 100, 1000)])
        send = loop.create_task(slices.send(transport, loop, False))
        got = await _read(loop, reader, len(head) + slices.size)
        await send
        transport.close()
        reader.close()
        return head, got

    head, got = loop.run_until_complete(run())
    assert got == head + data[:3 * 1024 * 1024] + data[100:1100]


def test_a_file_shorter_than_the_slice_is_an_error_not_a_short_response(loop, data_file):
    f, data = data_file

    async def run():
        transport, _, reader = await _pair(loop)
        drain = loop.create_task(_read(loop, reader, len(data)))
        with pytest.raises(OSError) as e:
            await direct_sendfile(transport, FileSlice(f, len(data) - 1000, 100_000))
        transport.abort()
        await drain
        reader.close()
        return e.value

    err = loop.run_until_complete(run())
    assert err.errno == errno.EIO and "short" in str(err)


def test_a_reader_gone_mid_slice_is_an_os_error(loop, data_file):
    f, _ = data_file

    async def run():
        transport, _, reader = await _pair(loop)
        send = loop.create_task(direct_sendfile(transport, FileSlice(f, 0, 5 * 1024 * 1024)))
        await until(lambda: transport.get_write_buffer_size() > 0, "the socket to fill")
        reader.close()
        with pytest.raises(OSError):
            await asyncio.wait_for(send, 10)
        transport.abort()

    loop.run_until_complete(run())
