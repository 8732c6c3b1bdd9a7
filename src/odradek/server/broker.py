"""The broker: configuration, log manager, metadata, partitions, listeners, and their lifecycle.

DESIGN, "How data flows" and "Metadata and the cluster". In embedded mode (the default for
`odradek serve`) the broker is its own controller: topic changes are written to the embedded store,
published in the metadata image (`metadata_cache.py`), and then applied to the replica manager as a
LeaderAndIsr for the partitions this broker hosts.

The broker only wires and runs its collaborators: request handlers get them as a typed context
(`context.py`), never the broker itself (but for the handlers not yet migrated, through `ctx.broker`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from typing import Any, Callable

from odradek.cluster.store import EmbeddedStore
from odradek.cluster.topics import TopicInfo, TopicStore, assign_replicas, validate_topic_name
from odradek.coordinator.runtime import GroupCoordinator
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.headers import RequestHeader
from odradek.protocol.messages import metadata as metadata_msgs
from odradek.server.apis import HANDLERS
from odradek.server.apis.api_versions import supported
from odradek.server.config import BrokerConfig, ConfigError, Endpoint, TopicConfig
from odradek.server.context import RequestContext, Services
from odradek.server.coordinators import Coordinators
from odradek.server.dispatch import Dispatcher
from odradek.server.fetch_session import FetchSessionCache
from odradek.server.metadata_cache import BrokerEndpoint, BrokerRegistration, MetadataCache, MetadataImage
from odradek.server.network import Connection, Listener, RequestPool
from odradek.server.partition import LeaderAndIsrState, Partition, PartitionLog
from odradek.server.purgatory import Purgatory
from odradek.server.replica_manager import ReplicaManager
from odradek.server.workers import WorkerPool
from odradek.storage.config import LogConfig, LogManagerConfig
from odradek.storage.manager import LogManager

log = logging.getLogger("odradek.broker")

METADATA_FILE = "odradek-metadata.json"


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class LocalLogs:
    """The replica manager's `LogProvider` over the broker's LogManager (opened in `Broker.start`)."""

    def __init__(self, log_config_for: Callable[[str], LogConfig], producer_id_expiration_ms: int) -> None:
        self.manager: LogManager | None = None
        self.log_config_for = log_config_for
        self.producer_id_expiration_ms = producer_id_expiration_ms

    def open_log(self, topic: str, partition: int, now_ms: int) -> PartitionLog:
        assert self.manager is not None, "logs are opened by Broker.start"
        log_ = self.manager.get_or_create_log(topic, partition, now_ms, self.log_config_for(topic))
        log_.producer_state.producer_id_expiration_ms = self.producer_id_expiration_ms
        return log_

    def delete_log(self, topic: str, partition: int, now_ms: int) -> None:
        assert self.manager is not None
        self.manager.delete_log(topic, partition, now_ms)


class Broker:
    def __init__(self, config: BrokerConfig, clock: Callable[[], int] = wall_clock_ms) -> None:
        self.clock = clock
        self.broker_id = config.broker_id
        self.controller_id = self.broker_id
        self.metadata = MetadataCache(MetadataImage(config, controller_id=self.broker_id))
        self.local_logs = LocalLogs(self.log_config_for, config.get("producer.id.expiration.ms"))
        self.replica_manager = ReplicaManager(
            self.broker_id, self.local_logs, self.metadata, clock,
            replica_lag_time_max_ms=config.get("replica.lag.time.max.ms"))
        self.fetch_sessions = FetchSessionCache(config.get("max.incremental.fetch.session.cache.slots"))
        self.listeners: list[tuple[Listener, Endpoint]] = []
        self._listener_names: dict[Listener, str] = {}
        self.bound_ports: dict[str, int] = {}
        self.api_versions = supported(HANDLERS)
        # Work that grows with its input runs here, off the event loop (server/workers.py).
        self.workers = WorkerPool(config.get("num.io.threads"), queue_max=config.get("queued.max.requests"))
        self.request_pool = RequestPool(self._queued_bytes_limit(), config.get("queued.max.requests"))
        self.dispatcher = Dispatcher(self.request_context, HANDLERS, self.workers)
        self._periodic: asyncio.Task | None = None
        self.logs: LogManager | None = None
        self.store: EmbeddedStore | None = None
        self.topics: TopicStore | None = None
        self.coordinators = Coordinators(self.broker_id, self.replica_manager, self.metadata, self, clock)
        self.services: Services | None = None

    # ----------------------------------------------------------------------------- collaborators
    @property
    def config(self) -> BrokerConfig:
        return self.metadata.image.config

    @property
    def cluster_id(self) -> str | None:
        return self.metadata.image.cluster_id

    @property
    def purgatory(self) -> Purgatory:
        return self.replica_manager.purgatory

    @property
    def group_coordinator(self) -> GroupCoordinator | None:
        return self.coordinators.group

    def request_context(self, connection: Connection | None, header: RequestHeader) -> RequestContext:
        """The context a handler gets for one request (the dispatcher's factory)."""
        assert self.services is not None, "requests are served only once the broker is started"
        listener = self._listener_names.get(connection.listener) if connection is not None else None
        return RequestContext(self.services, header, connection, listener)

    # ----------------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        now = self.clock()
        dirs = self.config.log_dirs
        for d in dirs:
            os.makedirs(d, exist_ok=True)
        self.store = EmbeddedStore(os.path.join(dirs[0], METADATA_FILE))
        self.topics = TopicStore(self.store)
        self.metadata.update(self.metadata.image.with_cluster_id(self._cluster_id()))
        self._load_dynamic_broker_configs()
        infos = [i for i in (self.topics.get(n) for n in self.topics.names()) if i is not None]
        self.metadata.update(self.metadata.image.with_topics(infos))
        self.logs = LogManager.open(self._log_manager_config(), now_ms=now,
                                    config_for_topic=self.log_config_for)
        self.local_logs.manager = self.logs
        self.logs.ensure_meta_properties(self.broker_id, self.cluster_id)
        for info in infos:
            self._open_partitions(info, now)
        await self.replica_manager.start()
        await self.coordinators.start()
        self.services = Services(
            broker_id=self.broker_id, clock=self.clock, metadata=self.metadata,
            replica_manager=self.replica_manager, coordinators=self.coordinators, controller=self,
            log_dirs=self.logs, workers=self.workers, fetch_sessions=self.fetch_sessions,
            api_versions=self.api_versions, broker=self)
        for ep in self.config.listeners:
            listener = Listener(
                self.dispatcher,
                max_request_bytes=self.config.get("socket.request.max.bytes"),
                pool=self.request_pool,
                max_connections=self.config.get("max.connections"),
                max_connections_per_ip=self.config.get("max.connections.per.ip"),
                idle_ms=self.config.get("connections.max.idle.ms"),
                receive_timeout_ms=self.config.get("socket.request.receive.timeout.ms"),
            )
            port = await listener.start(ep.host, ep.port)
            self.bound_ports[ep.listener_name] = port
            self.listeners.append((listener, ep))
            self._listener_names[listener] = ep.listener_name
        self._publish_registration()
        self._periodic = asyncio.get_running_loop().create_task(self._run_periodic())

    def _queued_bytes_limit(self) -> int:
        """`queued.max.request.bytes`; Kafka's -1 (no pool) is 100 MiB here: a broker always bounds
        the memory its requests hold. Never below one request of `socket.request.max.bytes`."""
        limit = self.config.get("queued.max.request.bytes")
        limit = limit if limit and limit > 0 else 100 * 1024 * 1024
        return max(limit, self.config.get("socket.request.max.bytes"))

    def _publish_registration(self) -> None:
        """This broker, with its advertised endpoints, is the one live broker of the image."""
        endpoints = tuple(BrokerEndpoint(ep.listener_name, *self._advertised(ep)) for _, ep in self.listeners)
        me = BrokerRegistration(self.broker_id, endpoints, self.config.get("broker.rack"))
        self.metadata.update(self.metadata.image.with_brokers({self.broker_id: me}, self.controller_id))

    def _cluster_id(self) -> str:
        assert self.store is not None
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
        )

    async def aclose(self) -> None:
        for listener, _ in self.listeners:
            await listener.aclose()
        if self._periodic is not None:
            self._periodic.cancel()
            try:
                await self._periodic
            except asyncio.CancelledError:
                pass
        await self.coordinators.aclose()
        await self.replica_manager.aclose()
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
        return self.metadata.topic_config(topic)

    def log_config_for(self, topic: str | None) -> LogConfig:
        tc = self.metadata.topic_config(topic)
        props = {name: tc[name].value_string for name in (
            "segment.bytes", "segment.ms", "segment.index.bytes", "index.interval.bytes", "retention.ms",
            "retention.bytes", "flush.messages", "flush.ms", "file.delete.delay.ms", "cleanup.policy")}
        return LogConfig().from_properties(props)

    def topic_by_id(self, topic_id: Any) -> TopicInfo | None:
        return self.metadata.topic_by_id(topic_id)

    def live_broker_ids(self) -> set[int]:
        return set(self.metadata.image.live_broker_ids())

    def broker_metadata(self, connection: Connection | None) -> list:
        """Live brokers on the connection's listener, for the handlers not yet migrated."""
        name = self._listener_names.get(connection.listener) if connection is not None else None
        return [metadata_msgs.MetadataResponseBroker(node_id=b.broker_id, host=e.host, port=e.port, rack=b.rack)
                for b, e in self.metadata.image.alive_endpoints(name)]

    def _advertised(self, ep: Endpoint) -> tuple[str, int]:
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
        self.metadata.update(self.metadata.image.with_topics([info]))
        self._open_partitions(info, self.clock())
        log.info("created topic %s with %d partition(s)", name, len(assignment))
        return info, ErrorCode.NONE, None

    async def auto_create_topic(self, name: str) -> tuple[TopicInfo | None, ErrorCode]:
        info, error, _ = self.create_topic(name, -1, -1, {})
        if error == ErrorCode.TOPIC_ALREADY_EXISTS:
            return self.topics.get(name), ErrorCode.NONE
        return info, error

    def _open_partitions(self, info: TopicInfo, now_ms: int) -> None:
        """The embedded controller's LeaderAndIsr to this broker: the partitions it hosts and does
        not have yet."""
        self.replica_manager.apply_leader_and_isr(
            [LeaderAndIsrState(info.name, p, st.leader, st.leader_epoch, tuple(st.isr), tuple(st.replicas))
             for p, st in info.partitions.items()
             if self.broker_id in st.replicas and self.replica_manager.get_partition(info.name, p) is None],
            now_ms)

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
        return self.replica_manager.get_partition(topic, index)

    # ----------------------------------------------------------------------------- admin changes
    # Called by apis/admin_*.py after validation; each change is in the store before it takes effect.
    def delete_topic(self, name: str) -> None:
        info = self.topics.get(name)
        self.replica_manager.stop_replicas([(name, p) for p in (info.partitions if info is not None else ())],
                                           delete=True, now_ms=self.clock())
        self.topics.delete(name)
        self.metadata.update(self.metadata.image.without_topics([name]))
        self.coordinators.topics_deleted({name})
        log.info("deleted topic %s", name)

    def add_partitions(self, name: str, assignment: dict[int, list[int]]) -> TopicInfo:
        info = self.topics.add_partitions(name, assignment)
        self.metadata.update(self.metadata.image.with_topics([info]))
        self._open_partitions(info, self.clock())
        log.info("topic %s now has %d partition(s)", name, len(info.partitions))
        return info

    def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        """Replace a topic's overrides; produce, fetch and the logs see them at once."""
        self.topics.set_configs(name, configs)
        info = self.topics.get(name)
        if info is not None:
            self.metadata.update(self.metadata.image.with_topics([info]))
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
        self.metadata.update(self.metadata.image.with_config(new))
        self._reconfigure_logs(None)

    def _load_dynamic_broker_configs(self) -> None:
        layers = {}
        for key, entity in (("dynamic_broker", str(self.broker_id)), ("dynamic_default", "<default>")):
            path = f"/config/brokers/{entity}"
            if self.store.exists(path):
                layers[key] = self.store.get(path)[0].get("config", {})
        if layers:
            try:
                self.metadata.update(self.metadata.image.with_config(self.config.with_dynamic(**layers)))
            except ConfigError as e:
                log.error("ignoring the stored dynamic broker configs: %s", e)

    def _reconfigure_logs(self, topic: str | None) -> None:
        for part in self.replica_manager.partitions():
            if topic is None or part.topic == topic:
                part.log.update_config(self.log_config_for(part.topic))  # type: ignore[attr-defined]


def _new_cluster_id() -> str:
    import base64
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
