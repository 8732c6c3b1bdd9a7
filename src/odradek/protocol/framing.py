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


class FrameDecoder:
    """Accumulates received bytes and yields complete frames (without their size prefix)."""

    __slots__ = ("max_frame_bytes", "_buf", "_need")

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._need = -1  # size of the frame being read, -1 while reading the size

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytearray]:
        buf = self._buf
        buf += data
        frames: list[bytearray] = []
        pos = 0
        end = len(buf)
        while True:
            if self._need < 0:
                if end - pos < 4:
                    break
                size = _SIZE.unpack_from(buf, pos)[0]
                if size < 0 or size > self.max_frame_bytes:
                    raise FrameTooLarge(size, self.max_frame_bytes)
                self._need = size
                pos += 4
            if end - pos < self._need:
                break
            frames.append(buf[pos:pos + self._need])  # a writable copy: the log patches offsets in it
            pos += self._need
            self._need = -1
        if pos:
            del buf[:pos]
        return frames


def frame(payload_size: int) -> bytes:
    """The size prefix for a payload of the given size."""
    return _SIZE.pack(payload_size)
