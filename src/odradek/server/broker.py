"""The broker: configuration, log manager, metadata, partitions, listeners, and their lifecycle.

DESIGN, "How data flows" and "Metadata and the cluster". In embedded mode (the default for
`odradek serve`) the broker is its own controller: topic changes are written to the embedded store
and the partitions this broker leads are opened at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from typing import Callable

from odradek.cluster.store import EmbeddedStore
from odradek.cluster.topics import TopicInfo, TopicStore, assign_replicas, validate_topic_name
from odradek.coordinator.records import OFFSETS_TOPIC
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import metadata as metadata_msgs
from odradek.server.apis import HANDLERS
from odradek.server.apis.api_versions import supported
from odradek.server.apis.groups import start_group_coordinator
from odradek.server.config import BrokerConfig, ConfigError, TopicConfig
from odradek.server.dispatch import Dispatcher
from odradek.server.fetch_session import FetchSessionCache
from odradek.server.network import Listener
from odradek.server.partition import Partition
from odradek.server.purgatory import Purgatory
from odradek.server.workers import WorkerPool
from odradek.storage.config import CleanerConfig, LogConfig, LogManagerConfig
from odradek.storage.manager import LogManager

log = logging.getLogger("odradek.broker")

METADATA_FILE = "odradek-metadata.json"


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Broker:
    def __init__(self, config: BrokerConfig, clock: Callable[[], int] = wall_clock_ms) -> None:
        self.config = config
        self.clock = clock
        self.broker_id = config.broker_id
        self.controller_id = self.broker_id
        self.partitions: dict[tuple[str, int], Partition] = {}
        self.purgatory = Purgatory()
        self.fetch_sessions = FetchSessionCache(config.get("max.incremental.fetch.session.cache.slots"))
        self.listeners: list[tuple[Listener, object]] = []
        self.bound_ports: dict[str, int] = {}
        self.api_versions = supported(HANDLERS)
        self.dispatcher = Dispatcher(self, HANDLERS)
        self._periodic: asyncio.Task | None = None
        self.logs: LogManager | None = None
        self.store: EmbeddedStore | None = None
        self.topics: TopicStore | None = None
        self.cluster_id: str | None = None
        self._topic_configs: dict[str, TopicConfig] = {}
        self._topic_ids: dict = {}
        self.group_coordinator = None   # odradek.coordinator.runtime.GroupCoordinator, from start()
        # Work that grows with its input runs here, off the event loop (server/workers.py).
        self.workers = WorkerPool(config.get("num.io.threads"), queue_max=config.get("queued.max.requests"))

    # ----------------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        now = self.clock()
        dirs = self.config.log_dirs
        for d in dirs:
            os.makedirs(d, exist_ok=True)
        self.store = EmbeddedStore(os.path.join(dirs[0], METADATA_FILE))
        self.topics = TopicStore(self.store)
        self.cluster_id = self._cluster_id()
        self._load_dynamic_broker_configs()
        self.logs = LogManager.open(self._log_manager_config(), now_ms=now,
                                    config_for_topic=self.log_config_for)
        self.logs.ensure_meta_properties(self.broker_id, self.cluster_id)
        for name in self.topics.names():
            info = self.topics.get(name)
            if info is not None:
                self._open_partitions(info, now)
        await start_group_coordinator(self)
        for ep in self.config.listeners:
            listener = Listener(
                self.dispatcher,
                max_request_bytes=self.config.get("socket.request.max.bytes"),
                queued_max_request_bytes=self._queued_bytes_limit(),
                max_connections=self.config.get("max.connections"),
                max_connections_per_ip=self.config.get("max.connections.per.ip"),
                idle_ms=self.config.get("connections.max.idle.ms"),
            )
            port = await listener.start(ep.host, ep.port)
            self.bound_ports[ep.listener_name] = port
            self.listeners.append((listener, ep))
        self._periodic = asyncio.get_running_loop().create_task(self._run_periodic())

    def _queued_bytes_limit(self) -> int:
        limit = self.config.get("queued.max.request.bytes")
        return limit if limit and limit > 0 else 100 * 1024 * 1024

    def _cluster_id(self) -> str:
        path = "/cluster/id"
        if self.store.exists(path):
            return self.store.get(path)[0]["id"]
        cid = _new_cluster_id()
        self.store.create(path, {"version": "1", "id": cid})
        return cid

    def _log_manager_config(self) -> LogManagerConfig:
        c = self.config
        return LogManagerConfig(
            log_dirs=tuple(c.log_dirs),
            retention_check_interval_ms=c.get("log.retention.check.interval.ms"),
            recovery_point_checkpoint_interval_ms=c.get("log.flush.offset.checkpoint.interval.ms"),
            log_start_offset_checkpoint_interval_ms=c.get("log.flush.start.offset.checkpoint.interval.ms"),
            high_watermark_checkpoint_interval_ms=c.get("replica.high.watermark.checkpoint.interval.ms"),
            log_defaults=self.log_config_for(None),
            cleaner=self._cleaner_config(),
        )

    def _cleaner_config(self) -> CleanerConfig:
        c = self.config
        return CleanerConfig(
            enable=c.get("log.cleaner.enable"), threads=c.get("log.cleaner.threads"),
            dedupe_buffer_size=c.get("log.cleaner.dedupe.buffer.size"),
            io_buffer_size=c.get("log.cleaner.io.buffer.size"),
            io_buffer_load_factor=c.get("log.cleaner.io.buffer.load.factor"),
            backoff_ms=c.get("log.cleaner.backoff.ms"),
            io_max_bytes_per_second=c.get("log.cleaner.io.max.bytes.per.second"))

    async def aclose(self) -> None:
        for listener, _ in self.listeners:
            await listener.aclose()
        if self._periodic is not None:
            self._periodic.cancel()
            try:
                await self._periodic
            except asyncio.CancelledError:
                pass
        if self.group_coordinator is not None:
            await self.group_coordinator.aclose()
        if self.logs is not None:
            self.logs.close(self.clock())
            self.logs = None
        self.workers.close()

    async def _run_periodic(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            try:
                self.logs.run_periodic(self.clock())
            except Exception:
                log.exception("periodic log maintenance failed")

    # ----------------------------------------------------------------------------- topics
    def topic_config(self, topic: str) -> TopicConfig:
        tc = self._topic_configs.get(topic)
        if tc is None:
            info = self.topics.get(topic) if self.topics else None
            tc = TopicConfig.resolve(info.configs if info else {}, self.config)
            self._topic_configs[topic] = tc
        return tc

    def log_config_for(self, topic: str | None) -> LogConfig:
        tc = self.topic_config(topic) if topic is not None else TopicConfig.resolve({}, self.config)
        props = {name: tc[name].value_string for name in (
            "segment.bytes", "segment.ms", "segment.index.bytes", "index.interval.bytes", "retention.ms",
            "retention.bytes", "flush.messages", "flush.ms", "file.delete.delay.ms", "cleanup.policy",
            "delete.retention.ms", "min.compaction.lag.ms", "max.compaction.lag.ms",
            "min.cleanable.dirty.ratio")}
        return LogConfig().from_properties(props)

    def topic_by_id(self, topic_id) -> TopicInfo | None:
        """Topic ids resolve through a cache rebuilt from the store whenever it misses or is stale,
        so creations and deletions need no hook here."""
        for attempt in range(2):
            name = self._topic_ids.get(topic_id)
            if name is not None:
                info = self.topics.get(name)
                if info is not None and info.topic_id == topic_id:
                    return info
            if attempt == 0:
                self._topic_ids = {}
                for n in self.topics.names():
                    i = self.topics.get(n)
                    if i is not None:
                        self._topic_ids[i.topic_id] = n
        return None

    def live_broker_ids(self) -> set[int]:
        return {self.broker_id}

    def broker_metadata(self, connection) -> list:
        out = []
        for listener, ep in self.listeners:
            if connection is None or connection.listener is listener:
                adv = self._advertised(ep)
                out.append(metadata_msgs.MetadataResponseBroker(
                    node_id=self.broker_id, host=adv[0], port=adv[1], rack=self.config.get("broker.rack")))
        return out

    def _advertised(self, ep) -> tuple[str, int]:
        for a in self.config.advertised_listeners:
            if a.listener_name == ep.listener_name:
                port = a.port or self.bound_ports.get(ep.listener_name, ep.port)
                return a.host or "localhost", port
        return ep.host or "localhost", self.bound_ports.get(ep.listener_name, ep.port)

    def create_topic(self, name: str, num_partitions: int, replication_factor: int,
                     configs: dict[str, str], assignment: dict[int, list[int]] | None = None,
                     validate_only: bool = False) -> tuple[TopicInfo | None, ErrorCode, str | None]:
        reason = validate_topic_name(name)
        if reason is not None:
            return None, ErrorCode.INVALID_TOPIC_EXCEPTION, reason
        if self.topics.get(name) is not None:
            return None, ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists."
        if "." in name or "_" in name:  # '.' and '_' collide in metric names (Kafka's Topic.unifyCollisionChars)
            unified = name.replace(".", "_")
            other = next((t for t in self.topics.names() if t.replace(".", "_") == unified), None)
            if other is not None:
                return None, ErrorCode.INVALID_TOPIC_EXCEPTION, f"Topic '{name}' collides with existing topic: {other}"
        if assignment is None:
            if num_partitions == -1:
                num_partitions = self.config.get("num.partitions")
            if replication_factor == -1:
                replication_factor = self.config.get("default.replication.factor")
            if num_partitions <= 0:
                return None, ErrorCode.INVALID_PARTITIONS, "Number of partitions must be larger than 0."
            if replication_factor <= 0:
                return None, ErrorCode.INVALID_REPLICATION_FACTOR, "Replication factor must be larger than 0."
            brokers = sorted(self.live_broker_ids())
            if replication_factor > len(brokers):
                return None, ErrorCode.INVALID_REPLICATION_FACTOR, (
                    f"Unable to replicate the partition {replication_factor} time(s): "
                    f"The target replication factor of {replication_factor} cannot be reached because "
                    f"only {len(brokers)} broker(s) are registered.")
            assignment = assign_replicas(brokers, num_partitions, replication_factor)
        try:
            TopicConfig.resolve(configs, self.config)
        except ConfigError as e:
            return None, ErrorCode.INVALID_CONFIG, str(e)
        if validate_only:
            return None, ErrorCode.NONE, None
        info = self.topics.create(name, assignment, configs)
        self._topic_configs.pop(name, None)
        self._open_partitions(info, self.clock())
        log.info("created topic %s with %d partition(s)", name, len(assignment))
        return info, ErrorCode.NONE, None

    async def auto_create_topic(self, name: str) -> tuple[TopicInfo | None, ErrorCode]:
        info, error, _ = self.create_topic(name, -1, -1, {})
        if error == ErrorCode.TOPIC_ALREADY_EXISTS:
            return self.topics.get(name), ErrorCode.NONE
        return info, error

    def _open_partitions(self, info: TopicInfo, now_ms: int) -> None:
        for p, st in info.partitions.items():
            if self.broker_id not in st.replicas or (info.name, p) in self.partitions:
                continue
            log_ = self.logs.get_or_create_log(info.name, p, now_ms, self.log_config_for(info.name))
            self.partitions[(info.name, p)] = Partition(
                info.name, p, log_, leader_epoch=st.leader_epoch, replicas=list(st.replicas),
                isr=list(st.isr), broker_id=self.broker_id,
                producer_id_expiration_ms=self.config.get("producer.id.expiration.ms"))

    def next_producer_id(self) -> int:
        path = "/latest_producer_id_block"
        if self.store.exists(path):
            value, version = self.store.get(path)
            pid = value["next"]
            self.store.set(path, {"next": pid + 1}, version)
        else:
            pid = 0
            self.store.create(path, {"next": 1})
        return pid

    def partition(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    # ----------------------------------------------------------------------------- admin changes
    # Called by apis/admin_*.py after validation; each change is in the store before it takes effect.
    def delete_topic(self, name: str) -> None:
        info = self.topics.get(name)
        now = self.clock()
        for p in (info.partitions if info is not None else ()):
            self.partitions.pop((name, p), None)
            self.logs.delete_log(name, p, now)
            self.purgatory.notify((name, p))
        self.topics.delete(name)
        self._topic_configs.pop(name, None)
        if self.group_coordinator is not None and name != OFFSETS_TOPIC:
            self.group_coordinator.remove_topics({name})
        log.info("deleted topic %s", name)

    def add_partitions(self, name: str, assignment: dict[int, list[int]]) -> TopicInfo:
        info = self.topics.add_partitions(name, assignment)
        self._open_partitions(info, self.clock())
        log.info("topic %s now has %d partition(s)", name, len(info.partitions))
        return info

    def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        """Replace a topic's overrides; produce, fetch and the logs see them at once."""
        self.topics.set_configs(name, configs)
        self._topic_configs.pop(name, None)
        self._reconfigure_logs(name)

    def set_dynamic_broker_configs(self, *, per_broker: dict[str, str] | None = None,
                                   default: dict[str, str] | None = None) -> None:
        """Replace a dynamic layer (`/config/brokers/<id>` or `/config/brokers/<default>`).
        Raises ConfigError, before anything is stored, if the new layer is not allowed."""
        new = self.config.with_dynamic(dynamic_broker=per_broker, dynamic_default=default)
        for entity, layer in ((str(self.broker_id), per_broker), ("<default>", default)):
            if layer is not None:
                path = f"/config/brokers/{entity}"
                value = {"version": 1, "config": dict(layer)}
                if self.store.exists(path):
                    self.store.set(path, value)
                else:
                    self.store.create(path, value)
        self.config = new
        self._topic_configs.clear()
        self._reconfigure_logs(None)
        self.logs.update_cleaner_config(self._cleaner_config())

    def _load_dynamic_broker_configs(self) -> None:
        layers = {}
        for key, entity in (("dynamic_broker", str(self.broker_id)), ("dynamic_default", "<default>")):
            path = f"/config/brokers/{entity}"
            if self.store.exists(path):
                layers[key] = self.store.get(path)[0].get("config", {})
        if layers:
            try:
                self.config = self.config.with_dynamic(**layers)
            except ConfigError as e:
                log.error("ignoring the stored dynamic broker configs: %s", e)

    def _reconfigure_logs(self, topic: str | None) -> None:
        for (t, _), part in self.partitions.items():
            if topic is None or t == topic:
                part.log.update_config(self.log_config_for(t))


def _new_cluster_id() -> str:
    import base64
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
