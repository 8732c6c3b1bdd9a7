"""The controller: the one place where topics, partitions, partition states and producer-id blocks
change (DESIGN, "Metadata and the cluster"; Kafka's ReplicationControlManager and ZooKeeper-era
KafkaController and TopicDeletionManager).

Every change goes the same way: planned against the image (validated, replicas placed), written to the
store as one multi, and only then applied to the image that request handlers read. The controller
never touches logs (the cluster layer does not know the storage layer): it returns the plans, and the
broker opens logs before committing a creation and removes them between the two writes of a deletion.
Writes are plain functions of the store, so the broker can run them on its worker pool.

Creation, one multi per request: for every topic /brokers/topics/<t>, .../partitions,
.../partitions/<p> and .../partitions/<p>/state for each partition, and /config/topics/<t>. A crash
leaves every topic of the request absent or complete.

Deletion, Kafka's /admin/delete_topics/<t>:
1. mark: one multi with, per topic, a version check of /brokers/topics/<t> and the creation of
   /admin/delete_topics/<t>; the topics leave the image (clients no longer see them);
2. the broker removes the logs;
3. complete: one multi deleting every node of the topics (children first) and their markers.
A marked topic never enters the image again: on start `start()` returns the marked topics and the
broker completes them before it opens anything. A completion that fails (a full disk) stays pending
and is retried by `retry_deletions` before the next change.

CreatePartitions, one multi per request: per topic a conditional set of /brokers/topics/<t> (the
version the plan was made against) with the longer partition map, and the new partitions' nodes. A
topic with a reassignment under way is refused with REASSIGNMENT_IN_PROGRESS, as Kafka's ZooKeeper-mode
broker does (ZkAdminManager.createPartitions).

Bounds: one request creates at most MAX_PARTITIONS_PER_REQUEST partitions (Kafka's controller refuses
a CreateTopics asking for more with POLICY_VIOLATION, "Excessively large number of partitions per
request.", and any operation producing more than 10,000 records with "Unable to perform excessively
large batch operation."). Names planned by an operation that has not finished are reserved, so two
operations never plan the same topic.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from typing import Callable, Collection, Iterable, Mapping, NoReturn

from odradek.cluster.producer_ids import PRODUCER_ID_BLOCK_PATH, ProducerIdManager
from odradek.cluster.store import CheckVersion, Create, Delete, MetadataStore, NodeExistsError, NoNodeError, Op, \
    SetData
from odradek.cluster.topics import (
    DELETE_TOPICS_PATH, TOPIC_CONFIGS_PATH, TOPICS_PATH, PartitionState, TopicImage, TopicInfo, assign_replicas,
    assign_replicas_rack_aware, config_node, config_path, delete_marker_path, initial_state, partition_path,
    partitions_path, state_node, state_path, topic_from_nodes, topic_node, topic_path, unify_collision_chars,
    validate_topic_name,
)
from odradek.protocol.error_codes import ErrorCode, KafkaApiError

log = logging.getLogger("odradek.controller")

MAX_PARTITIONS_PER_REQUEST = 10_000
EXCESSIVE_PARTITIONS = "Excessively large number of partitions per request."
EXCESSIVE_BATCH = "Unable to perform excessively large batch operation."

ISR_CHANGE_NOTIFICATION_PATH = "/isr_change_notification"
# Created at start when missing, parents first (Kafka's persistent ZooKeeper paths that we use).
PERSISTENT_PATHS = ("/admin", DELETE_TOPICS_PATH, "/brokers", "/brokers/ids", TOPICS_PATH, "/cluster",
                    "/config", TOPIC_CONFIGS_PATH, "/config/brokers", "/config/changes", ISR_CHANGE_NOTIFICATION_PATH)

__all__ = ["Controller", "MAX_PARTITIONS_PER_REQUEST", "EXCESSIVE_PARTITIONS", "EXCESSIVE_BATCH",
           "PRODUCER_ID_BLOCK_PATH", "requested_partitions"]


def _fail(code: ErrorCode, message: str | None = None) -> NoReturn:
    raise KafkaApiError(code, message)


def requested_partitions(num_partitions: int, assignments: int, default_partitions: int) -> int:
    """The partitions a CreateTopics entry asks for, as Kafka counts them against the bound."""
    if assignments:
        return assignments
    if num_partitions == -1:
        return default_partitions
    return max(num_partitions, 0)


def check_manual_assignment(live: Collection[int], replicas: list[int], replication_factor: int | None) -> None:
    """ReplicationControlManager.validateManualPartitionAssignment."""
    if not replicas:
        _fail(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment includes an empty replica list.")
    previous = None
    for broker_id in sorted(replicas):
        if broker_id not in live:
            _fail(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"The manual partition assignment includes broker "
                                                        f"{broker_id}, but no such broker is registered.")
        if broker_id == previous:
            _fail(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                  f"The manual partition assignment includes the broker {previous} more than once.")
        previous = broker_id
    if replication_factor is not None and len(replicas) != replication_factor:
        _fail(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
              f"The manual partition assignment includes a partition with {len(replicas)} replica(s), but "
              f"this is not consistent with previous partitions, which have {replication_factor} replica(s).")


def place_replicas(live: Collection[int], partitions: int, replication_factor: int,
                   first_partition: int = 0) -> dict[int, list[int]]:
    """`live`: the live broker ids, or a mapping of them to their racks (`broker.rack`): when every
    live broker has a rack the placement is rack-aware (Kafka refuses a mix; here brokers without a
    rack make the placement rack-unaware)."""
    brokers = sorted(live)
    if replication_factor > len(brokers):
        _fail(ErrorCode.INVALID_REPLICATION_FACTOR,
              f"Unable to replicate the partition {replication_factor} time(s): The target replication "
              f"factor of {replication_factor} cannot be reached because only {len(brokers)} broker(s) "
              f"are registered.")
    if isinstance(live, Mapping) and brokers and all(live[b] for b in brokers):
        return assign_replicas_rack_aware({b: live[b] for b in brokers}, partitions, replication_factor,
                                          first_partition=first_partition)
    return assign_replicas(brokers, partitions, replication_factor, first_partition=first_partition)


def manual_assignment(live: Collection[int], assignments: list[tuple[int, list[int]]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    replication_factor = None
    for index, replicas in assignments:
        if index in out:
            _fail(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                  f"Found multiple manual partition assignments for partition {index}")
        check_manual_assignment(live, replicas, replication_factor)
        replication_factor = len(replicas)
        out[index] = list(replicas)
    if any(i not in out for i in range(len(out))):
        _fail(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "partitions should be a consecutive 0-based integer sequence")
    return dict(sorted(out.items()))


class Controller:
    def __init__(self, store: MetadataStore, broker_id: int) -> None:
        self.store = store
        self.broker_id = broker_id
        self.image = TopicImage()
        self.producer_ids = ProducerIdManager(store, broker_id)
        self.pending_deletions: dict[str, TopicInfo | None] = {}
        # The version of each partition's state node: the partition epoch of LeaderAndIsr, and what the
        # conditional writes of leader and ISR changes check (Kafka's zkVersion).
        self.state_versions: dict[tuple[str, int], int] = {}
        # Reassignments under way (KIP-455), as the topic nodes record them: (topic, partition) ->
        # (adding, removing) replicas; the partition's replicas are the target followed by the removing.
        self.reassigning: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
        self._reserved: dict[str, str] = {}           # unified name -> name, for plans not yet finished

    # ------------------------------------------------------------------------------------------ start
    def start(self) -> list[str]:
        """Create the persistent paths, load the image; return the topics whose deletion is under way
        (the broker removes their logs, then calls `complete_deletions`)."""
        missing = [p for p in PERSISTENT_PATHS if not self.store.exists(p)]
        if missing:
            try:
                self.store.multi([Create(p, {}) for p in missing])
            except NodeExistsError:     # another broker of the cluster is creating them too
                for p in missing:
                    try:
                        self.store.create(p, {})
                    except NodeExistsError:
                        pass
        marked = set(self.store.children(DELETE_TOPICS_PATH))
        for name in self.store.children(TOPICS_PATH):
            info = self.read_topic(name)
            if name in marked:
                self.pending_deletions[name] = info
            elif info is not None:
                self.image.put(info)
        for name in marked:
            self.pending_deletions.setdefault(name, None)
        return sorted(self.pending_deletions)

    def read_topic(self, name: str) -> TopicInfo | None:
        try:
            value, version = self.store.get(topic_path(name))
        except NoNodeError:
            return None
        states: dict[int, dict | None] = {}
        for p in value["partitions"]:
            try:
                states[int(p)], self.state_versions[(name, int(p))] = self.store.get(state_path(name, int(p)))
            except NoNodeError:
                states[int(p)] = None
        try:
            configs: dict | None = self.store.get(config_path(name))[0]
        except NoNodeError:
            configs = None
        adding, removing = value.get("adding_replicas") or {}, value.get("removing_replicas") or {}
        for p in set(adding) | set(removing):
            self.reassigning[(name, int(p))] = (list(adding.get(p, [])), list(removing.get(p, [])))
        return topic_from_nodes(name, value, version, states, configs)

    def topic_reassignments(self, name: str) -> dict[int, tuple[list[int], list[int]]]:
        return {p: r for (t, p), r in self.reassigning.items() if t == name}

    # ------------------------------------------------------------------------------------------ creation
    def check_new_name(self, name: str) -> None:
        """Raise KafkaApiError unless a topic of this name may be created now."""
        reason = validate_topic_name(name)
        if reason is not None:
            _fail(ErrorCode.INVALID_TOPIC_EXCEPTION, reason)
        if name in self.pending_deletions:
            _fail(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' is marked for deletion.")
        unified = unify_collision_chars(name)
        if name in self.image or self._reserved.get(unified) == name:
            _fail(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        other = self.image.colliding(name) or self._reserved.get(unified)
        if other is not None:
            _fail(ErrorCode.INVALID_TOPIC_EXCEPTION, f"Topic '{name}' collides with existing topic: {other}")

    def plan_topic(self, name: str, num_partitions: int, replication_factor: int,
                   assignments: list[tuple[int, list[int]]] | None, configs: dict[str, str],
                   live: Collection[int], defaults: tuple[int, int]) -> TopicInfo:
        """A new topic, validated and placed, its name reserved until `publish` or `release`.
        -1 partitions or replication factor means the default; raises KafkaApiError."""
        self.check_new_name(name)
        if assignments:
            if replication_factor != -1:
                _fail(ErrorCode.INVALID_REQUEST, "A manual partition assignment was specified, but replication "
                                                 "factor was not set to -1.")
            if num_partitions != -1:
                _fail(ErrorCode.INVALID_REQUEST, "A manual partition assignment was specified, but numPartitions "
                                                 "was not set to -1.")
            assignment = manual_assignment(live, assignments)
        else:
            if replication_factor < -1 or replication_factor == 0:
                _fail(ErrorCode.INVALID_REPLICATION_FACTOR,
                      "Replication factor must be larger than 0, or -1 to use the default value.")
            if num_partitions < -1 or num_partitions == 0:
                _fail(ErrorCode.INVALID_PARTITIONS, "Number of partitions was set to an invalid non-positive value.")
            partitions = defaults[0] if num_partitions == -1 else num_partitions
            factor = defaults[1] if replication_factor == -1 else replication_factor
            assignment = place_replicas(live, partitions, factor)
        info = TopicInfo(name, uuid.uuid4(), {p: initial_state(r) for p, r in assignment.items()}, dict(configs))
        self._reserved[unify_collision_chars(name)] = name
        return info

    def release(self, names: Iterable[str]) -> None:
        for name in names:
            unified = unify_collision_chars(name)
            if self._reserved.get(unified) == name:
                del self._reserved[unified]

    @staticmethod
    def creation_ops(infos: list[TopicInfo]) -> list[Op]:
        ops: list[Op] = []
        for info in infos:
            name = info.name
            ops.append(Create(topic_path(name), topic_node(info)))
            ops.append(Create(partitions_path(name), {}))
            for p, st in info.partitions.items():
                ops.append(Create(partition_path(name, p), {}))
                ops.append(Create(state_path(name, p), state_node(st)))
            ops.append(Create(config_path(name), config_node(info.configs)))
        return ops

    def commit(self, ops: list[Op]) -> None:
        """One atomic, durable write (StoreError if it cannot be made). Safe on a worker thread."""
        self.store.multi(ops)

    def publish(self, info: TopicInfo) -> None:
        self.image.put(info)
        for p in info.partitions:
            self.state_versions[(info.name, p)] = 0
        self.release([info.name])

    # ------------------------------------------------------------------------------------------ partitions
    def plan_partitions(self, name: str, count: int, assignments: list[list[int]] | None,
                        live: Collection[int]) -> TopicInfo:
        """The topic with `count` partitions (CreatePartitions; ReplicationControlManager's checks)."""
        info = self.image.get(name)
        if info is None:
            raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None)
        if self.topic_reassignments(name):
            # Kafka (ZooKeeper mode) refuses it too: the controller finishing the reassignment and this
            # request would both rewrite the topic node.
            _fail(ErrorCode.REASSIGNMENT_IN_PROGRESS, f"A partition reassignment is in progress for the topic '{name}'.")
        current = len(info.partitions)
        if count == current:
            _fail(ErrorCode.INVALID_PARTITIONS, f"Topic already has {current} partition(s).")
        if count < current:
            _fail(ErrorCode.INVALID_PARTITIONS, f"The topic {name} currently has {current} partition(s); "
                                                f"{count} would not be an increase.")
        additional = count - current
        if assignments is not None and len(assignments) != additional:
            _fail(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"Attempted to add {additional} additional partition(s), but "
                                                        f"only {len(assignments)} assignment(s) were specified.")
        factor = info.replication_factor
        if assignments is not None:
            added = {}
            for i, replicas in enumerate(assignments):
                check_manual_assignment(live, list(replicas), factor)
                added[current + i] = list(replicas)
        else:
            added = place_replicas(live, additional, factor, first_partition=current)
        partitions = dict(info.partitions)
        partitions.update((p, initial_state(r)) for p, r in added.items())
        return replace(info, partitions=partitions)

    def partition_ops(self, plans: list[tuple[TopicInfo, TopicInfo]]) -> list[Op]:
        """(current, planned) per topic -> the conditional topic write and the new partitions' nodes.
        The topic node keeps the adding and removing replicas of a reassignment under way (`plan_partitions`
        refuses a topic being reassigned; a node written without them would end the reassignment)."""
        ops: list[Op] = []
        for old, new in plans:
            ops.append(SetData(topic_path(new.name), topic_node(new, self.topic_reassignments(new.name)), old.version))
            for p in sorted(set(new.partitions) - set(old.partitions)):
                ops.append(Create(partition_path(new.name, p), {}))
                ops.append(Create(state_path(new.name, p), state_node(new.partitions[p])))
        return ops

    def publish_partitions(self, planned: TopicInfo) -> TopicInfo:
        """After the write: the image's topic (whose configs may have changed meanwhile) gets the new
        partitions and the topic node's new version."""
        current = self.image.get(planned.name) or planned
        info = replace(current, partitions=planned.partitions, version=planned.version + 1)
        for p in planned.partitions:
            self.state_versions.setdefault((planned.name, p), 0)
        self.image.put(info)
        return info

    def set_partition_state(self, name: str, p: int, state: PartitionState) -> None:
        """Record a leader / ISR change (one write, then the image)."""
        info = self.image.get(name)
        if info is None or p not in info.partitions:
            raise NoNodeError(state_path(name, p))
        version = self.store.multi([SetData(state_path(name, p), state_node(state))])[0]
        partitions = dict(info.partitions)
        partitions[p] = state
        self.image.put(replace(info, partitions=partitions))
        if version is not None:
            self.state_versions[(name, p)] = version

    def state_write_ops(self, changes: list[tuple[str, int, PartitionState]],
                        fence: Callable[[list[Op]], list[Op]] | None = None) -> list[Op]:
        """One multi recording leader and ISR changes, each conditional on the state node's version
        this controller knows (BadVersionError if another writer, a leader changing its ISR, came
        first: `read_states` then elect again); `fence` makes it conditional on this controller's
        epoch. Run it with `store.multi` (on a worker thread), then `states_written` on the loop."""
        ops: list[Op] = [SetData(state_path(t, p), state_node(st), self.state_versions.get((t, p), -1))
                         for t, p, st in changes]
        return fence(ops) if fence is not None else ops

    def states_written(self, changes: list[tuple[str, int, PartitionState]], results: list[int | None]) -> None:
        versions = results[len(results) - len(changes):]
        for (t, p, st), version in zip(changes, versions):
            info = self.image.get(t)
            if info is None or p not in info.partitions:
                continue
            partitions = dict(info.partitions)
            partitions[p] = st
            self.image.put(replace(info, partitions=partitions))
            if version is not None:
                self.state_versions[(t, p)] = version

    def read_states(self, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple[dict, int]]:
        """The state nodes of these partitions as they are now (safe on a worker thread)."""
        out = {}
        for t, p in keys:
            try:
                out[(t, p)] = self.store.get(state_path(t, p))
            except NoNodeError:
                continue
        return out

    def states_read(self, nodes: dict[tuple[str, int], tuple[dict, int]]) -> list[tuple[str, int]]:
        """Take state nodes read by `read_states` into the image; the partitions that changed."""
        changed = []
        for (t, p), (node, version) in nodes.items():
            info = self.image.get(t)
            if info is None or p not in info.partitions or self.state_versions.get((t, p)) == version:
                continue
            st = PartitionState(node["leader"], node["leader_epoch"], list(node["isr"]),
                                list(info.partitions[p].replicas))
            partitions = dict(info.partitions)
            partitions[p] = st
            self.image.put(replace(info, partitions=partitions))
            self.state_versions[(t, p)] = version
            changed.append((t, p))
        return changed

    # ------------------------------------------------------------------------------------------ configs
    def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        self.write_topic_configs(name, configs)
        self.image.with_configs(name, configs)

    def write_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        """The store write of `set_topic_configs` alone (safe on a worker thread; then `image.with_configs`)."""
        path = config_path(name)
        op = SetData(path, config_node(configs)) if self.store.exists(path) else Create(path, config_node(configs))
        self.store.multi([op])

    # ------------------------------------------------------------------------------------------ deletion
    @staticmethod
    def deletion_mark_ops(infos: list[TopicInfo]) -> list[Op]:
        ops: list[Op] = []
        for info in infos:
            ops.append(CheckVersion(topic_path(info.name), info.version))
            ops.append(Create(delete_marker_path(info.name), {"topic_id": topic_node(info)["topic_id"]}))
        return ops

    def unpublish(self, names: Iterable[str]) -> list[TopicInfo]:
        """After the mark: the topics leave the image and wait in `pending_deletions`."""
        out = []
        for name in names:
            info = self.image.remove(name)
            self.pending_deletions[name] = info
            if info is not None:
                out.append(info)
        return out

    def completion_ops(self, names: Iterable[str]) -> list[Op]:
        """Every node of the topics, children before parents, and their deletion markers."""
        ops: list[Op] = []
        for name in names:
            root = topic_path(name)
            if self.store.exists(root):
                doomed, stack = [], [root]
                while stack:
                    path = stack.pop()
                    doomed.append(path)
                    stack.extend(f"{path}/{c}" for c in self.store.children(path))
                ops.extend(Delete(p) for p in reversed(doomed))
            if self.store.exists(config_path(name)):
                ops.append(Delete(config_path(name)))
            if self.store.exists(delete_marker_path(name)):
                ops.append(Delete(delete_marker_path(name)))
        return ops

    def complete_deletions(self, names: list[str]) -> None:
        """The final write of a deletion (StoreError: the deletions stay pending). Safe on a worker
        thread; call `finish_deletions` on the loop afterwards."""
        self.store.multi(self.completion_ops(names))

    def finish_deletions(self, names: Iterable[str]) -> None:
        for name in names:
            self.pending_deletions.pop(name, None)
