"""Writing transaction markers on a partition leader (seed 003, "Message Delivery Semantics" and
"WriteTxnMarkers API"; KIP-98; Kafka's ReplicaManager.appendRecords with AppendOrigin.COORDINATOR
for WriteTxnMarkers, and TransactionMarkerChannelManager).

`append_markers` is the leader's side, shared by the WriteTxnMarkers handler (another broker's
transaction coordinator asks) and `LocalMarkerWriter` (this broker's own coordinator, for partitions
it leads). Each marker is one control batch (COMMIT or ABORT with the coordinator epoch) at the
producer's epoch, appended as leader with acks=all; the producer state refuses a marker from an older
producer epoch (INVALID_PRODUCER_EPOCH) or coordinator epoch (TRANSACTION_COORDINATOR_FENCED). A
marker on `__consumer_offsets` also commits or drops the producer's pending offsets in the group
coordinator, as Kafka's onTransactionCompleted does.

`LocalMarkerWriter` is the transaction coordinator's `MarkerWriter` port: it appends to partitions led
here, and answers NOT_LEADER_OR_FOLLOWER for the others (the coordinator retries them). Sending
WriteTxnMarkers requests to the leaders on other brokers goes behind the same port.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from odradek.coordinator.records import OFFSETS_TOPIC
from odradek.coordinator.runtime import GroupCoordinator
from odradek.coordinator.transactions import MarkerJob
from odradek.protocol.error_codes import ErrorCode, KafkaApiError
from odradek.records.control import ABORT, COMMIT, EndTransactionMarker, build_end_txn_marker_batch
from odradek.server.partition import Partition
from odradek.server.replica_manager import ReplicaManager
from odradek.storage.errors import StorageError
from odradek.storage.producer_state import ProducerStateError

log = logging.getLogger("odradek.transactions")

MARKER_ACKS_TIMEOUT_MS = 30_000
TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Marker:
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: Sequence[TopicPartition]


async def append_markers(replica_manager: ReplicaManager, group: GroupCoordinator | None, markers: list[Marker],
                         now_ms: int) -> list[dict[TopicPartition, ErrorCode]]:
    """Append each marker to each of its partitions led here; the errors of each, by marker, once
    the appends are committed (or failed)."""
    results: list[dict[TopicPartition, ErrorCode]] = []
    waiting: list[tuple[int, TopicPartition, Partition, int]] = []
    for i, mk in enumerate(markers):
        errors: dict[TopicPartition, ErrorCode] = {}
        marker = EndTransactionMarker(COMMIT if mk.commit else ABORT, mk.coordinator_epoch)
        for tp in mk.partitions:
            try:
                part = replica_manager.leader_partition(tp[0], tp[1])
                batch = bytearray(build_end_txn_marker_batch(marker, producer_id=mk.producer_id,
                                                             producer_epoch=mk.producer_epoch, timestamp=now_ms))
                result = replica_manager.append_to_leader(part, batch, now_ms, log_append_time=False,
                                                          required_acks=-1, coordinator=True)
            except KafkaApiError as e:
                errors[tp] = e.code
                continue
            except ProducerStateError as e:
                log.info("marker for producer %d on %s-%d refused: %s", mk.producer_id, tp[0], tp[1], e)
                errors[tp] = e.error_code
                continue
            except StorageError as e:
                log.error("marker for producer %d on %s-%d failed: %s", mk.producer_id, tp[0], tp[1], e)
                errors[tp] = ErrorCode.KAFKA_STORAGE_ERROR
                continue
            if tp[0] == OFFSETS_TOPIC and group is not None:
                group.complete_transaction(tp[1], mk.producer_id, mk.commit)
            errors[tp] = ErrorCode.NONE
            waiting.append((i, tp, part, result.last_offset + 1))
        results.append(errors)
    if waiting:
        required = [(part, end) for _, _, part, end in waiting]
        codes = replica_manager.acks_done(required)
        if codes is None:
            codes = await replica_manager.wait_for_acks(required, MARKER_ACKS_TIMEOUT_MS)
        for (i, tp, _, _), code in zip(waiting, codes):
            results[i][tp] = code
    return results


class LocalMarkerWriter:
    """The transaction coordinator's marker port on this broker (see the module docstring)."""

    def __init__(self, replica_manager: ReplicaManager, group: Callable[[], GroupCoordinator | None],
                 clock: Callable[[], int]) -> None:
        self.replica_manager = replica_manager
        self.group = group
        self.clock = clock

    async def write_markers(self, job: MarkerJob, partitions: list[TopicPartition],
                            coordinator_epoch: int) -> dict[TopicPartition, ErrorCode]:
        marker = Marker(job.producer_id, job.producer_epoch, job.commit, coordinator_epoch, partitions)
        (errors,) = await append_markers(self.replica_manager, self.group(), [marker], self.clock())
        # A producer state that has moved past this epoch already holds a newer marker: nothing to do.
        return {tp: ErrorCode.NONE if code in (ErrorCode.INVALID_PRODUCER_EPOCH,
                                               ErrorCode.TRANSACTION_COORDINATOR_FENCED) else code
                for tp, code in errors.items()}
