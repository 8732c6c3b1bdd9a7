"""The transaction coordinator's state machine (seed 003, "Message Delivery Semantics"; KIP-98, with
KIP-360's producer epoch recovery; Kafka's TransactionCoordinator and TransactionMetadata, whose
transitions, checks and error codes these follow).

One `TxnShard` holds the transactional ids of one `__transaction_state` partition. An operation is a
plain function `op(shard, ..., now_ms) -> TxnOutcome` (STYLE, "Coordinators as replicated state
machines"): it reads the shard and returns the response, the records to append (state changes only
when the runtime replays them, the same path that loads a partition) and the transaction markers
to write once the records are committed.

States (ids as stored in the log):

    Empty(0) --AddPartitions--> Ongoing(1) --EndTxn--> PrepareCommit(2) --markers--> CompleteCommit(4)
                                     |      --EndTxn/timeout/fence--> PrepareAbort(3) --> CompleteAbort(5)
    Complete*/Empty --AddPartitions--> Ongoing;  --InitProducerId--> Empty with the epoch bumped
    Dead(6): an expired id (its tombstone); PrepareEpochFence(7): Kafka's transient state while an
    open transaction is fenced, which here is written directly as PrepareAbort at the bumped epoch.

Fencing: InitProducerId bumps the epoch; an open transaction is aborted at the new epoch first (the
caller is told CONCURRENT_TRANSACTIONS and retries), so an older producer's markers, appends and
requests are refused (PRODUCER_FENCED here, INVALID_PRODUCER_EPOCH at the partitions). A transaction
open longer than its timeout is aborted the same way, by `abort_timed_out`.

Transaction protocol v2 (KIP-890 part 2, `transaction.version` 2; the client's version is that of its
request: EndTxn v5+, AddPartitionsToTxn v4+ sent by a partition leader for a Produce v12+ or a
TxnOffsetCommit v5+): every EndTxn bumps the epoch, so each transaction has its own and a late write
of the previous one is fenced at the partitions by the epoch alone. The PrepareCommit/PrepareAbort
record carries the bumped epoch (the markers are written with it) and EndTxn answers it; when the
epoch is exhausted (32766) the record names a next producer id, which Complete* switches to at epoch
0. A retried EndTxn is recognised by its epoch being one below the stored one (or, after a switch,
by the previous producer id), Kafka's table:

                    abort: retry  current     commit: retry  current
    Empty                  FENCED bump                FENCED INVALID_TXN_STATE
    CompleteAbort          NONE   bump                INVALID_TXN_STATE (both)
    CompleteCommit         INVALID_TXN_STATE bump     NONE   INVALID_TXN_STATE

With transaction.version 2 finalized (`TxnConfig.transaction_version`), a fenced transaction
(InitProducerId over it, its timeout) is aborted at epoch + 2: the fence's bump and the end's. Records of a v2 transaction are written as TransactionLogValue version 1 (with
the previous/next producer ids and the client's transaction version), others as version 0.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from odradek.coordinator.transactions_records import TxnRecord, TxnValue
from odradek.protocol.error_codes import ErrorCode

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_EPOCH = 32767
NEED_PRODUCER_ID = object()   # the operation needs a fresh producer id: call it again with one
TV_0 = 0                      # transaction.version levels (Kafka's TransactionVersion)
TV_2 = 2


def supports_epoch_bump(client_transaction_version: int) -> bool:
    return client_transaction_version >= TV_2


def is_epoch_exhausted(epoch: int) -> bool:
    """No epoch is handed out at or past MAX_EPOCH - 1, so a producer can always still be fenced."""
    return epoch >= MAX_EPOCH - 1


class TxnState(enum.IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def display(self) -> str:
        """Kafka's name of the state (DescribeTransactions, ListTransactions)."""
        return _DISPLAY[self]


