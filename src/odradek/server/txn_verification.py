"""Transactional writes checked with the transaction coordinator before they are appended (seed 003,
"Message Delivery Semantics"; KIP-890 parts 1 and 2; Kafka's AddPartitionsToTxnManager and
ReplicaManager.handleProduceAppend, whose rules and error translations these follow).

When a transactional batch is the first write of its producer's transaction on a partition (the
partition's producer state has no transaction open for that producer id and epoch), the leader
records a verification guard (`storage/producer_verification.py`) and asks the coordinator of the
transactional id, with an AddPartitionsToTxn v4+ entry for the transaction:

- Produce v11 and below, TxnOffsetCommit v4 and below: `verify_only`: is the partition part of the
  open transaction? Only when `transaction.partition.verification.enable` (default true);
- Produce v12+, TxnOffsetCommit v5+ (the transaction protocol v2, KIP-890 part 2, whose clients send
  no AddPartitionsToTxn or AddOffsetsToTxn): add the partition to the transaction, whatever that
  setting says.

The coordinator is this broker's own runtime when it leads the id's `__transaction_state` partition,
otherwise its leader in the metadata image, reached over the inter-broker channel "txn-verification"
(one AddPartitionsToTxn v5 request per produce request and transaction, several partitions each).
The request's task awaits the answer, parked (`network.Parked`: it does not count in
`queued.max.requests` meanwhile); the event loop and other requests go on. The append
then passes only if the transaction is open here or the guard is still the producer's current one
(`check_verified`, right before the append, with no await in between).

Errors, as Kafka gives them back: the coordinator's PRODUCER_FENCED becomes INVALID_PRODUCER_EPOCH;
TRANSACTION_ABORTABLE (a partition not in the transaction) goes to clients that know it (Produce v11+,
TxnOffsetCommit v4+) and INVALID_TXN_STATE ("Partition was not added to the transaction") to older
ones; NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS, a lost connection,
and CONCURRENT_TRANSACTIONS below the protocol v2 become NOT_ENOUGH_REPLICAS for Produce (retried by
every client without a metadata refresh). The protocol v2's adds retry CONCURRENT_TRANSACTIONS every
`add.partitions.to.txn.retry.backoff.ms` (20) for at most `add.partitions.to.txn.retry.backoff.max.ms`
(100, capped by `request.timeout.ms`) and then answer it as is.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from odradek.coordinator.runtime import CoordinatorError
from odradek.coordinator.transactions import TV_2, add_partitions, verify_partitions
from odradek.coordinator.transactions_records import TRANSACTION_STATE_TOPIC, partition_for
from odradek.coordinator.transactions_runtime import TransactionCoordinator
from odradek.protocol.error_codes import ErrorCode, for_code
from odradek.protocol.messages import add_partitions_to_txn as ap
from odradek.records.header import HEADER_SIZE, TRANSACTIONAL_MASK, BatchHeader
from odradek.server.inter_broker import BrokerChannels
from odradek.server.metadata_cache import MetadataCache
from odradek.server.network import Parked
from odradek.storage.producer_state import InvalidTxnStateError
from odradek.storage.producer_verification import VerificationGuard

log = logging.getLogger("odradek.transactions")

ADD_PARTITIONS_TO_TXN_KEY = 24
PURPOSE = "txn-verification"
TopicPartition = tuple[str, int]
_MAGIC_AT = 16


class Operation(enum.Enum):
    """What a request's version lets the leader do (Kafka's TransactionSupportedOperation)."""
    DEFAULT_ERROR = "defaultError"            # verify; the client knows no TRANSACTION_ABORTABLE
    GENERIC_ERROR = "genericErrorSupported"   # verify; TRANSACTION_ABORTABLE goes back as it is
    ADD_PARTITION = "addPartition"            # the transaction protocol v2: add the partition

    @property
    def supports_epoch_bump(self) -> bool:
        return self is Operation.ADD_PARTITION


def produce_operation(version: int) -> Operation:
    return Operation.ADD_PARTITION if version > 11 else \
        Operation.GENERIC_ERROR if version > 10 else Operation.DEFAULT_ERROR


def txn_offset_commit_operation(version: int) -> Operation:
    return Operation.ADD_PARTITION if version > 4 else \
        Operation.GENERIC_ERROR if version > 3 else Operation.DEFAULT_ERROR


@dataclass(slots=True)
class TxnBatch:
    """The first batch of a partition's records when it is transactional."""
    producer_id: int
    producer_epoch: int
    base_sequence: int
    guard: VerificationGuard | None = None


def transactional_batch(records: object) -> TxnBatch | None:
    """The producer of `records` if its first batch is a transactional v2 batch (anything unreadable:
    None, the validator refuses it later)."""
    if not isinstance(records, (bytes, bytearray, memoryview)) or len(records) < HEADER_SIZE \
            or records[_MAGIC_AT] != 2:
        return None
    h = BatchHeader(records, 0)
    if h.producer_id < 0 or not h.attributes & TRANSACTIONAL_MASK:
        return None
    return TxnBatch(h.producer_id, h.producer_epoch, h.base_sequence)


