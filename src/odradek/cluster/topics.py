"""Topics and partition states: their store nodes, their validation, replica placement, and the
image the broker serves them from.

Nodes, as Kafka kept them on ZooKeeper (the intermediate nodes carry {}; ZooKeeper needs them):

    /brokers/topics/<t>                          {"version": 3, "topic_id": "<Kafka's base64 Uuid>",
                                                  "partitions": {"<p>": [replica, ...]},
                                                  "adding_replicas": {}, "removing_replicas": {}}
    /brokers/topics/<t>/partitions               {}
    /brokers/topics/<t>/partitions/<p>           {}
    /brokers/topics/<t>/partitions/<p>/state     {"controller_epoch", "leader", "version": 1, "leader_epoch", "isr"}
    /config/topics/<t>                           {"version": 1, "config": {name: value}}
    /admin/delete_topics/<t>                     {"topic_id": ...}: the deletion of <t> is under way

Placement follows Kafka's rule for a topic without explicit assignments: replicas round-robin over the
live brokers from a start index, the first replica the preferred leader.

`TopicImage` is what request handlers read: topics by name and by id, replaced entry by entry when the
controller has made a change durable; nothing on a request path reads the store.
"""

from __future__ import annotations

import base64
import re
import uuid
from dataclasses import dataclass, field, replace

LEGAL_TOPIC_CHARS = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME_LENGTH = 249
OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"
CLUSTER_METADATA_TOPIC = "__cluster_metadata"
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})

TOPICS_PATH = "/brokers/topics"
TOPIC_CONFIGS_PATH = "/config/topics"
DELETE_TOPICS_PATH = "/admin/delete_topics"
CONTROLLER_EPOCH = 1


def topic_path(name: str) -> str:
    return f"{TOPICS_PATH}/{name}"


def partitions_path(name: str) -> str:
    return f"{TOPICS_PATH}/{name}/partitions"


def partition_path(name: str, p: int) -> str:
    return f"{TOPICS_PATH}/{name}/partitions/{p}"


def state_path(name: str, p: int) -> str:
    return f"{TOPICS_PATH}/{name}/partitions/{p}/state"


def config_path(name: str) -> str:
    return f"{TOPIC_CONFIGS_PATH}/{name}"


def delete_marker_path(name: str) -> str:
    return f"{DELETE_TOPICS_PATH}/{name}"


@dataclass(frozen=True)
class PartitionState:
    leader: int
    leader_epoch: int
    isr: list[int]
    replicas: list[int]


@dataclass(frozen=True)
class TopicInfo:
    """One topic as the image holds it. Never changed in place: a change makes a new TopicInfo."""
    name: str
    topic_id: uuid.UUID
    partitions: dict[int, PartitionState] = field(default_factory=dict)
    configs: dict[str, str] = field(default_factory=dict)
    version: int = 0       # of /brokers/topics/<t>, for the conditional writes that change it

    @property
    def is_internal(self) -> bool:
        return self.name in INTERNAL_TOPICS

    @property
    def replication_factor(self) -> int:
        return len(self.partitions[min(self.partitions)].replicas) if self.partitions else 0


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


def unify_collision_chars(name: str) -> str:
    """'.' and '_' collide in metric names (Kafka's Topic.unifyCollisionChars)."""
    return name.replace(".", "_")


def assign_replicas(brokers: list[int], partitions: int, replication_factor: int,
                    start: int = 0, first_partition: int = 0) -> dict[int, list[int]]:
    brokers = sorted(brokers)
    n = len(brokers)
    out = {}
    for p in range(first_partition, first_partition + partitions):
        first = (start + p) % n
        out[p] = [brokers[(first + i) % n] for i in range(replication_factor)]
    return out


def assign_replicas_rack_aware(racks: dict[int, str], partitions: int, replication_factor: int,
                               start: int = 0, first_partition: int = 0) -> dict[int, list[int]]:
    """Kafka's rack-aware placement (AdminUtils.assignReplicasToBrokersRackAware): brokers listed
    alternating racks (the first of each rack, then the second of each, ...), the leader of each
    partition round-robin over that list, each further replica the next broker in a rack that has no
    replica of the partition yet (any rack once all have one), shifted once per full round so
    followers spread too."""
    by_rack: dict[str, list[int]] = {}
    for b in sorted(racks):
        by_rack.setdefault(racks[b], []).append(b)
    arranged: list[int] = []
    ordered = [by_rack[r] for r in sorted(by_rack)]
    for i in range(max(len(bs) for bs in ordered)):
        arranged.extend(bs[i] for bs in ordered if i < len(bs))
    n, num_racks = len(arranged), len(by_rack)
    out: dict[int, list[int]] = {}
    shift = 0
    for p in range(first_partition, first_partition + partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start) % n
        leader = arranged[first]
        replicas, used_racks, used = [leader], {racks[leader]}, {leader}
        k = 0
        for _ in range(replication_factor - 1):
            while True:
                broker = arranged[(first + 1 + (shift * num_racks + k) % (n - 1)) % n] if n > 1 else leader
                k += 1
                if (racks[broker] not in used_racks or len(used_racks) == num_racks) and \
                        (broker not in used or len(used) == n):
                    replicas.append(broker)
                    used_racks.add(racks[broker])
                    used.add(broker)
                    break
        out[p] = replicas
    return out


