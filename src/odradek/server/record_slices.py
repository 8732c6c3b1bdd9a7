"""The records of one fetched partition as file slices, spliced into the response when it is sent.

The protocol encoder writes the length prefix from `size` and records a reference; the connection
awaits `send(transport, loop)` in its place. Large slices go out with `sendfile` (the kernel copies
from the page cache to the socket; DESIGN, "Reads are slices of files, not copies") when the event
loop can do it natively; small ones, and every slice on loops without native sendfile, are read with
positioned reads (`pread`) into the transport. Either way the bytes are never decoded by Python.
"""

from __future__ import annotations

import asyncio

SENDFILE_MIN_BYTES = 64 * 1024


def native_sendfile(loop) -> bool:
    """asyncio's own selector loop sends files natively; uvloop's loop.sendfile would fall back to
    seeking and reading the shared segment file object, which storage forbids."""
    return isinstance(loop, asyncio.BaseEventLoop) and hasattr(loop, "_sendfile_native")


class RecordSlices:
    __slots__ = ("slices", "size")

    def __init__(self, slices: list) -> None:
        self.slices = slices
        self.size = sum(s.length for s in slices)

    async def send(self, transport, loop, use_sendfile: bool) -> None:
        for s in self.slices:
            if use_sendfile and s.length >= SENDFILE_MIN_BYTES:
                await loop.sendfile(transport, s.file, s.position, s.length, fallback=False)
            else:
                transport.write(s.read())

    def read(self) -> bytes:
        return b"".join(s.read() for s in self.slices)
