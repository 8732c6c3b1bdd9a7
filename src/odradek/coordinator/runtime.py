"""The group coordinator's runtime: the one place with I/O (DESIGN, Layers: "pure state machines plus
one small runtime that persists their records in internal topics").

It owns one `GroupShard` per `__consumer_offsets` partition this broker leads, and:

- loads a shard when it is elected (`elect`): reads the partition from its log start to its high
  watermark, `offsets.load.buffer.size` bytes at a time, replaying every record; until it is done,
  requests for its groups get COORDINATOR_LOAD_IN_PROGRESS (seed 001: a member that reaches the new
  coordinator too early is rejected and retries). Groups of partitions it does not lead get
  NOT_COORDINATOR;
- runs operations (`execute`): calls the pure operation with the clock's time, parks the caller if
  the operation says so, appends the records as one batch through the partition's log as leader and
  replays them at once (later operations see them, as Kafka's uncommitted timeline state);
- completes a write when the partition's high watermark reaches its records (Kafka's
  CoordinatorRuntime deferred events): the caller's response and the completions the write produced
  (answers to parked callers) wait until `high_watermark_advanced` reports the offset after the batch.
  An operation that writes nothing waits for the last write of its partition, so no answer ever
  reveals state that is not committed. When the high watermark is already there (one broker, or a
  fast ISR) nothing waits;
- runs timers: sleeps until the earliest deadline of any shard and fires what is due.

A write that cannot be committed here (an append failure, or resigning before the high watermark
passes it) fails its waiters with COORDINATOR_NOT_AVAILABLE or NOT_COORDINATOR, and the shard is
reloaded from its committed records.

Everything it holds is bounded: parked callers by connections (a connection sends one request at a
time), writes waiting for the high watermark by those callers plus timers, timers by groups and
members, a load read by `offsets.load.buffer.size`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from odradek.coordinator.membership import fire
from odradek.coordinator.offsets import remove_topics
from odradek.coordinator.records import TxnMarkerRecord, build_batch, iter_batches, partition_for
from odradek.coordinator.shard import GroupConfig, GroupShard, Outcome, WaitKey
from odradek.protocol.error_codes import ErrorCode

log = logging.getLogger("odradek.coordinator")

RETENTION_TIMER = ("offsets-retention",)


class CoordinatorError(Exception):
    """The request cannot be served here now; `code` tells the client what to do."""

    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.name)
        self.code = code


class CoordinatorLog(Protocol):
    """The port to one `__consumer_offsets` partition's log (the broker adapts its partition)."""

    @property
    def log_start_offset(self) -> int: ...

    @property
    def high_watermark(self) -> int: ...

    @property
    def log_end_offset(self) -> int:
        """Where loading stops: a new leader's whole log (Kafka's group coordinator loads to the log
        end; a leader's records past the high watermark become committed, the followers truncate to it)."""

    def append(self, batch: bytes, now_ms: int) -> int:
        """Append one batch as the leader and return the offset after it, without waiting for it to
        be committed (the runtime is told through `high_watermark_advanced`); raise on failure."""

    def read(self, start_offset: int, max_bytes: int) -> bytes:
        """Whole batches from start_offset, about max_bytes (at least one batch), below the log end."""


@dataclass(slots=True)
class DeferredWrite:
    """A write's outcome, held until the high watermark reaches `offset`."""
    offset: int
    completions: list[tuple[WaitKey, Any]]
    done: asyncio.Future[None]


def _retrieve(fut: asyncio.Future[None]) -> None:
    """Mark an outcome as seen: writes of timers are awaited by nobody."""
    if not fut.cancelled():
        fut.exception()


