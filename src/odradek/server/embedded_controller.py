"""The controller channel of a broker that is its own controller (embedded mode, the default for
`odradek serve`; DESIGN, "Metadata and the cluster").

The controller (`cluster/controller.py`) decides and records topic changes in the metadata store; this
module applies them on this broker: it creates and removes logs, sends the replica manager a
LeaderAndIsr (or StopReplica) for the partitions the broker hosts, and publishes the change in the
broker's metadata image, which is all request handlers read. It also records ISR changes the replica
manager proposes (`alter_isr`, Kafka's AlterPartition), hands out producer ids from the controller's
blocks, and records topic configs and dynamic broker configs.

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
(`lock`), each as a task of this channel (`call`), so a change is never cut short by the request that
asked for it going away; requests that only read the image never wait for them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Callable, Coroutine, Protocol, TypeVar

from odradek.cluster.controller import Controller
from odradek.cluster.store import Create, EmbeddedStore, MetadataStore, Op, SetData, StoreError
from odradek.cluster.topics import PartitionState, TopicInfo
from odradek.protocol.error_codes import ErrorCode, KafkaApiError
from odradek.server.config import BrokerConfig, ConfigError, TopicConfig
from odradek.server.metadata_cache import MetadataCache
from odradek.server.partition import LeaderAndIsrState
from odradek.server.replica_manager import ReplicaManager
from odradek.server.slices import Slices, run_now, run_sliced
from odradek.server.workers import Workers
from odradek.storage.checkpoints import fsync_dir
from odradek.storage.config import CleanerConfig, LogConfig
from odradek.storage.errors import StorageError
from odradek.storage.manager import LogManager

log = logging.getLogger("odradek.broker")
T = TypeVar("T")

DYNAMIC_BROKER_CONFIG_PATH = "/config/brokers"


class SizedLog(Protocol):
    @property
    def log_end_offset(self) -> int: ...


class LogStore(Protocol):
    """What topic changes do to the log directories (the LogManager; in-memory logs in tests)."""

    def get_log(self, topic: str, partition: int) -> Any: ...

    def get_or_create_log(self, topic: str, partition: int, now_ms: int, config: LogConfig | None = None) -> Any: ...

    def delete_log(self, topic: str, partition: int, now_ms: int, *, sync: bool = True,
                   stray: bool = False) -> bool: ...

    def logs(self) -> Iterator[tuple[tuple[str, int], SizedLog]]: ...

    def log_dir_of(self, topic: str, partition: int) -> Path | None: ...

    def update_cleaner_config(self, config: CleanerConfig) -> None: ...

    def update_move_throttle(self, bytes_per_second: int) -> None: ...


class EmbeddedController:
    def __init__(self, broker_id: int, store: EmbeddedStore, controller: Controller, logs: LogStore,
                 replica_manager: ReplicaManager, metadata: MetadataCache, workers: Workers,
                 clock: Callable[[], int]) -> None:
        self.broker_id = broker_id
        self.store = store
        self.controller = controller
        self.logs = logs
        self.replica_manager = replica_manager
        self.metadata = metadata
        self.workers = workers
        self.clock = clock
        # One controller change at a time (Kafka's controller is one event queue); readers never wait.
        self.lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._producer_id_lock = asyncio.Lock()

    # ------------------------------------------------------------------------------------------ start and stop
    def open_all(self, now_ms: int) -> None:
        """At start: remove strays, open every partition hosted here, publish every topic."""
        self._remove_stray_logs(now_ms)
        names = self.controller.image.names()
        for name in names:
            info = self.controller.image.get(name)
            if info is not None:
                run_now(self._open_partitions(info, now_ms))
        self._publish(names)

    async def aclose(self) -> None:
        """Changes under way finish (before the logs close)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    @staticmethod
    def finish_deletions_at_start(controller: Controller, log_dirs: list[str], names: list[str]) -> None:
        """Deletions a crash interrupted, finished before any log is loaded: the topics' partition
        dirs are renamed away (the log manager then removes them unread), then their nodes go."""
        try:
            LogManager.delete_topic_dirs(log_dirs, set(names))
            controller.complete_deletions(names)
        except (OSError, StorageError, StoreError) as e:
            log.warning("the deletion of %s is not finished: %s", _names(names), e)
            return
        controller.finish_deletions(names)
        log.info("finished the deletion of %s", _names(names))

    # ------------------------------------------------------------------------------------------ the image
    @property
    def is_active(self) -> bool:
        """A broker that is its own controller always is the active one."""
        return True

    def request_creation(self, topics: Iterable[tuple[str, int, int, dict[str, str]]]) -> None:
        """Only a cluster's non-controllers forward creations; here the handlers create directly."""
        raise NotImplementedError

    @property
    def config(self) -> BrokerConfig:
        return self.metadata.image.config

    def topic_defaults(self) -> tuple[int, int]:
        """(num.partitions, default.replication.factor): what -1 means in a creation."""
        return self.config.get("num.partitions"), self.config.get("default.replication.factor")

    def live_broker_ids(self) -> set[int]:
        return set(self.metadata.image.live_broker_ids())

    def _publish(self, names: Iterable[str]) -> None:
        """The controller's view of these topics (made durable) becomes the broker's image."""
        put, gone = [], []
        for name in names:
            info = self.controller.image.get(name)
            if info is None:
                gone.append(name)
            else:
                put.append(info)
        image = self.metadata.image.with_topics(put)
        self.metadata.update(image.without_topics(gone) if gone else image)

    # ------------------------------------------------------------------------------------------ topic changes
    async def call(self, change: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """Run a controller change (`change(*args)`, which takes `lock`) as a task of this channel, to
        its end even if the request that asked for it goes away: a client that closes its connection
        cancels its request, and a change cut short between its store write and the image would leave
        a topic recorded but never served. The request waits for it, shielded."""
        task: asyncio.Task[T] = asyncio.get_running_loop().create_task(change(*args))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    # The handlers plan with the controller while holding `lock` and call these to apply.
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
            self.controller.publish(info)
            log.info("created topic %s with %d partition(s)", info.name, len(info.partitions))
        self._publish(i.name for i in infos)

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
        self.controller.publish(info)
        self._publish([name])
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
        changed = []
        for _, new in plans:
            await run_sliced(self._open_partitions(new, now), slices)
            info = self.controller.publish_partitions(new)
            if info.configs != new.configs:     # changed while the logs were being created
                changed.append(info.name)
            log.info("topic %s now has %d partition(s)", info.name, len(info.partitions))
        self._publish(new.name for _, new in plans)    # one new image for the whole request
        for name in changed:
            self.reconfigure_logs(name)

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
        self._publish(names)
        for info in infos:
            self.replica_manager.stop_replicas([(info.name, p) for p in info.partitions], delete=False,
                                               now_ms=self.clock())
            log.info("deleting topic %s", info.name)
        await self._finish_deletions(names)

    def _commit_deletion_marks(self, infos: list[TopicInfo]) -> None:
        self.controller.commit(self.controller.deletion_mark_ops(infos))

    async def retry_pending_deletions(self) -> None:
        """Finish deletions whose last write failed before (a full disk); call with `lock`."""
        if self.controller.pending_deletions:
            await self._finish_deletions(sorted(self.controller.pending_deletions))

    async def _finish_deletions(self, names: list[str]) -> None:
        try:
            dirs: set[Path | None] = set()
            await run_sliced(self._delete_logs(set(names), dirs))
            await self.workers.run(fsync_dirs, dirs)
            await self.workers.run(self.controller.complete_deletions, names)
        except (OSError, StorageError, StoreError) as e:
            log.warning("the deletion of %s is not finished (tried again before the next topic change "
                        "and at start): %s", _names(names), e)
            return
        self.controller.finish_deletions(names)
        for name in names:
            log.info("deleted topic %s", name)

    def _remove_stray_logs(self, now_ms: int) -> None:
        """Logs of no topic in the image: empty ones are what a crash during a creation leaves (the
        logs come before the store write) and are removed; others are reported and left alone."""
        dirs: set[Path | None] = set()
        for (topic, p), log_ in self.logs.logs():
            info = self.controller.image.get(topic)
            if info is not None and p in info.partitions:
                continue
            if log_.log_end_offset == 0:
                dirs.add(self.logs.log_dir_of(topic, p))
                self.logs.delete_log(topic, p, now_ms, sync=False)
            else:
                log.warning("log %s-%d belongs to no topic; it is left as it is", topic, p)
        fsync_dirs(dirs)

    # ---- steps run in slices (`run_sliced`) or at once (`run_now`): each yields after every partition
    def _create_logs(self, info: TopicInfo, created: list[tuple[str, int]]) -> Iterator[None]:
        config = log_config(TopicConfig.resolve_stored(info.configs, self.config, info.name))
        now = self.clock()
        for p, st in info.partitions.items():
            if self.broker_id in st.replicas and self.logs.get_log(info.name, p) is None:
                self.logs.get_or_create_log(info.name, p, now, config)
                created.append((info.name, p))
            yield

    def _open_partitions(self, info: TopicInfo, now_ms: int) -> Iterator[None]:
        """The LeaderAndIsr this controller sends itself, one partition at a time: the partitions of
        `info` this broker hosts and does not have yet."""
        rm = self.replica_manager
        for p, st in info.partitions.items():
            if self.broker_id in st.replicas and rm.get_partition(info.name, p) is None:
                rm.apply_leader_and_isr([_leader_and_isr(info.name, p, st)], now_ms)
            yield

    def _delete_logs(self, names: set[str], dirs: set[Path | None]) -> Iterator[None]:
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

    # ------------------------------------------------------------------------------------------ ISR changes
    async def alter_isr(self, topic: str, partition: int, leader_epoch: int, isr: tuple[int, ...],
                        partition_epoch: int) -> int:
        """AlterPartition from this broker's replica manager: the new ISR recorded in the partition's
        state node (one write, on the worker pool), then published. Raises KafkaApiError
        FENCED_LEADER_EPOCH if the leader epoch moved on, UNKNOWN_TOPIC_OR_PARTITION if it is gone."""
        async with self.lock:
            info = self.controller.image.get(topic)
            st = info.partitions.get(partition) if info is not None else None
            if st is None:
                raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            if st.leader_epoch != leader_epoch or st.leader != self.broker_id:
                raise KafkaApiError(ErrorCode.FENCED_LEADER_EPOCH)
            if any(r not in st.replicas for r in isr):
                raise KafkaApiError(ErrorCode.INELIGIBLE_REPLICA)
            new = PartitionState(st.leader, st.leader_epoch, list(isr), list(st.replicas))
            try:
                await self.workers.run(self.controller.set_partition_state, topic, partition, new)
            except StoreError as e:
                raise _storage_error(f"Cannot record the ISR of {topic}-{partition}: {e}") from e
            self._publish([topic])
            return partition_epoch + 1

    # ------------------------------------------------------------------------------------------ producer ids
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

    # ------------------------------------------------------------------------------------------ configs
    async def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        """Replace a topic's overrides (the store write on the worker pool); produce, fetch and the
        logs see them once it is recorded."""
        try:
            await self.workers.run(self.controller.write_topic_configs, name, configs)
        except StoreError as e:
            raise _storage_error(f"Cannot record the configs of {name}: {e}") from e
        self.controller.image.with_configs(name, configs)
        self._publish([name])
        self.reconfigure_logs(name)

    async def set_dynamic_broker_configs(self, *, per_broker: dict[str, str] | None = None,
                                         default: dict[str, str] | None = None) -> None:
        """Replace a dynamic layer (`/config/brokers/<id>` or `/config/brokers/<default>`).
        Raises ConfigError, before anything is stored, if the new layer is not allowed."""
        self.config.with_dynamic(dynamic_broker=per_broker, dynamic_default=default)
        try:
            await self.workers.run(self._write_dynamic_layers, per_broker, default)
        except StoreError as e:
            raise _storage_error(f"Cannot record the broker configs: {e}") from e
        self.apply_dynamic_broker_configs(per_broker, default)

    def _write_dynamic_layers(self, per_broker: dict[str, str] | None, default: dict[str, str] | None) -> None:
        ops: list[Op] = []
        for entity, layer in ((str(self.broker_id), per_broker), ("<default>", default)):
            if layer is not None:
                path = f"{DYNAMIC_BROKER_CONFIG_PATH}/{entity}"
                value = {"version": 1, "config": dict(layer)}
                ops.append(SetData(path, value) if self.store.exists(path) else Create(path, value))
        self.store.multi(ops)

    def apply_dynamic_broker_configs(self, per_broker: dict[str, str] | None, default: dict[str, str] | None) -> None:
        """Recorded dynamic layers (None: unchanged) in the image, the logs, the cleaner and the throttle
        of replica moves between log dirs. A recorded value that cannot be applied (one a change
        notification brings from a broker that did not check it) is logged and its default used."""
        new = self.config.with_stored_dynamic(dynamic_broker=per_broker, dynamic_default=default)
        self.metadata.update(self.metadata.image.with_config(new))
        self.reconfigure_logs(None)
        self.logs.update_cleaner_config(cleaner_config(new))
        self.logs.update_move_throttle(new.get("replica.alter.log.dirs.io.max.bytes.per.second"))

    @staticmethod
    def load_dynamic_broker_configs(store: MetadataStore, broker_id: int, config: BrokerConfig) -> BrokerConfig:
        """The static config with the stored dynamic layers over it (as they were at start); a stored
        value that cannot be applied is logged and its default used: a broker always starts."""
        layers = {}
        for key, entity in (("dynamic_broker", str(broker_id)), ("dynamic_default", "<default>")):
            path = f"{DYNAMIC_BROKER_CONFIG_PATH}/{entity}"
            if store.exists(path):
                layers[key] = store.get(path)[0].get("config", {})
        return config.with_stored_dynamic(**layers) if layers else config

    def reconfigure_logs(self, topic: str | None) -> None:
        for part in self.replica_manager.partitions():
            if topic is None or part.topic == topic:
                part.log.update_config(log_config(self.metadata.topic_config(part.topic)))


def log_config(tc: TopicConfig) -> LogConfig:
    """The storage layer's config of a topic's logs, from its effective topic config (built, and so
    checked, when the topic config was resolved)."""
    return tc.log_config


def cleaner_config(c: BrokerConfig) -> CleanerConfig:
    """The log cleaner's config, from the broker's (`log.cleaner.*`, dynamic as in Kafka)."""
    return CleanerConfig(
        enable=c.get("log.cleaner.enable"), threads=c.get("log.cleaner.threads"),
        dedupe_buffer_size=c.get("log.cleaner.dedupe.buffer.size"),
        io_buffer_size=c.get("log.cleaner.io.buffer.size"),
        io_buffer_load_factor=c.get("log.cleaner.io.buffer.load.factor"),
        backoff_ms=c.get("log.cleaner.backoff.ms"),
        io_max_bytes_per_second=c.get("log.cleaner.io.max.bytes.per.second"))


def _leader_and_isr(topic: str, p: int, st: PartitionState) -> LeaderAndIsrState:
    return LeaderAndIsrState(topic, p, st.leader, st.leader_epoch, tuple(st.isr), tuple(st.replicas))


def _storage_error(message: str) -> KafkaApiError:
    log.warning("%s", message)
    return KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR, message)


def _reason(e: Exception) -> str:
    return getattr(e, "strerror", None) or str(e)


def _names(items: Iterable[Any]) -> str:
    names = [getattr(i, "name", i) for i in items]
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def fsync_dirs(dirs: Iterable[Path | None]) -> None:
    for d in dirs:
        if d is not None:
            fsync_dir(d)