def produce_error(code: ErrorCode, operation: Operation) -> tuple[ErrorCode, str | None]:
    """A verification's error as a produce partition's answer (Kafka's postVerificationCallback)."""
    if code == ErrorCode.INVALID_TXN_STATE:
        return code, "Partition was not added to the transaction"
    if code in (ErrorCode.NETWORK_EXCEPTION, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR) \
            or (code == ErrorCode.CONCURRENT_TRANSACTIONS and not operation.supports_epoch_bump):
        return ErrorCode.NOT_ENOUGH_REPLICAS, ("Unable to verify the partition has been added to the "
                                               f"transaction. Underlying error: {code.name}")
    return code, None


def offset_commit_error(code: ErrorCode) -> ErrorCode:
    """A verification's error as a TxnOffsetCommit partition's answer (Kafka's
    maybeConvertOffsetCommitError)."""
    if code == ErrorCode.NETWORK_EXCEPTION:
        return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    if code in (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_ENOUGH_REPLICAS,
                ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.KAFKA_STORAGE_ERROR):
        return ErrorCode.NOT_COORDINATOR
    return code


class TxnVerifier:
    """Asks the transaction coordinator about (or adds) a transaction's partitions for a leader."""

    def __init__(self, broker_id: int, metadata: MetadataCache,
                 coordinator: Callable[[], TransactionCoordinator | None],
                 channels: BrokerChannels | None = None) -> None:
        self.broker_id = broker_id
        self.metadata = metadata
        self.coordinator = coordinator
        self.channels = channels

    @property
    def enabled(self) -> bool:
        """transaction.partition.verification.enable, as of the current image (it is dynamic)."""
        return bool(self.metadata.image.config.get("transaction.partition.verification.enable"))

    def wanted(self, transactional_id: str | None, operation: Operation) -> bool:
        """Does a write of this request start a verification (or, v2, an add) at all?"""
        return transactional_id is not None and (operation.supports_epoch_bump or self.enabled)

    async def verify(self, transactional_id: str, producer_id: int, producer_epoch: int,
                     partitions: list[TopicPartition], operation: Operation) -> dict[TopicPartition, ErrorCode]:
        """The error of each partition (NONE: in the transaction, or added to it)."""
        errors = await self._ask(transactional_id, producer_id, producer_epoch, partitions, operation)
        if not operation.supports_epoch_bump:
            return errors
        config = self.metadata.image.config
        backoff_ms = config.get("add.partitions.to.txn.retry.backoff.ms")
        deadline = time.monotonic() + min(config.get("add.partitions.to.txn.retry.backoff.max.ms"),
                                          config.get("request.timeout.ms")) / 1000
        while True:
            retry = [tp for tp, code in errors.items() if code == ErrorCode.CONCURRENT_TRANSACTIONS]
            if not retry or time.monotonic() >= deadline:
                return errors
            with Parked():
                await asyncio.sleep(backoff_ms / 1000)
            errors.update(await self._ask(transactional_id, producer_id, producer_epoch, retry, operation))

    async def _ask(self, transactional_id: str, producer_id: int, producer_epoch: int,
                   partitions: list[TopicPartition], operation: Operation) -> dict[TopicPartition, ErrorCode]:
        leader = self._coordinator_id(transactional_id)
        if leader is None:
            raw = {tp: ErrorCode.COORDINATOR_NOT_AVAILABLE for tp in partitions}
        elif leader == self.broker_id:
            raw = await self._ask_local(transactional_id, producer_id, producer_epoch, partitions, operation)
        else:
            raw = await self._ask_remote(leader, transactional_id, producer_id, producer_epoch, partitions,
                                         operation)
        out = {}
        for tp, code in raw.items():
            if code == ErrorCode.PRODUCER_FENCED:
                code = ErrorCode.INVALID_PRODUCER_EPOCH
            elif code == ErrorCode.TRANSACTION_ABORTABLE and operation is Operation.DEFAULT_ERROR:
                code = ErrorCode.INVALID_TXN_STATE   # "for backward compatibility with clients"
            out[tp] = code
        return out

    def _coordinator_id(self, transactional_id: str) -> int | None:
        image = self.metadata.image
        info = image.topic(TRANSACTION_STATE_TOPIC)
        if info is None or not info.partitions:
            return None
        state = info.partitions.get(partition_for(transactional_id, len(info.partitions)))
        if state is None or state.leader < 0:
            return None
        if state.leader != self.broker_id and state.leader not in image.live_broker_ids():
            return None
        leader: int = state.leader
        return leader

    async def _ask_local(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         partitions: list[TopicPartition], operation: Operation) -> dict[TopicPartition, ErrorCode]:
        coordinator = self.coordinator()
        if coordinator is None:
            return {tp: ErrorCode.COORDINATOR_NOT_AVAILABLE for tp in partitions}
        try:
            if not operation.supports_epoch_bump:
                verified: dict[TopicPartition, ErrorCode] = coordinator.query(
                    transactional_id, verify_partitions, transactional_id, producer_id, producer_epoch, partitions)
                return verified
            code = await coordinator.execute(
                transactional_id, functools.partial(add_partitions, client_transaction_version=TV_2),
                transactional_id, producer_id, producer_epoch, partitions)
        except CoordinatorError as e:
            code = e.code
        return {tp: code for tp in partitions}

    async def _ask_remote(self, broker_id: int, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: list[TopicPartition], operation: Operation
                          ) -> dict[TopicPartition, ErrorCode]:
        if self.channels is None:
            return {tp: ErrorCode.COORDINATOR_NOT_AVAILABLE for tp in partitions}
        by_topic: dict[str, list[int]] = {}
        for topic, index in partitions:
            by_topic.setdefault(topic, []).append(index)
        request = ap.AddPartitionsToTxnRequest(transactions=[ap.AddPartitionsToTxnTransaction(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
            verify_only=not operation.supports_epoch_bump,
            topics=[ap.AddPartitionsToTxnTopic(name=t, partitions=ps) for t, ps in by_topic.items()])])
        try:
            with Parked():
                response = await self.channels.request(PURPOSE, broker_id, ADD_PARTITIONS_TO_TXN_KEY, request)
        except Exception as e:     # unreachable, or an answer that does not fit: the client retries
            log.info("AddPartitionsToTxn to broker %d for %s: %s", broker_id, transactional_id, e)
            return {tp: ErrorCode.NETWORK_EXCEPTION for tp in partitions}
        top = for_code(response.error_code or 0)
        if top != ErrorCode.NONE:
            code = ErrorCode.INVALID_TXN_STATE if top == ErrorCode.CLUSTER_AUTHORIZATION_FAILED else top
            return {tp: code for tp in partitions}
        # A partition the answer leaves out is not known to be in the transaction: retried.
        errors = {tp: ErrorCode.NETWORK_EXCEPTION for tp in partitions}
        for result in response.results_by_transaction or []:
            if result.transactional_id != transactional_id:
                continue
            for t in result.topic_results:
                for r in t.results_by_partition:
                    tp = (t.name, r.partition_index)
                    if tp in errors:
                        errors[tp] = for_code(r.partition_error_code)
        return errors


