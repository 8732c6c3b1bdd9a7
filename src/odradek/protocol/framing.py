"""Size-prefixed framing, sans I/O: bytes in, whole frames out (seed 003, "Protocol": "Requests and
Responses": every message is an int32 size followed by that many bytes).

Used by both the broker and the client. The size is checked against `max_frame_bytes` as soon as its
four bytes arrive, before anything is allocated for the frame; a negative or oversized size raises
`FrameTooLarge` and the caller closes the connection (as Kafka does for `socket.request.max.bytes`).
"""

from __future__ import annotations

import struct
import sys
from typing import Protocol

from odradek.protocol.exceptions import ProtocolError

SPARES = 2  # large frame buffers kept for reuse
_SIZE = struct.Struct(">i")


class FrameTooLarge(ProtocolError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class FramePool(Protocol):
    """Where a FrameReader accounts the memory of the frames it allocates (the broker's KIP-72 pool).
    `try_reserve` is asked before a large frame's buffer exists; small frames, already read into the
    scratch buffer, are `charge`d when copied out. The owner releases a frame's bytes when done."""

    def try_reserve(self, nbytes: int) -> bool: ...
    def charge(self, nbytes: int) -> None: ...


class FrameReader:
    """Frames from a stream read into buffers this object provides (asyncio.BufferedProtocol's
    `get_buffer` / `buffer_updated`), so the socket's bytes are copied as few times as possible.

    Small frames are read into a scratch buffer, many per read, and copied out one by one. A frame
    that does not fit in the scratch buffer gets its own bytearray once its size is known (checked
    against `max_frame_bytes` first) and its memory is granted by the pool, if there is one; the socket
    then reads straight into it. That buffer grows with the bytes that arrive (from
    `initial_frame_bytes`, by 4x), so memory follows what was sent, never what was announced: a
    client announcing 100 MB and sending 55 bytes costs a few hundred KiB, not 100 MB of zeroes.

    The last `SPARES` large frames' buffers are kept as spares: when the next large frame starts, the
    first spare nothing else holds any more (its reference count says so: no frame user, no memoryview
    of it) is resized in place to the new size and read into again, so a stream of large frames (a
    follower's fetch responses, a producer's 1 MiB requests) does not allocate, zero-fill and
    page-fault a fresh buffer for each one. Two, because a pipelining client's next request arrives
    while the one before it is still being handled: its buffer is busy, the one before that is free.
    Memory still follows what was sent: the spares are memory this reader already held for frames
    received, and a spare still in use is left alone.

    While the pool refuses a large frame, `waiting_bytes` is its size and nothing more is parsed; the
    owner stops reading and calls `retry_reserve()` when memory is released."""

    __slots__ = ("max_frame_bytes", "pool", "initial_frame_bytes", "_scratch", "_view", "_start", "_end",
                 "_frame", "_frame_view", "_filled", "_size", "waiting_bytes", "_spares")

    def __init__(self, max_frame_bytes: int, scratch_bytes: int = 16 * 1024, pool: FramePool | None = None,
                 initial_frame_bytes: int = 256 * 1024) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.pool = pool
        self.initial_frame_bytes = initial_frame_bytes
        self._scratch = bytearray(scratch_bytes)
        self._view = memoryview(self._scratch)
        self._start = 0               # unparsed bytes are _scratch[_start:_end]
        self._end = 0
        self._frame: bytearray | None = None   # a large frame being filled in place
        self._frame_view: memoryview | None = None
        self._filled = 0
        self._size = 0                # the large frame's announced size
        self.waiting_bytes = 0        # a large frame's size while the pool refuses it
        self._spares: list[bytearray] = []     # the last large frames' buffers, reused once free

    @property
    def buffered_bytes(self) -> int:
        """Bytes of frames not yet complete."""
        return self._filled if self._frame is not None else self._end - self._start

    @property
    def reserved_bytes(self) -> int:
        """Pool memory held by the large frame being read (to release if the stream ends)."""
        return self._size if self._frame is not None else 0

    def get_buffer(self) -> memoryview:
        """Where the next read goes."""
        if self._frame is not None:
            if self._filled == len(self._frame):          # grow with what arrives, up to the size
                grown = bytearray(min(self._size, 4 * len(self._frame)))
                grown[:self._filled] = self._frame_view[:self._filled]
                self._frame_view.release()
                self._frame, self._frame_view = grown, memoryview(grown)
            return self._frame_view[self._filled:]
        if self._start and len(self._scratch) - self._end < 4096:   # move the unparsed tail to the front
            n = self._end - self._start
            self._scratch[:n] = self._view[self._start:self._end]
            self._start, self._end = 0, n
        return self._view[self._end:]

    def feed(self, data) -> list[bytearray]:
        """For a caller that already holds the bytes: copy them in, buffer by buffer."""
        view = memoryview(data).cast("B")
        frames: list[bytearray] = []
        while view:
            if self.waiting_bytes:
                raise RuntimeError("feed() while the pool refuses a frame: retry_reserve() first")
            buf = self.get_buffer()
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            view = view[n:]
            frames += self.buffer_updated(n)
        return frames

    def buffer_updated(self, nbytes: int) -> list[bytearray]:
        """`nbytes` were written into the last buffer; the frames now complete, in order."""
        if self._frame is not None:
            self._filled += nbytes
            if self._filled < self._size:
                return []
            done = self._frame
            self._frame_view.release()
            self._frame = self._frame_view = None
            self._filled = self._size = 0
            self._spares.append(done)
            if len(self._spares) > SPARES:
                del self._spares[0]
            return [done] + self._parse()
        self._end += nbytes
        return self._parse()

    def retry_reserve(self) -> bool:
        """Ask the pool again for the large frame it refused; True once the frame is being read."""
        if not self.waiting_bytes:
            return True
        if self.pool is not None and not self.pool.try_reserve(self.waiting_bytes):
            return False
        self._start_large(self.waiting_bytes)
        self.waiting_bytes = 0
        return True

    def _parse(self) -> list[bytearray]:
        if self.waiting_bytes:
            return []
        frames: list[bytearray] = []
        scratch, view, start, end = self._scratch, self._view, self._start, self._end
        pool = self.pool
        while end - start >= 4:
            size = _SIZE.unpack_from(scratch, start)[0]
            if size < 0 or size > self.max_frame_bytes:
                raise FrameTooLarge(size, self.max_frame_bytes)
            if end - start - 4 >= size:
                frames.append(bytearray(view[start + 4:start + 4 + size]))
                if pool is not None:
                    pool.charge(size)
                start += 4 + size
                continue
            if size + 4 > len(scratch):         # never fits: give it its own buffer, if the pool agrees
                self._start, self._end = start, end
                if pool is not None and not pool.try_reserve(size):
                    self.waiting_bytes = size
                    return frames
                self._start_large(size)
                return frames
            break
        if start == end:
            start = end = 0
        self._start, self._end = start, end
        return frames

    def _start_large(self, size: int) -> None:
        start, end = self._start, self._end
        have = end - start - 4
        f = self._free_spare(size)
        if f is None:
            f = bytearray(min(size, max(self.initial_frame_bytes, 2 * have)))
        f[:have] = self._view[start + 4:end]
        self._frame, self._frame_view, self._filled, self._size = f, memoryview(f), have, size
        self._start = self._end = 0


    def _free_spare(self, size: int) -> bytearray | None:
        """A spare buffer resized to `size`, if one is free (nothing else refers to it) and at least half
        that size (then the resize keeps or grows its allocation, without zero-filling)."""
        spares = self._spares
        for i in range(len(spares)):
            spare = spares[i]
            # references: the list, `spare` here and getrefcount's argument; more and someone uses it
            if sys.getrefcount(spare) > 3 or 2 * len(spare) < size:
                continue
            del spares[i]
            if len(spare) > size:
                del spare[size:]
            elif len(spare) < size:
                spare.extend(bytes(size - len(spare)))
            return spare
        return None


def frame(payload_size: int) -> bytes:
    """The size prefix for a payload of the given size."""
    return _SIZE.pack(payload_size)


COALESCE_BYTES = 64 * 1024
_BUFFERS = (bytes, bytearray, memoryview)


def coalesced(chunks: list) -> list:
    """`chunks` with each run of small byte chunks (a size prefix, a header, a small body) joined
    into one, so a message goes to the socket in one write instead of one system call per chunk.
    Chunks of COALESCE_BYTES or more, and anything that is not a buffer (a record-set reference sent
    with sendfile), stay as they are, in order; joining copies only what is small."""
    out: list = []
    run: list = []
    run_bytes = 0
    for c in chunks:
        if isinstance(c, _BUFFERS):
            n = c.nbytes if isinstance(c, memoryview) else len(c)
            if n < COALESCE_BYTES:
                if run_bytes + n > COALESCE_BYTES:
                    out.append(_joined(run))
                    run, run_bytes = [], 0
                run.append(c)
                run_bytes += n
                continue
        if run:
            out.append(_joined(run))
            run, run_bytes = [], 0
        out.append(c)
    if run:
        out.append(_joined(run))
    return out


def _joined(run: list):
    return run[0] if len(run) == 1 else b"".join(run)
