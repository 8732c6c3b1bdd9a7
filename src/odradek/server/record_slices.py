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
down-converted lazily while the response is written (KIP-283), a step at a time on the worker pool's
conversion lane (`workers.CONVERSION_LANE`: at most a share of the threads, steps taken in turn), so
neither the range nor its conversion is ever whole in memory, and the event loop only moves bytes.
Within a batch too (`records.downconvert`): a batch of a million records is decompressed as it is
read and converted a piece of about `CONVERT_CHUNK_BYTES` of messages at a time, from a cursor in the
batch held between steps, and records below the fetch offset are passed over by their lengths. What
one response holds is one stored batch and a piece. What it costs is in proportion to its size: the
stored bytes it covers are at most its size, and the messages it makes at most `CONVERTED_PER_SENT`
times its size before compression (a gzip wrapper of small records can be a tenth of its messages or
less: past that, the rest of the response is padding, and the reader fetches the next records anew).

The size prefix goes out first, so the size is fixed before the conversion, by Kafka's rule: the
larger of the stored bytes and the first converted piece (Kafka's first converted batch; a piece holds
at least one whole message or wrapper), so a reader always gets that whole and goes on. The converted
stream is cut at that size (readers ignore a partial message at the end of a message set and fetch
it again, from inside the batch: the conversion starts at that offset); if it runs short, the rest is
an "overflow" entry, offset -1 with a message size pointing past the end, which readers ignore the
same way. Between pieces the sender waits for the transport to drain (the protocol's `drained`
event), so a slow reader holds one piece, not the response.

zstd batches are refused, as Kafka refuses them (RecordsUtil.downConvert throws
UnsupportedCompressionTypeException; KafkaApis answers UNSUPPORTED_COMPRESSION_TYPE for the
partition, and LazyDownConversionRecordsSend ends a response at a later zstd batch with an overflow
entry): magic 0/1 cannot carry zstd, and as plain messages a zstd batch grows about fortyfold, so a
reader would fetch it again and again from inside. `convert_first` raises
`UnsupportedCompressionForLegacy` when the first batch to convert is zstd; a later one ends the
stream, the rest is padding, and the reader's next fetch starts there and gets the error. Other
codecs are converted in pieces: gzip, snappy and lz4 batches as one wrapper of that codec per piece.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import struct
from typing import Generator, Iterator

from crc32c import crc32c

from odradek.protocol.exceptions import ProtocolError
from odradek.records import codecs
from odradek.records.batch import RecordBatch
from odradek.records.convert import v2_to_legacy
from odradek.records.downconvert import BatchFields, Work, convert_records, legacy_pieces
from odradek.records.header import ATTRIBUTES_OFFSET, COMPRESSION_MASK, CONTROL_MASK, HEADER_SIZE, MAGIC_OFFSET
from odradek.storage.errors import StorageError
from odradek.server.workers import CONVERSION_LANE, Workers
from odradek.storage.fileslice import FileSlice

log = logging.getLogger("odradek.fetch")

SENDFILE_MIN_BYTES = 64 * 1024
PREAD_PIECE_BYTES = 1024 * 1024       # stored bytes copied per write when not using sendfile
DIRECT_PIECE_BYTES = 64 * 1024       # copied through the transport while the socket is full
CONVERT_CHUNK_BYTES = 128 * 1024      # converted bytes per step (Kafka's MAX_READ_SIZE is of stored bytes)
STEP_TICKS = 8                        # stretches of skipped records (downconvert.STEP_RECORDS) per step
CONVERTED_PER_SENT = 2                # messages made per byte of the answer, at most (before compression)
LOG_OVERHEAD = 12                     # offset int64 + size int32 in front of every entry
_ENTRY_HEAD = struct.Struct(">qi")
Pieces = Generator[tuple[bytes, bool], None, None]   # (converted piece, whether it ends its batch)
_BATCH_HEAD = struct.Struct(">q13xhi")   # base offset, attributes, last offset delta (header layout)
_INT32_MAX = 2**31 - 1
_ZEROS = bytes(64 * 1024)

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


