"""The broker's metadata cache: one immutable image of the cluster, replaced as a whole (DESIGN,
"Metadata and the cluster"; Kafka's MetadataCache over a MetadataImage).

The image holds what request handlers need to know about the cluster: its id and controller, the live
brokers and their endpoints per listener, every topic with its id, partitions (leader, leader epoch,
replicas, ISR) and config overrides, and this broker's effective configuration (static plus dynamic
layers), from which each topic's effective config is resolved once per image.

Invariants:
- An image never changes once published. An update builds a new image (`with_topics`,
  `without_topics`, `with_config`, `with_brokers`) and `MetadataCache.update` swaps the reference, so a
  handler that reads `cache.image` once sees one consistent cluster for its whole request, across awaits.
- Nothing here does I/O: images are built from what the controller has already made durable (or, in a
  cluster, from UpdateMetadata). No request path waits for the metadata store.

A cluster broker's first image names only itself: the other brokers, the topics and often the
controller come with the controller's first UpdateMetadata, a few milliseconds after the broker
registers. A client that asked in between would take that one-broker list as the cluster (librdkafka
forgets the bootstrap brokers a Metadata answer does not name, and then waits for a controller it
cannot reach until its request times out). So, as a KRaft broker does not serve requests before it has
caught up with the metadata log, Metadata and DescribeCluster wait for that first update here
(`first_update`), within a bound: a controller that never comes leaves them answered from what there is.
They wait parked (`network.Parked`): clients reconnecting to a restarted broker must not fill
`queued.max.requests` and stop it reading the controller's UpdateMetadata they wait for.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, TypeVar

from odradek.cluster.topics import PartitionState, TopicInfo
from odradek.server.config import BrokerConfig, TopicConfig
from odradek.server.network import Parked

log = logging.getLogger("odradek.metadata")

# How long Metadata and DescribeCluster wait for the controller's first UpdateMetadata: well inside
# every client's request timeout (30 s in Java and kafka-python, 60 s in librdkafka), well past the
# few milliseconds the controller takes once the broker has registered.
FIRST_UPDATE_WAIT_S = 10.0


@dataclass(frozen=True, slots=True)
class BrokerEndpoint:
    listener_name: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """A live broker as `/brokers/ids/<id>` registers it."""
    broker_id: int
    endpoints: tuple[BrokerEndpoint, ...]
    rack: str | None = None

    def endpoint(self, listener_name: str) -> BrokerEndpoint | None:
        for e in self.endpoints:
            if e.listener_name == listener_name:
                return e
        return None


_EMPTY: Mapping = MappingProxyType({})
K = TypeVar("K")
V = TypeVar("V")


class MetadataImage:
    """One consistent view of the cluster. Build new images from old ones; never mutate one."""

    __slots__ = ("cluster_id", "controller_id", "brokers", "topics", "topic_ids", "config", "_topic_configs",
                 "_sorted_names")

    def __init__(self, config: BrokerConfig, *, cluster_id: str | None = None, controller_id: int = -1,
                 brokers: Mapping[int, BrokerRegistration] = _EMPTY, topics: Mapping[str, TopicInfo] = _EMPTY,
                 topic_ids: Mapping[uuid.UUID, str] | None = None) -> None:
        self.config = config
        self.cluster_id = cluster_id
        self.controller_id = controller_id
        self.brokers: Mapping[int, BrokerRegistration] = _frozen(brokers)
        self.topics: Mapping[str, TopicInfo] = _frozen(topics)
        self.topic_ids: Mapping[uuid.UUID, str] = _frozen(
            topic_ids if topic_ids is not None else {t.topic_id: n for n, t in self.topics.items()})
        # Derived, not state: computed on first use, the same for every reader of this image.
        self._topic_configs: dict[str, TopicConfig] = {}
        self._sorted_names: list[str] | None = None

    # ------------------------------------------------------------------------------ reads
    def topic(self, name: str | None) -> TopicInfo | None:
        return self.topics.get(name) if name is not None else None

    def topic_by_id(self, topic_id: uuid.UUID | None) -> TopicInfo | None:
        name = self.topic_ids.get(topic_id) if topic_id is not None else None
        return self.topics.get(name) if name is not None else None

    def topic_names(self) -> list[str]:
        """Every topic name, sorted (a new list: the caller may keep or change it)."""
        if self._sorted_names is None:
            self._sorted_names = sorted(self.topics)
        return list(self._sorted_names)

    def partition(self, topic: str | None, index: int) -> PartitionState | None:
        info = self.topic(topic)
        return info.partitions.get(index) if info is not None else None

    def has_partition(self, topic: str | None, index: int) -> bool:
        return self.partition(topic, index) is not None

    def live_broker_ids(self) -> frozenset[int]:
        return frozenset(self.brokers)

    def live_broker_racks(self) -> dict[int, str | None]:
        """Each live broker's `broker.rack` (None without one): what rack-aware placement reads."""
        return {b: r.rack for b, r in self.brokers.items()}

    def alive_endpoints(self, listener_name: str | None) -> list[tuple[BrokerRegistration, BrokerEndpoint]]:
        """Each live broker's endpoint on `listener_name` (every endpoint when None), by broker id."""
        out = []
        for broker_id in sorted(self.brokers):
            b = self.brokers[broker_id]
            for e in b.endpoints:
                if listener_name is None or e.listener_name == listener_name:
                    out.append((b, e))
        return out

    def topic_config(self, name: str | None) -> TopicConfig:
        """The topic's effective config: its overrides over this broker's config (the broker's alone
        for a topic that does not exist); a stored override that cannot be applied is logged and left out."""
        key = name or ""
        tc = self._topic_configs.get(key)
        if tc is None:
            info = self.topic(name)
            tc = TopicConfig.resolve_stored(info.configs if info is not None else {}, self.config, key)
            self._topic_configs[key] = tc
        return tc

    # ------------------------------------------------------------------------------ new images
    def _derive(self, **changes: object) -> MetadataImage:
        fields: dict = {"config": self.config, "cluster_id": self.cluster_id, "controller_id": self.controller_id,
                        "brokers": self.brokers, "topics": self.topics, "topic_ids": self.topic_ids}
        fields.update(changes)
        return MetadataImage(**fields)

    def with_topics(self, infos: Iterable[TopicInfo]) -> MetadataImage:
        """This image with `infos` added or replaced (one copy of the topic maps for all of them)."""
        infos = list(infos)
        if not infos:
            return self
        topics, ids = dict(self.topics), dict(self.topic_ids)
        for info in infos:
            old = topics.get(info.name)
            if old is not None and old.topic_id != info.topic_id:
                ids.pop(old.topic_id, None)
            topics[info.name] = info
            ids[info.topic_id] = info.name
        return self._derive(topics=MappingProxyType(topics), topic_ids=MappingProxyType(ids))

    def without_topics(self, names: Iterable[str]) -> MetadataImage:
        names = [n for n in names if n in self.topics]
        if not names:
            return self
        topics, ids = dict(self.topics), dict(self.topic_ids)
        for name in names:
            info = topics.pop(name)
            ids.pop(info.topic_id, None)
        return self._derive(topics=MappingProxyType(topics), topic_ids=MappingProxyType(ids))

    def with_config(self, config: BrokerConfig) -> MetadataImage:
        return self._derive(config=config)

    def with_brokers(self, brokers: Mapping[int, BrokerRegistration], controller_id: int) -> MetadataImage:
        return self._derive(brokers=brokers, controller_id=controller_id)

    def with_cluster_id(self, cluster_id: str) -> MetadataImage:
        return self._derive(cluster_id=cluster_id)


