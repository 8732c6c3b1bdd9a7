"""The controller channel: how the broker asks for the changes only the controller makes (DESIGN,
"Metadata and the cluster").

Each change is recorded in the metadata store, then published in the metadata image that handlers
read. In embedded mode the broker is its own controller and serves this channel itself; in a cluster
it forwards to the controller (Kafka's ForwardingManager). Handlers and the coordinators depend on
this port only, with an in-memory fake in tests.
"""

from __future__ import annotations

from typing import Protocol

from odradek.cluster.topics import TopicInfo
from odradek.protocol.error_codes import ErrorCode


class ControllerChannel(Protocol):
    """Changes only the controller makes: each is recorded in the metadata store, then published in
    the metadata image. In embedded mode the broker is its own controller and serves this itself."""

    def create_topic(self, name: str, num_partitions: int, replication_factor: int,
                     configs: dict[str, str]) -> tuple[TopicInfo | None, ErrorCode, str | None]: ...

    def set_topic_configs(self, name: str, configs: dict[str, str]) -> None: ...

    def set_dynamic_broker_configs(self, *, per_broker: dict[str, str] | None = None,
                                   default: dict[str, str] | None = None) -> None: ...