class GroupCoordinator:
    def __init__(self, config: GroupConfig, clock: Callable[[], int],
                 new_uuid: Callable[[], str] = lambda: str(uuid.uuid4())) -> None:
        self.config = config
        self.clock = clock
        self.new_uuid = new_uuid
        self.partition_count: int | None = None
        self._shards: dict[int, GroupShard] = {}
        self._logs: dict[int, CoordinatorLog] = {}
        self._last_written: dict[int, int] = {}          # partition -> offset after its last write
        self._deferred: dict[int, deque[DeferredWrite]] = {}
        self._loading: dict[int, asyncio.Task] = {}
        self._waiters: dict[WaitKey, asyncio.Future] = {}
        self._wake: asyncio.Event | None = None
        self._next_wake_ms: int | None = None
        self._timer_task: asyncio.Task | None = None

    # ------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._timer_task = asyncio.get_running_loop().create_task(self._run_timers())

    async def aclose(self) -> None:
        tasks = [t for t in [self._timer_task, *self._loading.values()] if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
        self._loading.clear()
        self._fail_waiters(lambda key: True, ErrorCode.NOT_COORDINATOR)
        self._shards.clear()

    # ------------------------------------------------------------------------------ ownership
    def elect(self, partition: int, log_: CoordinatorLog, partition_count: int) -> None:
        """This broker now leads `partition` of the offsets topic: load its groups."""
        self.partition_count = partition_count
        if partition in self._shards or partition in self._loading:
            return
        self._logs[partition] = log_
        task = asyncio.get_running_loop().create_task(self._load(partition, log_))
        self._loading[partition] = task
        task.add_done_callback(functools.partial(self._loaded, partition))

    def resign(self, partition: int) -> None:
        """Leadership moved away: drop the shard; parked callers go find the new coordinator."""
        task = self._loading.pop(partition, None)
        if task is not None:
            task.cancel()
        self._shards.pop(partition, None)
        self._logs.pop(partition, None)
        self._last_written.pop(partition, None)
        for write in self._deferred.pop(partition, ()):
            if not write.done.done():
                write.done.set_exception(CoordinatorError(ErrorCode.NOT_COORDINATOR))
        self._fail_waiters(lambda key: self._partition_of(key[1]) == partition, ErrorCode.NOT_COORDINATOR)

    def owns(self, partition: int) -> bool:
        return partition in self._shards or partition in self._loading

    @property
    def loading(self) -> bool:
        return bool(self._loading)

    def shards(self) -> list[GroupShard]:
        return [self._shards[p] for p in sorted(self._shards)]

    def _partition_of(self, group_id: str) -> int | None:
        return None if self.partition_count is None else partition_for(group_id, self.partition_count)

    def shard_for(self, group_id: str) -> GroupShard:
        p = self._partition_of(group_id)
        if p is None:
            raise CoordinatorError(ErrorCode.NOT_COORDINATOR)
        shard = self._shards.get(p)
        if shard is not None:
            return shard
        if p in self._loading:
            raise CoordinatorError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        raise CoordinatorError(ErrorCode.NOT_COORDINATOR)

    # ------------------------------------------------------------------------------ operations
    async def execute(self, group_id: str, op: Callable[..., Outcome], *args: Any) -> Any:
        """Run `op(shard, *args, now_ms)` for the group's shard; its response once its write is
        committed and, for a parked caller, once it has one."""
        shard = self.shard_for(group_id)
        now = self.clock()
        outcome = op(shard, *args, now)
        fut = self._park(outcome.park) if outcome.park is not None else None
        try:
            committed = self._commit(shard, outcome, now)
            if committed is not None:
                await committed
        except CoordinatorError:
            if fut is not None and fut.done() and not fut.cancelled():
                fut.exception()   # failed with the shard; the caller gets the error raised here
            raise
        if fut is None:
            return outcome.response
        return await fut

    def high_watermark_advanced(self, partition: int, high_watermark: int) -> None:
        """The partition's high watermark moved: complete the writes it has passed, in order."""
        queue = self._deferred.get(partition)
        while queue and queue[0].offset <= high_watermark:
            write = queue.popleft()
            self._complete(write.completions)
            if not write.done.done():
                write.done.set_result(None)

    def remove_topics(self, topics: set[str]) -> None:
        """Deleted topics: their committed offsets go from every group this broker coordinates."""
        now = self.clock()
        for shard in self.shards():
            try:
                self._commit(shard, remove_topics(shard, topics), now)
            except CoordinatorError:
                pass   # the shard is reloading; its groups are cleaned when it is loaded again

    def complete_transaction(self, partition: int, producer_id: int, commit: bool) -> None:
        """The transaction coordinator wrote the producer's marker to the partition: its pending
        offset commits are committed or dropped (a shard still loading reads the marker itself)."""
        shard = self._shards.get(partition)
        if shard is not None:
            shard.replay(TxnMarkerRecord(producer_id, commit), self.clock())

    def query(self, group_id: str, fn: Callable[..., Any], *args: Any) -> Any:
        """A read-only look at the group's shard: `fn(shard, *args)`."""
        return fn(self.shard_for(group_id), *args)

    def _commit(self, shard: GroupShard, outcome: Outcome, now_ms: int) -> asyncio.Future[None] | None:
        """Append and replay the outcome's records; None if the partition's high watermark has
        reached its last write (the completions are handed out), else a future set when it does."""
        p = shard.partition
        log_ = self._logs[p]
        if outcome.records:
            try:
                end = log_.append(build_batch(outcome.records, now_ms), now_ms)
            except CoordinatorError:
                raise   # the log refused the batch (a fenced producer): nothing was appended
            except Exception as e:  # noqa: BLE001 - any append failure leaves the state unknown
                log.error("appending %d records to __consumer_offsets-%d failed: %s; reloading it",
                          len(outcome.records), p, e)
                self._reload(p)
                raise CoordinatorError(ErrorCode.COORDINATOR_NOT_AVAILABLE) from e
            self._last_written[p] = end
            for r in outcome.records[outcome.replayed:]:
                shard.replay(r, now_ms)
        deadline = shard.next_deadline()
        if deadline is not None and (self._next_wake_ms is None or deadline < self._next_wake_ms):
            assert self._wake is not None
            self._wake.set()
        if log_.high_watermark >= self._last_written.get(p, 0):
            self._complete(outcome.completions)
            return None
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.add_done_callback(_retrieve)
        self._deferred.setdefault(p, deque()).append(
            DeferredWrite(self._last_written[p], list(outcome.completions), done))
        return done

    def _complete(self, completions: list[tuple[WaitKey, Any]]) -> None:
        for key, response in completions:
            fut = self._waiters.pop(key, None)
            if fut is not None and not fut.done():
                fut.set_result(response)

    def _park(self, key: WaitKey) -> asyncio.Future:
        old = self._waiters.pop(key, None)
        if old is not None and not old.done():
            # The same member asked again on another connection: the first request is stale.
            old.set_exception(CoordinatorError(ErrorCode.REBALANCE_IN_PROGRESS))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[key] = fut
        fut.add_done_callback(functools.partial(self._unpark, key))
        return fut

    def _unpark(self, key: WaitKey, fut: asyncio.Future[Any]) -> None:
        if self._waiters.get(key) is fut:
            del self._waiters[key]

    def _fail_waiters(self, which: Callable[[WaitKey], bool], code: ErrorCode) -> None:
        for key in [k for k in self._waiters if which(k)]:
            fut = self._waiters.pop(key)
            if not fut.done():
                fut.set_exception(CoordinatorError(code))

    def _reload(self, partition: int) -> None:
        log_ = self._logs.get(partition)
        count = self.partition_count
        self.resign(partition)
        if log_ is not None and count is not None:
            self.elect(partition, log_, count)

    # ------------------------------------------------------------------------------ loading
    async def _load(self, partition: int, log_: CoordinatorLog) -> GroupShard:
        started = self.clock()
        shard = GroupShard(partition, self.config, self.new_uuid)
        offset = log_.log_start_offset
        records = 0
        while offset < log_.log_end_offset:
            buf = log_.read(offset, self.config.load_buffer_bytes)
            now = self.clock()
            next_offset = offset
            for next_offset, batch in iter_batches(buf):
                for r in batch:
                    shard.replay(r, now)
                records += len(batch)
            if next_offset <= offset:
                log.error("__consumer_offsets-%d: no progress loading at offset %d; stopping", partition, offset)
                break
            offset = next_offset
            await asyncio.sleep(0)   # let requests in (they get COORDINATOR_LOAD_IN_PROGRESS)
        now = self.clock()
        shard.schedule(RETENTION_TIMER, now + self.config.offsets_retention_check_interval_ms)
        log.log(logging.INFO if records else logging.DEBUG,
                "Finished loading offsets and group metadata from __consumer_offsets-%d in %d ms: "
                "%d records, %d groups", partition, now - started, records, len(shard.groups))
        return shard

    def _loaded(self, partition: int, task: asyncio.Task[GroupShard]) -> None:
        if self._loading.get(partition) is not task:
            return
        del self._loading[partition]
        if task.cancelled():
            return
        if task.exception() is not None:
            log.error("loading __consumer_offsets-%d failed", partition, exc_info=task.exception())
            return
        self._shards[partition] = task.result()
        if self._wake is not None:
            self._wake.set()

    # ------------------------------------------------------------------------------ timers
    async def _run_timers(self) -> None:
        wake = self._wake
        assert wake is not None
        while True:
            now = self.clock()
            nearest = None
            for shard in list(self._shards.values()):
                for key in shard.pop_due(now):
                    if self._shards.get(shard.partition) is not shard:
                        break
                    try:
                        self._commit(shard, fire(shard, key, now), now)
                    except CoordinatorError:
                        break   # the shard is reloading
                    except Exception:
                        log.exception("timer %r of __consumer_offsets-%d failed", key, shard.partition)
                deadline = shard.next_deadline()
                if deadline is not None and (nearest is None or deadline < nearest):
                    nearest = deadline
            wake.clear()
            self._next_wake_ms = nearest
            # Not asyncio.wait_for: before Python 3.12 it can swallow a cancellation that arrives
            # together with the wake-up, and aclose() would then wait for the next deadline.
            handle = None if nearest is None else asyncio.get_running_loop().call_later(
                max(nearest - self.clock(), 0) / 1000, wake.set)
            try:
                await wake.wait()
            finally:
                if handle is not None:
                    handle.cancel()