_DISPLAY = {TxnState.EMPTY: "Empty", TxnState.ONGOING: "Ongoing", TxnState.PREPARE_COMMIT: "PrepareCommit",
            TxnState.PREPARE_ABORT: "PrepareAbort", TxnState.COMPLETE_COMMIT: "CompleteCommit",
            TxnState.COMPLETE_ABORT: "CompleteAbort", TxnState.DEAD: "Dead",
            TxnState.PREPARE_EPOCH_FENCE: "PrepareEpochFence"}
COMPLETE = (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
PREPARE = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


@dataclass(frozen=True)
class TxnConfig:
    """Broker settings the transaction coordinator reads (Kafka's names, units last)."""
    max_timeout_ms: int = 900_000                      # transaction.max.timeout.ms
    abort_timed_out_interval_ms: int = 10_000          # transaction.abort.timed.out.transaction.cleanup.interval.ms
    id_expiration_ms: int = 604_800_000                # transactional.id.expiration.ms
    remove_expired_interval_ms: int = 3_600_000        # transaction.remove.expired.transaction.cleanup.interval.ms
    load_buffer_bytes: int = 5 * 1024 * 1024           # transaction.state.log.load.buffer.size
    transaction_version: int = 2                       # the finalized transaction.version feature level


@dataclass
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[tuple[str, int]]
    last_update_ms: int
    start_ms: int = -1
    last_producer_epoch: int = NO_PRODUCER_EPOCH   # in memory only, as with Kafka's v0 records
    previous_producer_id: int = NO_PRODUCER_ID
    next_producer_id: int = NO_PRODUCER_ID
    client_transaction_version: int = TV_0

    def value(self, **changes: object) -> TxnValue:
        v = TxnValue(self.producer_id, self.producer_epoch, self.timeout_ms, int(self.state), self.partitions,
                     self.last_update_ms, self.start_ms, self.last_producer_epoch, self.previous_producer_id,
                     self.next_producer_id, self.client_transaction_version)
        return replace(v, **changes)   # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class MarkerJob:
    """Write a COMMIT or ABORT marker for the transaction to each of its partitions, then complete it."""
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: frozenset[tuple[str, int]]


@dataclass(frozen=True, slots=True)
class EndResult:
    """EndTxn's answer; from v5 the producer id and epoch the next transaction uses."""
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True, slots=True)
class InitResult:
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass
class TxnOutcome:
    response: object = None
    records: list[TxnRecord] = field(default_factory=list)
    markers: list[MarkerJob] = field(default_factory=list)
    wait_complete: str | None = None   # answer once this transactional id's transaction is complete


class TxnShard:
    def __init__(self, partition: int, config: TxnConfig, coordinator_epoch: int = 0) -> None:
        self.partition = partition
        self.config = config
        self.coordinator_epoch = coordinator_epoch
        self.txns: dict[str, TxnMetadata] = {}

    def get(self, transactional_id: str) -> TxnMetadata | None:
        m = self.txns.get(transactional_id)
        return None if m is None or m.state == TxnState.DEAD else m

    def replay(self, record: TxnRecord, now_ms: int = 0) -> None:
        """Apply one record; later records win and a tombstone deletes (compaction keeps the last).
        `now_ms` is not needed here (the runtime passes it to every shard)."""
        v = record.value
        if v is None:
            self.txns.pop(record.transactional_id, None)
            return
        self.txns[record.transactional_id] = TxnMetadata(
            record.transactional_id, v.producer_id, v.producer_epoch, v.timeout_ms, TxnState(v.state),
            v.partitions, v.last_update_ms, v.start_ms, v.last_producer_epoch, v.previous_producer_id,
            v.next_producer_id, v.client_transaction_version)

    def pending_markers(self) -> list[MarkerJob]:
        """Transactions whose markers were not all written (after a load): write them again."""
        return [_marker_job(m) for m in self.txns.values() if m.state in PREPARE]


def _marker_job(m: TxnMetadata) -> MarkerJob:
    return MarkerJob(m.transactional_id, m.producer_id, m.producer_epoch, m.state == TxnState.PREPARE_COMMIT,
                     m.partitions)


