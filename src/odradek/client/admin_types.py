"""What `Admin` takes and returns: plain data, Kafka's names (the Java AdminClient's, in snake case).

`AdminError` is the error of one resource (a topic, a config resource, a group, a partition): the
broker's `ErrorCode` (name, message, retriable) in `code`, the broker's own message in `detail`, the
resource in `resource`. A call about several resources raises the first failure in request order and
keeps every outcome in `results` (the value for a success, the `AdminError` for a failure), so a caller
can tell which of them went through.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from odradek.client.errors import BrokerResponseError
from odradek.client.fetcher import TopicPartition
from odradek.protocol.error_codes import ErrorCode, for_code


class AdminError(BrokerResponseError):
    """A broker refused an admin request for one resource."""

    def __init__(self, code: ErrorCode | int, detail: str | None = None, resource: Any = None,
                 results: dict | None = None) -> None:
        err = for_code(int(code))
        where = f"{resource}: " if resource is not None else ""
        super().__init__(err, f"{where}{detail or err.message}")
        self.detail = detail
        self.resource = resource
        self.results = results if results is not None else {}

    @property
    def name(self) -> str:
        return self.code.name


class Retry(Exception):
    """Internal: an answer that says "ask again later" (after a metadata refresh when `refresh`)."""

    def __init__(self, reason: str, refresh: bool = True) -> None:
        super().__init__(reason)
        self.refresh = refresh


def raise_first(results: dict) -> dict:
    """`results` if nothing failed, else the first AdminError (in order), carrying all results."""
    for value in results.values():
        if isinstance(value, AdminError):
            value.results = results
            raise value
    return results


# ------------------------------------------------------------------------------------------ topics
@dataclass
class NewTopic:
    """A topic to create; -1 partitions or replication factor take the broker's defaults (KIP-464)."""
    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: dict[str, str] = field(default_factory=dict)
    replica_assignment: dict[int, list[int]] | None = None   # partition -> broker ids


@dataclass
class CreatedTopic:
    name: str
    topic_id: Any = None
    num_partitions: int = -1
    replication_factor: int = -1
    configs: dict[str, str | None] = field(default_factory=dict)


@dataclass
class TopicListing:
    name: str
    topic_id: Any
    is_internal: bool
    partitions: int


@dataclass
class PartitionDescription:
    partition: int
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    offline_replicas: list[int] = field(default_factory=list)


@dataclass
class TopicDescription:
    name: str
    topic_id: Any
    is_internal: bool
    partitions: list[PartitionDescription]


# ------------------------------------------------------------------------------------------ configs
class ResourceType(enum.IntEnum):
    """ConfigResource.Type codes."""
    UNKNOWN = 0
    TOPIC = 2
    BROKER = 4
    BROKER_LOGGER = 8
    CLIENT_METRICS = 16
    GROUP = 32


class ConfigSource(enum.IntEnum):
    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    DYNAMIC_BROKER_LOGGER_CONFIG = 6
    CLIENT_METRICS_CONFIG = 7
    GROUP_CONFIG = 8


class ConfigType(enum.IntEnum):
    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


class AlterConfigOpType(enum.IntEnum):
    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


class ConfigResource(NamedTuple):
    """A topic (`ConfigResource.topic("t")`) or a broker (`ConfigResource.broker(0)`; "" is the
    cluster-wide default layer)."""
    type: ResourceType
    name: str

    @classmethod
    def topic(cls, name: str) -> "ConfigResource":
        return cls(ResourceType.TOPIC, name)

    @classmethod
    def broker(cls, broker_id: int | str = "") -> "ConfigResource":
        return cls(ResourceType.BROKER, str(broker_id))

    def __str__(self) -> str:
        kind = self.type.name.lower() if isinstance(self.type, ResourceType) else str(self.type)
        return f"{kind} {self.name!r}"


@dataclass
class ConfigSynonym:
    name: str
    value: str | None
    source: ConfigSource


@dataclass
class ConfigEntry:
    name: str
    value: str | None
    source: ConfigSource = ConfigSource.UNKNOWN
    is_read_only: bool = False
    is_sensitive: bool = False
    is_default: bool = False
    synonyms: list[ConfigSynonym] = field(default_factory=list)
    type: ConfigType = ConfigType.UNKNOWN
    documentation: str | None = None


@dataclass
class AlterConfigOp:
    name: str
    value: str | None = None
    op: AlterConfigOpType = AlterConfigOpType.SET


# ------------------------------------------------------------------------------------------ cluster, logs
@dataclass
class Node:
    id: int
    host: str
    port: int
    rack: str | None = None


@dataclass
class ClusterDescription:
    cluster_id: str | None
    controller_id: int
    brokers: list[Node]


@dataclass
class ReplicaInfo:
    size: int
    offset_lag: int
    is_future: bool


@dataclass
class LogDirDescription:
    path: str
    error: ErrorCode
    replicas: dict[TopicPartition, ReplicaInfo]
    total_bytes: int = -1
    usable_bytes: int = -1


# ------------------------------------------------------------------------------------------ groups
@dataclass
class GroupListing:
    group_id: str
    protocol_type: str
    state: str | None = None      # ListGroups v4+
    type: str | None = None       # ListGroups v5+


@dataclass
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    assignment: list[TopicPartition]


@dataclass
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: list[MemberDescription]
    coordinator: int

    @property
    def is_empty(self) -> bool:
        return not self.members


@dataclass
class ConsumerGroupMember:
    """A member of a consumer-protocol group (KIP-848), from ConsumerGroupDescribe."""
    member_id: str
    group_instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: list[str]
    subscribed_topic_regex: str | None
    assignment: list[TopicPartition]
    target_assignment: list[TopicPartition]


@dataclass
class ConsumerGroupDescription:
    """A consumer-protocol group (KIP-848): epochs, the assignor of the current target, members."""
    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: list[ConsumerGroupMember]
    coordinator: int


class OffsetAndMetadata(NamedTuple):
    offset: int
    metadata: str = ""
    leader_epoch: int = -1
