"""The records of one fetched partition as file slices, spliced into the response when it is sent.

The protocol encoder writes the length prefix from `size` and records a reference; the connection
calls `write_to(transport)` in its place. Slices are read with positioned reads (`pread`) straight into
the transport's buffer: the bytes are never decoded or re-encoded by Python. (A `sendfile` path for
plaintext listeners is the next step; see the notes of the broker issue.)
"""

from __future__ import annotations


class RecordSlices:
    __slots__ = ("slices", "size")

    def __init__(self, slices: list) -> None:
        self.slices = slices
        self.size = sum(s.length for s in slices)

    def write_to(self, transport) -> None:
        for s in self.slices:
            transport.write(s.read())

    def read(self) -> bytes:
        return b"".join(s.read() for s in self.slices)
