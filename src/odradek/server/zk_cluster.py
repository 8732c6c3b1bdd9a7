"""A broker in a cluster on ZooKeeper (`zookeeper.connect` set; seed 003, "Replication"; Kafka's
ZooKeeper-era KafkaServer, KafkaController election and the broker side of the controller's requests).

This is the broker's controller channel in cluster mode (`controller_channel.ControllerChannel`) and
its membership in the cluster:
- registration: after the listeners are bound, the ephemeral `/brokers/ids/<id>` with their
  advertised endpoints and `broker.rack`; a broker id held by a live broker is refused at start;
- controller election: every broker watches `/controller`; when it is free each tries to take it
  (with the epoch bump of `cluster/registration.py`); the winner runs `zk_controller.ActiveController`
  and the others follow whatever it sends, refusing requests of an older controller epoch with
  STALE_CONTROLLER_EPOCH;
- the controller's requests applied here: UpdateMetadata replaces the metadata image (brokers,
  partition states, and the topic configs read from the store for topics new to this broker),
  LeaderAndIsr makes partitions leaders or followers (followers go to the replica fetchers, leaders
  leave them), StopReplica stops (and may delete) replicas;
- ISR changes of partitions led here (the replica manager's AlterPartition port): written to the
  partition's state node conditionally on its version, with a notification under
  `/isr_change_notification` in the same multi for the controller;
- config changes (AlterConfigs, IncrementalAlterConfigs) made through any broker: the topic's or
  dynamic broker layer's node and a change notification under `/config/changes` in one multi; every
  broker watches `/config/changes` and applies the configs the new notifications name to its image,
  its partitions' logs and its dynamic broker layers (`cluster/config_changes.py`); the controller
  deletes notifications older than 15 minutes;
- topic changes: only the active controller makes them; another broker's CreateTopics, DeleteTopics and
  CreatePartitions answer NOT_CONTROLLER (clients send them to the controller Metadata names), and the
  topics a Metadata request or FindCoordinator creates are asked of the controller with a CreateTopics
  request (Kafka's auto-topic creation forwarding), answered LEADER_NOT_AVAILABLE /
  COORDINATOR_NOT_AVAILABLE until the controller has propagated them;
- controlled shutdown on SIGTERM (`controlled.shutdown.enable`): ControlledShutdown to the controller,
  retried `controlled.shutdown.max.retries` times, before the listeners close.
- a ZooKeeper session that expires (a paused process, a partition from the ensemble) loses the
  ephemeral nodes; when the client gets a new session the broker registers again and stands for
  controller again. Store calls run on one thread of their own, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable, Iterable, Iterator

from odradek.cluster.config_changes import (
    CONFIG_CHANGES_PATH, TOPICS, broker_entity, read_changes, read_configs,
    topic_entity, write_configs,
)
from odradek.cluster.controller import ISR_CHANGE_NOTIFICATION_PATH, Controller
from odradek.cluster.producer_ids import ProducerIdManager
from odradek.cluster.registration import (
    BROKER_IDS_PATH, CONTROLLER_PATH, Endpoint, broker_node, current_controller, register_broker,
    try_become_controller,
)
from odradek.cluster.store import BadVersionError, Create, NodeExistsError, NoNodeError, SetData, StoreError
from odradek.cluster.topics import (
    OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, PartitionState, TopicInfo, config_path, state_node, state_path,
)
from odradek.protocol.error_codes import ErrorCode, KafkaApiError, for_code
from odradek.protocol.messages import controlled_shutdown as csm
from odradek.protocol.messages import create_topics as ctm
from odradek.protocol.messages import leader_and_isr as lm
from odradek.protocol.messages import stop_replica as sm
from odradek.protocol.messages import update_metadata as um
from odradek.server.config import ConfigError
from odradek.server.embedded_controller import EmbeddedController, LogStore, fsync_dirs
from odradek.server.inter_broker import BrokerChannels, BrokerUnreachable
from odradek.server.metadata_cache import BrokerEndpoint, BrokerRegistration, MetadataCache
from odradek.server.partition import LeaderAndIsrState
from odradek.server.replica_fetcher import FetcherConfig, ReplicaFetcherManager
from odradek.server.replica_manager import ReplicaManager
from odradek.server.workers import Workers
from odradek.server.zk_controller import FULL_REQUEST, LEADER_DURING_DELETE, ActiveController

log = logging.getLogger("odradek.cluster")

CONTROLLED_SHUTDOWN_KEY = 7
CREATE_TOPICS_KEY = 19
PROTOCOL_NAMES = {0: "PLAINTEXT", 1: "SSL", 2: "SASL_PLAINTEXT", 3: "SASL_SSL"}


class ZkCluster(EmbeddedController):
    store: Any      # the ZooKeeper store (kazoo is optional, so not named here)

    def __init__(self, broker_id: int, store: Any, logs: LogStore, replica_manager: ReplicaManager,
                 metadata: MetadataCache, workers: Workers, clock: Callable[[], int]) -> None:
        self._idle = Controller(store, broker_id)
        super().__init__(broker_id, store, self._idle, logs, replica_manager, metadata, workers, clock)
        config = metadata.image.config
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="zookeeper")
        self.channels = BrokerChannels(broker_id, self._address_of,
                                       request_timeout_ms=config.get("request.timeout.ms") or 30_000)
        self.fetchers = ReplicaFetcherManager(replica_manager, self.channels, FetcherConfig(
            replica_id=broker_id, max_wait_ms=config.get("replica.fetch.wait.max.ms"),
            min_bytes=config.get("replica.fetch.min.bytes"),
            partition_max_bytes=config.get("replica.fetch.max.bytes"),
            response_max_bytes=config.get("replica.fetch.response.max.bytes"),
            backoff_ms=config.get("replica.fetch.backoff.ms")), clock)
        self.producer_id_manager = ProducerIdManager(store, broker_id)
        self.active: ActiveController | None = None
        self.controller_epoch = 0           # the newest controller epoch heard from
        self._member_lock = asyncio.Lock()  # the controller's requests, one at a time
        self._registration: dict | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session_lost = False
        self._creating: set[str] = set()
        self._stopping = False
        self._disconnected_at: float | None = None       # loop time ZooKeeper went away
        self._isolation_check: asyncio.Task[None] | None = None
        self._stepped_down = False
        self._configs_unknown: set[str] = set()      # topics whose configs the store could not give
        # Config change notifications: the last one applied, and one pass over new ones at a time (a
        # change seen meanwhile makes it go again). Passes and the configs UpdateMetadata reads for
        # new topics take `_configs_lock`, so an older read never replaces a newer one.
        self._last_config_change = -1
        self._config_changes_running = False
        self._config_changes_again = False
        self._configs_lock = asyncio.Lock()

    # ------------------------------------------------------------------------------ store calls
    async def run_store(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def _from_zookeeper(self, fn: Callable[[], Any]) -> Callable[[str], None]:
        """A watch callback (kazoo's thread) that runs `fn` on the event loop."""
        def callback(_path: str) -> None:
            loop = self._loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(fn)
        return callback

    # ------------------------------------------------------------------------------ start and stop
    def open_all(self, now_ms: int) -> None:
        """Partitions are opened when the controller's LeaderAndIsr names them, not at start."""

    async def join(self, endpoints: list[Endpoint], rack: str | None) -> None:
        """Register (after the listeners are bound), watch, and stand for controller."""
        self._loop = asyncio.get_running_loop()
        self._registration = broker_node(endpoints, rack, self.clock())
        # A broker restarted right after a crash finds its previous registration until that session
        # expires: it waits for it (up to twice the session timeout), then refuses to start.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2 * self.config.get("zookeeper.session.timeout.ms") / 1000
        while True:
            try:
                await self.run_store(register_broker, self.store, self.broker_id, self._registration)
                break
            except NodeExistsError:
                if loop.time() > deadline:
                    raise StoreError(f"broker id {self.broker_id} is registered by another live broker "
                                     f"({BROKER_IDS_PATH}/{self.broker_id} exists)") from None
                log.info("broker id %d is still registered (a previous session of it, until it expires); "
                         "waiting", self.broker_id)
                await asyncio.sleep(0.5)
        log.info("registered broker %d at %s", self.broker_id, ", ".join(
            f"{e.listener}://{e.host}:{e.port}" for e in endpoints))
        self.store.add_session_listener(self._session_changed)
        self.store.watch(CONTROLLER_PATH, self._from_zookeeper(self._controller_changed))
        self.store.watch(BROKER_IDS_PATH, self._from_zookeeper(self._brokers_changed))
        self.store.watch(ISR_CHANGE_NOTIFICATION_PATH, self._from_zookeeper(self._isr_changed))
        self.store.watch(CONFIG_CHANGES_PATH, self._from_zookeeper(self._config_changes))
        await self._elect_controller()

    def _session_changed(self, state: str) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if state == "LOST":
            loop.call_soon_threadsafe(self._lost)
        elif state == "SUSPENDED":
            loop.call_soon_threadsafe(self._suspended)
        elif state == "CONNECTED":
            loop.call_soon_threadsafe(self._connected)

    def _suspended(self) -> None:
        """Cut off from ZooKeeper: after a session timeout without it, partitions led here whose
        followers stopped fetching step down (`_step_down_if_isolated`)."""
        if self._stopping or self._isolation_check is not None:
            return
        assert self._loop is not None
        self._disconnected_at = self._loop.time()
        self._isolation_check = self._loop.create_task(self._watch_isolation())

    async def _watch_isolation(self) -> None:
        timeout_s = self.config.get("zookeeper.session.timeout.ms") / 1000
        lag_ms = self.replica_manager.replica_lag_time_max_ms
        while self._disconnected_at is not None:
            await asyncio.sleep(min(timeout_s, lag_ms / 1000) / 4)
            assert self._loop is not None
            if self._disconnected_at is not None and self._loop.time() - self._disconnected_at >= timeout_s:
                self._step_down_if_isolated(lag_ms)

    def _step_down_if_isolated(self, lag_ms: int) -> None:
        """Without ZooKeeper for longer than the session timeout this broker's session has expired and
        another broker leads what it led; a partition whose in-sync followers stopped fetching (so its
        ISR should shrink, which needs ZooKeeper) stops taking writes here: it follows no one and the
        image names no leader, so clients ask the other brokers. (Kafka keeps leading and times acks=all
        out; the records it took with acks=1 are truncated later. Stepping down shortens that window.)
        Partitions whose followers still fetch keep their leader: a ZooKeeper outage alone stops no one."""
        now = self.clock()
        doomed = [p for p in self.replica_manager.partitions()
                  if p.is_leader and p.isr_to_shrink(now, lag_ms) is not None]
        if not doomed:
            return
        self._resign()
        self._stepped_down = True
        states = [LeaderAndIsrState(p.topic, p.index, -1, p.leader_epoch, tuple(p.isr), tuple(p.replicas),
                                    p.partition_epoch, self.controller_epoch) for p in doomed]
        self.replica_manager.apply_leader_and_isr(states, now)
        image = self.metadata.image
        put = []
        for p in doomed:
            info = image.topic(p.topic)
            if info is not None and p.index in info.partitions:
                st = info.partitions[p.index]
                parts = dict(info.partitions)
                parts[p.index] = PartitionState(-1, st.leader_epoch, st.isr, st.replicas)
                put.append(replace(info, partitions=parts))
                image = image.with_topics(put[-1:])
        # Nor does it name itself among the brokers: a client then leaves it for the others, whose
        # metadata is the controller's (librdkafka drops a broker that metadata no longer lists).
        others = {b: r for b, r in image.brokers.items() if b != self.broker_id}
        self.metadata.update(image.with_brokers(others, -1))
        log.warning("no ZooKeeper for longer than its session timeout and followers gone: broker %d stops "
                    "leading %s", self.broker_id, ", ".join(f"{p.topic}-{p.index}" for p in doomed[:10]))

    def _lost(self) -> None:
        if self._stopping:
            return
        log.warning("the ZooKeeper session of broker %d expired; its registration is gone", self.broker_id)
        self._session_lost = True
        self._resign()

    def _connected(self) -> None:
        self._disconnected_at = None
        if self._isolation_check is not None:
            self._isolation_check.cancel()
            self._isolation_check = None
        if self._stopping:
            return
        if self._configs_unknown:
            self._spawn(self._reload_configs())
        self._config_changes()       # notifications written while ZooKeeper was away
        if self._session_lost or self._stepped_down:
            self._session_lost = False
            self._spawn(self._rejoin())
        elif self.active is not None:
            # The same session, back after a disconnection: events seen meanwhile may have failed.
            self._brokers_changed()
            self._isr_changed()

    async def _reload_configs(self) -> None:
        async with self._configs_lock:
            names = sorted(self._configs_unknown)
            configs = await self.run_store(_read_configs, self.store, names)
            self._configs_unknown.difference_update(names)
            self._apply_topic_configs(configs)

    # ------------------------------------------------------------------------------ config changes
    def _config_changes(self) -> None:
        """/config/changes changed (or the session is back): apply the new notifications."""
        if self._stopping:
            return
        if self._config_changes_running:
            self._config_changes_again = True
            return
        self._config_changes_running = True
        self._spawn(self._apply_config_changes())

    async def _apply_config_changes(self) -> None:
        try:
            again = True
            while again:
                self._config_changes_again = False
                await self._config_change_pass()
                again = self._config_changes_again
        finally:
            self._config_changes_running = False
        active = self.active
        if active is not None and active.active:
            await active.purge_config_changes(self.clock())

    async def _config_change_pass(self) -> None:
        async with self._configs_lock:
            entities, last = await self.run_store(read_changes, self.store, self._last_config_change)
            mine = (broker_entity(self.broker_id), broker_entity(None))
            topics = [e for e in entities if e.startswith(TOPICS + "/") and self._hosts_topic(e[len(TOPICS) + 1:])]
            brokers = any(e in mine for e in entities)
            wanted = topics + (list(mine) if brokers else [])
            configs = await self.run_store(read_configs, self.store, wanted) if wanted else {}
            self._apply_topic_configs({e[len(TOPICS) + 1:]: configs[e] for e in topics})
            if brokers:
                per_broker, default = configs[mine[0]], configs[mine[1]]
                if (per_broker, default) != (self.config.dynamic_broker, self.config.dynamic_default):
                    try:
                        self.apply_dynamic_broker_configs(per_broker, default)
                        log.info("dynamic broker configs changed: %s (default %s)", per_broker, default)
                    except ConfigError as e:
                        log.error("ignoring the changed dynamic broker configs: %s", e)
            if entities:
                log.info("applied config changes of %s", ", ".join(entities[:10]))
            self._last_config_change = last

    def _hosts_topic(self, name: str) -> bool:
        """A topic this broker's image or controller knows (others get their configs when they arrive)."""
        return self.metadata.image.topic(name) is not None or (
            self.active is not None and self.active.cluster.image.get(name) is not None)

    def _apply_topic_configs(self, configs: dict[str, dict[str, str]]) -> None:
        """Recorded topic configs into the image (and the controller's), then into the topics' logs."""
        image = self.metadata.image
        put = [replace(info, configs=dict(c)) for n, c in configs.items()
               if (info := image.topic(n)) is not None and info.configs != c]
        self.metadata.update(image.with_topics(put))
        for name, c in configs.items():
            if self.active is not None:
                self.active.cluster.image.with_configs(name, c)
            self._configs_unknown.discard(name)
        for info in put:
            self.reconfigure_logs(info.name)

    async def _purge_config_changes(self, active: ActiveController) -> None:
        """While this broker is the controller: notifications older than their expiration go, checked
        every minute (and after each pass over new ones)."""
        while active.active:
            await asyncio.sleep(min(60.0, active.config_change_expiration_ms / 1000))
            if active.active:
                await active.purge_config_changes(self.clock())

    async def _rejoin(self) -> None:
        assert self._registration is not None
        # A new timestamp tells the controller this is a new registration (Kafka's broker epoch), even
        # when it sees the old node's removal and the new one's creation as one change.
        self._registration = {**self._registration, "timestamp": str(self.clock())}
        if self._stepped_down:
            # The same session, but leadership given up here: registering anew makes the controller
            # send this broker its partitions' states again.
            self._stepped_down = False
            try:
                await self.run_store(self.store.delete, f"{BROKER_IDS_PATH}/{self.broker_id}")
            except NoNodeError:
                pass
        try:
            await self.run_store(register_broker, self.store, self.broker_id, self._registration)
            log.info("broker %d registered again with a new ZooKeeper session", self.broker_id)
        except NodeExistsError:
            pass
        await self._elect_controller()

    async def shutdown(self) -> None:
        """Before the listeners close: controlled shutdown, then leave the controller's place."""
        self._stopping = True
        if self.config.get("controlled.shutdown.enable"):
            await self._controlled_shutdown()
        self._resign()
        await self.fetchers.aclose()

    async def aclose(self) -> None:
        self._stopping = True
        self._disconnected_at = None
        if self._isolation_check is not None:
            self._isolation_check.cancel()
        self._resign()
        await self.fetchers.aclose()
        await super().aclose()
        self.channels.close()
        self._executor.shutdown(wait=False)

    def _resign(self) -> None:
        if self.active is not None:
            self.active.stop()
            self.active = None
            self.controller = self._idle

    # ------------------------------------------------------------------------------ controller election
    @property
    def is_active(self) -> bool:
        """Elected: a topic change waits for the controller's lock, which loading holds."""
        return self.active is not None

    def _controller_changed(self) -> None:
        self._spawn(self._elect_controller())

    async def _elect_controller(self) -> None:
        if self._stopping:
            return
        holder = await self.run_store(current_controller, self.store)
        if holder is None:
            lease = await self.run_store(try_become_controller, self.store, self.broker_id, self.clock())
            if lease is not None:
                self._resign()
                active = ActiveController(self.broker_id, self.store, lease, self.run_store, self.channels,
                                          self._unclean_allowed,
                                          request_timeout_ms=self.config.get("controller.socket.timeout.ms") or 30_000)
                self.active = active
                self.controller = active.cluster
                self.lock = active.lock
                self._set_controller_id(self.broker_id)
                await active.start()
                active.spawn(self._rebalance_leaders(active))
                active.spawn(self._purge_config_changes(active))
                return
            holder = await self.run_store(current_controller, self.store)
        if holder != self.broker_id:
            self._resign()
        self._set_controller_id(holder if holder is not None else -1)

    async def _rebalance_leaders(self, active: ActiveController) -> None:
        """While this broker is the controller: auto.leader.rebalance.enable, every
        leader.imbalance.check.interval.seconds."""
        while active.active:
            await asyncio.sleep(self.config.get("leader.imbalance.check.interval.seconds"))
            if active.active and self.config.get("auto.leader.rebalance.enable"):
                await active.rebalance_leaders(self.config.get("leader.imbalance.per.broker.percentage"))

    async def elect_leaders(self, election_type: int,
                            keys: list[tuple[str, int]] | None) -> dict[tuple[str, int], ErrorCode] | None:
        """ElectLeaders on the controller; None on any other broker (NOT_CONTROLLER)."""
        if self.active is None or not self.active.active:
            return None
        return await self.active.elect_leaders(election_type, keys)

    def _set_controller_id(self, controller_id: int) -> None:
        image = self.metadata.image
        if image.controller_id != controller_id:
            self.metadata.update(image.with_brokers(image.brokers, controller_id))

    def _unclean_allowed(self, topic: str) -> bool:
        value: bool = self.metadata.image.topic_config(topic).get_value("unclean.leader.election.enable")
        if self.active is not None:
            info = self.active.cluster.image.get(topic)
            if info is not None and "unclean.leader.election.enable" in info.configs:
                return info.configs["unclean.leader.election.enable"].strip().lower() == "true"
        return value

    def _brokers_changed(self) -> None:
        if self.active is not None:
            self.active.spawn(self.active.brokers_changed())

    def _isr_changed(self) -> None:
        if self.active is not None:
            self.active.spawn(self.active.isr_changed())

    def _spawn(self, coro: Any) -> None:
        async def run() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except (StoreError, NoNodeError) as e:
                log.warning("cluster membership: %s", e)
            except Exception:
                log.exception("cluster membership failed")
        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------------------ the controller's requests
    def _stale(self, controller_epoch: int) -> bool:
        if controller_epoch < self.controller_epoch:
            log.warning("ignoring a request of controller epoch %d (current %d)", controller_epoch,
                        self.controller_epoch)
            return True
        self.controller_epoch = controller_epoch
        return False

    async def update_metadata(self, request: um.UpdateMetadataRequest) -> ErrorCode:
        async with self._member_lock:
            if self._stale(request.controller_epoch):
                return ErrorCode.STALE_CONTROLLER_EPOCH
            image = self.metadata.image
            brokers = {}
            for b in request.live_brokers:
                eps = tuple(BrokerEndpoint(e.listener or PROTOCOL_NAMES.get(e.security_protocol, "PLAINTEXT"),
                                           e.host, e.port) for e in b.endpoints)
                brokers[b.id] = BrokerRegistration(b.id, eps, b.rack)
            states = _grouped(request.topic_states, request.ungrouped_partition_states)
            new_names = [t for t, (tid, _) in states.items()
                         if (image.topic(t) is None or image.topic(t).topic_id != tid)  # type: ignore[union-attr]
                         and any(s.leader != LEADER_DURING_DELETE for s in states[t][1])]
            async with self._configs_lock:
                return await self._apply_update_metadata(request, brokers, states, new_names)

    async def _apply_update_metadata(self, request: um.UpdateMetadataRequest, brokers: dict[int, BrokerRegistration],
                                     states: dict[str, tuple[uuid.UUID, list[Any]]], new_names: list[str]) -> ErrorCode:
        """The image UpdateMetadata makes (with the configs of topics new here read from the store)."""
        configs: dict[str, dict[str, str]] = {}
        if new_names:
            try:
                configs = await self.run_store(_read_configs, self.store, new_names)
            except StoreError as e:    # ZooKeeper away: the defaults for now, the overrides once back
                log.warning("the configs of %s are not readable yet: %s", ", ".join(new_names[:5]), e)
                self._configs_unknown.update(new_names)
        put: list[TopicInfo] = []
        gone: list[str] = []
        image = self.metadata.image          # the store read above yielded
        if request.type == FULL_REQUEST:     # the whole cluster: a topic it does not name is gone
            gone.extend(name for name in image.topic_names() if name not in states)
        for name, (topic_id, parts) in states.items():
            if any(s.leader == LEADER_DURING_DELETE for s in parts):
                gone.append(name)
                continue
            old = image.topic(name)
            kept = old if old is not None and old.topic_id == topic_id else None
            partitions = dict(kept.partitions) if kept is not None else {}
            for s in parts:
                partitions[s.partition_index] = PartitionState(s.leader, s.leader_epoch, list(s.isr), list(s.replicas))
            put.append(TopicInfo(name, topic_id, dict(sorted(partitions.items())),
                                 kept.configs if kept is not None else configs.get(name, {}),
                                 kept.version if kept is not None else 0))
        new = image.with_brokers(brokers, request.controller_id).with_topics(put).without_topics(gone)
        self.metadata.update(new)
        self.metadata.controller_reached()
        for name in gone:
            keys = [(name, p) for p in (image.topic(name).partitions if image.topic(name) else ())]  # type: ignore[union-attr]
            self.fetchers.unfollow(keys)
        return ErrorCode.NONE

    async def leader_and_isr(self, request: lm.LeaderAndIsrRequest) -> dict[tuple[str, int], ErrorCode]:
        async with self._member_lock:
            grouped = _grouped(request.topic_states, request.ungrouped_partition_states)
            if self._stale(request.controller_epoch):
                return {(t, s.partition_index): ErrorCode.STALE_CONTROLLER_EPOCH
                        for t, (_, ps) in grouped.items() for s in ps}
            states = [LeaderAndIsrState(t, s.partition_index, s.leader, s.leader_epoch, tuple(s.isr),
                                        tuple(s.replicas), s.partition_epoch, s.controller_epoch)
                      for t, (_, ps) in grouped.items() for s in ps]
            errors = self.replica_manager.apply_leader_and_isr(states, self.clock())
            for st in states:
                if errors.get(st.key) is not ErrorCode.NONE:
                    continue
                if st.leader == self.broker_id or st.leader < 0:
                    self.fetchers.unfollow([st.key])
                else:
                    self.fetchers.follow(st.key, st.leader, st.leader_epoch)
            if request.type == FULL_REQUEST:
                await self._set_aside_strays({st.key for st in states})
            return errors

    async def _set_aside_strays(self, placed: set[tuple[str, int]]) -> None:
        """A full LeaderAndIsr names every replica the cluster places here: a log it does not name is a
        stray, left by a deletion or reassignment whose StopReplica this broker missed (it was down or
        cut off). As Kafka does with strays, it is no longer served and its directory is renamed
        `-stray` and kept, with a warning, for an operator to remove."""
        strays = sorted(tp for tp, _ in self.logs.logs() if tp not in placed)
        if not strays:
            return
        now = self.clock()
        self.fetchers.unfollow(strays)
        self.replica_manager.stop_replicas(strays, delete=False, now_ms=now)
        dirs = {self.logs.log_dir_of(*tp) for tp in strays}
        for topic, partition in strays:
            self.logs.delete_log(topic, partition, now, sync=False, stray=True)
        await self.workers.run(fsync_dirs, dirs)       # once per log dir, off the event loop
        log.warning("set aside %d stray log(s) the cluster no longer places on broker %d (renamed -stray, "
                    "kept): %s", len(strays), self.broker_id,
                    ", ".join(f"{t}-{p}" for t, p in strays[:10]) + (" ..." if len(strays) > 10 else ""))

    async def stop_replica(self, request: sm.StopReplicaRequest) -> dict[tuple[str, int], ErrorCode]:
        async with self._member_lock:
            keys: list[tuple[tuple[str, int], bool]] = []
            for ts in request.topic_states or ():
                keys.extend(((ts.topic_name, p.partition_index), p.delete_partition) for p in ts.partition_states)
            if not keys:
                for t in request.topics or ():
                    keys.extend(((t.name, p), request.delete_partitions) for p in t.partition_indexes)
                for u in request.ungrouped_partitions or ():
                    keys.append(((u.topic_name, u.partition_index), request.delete_partitions))
            if self._stale(request.controller_epoch):
                return {k: ErrorCode.STALE_CONTROLLER_EPOCH for k, _ in keys}
            self.fetchers.unfollow([k for k, _ in keys])
            now = self.clock()
            out = {}
            for key, delete in keys:
                self.replica_manager.stop_replicas([key], delete=False, now_ms=now)
                if delete and self.logs.get_log(*key) is not None:
                    self.logs.delete_log(key[0], key[1], now)
                out[key] = ErrorCode.NONE
            return out

    async def controlled_shutdown_of(self, broker_id: int) -> tuple[ErrorCode, list[tuple[str, int]]]:
        """ControlledShutdown received: NOT_CONTROLLER unless this broker is the controller."""
        if self.active is None or not self.active.active:
            return ErrorCode.NOT_CONTROLLER, []
        try:
            return ErrorCode.NONE, await self.active.controlled_shutdown(broker_id)
        except KafkaApiError as e:
            return e.code, []

    async def _controlled_shutdown(self) -> None:
        retries = self.config.get("controlled.shutdown.max.retries")
        backoff_s = self.config.get("controlled.shutdown.retry.backoff.ms") / 1000
        for attempt in range(retries + 1):
            remaining: list[Any] = []
            try:
                if self.active is not None and self.active.active:
                    code, remaining = await self.controlled_shutdown_of(self.broker_id)
                else:
                    controller_id = self.metadata.image.controller_id
                    if controller_id < 0:
                        raise BrokerUnreachable("no controller")
                    response = await self.channels.request(
                        "to-controller", controller_id, CONTROLLED_SHUTDOWN_KEY,
                        csm.ControlledShutdownRequest(broker_id=self.broker_id, broker_epoch=-1))
                    code = for_code(response.error_code)
                    remaining = list(response.remaining_partitions)
            except (BrokerUnreachable, StoreError) as e:
                code = ErrorCode.NOT_CONTROLLER
                log.info("controlled shutdown: %s", e)
            if code is ErrorCode.NONE and not remaining:
                log.info("controlled shutdown of broker %d succeeded", self.broker_id)
                return
            log.info("controlled shutdown attempt %d: %s, %d partition(s) remaining", attempt + 1, code.name,
                     len(remaining))
            if attempt < retries:
                await asyncio.sleep(min(backoff_s, 1.0))
        log.warning("proceeding with an uncontrolled shutdown of broker %d", self.broker_id)

    def _address_of(self, broker_id: int) -> tuple[str, int] | None:
        b = self.metadata.image.brokers.get(broker_id)
        if b is None:
            if broker_id == self.broker_id and self._registration is not None:
                return self._registration["host"], self._registration["port"]
            if self.active is not None and broker_id in self.active.live:
                node = self.active.live[broker_id]
                return node["host"], node["port"]
            return None
        name = self.config.get("inter.broker.listener.name")
        e = (b.endpoint(name) if name else None) or (b.endpoints[0] if b.endpoints else None)
        return (e.host, e.port) if e is not None else None

    # ------------------------------------------------------------------------------ ISR changes
    async def alter_isr(self, topic: str, partition: int, leader_epoch: int, isr: tuple[int, ...],
                        partition_epoch: int) -> int:
        """The leader records its partition's new ISR (conditional on the state node's version) and
        notifies the controller, in one multi."""
        info = self.metadata.image.topic(topic)
        part = self.replica_manager.get_partition(topic, partition)
        if info is None or part is None:
            raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if part.leader_epoch != leader_epoch or not part.is_leader:
            raise KafkaApiError(ErrorCode.FENCED_LEADER_EPOCH)
        new = PartitionState(self.broker_id, leader_epoch, list(isr), list(part.replicas))
        notice = {"version": 1, "partitions": [{"topic": topic, "partition": partition}]}
        ops = [SetData(state_path(topic, partition), {**state_node(new), "controller_epoch": self.controller_epoch},
                       partition_epoch),
               Create(f"{ISR_CHANGE_NOTIFICATION_PATH}/isr_change_{self.broker_id}_{uuid.uuid4().hex[:16]}", notice)]
        try:
            results = await self.run_store(self.store.multi, ops)
        except StoreError as e:
            raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR, str(e)) from e
        except (ValueError, KeyError) as e:     # BadVersionError / NoNodeError: the controller changed it
            raise KafkaApiError(ErrorCode.INVALID_UPDATE_VERSION, str(e)) from e
        version: int = results[0]
        return version

    # ------------------------------------------------------------------------------ topic changes
    def _require_active(self) -> ActiveController:
        if self.active is None or not self.active.active:
            raise KafkaApiError(ErrorCode.NOT_CONTROLLER)
        return self.active

    async def retry_pending_deletions(self) -> None:
        with _store_errors("finish topic deletions"):
            await self._require_active().retry_pending_deletions()

    async def create_topics(self, infos: list[TopicInfo]) -> None:
        try:
            with _store_errors("record the topics"):
                await self._require_active().create_topics(infos)
        finally:
            self.controller.release(i.name for i in infos)

    async def add_partitions(self, plans: list[tuple[TopicInfo, TopicInfo]]) -> None:
        with _store_errors("record the partitions"):
            await self._require_active().add_partitions(plans)

    async def delete_topics(self, infos: list[TopicInfo]) -> None:
        with _store_errors("record the deletion"):
            await self._require_active().delete_topics(infos)

    def create_topic(self, name: str, num_partitions: int, replication_factor: int,
                     configs: dict[str, str]) -> tuple[TopicInfo | None, ErrorCode, str | None]:
        """An internal topic on first need: asked of the controller (itself, or over the wire); the
        caller answers COORDINATOR_NOT_AVAILABLE until the controller has propagated it."""
        if name == OFFSETS_TOPIC:      # a cluster waits for the full replication factor, as Kafka does
            replication_factor = self.config.get("offsets.topic.replication.factor")
        elif name == TRANSACTION_STATE_TOPIC:
            replication_factor = self.config.get("transaction.state.log.replication.factor")
            min_isr = min(self.config.get("transaction.state.log.min.isr"), replication_factor)
            configs = {**configs, "min.insync.replicas": str(min_isr)}
        self.request_creation([(name, num_partitions, replication_factor, configs)])
        return None, ErrorCode.COORDINATOR_NOT_AVAILABLE, "the controller is creating it"

    def request_creation(self, topics: Iterable[tuple[str, int, int, dict[str, str]]]) -> None:
        """Ask the controller to create these topics (once at a time per name), without waiting."""
        wanted = [t for t in topics if t[0] not in self._creating]
        if not wanted:
            return
        self._creating.update(t[0] for t in wanted)
        request = ctm.CreateTopicsRequest(timeout_ms=30_000, validate_only=False, topics=[
            ctm.CreatableTopic(name=n, num_partitions=p, replication_factor=r, assignments=[],
                               configs=[ctm.CreatableTopicConfig(name=k, value=v) for k, v in c.items()])
            for n, p, r, c in wanted])

        async def send() -> None:
            try:
                controller_id = self.metadata.image.controller_id
                if controller_id < 0:
                    return
                response = await self.channels.request("to-controller", controller_id, CREATE_TOPICS_KEY, request)
                for t in response.topics:
                    if t.error_code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                        log.info("the controller did not create %s: %s %s", t.name, for_code(t.error_code).name,
                                 t.error_message or "")
            except BrokerUnreachable as e:
                log.info("asking the controller to create topics: %s", e)
            finally:
                self._creating.difference_update(t[0] for t in wanted)
        self._spawn(send())

    async def next_producer_id(self) -> int:
        ids = self.producer_id_manager
        pid = ids.next_id()
        while pid is None:
            async with self._producer_id_lock:
                pid = ids.next_id()
                if pid is None:
                    ids.install(await self.run_store(ids.claim_block))
                    pid = ids.next_id()
        return pid

    async def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        """Replace a topic's overrides: the config node and a change notification in one multi (off the
        event loop), then this broker's image and logs; the other brokers follow the notification."""
        async with self._configs_lock:
            try:
                await self.run_store(write_configs, self.store, {topic_entity(name): configs})
            except (StoreError, KeyError) as e:
                raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR, f"Cannot record the configs of {name}: {e}") from e
            self._apply_topic_configs({name: dict(configs)})

    async def set_dynamic_broker_configs(self, *, per_broker: dict[str, str] | None = None,
                                         default: dict[str, str] | None = None) -> None:
        """Replace a dynamic broker layer (this broker's, or the cluster-wide default) with a change
        notification, so every broker (the default) or a restarted one (its own) applies it."""
        self.config.with_dynamic(dynamic_broker=per_broker, dynamic_default=default)    # ConfigError first
        changes = {broker_entity(b): layer for b, layer in ((self.broker_id, per_broker), (None, default))
                   if layer is not None}
        async with self._configs_lock:
            try:
                await self.run_store(write_configs, self.store, changes)
            except (StoreError, KeyError) as e:
                raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR, f"Cannot record the broker configs: {e}") from e
            self.apply_dynamic_broker_configs(per_broker, default)


