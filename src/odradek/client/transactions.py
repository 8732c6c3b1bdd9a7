"""The transactional producer: Kafka's TransactionManager state machine and the requests it sends to
the transaction and group coordinators (seed 003, "Message Delivery Semantics"; KIP-98, KIP-360's
epoch bump, KIP-447's group metadata in TxnOffsetCommit, KIP-588's error classes).

States (Kafka's names) and the calls that move between them:

    UNINITIALIZED --init_transactions--> INITIALIZING --> READY
    READY --begin_transaction--> IN_TRANSACTION --commit_transaction--> COMMITTING --> READY
    IN_TRANSACTION --prepare_transaction--> PREPARED --commit / abort--> READY
    IN_TRANSACTION | ABORTABLE_ERROR | PREPARED --abort_transaction--> ABORTING --> READY
    IN_TRANSACTION | COMMITTING --(a send or request failed, abortable)--> ABORTABLE_ERROR
    any --(fenced, unauthorised, unexpected error)--> FATAL_ERROR

Requests, each to the coordinator of the transactional id (FindCoordinator, key type 1):
InitProducerId (the producer id and a bumped epoch, which fences older producers of the id and
aborts their open transaction), AddPartitionsToTxn before the first batch of a transaction goes to a
partition (the sender holds such batches back until it is answered), AddOffsetsToTxn and then
TxnOffsetCommit to the *group* coordinator (send_offsets_to_transaction), EndTxn. NOT_COORDINATOR,
COORDINATOR_NOT_AVAILABLE and lost connections look the coordinator up again; COORDINATOR_LOAD_IN_PROGRESS,
CONCURRENT_TRANSACTIONS and UNKNOWN_TOPIC_OR_PARTITION are retried after retry.backoff.ms.

Error classes, as the Java client raises them: PRODUCER_FENCED, and INVALID_PRODUCER_EPOCH from a
coordinator, are fatal (`ProducerFencedError`); authorization failures of the id, INVALID_TXN_STATE and
unexpected codes are fatal too; INVALID_PRODUCER_EPOCH from a partition leader
(`InvalidProducerEpochError`), TRANSACTION_ABORTABLE, a failed batch, group membership errors in
TxnOffsetCommit and UNKNOWN_PRODUCER_ID are abortable (`TransactionAbortableError`). After an abortable
error whose batch sequence numbers may be out of step with the broker (a numbered batch failed,
UNKNOWN_PRODUCER_ID), `abort_transaction` bumps the epoch with InitProducerId (KIP-360: the current
producer id and epoch), so the next transaction starts its sequences at 0.

A call that times out (KafkaTimeoutError) leaves its work running: calling the same method again
waits for that result, as Java's does. `prepare_transaction` (a KIP-939-style first phase) flushes
the transaction and returns its `PreparedTransaction` (id, producer id, epoch) without ending it;
`end_prepared_transaction` ends such a transaction from any client that has those three, since EndTxn
names the transaction by them alone (how the Spark sink's driver commits its tasks' transactions).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass
from typing import Any, Callable

from odradek.client.cluster import Cluster
from odradek.client.errors import (
    IllegalStateError, InvalidProducerEpochError, KafkaConnectionError, KafkaTimeoutError,
    ProducerFencedError, TransactionAbortableError, TransactionError,
)
from odradek.protocol.error_codes import ErrorCode, for_code
from odradek.protocol.messages import add_offsets_to_txn as ao
from odradek.protocol.messages import add_partitions_to_txn as ap
from odradek.protocol.messages import end_txn as et
from odradek.protocol.messages import find_coordinator as fc
from odradek.protocol.messages import init_producer_id as ipi
from odradek.protocol.messages import txn_offset_commit as toc

log = logging.getLogger("odradek.client.transactions")

FIND_COORDINATOR_KEY = 10
INIT_PRODUCER_ID_KEY = 22
ADD_PARTITIONS_KEY = 24
ADD_OFFSETS_KEY = 25
END_TXN_KEY = 26
TXN_OFFSET_COMMIT_KEY = 28
GROUP_KEY_TYPE = 0
TXN_KEY_TYPE = 1

# What a coordinator's error code asks of the client.
_REFIND = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
_RETRY = frozenset({ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.CONCURRENT_TRANSACTIONS,
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.REQUEST_TIMED_OUT,
                    ErrorCode.OPERATION_NOT_ATTEMPTED, ErrorCode.UNSTABLE_OFFSET_COMMIT})
_FENCED = frozenset({ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH})
_BUMP = frozenset({ErrorCode.UNKNOWN_PRODUCER_ID, ErrorCode.INVALID_PRODUCER_ID_MAPPING})
_ABORTABLE = _BUMP | {ErrorCode.TRANSACTION_ABORTABLE, ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                      ErrorCode.GROUP_AUTHORIZATION_FAILED, ErrorCode.UNKNOWN_MEMBER_ID,
                      ErrorCode.ILLEGAL_GENERATION, ErrorCode.FENCED_INSTANCE_ID,
                      ErrorCode.REBALANCE_IN_PROGRESS}


class TxnState(enum.Enum):
    UNINITIALIZED = "UNINITIALIZED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    PREPARED = "PREPARED"
    COMMITTING = "COMMITTING"
    ABORTING = "ABORTING"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"


S = TxnState
_NEXT: dict[TxnState, frozenset[TxnState]] = {
    S.UNINITIALIZED: frozenset({S.INITIALIZING}),
    S.INITIALIZING: frozenset({S.READY}),
    S.READY: frozenset({S.IN_TRANSACTION, S.INITIALIZING}),
    S.IN_TRANSACTION: frozenset({S.COMMITTING, S.ABORTING, S.ABORTABLE_ERROR, S.PREPARED}),
    S.PREPARED: frozenset({S.COMMITTING, S.ABORTING}),
    S.COMMITTING: frozenset({S.READY, S.ABORTABLE_ERROR}),
    S.ABORTING: frozenset({S.READY, S.INITIALIZING}),
    S.ABORTABLE_ERROR: frozenset({S.ABORTING, S.ABORTABLE_ERROR}),
    S.FATAL_ERROR: frozenset(),
}


@dataclass(frozen=True)
class ConsumerGroupMetadata:
    """What TxnOffsetCommit needs of the consumer whose offsets a transaction commits (KIP-447): the
    group coordinator refuses the commit of a member that is no longer in the generation."""
    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


@dataclass(frozen=True)
class PreparedTransaction:
    """A transaction flushed and left open (`Producer.prepare_transaction`): enough to end it from
    another client (`end_prepared_transaction`) while the coordinator keeps it (transaction.timeout.ms)."""
    transactional_id: str
    producer_id: int
    producer_epoch: int


def classify(code: int, what: str, *, from_coordinator: bool = True) -> TransactionError:
    """The error to raise for a non-retriable code (Java's TransactionManager handlers)."""
    err = for_code(code)
    if err in _FENCED and from_coordinator or err == ErrorCode.PRODUCER_FENCED:
        return ProducerFencedError(f"{what}: {err.name}: the transactional id has a newer producer")
    if err == ErrorCode.INVALID_PRODUCER_EPOCH:
        return InvalidProducerEpochError(f"{what}: {err.message}")
    if err in _ABORTABLE:
        return TransactionAbortableError(f"{what}: {err.name}: {err.message}", err)
    return TransactionError(f"{what}: {err.name}: {err.message}", err, fatal=True)


def _codes_of(response: Any) -> list[int]:
    """Every non-zero error code of a coordinator's response (top level and per partition)."""
    out = []
    code = getattr(response, "error_code", 0)
    if code:
        out.append(code)
    for t in getattr(response, "results_by_topic_v3_and_below", None) or ():
        out += [p.partition_error_code for p in t.results_by_partition if p.partition_error_code]
    for r in getattr(response, "results_by_transaction", None) or ():
        for t in r.topic_results:
            out += [p.partition_error_code for p in t.results_by_partition if p.partition_error_code]
    if isinstance(response, toc.TxnOffsetCommitResponse):
        out += [p.error_code for t in response.topics for p in t.partitions if p.error_code]
    return out


class Coordinators:
    """Finds coordinators (FindCoordinator) and sends them requests with Kafka's retries."""

    def __init__(self, cluster: Cluster, config: dict) -> None:
        self.cluster = cluster
        self.backoff_ms = config["retry.backoff.ms"]
        self._nodes: dict[tuple[int, str], int] = {}

    async def find(self, key_type: int, key: str) -> int:
        node = self._nodes.get((key_type, key))
        if node is not None and node in self.cluster.metadata.brokers:
            return node
        r = await self.cluster.request_any(FIND_COORDINATOR_KEY, fc.FindCoordinatorRequest(
            key=key, key_type=key_type, coordinator_keys=[key]))
        c = r.coordinators[0] if getattr(r, "coordinators", None) else r
        if c.error_code:
            if c.error_code in _REFIND or c.error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                raise KafkaConnectionError(f"FindCoordinator({key!r}): {for_code(c.error_code).name}")
            raise classify(c.error_code, f"FindCoordinator({key!r})")
        if c.node_id not in self.cluster.metadata.brokers:
            self.cluster.metadata.brokers[c.node_id] = (c.host, c.port, None)
        self._nodes[(key_type, key)] = c.node_id
        return c.node_id

    def forget(self, key_type: int, key: str) -> None:
        self._nodes.pop((key_type, key), None)

    async def call(self, what: str, key_type: int, key: str, api_key: int, body,
                   codes_of: Callable[[Any], list[int]] = _codes_of, *, from_coordinator: bool = True):
        """Send `body` to the coordinator of `key` until it answers without a retriable error; the
        first other error is raised, classified. The caller bounds the time (asyncio.timeout)."""
        while True:
            try:
                node = await self.find(key_type, key)
                response = await self.cluster.request(node, api_key, body)
            except KafkaConnectionError as e:
                log.debug("%s: %s; looking the coordinator up again", what, e)
                self.forget(key_type, key)
                self.cluster.request_update()
                await asyncio.sleep(self.backoff_ms / 1000)
                continue
            codes = codes_of(response)
            if not codes:
                return response
            final = [c for c in codes if c not in _REFIND and c not in _RETRY]
            if final:
                raise classify(final[0], what, from_coordinator=from_coordinator)
            if any(c in _REFIND for c in codes):
                self.forget(key_type, key)
            if ErrorCode.UNKNOWN_TOPIC_OR_PARTITION in codes:
                self.cluster.request_update()
            await asyncio.sleep((20 if codes == [ErrorCode.CONCURRENT_TRANSACTIONS] else self.backoff_ms) / 1000)


class TransactionManager:
    """One transactional producer's transaction state; the producer calls it from its public methods
    and from its sender task."""

    def __init__(self, cluster: Cluster, config: dict) -> None:
        self.transactional_id: str = config["transactional.id"]
        self.timeout_ms: int = config["transaction.timeout.ms"]
        self.coordinators = Coordinators(cluster, config)
        self.state = TxnState.UNINITIALIZED
        self.producer_id = -1
        self.producer_epoch = -1
        self.added: set[tuple[str, int]] = set()     # partitions in the transaction (AddPartitionsToTxn answered)
        self.pending: set[tuple[str, int]] = set()   # partitions written to, not added yet
        self.started = False                         # the coordinator knows of this transaction
        self.bump_needed = False                     # sequences may be out of step: new epoch after abort
        self.last_error: BaseException | None = None
        self.epoch_changed: Callable[[], None] = lambda: None   # the producer resets its sequences
        self._op: tuple[str, asyncio.Task] | None = None
        self._adding = asyncio.Lock()

    # ------------------------------------------------------------------------------------ states
    def transition(self, target: TxnState, error: BaseException | None = None) -> None:
        if self.state is TxnState.FATAL_ERROR:
            raise self._fatal_error()
        if target is TxnState.FATAL_ERROR:
            log.error("transactional id %s: fatal error: %s", self.transactional_id, error)
        elif target not in _NEXT[self.state]:
            raise IllegalStateError(f"transactional id {self.transactional_id}: invalid transition "
                                    f"{self.state.value} -> {target.value}")
        if error is not None:
            self.last_error = error
        self.state = target

    def fail(self, error: BaseException) -> None:
        """Move to the error state `error` calls for (fatal or abortable)."""
        if self.state is TxnState.FATAL_ERROR:
            return
        if isinstance(error, TransactionError) and error.fatal:
            self.transition(TxnState.FATAL_ERROR, error)
            return
        if isinstance(error, TransactionError) and error.code in _BUMP:
            self.bump_needed = True
        if self.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING, TxnState.ABORTABLE_ERROR,
                          TxnState.PREPARED):
            self.state = TxnState.ABORTABLE_ERROR
            self.last_error = error

    def _fatal_error(self) -> BaseException:
        e = self.last_error
        return e if e is not None else TransactionError("the transactional producer failed", fatal=True)

    def error_for_state(self, doing: str) -> BaseException:
        if self.state is TxnState.FATAL_ERROR:
            return self._fatal_error()
        if self.state is TxnState.ABORTABLE_ERROR:
            cause = self.last_error
            if isinstance(cause, TransactionAbortableError | InvalidProducerEpochError):
                return cause
            e = TransactionAbortableError(f"cannot {doing}: the transaction must be aborted: {cause}",
                                          getattr(cause, "code", None))
            e.__cause__ = cause
            return e
        return IllegalStateError(f"cannot {doing} in state {self.state.value} "
                                 f"(transactional id {self.transactional_id})")

    def check_send(self, topic: str, partition: int) -> None:
        """A record for (topic, partition) is about to be appended: it joins the transaction."""
        if self.state is not TxnState.IN_TRANSACTION:
            if self.state is TxnState.READY:
                raise IllegalStateError("cannot send outside a transaction: call begin_transaction() first")
            raise self.error_for_state("send")
        tp = (topic, partition)
        if tp not in self.added:
            self.pending.add(tp)

    @property
    def sending_allowed(self) -> bool:
        return self.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING, TxnState.PREPARED)

    def reset_transaction(self) -> None:
        self.added.clear()
        self.pending.clear()
        self.started = False

    # ------------------------------------------------------------------------------------ one op at a time
    async def run(self, kind: str, make, timeout: float | None):
        """Run the operation `make()` (a coroutine) as a task; a call that times out leaves it running and
        the next call of the same kind waits for it. A different operation meanwhile is refused."""
        if self._op is not None and self._op[1].done():
            self._op = None
        if self._op is None:
            task = asyncio.get_running_loop().create_task(make(), name=f"odradek-txn-{kind}")
            self._op = (kind, task)
        elif self._op[0] != kind:
            raise IllegalStateError(f"{self._op[0]} is still in progress; call it again to wait for it")
        task = self._op[1]
        try:
            async with asyncio.timeout(timeout):
                result = await asyncio.shield(task)
        except TimeoutError:
            raise KafkaTimeoutError(f"{kind} did not finish within {timeout} s; call it again to wait "
                                    f"for it") from None
        finally:
            if task.done():
                self._op = None
                if not task.cancelled():
                    task.exception()
        return result

    async def cancel(self) -> None:
        """Stop an operation still running (the producer is closing)."""
        if self._op is not None and not self._op[1].done():
            self._op[1].cancel()
            try:
                await self._op[1]
            except BaseException:   # cancelled, or its own error: the producer is closing anyway
                pass
        self._op = None

    # ------------------------------------------------------------------------------------ requests
    async def init_producer_id(self, *, bump: bool = False) -> None:
        """InitProducerId for the transactional id; with `bump` (KIP-360) the current producer id and
        epoch are named, so the coordinator bumps the epoch instead of fencing us."""
        body = ipi.InitProducerIdRequest(
            transactional_id=self.transactional_id, transaction_timeout_ms=self.timeout_ms,
            producer_id=self.producer_id if bump else -1, producer_epoch=self.producer_epoch if bump else -1)
        r = await self.coordinators.call("InitProducerId", TXN_KEY_TYPE, self.transactional_id,
                                         INIT_PRODUCER_ID_KEY, body)
        self.producer_id, self.producer_epoch = r.producer_id, r.producer_epoch
        self.bump_needed = False
        self.epoch_changed()
        log.info("transactional id %s: producer id %d epoch %d", self.transactional_id, self.producer_id,
                 self.producer_epoch)

    async def add_pending_partitions(self) -> None:
        """AddPartitionsToTxn for the partitions written to since the last call (the sender's step, and
        the commit's for partitions whose records all failed before they were queued); one at a time."""
        async with self._adding:
            await self._add_pending_partitions()

    async def _add_pending_partitions(self) -> None:
        tps = sorted(self.pending - self.added)
        if not tps:
            self.pending.clear()
            return
        by_topic: dict[str, list[int]] = {}
        for t, p in tps:
            by_topic.setdefault(t, []).append(p)
        topics = [ap.AddPartitionsToTxnTopic(name=t, partitions=ps) for t, ps in by_topic.items()]
        body = ap.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=self.transactional_id, v3_and_below_producer_id=self.producer_id,
            v3_and_below_producer_epoch=self.producer_epoch, v3_and_below_topics=topics, transactions=[])
        await self.coordinators.call("AddPartitionsToTxn", TXN_KEY_TYPE, self.transactional_id,
                                     ADD_PARTITIONS_KEY, body)
        self.added.update(tps)
        self.pending.difference_update(tps)
        self.started = True

    async def send_offsets(self, offsets: dict, group: ConsumerGroupMetadata) -> None:
        """AddOffsetsToTxn to the transaction coordinator, then TxnOffsetCommit to the group's."""
        await self.coordinators.call("AddOffsetsToTxn", TXN_KEY_TYPE, self.transactional_id, ADD_OFFSETS_KEY,
                                     ao.AddOffsetsToTxnRequest(
                                         transactional_id=self.transactional_id, producer_id=self.producer_id,
                                         producer_epoch=self.producer_epoch, group_id=group.group_id))
        self.started = True
        by_topic: dict[str, list] = {}
        for (topic, partition), (offset, metadata, leader_epoch) in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append(toc.TxnOffsetCommitRequestPartition(
                partition_index=partition, committed_offset=offset, committed_leader_epoch=leader_epoch,
                committed_metadata=metadata))
        body = toc.TxnOffsetCommitRequest(
            transactional_id=self.transactional_id, group_id=group.group_id, producer_id=self.producer_id,
            producer_epoch=self.producer_epoch, generation_id=group.generation_id, member_id=group.member_id,
            group_instance_id=group.group_instance_id,
            topics=[toc.TxnOffsetCommitRequestTopic(name=t, partitions=ps) for t, ps in by_topic.items()])
        await self.coordinators.call("TxnOffsetCommit", GROUP_KEY_TYPE, group.group_id, TXN_OFFSET_COMMIT_KEY, body)

    async def end_txn(self, commit: bool) -> None:
        r = await self.coordinators.call("EndTxn", TXN_KEY_TYPE, self.transactional_id, END_TXN_KEY,
                                         et.EndTxnRequest(transactional_id=self.transactional_id,
                                                          producer_id=self.producer_id,
                                                          producer_epoch=self.producer_epoch, committed=commit))
        # EndTxn v5 (KIP-890 part 2) may hand back a bumped epoch for the next transaction.
        pid, epoch = getattr(r, "producer_id", -1), getattr(r, "producer_epoch", -1)
        if pid >= 0 and epoch >= 0 and (pid, epoch) != (self.producer_id, self.producer_epoch):
            self.producer_id, self.producer_epoch = pid, epoch
            self.epoch_changed()


