"""The broker's side of the transaction coordinator (DESIGN, "How data flows: Groups and
transactions"; Kafka's TransactionStateManager topic handling and TransactionCoordinator start-up).

- creates `__transaction_state` on first need (FindCoordinator with key type 1):
  transaction.state.log.num.partitions partitions (50), cleanup.policy=compact,
  transaction.state.log.segment.bytes, min.insync.replicas transaction.state.log.min.isr, and
  transaction.state.log.replication.factor capped at the live brokers (one broker in embedded mode
  gets 1, as for the offsets topic);
- loads a partition's transactional ids when this broker becomes its leader (coordinator epoch: the
  partition's leader epoch) and unloads them when it stops leading; completes the runtime's writes
  as the partition's high watermark moves;
- answers which broker coordinates a transactional id;
- writes markers through `LocalMarkerWriter` on one broker, through `ClusterMarkerWriter`
  (`txn_marker_channel.py`: WriteTxnMarkers to each partition's leader) in a cluster;
- holds the `TxnVerifier` partition leaders use to check (or, protocol v2, add) a transaction's
  partitions with its coordinator before the first write (KIP-890, `txn_verification.py`).
"""

from __future__ import annotations

import logging
from typing import Callable

from odradek.cluster.topics import TopicInfo
from odradek.coordinator.runtime import CoordinatorError, CoordinatorLog, GroupCoordinator
from odradek.coordinator.transactions import TxnConfig
from odradek.coordinator.transactions_records import TRANSACTION_STATE_TOPIC, partition_for
from odradek.coordinator.transactions_runtime import MarkerWriter, TransactionCoordinator
from odradek.protocol.error_codes import ErrorCode
from odradek.server.config import BrokerConfig
from odradek.server.controller_channel import ControllerChannel
from odradek.server.coordinator_leadership import LeadershipFollower
from odradek.server.metadata_cache import MetadataCache
from odradek.server.network import Parked
from odradek.server.partition import Partition
from odradek.server.replica_manager import ReplicaManager
from odradek.server.internal_topics import ensure_internal_topic
from odradek.server.inter_broker import BrokerChannels
from odradek.server.txn_marker_channel import ClusterMarkerWriter
from odradek.server.txn_markers import LocalMarkerWriter
from odradek.server.txn_verification import TxnVerifier

log = logging.getLogger("odradek.transactions")


def txn_config(config: BrokerConfig) -> TxnConfig:
    return TxnConfig(
        max_timeout_ms=config.get("transaction.max.timeout.ms"),
        abort_timed_out_interval_ms=config.get("transaction.abort.timed.out.transaction.cleanup.interval.ms"),
        id_expiration_ms=config.get("transactional.id.expiration.ms"),
        remove_expired_interval_ms=config.get("transaction.remove.expired.transaction.cleanup.interval.ms"),
        load_buffer_bytes=config.get("transaction.state.log.load.buffer.size"))


class TxnCoordinators:
    def __init__(self, broker_id: int, replica_manager: ReplicaManager, metadata: MetadataCache,
                 controller: ControllerChannel, clock: Callable[[], int],
                 group: Callable[[], GroupCoordinator | None],
                 writer_for: Callable[[Partition], CoordinatorLog],
                 channels: BrokerChannels | None = None) -> None:
        self.broker_id = broker_id
        self.replica_manager = replica_manager
        self.metadata = metadata
        self.controller = controller
        self.clock = clock
        self.group = group
        self.writer_for = writer_for   # the runtime's log port over a partition (as for groups)
        self.channels = channels   # in a cluster: markers for partitions led elsewhere go over these
        self.coordinator: TransactionCoordinator | None = None
        self.cluster_markers: ClusterMarkerWriter | None = None
        self.verifier = TxnVerifier(broker_id, metadata, lambda: self.coordinator, channels)

    async def start(self) -> None:
        local = LocalMarkerWriter(self.replica_manager, self.group, self.clock)
        markers: MarkerWriter = local
        if self.channels is not None:
            markers = self.cluster_markers = ClusterMarkerWriter(self.broker_id, self.metadata, self.channels,
                                                                 local)
        coordinator = TransactionCoordinator(txn_config(self.metadata.config), self.clock, markers)
        coordinator.parked = Parked     # a request waiting for its write or its transaction's markers
        await coordinator.start()
        self.coordinator = coordinator
        LeadershipFollower(TRANSACTION_STATE_TOPIC, self.replica_manager, self.metadata, lambda: self.coordinator,
                           self.writer_for).attach()

    async def aclose(self) -> None:
        if self.coordinator is not None:
            await self.coordinator.aclose()
            self.coordinator = None
        if self.cluster_markers is not None:
            await self.cluster_markers.aclose()
            self.cluster_markers = None

    def txn_coordinator(self) -> TransactionCoordinator:
        if self.coordinator is None:
            raise CoordinatorError(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return self.coordinator

    # ------------------------------------------------------------------------------ finding
    def ensure_topic(self) -> TopicInfo | None:
        """__transaction_state, created on first need; None if it cannot be created."""
        return ensure_internal_topic(TRANSACTION_STATE_TOPIC, self.metadata, self.controller)

    def coordinator_id(self, transactional_id: str) -> int | None:
        """The broker leading the id's __transaction_state partition (creating the topic first)."""
        info = self.ensure_topic()
        if info is None:
            return None
        return info.partitions[partition_for(transactional_id, len(info.partitions))].leader
