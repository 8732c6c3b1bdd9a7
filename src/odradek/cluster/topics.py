"""Topics and partition states as the cluster sees them, read and written through the store.

Partition assignment follows Kafka's rule for a new topic without explicit assignments: replicas
placed round-robin over the live brokers from a start index, the first replica the preferred leader.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field

from odradek.cluster.store import MetadataStore, NoNodeError

LEGAL_TOPIC_CHARS = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME_LENGTH = 249
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


@dataclass
class PartitionState:
    leader: int
    leader_epoch: int
    isr: list[int]
    replicas: list[int]


@dataclass
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: dict[int, PartitionState] = field(default_factory=dict)
    configs: dict[str, str] = field(default_factory=dict)

    @property
    def is_internal(self) -> bool:
        return self.name in INTERNAL_TOPICS


def validate_topic_name(name: str) -> str | None:
    """None if valid, else the reason (Kafka's InvalidTopicException messages)."""
    if not name:
        return "Topic name is illegal, it can't be empty"
    if name in (".", ".."):
        return "Topic name cannot be \".\" or \"..\""
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters"
    if not LEGAL_TOPIC_CHARS.match(name):
        return (f"Topic name \"{name}\" is illegal, it contains a character other than ASCII "
                "alphanumerics, '.', '_' and '-'")
    return None


def assign_replicas(brokers: list[int], partitions: int, replication_factor: int,
                    start: int = 0, first_partition: int = 0) -> dict[int, list[int]]:
    brokers = sorted(brokers)
    n = len(brokers)
    out = {}
    for p in range(first_partition, first_partition + partitions):
        first = (start + p) % n
        out[p] = [brokers[(first + i) % n] for i in range(replication_factor)]
    return out


class TopicStore:
    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    def names(self) -> list[str]:
        return self.store.children("/brokers/topics")

    def get(self, name: str) -> TopicInfo | None:
        try:
            value, _ = self.store.get(f"/brokers/topics/{name}")
        except NoNodeError:
            return None
        info = TopicInfo(name, uuid.UUID(value["topic_id"]))
        for p, replicas in value["partitions"].items():
            try:
                st, _ = self.store.get(f"/brokers/topics/{name}/partitions/{p}/state")
                info.partitions[int(p)] = PartitionState(st["leader"], st["leader_epoch"], st["isr"], replicas)
            except NoNodeError:
                info.partitions[int(p)] = PartitionState(-1, 0, [], replicas)
        try:
            cfg, _ = self.store.get(f"/config/topics/{name}")
            info.configs = dict(cfg.get("config", {}))
        except NoNodeError:
            pass
        return info

    def create(self, name: str, assignment: dict[int, list[int]], configs: dict[str, str]) -> TopicInfo:
        topic_id = uuid.uuid4()
        self.store.create(f"/config/topics/{name}", {"version": 1, "config": configs})
        self.store.create(f"/brokers/topics/{name}", {
            "version": 3, "topic_id": str(topic_id),
            "partitions": {str(p): r for p, r in assignment.items()},
        })
        for p, replicas in assignment.items():
            self.store.create(f"/brokers/topics/{name}/partitions/{p}/state",
                              {"leader": replicas[0], "leader_epoch": 0, "isr": list(replicas),
                               "controller_epoch": 1})
        return self.get(name)

    def add_partitions(self, name: str, assignment: dict[int, list[int]]) -> TopicInfo:
        value, version = self.store.get(f"/brokers/topics/{name}")
        parts = dict(value["partitions"])
        for p, replicas in assignment.items():
            parts[str(p)] = replicas
            self.store.create(f"/brokers/topics/{name}/partitions/{p}/state",
                              {"leader": replicas[0], "leader_epoch": 0, "isr": list(replicas),
                               "controller_epoch": 1})
        self.store.set(f"/brokers/topics/{name}", {**value, "partitions": parts}, version)
        return self.get(name)

    def set_configs(self, name: str, configs: dict[str, str]) -> None:
        path = f"/config/topics/{name}"
        if self.store.exists(path):
            self.store.set(path, {"version": 1, "config": configs})
        else:
            self.store.create(path, {"version": 1, "config": configs})

    def delete(self, name: str) -> None:
        self.store.delete(f"/brokers/topics/{name}", recursive=True)
        self.store.delete(f"/config/topics/{name}", recursive=True)
