"""The transaction coordinator's runtime: the one place with I/O around `transactions.py` (DESIGN,
"How data flows: Groups and transactions"; Kafka's TransactionStateManager and
TransactionMarkerChannelManager).

A `CoordinatorRuntime` (`runtime.py`), as the group coordinator is: one `TxnShard` per
`__transaction_state` partition this broker leads, loaded from the log up to its high watermark
(requests for its ids get COORDINATOR_LOAD_IN_PROGRESS meanwhile, NOT_COORDINATOR for partitions led
elsewhere); an operation's records are appended as one batch and replayed at once, and its answer
waits until the high watermark passes them (nothing waits when it already has).

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
from typing import Any, Callable, Protocol

from odradek.coordinator.runtime import CoordinatorError, CoordinatorLog, CoordinatorRuntime, CoordinatorTopic
from odradek.coordinator.transactions import (
    MarkerJob, TxnConfig, TxnOutcome, TxnShard, abort_timed_out, complete_txn, expire_ids,
)
from odradek.coordinator.transactions_records import (
    TRANSACTION_STATE_TOPIC, TxnRecord, build_batch, iter_batches, partition_for,
)
from odradek.protocol.error_codes import ErrorCode

log = logging.getLogger("odradek.transactions")

MARKER_RETRY_BACKOFF_MS = 100
END_TXN_WAIT_MS = 10_000

TRANSACTION_STATE = CoordinatorTopic(TRANSACTION_STATE_TOPIC, partition_for, build_batch, iter_batches)


class MarkerWriter(Protocol):
    """The port that writes transaction markers to partition leaders."""

    async def write_markers(self, job: MarkerJob, partitions: list[tuple[str, int]],
                            coordinator_epoch: int) -> dict[tuple[str, int], ErrorCode]:
        """Write `job`'s marker to each partition; the error of each (NONE: written and committed;
        UNKNOWN_TOPIC_OR_PARTITION: the partition is gone, nothing to write)."""


class TransactionCoordinator(CoordinatorRuntime[TxnShard, TxnRecord]):
    def __init__(self, config: TxnConfig, clock: Callable[[], int], markers: MarkerWriter) -> None:
        super().__init__(TRANSACTION_STATE, clock, config.load_buffer_bytes, log)
        self.config = config
        self.markers = markers
        self._marker_tasks: dict[str, asyncio.Task] = {}
        self._completions: dict[str, list[asyncio.Future[None]]] = {}

    # ------------------------------------------------------------------------------ runtime hooks
    def _new_shard(self, partition: int, coordinator_epoch: int) -> TxnShard:
        return TxnShard(partition, self.config, coordinator_epoch)

    def _loaded_shard(self, shard: TxnShard, records: int, started_ms: int) -> None:
        log.log(logging.INFO if records else logging.DEBUG,
                "Finished loading transaction metadata from %s-%d in %d ms: %d records, %d transactional ids",
                TRANSACTION_STATE_TOPIC, shard.partition, self.clock() - started_ms, records, len(shard.txns))
        for job in shard.pending_markers():
            log.info("completing transaction of %s (%s) left prepared", job.transactional_id,
                     "commit" if job.commit else "abort")
            self._start_markers(shard, job)

    def _resigned(self, partition: int, shard: TxnShard | None) -> None:
        if shard is not None:
            for txn_id in list(shard.txns):
                t = self._marker_tasks.pop(txn_id, None)
                if t is not None:
                    t.cancel()
        self._wake_completions(lambda txn_id: self._partition_of(txn_id) == partition)

    def _tasks(self) -> list[asyncio.Task]:
        return list(self._marker_tasks.values())

    def _closed(self) -> None:
        self._marker_tasks.clear()
        self._wake_completions(lambda _: True)

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
                with self.parked():
                    await asyncio.wait_for(asyncio.shield(waiter), END_TXN_WAIT_MS / 1000)
            except asyncio.TimeoutError:
                pass
        return out.response

    async def _run(self, shard: TxnShard, out: TxnOutcome, now_ms: int) -> None:
        committed = self._write(shard, out.records, now_ms)
        if committed is not None:
            with self.parked():
                await committed
        for job in out.markers:
            self._start_markers(shard, job)

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