def initial_state(replicas: list[int]) -> PartitionState:
    return PartitionState(leader=replicas[0], leader_epoch=0, isr=list(replicas), replicas=list(replicas))


# ------------------------------------------------------------------------------------------ node formats
def encode_topic_id(topic_id: uuid.UUID) -> str:
    """Kafka's Uuid.toString: URL-safe base64 of the 16 bytes, without padding."""
    return base64.urlsafe_b64encode(topic_id.bytes).decode().rstrip("=")


def decode_topic_id(text: str) -> uuid.UUID:
    if len(text) == 36:              # str(uuid), as earlier versions stored it
        return uuid.UUID(text)
    return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def topic_node(info: TopicInfo, reassigning: dict[int, tuple[list[int], list[int]]] | None = None) -> dict:
    """`reassigning`: partition -> (adding, removing) replicas of a reassignment under way (KIP-455)."""
    moving = reassigning or {}
    return {"version": 3, "topic_id": encode_topic_id(info.topic_id),
            "partitions": {str(p): list(st.replicas) for p, st in sorted(info.partitions.items())},
            "adding_replicas": {str(p): list(a) for p, (a, _) in sorted(moving.items()) if a},
            "removing_replicas": {str(p): list(r) for p, (_, r) in sorted(moving.items()) if r}}


def state_node(st: PartitionState) -> dict:
    return {"controller_epoch": CONTROLLER_EPOCH, "leader": st.leader, "version": 1,
            "leader_epoch": st.leader_epoch, "isr": list(st.isr)}


def config_node(configs: dict[str, str]) -> dict:
    return {"version": 1, "config": dict(configs)}


def topic_from_nodes(name: str, topic: dict, version: int, states: dict[int, dict | None],
                     configs: dict | None) -> TopicInfo:
    partitions = {}
    for p, replicas in topic["partitions"].items():
        st = states.get(int(p))
        if st is None:   # never written by this controller; the preferred replica leads
            partitions[int(p)] = initial_state(list(replicas))
        else:
            partitions[int(p)] = PartitionState(st["leader"], st["leader_epoch"], list(st["isr"]), list(replicas))
    return TopicInfo(name, decode_topic_id(topic["topic_id"]), dict(sorted(partitions.items())),
                     dict((configs or {}).get("config", {})), version)


# ------------------------------------------------------------------------------------------ the image
class TopicImage:
    """Topics by name, by id and by collision-unified name. One writer (the controller, on the event
    loop); each change replaces whole entries, so readers on any thread see a topic before or after."""

    def __init__(self) -> None:
        self._by_name: dict[str, TopicInfo] = {}
        self._by_id: dict[uuid.UUID, str] = {}
        self._unified: dict[str, str] = {}
        self._sorted: list[str] | None = None

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def get(self, name: str) -> TopicInfo | None:
        return self._by_name.get(name)

    def by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        name = self._by_id.get(topic_id)
        return self._by_name.get(name) if name is not None else None

    def names(self) -> list[str]:
        """Every topic name, sorted."""
        names = self._sorted
        if names is None:
            names = self._sorted = sorted(self._by_name)
        return list(names)

    def colliding(self, name: str) -> str | None:
        """Another topic whose name differs from `name` only in '.' versus '_'."""
        other = self._unified.get(unify_collision_chars(name))
        return other if other is not None and other != name else None

    def put(self, info: TopicInfo) -> None:
        old = self._by_name.get(info.name)
        if old is not None and old.topic_id != info.topic_id:
            self._by_id.pop(old.topic_id, None)
        self._by_id[info.topic_id] = info.name
        self._unified[unify_collision_chars(info.name)] = info.name
        self._by_name[info.name] = info
        if old is None:
            self._sorted = None

    def remove(self, name: str) -> TopicInfo | None:
        info = self._by_name.pop(name, None)
        if info is not None:
            self._by_id.pop(info.topic_id, None)
            if self._unified.get(unify_collision_chars(name)) == name:
                del self._unified[unify_collision_chars(name)]
            self._sorted = None
        return info

    def with_configs(self, name: str, configs: dict[str, str]) -> None:
        info = self._by_name.get(name)
        if info is not None:
            self.put(replace(info, configs=dict(configs)))
