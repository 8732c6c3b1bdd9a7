"""A partition replica on this broker: its log, its role, leader epoch, replicas, ISR and, on the
leader, each follower's fetch state (seed 003, "Replication"; Kafka's Partition and Replica).

Invariants:
- The role, leader, leader epoch, replicas and ISR are those of the last LeaderAndIsr state applied
  (`make_leader`, `make_follower`); nothing is guessed from the order of the replicas. A state with an
  older leader epoch than the one held is refused.
- The high watermark has one home, the log (`Log.high_watermark`, which the log keeps between
  log_start_offset and log_end_offset and checkpoints). The leader moves it forward only, to the
  smallest log end offset of the in-sync replicas (its own, and each in-sync follower's last fetch
  offset); with the leader alone in the ISR that is its log end offset, at every append. A follower
  takes the leader's, capped at its own log end offset.
- A follower joins the ISR once its fetch offset reaches the high watermark (and the leader epoch's
  start), and leaves it when it has not caught up for `replica.lag.time.max.ms`; `isr_to_expand` and
  `isr_to_shrink` only propose: the ISR changes when the change is recorded (`apply_isr`).
- Leader-epoch fencing is `check_leader_epoch`, the one place it is written: an older epoch than ours
  is FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH, -1 is not checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from odradek.protocol.error_codes import ErrorCode, KafkaApiError
from odradek.storage.config import LogConfig

NO_LEADER = -1
UNDEFINED_EPOCH = -1
READ_COMMITTED = 1

TopicPartition = tuple[str, int]
Records = bytearray | memoryview | bytes   # v2 batches; writable ones are patched in place


class EpochCache(Protocol):
    @property
    def latest_epoch(self) -> int | None: ...

    def epoch_for_offset(self, offset: int) -> int | None: ...


class TimestampSearch(Protocol):
    """A bounded search of one segment (storage/timestamps.py), run where the caller likes."""

    def run(self) -> tuple[int, int] | None: ...


class TimestampAndOffset(Protocol):
    @property
    def timestamp(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def leader_epoch(self) -> int | None: ...


class PartitionLog(Protocol):
    """What a partition needs of its log (`odradek.storage.log.Log`; an in-memory fake in tests)."""

    # how much of its newest data the log keeps in the page cache; None: the broker's default
    cache_keep_bytes: int | None

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    @property
    def high_watermark(self) -> int: ...

    def update_high_watermark(self, offset: int) -> int: ...

    def append(self, records: Records, leader_epoch: int, now_ms: int,
               log_append_time: bool = False, *, coordinator: bool = False) -> AppendInfo: ...

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest open transaction, None if none is open."""

    def collect_aborted_transactions(self, fetch_offset: int, upper_bound_offset: int) -> list[Any]:
        """Aborted transactions (`producer_id`, `first_offset`) overlapping the range."""

    def append_as_follower(self, records: Records, now_ms: int) -> AppendInfo: ...

    def truncate_to(self, offset: int, now_ms: int) -> bool: ...

    def truncate_fully_and_start_at(self, offset: int, now_ms: int) -> None: ...

    def read(self, start_offset: int, max_bytes: int, max_offset: int | None = None,
             min_one_batch: bool = True) -> list[Any]:
        """Slices (`length`, `read()`) of whole batches from start_offset, below max_offset."""

    @property
    def leader_epoch_cache(self) -> EpochCache: ...

    def end_offset_for_epoch(self, leader_epoch: int) -> tuple[int, int] | None: ...

    def delete_records_before(self, offset: int, now_ms: int) -> int: ...

    def update_config(self, config: LogConfig) -> None: ...

    def timestamp_scans(self, timestamp: int) -> Iterator[TimestampSearch]: ...

    def max_timestamp_scan(self) -> TimestampSearch | None: ...

    def timestamp_and_offset(self, timestamp: int, offset: int) -> TimestampAndOffset: ...


