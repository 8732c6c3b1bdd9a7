"""The records of one fetched partition, spliced into the response when it is sent.

`RecordSlices` (Fetch v4+): file slices. The protocol encoder writes the length prefix from `size` and
records a reference; the connection awaits `send(transport, loop, use_sendfile)` in its place. Large
slices go out with `sendfile` (the kernel copies from the page cache to the socket; DESIGN, "Reads are
slices of files, not copies"). asyncio's selector loop does that itself (`loop.sendfile`); on uvloop,
whose `loop.sendfile` would read and copy, the slice is sent straight to the transport's socket
(`direct_sendfile`) whenever the transport holds nothing unsent, and when the socket is full one piece
goes through the transport, which waits for the socket, before sendfile takes over again. Small
slices, and slices on transports without a plain socket, are read with positioned reads (`pread`)
into the transport a bounded piece at a time; record sets that come to less than SENDFILE_MIN_BYTES in
all are read before the answer is written (`inlined`), so a small answer goes out as one buffer in one
write. Either way
the bytes are never decoded by Python.

`LegacyRecords` (Fetch v0-3, whose readers know only magic 0/1 messages): the v2 batches are
down-converted lazily while the response is written (KIP-283), `CONVERT_CHUNK_BYTES` of stored batches
at a time on the broker's worker pool, so neither the range nor its conversion is ever whole in memory
and the event loop only moves bytes. The size prefix goes out first, so the size is fixed before the
conversion, by Kafka's rule: the larger of the stored bytes and the first converted batch, so a reader
always gets at least that batch whole. The converted stream is cut at that size (readers ignore a
partial message at the end of a message set and fetch it again); if it runs short, the rest is an
"overflow" entry, offset -1 with a message size pointing past the end, which readers ignore the same
way. Between pieces the sender waits for the transport to drain (the protocol's `drained` event), so a
slow reader holds one piece, not the response.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import struct

from odradek.protocol.exceptions import ProtocolError
from odradek.records.convert import v2_to_legacy_prefix
from odradek.storage.errors import StorageError
from odradek.server.workers import Workers
from odradek.storage.fileslice import FileSlice

log = logging.getLogger("odradek.fetch")

SENDFILE_MIN_BYTES = 64 * 1024
PREAD_PIECE_BYTES = 1024 * 1024       # stored bytes copied per write when not using sendfile
DIRECT_PIECE_BYTES = 64 * 1024       # copied through the transport while the socket is full
CONVERT_CHUNK_BYTES = 128 * 1024      # stored bytes down-converted per step (Kafka's MAX_READ_SIZE)
FIRST_WINDOW_BYTES = 16 * 1024        # read to find the first batch that converts to messages
LOG_OVERHEAD = 12                     # offset int64 + size int32 in front of every entry
_ENTRY_HEAD = struct.Struct(">qi")
_INT32_MAX = 2**31 - 1
_ZEROS = bytes(64 * 1024)

Cursor = tuple[int, int]  # (index of the slice, file position of the next entry in it)


def native_sendfile(loop: asyncio.AbstractEventLoop) -> bool:
    """asyncio's own selector loop sends files natively; uvloop's loop.sendfile would fall back to
    seeking and reading the shared segment file object, which storage forbids."""
    return isinstance(loop, asyncio.BaseEventLoop) and hasattr(loop, "_sendfile_native")


async def _drained(transport: asyncio.WriteTransport) -> None:
    """Wait while the transport's buffer is above its high-water mark (network.Connection's event)."""
    drained = getattr(transport.get_protocol(), "drained", None)
    if drained is not None and not drained.is_set():
        await drained.wait()


def _plain_socket_fd(transport: asyncio.WriteTransport) -> int | None:
    """The transport's socket descriptor, if bytes written to it go to the peer as they are."""
    if transport.get_extra_info("sslcontext") is not None:
        return None
    sock = transport.get_extra_info("socket")
    return None if sock is None else sock.fileno()