async def end_prepared_transaction(cluster: Cluster, config: dict, prepared: PreparedTransaction,
                                   commit: bool) -> None:
    """End a transaction another producer prepared (EndTxn with its id, producer id and epoch), as a
    KIP-939 coordinator would. Ending it again the same way succeeds (the coordinator answers a retried
    EndTxn of a completed transaction with no error); ProducerFencedError means the coordinator no
    longer has it at that epoch: a newer producer of the id fenced it or its timeout aborted it."""
    coordinators = Coordinators(cluster, config)
    await coordinators.call("EndTxn", TXN_KEY_TYPE, prepared.transactional_id, END_TXN_KEY, et.EndTxnRequest(
        transactional_id=prepared.transactional_id, producer_id=prepared.producer_id,
        producer_epoch=prepared.producer_epoch, committed=commit))


def offsets_arg(offsets: dict) -> dict[tuple[str, int], tuple[int, str | None, int]]:
    """send_offsets_to_transaction's offsets: {tp: offset | (offset, metadata) | OffsetAndMetadata}."""
    out = {}
    for tp, v in offsets.items():
        topic, partition = tp
        if isinstance(v, int):
            out[(topic, partition)] = (v, None, -1)
        elif isinstance(v, tuple):
            out[(topic, partition)] = (int(v[0]), v[1] if len(v) > 1 else None, -1)
        else:
            out[(topic, partition)] = (int(v.offset), getattr(v, "metadata", None),
                                       getattr(v, "leader_epoch", None) if getattr(v, "leader_epoch", None)
                                       is not None else -1)
    return out


__all__ = ["ConsumerGroupMetadata", "PreparedTransaction", "TransactionManager", "TxnState",
           "end_prepared_transaction"]
