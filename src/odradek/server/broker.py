"""The broker: configuration, log manager, metadata, partitions, listeners, and their lifecycle.

DESIGN, "How data flows" and "Metadata and the cluster". In embedded mode (the default for
`odradek serve`) the broker is its own controller (`cluster/controller.py`): the controller decides and
records topic changes in the embedded store; the broker applies them to its logs and partitions.

Topic changes, and what a crash (kill -9) at any point leaves:
- creation: logs are created first (in slices, so the event loop keeps serving), then every node of
  the request's topics is written in one multi (on the worker pool), then partitions are opened and the
  topics published. Before the write: the topics are absent and their empty logs are strays, removed
  at the next start. After it: the topics are complete and missing logs are created at start.
- deletion: the deletion is recorded (`/admin/delete_topics/<t>`) and the topics leave the image, then
  their logs are removed and the log dirs fsynced once, then the topics' nodes are removed. A marked
  deletion is completed at the next start before any partition is opened: a deleted topic never
  returns.
A failed store or log-dir write (ENOSPC, EIO) is answered with KAFKA_STORAGE_ERROR per topic and leaves
nothing behind, so every name can be created once space returns. Controller changes run one at a time
(`controller_lock`); requests that only read the image never wait for them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Awaitable, Callable, TypeVar

from odradek.cluster.controller import Controller
from odradek.cluster.store import Create, EmbeddedStore, Op, SetData, StoreError
from odradek.cluster.topics import TopicInfo
from odradek.coordinator.records import OFFSETS_TOPIC
from odradek.protocol.error_codes import ErrorCode, KafkaApiError
from odradek.protocol.messages import metadata as metadata_msgs
from odradek.server.apis import HANDLERS
from odradek.server.apis.api_versions import supported
from odradek.server.apis.groups import start_group_coordinator
from odradek.server.config import BrokerConfig, ConfigError, TopicConfig
from odradek.server.dispatch import Dispatcher
from odradek.server.fetch_session import FetchSessionCache
from odradek.server.network import Listener, RequestPool
from odradek.server.partition import Partition
from odradek.server.purgatory import Purgatory
from odradek.server.slices import Slices, run_now, run_sliced
from odradek.server.workers import WorkerPool
from odradek.storage.checkpoints import fsync_dir
from odradek.storage.config import CleanerConfig, LogConfig, LogManagerConfig
from odradek.storage.errors import StorageError
from odradek.storage.manager import LogManager

log = logging.getLogger("odradek.broker")
T = TypeVar("T")



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
        self.controller: Controller | None = None
        # One controller change at a time (Kafka's controller is one event queue); readers never wait.
        self.controller_lock = asyncio.Lock()
        self._controller_tasks: set[asyncio.Task] = set()
        self._producer_id_lock = asyncio.Lock()
        self.cluster_id: str | None = None
        self._topic_configs: dict[str, TopicConfig] = {}
        self.group_coordinator = None   # odradek.coordinator.runtime.GroupCoordinator, from start()
        # Work that grows with its input runs here, off the event loop (server/workers.py).
        self.workers = WorkerPool(config.get("num.io.threads"), queue_max=config.get("queued.max.requests"))
        self.request_pool = RequestPool(self._queued_bytes_limit(), config.get("queued.max.requests"))

    # ----------------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        now = self.clock()
        dirs = self.config.log_dirs
        for d in dirs:
            os.makedirs(d, exist_ok=True)
        self.store = EmbeddedStore.open(dirs[0])
        self.controller = Controller(self.store, self.broker_id)
        pending_deletions = self.controller.start()
        self.cluster_id = self._cluster_id()
        self._load_dynamic_broker_configs()
        if pending_deletions:
            self._finish_deletions_at_start(pending_deletions)
        self.logs = LogManager.open(self._log_manager_config(), now_ms=now,
                                    config_for_topic=self.log_config_for)
        self.logs.ensure_meta_properties(self.broker_id, self.cluster_id)
        self._remove_stray_logs(now)
        for name in self.topics.names():
            run_now(self._open_partitions(self.topics.get(name), now))
        await start_group_coordinator(self)
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
        self._periodic = asyncio.get_running_loop().create_task(self._run_periodic())

    def _queued_bytes_limit(self) -> int:
        """`queued.max.request.bytes`; Kafka's -1 (no pool) is 100 MiB here: a broker always bounds
        the memory its requests hold. Never below one request of `socket.request.max.bytes`."""
        limit = self.config.get("queued.max.request.bytes")
        limit = limit if limit and limit > 0 else 100 * 1024 * 1024
        return max(limit, self.config.get("socket.request.max.bytes"))

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
        if self._controller_tasks:     # changes under way finish before the logs close
            await asyncio.gather(*self._controller_tasks, return_exceptions=True)
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
        if self.store is not None:
            self.store.close()
        self.workers.close()

    async def _run_periodic(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            try:
                self.logs.run_periodic(self.clock())
            except Exception:
                log.exception("periodic log maintenance failed")

    # ----------------------------------------------------------------------------- topics (reads)
    @property
    def topics(self):
        """The topic image (`cluster.topics.TopicImage`): what request handlers read."""
        return self.controller.image if self.controller is not None else None

    def topic_config(self, topic: str) -> TopicConfig:
        tc = self._topic_configs.get(topic)
        if tc is None:
            info = self.topics.get(topic) if self.topics is not None else None
            tc = TopicConfig.resolve(info.configs if info else {}, self.config)
            self._topic_configs[topic] = tc
        return tc

    def log_config_for(self, topic: str | None) -> LogConfig:
        tc = self.topic_config(topic) if topic is not None else TopicConfig.resolve({}, self.config)
        return _log_config(tc)

    def topic_by_id(self, topic_id) -> TopicInfo | None:
        return self.topics.by_id(topic_id)

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

    def partition(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    def topic_defaults(self) -> tuple[int, int]:
        """(num.partitions, default.replication.factor): what -1 means in a creation."""
        return self.config.get("num.partitions"), self.config.get("default.replication.factor")

    # ----------------------------------------------------------------------------- topic changes
    async def controller_call(self, change: Callable[..., Awaitable[T]], *args: object) -> T:
        """Run a controller change (`change(*args)`, which takes `controller_lock`) as a task of the
        broker, to its end even if the request that asked for it goes away: a client that closes its
        connection cancels its request, and a change cut short between its store write and the image
        would leave a topic recorded but never served. The request waits for it, shielded."""
        task = asyncio.get_running_loop().create_task(change(*args))
        self._controller_tasks.add(task)
        task.add_done_callback(self._controller_tasks.discard)
        return await asyncio.shield(task)

    # The handlers plan with the controller while holding `controller_lock` and call these to apply.
    async def create_topics(self, infos: list[TopicInfo]) -> None:
        """Make planned topics real: logs, one store write, partitions, then the image. Raises
        KafkaApiError(KAFKA_STORAGE_ERROR) for all of them if a write fails; nothing is left then."""
        created: list[tuple[str, int]] = []
        slices = Slices()
        try:
            try:
                for info in infos:
                    await run_sliced(self._create_logs(info, created), slices)
            except (OSError, StorageError) as e:
                raise _storage_error(f"Cannot create a log of {_names(infos)}: {_reason(e)}") from e
            try:
                await self.workers.run(self._commit_creations, infos)
            except StoreError as e:
                raise _storage_error(f"Cannot record {_names(infos)}: {e}") from e
        except BaseException:
            self._discard_logs(created)
            self.controller.release(i.name for i in infos)
            raise
        now = self.clock()
        for info in infos:
            await run_sliced(self._open_partitions(info, now), slices)
            self._topic_configs.pop(info.name, None)
            self.controller.publish(info)
            log.info("created topic %s with %d partition(s)", info.name, len(info.partitions))

    def _commit_creations(self, infos: list[TopicInfo]) -> None:
        self.controller.commit(self.controller.creation_ops(infos))

    def create_topic(self, name: str, num_partitions: int, replication_factor: int,
                     configs: dict[str, str]) -> tuple[TopicInfo | None, ErrorCode, str | None]:
        """Create a small internal topic at once, without yielding (the offsets topic on the first
        FindCoordinator): the same steps as `create_topics`, for callers that cannot await."""
        try:
            TopicConfig.resolve(configs, self.config)
            info = self.controller.plan_topic(name, num_partitions, replication_factor, None, configs,
                                              self.live_broker_ids(), self.topic_defaults())
        except ConfigError as e:
            return None, ErrorCode.INVALID_CONFIG, str(e)
        except KafkaApiError as e:
            return None, e.code, e.detail
        created: list[tuple[str, int]] = []
        try:
            run_now(self._create_logs(info, created))
            self._commit_creations([info])
        except (OSError, StorageError, StoreError) as e:
            self._discard_logs(created)
            self.controller.release([name])
            return None, ErrorCode.KAFKA_STORAGE_ERROR, f"Cannot create topic {name}: {e}"
        run_now(self._open_partitions(info, self.clock()))
        self._topic_configs.pop(name, None)
        self.controller.publish(info)
        log.info("created topic %s with %d partition(s)", name, len(info.partitions))
        return info, ErrorCode.NONE, None

    async def add_partitions(self, plans: list[tuple[TopicInfo, TopicInfo]]) -> None:
        """(current, planned) per topic: new logs, one store write, then partitions and the image.
        Raises KafkaApiError(KAFKA_STORAGE_ERROR) if a write fails; nothing is left then."""
        created: list[tuple[str, int]] = []
        slices = Slices()
        try:
            try:
                for _, new in plans:
                    await run_sliced(self._create_logs(new, created), slices)
                await self.workers.run(self._commit_partitions, plans)
            except (OSError, StorageError, StoreError) as e:
                raise _storage_error(f"Cannot add partitions to {_names(n for _, n in plans)}: "
                                     f"{_reason(e)}") from e
        except BaseException:
            self._discard_logs(created)
            raise
        now = self.clock()
        for _, new in plans:
            await run_sliced(self._open_partitions(new, now), slices)
            info = self.controller.publish_partitions(new)
            if info.configs != new.configs:     # changed while the logs were being created
                self._topic_configs.pop(info.name, None)
                self._reconfigure_logs(info.name)
            log.info("topic %s now has %d partition(s)", info.name, len(info.partitions))

    def _commit_partitions(self, plans: list[tuple[TopicInfo, TopicInfo]]) -> None:
        self.controller.commit(self.controller.partition_ops(plans))

    async def delete_topics(self, infos: list[TopicInfo]) -> None:
        """Record the deletions (KafkaApiError(KAFKA_STORAGE_ERROR) if that fails: nothing changed),
        take the topics out of service, remove their logs, then their nodes."""
        try:
            await self.workers.run(self._commit_deletion_marks, infos)
        except StoreError as e:
            raise _storage_error(f"Cannot record the deletion of {_names(infos)}: {e}") from e
        names = [i.name for i in infos]
        self.controller.unpublish(names)
        for info in infos:
            self._stop_topic(info)
            log.info("deleting topic %s", info.name)
        await self._finish_deletions(names)

    def _commit_deletion_marks(self, infos: list[TopicInfo]) -> None:
        self.controller.commit(self.controller.deletion_mark_ops(infos))

    async def retry_pending_deletions(self) -> None:
        """Finish deletions whose last write failed before (a full disk); call with controller_lock."""
        if self.controller.pending_deletions:
            await self._finish_deletions(sorted(self.controller.pending_deletions))

    async def _finish_deletions(self, names: list[str]) -> None:
        try:
            dirs: set = set()
            await run_sliced(self._delete_logs(set(names), dirs))
            await self.workers.run(_fsync_dirs, dirs)
            await self.workers.run(self.controller.complete_deletions, names)
        except (OSError, StorageError, StoreError) as e:
            log.warning("the deletion of %s is not finished (tried again before the next topic change "
                        "and at start): %s", _names(names), e)
            return
        self.controller.finish_deletions(names)
        for name in names:
            log.info("deleted topic %s", name)

    def _finish_deletions_at_start(self, names: list[str]) -> None:
        """Deletions a crash interrupted, finished before any log is loaded: the topics' partition
        dirs are renamed away (the log manager then removes them unread), then their nodes go."""
        try:
            LogManager.delete_topic_dirs(self.config.log_dirs, set(names))
            self.controller.complete_deletions(names)
        except (OSError, StorageError, StoreError) as e:
            log.warning("the deletion of %s is not finished: %s", _names(names), e)
            return
        self.controller.finish_deletions(names)
        log.info("finished the deletion of %s", _names(names))

    def _stop_topic(self, info: TopicInfo) -> None:
        for p in info.partitions:
            self.partitions.pop((info.name, p), None)
            self.purgatory.notify((info.name, p))
        self._topic_configs.pop(info.name, None)
        if self.group_coordinator is not None and info.name != OFFSETS_TOPIC:
            self.group_coordinator.remove_topics({info.name})

    def _remove_stray_logs(self, now_ms: int) -> None:
        """Logs of no topic in the image: empty ones are what a crash during a creation leaves (the
        logs come before the store write) and are removed; others are reported and left alone."""
        dirs: set = set()
        for (topic, p), log_ in self.logs.logs():
            info = self.topics.get(topic)
            if info is not None and p in info.partitions:
                continue
            if log_.log_end_offset == 0:
                dirs.add(self.logs.log_dir_of(topic, p))
                self.logs.delete_log(topic, p, now_ms, sync=False)
            else:
                log.warning("log %s-%d belongs to no topic; it is left as it is", topic, p)
        _fsync_dirs(dirs)

    # ---- steps run in slices (`run_sliced`) or at once (`run_now`): each yields after every partition
    def _create_logs(self, info: TopicInfo, created: list[tuple[str, int]]) -> Iterator[None]:
        config = _log_config(TopicConfig.resolve(info.configs, self.config))
        now = self.clock()
        for p, st in info.partitions.items():
            if self.broker_id in st.replicas and self.logs.get_log(info.name, p) is None:
                self.logs.get_or_create_log(info.name, p, now, config)
                created.append((info.name, p))
            yield

    def _open_partitions(self, info: TopicInfo, now_ms: int) -> Iterator[None]:
        config = None
        for p, st in info.partitions.items():
            if self.broker_id in st.replicas and (info.name, p) not in self.partitions:
                log_ = self.logs.get_log(info.name, p)
                if log_ is None:
                    if config is None:
                        config = _log_config(TopicConfig.resolve(info.configs, self.config))
                    log_ = self.logs.get_or_create_log(info.name, p, now_ms, config)
                self.partitions[(info.name, p)] = Partition(
                    info.name, p, log_, leader_epoch=st.leader_epoch, replicas=list(st.replicas),
                    isr=list(st.isr), broker_id=self.broker_id,
                    producer_id_expiration_ms=self.config.get("producer.id.expiration.ms"))
            yield

    def _delete_logs(self, names: set[str], dirs: set) -> Iterator[None]:
        """Every log of these topics (not only the partitions the store lists: a crash may have
        left more); the log dirs to fsync go into `dirs`."""
        doomed = [tp for tp, _ in self.logs.logs() if tp[0] in names]
        for topic, p in doomed:
            dirs.add(self.logs.log_dir_of(topic, p))
            self.logs.delete_log(topic, p, self.clock(), sync=False)
            yield

    def _discard_logs(self, created: list[tuple[str, int]]) -> None:
        """Undo the logs of a creation that failed (they are empty and were never served)."""
        now = self.clock()
        for topic, p in created:
            try:
                self.logs.delete_log(topic, p, now)
            except (OSError, StorageError) as e:   # an empty stray: removed at the next start
                log.warning("could not remove the log %s-%d of a failed creation: %s", topic, p, e)

    # ----------------------------------------------------------------------------- producer ids
    async def next_producer_id(self) -> int:
        """An id from the block in hand; a new block (one store write, on the worker pool) when it
        is used up. Raises StoreError if no block can be claimed."""
        ids = self.controller.producer_ids
        pid = ids.next_id()
        while pid is None:
            async with self._producer_id_lock:
                pid = ids.next_id()
                if pid is None:
                    ids.install(await self.workers.run(ids.claim_block))
                    pid = ids.next_id()
        return pid

    # ----------------------------------------------------------------------------- config changes
    def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        """Replace a topic's overrides; produce, fetch and the logs see them at once."""
        try:
            self.controller.set_topic_configs(name, configs)
        except StoreError as e:
            raise _storage_error(f"Cannot record the configs of {name}: {e}") from e
        self._topic_configs.pop(name, None)
        self._reconfigure_logs(name)

    def set_dynamic_broker_configs(self, *, per_broker: dict[str, str] | None = None,
                                   default: dict[str, str] | None = None) -> None:
        """Replace a dynamic layer (`/config/brokers/<id>` or `/config/brokers/<default>`).
        Raises ConfigError, before anything is stored, if the new layer is not allowed."""
        new = self.config.with_dynamic(dynamic_broker=per_broker, dynamic_default=default)
        ops: list[Op] = []
        for entity, layer in ((str(self.broker_id), per_broker), ("<default>", default)):
            if layer is not None:
                path = f"/config/brokers/{entity}"
                value = {"version": 1, "config": dict(layer)}
                ops.append(SetData(path, value) if self.store.exists(path) else Create(path, value))
        try:
            self.store.multi(ops)
        except StoreError as e:
            raise _storage_error(f"Cannot record the broker configs: {e}") from e
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


def _log_config(tc: TopicConfig) -> LogConfig:
    props = {name: tc[name].value_string for name in (
        "segment.bytes", "segment.ms", "segment.index.bytes", "index.interval.bytes", "retention.ms",
        "retention.bytes", "flush.messages", "flush.ms", "file.delete.delay.ms", "cleanup.policy",
        "delete.retention.ms", "min.compaction.lag.ms", "max.compaction.lag.ms", "min.cleanable.dirty.ratio")}
    return LogConfig().from_properties(props)


def _storage_error(message: str) -> KafkaApiError:
    log.warning("%s", message)
    return KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR, message)


def _reason(e: Exception) -> str:
    return getattr(e, "strerror", None) or str(e)


def _names(items: Iterable) -> str:
    names = [getattr(i, "name", i) for i in items]
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _fsync_dirs(dirs: Iterable) -> None:
    for d in dirs:
        if d is not None:
            fsync_dir(d)