async def _emptied(transport: asyncio.WriteTransport) -> None:
    """Wait until the transport has handed every byte it holds to the kernel: the write-buffer limits
    are lowered to zero meanwhile, so the protocol is paused while anything is held and resumed (its
    `drained` event set) once nothing is."""
    if transport.get_write_buffer_size() == 0:
        return
    drained = getattr(transport.get_protocol(), "drained", None)
    if drained is None:
        return
    low, high = transport.get_write_buffer_limits()
    transport.set_write_buffer_limits(high=0, low=0)
    try:
        await drained.wait()
    finally:
        if not transport.is_closing():
            transport.set_write_buffer_limits(high=high, low=low)


async def direct_sendfile(transport: asyncio.WriteTransport, s: FileSlice) -> int:
    """Send slice `s` with sendfile on the transport's own socket (the kernel copies from the page
    cache), only while the transport holds nothing unsent, so the bytes keep their order; when the
    socket is full, one piece goes through the transport, which waits for the socket, and sendfile
    goes on once that piece has left. Returns the bytes sent: all of the slice, or 0 when the
    transport has no plain socket (the caller then copies it). Raises OSError when the peer is gone
    or the file is shorter than the slice."""
    fd = _plain_socket_fd(transport)
    if fd is None:
        return 0
    src = s.fileno()
    sent = 0
    while sent < s.length:
        if transport.is_closing():
            raise ConnectionResetError(errno.ECONNRESET, "the connection closed while sending records")
        if transport.get_write_buffer_size() == 0:
            try:
                while sent < s.length:
                    n = os.sendfile(fd, src, s.position + sent, s.length - sent)
                    if n == 0:
                        raise OSError(errno.EIO, f"{s.path}: {s.length - sent} bytes short of the slice sent")
                    sent += n
                break
            except (BlockingIOError, InterruptedError):
                pass
        n = min(DIRECT_PIECE_BYTES, s.length - sent)
        transport.write(FileSlice(s.file, s.position + sent, n).read())
        sent += n
        await _emptied(transport)
    return sent


class RecordSlices:
    __slots__ = ("slices", "size")

    def __init__(self, slices: list) -> None:
        self.slices = slices
        self.size = sum(s.length for s in slices)

    async def send(self, transport: asyncio.WriteTransport, loop: asyncio.AbstractEventLoop,
                   use_sendfile: bool) -> None:
        for s in self.slices:
            start = 0
            if s.length >= SENDFILE_MIN_BYTES:
                if use_sendfile:
                    await loop.sendfile(transport, s.file, s.position, s.length, fallback=False)
                    continue
                start = await direct_sendfile(transport, s)
            for at in range(start, s.length, PREAD_PIECE_BYTES):
                n = min(PREAD_PIECE_BYTES, s.length - at)
                transport.write(FileSlice(s.file, s.position + at, n).read())
                await _drained(transport)

    def read(self) -> bytes:
        return b"".join(s.read() for s in self.slices)


def inlined(chunks: list) -> list:
    """`chunks` with its record sets read now into bytes while together they come to less than
    SENDFILE_MIN_BYTES (each would be read with pread when sent anyway), so a fetch answer with a few
    records is one buffer: one write, one segment, one wake-up of the reader, instead of a header,
    the records and the rest written one by one. What is read at once stays that small; larger
    answers still read and send their small slices a piece at a time, as the socket takes them."""
    budget = SENDFILE_MIN_BYTES
    out = None
    for i, c in enumerate(chunks):
        if type(c) is RecordSlices and c.size < budget:
            if out is None:
                out = list(chunks)
            out[i] = c.read()
            budget -= c.size
    return chunks if out is None else out