def _write(m: TxnMetadata, value: TxnValue) -> TxnRecord:
    return TxnRecord(m.transactional_id, value)


# ------------------------------------------------------------------------------------------ InitProducerId
def init_producer_id(shard: TxnShard, transactional_id: str, timeout_ms: int, expected_pid: int,
                     expected_epoch: int, new_producer_id: int | None, now_ms: int) -> TxnOutcome:
    """InitProducerId with a transactional id. `expected_*` are -1 unless a KIP-360 producer resumes;
    `new_producer_id` is None until the op has asked for one (NEED_PRODUCER_ID)."""
    if timeout_ms <= 0 or timeout_ms > shard.config.max_timeout_ms:
        return TxnOutcome(InitResult(ErrorCode.INVALID_TRANSACTION_TIMEOUT))
    m = shard.get(transactional_id)
    if m is None:
        if new_producer_id is None:
            return TxnOutcome(NEED_PRODUCER_ID)
        value = TxnValue(new_producer_id, 0, timeout_ms, int(TxnState.EMPTY), frozenset(), now_ms, -1)
        return TxnOutcome(InitResult(ErrorCode.NONE, new_producer_id, 0),
                          [TxnRecord(transactional_id, value)])
    resuming = expected_pid != NO_PRODUCER_ID
    if resuming and m.producer_epoch != NO_PRODUCER_EPOCH and expected_pid != m.producer_id \
            and not (expected_pid == m.previous_producer_id and is_epoch_exhausted(expected_epoch)):
        return TxnOutcome(InitResult(ErrorCode.PRODUCER_FENCED))
    if m.state in PREPARE or m.state == TxnState.PREPARE_EPOCH_FENCE:
        return TxnOutcome(InitResult(ErrorCode.CONCURRENT_TRANSACTIONS))
    if m.state == TxnState.ONGOING:
        # Fence the current producer: abort its transaction at a bumped epoch; the caller retries.
        out = _fence(shard, m, now_ms)
        out.response = InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)
        return out
    # Empty, CompleteCommit, CompleteAbort: bump the epoch (or rotate the id when it is exhausted).
    if m.producer_epoch >= MAX_EPOCH - 1 and (not resuming or expected_epoch == m.producer_epoch):
        if new_producer_id is None:
            return TxnOutcome(NEED_PRODUCER_ID)
        value = m.value(producer_id=new_producer_id, producer_epoch=0, timeout_ms=timeout_ms,
                        state=int(TxnState.EMPTY), partitions=frozenset(), last_update_ms=now_ms, start_ms=-1,
                        last_producer_epoch=m.producer_epoch if resuming else NO_PRODUCER_EPOCH,
                        previous_producer_id=m.producer_id, next_producer_id=NO_PRODUCER_ID)
        return TxnOutcome(InitResult(ErrorCode.NONE, new_producer_id, 0), [_write(m, value)])
    if not resuming:
        epoch, last = m.producer_epoch + 1, NO_PRODUCER_EPOCH
    elif expected_epoch == m.producer_epoch or m.producer_epoch == NO_PRODUCER_EPOCH:
        epoch, last = m.producer_epoch + 1, m.producer_epoch
    elif expected_epoch == m.last_producer_epoch:
        return TxnOutcome(InitResult(ErrorCode.NONE, m.producer_id, m.producer_epoch))   # a retry
    else:
        return TxnOutcome(InitResult(ErrorCode.PRODUCER_FENCED))
    value = m.value(producer_epoch=epoch, timeout_ms=timeout_ms, state=int(TxnState.EMPTY),
                    partitions=frozenset(), last_update_ms=now_ms, start_ms=-1, last_producer_epoch=last)
    return TxnOutcome(InitResult(ErrorCode.NONE, m.producer_id, epoch), [_write(m, value)])


# ------------------------------------------------------------------------------------------ checks
def _check_producer(m: TxnMetadata | None, producer_id: int, producer_epoch: int) -> ErrorCode:
    if m is None or m.producer_id != producer_id:
        return ErrorCode.INVALID_PRODUCER_ID_MAPPING
    if producer_epoch != m.producer_epoch:
        return ErrorCode.PRODUCER_FENCED
    return ErrorCode.NONE