def _frozen(mapping: Mapping[K, V]) -> Mapping[K, V]:
    """A read-only mapping: a proxy is an image's own (made here from a fresh copy) and is shared by
    the images derived from it; anything else is copied."""
    return mapping if isinstance(mapping, MappingProxyType) else MappingProxyType(dict(mapping))


class MetadataCache:
    """The current image, and who wants to hear of a new one."""

    def __init__(self, image: MetadataImage) -> None:
        self._image = image
        self._listeners: list[Callable[[MetadataImage, MetadataImage], None]] = []
        self._first_update: asyncio.Event | None = None     # set: the controller's view has arrived
        self._held_logged = False

    def expect_controller(self) -> None:
        """A cluster broker: the image is its own until `controller_reached` (the first UpdateMetadata)."""
        self._first_update = asyncio.Event()

    def controller_reached(self) -> None:
        if self._first_update is not None:
            self._first_update.set()

    async def first_update(self, timeout_s: float) -> None:
        """Return once the controller's first UpdateMetadata is in the image, or after `timeout_s`."""
        event = self._first_update
        if event is None or event.is_set():
            return
        if not self._held_logged:
            self._held_logged = True
            log.info("client metadata requests wait for the controller's first UpdateMetadata (at most %.0f s)",
                     timeout_s)
        try:
            with Parked():
                await asyncio.wait_for(event.wait(), timeout_s)
        except asyncio.TimeoutError:
            log.warning("no UpdateMetadata from the controller after %.0f s; answering metadata requests "
                        "with this broker's own view", timeout_s)

    @property
    def image(self) -> MetadataImage:
        return self._image

    def update(self, image: MetadataImage) -> None:
        old, self._image = self._image, image
        for fn in list(self._listeners):
            fn(old, image)

    def add_listener(self, fn: Callable[[MetadataImage, MetadataImage], None]) -> None:
        """`fn(old, new)` after each update (on the event loop; it must not block)."""
        self._listeners.append(fn)

    # Shorthands for one read of the current image.
    def topic(self, name: str | None) -> TopicInfo | None:
        return self._image.topic(name)

    def topic_by_id(self, topic_id: uuid.UUID | None) -> TopicInfo | None:
        return self._image.topic_by_id(topic_id)

    def topic_config(self, name: str | None) -> TopicConfig:
        return self._image.topic_config(name)

    @property
    def config(self) -> BrokerConfig:
        return self._image.config
