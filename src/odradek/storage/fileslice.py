"""FileSlice: a range of a segment file handed to the fetch path instead of a copy of its bytes.

A slice is (file, position, length) and always covers whole batches. `file` is the segment's open,
binary file object; `fileno()` gives the descriptor for `os.sendfile(sock, fd, position, length)`, and
`read()` / `readinto()` copy the bytes with `pread` when the caller needs them (TLS, tests, legacy
down-conversion).

Rules for the fetch path:
- Use only positioned I/O (`os.sendfile` with an explicit offset, `pread`): the file object is shared
  by every reader of the segment, so its seek position means nothing. (asyncio's `loop.sendfile`
  fallback for transports without sendfile seeks and reads that shared object; do not use it here.)
- The descriptor stays open while the slice is in flight: a deleted segment is first renamed to
  `.deleted` and closed only after `file.delete.delay.ms`, as in Kafka. A replica truncation can still
  shorten the file under a slice, so `read` raises `StorageError` on a short read and a sender must
  treat a short `sendfile` the same way.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

from odradek.storage.errors import StorageError


@dataclass(frozen=True, slots=True)
class FileSlice:
    file: io.FileIO
    position: int
    length: int

    @property
    def path(self) -> str:
        return str(self.file.name)

    def fileno(self) -> int:
        return self.file.fileno()

    def read(self) -> bytes:
        buf = bytearray(self.length)
        self.readinto(buf)
        return bytes(buf)

    def readinto(self, buf) -> int:
        """Fill buf[:length] with the slice's bytes; buf must hold at least `length` bytes."""
        view = memoryview(buf)[: self.length]
        done = 0
        fd = self.file.fileno()
        while done < self.length:
            n = os.preadv(fd, [view[done:]], self.position + done)
            if n == 0:
                raise StorageError(
                    f"{self.path}: {self.length - done} bytes missing at {self.position + done}")
            done += n
        return done
