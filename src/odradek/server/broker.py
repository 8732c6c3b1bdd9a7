"""The broker: it builds its collaborators, starts them in order, serves its listeners and stops them
(DESIGN, "Layers", "How data flows" and "Metadata and the cluster").

Collaborators, and who owns what:
- `metadata` (`metadata_cache.py`): the immutable image handlers read: cluster id, live brokers and
  their endpoints, topics, this broker's effective config;
- `replica_manager` (`replica_manager.py`): the partitions hosted here, their logs, the high
  watermark, delayed produce and fetch;
- `controller` (`embedded_controller.py`): in embedded mode (the default for `odradek serve`) the
  broker is its own controller: the cluster controller (`cluster/controller.py`) decides and records
  changes in the embedded store, and this channel applies them here (logs, LeaderAndIsr to the replica
  manager, the image);
- `coordinators` (`coordinators.py`): the group coordinator runtime over `__consumer_offsets`;
- `workers`: the bounded worker pool; `dispatcher` and the listeners: the network side.
Request handlers get these as a typed context (`context.py`), never the broker itself.

Start order: store and controller, finished deletions, the log manager, partitions opened and
published, the ISR expiration task, the coordinators, then the listeners, and the broker registered
with its bound endpoints. Stop: listeners, controller changes under way, periodic work, coordinators,
replica manager, logs, store, worker pool.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import time
import uuid
from typing import TYPE_CHECKING, Callable

from odradek.cluster.controller import Controller
from odradek.cluster.registration import Endpoint as RegisteredEndpoint
from odradek.cluster.store import EmbeddedStore, MetadataStore, NodeExistsError
from odradek.coordinator.runtime import GroupCoordinator
from odradek.protocol.headers import RequestHeader
from odradek.server.apis import HANDLERS
from odradek.server.apis.api_versions import disabled_extensions, enabled_handlers, supported
from odradek.server.apis.consumer_group_assign import answer_disabled
from odradek.server.config import BrokerConfig, Endpoint, TopicConfig
from odradek.server.context import RequestContext, Services
from odradek.server.coordinators import Coordinators
from odradek.server.dispatch import Dispatcher
from odradek.server.embedded_controller import EmbeddedController, cleaner_config, log_config
from odradek.server.fetch_session import FetchSessionCache
from odradek.server.metadata_cache import BrokerEndpoint, BrokerRegistration, MetadataCache, MetadataImage
from odradek.server.network import Connection, Listener, RequestPool
from odradek.server.partition import PartitionLog
from odradek.server.replica_manager import ReplicaManager
from odradek.server.workers import WorkerPool
from odradek.server.zk_cluster import ZkCluster
from odradek.storage.config import LONG_MAX, LogConfig, LogManagerConfig
from odradek.storage.manager import LogManager
from odradek.storage.page_cache import resolve_keep_bytes

if TYPE_CHECKING:
    from odradek.cluster.zookeeper_store import ZooKeeperStore

log = logging.getLogger("odradek.broker")

CLUSTER_ID_PATH = "/cluster/id"


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
        log_ = self.manager.get_log(topic, partition)
        if log_ is None:
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
        self.metadata = MetadataCache(MetadataImage(config, controller_id=self.broker_id, brokers={
            self.broker_id: BrokerRegistration(self.broker_id, ())}))
        self.local_logs = LocalLogs(self._new_log_config, config.get("producer.id.expiration.ms"))
        self.replica_manager = ReplicaManager(
            self.broker_id, self.local_logs, self.metadata, clock,
            replica_lag_time_max_ms=config.get("replica.lag.time.max.ms"),
            follower_cache_keep_bytes=resolve_keep_bytes(config.get("replica.drop.behind.bytes"),
                                                         key="replica.drop.behind.bytes",
                                                         logs="each follower replica's log"))
        self.fetch_sessions = FetchSessionCache(config.get("max.incremental.fetch.session.cache.slots"))
        self.listeners: list[tuple[Listener, Endpoint]] = []
        self._listener_names: dict[Listener, str] = {}
        self.bound_ports: dict[str, int] = {}
        handlers = enabled_handlers(HANDLERS, config.get("group.coordinator.rebalance.protocols"),
                                    config.get("group.consumer.client.assignors.enable"))
        self.api_versions = supported(handlers)
        handlers = disabled_extensions(handlers, answer_disabled)
        # Work that grows with its input runs here, off the event loop (server/workers.py).
        self.workers = WorkerPool(config.get("num.io.threads"), queue_max=config.get("queued.max.requests"))
        self.request_pool = RequestPool(self._queued_bytes_limit(), config.get("queued.max.requests"))
        self.dispatcher = Dispatcher(self.request_context, handlers, self.workers)
        self._periodic: asyncio.Task[None] | None = None
        self.logs: LogManager | None = None
        self.store: EmbeddedStore | ZooKeeperStore | None = None
        self.controller: EmbeddedController | None = None
        self.coordinators: Coordinators | None = None
        self.services: Services | None = None

    # ----------------------------------------------------------------------------- collaborators
    @property
    def config(self) -> BrokerConfig:
        return self.metadata.image.config

    @property
    def cluster_id(self) -> str | None:
        return self.metadata.image.cluster_id

    @property
    def group_coordinator(self) -> GroupCoordinator | None:
        return self.coordinators.group if self.coordinators is not None else None

    def request_context(self, connection: Connection | None, header: RequestHeader) -> RequestContext:
        """The context a handler gets for one request (the dispatcher's factory)."""
        assert self.services is not None, "requests are served only once the broker is started"
        listener = self._listener_names.get(connection.listener) if connection is not None else None
        return RequestContext(self.services, header, connection, listener)

    # ----------------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        if self.config.get("zookeeper.connect"):
            await self._start_in_cluster()
            return
        now = self.clock()
        dirs = self.config.log_dirs
        for d in dirs:
            os.makedirs(d, exist_ok=True)
        store = self.store = EmbeddedStore.open(dirs[0])
        cluster = Controller(store, self.broker_id)
        pending_deletions = cluster.start()
        config = EmbeddedController.load_dynamic_broker_configs(store, self.broker_id, self.config)
        # The image starts as the store has it: the logs about to be opened take their topics' configs
        # from it (nothing is served before the listeners start).
        durable = [i for i in (cluster.image.get(n) for n in cluster.image.names()) if i is not None]
        self.metadata.update(self.metadata.image.with_cluster_id(_cluster_id(store)).with_config(config)
                             .with_topics(durable))
        if pending_deletions:
            EmbeddedController.finish_deletions_at_start(cluster, self.config.log_dirs, pending_deletions)
        logs = self.logs = LogManager.open(self._log_manager_config(), now_ms=now, config_for_topic=self.log_config_for)
        self.local_logs.manager = logs
        logs.ensure_meta_properties(self.broker_id, self.cluster_id)
        controller = EmbeddedController(
            self.broker_id, store, cluster, logs, self.replica_manager, self.metadata, self.workers, self.clock)
        controller.open_all(now)
        await self._serve(controller, logs)
        self._periodic = asyncio.get_running_loop().create_task(self._run_periodic(logs))

    async def _serve(self, controller: EmbeddedController, logs: LogManager) -> None:
        """The replica manager's ISR port, the coordinators, the handlers' services, the listeners."""
        self.controller = controller
        self.replica_manager.alter_partition = controller
        await self.replica_manager.start()
        channels = controller.channels if isinstance(controller, ZkCluster) else None   # markers to leaders
        coordinators = self.coordinators = Coordinators(
            self.broker_id, self.replica_manager, self.metadata, controller, self.clock, channels)
        await coordinators.start()
        self.services = Services(
            broker_id=self.broker_id, clock=self.clock, metadata=self.metadata,
            replica_manager=self.replica_manager, coordinators=coordinators, controller=controller,
            log_dirs=logs, workers=self.workers, fetch_sessions=self.fetch_sessions,
            api_versions=self.api_versions)
        await self._start_listeners()

    async def _start_in_cluster(self) -> None:
        """A broker of a cluster on ZooKeeper (`zk_cluster.py`): the store is the ensemble; partitions
        open when the controller's LeaderAndIsr names them; registration once the listeners are bound."""
        from odradek.cluster.zookeeper_store import ZooKeeperStore   # kazoo: the `zookeeper` extra
        loop = asyncio.get_running_loop()
        c = self.config
        for d in c.log_dirs:
            os.makedirs(d, exist_ok=True)
        store = ZooKeeperStore(c.get("zookeeper.connect"), c.get("zookeeper.session.timeout.ms"),
                               c.get("zookeeper.connection.timeout.ms"))
        await loop.run_in_executor(None, store.start)
        self.store = store
        await loop.run_in_executor(None, Controller(store, self.broker_id).start)
        config = await loop.run_in_executor(
            None, EmbeddedController.load_dynamic_broker_configs, store, self.broker_id, self.config)
        cluster_id = await loop.run_in_executor(None, _cluster_id, store)
        image = self.metadata.image.with_cluster_id(cluster_id).with_config(config)
        self.metadata.update(image.with_brokers(image.brokers, -1))
        self.controller_id = -1
        logs = self.logs = LogManager.open(self._log_manager_config(), now_ms=self.clock(),
                                           config_for_topic=self.log_config_for)
        self.local_logs.manager = logs
        logs.ensure_meta_properties(self.broker_id, self.cluster_id)
        cluster = ZkCluster(self.broker_id, store, logs, self.replica_manager, self.metadata, self.workers, self.clock)
        self.metadata.expect_controller()
        await self._serve(cluster, logs)
        protocols = self.config.get("listener.security.protocol.map") or ""
        protocol_of = dict(item.split(":", 1) for item in protocols.split(",") if ":" in item)
        endpoints = []
        for _, ep in self.listeners:
            host, port = self._advertised(ep)
            endpoints.append(RegisteredEndpoint(ep.listener_name, host, port,
                                                protocol_of.get(ep.listener_name, "PLAINTEXT")))
        await cluster.join(endpoints, self.config.get("broker.rack"))
        self._periodic = loop.create_task(self._run_periodic(logs))

    async def _start_listeners(self) -> None:
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
        # This broker, with its advertised endpoints, is the one live broker of the image.
        endpoints = tuple(BrokerEndpoint(ep.listener_name, *self._advertised(ep)) for _, ep in self.listeners)
        me = BrokerRegistration(self.broker_id, endpoints, self.config.get("broker.rack"))
        brokers = {**self.metadata.image.brokers, self.broker_id: me}
        self.metadata.update(self.metadata.image.with_brokers(brokers, self.metadata.image.controller_id))

    def _queued_bytes_limit(self) -> int:
        """`queued.max.request.bytes`; Kafka's -1 (no pool) is 100 MiB here: a broker always bounds
        the memory its requests hold. Never below one request of `socket.request.max.bytes`."""
        limit: int = self.config.get("queued.max.request.bytes")
        limit = limit if limit and limit > 0 else 100 * 1024 * 1024
        return max(limit, self.config.get("socket.request.max.bytes"))

    def _log_manager_config(self) -> LogManagerConfig:
        return log_manager_config(self.config, self.log_config_for(None))

    def _advertised(self, ep: Endpoint) -> tuple[str, int]:
        for a in self.config.advertised_listeners:
            if a.listener_name == ep.listener_name:
                port = a.port or self.bound_ports.get(ep.listener_name, ep.port)
                return a.host or "localhost", port
        return ep.host or "localhost", self.bound_ports.get(ep.listener_name, ep.port)

    def log_config_for(self, topic: str | None) -> LogConfig:
        return log_config(self.metadata.topic_config(topic))

    def _new_log_config(self, topic: str) -> LogConfig:
        """A new log's config: its topic as the controller has it (the image may not show it yet)."""
        info = self.controller.controller.image.get(topic) if self.controller is not None else None
        return log_config(TopicConfig.resolve_stored(info.configs, self.config, topic)) if info is not None \
            else self.log_config_for(topic)

    async def aclose(self) -> None:
        if isinstance(self.controller, ZkCluster):    # leadership moves off before the listeners close
            await self.controller.shutdown()
        for listener, _ in self.listeners:
            await listener.aclose()
        if self.controller is not None:     # changes under way finish before the logs close
            await self.controller.aclose()
        if self._periodic is not None:
            self._periodic.cancel()
            try:
                await self._periodic
            except asyncio.CancelledError:
                pass
        if self.coordinators is not None:
            await self.coordinators.aclose()
        await self.replica_manager.aclose()
        if self.logs is not None:
            self.logs.close(self.clock(), self.config.get("num.recovery.threads.per.data.dir"))
            self.logs = None
        if self.store is not None:
            self.store.close()
        self.workers.close()

    async def _run_periodic(self, logs: LogManager) -> None:
        while True:
            await asyncio.sleep(0.1)
            try:
                logs.run_periodic(self.clock())
            except Exception:
                log.exception("periodic log maintenance failed")


def log_manager_config(c: BrokerConfig, log_defaults: LogConfig) -> LogManagerConfig:
    """The log manager's config from the broker's: any value the definitions accept builds one."""
    return LogManagerConfig(
        log_dirs=tuple(c.log_dirs),
        retention_check_interval_ms=c.get("log.retention.check.interval.ms"),
        recovery_point_checkpoint_interval_ms=_period_ms(c.get("log.flush.offset.checkpoint.interval.ms")),
        log_start_offset_checkpoint_interval_ms=_period_ms(c.get("log.flush.start.offset.checkpoint.interval.ms")),
        high_watermark_checkpoint_interval_ms=_period_ms(c.get("replica.high.watermark.checkpoint.interval.ms")),
        log_defaults=log_defaults,
        cleaner=cleaner_config(c),
        move_max_bytes_per_second=c.get("replica.alter.log.dirs.io.max.bytes.per.second"),
        move_quota_window_num=c.get("alter.log.dirs.replication.quota.window.num"),
        move_quota_window_size_seconds=c.get("alter.log.dirs.replication.quota.window.size.seconds"),
        drop_behind_bytes=resolve_keep_bytes(c.get("log.drop.behind.bytes")),
    )


def _period_ms(value: int) -> int:
    """A checkpoint interval as Kafka's scheduler reads it: 0 or less (which the definitions allow) is no
    periodic run; the checkpoints are still written at shutdown."""
    return value if value > 0 else LONG_MAX


def _cluster_id(store: MetadataStore) -> str:
    if store.exists(CLUSTER_ID_PATH):
        value: str = store.get(CLUSTER_ID_PATH)[0]["id"]
        return value
    cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    try:
        store.create(CLUSTER_ID_PATH, {"version": "1", "id": cid})
    except NodeExistsError:          # another broker of the cluster made it first
        return _cluster_id(store)
    return cid