class AppendInfo(Protocol):
    @property
    def first_offset(self) -> int: ...

    @property
    def last_offset(self) -> int: ...

    @property
    def duplicate(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class LeaderAndIsrState:
    """One partition of a LeaderAndIsr request (API key 4): what the controller decided."""
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    partition_epoch: int = 0      # the version of the partition's state node
    controller_epoch: int = 0

    @property
    def key(self) -> TopicPartition:
        return (self.topic, self.partition)


@dataclass(slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time: int      # -1 unless the topic uses LogAppendTime
    log_start_offset: int
    duplicate: bool = False   # an idempotent producer's retry, answered with the original offsets


@dataclass(slots=True)
class FollowerState:
    """The leader's view of one follower (Kafka's ReplicaState)."""
    log_end_offset: int = -1
    last_fetch_ms: int = 0
    last_caught_up_ms: int = 0


@dataclass(slots=True)
class Partition:
    topic: str
    index: int
    log: PartitionLog
    broker_id: int
    leader: int = NO_LEADER
    leader_epoch: int = UNDEFINED_EPOCH
    partition_epoch: int = 0
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    # the leader epoch's first offset on this leader: a follower below it is not yet in sync
    leader_epoch_start_offset: int = 0
    followers: dict[int, FollowerState] = field(default_factory=dict)
    isr_change_in_flight: bool = False

    @property
    def key(self) -> TopicPartition:
        return (self.topic, self.index)

    @property
    def is_leader(self) -> bool:
        return self.leader == self.broker_id

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def last_stable_offset(self) -> int:
        """The high watermark, or the first offset of the earliest open transaction if smaller."""
        first_unstable = self.log.first_unstable_offset
        hw = self.log.high_watermark
        return hw if first_unstable is None else min(hw, first_unstable)

    def fetch_limit(self, replica_id: int, isolation: int) -> int:
        """Where a reader's view ends: the log end for a follower (replica id >= 0), the last stable
        offset for a read_committed consumer, the high watermark for any other."""
        if replica_id >= 0:
            return self.log.log_end_offset
        return self.last_stable_offset if isolation == READ_COMMITTED else self.log.high_watermark

    # ------------------------------------------------------------------------------ role changes
    def make_leader(self, state: LeaderAndIsrState, now_ms: int) -> bool:
        """Become (or stay) the leader of `state`; True if this is a new leader epoch."""
        self._check_newer(state)
        new_epoch = state.leader_epoch != self.leader_epoch or not self.is_leader
        self._take(state)
        if new_epoch:
            self.leader_epoch_start_offset = self.log.log_end_offset
            # Followers start unknown: the high watermark only moves as they fetch.
            self.followers = {r: FollowerState(last_caught_up_ms=now_ms if r in self.isr else 0)
                              for r in self.replicas if r != self.broker_id}
        elif len(self.followers) != len(self.replicas) - (self.broker_id in self.replicas) or \
                any(r not in self.followers for r in self.replicas if r != self.broker_id):
            # The same epoch with another replica set (a reassignment): only replicas may fetch as
            # followers (ReplicaManager.read), so the followers follow the set, keeping what is known.
            self.followers = {r: self.followers.get(r) or
                              FollowerState(last_caught_up_ms=now_ms if r in self.isr else 0)
                              for r in self.replicas if r != self.broker_id}
        self.maybe_increment_high_watermark()
        return new_epoch

    def make_follower(self, state: LeaderAndIsrState) -> bool:
        """Follow `state.leader`; True if the leader or its epoch changed."""
        self._check_newer(state)
        changed = state.leader != self.leader or state.leader_epoch != self.leader_epoch
        self._take(state)
        self.followers = {}
        return changed

    def _check_newer(self, state: LeaderAndIsrState) -> None:
        if state.leader_epoch < self.leader_epoch:
            raise KafkaApiError(ErrorCode.STALE_CONTROLLER_EPOCH,
                                f"leader epoch {state.leader_epoch} of {self.topic}-{self.index} is older "
                                f"than the current {self.leader_epoch}")

    def _take(self, state: LeaderAndIsrState) -> None:
        self.leader = state.leader
        self.leader_epoch = state.leader_epoch
        self.partition_epoch = state.partition_epoch
        self.replicas = tuple(state.replicas)
        self.isr = tuple(state.isr)
        self.isr_change_in_flight = False

    # ------------------------------------------------------------------------------ fencing
    def check_leader_epoch(self, current_leader_epoch: int) -> ErrorCode:
        """The request's view of the leader epoch against ours (Kafka's checkCurrentLeaderEpoch)."""
        if current_leader_epoch == UNDEFINED_EPOCH or current_leader_epoch == self.leader_epoch:
            return ErrorCode.NONE
        if current_leader_epoch < self.leader_epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        return ErrorCode.UNKNOWN_LEADER_EPOCH

    def last_offset_for_leader_epoch(self, epoch: int) -> tuple[int, int] | None:
        """OffsetForLeaderEpoch: (the largest epoch at or below `epoch`, where the next one starts).
        Kafka's leader writes (its epoch, log end offset) into the cache when it takes over; this
        broker writes the entry with the epoch's first append, so until then the answer is computed
        as if the entry were there."""
        if epoch == UNDEFINED_EPOCH:
            return None
        lg = self.log
        latest = lg.leader_epoch_cache.latest_epoch
        if latest is None or latest < self.leader_epoch:
            if epoch > self.leader_epoch:
                return None
            if epoch == self.leader_epoch or latest is None:
                return epoch, lg.log_end_offset
            if epoch > latest:
                return latest, lg.log_end_offset
        return lg.end_offset_for_epoch(epoch)

    # ------------------------------------------------------------------------------ appends
    def append_records_to_leader(self, records: Records, now_ms: int, log_append_time: bool,
                                 required_acks: int, min_insync_replicas: int, *,
                                 coordinator: bool = False) -> AppendResult:
        """Append validated records as the leader. Raises KafkaApiError(NOT_LEADER_OR_FOLLOWER) if
        this replica no longer leads, (NOT_ENOUGH_REPLICAS) for acks=all below min.insync.replicas."""
        if not self.is_leader:
            raise KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        if required_acks == -1 and len(self.isr) < min_insync_replicas:
            raise KafkaApiError(ErrorCode.NOT_ENOUGH_REPLICAS)
        # LogAppendTime is stamped by the validator already; the log only assigns offsets.
        info = self.log.append(records, leader_epoch=self.leader_epoch, now_ms=now_ms, coordinator=coordinator)
        return AppendResult(info.first_offset, info.last_offset, now_ms if log_append_time else -1,
                            self.log.log_start_offset, info.duplicate)

    def append_records_to_follower(self, records: Records, now_ms: int) -> AppendInfo:
        if self.is_leader:
            raise KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                f"{self.topic}-{self.index}: the leader does not append as a follower")
        return self.log.append_as_follower(records, now_ms)

    # ------------------------------------------------------------------------------ high watermark
    def maybe_increment_high_watermark(self) -> bool:
        """Leader: the high watermark becomes the smallest log end offset in the ISR, if larger."""
        if not self.is_leader:
            return False
        new_hw = self.log.log_end_offset
        for r in self.isr:
            if r != self.broker_id:
                f = self.followers.get(r)
                new_hw = min(new_hw, f.log_end_offset if f is not None else -1)
        if new_hw > self.log.high_watermark:
            self.log.update_high_watermark(new_hw)
            return True
        return False

    def update_follower_high_watermark(self, leader_high_watermark: int) -> bool:
        """Follower: take the leader's high watermark, never past our own log end."""
        old = self.log.high_watermark
        return self.log.update_high_watermark(min(leader_high_watermark, self.log.log_end_offset)) != old

    # ------------------------------------------------------------------------------ follower state
    def update_follower_fetch_state(self, replica_id: int, fetch_offset: int, now_ms: int) -> bool | None:
        """A follower fetched from `fetch_offset`: it has everything below it. None if it is no
        replica of ours, else whether its log end offset moved (only then can the high watermark)."""
        f = self.followers.get(replica_id)
        if f is None:
            return None
        if fetch_offset >= self.log.log_end_offset:
            f.last_caught_up_ms = now_ms
        moved = f.log_end_offset != fetch_offset
        f.log_end_offset = fetch_offset
        f.last_fetch_ms = now_ms
        return moved

    def follower_idle(self, replica_id: int, fetch_offset: int, current_leader_epoch: int,
                      answered: tuple[int, int, int], now_ms: int) -> bool:
        """A follower in the ISR fetched from our log end, as at its last fetch, and the (high
        watermark, last stable offset, log start offset) its session was last answered with still
        hold: note that it is caught up and say True, its answer has nothing for this partition.
        False when anything differs (the full path then reads, moves the high watermark, expands the
        ISR or answers an error)."""
        lg = self.log
        if self.leader != self.broker_id or fetch_offset != lg.log_end_offset or replica_id not in self.isr:
            return False
        if current_leader_epoch != self.leader_epoch and current_leader_epoch != UNDEFINED_EPOCH:
            return False
        f = self.followers.get(replica_id)
        if f is None or f.log_end_offset != fetch_offset:
            return False
        if answered[0] != lg.high_watermark or answered[2] != lg.log_start_offset \
                or answered[1] != self.last_stable_offset:
            return False
        f.last_caught_up_ms = f.last_fetch_ms = now_ms
        return True

    def isr_to_expand(self, replica_id: int) -> tuple[int, ...] | None:
        """The ISR with `replica_id` added, if it has caught up and is not in it; else None."""
        f = self.followers.get(replica_id)
        if (not self.is_leader or self.isr_change_in_flight or f is None or replica_id in self.isr
                or f.log_end_offset < self.log.high_watermark
                or f.log_end_offset < self.leader_epoch_start_offset):
            return None
        return tuple(sorted((*self.isr, replica_id)))

    def isr_to_shrink(self, now_ms: int, lag_max_ms: int) -> tuple[int, ...] | None:
        """The ISR without followers that have not caught up in `lag_max_ms`, if any; else None."""
        if not self.is_leader or self.isr_change_in_flight:
            return None
        out = tuple(r for r in self.isr if r == self.broker_id or not self._lagging(r, now_ms, lag_max_ms))
        return out if out != self.isr else None

    def _lagging(self, replica_id: int, now_ms: int, lag_max_ms: int) -> bool:
        f = self.followers.get(replica_id)
        return f is None or now_ms - f.last_caught_up_ms > lag_max_ms

    def apply_isr(self, isr: tuple[int, ...], partition_epoch: int) -> bool:
        """The controller's store recorded `isr` at `partition_epoch`; True if the HW moved."""
        self.isr = tuple(isr)
        self.partition_epoch = partition_epoch
        self.isr_change_in_flight = False
        return self.maybe_increment_high_watermark()
