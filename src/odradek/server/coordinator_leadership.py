"""A coordinator follows the leadership of its topic's partitions (seed 003; Kafka's
GroupCoordinator.onElection / onResignation, the same for the transaction coordinator).

When this broker becomes the leader of a partition of the coordinator's topic (`__consumer_offsets`,
`__transaction_state`) the coordinator loads it (`elect`), with a high-watermark listener so its writes
complete when they are committed; when it becomes a follower or stops hosting it, the coordinator
unloads it (`resign`). A topic that appears or grows in the metadata image loads what is already led
here. One instance per coordinator; both coordinators run on the generic `CoordinatorRuntime`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, Callable, Protocol

from odradek.server.metadata_cache import MetadataCache, MetadataImage
from odradek.server.partition import Partition, TopicPartition
from odradek.server.replica_manager import ReplicaManager


class Runtime(Protocol):
    @property
    def partition_count(self) -> int | None: ...

    def owns(self, partition: int) -> bool: ...

    def elect(self, partition: int, log_: Any, partition_count: int, coordinator_epoch: int = 0) -> None: ...

    def resign(self, partition: int) -> None: ...

    def high_watermark_advanced(self, partition: int, high_watermark: int) -> None: ...


class LeadershipFollower:
    def __init__(self, topic: str, replica_manager: ReplicaManager, metadata: MetadataCache,
                 runtime: Callable[[], Runtime | None], writer_for: Callable[[Partition], Any]) -> None:
        self.topic = topic
        self.replica_manager = replica_manager
        self.metadata = metadata
        self.runtime = runtime
        self.writer_for = writer_for

    def attach(self) -> None:
        """Listen to leadership changes and new images; load what this broker leads already."""
        self.replica_manager.add_leadership_listener(self.leadership_changed)
        self.metadata.add_listener(self.image_changed)
        self.elect_led()

    def leadership_changed(self, leaders: list[Partition], followers: list[Partition],
                           stopped: list[TopicPartition]) -> None:
        self.elect(p for p in leaders if p.topic == self.topic)
        runtime = self.runtime()
        for key in [p.key for p in followers] + stopped:
            if key[0] == self.topic and runtime is not None:
                self.replica_manager.remove_high_watermark_listener(key)
                runtime.resign(key[1])

    def image_changed(self, old: MetadataImage, new: MetadataImage) -> None:
        info = new.topic(self.topic)
        if info is not None and info is not old.topic(self.topic):
            self.elect_led()

    def elect_led(self) -> None:
        self.elect(p for p in self.replica_manager.partitions() if p.topic == self.topic and p.is_leader)

    def elect(self, partitions: Iterable[Partition]) -> None:
        runtime = self.runtime()
        if runtime is None:
            return
        info = self.metadata.topic(self.topic)
        for part in partitions:
            count = len(info.partitions) if info is not None else runtime.partition_count
            if count is None or runtime.owns(part.index):
                continue
            self.replica_manager.add_high_watermark_listener(
                part.key, functools.partial(runtime.high_watermark_advanced, part.index))
            runtime.elect(part.index, self.writer_for(part), count, max(part.leader_epoch, 0))