class UnsupportedCompressionForLegacy(Exception):
    """The first batch to convert is zstd, which magic 0/1 messages cannot carry (Kafka:
    UNSUPPORTED_COMPRESSION_TYPE for the partition)."""


class LegacyRecords:
    """Fetch v0-3: the batches of `slices` as magic `magic` messages, converted while sent. Build with
    `convert_first`, which fixes the size."""

    __slots__ = ("workers", "size", "_first", "_pieces", "_work")

    def __init__(self, workers: Workers, first: bytes, pieces: Pieces, size: int, work: Budget) -> None:
        self.workers = workers
        self.size = size
        self._first: bytes | None = first
        self._pieces = pieces
        self._work = work
        work.limit = work.converted + CONVERTED_PER_SENT * size

    @classmethod
    async def convert_first(cls, slices: list[FileSlice], magic: int, fetch_offset: int,
                            workers: Workers) -> LegacyRecords | None:
        """Convert the first piece that gives messages (on the worker pool's conversion lane, a bounded
        step at a time) and size the response by it; None when nothing does (only control batches: a
        legacy reader sees nothing). Raises UnsupportedCompressionForLegacy when that batch is zstd, and
        ProtocolError or StorageError when it cannot be read or converted."""
        lane = workers.lane(CONVERSION_LANE)
        work = Budget()
        pieces = legacy_stream(slices, magic, fetch_offset, CONVERT_CHUNK_BYTES, work)
        while True:
            first = await lane.run(convert_step, pieces, work, CONVERT_CHUNK_BYTES, True)
            if first is None:
                return None
            if first:
                break
        stored = sum(s.length for s in slices)
        return cls(lane, first, pieces, max(stored, len(first)), work)

    async def send(self, transport: asyncio.WriteTransport, loop: asyncio.AbstractEventLoop,
                   use_sendfile: bool) -> None:
        remaining = self.size
        pending, self._first = self._first, None
        try:
            while remaining > 0:
                if pending is None:
                    pending = await self._convert_next()
                    if pending is None:
                        await _write_overflow(transport, remaining)
                        return
                    if not pending:
                        pending = None        # a step that only skipped records: go on
                        continue
                piece = memoryview(pending)[:remaining]
                transport.write(piece)
                remaining -= len(piece)
                pending = None
                await _drained(transport)
        finally:
            try:
                self._pieces.close()       # frees the batch held, when the response stops early
            except ValueError:
                pass                       # still running on a worker (the send was cancelled)

    async def _convert_next(self) -> bytes | None:
        try:
            return await self.workers.run(convert_step, self._pieces, self._work, CONVERT_CHUNK_BYTES, False)
        except (ProtocolError, StorageError, OSError, ValueError) as e:
            # The size is on the wire already: what is left becomes an overflow entry, and the reader
            # fetches again from the batch that failed (and gets the error then, from convert_first).
            # ValueError: the segment file was closed under the response (deleted without delay).
            log.warning("down-conversion stopped mid-response, the rest is padding: %s", e)
            return None


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


def convert_step(pieces: Iterator[tuple[bytes, bool]], work: Work, want_bytes: int, first_only: bool
                 ) -> bytes | None:
    """One step of a conversion (`legacy_stream`): the pieces that come until they hold `want_bytes`,
    until they made `want_bytes` of messages (compressed wrappers are smaller), until `STEP_TICKS`
    stretches of records only skipped, or (`first_only`) until the end of the first batch that gives
    messages; None at the end. Runs on a worker thread."""
    out = []
    n = 0
    ticks = 0
    made = work.converted + want_bytes
    for piece, batch_end in pieces:
        if piece:
            out.append(piece)
            n += len(piece)
        else:
            ticks += 1
        if n >= want_bytes or work.converted >= made or (first_only and n and batch_end) or ticks >= STEP_TICKS:
            return b"".join(out)
    return b"".join(out) if out else None