@contextlib.contextmanager
def _store_errors(what: str) -> Iterator[None]:
    """A topic change the store cannot take (ZooKeeper unreachable: Kafka's controller times out then):
    REQUEST_TIMED_OUT, retriable; a write refused because another controller took over: NOT_CONTROLLER."""
    try:
        yield
    except BadVersionError as e:
        raise KafkaApiError(ErrorCode.NOT_CONTROLLER, f"Cannot {what}: another controller took over") from e
    except StoreError as e:
        raise KafkaApiError(ErrorCode.REQUEST_TIMED_OUT, f"Cannot {what}: {e}") from e


def _grouped(topic_states: Any, ungrouped: Any) -> dict[str, tuple[uuid.UUID, list[Any]]]:
    """Partition states by topic, from either shape of the request (grouped from v5, v2 for LeaderAndIsr)."""
    out: dict[str, tuple[uuid.UUID, list[Any]]] = {}
    if topic_states:
        for ts in topic_states:
            out[ts.topic_name] = (ts.topic_id, list(ts.partition_states))
            for s in ts.partition_states:
                s.topic_name = ts.topic_name
    else:
        for s in ungrouped or ():
            out.setdefault(s.topic_name, (uuid.UUID(int=0), []))[1].append(s)
    return out


def _read_configs(store: Any, names: list[str]) -> dict[str, dict[str, str]]:
    out = {}
    for name in names:
        try:
            out[name] = dict(store.get(config_path(name))[0].get("config", {}))
        except NoNodeError:
            out[name] = {}
    return out