class LegacyRecords:
    """Fetch v0-3: the batches of `slices` as magic `magic` messages, converted while sent. Build with
    `convert_first`, which fixes the size."""

    __slots__ = ("slices", "magic", "fetch_offset", "workers", "size", "_first", "_cursor")

    def __init__(self, slices: list[FileSlice], magic: int, fetch_offset: int, workers: Workers, first: bytes,
                 cursor: Cursor, size: int) -> None:
        self.slices = slices
        self.magic = magic
        self.fetch_offset = fetch_offset
        self.workers = workers
        self.size = size
        self._first: bytes | None = first
        self._cursor = cursor

    @classmethod
    async def convert_first(cls, slices: list[FileSlice], magic: int, fetch_offset: int,
                            workers: Workers) -> LegacyRecords | None:
        """Convert the first batch that gives messages (on the worker pool) and size the response by
        it; None when no batch does (only control batches: a legacy reader sees nothing). Raises
        ProtocolError or StorageError when that batch cannot be read or converted."""
        first, cursor = await workers.run(convert_step, slices, (0, slices[0].position), magic,
                                          fetch_offset, FIRST_WINDOW_BYTES, True)
        if not first:
            return None
        stored = sum(s.length for s in slices)
        return cls(slices, magic, fetch_offset, workers, first, cursor, max(stored, len(first)))

    async def send(self, transport: asyncio.WriteTransport, loop: asyncio.AbstractEventLoop,
                   use_sendfile: bool) -> None:
        remaining = self.size
        pending, self._first = self._first, None
        cursor = self._cursor
        while remaining > 0:
            if pending is None:
                pending, cursor = await self._convert_next(cursor)
                if pending is None:
                    await _write_overflow(transport, remaining)
                    return
            piece = memoryview(pending)[:remaining]
            transport.write(piece)
            remaining -= len(piece)
            pending = None
            await _drained(transport)

    async def _convert_next(self, cursor: Cursor) -> tuple[bytes | None, Cursor]:
        done = (len(self.slices), 0)
        if cursor[0] >= len(self.slices):
            return None, done
        try:
            out, cursor = await self.workers.run(convert_step, self.slices, cursor, self.magic,
                                                 self.fetch_offset, CONVERT_CHUNK_BYTES, False)
        except (ProtocolError, StorageError, OSError, ValueError) as e:
            # The size is on the wire already: what is left becomes an overflow entry, and the reader
            # fetches again from the batch that failed (and gets the error then, from convert_first).
            # ValueError: the segment file was closed under the response (deleted without delay).
            log.warning("down-conversion stopped mid-response, the rest is padding: %s", e)
            return None, done
        return (out or None), cursor


async def _write_overflow(transport: asyncio.WriteTransport, remaining: int) -> None:
    """`remaining` bytes that a legacy reader takes for a partial entry: an entry head announcing a
    message longer than what is left, then zeros."""
    transport.write(_ENTRY_HEAD.pack(-1, min(remaining + 1, _INT32_MAX))[:remaining])
    remaining -= LOG_OVERHEAD
    while remaining > 0:
        n = min(remaining, len(_ZEROS))
        transport.write(memoryview(_ZEROS)[:n])
        remaining -= n
        await _drained(transport)


def convert_step(slices: list, cursor: Cursor, magic: int, fetch_offset: int, window_bytes: int,
                 first_only: bool) -> tuple[bytes, Cursor]:
    """Down-convert about `window_bytes` of stored batches from `cursor` (at least one whole batch,
    more while they give no messages): (the legacy messages, the cursor after them); b"" at the end.
    Messages below `fetch_offset` in uncompressed batches are left out (records/convert.py). Reads
    files only, so it runs on a worker thread."""
    i, pos = cursor
    while i < len(slices):
        s = slices[i]
        end = s.position + s.length
        if pos < end:
            window = _whole_entries(s, pos, end, window_bytes)
            out, used = v2_to_legacy_prefix(window, magic, first_only=first_only, min_offset=fetch_offset)
            if used <= 0:
                raise ProtocolError(f"no whole batch at {s.path}:{pos}")
            pos += used
            if out:
                return out, (i, pos)
            continue
        i += 1
        pos = slices[i].position if i < len(slices) else 0
    return b"", (i, pos)


def _whole_entries(s: FileSlice, pos: int, end: int, window_bytes: int) -> bytes:
    """About `window_bytes` from `pos` (a batch start) inside the slice, ending with whole batches
    (at least the first one, however large)."""
    buf = FileSlice(s.file, pos, min(max(window_bytes, LOG_OVERHEAD), end - pos)).read()
    if len(buf) >= LOG_OVERHEAD:
        size = LOG_OVERHEAD + _ENTRY_HEAD.unpack_from(buf)[1]
        if size > len(buf):
            if not LOG_OVERHEAD < size <= end - pos:
                raise ProtocolError(f"batch of {size} bytes at {s.path}:{pos} runs past its slice")
            buf = FileSlice(s.file, pos, size).read()
    return buf