class Budget(Work):
    """A conversion's work so far and its limit: the stream ends once `converted` passes `limit`."""

    __slots__ = ("limit",)

    def __init__(self) -> None:
        super().__init__()
        self.limit = 2**63 - 1


def legacy_stream(slices: list[FileSlice], magic: int, fetch_offset: int, piece_bytes: int,
                  work: Budget | None = None) -> Pieces:
    """The entries of `slices` converted to magic `magic` messages: (piece, whether it ends its batch),
    a piece of about `piece_bytes` at a time (`downconvert.legacy_pieces`; b"" after a stretch of
    records only skipped). Control batches and batches wholly below `fetch_offset` are passed over
    by their header; a zstd batch ends the stream, or raises UnsupportedCompressionForLegacy when
    nothing came before it; so does `work` passing its limit (compressed wrappers can hold many times
    their size in messages: the conversion's work stays in proportion to the answer's size). Holds one
    stored batch and its current piece; reads files only."""
    work = work or Budget()
    given = False
    for s in slices:
        pos, end = s.position, s.position + s.length
        while pos < end:
            head = FileSlice(s.file, pos, min(HEADER_SIZE, end - pos)).read()
            if len(head) < MAGIC_OFFSET + 1:
                raise ProtocolError(f"entry at {s.path}:{pos} too short to hold its magic byte")
            size = LOG_OVERHEAD + _ENTRY_HEAD.unpack_from(head)[1]
            if not LOG_OVERHEAD < size <= end - pos:
                raise ProtocolError(f"batch of {size} bytes at {s.path}:{pos} runs past its slice")
            if head[MAGIC_OFFSET] == 2:
                if len(head) < HEADER_SIZE:
                    raise ProtocolError(f"batch header at {s.path}:{pos} truncated")
                base_offset, attributes, last_delta = _BATCH_HEAD.unpack_from(head)
                if attributes & CONTROL_MASK or base_offset + last_delta < fetch_offset:
                    pos += size
                    continue
                if attributes & COMPRESSION_MASK == codecs.ZSTD:
                    if given:
                        return
                    raise UnsupportedCompressionForLegacy(
                        f"down-conversion of zstd batches is not supported (offset {base_offset})")
                if attributes & COMPRESSION_MASK in (codecs.NONE, codecs.GZIP):
                    # read from the file as the conversion goes: the batch is never held whole
                    fields = BatchFields(head)
                    _check_crc(s, pos, size, fields.crc, base_offset)
                    pieces = convert_records(fields, _file_pieces(s, pos + HEADER_SIZE, pos + size), magic,
                                             piece_bytes=piece_bytes, min_offset=fetch_offset, work=work)
                else:
                    batch = RecordBatch(FileSlice(s.file, pos, size).read())
                    pieces = legacy_pieces(batch, magic, piece_bytes=piece_bytes, min_offset=fetch_offset,
                                           work=work)
                for piece in pieces:
                    given = given or bool(piece)
                    yield piece, False
                    if work.converted > work.limit:
                        return
            else:
                piece = v2_to_legacy(FileSlice(s.file, pos, size).read(), magic)
                given = given or bool(piece)
                yield piece, False
            pos += size
            yield b"", True




READ_PIECE_BYTES = 64 * 1024          # stored bytes read at a time by a conversion


def _file_pieces(s: FileSlice, pos: int, end: int) -> Iterator[bytes]:
    for at in range(pos, end, READ_PIECE_BYTES):
        yield FileSlice(s.file, at, min(READ_PIECE_BYTES, end - at)).read()


def _check_crc(s: FileSlice, pos: int, size: int, stored: int, base_offset: int) -> None:
    """The batch's CRC-32C, read a piece at a time (as `BatchHeader.ensure_valid` checks it)."""
    crc = 0
    for piece in _file_pieces(s, pos + ATTRIBUTES_OFFSET, pos + size):
        crc = crc32c(piece, crc)
    if crc != stored:
        raise ProtocolError(f"record batch at offset {base_offset} is corrupt: stored crc {stored:#010x}, "
                            f"computed {crc:#010x}")
