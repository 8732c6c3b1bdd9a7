"""A bounded pool of record-batch buffers for a producer (seed 003, "Asynchronous send").

A producer accumulates records in memory and sends them in batches of up to `batch.size` bytes, one
after another. Each batch's `RecordBatchBuilder` writes into an `io.BytesIO`; a fresh one grows by
reallocation and the operating system maps its pages one fault at a time, for every batch. Handing a
finished batch's buffer to the next builder (`RecordBatchBuilder(buffer=pool.take())`) skips both: its
memory is already allocated and mapped. Kafka's Java producer keeps a free list of batch.size buffers
inside buffer.memory for the same reason.

Bounds: `give(buf, room)` keeps a buffer only while the idle buffers' allocations (`__sizeof__`) stay
within `room` (what the caller's memory budget has left) and the buffer is at most `max_buffer_bytes`,
so an odd oversized batch is not kept. A buffer is only given back when nothing may read its bytes any
more (its batch's request answered); one that still has exported views (a memoryview somebody kept)
is refused, since the next batch would overwrite what that view shows.
"""

from __future__ import annotations

import io


class BufferPool:
    def __init__(self, max_buffer_bytes: int) -> None:
        self.max_buffer_bytes = max_buffer_bytes
        self.idle_bytes = 0
        self._idle: list[tuple[io.BytesIO, int]] = []

    def __len__(self) -> int:
        return len(self._idle)

    def take(self) -> io.BytesIO | None:
        """The idle buffer used last (its memory the most likely still cached), or None: the builder
        makes a fresh one."""
        if not self._idle:
            return None
        buf, size = self._idle.pop()
        self.idle_bytes -= size
        return buf

    def give(self, buf: io.BytesIO, room: int) -> bool:
        """Keep `buf` for a later batch if idle buffers then hold at most `room` bytes; whether it was
        kept."""
        size = buf.__sizeof__()
        if size > self.max_buffer_bytes or self.idle_bytes + size > room:
            return False
        try:
            buf.write(b"")   # BufferError while a view of its bytes is alive
        except BufferError:
            return False
        self._idle.append((buf, size))
        self.idle_bytes += size
        return True

    def clear(self) -> None:
        self._idle.clear()
        self.idle_bytes = 0