# ------------------------------------------------------------------------------------------ AddPartitions
def add_partitions(shard: TxnShard, transactional_id: str, producer_id: int, producer_epoch: int,
                   partitions: list[tuple[str, int]], now_ms: int, client_transaction_version: int = TV_0
                   ) -> TxnOutcome:
    """AddPartitionsToTxn (and AddOffsetsToTxn, with the group's offsets partition; and a partition
    leader adding a partition for a v2 client): one error code for the whole request (the handler
    spreads it over the partitions). The transaction takes the client's transaction version."""
    m = shard.get(transactional_id)
    code = _check_producer(m, producer_id, producer_epoch)
    if code != ErrorCode.NONE:
        return TxnOutcome(code)
    assert m is not None
    if m.state in PREPARE or m.state == TxnState.PREPARE_EPOCH_FENCE:
        return TxnOutcome(ErrorCode.CONCURRENT_TRANSACTIONS)
    wanted = frozenset(partitions)
    if m.state == TxnState.ONGOING and wanted <= m.partitions:
        return TxnOutcome(ErrorCode.NONE)
    start = m.start_ms if m.state == TxnState.ONGOING else now_ms
    value = m.value(state=int(TxnState.ONGOING), partitions=m.partitions | wanted, last_update_ms=now_ms,
                    start_ms=start, client_transaction_version=client_transaction_version)
    return TxnOutcome(ErrorCode.NONE, [_write(m, value)])


def verify_partitions(shard: TxnShard, transactional_id: str, producer_id: int, producer_epoch: int,
                      partitions: list[tuple[str, int]]) -> dict[tuple[str, int], ErrorCode]:
    """AddPartitionsToTxn v4+ with verify_only (KIP-890 part 1): is each partition in the open
    transaction? A transaction being ended answers CONCURRENT_TRANSACTIONS (the leader retries);
    a partition not in it, TRANSACTION_ABORTABLE."""
    m = shard.get(transactional_id)
    code = _check_producer(m, producer_id, producer_epoch)
    if code == ErrorCode.NONE:
        assert m is not None
        if m.state in PREPARE or m.state == TxnState.PREPARE_EPOCH_FENCE:
            code = ErrorCode.CONCURRENT_TRANSACTIONS
    if code != ErrorCode.NONE:
        return {tp: code for tp in partitions}
    assert m is not None
    return {tp: ErrorCode.NONE if tp in m.partitions else ErrorCode.TRANSACTION_ABORTABLE for tp in partitions}


# ------------------------------------------------------------------------------------------ EndTxn
def _begin_end(m: TxnMetadata, *, commit: bool, epoch: int, now_ms: int, last_epoch: int | None = None,
               next_producer_id: int = NO_PRODUCER_ID, start_ms: int | None = None,
               client_transaction_version: int | None = None) -> TxnOutcome:
    state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    changes: dict[str, object] = {}
    if client_transaction_version is not None:
        changes["client_transaction_version"] = client_transaction_version
    if last_epoch is not None:
        changes["last_producer_epoch"] = last_epoch
    if start_ms is not None:
        changes["start_ms"] = start_ms
    value = m.value(producer_epoch=epoch, state=int(state), last_update_ms=now_ms,
                    next_producer_id=next_producer_id, **changes)
    job = MarkerJob(m.transactional_id, m.producer_id, epoch, commit, m.partitions)
    return TxnOutcome(ErrorCode.NONE, [_write(m, value)], [job])


