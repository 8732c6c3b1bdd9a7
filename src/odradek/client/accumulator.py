"""The producer's record accumulator: per-partition queues of batches, bounded by `buffer.memory`.

Seed 003, "Asynchronous send": records are accumulated in memory and sent in larger batches, bounded by
size (`batch.size`) and by latency (`linger.ms`). A partition's first batch is sendable when it is full,
when `linger.ms` has passed since it was created, when a flush or close is waiting, when the buffer is
exhausted (someone waits for space), or when it is a retry whose `retry.backoff.ms` has passed.

Memory: every appended record is charged its encoded size estimate against `buffer.memory`, released
when its batch completes; `reserve()` waits (up to a deadline) while the buffer is full, which is how
`send()` blocks for at most `max.block.ms`. The batch taking a topic's keyless records is charged in
advance (`grant`: what batch.size and the free buffer allow) and the producer spends that `room` per
record; the unspent rest goes back when the batch closes, when the producer appends to it otherwise, or
when someone must wait for memory (`revoke`). Batches older than `delivery.timeout.ms` that are still
queued are expired (`expire`).

Buffers: a batch whose request was answered gives its builder's buffer back (`recycle`) to a
`BufferPool`, and new batches write into those first, so steady producing reuses memory that is
already mapped instead of growing a fresh buffer per batch. As in the Java producer, idle buffers
live inside buffer.memory: the pool keeps one only while its idle bytes and the bytes charged to
batches stay within buffer.memory.

Idempotence: with `guarantee_order` a partition has at most one batch in flight (`muted`), so
retries keep their sequence numbers and order without the Java client's in-flight bookkeeping.
Transactions: a partition's batches are not sendable while it is `blocked` (not yet added to the
transaction with AddPartitionsToTxn).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Iterable

from odradek.client.batch import ProducerBatch
from odradek.client.errors import KafkaTimeoutError
from odradek.records.buffer_pool import BufferPool
from odradek.records.builder import RecordBatchBuilder
from odradek.records.header import NO_SEQUENCE

RECORD_OVERHEAD = 21  # length, attributes, deltas, key and value lengths, header count (upper bound)


def record_size(key, value, headers) -> int:
    n = RECORD_OVERHEAD + (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
    if headers:
        for k, v in headers:
            n += 10 + len(k) + (len(v) if v is not None else 0)
    return n


class RecordAccumulator:
    def __init__(self, *, batch_size: int, buffer_memory: int, linger_ms: int, compression: int,
                 delivery_timeout_ms: int, retry_backoff_ms: int, guarantee_order: bool,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.batch_size = batch_size
        self.buffer_memory = buffer_memory
        self.linger_ms = linger_ms
        self.compression = compression
        self.delivery_timeout_ms = delivery_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.guarantee_order = guarantee_order
        self.loop = loop
        self.queues: dict[tuple[str, int], collections.deque[ProducerBatch]] = {}
        self.open: dict[str, dict[int, ProducerBatch]] = {}   # topic -> partition -> batch taking appends
        self.incomplete: set[ProducerBatch] = set()
        self.muted: set[tuple[str, int]] = set()
        self.blocked: set[tuple[str, int]] = set()   # a transaction has not added these partitions yet
        self.used_bytes = 0
        self.flushing = 0
        self.closing = False
        self._waiting = 0
        self._freed = asyncio.Event()
        self._drain_index: dict[int, int] = {}
        # a batch's buffer ends up a little past batch.size (the last record, BytesIO's growth step)
        self.buffers = BufferPool(batch_size + batch_size // 4 + 4096)

    # ------------------------------------------------------------------------------------ memory
    def has_room(self, size: int) -> bool:
        return self.used_bytes + size <= self.buffer_memory and not self._waiting

    async def reserve(self, size: int, deadline_ms: float, now_ms) -> None:
        """Wait until `size` more bytes fit in buffer.memory, or raise KafkaTimeoutError at the deadline."""
        self._waiting += 1
        self.revoke_all()
        try:
            while self.used_bytes + size > self.buffer_memory:
                left = deadline_ms - now_ms()
                if left <= 0:
                    raise KafkaTimeoutError(
                        f"buffer.memory ({self.buffer_memory} bytes) still full after max.block.ms")
                try:
                    async with asyncio.timeout(left / 1000):
                        await self._freed.wait()
                except TimeoutError:
                    pass
        finally:
            self._waiting -= 1

    def release(self, size: int) -> None:
        self.used_bytes -= size
        if self._waiting:
            self._freed.set()
            self._freed = asyncio.Event()

    @property
    def exhausted(self) -> bool:
        return self._waiting > 0

    def grant(self, b: ProducerBatch) -> None:
        """Charge open batch b in advance with all batch.size and the free buffer still allow; the
        producer spends `b.room` per record without asking again. Not while someone waits for memory."""
        credit = min(self.batch_size - b.size_bytes, self.buffer_memory - self.used_bytes)
        if credit > 0 and not self._waiting and not b.closed:
            b.room += credit
            b.size_bytes += credit
            self.used_bytes += credit

    def revoke(self, b: ProducerBatch) -> None:
        """Give back what b was charged in advance and has not spent."""
        room = b.room
        if room:
            b.room = 0
            b.size_bytes -= room
            self.release(room)

    def revoke_all(self) -> None:
        for ot in self.open.values():
            for b in ot.values():
                if b.room:
                    self.revoke(b)

    # ------------------------------------------------------------------------------------ append
    def open_batch(self, topic: str, partition: int) -> ProducerBatch | None:
        ot = self.open.get(topic)
        return ot.get(partition) if ot is not None else None

    def close_batch(self, b: ProducerBatch) -> None:
        """No more appends to b."""
        self.revoke(b)
        b.closed = True
        ot = self.open.get(b.topic)
        if ot is not None and ot.get(b.partition) is b:
            del ot[b.partition]

    def new_batch(self, topic: str, partition: int, now_ms: float) -> ProducerBatch:
        tp = (topic, partition)
        q = self.queues.get(tp)
        if q is None:
            q = self.queues[tp] = collections.deque()
        elif q and not q[-1].closed:
            self.close_batch(q[-1])
        builder = RecordBatchBuilder(compression=self.compression, buffer=self.buffers.take())
        b = ProducerBatch(topic, partition, builder, now_ms, now_ms + self.delivery_timeout_ms, self.loop)
        q.append(b)
        self.open.setdefault(topic, {})[partition] = b
        self.incomplete.add(b)
        self.used_bytes += b.size_bytes
        return b

    # ------------------------------------------------------------------------------------ sender side
    def ready(self, leader_for, now_ms: float) -> tuple[set[int], float, bool]:
        """(nodes with a sendable batch, ms until the next batch may become sendable, whether some
        partition has no known leader)."""
        nodes: set[int] = set()
        next_ms = float("inf")
        unknown_leader = False
        force = self.flushing > 0 or self.closing or self._waiting > 0
        for tp, q in self.queues.items():
            if not q or tp in self.muted or tp in self.blocked:
                continue
            b = q[0]
            if b.attempts and b.retry_at_ms > now_ms:
                next_ms = min(next_ms, b.retry_at_ms - now_ms)
                continue
            leader = leader_for(tp[0], tp[1])
            if leader < 0:
                unknown_leader = True
                continue
            if leader in nodes:
                continue
            if force or b.closed or len(q) > 1 or b.attempts:
                nodes.add(leader)
            else:
                wait = b.created_ms + self.linger_ms - now_ms
                if wait <= 0:
                    nodes.add(leader)
                else:
                    next_ms = min(next_ms, wait)
        return nodes, next_ms, unknown_leader

    def drain(self, node: int, leader_for, max_request_size: int, now_ms: float) -> list[ProducerBatch]:
        """Take at most one sendable batch per partition led by `node`, up to max.request.size bytes."""
        out: list[ProducerBatch] = []
        size = 0
        tps = [tp for tp, q in self.queues.items() if q and tp not in self.muted and tp not in self.blocked
               and leader_for(tp[0], tp[1]) == node]
        if not tps:
            return out
        start = self._drain_index.get(node, 0) % len(tps)   # round-robin, so no partition starves
        force = self.flushing > 0 or self.closing or self._waiting > 0
        for i in range(len(tps)):
            tp = tps[(start + i) % len(tps)]
            q = self.queues[tp]
            b = q[0]
            if b.attempts and b.retry_at_ms > now_ms:
                continue
            if not (force or b.closed or len(q) > 1 or b.attempts or now_ms - b.created_ms >= self.linger_ms):
                continue
            n = len(b.built) if b.built is not None else b.size_bytes - b.room
            if out and size + n > max_request_size:
                break
            q.popleft()
            if not b.closed:
                self.close_batch(b)
            size += n
            out.append(b)
            if self.guarantee_order:
                self.muted.add(tp)
        self._drain_index[node] = start + 1
        return out

    def reenqueue(self, b: ProducerBatch, now_ms: float) -> None:
        """A retriable failure: back to the front of its queue after retry.backoff.ms."""
        b.attempts += 1
        b.retry_at_ms = now_ms + self.retry_backoff_ms
        b.in_flight = False
        tp = (b.topic, b.partition)
        q = self.queues.get(tp)
        if q is None:
            q = self.queues[tp] = collections.deque()
        q.appendleft(b)
        self.muted.discard(tp)

    def completed(self, b: ProducerBatch) -> None:
        """Bookkeeping once `b.complete()` has run."""
        self.incomplete.discard(b)
        self.muted.discard((b.topic, b.partition))
        b.room = 0   # released with the rest
        self.release(b.size_bytes)

    def recycle(self, builder: RecordBatchBuilder | None) -> None:
        """A completed batch's builder, whose request was answered (so no socket buffer still holds a
        view of its bytes): its buffer serves a later batch."""
        if builder is not None:
            self.buffers.give(builder.detach_buffer(), self.buffer_memory - self.used_bytes)

    def expire(self, now_ms: float) -> list[ProducerBatch]:
        """Queued batches past delivery.timeout.ms, removed from their queues."""
        out = []
        for q in self.queues.values():
            while q and q[0].deadline_ms <= now_ms and not q[0].in_flight:
                b = q.popleft()
                if not b.closed:
                    self.close_batch(b)
                out.append(b)
        return out

    def abort_all(self) -> list[ProducerBatch]:
        out = []
        for q in self.queues.values():
            out.extend(q)
            q.clear()
        return out

    def has_queued(self) -> bool:
        return any(self.queues.values())

    def unsequence(self, batches: Iterable[ProducerBatch]) -> None:
        """Forget producer ids and sequences (after a new producer id): rebuilt at the next drain."""
        for b in batches:
            if b.sequenced and not b.in_flight:
                b.sequenced = False
                if b.builder is not None:   # a batch given whole (send_batch) is stamped again instead
                    b.built = None
                    b.builder.base_sequence = NO_SEQUENCE
