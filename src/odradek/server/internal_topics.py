"""The internal topics' shapes and their creation on first need (Kafka's AutoTopicCreationManager and
the group and transaction coordinators' topic configs).

`__consumer_offsets` and `__transaction_state` are created when a client first needs them (a
FindCoordinator, or a Metadata request naming them): with the configured partitions, a replication
factor of the configured one capped at the live brokers (the cluster's controller asks for the full
configured factor, as Kafka does), compaction, and for transactions `min.insync.replicas` from
`transaction.state.log.min.isr` (never above the replication factor) and no unclean election.
"""

from __future__ import annotations

import logging

from odradek.cluster.topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, TopicInfo
from odradek.server.config import BrokerConfig
from odradek.server.controller_channel import ControllerChannel
from odradek.server.metadata_cache import MetadataCache

log = logging.getLogger("odradek.coordinator")


def creation_spec(name: str, config: BrokerConfig, live_brokers: int | None = None) -> tuple[int, int, dict[str, str]]:
    """(partitions, replication factor, configs) of a topic created on first need; -1 means the
    broker's default (any topic but the internal ones). `live_brokers` caps the replication factor."""
    if name == OFFSETS_TOPIC:
        factor = _capped(config.get("offsets.topic.replication.factor"), live_brokers)
        return (config.get("offsets.topic.num.partitions"), factor,
                {"cleanup.policy": "compact", "compression.type": "producer",
                 "segment.bytes": str(config.get("offsets.topic.segment.bytes"))})
    if name == TRANSACTION_STATE_TOPIC:
        factor = _capped(config.get("transaction.state.log.replication.factor"), live_brokers)
        min_isr = min(config.get("transaction.state.log.min.isr"), max(factor, 1))
        return (config.get("transaction.state.log.num.partitions"), factor,
                {"unclean.leader.election.enable": "false", "compression.type": "uncompressed",
                 "cleanup.policy": "compact", "min.insync.replicas": str(min_isr),
                 "segment.bytes": str(config.get("transaction.state.log.segment.bytes"))})
    return -1, -1, {}


def _capped(factor: int, live_brokers: int | None) -> int:
    return factor if live_brokers is None else min(factor, live_brokers)


def ensure_internal_topic(name: str, metadata: MetadataCache, controller: ControllerChannel) -> TopicInfo | None:
    """The internal topic `name`, created on first need; None if it cannot be created (yet)."""
    info = metadata.topic(name)
    if info is not None:
        return info
    partitions, factor, configs = creation_spec(name, metadata.config, len(metadata.image.live_broker_ids()))
    info, error, message = controller.create_topic(name, partitions, factor, configs)
    if info is None:
        info = metadata.topic(name)
        if info is None:
            log.error("cannot create %s: %s %s", name, error.name, message or "")
    return info
