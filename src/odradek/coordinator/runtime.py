"""The coordinators' runtime: the one place with I/O (DESIGN, Layers: "pure state machines plus one
small runtime that persists their records in internal topics"; Kafka's CoordinatorRuntime).

`CoordinatorRuntime` is generic over the shard it keeps: both the group coordinator (`GroupCoordinator`
below, one `GroupShard` per `__consumer_offsets` partition) and the transaction coordinator
(`transactions_runtime.py`, one `TxnShard` per `__transaction_state` partition) are records-out state
machines on it. A shard is the state of one partition this broker leads, rebuilt by `replay(record,
now_ms)`; the topic's `CoordinatorTopic` says how records are encoded into batches and read back.

The runtime:

- loads a shard when it is elected (`elect`): reads the partition from its log start,
  `load_buffer_bytes` at a time, replaying every record; until it is done, requests for its keys get
  COORDINATOR_LOAD_IN_PROGRESS (seed 001: a member that reaches the new coordinator too early is
  rejected and retries). Keys of partitions it does not lead get NOT_COORDINATOR;
- writes an operation's records (`_write`) as one batch through the partition's log as leader and
  replays them at once (later operations see them, as Kafka's uncommitted timeline state);
- completes a write when the partition's high watermark reaches its records (Kafka's deferred
  events): the caller's response and the completions the write produced (answers to parked callers)
  wait until `high_watermark_advanced` reports the offset after the batch. An operation that writes
  nothing waits for the last write of its partition, so no answer ever reveals state that is not
  committed. When the high watermark is already there (one broker, or a fast ISR) nothing waits;
- parks callers that wait for other callers (`_park`) and answers them with a write's completions;
  while a caller waits (for other callers, or for its write's high watermark) it is inside `parked()`,
  a context the broker sets so that a request waiting here does not count as work in progress
  (`queued.max.requests`; Kafka's handler threads leave such requests in its purgatories);
- runs the coordinator's timers (`_run_timers`, a task from `start` to `aclose`).

A write that cannot be committed here (an append failure, or resigning before the high watermark
passes it) fails its waiters with COORDINATOR_NOT_AVAILABLE or NOT_COORDINATOR, and the shard is
reloaded from its committed records.

The group coordinator: a partition is loaded to its log end (a new leader's records past the high
watermark become committed); after a load the offsets retention timer is armed. Timers sleep until
the earliest deadline of any shard and fire what is due.

Everything it holds is bounded: parked callers by connections (a connection sends one request at a
time), writes waiting for the high watermark by those callers plus timers, timers by groups and
members, a load read by `load_buffer_bytes` (offsets.load.buffer.size).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable, Generic, Protocol, Sequence, TypeVar

from odradek.coordinator.membership import fire
from odradek.coordinator.offsets import remove_topics
from odradek.coordinator.records import (
    OFFSETS_TOPIC, Record, TxnMarkerRecord, build_batch, iter_batches, partition_for,
)
from odradek.coordinator.shard import GroupConfig, GroupShard, Outcome, WaitKey
from odradek.protocol.error_codes import ErrorCode

log = logging.getLogger("odradek.coordinator")

RETENTION_TIMER = ("offsets-retention",)

R = TypeVar("R")
R_contra = TypeVar("R_contra", contravariant=True)


class CoordinatorError(Exception):
    """The request cannot be served here now; `code` tells the client what to do."""

    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.name)
        self.code = code


class CoordinatorLog(Protocol):
    """The port to one partition of a coordinator's topic (the broker adapts its partition)."""

    @property
    def log_start_offset(self) -> int: ...

    @property
    def high_watermark(self) -> int: ...

    @property
    def log_end_offset(self) -> int:
        """Where the group coordinator's loading stops: a new leader's whole log (Kafka's group
        coordinator loads to the log end; a leader's records past the high watermark become
        committed, the followers truncate to it)."""

    def append(self, batch: bytes, now_ms: int) -> int:
        """Append one batch as the leader and return the offset after it, without waiting for it to
        be committed (the runtime is told through `high_watermark_advanced`); raise on failure."""

    def read(self, start_offset: int, max_bytes: int) -> bytes:
        """Whole batches from start_offset, about max_bytes (at least one batch), below the log end."""


