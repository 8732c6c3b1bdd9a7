"""The replica manager: the one owner of this broker's partition replicas (DESIGN, "Layers" and
"How data flows"; Kafka's ReplicaManager).

It answers every question a request asks of a partition, with Kafka's errors:
- lookup: a partition hosted here, else NOT_LEADER_OR_FOLLOWER when the metadata knows it (it lives on
  another broker) or UNKNOWN_TOPIC_OR_PARTITION; as leader, the request's current leader epoch is
  fenced (FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH, `Partition.check_leader_epoch`) and a follower
  answers NOT_LEADER_OR_FOLLOWER;
- appends as leader (min.insync.replicas for acks=all) and as follower; after each, the high watermark
  is moved (`Partition.maybe_increment_high_watermark`), high-watermark listeners (the coordinators)
  hear of it and the waiters on the partition look again (`_wake`);
- delayed produce (`wait_for_acks`, delayed_produce.py): acks=all answers when the high watermark
  reaches each append's end, or REQUEST_TIMED_OUT; delayed fetch (`wait_for_data`, in the purgatory):
  a long poll woken by appends;
- reads (`read`): the limit a reader may see (the high watermark for consumers, the last stable offset
  for read_committed, the log end for followers) and the follower's fetch state, which can move the high
  watermark and grow the ISR; a follower fetch (replica id >= 0) is served only to a replica of the
  partition other than this broker (one membership test of `Partition.followers`), as Kafka's
  followerReplicaOrThrow;
- ISR changes: expansions proposed by follower fetches, shrinks by the expiration task every
  replica.lag.time.max.ms / 2; each goes through the `AlterPartition` port (the controller's store) and
  takes effect once recorded, at most one in flight per partition;
- LeaderAndIsr and StopReplica (`apply_leader_and_isr`, `stop_replicas`): partitions become leaders or
  followers or go away; leadership listeners (coordinator loading) hear of each change.

Bounds: the purgatory and the delayed produces hold at most a few waiters per connection (network.MAX_PENDING_ANSWERS); ISR
proposals at most one per partition.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Callable, Protocol

from odradek.cluster.topics import INTERNAL_TOPICS
from odradek.protocol.error_codes import ErrorCode, KafkaApiError
from odradek.server.metadata_cache import MetadataCache
from odradek.server.partition import (
    READ_COMMITTED, AppendInfo, AppendResult, LeaderAndIsrState, Partition, PartitionLog, Records, TopicPartition,
)
from odradek.server.delayed_produce import DelayedProduces
from odradek.server.purgatory import Purgatory
from odradek.storage.errors import OffsetOutOfRangeError, StorageError

log = logging.getLogger("odradek.replicas")

HIGH_WATERMARK = -1   # DeleteRecords' "up to the high watermark"


def _replica_fetches(replica_id: int) -> tuple[str, int]:
    """The purgatory key a follower broker's delayed fetches wait on: an append to (or any change of)
    a partition led here that it replicates. One key per follower, where its session names dozens of
    partitions (consumers wait on each partition's key, which moves with the high watermark)."""
    return "replica fetches", replica_id


Clock = Callable[[], int]
HighWatermarkListener = Callable[[int], None]
# (partitions that became leaders, that became followers, that were stopped)
LeadershipListener = Callable[[list[Partition], list[Partition], list[TopicPartition]], None]


class LogProvider(Protocol):
    """Where partition logs come from (the broker's LogManager; in-memory logs in tests)."""

    def open_log(self, topic: str, partition: int, now_ms: int) -> PartitionLog: ...

    def delete_log(self, topic: str, partition: int, now_ms: int) -> None: ...


class AlterPartition(Protocol):
    """The leader's channel for ISR changes (Kafka's AlterPartition): returns the partition epoch the
    change was recorded at, or raises KafkaApiError (FENCED_LEADER_EPOCH, INVALID_UPDATE_VERSION)."""

    async def alter_isr(self, topic: str, partition: int, leader_epoch: int, isr: tuple[int, ...],
                        partition_epoch: int) -> int: ...


@dataclass(slots=True)
class LogReadResult:
    """One partition's part of a fetch (Kafka's LogReadResult): an error, or the offsets and slices."""
    error: ErrorCode
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    slices: list = field(default_factory=list)
    size: int = 0
    aborted_transactions: list | None = None   # read_committed: (producer_id, first_offset) entries


class ReplicaManager:
    def __init__(self, broker_id: int, logs: LogProvider, metadata: MetadataCache, clock: Clock, *,
                 purgatory: Purgatory | None = None, alter_partition: AlterPartition | None = None,
                 replica_lag_time_max_ms: int = 30_000, follower_cache_keep_bytes: int = 0) -> None:
        self.broker_id = broker_id
        self.logs = logs
        self.metadata = metadata
        self.clock = clock
        self.purgatory = purgatory if purgatory is not None else Purgatory()
        self.delayed_produces: DelayedProduces[Partition] = DelayedProduces(self._acks_status)
        self.alter_partition = alter_partition
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        # replica.drop.behind.bytes, resolved: what a follower's log keeps in the page cache (0: the
        # broker's log.drop.behind.bytes, as for leaders)
        self.follower_cache_keep_bytes = follower_cache_keep_bytes
        self._partitions: dict[TopicPartition, Partition] = {}
        self._hw_listeners: dict[TopicPartition, HighWatermarkListener] = {}
        self._leadership_listeners: list[LeadershipListener] = []
        self._isr_tasks: set[asyncio.Task] = set()
        self._expiration: asyncio.Task | None = None

    # ------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the ISR expiration task (Kafka's isr-expiration, every replica.lag.time.max.ms / 2)."""
        self._expiration = asyncio.get_running_loop().create_task(self._run_isr_expiration())

    async def aclose(self) -> None:
        tasks = [t for t in (self._expiration, *self._isr_tasks) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
        self._isr_tasks.clear()

    # ------------------------------------------------------------------------------ lookup
    def get_partition(self, topic: str | None, index: int) -> Partition | None:
        return self._partitions.get((topic, index)) if topic is not None else None

    def partitions(self) -> list[Partition]:
        return list(self._partitions.values())

    def get_partition_or_error(self, topic: str | None, index: int) -> Partition:
        """The replica hosted here; KafkaApiError NOT_LEADER_OR_FOLLOWER if the partition exists on
        other brokers only, UNKNOWN_TOPIC_OR_PARTITION if it does not exist."""
        part = self._partitions.get((topic, index)) if topic is not None else None
        if part is not None:
            return part
        if self.metadata.image.has_partition(topic, index):
            raise KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)

    def leader_partition(self, topic: str | None, index: int, current_leader_epoch: int = -1, *,
                         require_leader: bool = True) -> Partition:
        """The replica hosted here as leader (any replica without `require_leader`), the request's
        leader epoch fenced (Kafka's getPartitionOrException then localLogWithEpochOrThrow)."""
        part = self.get_partition_or_error(topic, index)
        code = part.check_leader_epoch(current_leader_epoch)
        if code is not ErrorCode.NONE:
            raise KafkaApiError(code)
        if require_leader and not part.is_leader:
            raise KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        return part

    # ------------------------------------------------------------------------------ appends
    def append_to_leader(self, part: Partition, records: Records, now_ms: int, *, log_append_time: bool,
                         required_acks: int, coordinator: bool = False) -> AppendResult:
        """Append validated records as leader (`coordinator`: a coordinator's own records or markers,
        no sequence checks). Raises KafkaApiError (NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS),
        StorageError, ProducerStateError."""
        min_isr = self._min_insync_replicas(part.topic) if required_acks == -1 else 1
        result = part.append_records_to_leader(records, now_ms, log_append_time, required_acks, min_isr,
                                               coordinator=coordinator)
        self._appended(part)
        return result

    def append_to_follower(self, topic: str, index: int, records: Records, leader_high_watermark: int,
                           now_ms: int) -> AppendInfo:
        """A replica fetcher's append: the leader's batches as they are, then the leader's HW."""
        part = self.get_partition_or_error(topic, index)
        info = part.append_records_to_follower(records, now_ms)
        if part.update_follower_high_watermark(leader_high_watermark):
            self._high_watermark_moved(part)
        self._high_watermark_waiters(part.key)     # no broker fetches from a follower: none of theirs
        return info

    # ------------------------------------------------------------------------------ follower side
    def _follower(self, topic: str, index: int) -> Partition | None:
        part = self._partitions.get((topic, index))
        return part if part is not None and not part.is_leader else None

    def follower_log_end_offset(self, topic: str, index: int) -> int | None:
        """Where a replica fetcher fetches from; None if this broker does not follow the partition."""
        part = self._follower(topic, index)
        return part.log_end_offset if part is not None else None

    def follower_latest_epoch(self, topic: str, index: int) -> int | None:
        part = self._follower(topic, index)
        return part.log.leader_epoch_cache.latest_epoch if part is not None else None

    def follower_truncation_point(self, topic: str, index: int, leader_epoch: int,
                                  leader_end_offset: int) -> int | None:
        """Where a follower truncates (KIP-279): the smaller of the leader's end of `leader_epoch` and
        its own end of the largest epoch at or below it; its high watermark when the leader knows no
        such epoch (-1) or the follower has none."""
        part = self._follower(topic, index)
        if part is None:
            return None
        if leader_epoch < 0 or leader_end_offset < 0:
            return part.high_watermark
        own = part.log.end_offset_for_epoch(leader_epoch)
        if own is None:
            return part.high_watermark
        return min(leader_end_offset, own[1])

    def truncate_follower(self, topic: str, index: int, offset: int, *, fully: bool, now_ms: int) -> None:
        part = self._follower(topic, index)
        if part is None:
            raise KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        if fully:
            part.log.truncate_fully_and_start_at(offset, now_ms)
        else:
            part.log.truncate_to(offset, now_ms)
        self._high_watermark_waiters(part.key)

    def update_follower_from_leader(self, topic: str, index: int, leader_high_watermark: int) -> None:
        part = self._follower(topic, index)
        if part is not None and part.update_follower_high_watermark(leader_high_watermark):
            self._high_watermark_moved(part)
            self._high_watermark_waiters(part.key)

    def _appended(self, part: Partition) -> None:
        """A leader's append: the followers' delayed fetches look again; the consumers' fetches and
        the acks=all produces only if the high watermark moved (with followers in the ISR it moves
        later, when they fetch: `update_follower_fetch_state`)."""
        self._followers_look_again(part)
        if part.maybe_increment_high_watermark():
            self._high_watermark_moved(part)
            self._high_watermark_waiters(part.key)

    def _followers_look_again(self, part: Partition, replicas: Iterable[int] = ()) -> None:
        notify, me = self.purgatory.notify, self.broker_id
        for r in (*part.replicas, *replicas) if replicas else part.replicas:
            if r != me:
                notify(_replica_fetches(r))

    def _wake(self, part: Partition, former_replicas: Iterable[int] = ()) -> None:
        """Something changed on `part`: delayed fetches and produces waiting on it look again (those
        of `former_replicas` too, which a reassignment removed)."""
        self._followers_look_again(part, former_replicas)
        self._high_watermark_waiters(part.key)

    def _high_watermark_waiters(self, key: TopicPartition) -> None:
        """What waits for the high watermark (consumers' delayed fetches, acks=all) looks again.
        Followers read to the log end: their delayed fetches wait for appends, not for this."""
        self.purgatory.notify(key)
        self.delayed_produces.check(key)

    def _high_watermark_moved(self, part: Partition) -> None:
        listener = self._hw_listeners.get(part.key)
        if listener is not None:
            listener(part.high_watermark)

    def _min_insync_replicas(self, topic: str) -> int:
        value: int = self.metadata.image.topic_config(topic).get_value("min.insync.replicas")
        return value

    # ------------------------------------------------------------------------------ delayed produce
    async def wait_for_acks(self, required: Sequence[tuple[Partition, int]], timeout_ms: int) -> list[ErrorCode]:
        """acks=all (Kafka's DelayedProduce): for each (partition, offset after its append) NONE once
        the high watermark reaches the offset, NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR has shrunk
        below min.insync.replicas by then, NOT_LEADER_OR_FOLLOWER if leadership moved, and
        REQUEST_TIMED_OUT when `timeout_ms` passes first (delayed_produce.py)."""
        codes = [self._acks_status(p, o) for p, o in required]
        if all(c is not None for c in codes):
            return codes  # type: ignore[return-value]
        return await self.delayed_produces.wait(required, codes, max(timeout_ms, 0) / 1000)

    def acks_done(self, required: Sequence[tuple[Partition, int]]) -> list[ErrorCode] | None:
        """`wait_for_acks`' answer if it is there already (alone in the ISR, always), else None: the
        caller awaits only when something is left to wait for."""
        done: list[ErrorCode] = []
        for p, o in required:
            c = self._acks_status(p, o)
            if c is None:
                return None
            done.append(c)
        return done

    def _acks_status(self, part: Partition, required_offset: int) -> ErrorCode | None:
        if self._partitions.get(part.key) is not part or not part.is_leader:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if part.high_watermark < required_offset:
            return None
        if len(part.isr) < self._min_insync_replicas(part.topic):
            return ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return ErrorCode.NONE

    # ------------------------------------------------------------------------------ reads
    def read(self, topic: str | None, index: int, *, fetch_offset: int, current_leader_epoch: int,
             replica_id: int, isolation: int, max_bytes: int, min_one_batch: bool, now_ms: int) -> LogReadResult:
        """One partition of a Fetch, from the leader (Kafka's readFromLocalLog)."""
        try:
            part = self.leader_partition(topic, index, current_leader_epoch)
        except KafkaApiError as e:
            fenced = self.get_partition(topic, index)
            if fenced is None or e.code is ErrorCode.NOT_LEADER_OR_FOLLOWER:
                return LogReadResult(e.code)
            return LogReadResult(e.code, fenced.high_watermark, fenced.last_stable_offset, fenced.log_start_offset)
        if replica_id >= 0 and replica_id not in part.followers:
            # A follower fetch from a broker that is no replica of the partition, or that claims to be
            # this broker: not served, and nothing of the follower state moves (Kafka's
            # followerReplicaOrThrow: UNKNOWN_LEADER_EPOCH when the request names the current epoch,
            # so that a replica just added retries, else NOT_LEADER_OR_FOLLOWER).
            return LogReadResult(ErrorCode.UNKNOWN_LEADER_EPOCH if current_leader_epoch >= 0
                                 else ErrorCode.NOT_LEADER_OR_FOLLOWER)
        hw = part.high_watermark
        result = LogReadResult(ErrorCode.NONE, hw, part.last_stable_offset, part.log_start_offset)
        leo = part.log_end_offset
        if fetch_offset > leo or fetch_offset < result.log_start_offset:
            result.error = ErrorCode.OFFSET_OUT_OF_RANGE
            return result
        if replica_id >= 0:
            self.update_follower_fetch_state(part, replica_id, fetch_offset, now_ms)
        limit = part.fetch_limit(replica_id, isolation)
        if fetch_offset >= limit or max_bytes <= 0:
            return result
        try:
            result.slices = part.log.read(fetch_offset, max_bytes, limit, min_one_batch=min_one_batch)
        except OffsetOutOfRangeError:
            result.error = ErrorCode.OFFSET_OUT_OF_RANGE
            return result
        except StorageError as e:
            log.error("fetch from %s-%d failed: %s", part.topic, part.index, e)
            result.error = ErrorCode.KAFKA_STORAGE_ERROR
            return result
        result.size = sum(s.length for s in result.slices)
        if isolation == READ_COMMITTED and replica_id < 0 and result.slices:
            result.aborted_transactions = part.log.collect_aborted_transactions(fetch_offset, limit)
        return result

    def follower_idle(self, topic: str, index: int, fetch_offset: int, current_leader_epoch: int,
                      replica_id: int, answered: tuple[int, int, int], now_ms: int) -> bool:
        """A follower's fetch of a partition led here that `read` would answer with no records and
        the same offsets as the session's last answer (`answered`): noted, as `read` notes it, and
        True. False when `read` has more to say (records, an error, a moved offset, an ISR change)."""
        part = self._partitions.get((topic, index))
        return part is not None and part.follower_idle(replica_id, fetch_offset, current_leader_epoch,
                                                       answered, now_ms)

    async def wait_for_data(self, keys: list[TopicPartition], timeout_ms: int, *, replica_id: int = -1) -> bool:
        """A delayed fetch: True when one of `keys` had what the reader waits for or another change
        (a consumer: a new high watermark; a follower broker, `replica_id`: an append to any partition
        led here that it replicates); False at the timeout."""
        return await self.purgatory.wait_any([_replica_fetches(replica_id)] if replica_id >= 0 else keys,
                                             timeout_ms / 1000)

    # ------------------------------------------------------------------------------ admin
    def delete_records(self, topic: str, index: int, offset: int, now_ms: int) -> int:
        """DeleteRecords on the leader (Kafka's deleteRecordsOnLocalLog): the new log start offset.
        -1 means the high watermark. Raises KafkaApiError: UNKNOWN_TOPIC_OR_PARTITION,
        INVALID_TOPIC_EXCEPTION (internal topics), NOT_LEADER_OR_FOLLOWER, POLICY_VIOLATION (no
        `delete` in cleanup.policy), OFFSET_OUT_OF_RANGE (past the high watermark), KAFKA_STORAGE_ERROR."""
        if self.get_partition(topic, index) is None and not self.metadata.image.has_partition(topic, index):
            raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if topic in INTERNAL_TOPICS:
            raise KafkaApiError(ErrorCode.INVALID_TOPIC_EXCEPTION)
        part = self.leader_partition(topic, index)
        if not self.metadata.image.topic_config(topic).delete:
            raise KafkaApiError(ErrorCode.POLICY_VIOLATION)
        hw = part.high_watermark
        target = hw if offset == HIGH_WATERMARK else offset
        if target < 0 or target > hw:
            raise KafkaApiError(ErrorCode.OFFSET_OUT_OF_RANGE)
        try:
            part.log.delete_records_before(target, now_ms)
        except OffsetOutOfRangeError:
            raise KafkaApiError(ErrorCode.OFFSET_OUT_OF_RANGE) from None
        except StorageError as e:
            log.error("DeleteRecords on %s-%d failed: %s", topic, index, e)
            raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR) from e
        return part.log_start_offset

    def last_offset_for_leader_epoch(self, topic: str, index: int, current_leader_epoch: int,
                                     leader_epoch: int) -> tuple[int, int] | None:
        """OffsetForLeaderEpoch on the leader: (epoch, end offset) or None for an unknown epoch."""
        return self.leader_partition(topic, index, current_leader_epoch).last_offset_for_leader_epoch(leader_epoch)

    # ------------------------------------------------------------------------------ followers and ISR
    def update_follower_fetch_state(self, part: Partition, replica_id: int, fetch_offset: int, now_ms: int) -> None:
        moved = part.update_follower_fetch_state(replica_id, fetch_offset, now_ms)
        if moved is None:
            return
        if moved and part.maybe_increment_high_watermark():
            self._high_watermark_moved(part)
            self._high_watermark_waiters(part.key)
        if replica_id not in part.isr:
            isr = part.isr_to_expand(replica_id)
            if isr is not None:
                self._propose_isr(part, isr)

    def maybe_shrink_isr(self, now_ms: int) -> int:
        """Propose shrinking the ISR of every partition led here with lagging followers; how many."""
        proposed = 0
        for part in list(self._partitions.values()):
            isr = part.isr_to_shrink(now_ms, self.replica_lag_time_max_ms)
            if isr is not None:
                self._propose_isr(part, isr)
                proposed += 1
        return proposed

    def _propose_isr(self, part: Partition, isr: tuple[int, ...]) -> None:
        if self.alter_partition is None:
            return
        part.isr_change_in_flight = True
        task = asyncio.get_running_loop().create_task(self._alter_isr(part, isr))
        self._isr_tasks.add(task)
        task.add_done_callback(self._isr_tasks.discard)

    async def _alter_isr(self, part: Partition, isr: tuple[int, ...]) -> None:
        assert self.alter_partition is not None
        epoch = part.leader_epoch
        try:
            partition_epoch = await self.alter_partition.alter_isr(part.topic, part.index, epoch, isr,
                                                                   part.partition_epoch)
        except (KafkaApiError, StorageError, OSError) as e:
            log.warning("ISR change of %s-%d to %s not recorded: %s", part.topic, part.index, list(isr), e)
            if part.leader_epoch == epoch:
                part.isr_change_in_flight = False
            return
        if self._partitions.get(part.key) is not part or part.leader_epoch != epoch:
            return   # a newer LeaderAndIsr came meanwhile; it carries the truth
        log.info("ISR of %s-%d is now %s", part.topic, part.index, list(isr))
        if part.apply_isr(isr, partition_epoch):
            self._high_watermark_moved(part)
        self._wake(part)

    async def _run_isr_expiration(self) -> None:
        interval_s = max(self.replica_lag_time_max_ms / 2, 10) / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.maybe_shrink_isr(self.clock())
            except Exception:
                log.exception("ISR expiration failed")

    # ------------------------------------------------------------------------------ LeaderAndIsr / StopReplica
    def apply_leader_and_isr(self, states: Iterable[LeaderAndIsrState], now_ms: int) -> dict[TopicPartition, ErrorCode]:
        """Make this broker leader or follower of each partition (Kafka's becomeLeaderOrFollower):
        opens the log of a new replica; a state with an older leader epoch is STALE_CONTROLLER_EPOCH."""
        errors: dict[TopicPartition, ErrorCode] = {}
        leaders: list[Partition] = []
        followers: list[Partition] = []
        for st in states:
            if self.broker_id not in st.replicas:
                errors[st.key] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            part = self._partitions.get(st.key)
            if part is None:
                part = Partition(st.topic, st.partition, self.logs.open_log(st.topic, st.partition, now_ms),
                                 self.broker_id)
            former = part.replicas
            try:
                if st.leader == self.broker_id:
                    changed = part.make_leader(st, now_ms)
                else:
                    changed = part.make_follower(st)
            except KafkaApiError as e:
                errors[st.key] = e.code
                continue
            self._partitions[st.key] = part
            errors[st.key] = ErrorCode.NONE
            # Nobody reads a follower's log (consumers read leaders): it need not stay cached.
            part.log.cache_keep_bytes = None if part.is_leader else (self.follower_cache_keep_bytes or None)
            if changed:
                (leaders if part.is_leader else followers).append(part)
                self._wake(part, former)
        if leaders or followers:
            for fn in list(self._leadership_listeners):
                fn(leaders, followers, [])
        return errors

    def stop_replicas(self, keys: Iterable[TopicPartition], *, delete: bool, now_ms: int) -> list[TopicPartition]:
        """StopReplica: the partitions leave this broker (their logs too with `delete`); waiters on them
        are woken to find them gone. Returns the partitions that were here."""
        stopped = []
        for key in keys:
            part = self._partitions.pop(key, None)
            if part is None:
                continue
            stopped.append(key)
            self._hw_listeners.pop(key, None)
            if delete:
                self.logs.delete_log(key[0], key[1], now_ms)
            self._wake(part)
        if stopped:
            for fn in list(self._leadership_listeners):
                fn([], [], stopped)
        return stopped

    # ------------------------------------------------------------------------------ listeners
    def add_high_watermark_listener(self, key: TopicPartition, fn: HighWatermarkListener) -> None:
        """`fn(high_watermark)` each time the partition's high watermark moves (one per partition)."""
        self._hw_listeners[key] = fn

    def remove_high_watermark_listener(self, key: TopicPartition) -> None:
        self._hw_listeners.pop(key, None)

    def add_leadership_listener(self, fn: LeadershipListener) -> None:
        self._leadership_listeners.append(fn)
