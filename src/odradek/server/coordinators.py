"""The broker's side of the coordinators (DESIGN, "How data flows: Groups and transactions" and
"Metadata and the cluster"; Kafka's GroupCoordinatorService, CoordinatorPartitionWriter and
CoordinatorLoader).

- `PartitionWriter`: the coordinator runtime's log port over one `__consumer_offsets` partition. An
  append is validated as a produce is and appended through the replica manager as leader with
  acks=all semantics (min.insync.replicas); it returns the offset after the batch, and the runtime
  completes the write when the high watermark reaches it (the replica manager tells it, through a
  high-watermark listener registered here). Reads stop at the high watermark.
- `Coordinators`: creates `__consumer_offsets` on first need (offsets.topic.num.partitions partitions,
  cleanup.policy=compact, offsets.topic.segment.bytes, offsets.topic.replication.factor capped at the
  live brokers) through the controller; loads a partition's groups when this broker becomes its leader
  and unloads them when it stops leading (a leadership listener on the replica manager); answers
  which broker coordinates a group.
- The transaction coordinator the same way on `__transaction_state` (transaction.state.log.*
  settings; `server/txn_coordinator.py`), with its markers written through `txn_markers.py`.
"""

from __future__ import annotations

import logging
from typing import Callable

from odradek.cluster.topics import TopicInfo
from odradek.coordinator.records import OFFSETS_TOPIC, partition_for
from odradek.coordinator.runtime import CoordinatorError, GroupCoordinator
from odradek.coordinator.shard import GroupConfig
from odradek.protocol.error_codes import ErrorCode
from odradek.server.config import BrokerConfig
from odradek.server.log_validator import LOG_APPEND_TIME, topic_rules, validate
from odradek.server.metadata_cache import MetadataCache, MetadataImage
from odradek.server.network import Parked
from odradek.server.partition import Partition
from odradek.server.controller_channel import ControllerChannel
from odradek.server.coordinator_leadership import LeadershipFollower
from odradek.server.internal_topics import ensure_internal_topic
from odradek.server.inter_broker import BrokerChannels
from odradek.server.replica_manager import ReplicaManager
from odradek.storage.producer_state import ProducerStateError
from odradek.server.txn_coordinator import TxnCoordinators

log = logging.getLogger("odradek.groups")

class PartitionWriter:
    """`CoordinatorLog` over a partition this broker leads."""

    def __init__(self, replica_manager: ReplicaManager, metadata: MetadataCache, partition: Partition) -> None:
        self.replica_manager = replica_manager
        self.metadata = metadata
        self.partition = partition

    @property
    def log_start_offset(self) -> int:
        return self.partition.log_start_offset

    @property
    def high_watermark(self) -> int:
        return self.partition.high_watermark

    @property
    def log_end_offset(self) -> int:
        return self.partition.log_end_offset

    def append(self, batch: bytes, now_ms: int) -> int:
        rules = topic_rules(self.metadata.topic_config(self.partition.topic))
        validated = validate(bytearray(batch), rules, now_ms)
        try:
            result = self.replica_manager.append_to_leader(
                self.partition, validated.buffer, now_ms, log_append_time=rules.timestamp_type == LOG_APPEND_TIME,
                required_acks=-1, coordinator=True)
        except ProducerStateError as e:
            # A fenced producer's transactional offset commit: refused, nothing appended.
            raise CoordinatorError(e.error_code) from e
        return result.last_offset + 1

    def read(self, start_offset: int, max_bytes: int) -> bytes:
        slices = self.partition.log.read(start_offset, max_bytes, self.partition.log_end_offset)
        return b"".join(s.read() for s in slices)


def group_config(config: BrokerConfig) -> GroupConfig:
    return GroupConfig(
        min_session_timeout_ms=config.get("group.min.session.timeout.ms"),
        max_session_timeout_ms=config.get("group.max.session.timeout.ms"),
        initial_rebalance_delay_ms=config.get("group.initial.rebalance.delay.ms"),
        max_size=config.get("group.max.size"),
        offset_metadata_max_bytes=config.get("offset.metadata.max.bytes"),
        offsets_retention_ms=config.get("offsets.retention.minutes") * 60_000,
        offsets_retention_check_interval_ms=config.get("offsets.retention.check.interval.ms"),
        load_buffer_bytes=config.get("offsets.load.buffer.size"),
        consumer_session_timeout_ms=config.get("group.consumer.session.timeout.ms"),
        consumer_heartbeat_interval_ms=config.get("group.consumer.heartbeat.interval.ms"),
        consumer_max_size=config.get("group.consumer.max.size"),
        consumer_assignors=tuple(config.get("group.consumer.assignors")),
        consumer_migration_policy=config.get("group.consumer.migration.policy"),
        consumer_regex_refresh_interval_ms=config.get("group.consumer.regex.refresh.interval.ms"),
        consumer_client_assignors_enable=config.get("group.consumer.client.assignors.enable"))


class Coordinators:
    def __init__(self, broker_id: int, replica_manager: ReplicaManager, metadata: MetadataCache,
                 controller: ControllerChannel, clock: Callable[[], int],
                 channels: BrokerChannels | None = None) -> None:
        self.broker_id = broker_id
        self.replica_manager = replica_manager
        self.metadata = metadata
        self.controller = controller
        self.clock = clock
        self.group: GroupCoordinator | None = None
        self.transactions = TxnCoordinators(broker_id, replica_manager, metadata, controller, clock,
                                            lambda: self.group,
                                            lambda part: PartitionWriter(replica_manager, metadata, part),
                                            channels)

    async def start(self) -> None:
        """Start the group coordinator and load the offsets partitions this broker leads."""
        group = GroupCoordinator(group_config(self.metadata.config), self.clock)
        group.parked = Parked      # a request waiting for the group (JoinGroup, SyncGroup) or its write
        await group.start()
        self.group = group
        LeadershipFollower(OFFSETS_TOPIC, self.replica_manager, self.metadata, lambda: self.group,
                           lambda part: PartitionWriter(self.replica_manager, self.metadata, part)).attach()
        self.metadata.add_listener(self._image_changed)
        await self.transactions.start()

    async def aclose(self) -> None:
        await self.transactions.aclose()
        if self.group is not None:
            await self.group.aclose()
            self.group = None

    def group_coordinator(self) -> GroupCoordinator:
        if self.group is None:
            raise CoordinatorError(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return self.group

    # ------------------------------------------------------------------------------ leadership
    def _image_changed(self, old: MetadataImage, new: MetadataImage) -> None:
        """Topics went away: their committed offsets go from every group coordinated here."""
        if len(new.topics) < len(old.topics):
            self.topics_deleted(set(old.topics) - set(new.topics))

    # ------------------------------------------------------------------------------ finding
    def ensure_offsets_topic(self) -> TopicInfo | None:
        """The offsets topic, created on first need; None if it cannot be created."""
        return ensure_internal_topic(OFFSETS_TOPIC, self.metadata, self.controller)

    def group_coordinator_id(self, group_id: str) -> int | None:
        """The broker leading the group's offsets partition (creating the topic first); None if none."""
        info = self.ensure_offsets_topic()
        if info is None:
            return None
        return info.partitions[partition_for(group_id, len(info.partitions))].leader

    def topics_deleted(self, names: set[str]) -> None:
        """Committed offsets of deleted topics go from every group coordinated here."""
        names = names - {OFFSETS_TOPIC}
        if self.group is not None and names:
            self.group.remove_topics(names)