class Shard(Protocol[R_contra]):
    """The state of one partition of a coordinator's topic, rebuilt from its records."""

    @property
    def partition(self) -> int: ...

    def replay(self, record: R_contra, now_ms: int) -> None:
        """Apply one record (while loading, and right after the runtime appends it)."""


S = TypeVar("S", bound=Shard[Any])


@dataclass(frozen=True)
class CoordinatorTopic(Generic[R]):
    """A coordinator's internal topic: its name, which partition holds a key, and its record format."""
    name: str
    partition_for: Callable[[str, int], int]
    build_batch: Callable[[list[R], int], bytes]
    iter_batches: Callable[[bytes], Iterator[tuple[int, list[R]]]]


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


class CoordinatorRuntime(Generic[S, R]):
    """The shards of the partitions this broker leads, their loading, writes and parked callers.

    A coordinator subclasses it with `_new_shard` (an empty shard), `_run_timers` and, where it
    needs them, the hooks `_loaded_shard` (after a load), `_resigned` and `_closed`. Parked callers
    are keyed by a `WaitKey` whose second element is the coordinator key (group id)."""

    def __init__(self, topic: CoordinatorTopic[R], clock: Callable[[], int], load_buffer_bytes: int,
                 logger: logging.Logger) -> None:
        self.topic = topic
        self.clock = clock
        self.load_buffer_bytes = load_buffer_bytes
        self.log = logger
        self.partition_count: int | None = None
        self._shards: dict[int, S] = {}
        self._logs: dict[int, CoordinatorLog] = {}
        self._epochs: dict[int, int] = {}                 # partition -> coordinator epoch
        self._last_written: dict[int, int] = {}          # partition -> offset after its last write
        self._deferred: dict[int, deque[DeferredWrite]] = {}
        self._loading: dict[int, asyncio.Task] = {}
        self._waiters: dict[WaitKey, asyncio.Future] = {}
        self._timer_task: asyncio.Task | None = None
        # entered while a caller waits; the broker sets its request parking (server.network.Parked)
        self.parked: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext

    # ------------------------------------------------------------------------------ the coordinator's part
    def _new_shard(self, partition: int, coordinator_epoch: int) -> S:
        raise NotImplementedError

    async def _run_timers(self) -> None:
        raise NotImplementedError

    def _load_end_offset(self, log_: CoordinatorLog) -> int:
        """Where loading a partition stops."""
        return log_.log_end_offset

    def _loaded_shard(self, shard: S, records: int, started_ms: int) -> None:
        """A load finished and its shard serves requests now."""

    def _resigned(self, partition: int, shard: S | None) -> None:
        """The partition's shard is dropped (its writes and parked callers have been failed)."""

    def _closed(self) -> None:
        """`aclose` stopped every task and dropped every shard."""

    def _tasks(self) -> list[asyncio.Task]:
        """The coordinator's own tasks, cancelled and awaited by `aclose`."""
        return []

    # ------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._timer_task = asyncio.get_running_loop().create_task(self._run_timers())

    async def aclose(self) -> None:
        tasks = [t for t in [self._timer_task, *self._loading.values(), *self._tasks()] if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass   # a failed load or task was logged when it ended
        self._loading.clear()
        self._fail_waiters(lambda key: True, ErrorCode.NOT_COORDINATOR)
        self._shards.clear()
        self._closed()

    # ------------------------------------------------------------------------------ ownership
    def elect(self, partition: int, log_: CoordinatorLog, partition_count: int, coordinator_epoch: int = 0) -> None:
        """This broker now leads `partition` of the topic: load its shard."""
        self.partition_count = partition_count
        if partition in self._shards or partition in self._loading:
            return
        self._logs[partition] = log_
        self._epochs[partition] = coordinator_epoch
        task = asyncio.get_running_loop().create_task(self._load(partition, log_, coordinator_epoch))
        self._loading[partition] = task
        task.add_done_callback(functools.partial(self._loaded, partition))

    def resign(self, partition: int) -> None:
        """Leadership moved away: drop the shard; parked callers go find the new coordinator."""
        task = self._loading.pop(partition, None)
        if task is not None:
            task.cancel()
        shard = self._shards.pop(partition, None)
        self._logs.pop(partition, None)
        self._last_written.pop(partition, None)
        for write in self._deferred.pop(partition, ()):
            if not write.done.done():
                write.done.set_exception(CoordinatorError(ErrorCode.NOT_COORDINATOR))
        self._fail_waiters(lambda key: self._partition_of(key[1]) == partition, ErrorCode.NOT_COORDINATOR)
        self._resigned(partition, shard)

    def owns(self, partition: int) -> bool:
        return partition in self._shards or partition in self._loading

    @property
    def loading(self) -> bool:
        return bool(self._loading)

    def shards(self) -> list[S]:
        return [self._shards[p] for p in sorted(self._shards)]

    def _partition_of(self, key: str) -> int | None:
        return None if self.partition_count is None else self.topic.partition_for(key, self.partition_count)

    def shard_for(self, key: str) -> S:
        p = self._partition_of(key)
        if p is None:
            raise CoordinatorError(ErrorCode.NOT_COORDINATOR)
        shard = self._shards.get(p)
        if shard is not None:
            return shard
        if p in self._loading:
            raise CoordinatorError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        raise CoordinatorError(ErrorCode.NOT_COORDINATOR)

    def query(self, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """A read-only look at the key's shard: `fn(shard, *args)`."""
        return fn(self.shard_for(key), *args)

    # ------------------------------------------------------------------------------ writes
    def high_watermark_advanced(self, partition: int, high_watermark: int) -> None:
        """The partition's high watermark moved: complete the writes it has passed, in order."""
        queue = self._deferred.get(partition)
        while queue and queue[0].offset <= high_watermark:
            write = queue.popleft()
            self._complete(write.completions)
            if not write.done.done():
                write.done.set_result(None)

    def _write(self, shard: S, records: list[R], now_ms: int,
               completions: Sequence[tuple[WaitKey, Any]] = (), replayed: int = 0) -> asyncio.Future[None] | None:
        """Append and replay `records` (but the first `replayed`, which the operation has replayed);
        None if the partition's high watermark has reached its last write (the completions are
        handed out), else a future set when it does."""
        p = shard.partition
        log_ = self._logs[p]
        if records:
            try:
                end = log_.append(self.topic.build_batch(records, now_ms), now_ms)
            except CoordinatorError:
                raise   # the log refused the batch (a fenced producer): nothing was appended
            except Exception as e:  # noqa: BLE001 - any append failure leaves the state unknown
                self.log.error("appending %d records to %s-%d failed: %s; reloading it",
                               len(records), self.topic.name, p, e)
                self._reload(p)
                raise CoordinatorError(ErrorCode.COORDINATOR_NOT_AVAILABLE) from e
            self._last_written[p] = end
            for r in records[replayed:]:
                shard.replay(r, now_ms)
        if log_.high_watermark >= self._last_written.get(p, 0):
            self._complete(completions)
            return None
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.add_done_callback(_retrieve)
        self._deferred.setdefault(p, deque()).append(DeferredWrite(self._last_written[p], list(completions), done))
        return done

    def _reload(self, partition: int) -> None:
        log_ = self._logs.get(partition)
        count, epoch = self.partition_count, self._epochs.get(partition, 0)
        self.resign(partition)
        if log_ is not None and count is not None:
            self.elect(partition, log_, count, epoch)

    # ------------------------------------------------------------------------------ parked callers
    def _complete(self, completions: Sequence[tuple[WaitKey, Any]]) -> None:
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

    # ------------------------------------------------------------------------------ loading
    async def _load(self, partition: int, log_: CoordinatorLog, coordinator_epoch: int) -> tuple[S, int, int]:
        """The partition's shard rebuilt from its log, the records read and when the load started."""
        started = self.clock()
        shard = self._new_shard(partition, coordinator_epoch)
        offset = log_.log_start_offset
        records = 0
        while offset < self._load_end_offset(log_):
            buf = log_.read(offset, self.load_buffer_bytes)
            now = self.clock()
            next_offset = offset
            for next_offset, batch in self.topic.iter_batches(buf):
                for r in batch:
                    shard.replay(r, now)
                records += len(batch)
            if next_offset <= offset:
                self.log.error("%s-%d: no progress loading at offset %d; stopping", self.topic.name,
                               partition, offset)
                break
            offset = next_offset
            await asyncio.sleep(0)   # let requests in (they get COORDINATOR_LOAD_IN_PROGRESS)
        return shard, records, started

    def _loaded(self, partition: int, task: asyncio.Task[tuple[S, int, int]]) -> None:
        if self._loading.get(partition) is not task:
            return
        del self._loading[partition]
        if task.cancelled():
            return
        if task.exception() is not None:
            self.log.error("loading %s-%d failed", self.topic.name, partition, exc_info=task.exception())
            return
        shard, records, started = task.result()
        self._shards[partition] = shard
        self._loaded_shard(shard, records, started)


OFFSETS = CoordinatorTopic(OFFSETS_TOPIC, partition_for, build_batch, iter_batches)


class GroupCoordinator(CoordinatorRuntime[GroupShard, Record]):
    def __init__(self, config: GroupConfig, clock: Callable[[], int],
                 new_uuid: Callable[[], str] = lambda: str(uuid.uuid4())) -> None:
        super().__init__(OFFSETS, clock, config.load_buffer_bytes, log)
        self.config = config
        self.new_uuid = new_uuid
        self._wake: asyncio.Event | None = None
        self._next_wake_ms: int | None = None

    async def start(self) -> None:
        self._wake = asyncio.Event()
        await super().start()

    def _new_shard(self, partition: int, coordinator_epoch: int) -> GroupShard:
        return GroupShard(partition, self.config, self.new_uuid)

    def _loaded_shard(self, shard: GroupShard, records: int, started_ms: int) -> None:
        now = self.clock()
        shard.schedule(RETENTION_TIMER, now + self.config.offsets_retention_check_interval_ms)
        log.log(logging.INFO if records else logging.DEBUG,
                "Finished loading offsets and group metadata from %s-%d in %d ms: %d records, %d groups",
                OFFSETS_TOPIC, shard.partition, now - started_ms, records, len(shard.groups))
        if self._wake is not None:
            self._wake.set()

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
                with self.parked():
                    await committed
        except CoordinatorError:
            if fut is not None and fut.done() and not fut.cancelled():
                fut.exception()   # failed with the shard; the caller gets the error raised here
            raise
        if fut is None:
            return outcome.response
        with self.parked():
            return await fut

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

    def _commit(self, shard: GroupShard, outcome: Outcome, now_ms: int) -> asyncio.Future[None] | None:
        """Write the outcome's records and hand out its completions (see `_write`); wake the timers
        if the shard has an earlier deadline now."""
        done = self._write(shard, outcome.records, now_ms, outcome.completions, outcome.replayed)
        deadline = shard.next_deadline()
        if deadline is not None and (self._next_wake_ms is None or deadline < self._next_wake_ms):
            assert self._wake is not None
            self._wake.set()
        return done

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
                        log.exception("timer %r of %s-%d failed", key, OFFSETS_TOPIC, shard.partition)
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