def _fence(shard: TxnShard, m: TxnMetadata, now_ms: int) -> TxnOutcome:
    """Abort `m`'s open transaction at a bumped epoch (Kafka's PrepareEpochFence then PrepareAbort):
    one bump, and with transaction.version 2 finalized the end's own bump too (Kafka ends a fenced
    transaction at the cluster's version, whatever its client spoke), so a v2 client's EndTxn at
    the old epoch is told PRODUCER_FENCED rather than taken for a retry."""
    fenced = min(m.producer_epoch + 1, MAX_EPOCH - 1)
    if supports_epoch_bump(shard.config.transaction_version):
        return _begin_end(m, commit=False, epoch=min(fenced + 1, MAX_EPOCH), last_epoch=fenced, now_ms=now_ms)
    return _begin_end(m, commit=False, epoch=fenced, last_epoch=NO_PRODUCER_EPOCH, now_ms=now_ms)


def end_txn(shard: TxnShard, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
            now_ms: int) -> TxnOutcome:
    """EndTxn below v5 (transaction protocol v1): the epoch stays; the response is an ErrorCode."""
    m = shard.get(transactional_id)
    code = _check_producer(m, producer_id, producer_epoch)
    if code != ErrorCode.NONE:
        return TxnOutcome(code)
    assert m is not None
    if m.state == TxnState.ONGOING:
        out = _begin_end(m, commit=commit, epoch=m.producer_epoch, now_ms=now_ms)
        out.wait_complete = transactional_id
        return out
    done, prepared = (TxnState.COMPLETE_COMMIT, TxnState.PREPARE_COMMIT) if commit \
        else (TxnState.COMPLETE_ABORT, TxnState.PREPARE_ABORT)
    if m.state == done:
        return TxnOutcome(ErrorCode.NONE)                   # a retry of an EndTxn that succeeded
    if m.state == prepared:
        return TxnOutcome(ErrorCode.CONCURRENT_TRANSACTIONS)
    return TxnOutcome(ErrorCode.INVALID_TXN_STATE)


def end_txn_v2(shard: TxnShard, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
               next_producer_id: int | None, now_ms: int) -> TxnOutcome:
    """EndTxn v5+ (transaction protocol v2): the response is an `EndResult` with the producer id and
    epoch of the next transaction, or NEED_PRODUCER_ID when the epoch bump exhausts the producer
    id and `next_producer_id` is None (call it again with one)."""
    return _end_txn_v2(shard, transactional_id, producer_id, producer_epoch, commit, now_ms, next_producer_id)


def _end_txn_v2(shard: TxnShard, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
                now_ms: int, next_producer_id: int | None) -> TxnOutcome:
    m = shard.get(transactional_id)
    if m is None:
        return TxnOutcome(EndResult(ErrorCode.INVALID_PRODUCER_ID_MAPPING))
    retry_on_overflow = m.previous_producer_id == producer_id and producer_epoch == MAX_EPOCH - 1 \
        and m.producer_epoch == 0
    retry_on_bump = m.producer_epoch == producer_epoch + 1
    if m.producer_id != producer_id and not retry_on_overflow:
        return TxnOutcome(EndResult(ErrorCode.INVALID_PRODUCER_ID_MAPPING))
    if m.state in (TxnState.ONGOING, TxnState.EMPTY):
        valid = producer_epoch == m.producer_epoch
    elif m.state in PREPARE:
        valid = retry_on_bump
    else:
        valid = retry_on_bump or retry_on_overflow or producer_epoch == m.producer_epoch
    if not valid:
        return TxnOutcome(EndResult(ErrorCode.PRODUCER_FENCED))
    is_retry = retry_on_bump or retry_on_overflow
    state = m.state
    if state == TxnState.ONGOING:
        return _bump_and_end(m, commit, now_ms, next_producer_id, no_partition_added=False)
    if state == TxnState.EMPTY:
        return _bump_and_end(m, False, now_ms, next_producer_id, True) if not commit \
            else TxnOutcome(EndResult(ErrorCode.INVALID_TXN_STATE))
    if state == TxnState.COMPLETE_COMMIT:
        if commit:
            return TxnOutcome(EndResult(ErrorCode.NONE, m.producer_id, m.producer_epoch) if is_retry
                              else EndResult(ErrorCode.INVALID_TXN_STATE))
        return TxnOutcome(EndResult(ErrorCode.INVALID_TXN_STATE)) if is_retry \
            else _bump_and_end(m, False, now_ms, next_producer_id, True)
    if state == TxnState.COMPLETE_ABORT:
        if not commit:
            return TxnOutcome(EndResult(ErrorCode.NONE, m.producer_id, m.producer_epoch)) if is_retry \
                else _bump_and_end(m, False, now_ms, next_producer_id, True)
        return TxnOutcome(EndResult(ErrorCode.INVALID_TXN_STATE))
    if (state == TxnState.PREPARE_COMMIT) == commit and state in PREPARE:
        return TxnOutcome(EndResult(ErrorCode.CONCURRENT_TRANSACTIONS))
    return TxnOutcome(EndResult(ErrorCode.INVALID_TXN_STATE))


