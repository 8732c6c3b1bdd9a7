"""The transaction coordinator's runtime: the one place with I/O around `transactions.py` (DESIGN,
"How data flows: Groups and transactions"; Kafka's TransactionStateManager and
TransactionMarkerChannelManager).

Built as the group coordinator's runtime is (`runtime.py`): one `TxnShard` per `__transaction_state`
partition this broker leads, loaded from the log (requests for its ids get
COORDINATOR_LOAD_IN_PROGRESS meanwhile, NOT_COORDINATOR for partitions led elsewhere); an operation's
records are appended as one batch and replayed at once, and its answer waits until the high watermark
passes them (nothing waits when it already has).

Markers: once a PrepareCommit or PrepareAbort record is committed, a marker task writes the COMMIT or
ABORT control batch to each partition of the transaction through the `MarkerWriter` port (on one
broker, appends through the replica manager; in a cluster, WriteTxnMarkers requests to the leaders),
retrying partitions that fail every `MARKER_RETRY_BACKOFF_MS` and dropping partitions that no longer
exist, then writes CompleteCommit or CompleteAbort. A load restarts the marker tasks of every
transaction found prepared, so a coordinator that died mid-commit leaves no transaction hanging.
EndTxn answers once the transaction is complete, or after `END_TXN_WAIT_MS` (the prepare record is
durable by then; Kafka answers right after it, and the client's next request is told
CONCURRENT_TRANSACTIONS until the markers are written).

Timers: every `transaction.abort.timed.out.transaction.cleanup.interval.ms` open transactions past
their timeout are aborted at a bumped epoch; every
`transaction.remove.expired.transaction.cleanup.interval.ms` idle ids are deleted (tombstones).

Bounds: marker tasks, one per prepared transaction (each id has at most one); waiters on completion,
one per EndTxn in flight (one request per connection); loads read `load_buffer_bytes` at a time.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from odradek.coordinator.runtime import CoordinatorError, CoordinatorLog
from odradek.coordinator.transactions import (
    MarkerJob, TxnConfig, TxnOutcome, TxnShard, abort_timed_out, complete_txn, expire_ids,
)
from odradek.coordinator.transactions_records import (
    TRANSACTION_STATE_TOPIC, build_batch, iter_batches, partition_for,
)
from odradek.protocol.error_codes import ErrorCode

log = logging.getLogger("odradek.transactions")

MARKER_RETRY_BACKOFF_MS = 100
END_TXN_WAIT_MS = 10_000


class MarkerWriter(Protocol):
    """The port that writes transaction markers to partition leaders."""

    async def write_markers(self, job: MarkerJob, partitions: list[tuple[str, int]],
                            coordinator_epoch: int) -> dict[tuple[str, int], ErrorCode]:
        """Write `job`'s marker to each partition; the error of each (NONE: written and committed;
        UNKNOWN_TOPIC_OR_PARTITION: the partition is gone, nothing to write)."""


@dataclass(slots=True)
class _Deferred:
    offset: int
    done: asyncio.Future[None]


def _retrieve(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()


class TransactionCoordinator:
    def __init__(self, config: TxnConfig, clock: Callable[[], int], markers: MarkerWriter) -> None:
        self.config = config
        self.clock = clock
        self.markers = markers
        self.partition_count: int | None = None
        self._shards: dict[int, TxnShard] = {}
        self._logs: dict[int, CoordinatorLog] = {}
        self._epochs: dict[int, int] = {}
        self._last_written: dict[int, int] = {}
        self._deferred: dict[int, deque[_Deferred]] = {}
        self._loading: dict[int, asyncio.Task] = {}
        self._marker_tasks: dict[str, asyncio.Task] = {}
        self._completions: dict[str, list[asyncio.Future[None]]] = {}
        self._timer_task: asyncio.Task | None = None

    # ------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._timer_task = asyncio.get_running_loop().create_task(self._run_timers())

    async def aclose(self) -> None:
        tasks = [t for t in [self._timer_task, *self._loading.values(), *self._marker_tasks.values()]
                 if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._loading.clear()
        self._marker_tasks.clear()
        self._shards.clear()
        self._wake_completions(lambda _: True)

    # ------------------------------------------------------------------------------ ownership
    def elect(self, partition: int, log_: CoordinatorLog, partition_count: int, coordinator_epoch: int) -> None:
        """This broker now leads `partition` of __transaction_state: load its transactional ids."""
        self.partition_count = partition_count
        if partition in self._shards or partition in self._loading:
            return
        self._logs[partition] = log_
        self._epochs[partition] = coordinator_epoch
        task = asyncio.get_running_loop().create_task(self._load(partition, log_, coordinator_epoch))
        self._loading[partition] = task
        task.add_done_callback(functools.partial(self._loaded, partition))

    def resign(self, partition: int) -> None:
        task = self._loading.pop(partition, None)
        if task is not None:
            task.cancel()
        shard = self._shards.pop(partition, None)
        self._logs.pop(partition, None)
        self._last_written.pop(partition, None)
        for write in self._deferred.pop(partition, ()):
            if not write.done.done():
                write.done.set_exception(CoordinatorError(ErrorCode.NOT_COORDINATOR))
        if shard is not None:
            for txn_id in list(shard.txns):
                t = self._marker_tasks.pop(txn_id, None)
                if t is not None:
                    t.cancel()
        self._wake_completions(lambda txn_id: self._partition_of(txn_id) == partition)

    def owns(self, partition: int) -> bool:
        return partition in self._shards or partition in self._loading

    @property
    def loading(self) -> bool:
        return bool(self._loading)

    def shards(self) -> list[TxnShard]:
        return [self._shards[p] for p in sorted(self._shards)]

    def _partition_of(self, transactional_id: str) -> int | None:
        return None if self.partition_count is None else partition_for(transactional_id, self.partition_count)

    def shard_for(self, transactional_id: str) -> TxnShard:
        p = self._partition_of(transactional_id)
        if p is None:
            raise CoordinatorError(ErrorCode.NOT_COORDINATOR)
        shard = self._shards.get(p)
        if shard is not None:
            return shard
        if p in self._loading:
            raise CoordinatorError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        raise CoordinatorError(ErrorCode.NOT_COORDINATOR)

    # ------------------------------------------------------------------------------ operations
    async def execute(self, transactional_id: str, op: Callable[..., TxnOutcome], *args: Any) -> Any:
        """Run `op(shard, *args, now_ms)`; its response once its records are committed (and, for an
        EndTxn, once the transaction is complete or END_TXN_WAIT_MS has passed)."""
        shard = self.shard_for(transactional_id)
        now = self.clock()
        out = op(shard, *args, now)
        waiter = self._completion(out.wait_complete) if out.wait_complete else None
        await self._run(shard, out, now)
        if waiter is not None:
            try:
                await asyncio.wait_for(asyncio.shield(waiter), END_TXN_WAIT_MS / 1000)
            except asyncio.TimeoutError:
                pass
        return out.response

    def query(self, transactional_id: str, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(self.shard_for(transactional_id), *args)

    async def _run(self, shard: TxnShard, out: TxnOutcome, now_ms: int) -> None:
        committed = self._commit(shard, out, now_ms)
        if committed is not None:
            await committed
        for job in out.markers:
            self._start_markers(shard, job)

    def high_watermark_advanced(self, partition: int, high_watermark: int) -> None:
        queue = self._deferred.get(partition)
        while queue and queue[0].offset <= high_watermark:
            write = queue.popleft()
            if not write.done.done():
                write.done.set_result(None)

    def _commit(self, shard: TxnShard, out: TxnOutcome, now_ms: int) -> asyncio.Future[None] | None:
        p = shard.partition
        log_ = self._logs[p]
        if out.records:
            try:
                end = log_.append(build_batch(out.records, now_ms), now_ms)
            except CoordinatorError:
                raise
            except Exception as e:  # noqa: BLE001 - any append failure leaves the state unknown
                log.error("appending %d records to %s-%d failed: %s; reloading it", len(out.records),
                          TRANSACTION_STATE_TOPIC, p, e)
                self._reload(p)
                raise CoordinatorError(ErrorCode.COORDINATOR_NOT_AVAILABLE) from e
            self._last_written[p] = end
            for r in out.records:
                shard.replay(r)
        if log_.high_watermark >= self._last_written.get(p, 0):
            return None
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.add_done_callback(_retrieve)
        self._deferred.setdefault(p, deque()).append(_Deferred(self._last_written[p], done))
        return done

    def _reload(self, partition: int) -> None:
        log_ = self._logs.get(partition)
        count, epoch = self.partition_count, self._epochs.get(partition, 0)
        self.resign(partition)
        if log_ is not None and count is not None:
            self.elect(partition, log_, count, epoch)

    # ------------------------------------------------------------------------------ completion
    def _completion(self, transactional_id: str) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._completions.setdefault(transactional_id, []).append(fut)
        return fut

    def _wake_completions(self, which: Callable[[str], bool]) -> None:
        for txn_id in [t for t in self._completions if which(t)]:
            for fut in self._completions.pop(txn_id):
                if not fut.done():
                    fut.set_result(None)

    # ------------------------------------------------------------------------------ markers
    def _start_markers(self, shard: TxnShard, job: MarkerJob) -> None:
        old = self._marker_tasks.get(job.transactional_id)
        if old is not None and not old.done():
            old.cancel()   # a newer transition of the same id supersedes it
        task = asyncio.get_running_loop().create_task(self._send_markers(shard, job))
        self._marker_tasks[job.transactional_id] = task
        task.add_done_callback(functools.partial(self._markers_done, job.transactional_id))

    def _markers_done(self, transactional_id: str, task: asyncio.Task) -> None:
        if self._marker_tasks.get(transactional_id) is task:
            del self._marker_tasks[transactional_id]
        if not task.cancelled() and task.exception() is not None:
            log.error("markers of transactional id %s failed", transactional_id, exc_info=task.exception())

    async def _send_markers(self, shard: TxnShard, job: MarkerJob) -> None:
        remaining = sorted(job.partitions)
        epoch = self._epochs.get(shard.partition, 0)
        while remaining:
            errors = await self.markers.write_markers(job, remaining, epoch)
            if self._shards.get(shard.partition) is not shard:
                return
            retry = [tp for tp in remaining
                     if errors.get(tp, ErrorCode.UNKNOWN_SERVER_ERROR) not in
                     (ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]
            if retry:
                log.debug("markers of %s: retrying %s", job.transactional_id,
                          {tp: errors.get(tp) for tp in retry})
                await asyncio.sleep(MARKER_RETRY_BACKOFF_MS / 1000)
            remaining = retry
        now = self.clock()
        await self._run(shard, complete_txn(shard, job, now), now)
        self._wake_completions(lambda t: t == job.transactional_id)

    # ------------------------------------------------------------------------------ loading
    async def _load(self, partition: int, log_: CoordinatorLog, coordinator_epoch: int) -> TxnShard:
        started = self.clock()
        shard = TxnShard(partition, self.config, coordinator_epoch)
        offset = log_.log_start_offset
        records = 0
        while offset < log_.high_watermark:
            buf = log_.read(offset, self.config.load_buffer_bytes)
            next_offset = offset
            for next_offset, batch in iter_batches(buf):
                for r in batch:
                    shard.replay(r)
                records += len(batch)
            if next_offset <= offset:
                log.error("%s-%d: no progress loading at offset %d; stopping", TRANSACTION_STATE_TOPIC,
                          partition, offset)
                break
            offset = next_offset
            await asyncio.sleep(0)
        log.log(logging.INFO if records else logging.DEBUG,
                "Finished loading transaction metadata from %s-%d in %d ms: %d records, %d transactional ids",
                TRANSACTION_STATE_TOPIC, partition, self.clock() - started, records, len(shard.txns))
        return shard

    def _loaded(self, partition: int, task: asyncio.Task[TxnShard]) -> None:
        if self._loading.get(partition) is not task:
            return
        del self._loading[partition]
        if task.cancelled():
            return
        if task.exception() is not None:
            log.error("loading %s-%d failed", TRANSACTION_STATE_TOPIC, partition, exc_info=task.exception())
            return
        shard = self._shards[partition] = task.result()
        for job in shard.pending_markers():
            log.info("completing transaction of %s (%s) left prepared", job.transactional_id,
                     "commit" if job.commit else "abort")
            self._start_markers(shard, job)

    # ------------------------------------------------------------------------------ timers
    async def _run_timers(self) -> None:
        abort_every = self.config.abort_timed_out_interval_ms
        expire_every = self.config.remove_expired_interval_ms
        next_expire = self.clock() + expire_every
        while True:
            await asyncio.sleep(abort_every / 1000)
            now = self.clock()
            ops: list[Callable[[TxnShard, int], TxnOutcome]] = [abort_timed_out]
            if now >= next_expire:
                ops.append(expire_ids)
                next_expire = now + expire_every
            for shard in self.shards():
                for op in ops:
                    try:
                        out = op(shard, now)
                        if out.records:
                            for job in out.markers:
                                log.info("aborting transaction of %s: open longer than its timeout",
                                         job.transactional_id)
                            await self._run(shard, out, now)
                    except CoordinatorError:
                        break
                    except Exception:
                        log.exception("transaction timer of %s-%d failed", TRANSACTION_STATE_TOPIC,
                                      shard.partition)