def check_verified(producer_state: object, batch: TxnBatch | None, enabled: bool) -> None:
    """Right before the append: a transactional batch that would open a transaction here must carry
    the producer's current guard. Raises InvalidTxnStateError (INVALID_TXN_STATE)."""
    if batch is None or not enabled or producer_state is None:
        return
    is_verified = getattr(producer_state, "is_verified", None)
    if is_verified is not None and not is_verified(batch.producer_id, batch.producer_epoch, batch.guard):
        raise InvalidTxnStateError("Record was not part of an ongoing transaction")


class ProduceVerification:
    """One Produce request's transactional partitions: their batches, guards and verification errors."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.batches: dict[TopicPartition, TxnBatch] = {}
        self.errors: dict[TopicPartition, tuple[ErrorCode, str | None]] = {}

    def error(self, topic: str, index: int) -> tuple[ErrorCode, str | None] | None:
        return self.errors.get((topic, index))

    def check(self, partition: object, topic: str, index: int) -> None:
        """`check_verified` for the partition's batch, against the partition's producer state."""
        batch = self.batches.get((topic, index))
        if batch is not None:
            check_verified(getattr(getattr(partition, "log", None), "producer_state", None), batch, self.enabled)


async def verify_produce(verifier: TxnVerifier | None, leader_partition: Callable[[str, int], object],
                         transactional_id: str | None, version: int,
                         partitions: list[tuple[str | None, int, object]], now_ms: int) -> ProduceVerification:
    """Start (and await) the verification of a Produce request's transactional partitions:
    `partitions` holds (topic, index, records); `leader_partition` the replica manager's lookup."""
    out = ProduceVerification(verifier.enabled if verifier is not None else True)
    for topic, index, records in partitions:
        batch = transactional_batch(records) if topic is not None else None
        if batch is not None and topic is not None:
            out.batches[(topic, index)] = batch
    if not out.batches or verifier is None:
        return out
    producers = {(b.producer_id, b.producer_epoch) for b in out.batches.values()}
    if len(producers) > 1:   # Kafka: "Transactional records contained more than one producer ID"
        out.errors = {tp: (ErrorCode.INVALID_PRODUCER_ID_MAPPING, None) for tp in out.batches}
        return out
    operation = produce_operation(version)
    if not verifier.wanted(transactional_id, operation):
        return out
    assert transactional_id is not None
    ((producer_id, producer_epoch),) = producers
    ask: list[TopicPartition] = []
    for tp, batch in out.batches.items():
        try:
            state = getattr(getattr(leader_partition(*tp), "log", None), "producer_state", None)
        except Exception:      # not the leader, gone: the append answers it
            continue
        if state is None:
            continue
        batch.guard = state.maybe_start_verification(batch.producer_id, batch.base_sequence, batch.producer_epoch,
                                                     now_ms, operation.supports_epoch_bump)
        if batch.guard is not None:
            ask.append(tp)
    if ask:
        errors = await verifier.verify(transactional_id, producer_id, producer_epoch, ask, operation)
        out.errors = {tp: produce_error(code, operation) for tp, code in errors.items() if code != ErrorCode.NONE}
    return out
