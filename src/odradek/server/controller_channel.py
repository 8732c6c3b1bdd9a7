"""The controller channel: how the broker asks for the changes only the controller makes (DESIGN,
"Metadata and the cluster").

Each change is planned by the cluster controller (`cluster/controller.py`: validation, placement,
reserved names), recorded in the metadata store with one atomic write, applied on the brokers that
host the partitions, and published in the metadata image that handlers read. Changes run one at a
time under `lock`, each as a task of the channel (`call`), so a request going away never cuts one
short. In embedded mode the broker is its own controller and `embedded_controller.EmbeddedController`
serves this channel; handlers and the coordinators depend on this port only.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine, Iterable, Protocol, TypeVar

from odradek.cluster.controller import Controller
from odradek.cluster.topics import TopicInfo
from odradek.protocol.error_codes import ErrorCode

T = TypeVar("T")


class ControllerChannel(Protocol):
    @property
    def controller(self) -> Controller:
        """The cluster controller: plans changes against its own image (ahead of the broker's)."""

    @property
    def lock(self) -> asyncio.Lock: ...

    @property
    def is_active(self) -> bool:
        """True if this broker is the controller and makes topic changes itself; otherwise
        CreateTopics, DeleteTopics and CreatePartitions answer NOT_CONTROLLER and the topics a request
        creates on the fly are asked of the controller (`request_creation`)."""

    def request_creation(self, topics: Iterable[tuple[str, int, int, dict[str, str]]]) -> None:
        """Ask the controller to create (name, partitions, replication factor, configs), not waiting."""

    async def call(self, change: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T: ...

    def topic_defaults(self) -> tuple[int, int]:
        """(num.partitions, default.replication.factor): what -1 means in a creation."""

    # Each of these applies what was planned under `lock`; KafkaApiError(KAFKA_STORAGE_ERROR) if the
    # store or a log dir cannot be written (nothing is left behind then).
    async def retry_pending_deletions(self) -> None: ...

    async def create_topics(self, infos: list[TopicInfo]) -> None: ...

    async def add_partitions(self, plans: list[tuple[TopicInfo, TopicInfo]]) -> None: ...

    async def delete_topics(self, infos: list[TopicInfo]) -> None: ...

    def create_topic(self, name: str, num_partitions: int, replication_factor: int,
                     configs: dict[str, str]) -> tuple[TopicInfo | None, ErrorCode, str | None]:
        """A small internal topic at once, without yielding (the offsets topic on FindCoordinator)."""

    async def next_producer_id(self) -> int:
        """A producer id from the block in hand; raises StoreError if no block can be claimed."""

    # Config changes, recorded then applied here; in a cluster every other broker applies them when
    # the change notification reaches it (`cluster/config_changes.py`).
    async def set_topic_configs(self, name: str, configs: dict[str, str]) -> None: ...

    async def set_dynamic_broker_configs(self, *, per_broker: dict[str, str] | None = None,
                                         default: dict[str, str] | None = None) -> None: ...
