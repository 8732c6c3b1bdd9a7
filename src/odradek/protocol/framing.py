"""Size-prefixed framing, sans I/O: bytes in, whole frames out (seed 003, "Protocol": "Requests and
Responses": every message is an int32 size followed by that many bytes).

Used by both the broker and the client. The size is checked against `max_frame_bytes` as soon as its
four bytes arrive, before anything is allocated for the frame; a negative or oversized size raises
`FrameTooLarge` and the caller closes the connection (as Kafka does for `socket.request.max.bytes`).
"""

from __future__ import annotations

import struct

from odradek.protocol.exceptions import ProtocolError

_SIZE = struct.Struct(">i")


class FrameTooLarge(ProtocolError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class FrameReader:
    """Frames from a stream read into buffers this object provides (asyncio.BufferedProtocol's
    `get_buffer` / `buffer_updated`), so the socket's bytes are copied as few times as possible.

    Small frames are read into a scratch buffer, many per read, and copied out one by one. A frame
    that does not fit in the scratch buffer gets its own bytearray as soon as its size is known (checked
    against `max_frame_bytes` first, as Kafka allocates a request's buffer once its size is read), and
    the socket reads straight into it: a 1 MiB Produce request is copied once, by the kernel, instead
    of piece by piece into a growing buffer and then out of it again."""

    __slots__ = ("max_frame_bytes", "_scratch", "_view", "_start", "_end", "_frame", "_frame_view",
                 "_filled")

    def __init__(self, max_frame_bytes: int, scratch_bytes: int = 16 * 1024) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._scratch = bytearray(scratch_bytes)
        self._view = memoryview(self._scratch)
        self._start = 0               # unparsed bytes are _scratch[_start:_end]
        self._end = 0
        self._frame: bytearray | None = None   # a large frame being filled in place
        self._frame_view: memoryview | None = None
        self._filled = 0

    @property
    def buffered_bytes(self) -> int:
        return self._filled if self._frame is not None else self._end - self._start

    def get_buffer(self) -> memoryview:
        """Where the next read goes."""
        if self._frame_view is not None:
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
            if self._filled < len(self._frame):
                return []
            done = self._frame
            self._frame = self._frame_view = None
            self._filled = 0
            return [done]
        self._end += nbytes
        frames: list[bytearray] = []
        scratch, view, start, end = self._scratch, self._view, self._start, self._end
        while end - start >= 4:
            size = _SIZE.unpack_from(scratch, start)[0]
            if size < 0 or size > self.max_frame_bytes:
                raise FrameTooLarge(size, self.max_frame_bytes)
            if end - start - 4 >= size:
                frames.append(bytearray(view[start + 4:start + 4 + size]))
                start += 4 + size
                continue
            if size + 4 > len(scratch):         # never fits: give it its own buffer
                have = end - start - 4
                f = bytearray(size)
                f[:have] = view[start + 4:end]
                self._frame, self._frame_view, self._filled = f, memoryview(f), have
                start = end = 0
            break
        if start == end:
            start = end = 0
        self._start, self._end = start, end
        return frames


def frame(payload_size: int) -> bytes:
    """The size prefix for a payload of the given size."""
    return _SIZE.pack(payload_size)