def _bump_and_end(m: TxnMetadata, commit: bool, now_ms: int, next_producer_id: int | None,
                  no_partition_added: bool) -> TxnOutcome:
    """Prepare the end at epoch + 1 (a new producer id once that exhausts the epochs): the answer is
    the producer id and epoch of the producer's next transaction."""
    if is_epoch_exhausted(m.producer_epoch):
        if next_producer_id is None:
            return TxnOutcome(NEED_PRODUCER_ID)
        answer = EndResult(ErrorCode.NONE, next_producer_id, 0)
    else:
        next_producer_id = NO_PRODUCER_ID
        answer = EndResult(ErrorCode.NONE, m.producer_id, m.producer_epoch + 1)
    out = _begin_end(m, commit=commit, epoch=m.producer_epoch + 1, last_epoch=m.producer_epoch, now_ms=now_ms,
                     next_producer_id=next_producer_id, start_ms=now_ms if no_partition_added else None,
                     client_transaction_version=TV_2)
    out.response = answer
    out.wait_complete = m.transactional_id
    return out


def complete_txn(shard: TxnShard, job: MarkerJob, now_ms: int) -> TxnOutcome:
    """Every marker of `job` is written: the transaction is complete (nothing if it moved on)."""
    m = shard.get(job.transactional_id)
    expected = TxnState.PREPARE_COMMIT if job.commit else TxnState.PREPARE_ABORT
    if m is None or m.state != expected or m.producer_id != job.producer_id \
            or m.producer_epoch != job.producer_epoch:
        return TxnOutcome(ErrorCode.NONE)
    state = TxnState.COMPLETE_COMMIT if job.commit else TxnState.COMPLETE_ABORT
    value = m.value(state=int(state), partitions=frozenset(), last_update_ms=now_ms)
    if supports_epoch_bump(m.client_transaction_version) and m.next_producer_id != NO_PRODUCER_ID:
        # The epochs of this producer id are used up: the next transaction runs on the next id.
        value = replace(value, producer_id=m.next_producer_id, producer_epoch=0,
                        previous_producer_id=m.producer_id, next_producer_id=NO_PRODUCER_ID)
    return TxnOutcome(ErrorCode.NONE, [_write(m, value)])


# ------------------------------------------------------------------------------------------ timers
def abort_timed_out(shard: TxnShard, now_ms: int) -> TxnOutcome:
    """Abort, at a bumped epoch, every transaction open longer than its timeout."""
    out = TxnOutcome()
    for m in list(shard.txns.values()):
        if m.state == TxnState.ONGOING and m.start_ms >= 0 and m.start_ms + m.timeout_ms <= now_ms:
            one = _fence(shard, m, now_ms)
            out.records += one.records
            out.markers += one.markers
    return out


def expire_ids(shard: TxnShard, now_ms: int) -> TxnOutcome:
    """Tombstones for transactional ids idle (Empty or complete) for transactional.id.expiration.ms."""
    out = TxnOutcome()
    for m in list(shard.txns.values()):
        if (m.state == TxnState.EMPTY or m.state in COMPLETE) \
                and m.last_update_ms + shard.config.id_expiration_ms <= now_ms:
            out.records.append(TxnRecord(m.transactional_id, None))
    return out
