"""The active controller of a cluster on ZooKeeper (seed 003, "Replication" and the inter-broker APIs
LeaderAndIsr, StopReplica, UpdateMetadata and ControlledShutdown; Kafka's ZooKeeper-era KafkaController,
PartitionStateMachine and ControllerChannelManager).

A broker runs this while it holds the controller lease (`cluster/registration.py`). It
- loads every topic and partition state from the store, then sends every live broker the whole
  metadata (UpdateMetadata) and each one the states of its replicas (LeaderAndIsr);
- watches `/brokers/ids`: for brokers that died, one batch of elections (`cluster/elections.py`) for
  the partitions they led and the removal of the dead from every ISR, recorded in one multi fenced by
  the controller epoch, then LeaderAndIsr to the affected replicas and UpdateMetadata to every broker;
  for brokers that (re)joined, UpdateMetadata everywhere, LeaderAndIsr with all their replicas, and an
  election for offline partitions they can lead;
- watches `/isr_change_notification`, where leaders announce the ISR changes they recorded, and sends
  UpdateMetadata with them;
- makes topic changes (create, add partitions, delete) that handlers planned, and moves leadership
  off a broker asking for a controlled shutdown;
- deletes config change notifications (`/config/changes`) older than 15 minutes (Kafka's
  changeExpirationMs; every broker has applied them by then).
Every state write is conditional on the state node's version (a leader changing its ISR at the same
time makes it fail; the controller reads the states again and retries) and on the controller epoch (a
controller whose lease was taken has every write refused). Requests to one broker go in order, one at
a time. A request that does not reach a broker still registered (a connection refused or cut, no
answer within `controller.socket.timeout.ms`) is not lost: as Kafka's ControllerChannelManager retries
a request until its broker answers or leaves, that broker is sent the whole metadata and the states of
all its replicas again, after a backoff (100 ms, doubling up to 5 s), until a round reaches it (`_resync`;
a newer state replaces an older one, so the whole state stands for every request it missed). A broker
that leaves instead gets everything when it registers again. "Everything" goes marked FULL (KIP-516's
request type), which is what stands in for a missed StopReplica or deletion: the broker drops the
topics a full UpdateMetadata does not name and sets aside, renamed `-stray`, its logs of partitions a
full LeaderAndIsr does not place on it (`zk_cluster.py`). So a topic deleted while one of its brokers
was down or cut off never comes back on that broker, and the deletion does not wait for it.
"""

from __future__ import annotations

import asyncio
import time
import logging
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Awaitable, Callable

from odradek.cluster.config_changes import CHANGE_EXPIRATION_MS, purge_expired_changes
from odradek.cluster.controller import ISR_CHANGE_NOTIFICATION_PATH, Controller
from odradek.cluster.elections import NO_LEADER, elect_offline, elect_preferred, shut_down_broker
from odradek.cluster.registration import ControllerLease, controller_epoch, live_brokers, parse_endpoints
from odradek.cluster.store import BadVersionError, MetadataStore, NoNodeError, SetData, StoreError
from odradek.cluster.topics import PartitionState, TopicInfo, topic_node, topic_path
from odradek.protocol.error_codes import ErrorCode, KafkaApiError, for_code
from odradek.protocol.messages import leader_and_isr as lm
from odradek.protocol.messages import stop_replica as sm
from odradek.protocol.messages import update_metadata as um
from odradek.server.inter_broker import BrokerChannels, BrokerUnreachable

log = logging.getLogger("odradek.controller")

LEADER_AND_ISR_KEY = 4
STOP_REPLICA_KEY = 5
UPDATE_METADATA_KEY = 6
LEADER_DURING_DELETE = -2      # UpdateMetadata's mark of a topic being deleted
# LeaderAndIsr (v5+) and UpdateMetadata (v8+) `type` (KIP-516): 2 is FULL; the others go as 0, as
# Kafka's ZooKeeper controller sends every request.
FULL_REQUEST = 2
SECURITY_PROTOCOLS = {"PLAINTEXT": 0, "SSL": 1, "SASL_PLAINTEXT": 2, "SASL_SSL": 3}
STATE_WRITE_ATTEMPTS = 5
RESYNC_BACKOFF_S = 0.1
RESYNC_BACKOFF_MAX_S = 5.0

Key = tuple[str, int]
RunStore = Callable[..., Awaitable[Any]]


class ActiveController:
    def __init__(self, broker_id: int, store: MetadataStore, lease: ControllerLease, run_store: RunStore,
                 channels: BrokerChannels, unclean_allowed: Callable[[str], bool],
                 request_timeout_ms: int = 30_000, config_change_expiration_ms: int = CHANGE_EXPIRATION_MS) -> None:
        self.broker_id = broker_id
        self.store = store
        self.lease = lease
        self.run_store = run_store           # runs a blocking store call off the event loop
        self.channels = channels
        self.unclean_allowed = unclean_allowed
        self.request_timeout_ms = request_timeout_ms
        self.config_change_expiration_ms = config_change_expiration_ms
        self.cluster = Controller(store, broker_id)
        self.live: dict[int, dict] = {}      # broker id -> its registration node
        self.lock = asyncio.Lock()           # one controller event at a time (Kafka's event queue)
        self.shutting_down: set[int] = set()
        self._send_locks: dict[int, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.active = False
        self._stale: set[int] = set()        # live brokers a request did not reach (`_resync`)
        self._resyncing = False

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    # ------------------------------------------------------------------------------ events
    async def start(self) -> None:
        """Become the controller: load, elect where leaders are gone, tell every broker everything."""
        async with self.lock:
            pending = await self.run_store(self.cluster.start)
            if pending:
                log.warning("topic deletions %s are pending; they complete when retried", pending)
            self.live = await self.run_store(live_brokers, self.store)
            self.active = True
            log.info("broker %d is the controller (epoch %d); live brokers %s", self.broker_id, self.epoch,
                     sorted(self.live))
            await self._elect(self._all_keys(), set(self.live))
            await self._send_everything(set(self.live))

    def stop(self) -> None:
        self.active = False
        for t in self._tasks:
            t.cancel()

    def spawn(self, coro: Awaitable[Any]) -> None:
        async def run() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except BadVersionError as e:
                log.warning("the controller's write was refused (%s): another controller has taken over", e)
            except StoreError as e:      # ZooKeeper unreachable: done again when the session is back
                log.warning("controller event not completed: %s", e)
            except Exception:
                log.exception("controller event failed")
        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def brokers_changed(self) -> None:
        async with self.lock:
            if not self.active:
                return
            now = await self.run_store(live_brokers, self.store)
            gone = set(self.live) - set(now)
            joined = {b for b in now if b not in self.live or now[b].get("timestamp") != self.live[b].get("timestamp")}
            self.live = now
            self.shutting_down &= set(now)
            if not gone and not joined:
                return
            log.info("brokers changed: live %s, gone %s, (re)joined %s", sorted(now), sorted(gone), sorted(joined))
            for b in gone:
                self.channels.drop_broker(b)
            live = set(now)
            affected = [k for k in self._all_keys()
                        if self._state(k).leader in gone or self._state(k).leader == NO_LEADER
                        or any(r in gone for r in self._state(k).isr)]
            started = time.monotonic()
            changed = await self._elect(affected, live)
            elected = time.monotonic()
            if joined:
                await self._send_everything(live, leader_and_isr_to=joined)
            if changed:
                await self._propagate(changed)
            elif gone:
                await self._update_metadata(live, [])
            if changed:
                log.info("leaders elected: %d partition state(s) changed in %.0f ms, sent to the brokers in %.0f ms",
                         len(changed), 1000 * (elected - started), 1000 * (time.monotonic() - elected))

    async def isr_changed(self) -> None:
        """Leaders recorded ISR changes: take them in and tell every broker."""
        async with self.lock:
            if not self.active:
                return
            children = await self.run_store(self.store.children, ISR_CHANGE_NOTIFICATION_PATH)
            if not children:
                return
            keys: set[Key] = set()
            for child in children:
                path = f"{ISR_CHANGE_NOTIFICATION_PATH}/{child}"
                try:
                    node, _ = await self.run_store(self.store.get, path)
                    for e in node.get("partitions", []):
                        keys.add((e["topic"], int(e["partition"])))
                    await self.run_store(self.store.delete, path)
                except (NoNodeError, KeyError, ValueError, TypeError):
                    continue
            nodes = await self.run_store(self.cluster.read_states, sorted(keys))
            changed = self.cluster.states_read(nodes)
            if changed:
                await self._update_metadata(set(self.live), changed)
                await self._complete_reassignments(changed)

    async def purge_config_changes(self, now_ms: int) -> list[str]:
        """Delete the config change notifications older than their expiration; their names."""
        if not self.active:
            return []
        purged: list[str] = await self.run_store(purge_expired_changes, self.store, now_ms,
                                                 self.config_change_expiration_ms)
        if purged:
            log.info("purged %d config change notification(s) older than %d ms", len(purged),
                     self.config_change_expiration_ms)
        return purged

    # ------------------------------------------------------------------------------ elections
    def _all_keys(self) -> list[Key]:
        image = self.cluster.image
        return [(name, p) for name in image.names() for p in image.get(name).partitions]  # type: ignore[union-attr]

    def _state(self, key: Key) -> PartitionState:
        info = self.cluster.image.get(key[0])
        assert info is not None
        return info.partitions[key[1]]

    async def _elect(self, keys: Iterable[Key], live: set[int]) -> list[Key]:
        """Offline elections and the removal of dead replicas from ISRs, recorded; the changed keys."""
        keys = list(keys)
        for attempt in range(STATE_WRITE_ATTEMPTS):
            changes = []
            for k in keys:
                if self.cluster.image.get(k[0]) is None:
                    continue
                st = self._state(k)
                after, unclean = elect_offline(st, live, self.unclean_allowed(k[0]))
                if after.leader in live:
                    isr = [r for r in after.isr if r in live] or [after.leader]
                    if isr != after.isr:
                        after = PartitionState(after.leader, max(after.leader_epoch, st.leader_epoch + 1), isr,
                                               list(after.replicas))
                if after != st:
                    if unclean:
                        log.warning("unclean leader election for %s-%d: broker %d leads, records only the "
                                    "old ISR %s had are lost", k[0], k[1], after.leader, st.isr)
                    elif after.leader == NO_LEADER:
                        log.warning("%s-%d is offline: no live replica of its ISR %s", k[0], k[1], st.isr)
                    changes.append((k[0], k[1], after))
            if await self._write_states(changes, keys):
                return [(t, p) for t, p, _ in changes]
        raise StoreError(f"could not record elections after {STATE_WRITE_ATTEMPTS} attempts")

    async def _write_states(self, changes: list[tuple[str, int, PartitionState]], keys: list[Key]) -> bool:
        """Write; False (the states read again) if a leader's ISR change came first."""
        if not changes:
            return True
        ops = self.cluster.state_write_ops(changes, self.lease.fenced)
        try:
            results = await self.run_store(self.store.multi, ops)
        except BadVersionError:
            if not await self._still_controller():
                raise
            nodes = await self.run_store(self.cluster.read_states, keys)
            self.cluster.states_read(nodes)
            return False
        self.cluster.states_written(changes, results)
        return True

    async def _still_controller(self) -> bool:
        epoch, version = await self.run_store(controller_epoch, self.store)
        return version == self.lease.epoch_zk_version

    async def elect_leaders(self, election_type: int, keys: Iterable[Key] | None) -> dict[Key, ErrorCode]:
        """ElectLeaders (KIP-460): type 0 moves leadership to the preferred replica where it is alive
        and in sync; type 1 elects a leader for offline partitions, outside the ISR if need be. `keys`
        None means every partition. Per partition: NONE, ELECTION_NOT_NEEDED,
        PREFERRED_LEADER_NOT_AVAILABLE, ELIGIBLE_LEADERS_NOT_AVAILABLE or UNKNOWN_TOPIC_OR_PARTITION."""
        async with self.lock:
            return await self._elect_leaders(election_type, keys)

    async def _elect_leaders(self, election_type: int, keys: Iterable[Key] | None) -> dict[Key, ErrorCode]:
        out: dict[Key, ErrorCode] = {}
        live = set(self.live) - self.shutting_down
        wanted = list(keys) if keys is not None else self._all_keys()
        changes = []
        for k in wanted:
            info = self.cluster.image.get(k[0])
            if info is None or k[1] not in info.partitions:
                out[k] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            st = info.partitions[k[1]]
            if election_type == 0:
                after = elect_preferred(st, live)
                if after == st:
                    preferred = st.replicas[0] if st.replicas else NO_LEADER
                    out[k] = ErrorCode.ELECTION_NOT_NEEDED if st.leader == preferred \
                        else ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
                    continue
            else:
                if st.leader in live:
                    out[k] = ErrorCode.ELECTION_NOT_NEEDED
                    continue
                after, unclean = elect_offline(st, live, True)
                if after.leader not in live:
                    out[k] = ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE
                    continue
                if unclean:
                    log.warning("unclean leader election for %s-%d (ElectLeaders): broker %d leads, records "
                                "only the old ISR %s had are lost", k[0], k[1], after.leader, st.isr)
            changes.append((k[0], k[1], after))
            out[k] = ErrorCode.NONE
        if changes and not await self._write_states(changes, [(t, p) for t, p, _ in changes]):
            for t, p, _ in changes:
                out[(t, p)] = ErrorCode.NOT_CONTROLLER if not self.active else ErrorCode.REQUEST_TIMED_OUT
            return out
        await self._propagate([(t, p) for t, p, _ in changes])
        return out

    async def rebalance_leaders(self, imbalance_percentage: int) -> int:
        """auto.leader.rebalance.enable: on each broker whose share of partitions not led by their
        preferred replica is above `leader.imbalance.per.broker.percentage`, move leadership back to the
        preferred replicas (Kafka's checkAndTriggerAutoLeaderRebalance). The number of elections."""
        async with self.lock:
            by_preferred: dict[int, list[Key]] = {}
            for k in self._all_keys():
                st = self._state(k)
                if st.replicas:
                    by_preferred.setdefault(st.replicas[0], []).append(k)
            live = set(self.live) - self.shutting_down
            todo: list[Key] = []
            for broker, keys in by_preferred.items():
                if broker not in live:
                    continue
                moved = [k for k in keys if self._state(k).leader != broker]
                if moved and len(moved) * 100 / len(keys) > imbalance_percentage:
                    todo.extend(k for k in moved if broker in self._state(k).isr)
            if not todo:
                return 0
            results = await self._elect_leaders(0, todo)
            done = sum(1 for c in results.values() if c is ErrorCode.NONE)
            if done:
                log.info("auto leader rebalance: %d partition(s) led by their preferred replica again", done)
            return done

    async def controlled_shutdown(self, broker: int) -> list[Key]:
        """Move leadership off `broker` and take it out of ISRs; the partitions it still leads."""
        async with self.lock:
            if broker not in self.live:
                raise KafkaApiError(ErrorCode.BROKER_NOT_AVAILABLE)
            self.shutting_down.add(broker)
            live = set(self.live) - self.shutting_down
            keys = [k for k in self._all_keys() if broker in self._state(k).replicas]
            for _ in range(STATE_WRITE_ATTEMPTS):
                changes = []
                for k in keys:
                    st = self._state(k)
                    after = shut_down_broker(st, broker, live)
                    if after != st:
                        if after.leader == st.leader and after.leader_epoch == st.leader_epoch:
                            after = PartitionState(after.leader, st.leader_epoch + 1, after.isr, after.replicas)
                        changes.append((k[0], k[1], after))
                if await self._write_states(changes, keys):
                    break
            else:
                raise StoreError("could not record the controlled shutdown")
            changed = [(t, p) for t, p, _ in changes]
            await self._propagate(changed)
            # The stopping broker stops fetching what it no longer leads (its logs stay).
            follows = [k for k in keys if self._state(k).leader != broker]
            if follows:
                await self._send(broker, STOP_REPLICA_KEY, self._stop_replica(follows, delete=False))
            # Still led there with another live ISR member to take over: the broker asks again. A
            # partition with no such member stays led there (Kafka keeps retrying; nothing can move).
            remaining = [k for k in keys if self._state(k).leader == broker
                         and any(r != broker and r in live for r in self._state(k).isr)]
            log.info("controlled shutdown of broker %d: %d partition(s) moved, %d still led there", broker,
                     len(changed), len(remaining))
            return remaining

    # ------------------------------------------------------------------------------ reassignments
    async def reassign(self, wanted: dict[Key, list[int] | None]) -> dict[Key, tuple[ErrorCode, str | None]]:
        """AlterPartitionReassignments (KIP-455): each partition's replicas become the target followed by
        the replicas leaving; the new ones fetch and join the ISR; once every target replica is in the
        ISR the leaving ones are dropped (`_complete_reassignments`). None cancels a reassignment under
        way (back to the original replicas)."""
        async with self.lock:
            out: dict[Key, tuple[ErrorCode, str | None]] = {}
            registered = set(self.live)
            planned: dict[Key, tuple[PartitionState, tuple[list[int], list[int]] | None]] = {}
            dropped: dict[int, list[Key]] = {}
            for k, target in wanted.items():
                info = self.cluster.image.get(k[0])
                if info is None or k[1] not in info.partitions:
                    out[k] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None)
                    continue
                st = info.partitions[k[1]]
                current = self.cluster.reassigning.get(k)
                original = [r for r in st.replicas if current is None or r not in current[0]]
                if target is None:
                    if current is None:
                        out[k] = (ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, None)
                        continue
                    target = original
                if not target or len(set(target)) != len(target):
                    out[k] = (ErrorCode.INVALID_REPLICA_ASSIGNMENT, "The replica assignment is empty or has duplicates.")
                    continue
                unknown = [r for r in target if r not in registered]
                if unknown:
                    out[k] = (ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                              f"The proposed assignment names brokers that are not registered: {unknown}")
                    continue
                out[k] = (ErrorCode.NONE, None)
                if list(target) == list(st.replicas) and current is None:
                    continue
                adding = [r for r in target if r not in original]
                removing = [r for r in original if r not in target]
                full = list(target) + removing
                for r in st.replicas:
                    if r not in full:       # a cancelled reassignment's new replicas go again
                        dropped.setdefault(r, []).append(k)
                after = PartitionState(st.leader, st.leader_epoch + 1, [r for r in st.isr if r in full], full)
                planned[k] = (after, (adding, removing) if adding or removing else None)
            if planned:
                await self._write_reassignment(planned)
                await self._propagate(list(planned))
                await asyncio.gather(*(self._send(b, STOP_REPLICA_KEY, self._stop_replica(ks, delete=True))
                                       for b, ks in dropped.items() if b in registered))
                await self._complete_reassignments(list(planned))
            return out

    def list_reassignments(self, keys: Iterable[Key] | None) -> dict[Key, tuple[list[int], list[int], list[int]]]:
        """(replicas, adding, removing) of the reassignments under way (all, or those of `keys`)."""
        wanted = set(keys) if keys is not None else None
        out = {}
        for k, (adding, removing) in sorted(self.cluster.reassigning.items()):
            if (wanted is None or k in wanted) and self.cluster.image.get(k[0]) is not None:
                out[k] = (list(self._state(k).replicas), list(adding), list(removing))
        return out

    async def _write_reassignment(self, planned: dict[Key, tuple[PartitionState, tuple[list[int], list[int]] | None]]
                                  ) -> None:
        """One multi: per topic its node (replicas, adding, removing; conditional on its version) and
        the partitions' states; then the image."""
        topics = sorted({t for t, _ in planned})
        ops: list[Any] = []
        infos = {}
        moving_after = dict(self.cluster.reassigning)
        for (t, p), (_, moving) in planned.items():
            if moving is None:
                moving_after.pop((t, p), None)
            else:
                moving_after[(t, p)] = moving
        changes = [(t, p, st) for (t, p), (st, _) in planned.items()]
        for t in topics:
            info = self.cluster.image.get(t)
            assert info is not None
            partitions = dict(info.partitions)
            partitions.update({p: st for (tt, p), (st, _) in planned.items() if tt == t})
            new = replace(info, partitions=partitions)
            infos[t] = new
            ops.append(SetData(topic_path(t), topic_node(new, {p: m for (tt, p), m in moving_after.items() if tt == t}),
                               info.version))
        ops.extend(self.cluster.state_write_ops(changes))
        results = await self.run_store(self.store.multi, self.lease.fenced(ops))
        for t, version in zip(topics, results[1:1 + len(topics)]):
            self.cluster.image.put(replace(infos[t], version=version if version is not None else infos[t].version))
        self.cluster.states_written(changes, results)
        self.cluster.reassigning = moving_after

    async def _complete_reassignments(self, keys: Iterable[Key]) -> None:
        """Reassignments whose target replicas are all in the ISR: the leaving replicas go (a new
        leader from the target if the leader leaves), recorded, propagated, and their logs deleted."""
        live = set(self.live)
        done: dict[Key, tuple[PartitionState, tuple[list[int], list[int]] | None]] = {}
        leaving: dict[int, list[Key]] = {}
        for k in keys:
            moving = self.cluster.reassigning.get(k)
            if moving is None or self.cluster.image.get(k[0]) is None:
                continue
            st = self._state(k)
            target = [r for r in st.replicas if r not in moving[1]]
            if not all(r in st.isr for r in target):
                continue
            isr = [r for r in st.isr if r in target]
            leader = st.leader if st.leader in target else next((r for r in target if r in isr and r in live), NO_LEADER)
            done[k] = (PartitionState(leader, st.leader_epoch + 1, isr, target), None)
            for r in moving[1]:
                leaving.setdefault(r, []).append(k)
        if not done:
            return
        await self._write_reassignment(done)
        await self._propagate(list(done))
        await asyncio.gather(*(self._send(b, STOP_REPLICA_KEY, self._stop_replica(ks, delete=True))
                               for b, ks in leaving.items() if b in live))
        for t, p in done:
            log.info("reassignment of %s-%d complete: replicas %s", t, p, self._state((t, p)).replicas)

    # ------------------------------------------------------------------------------ topic changes
    async def create_topics(self, infos: list[TopicInfo]) -> None:
        """Record planned topics (one multi, fenced), then tell the brokers."""
        ops = self.lease.fenced(self.cluster.creation_ops(infos))
        await self.run_store(self.store.multi, ops)
        keys: list[Key] = []
        for info in infos:
            self.cluster.publish(info)
            keys.extend((info.name, p) for p in info.partitions)
            log.info("created topic %s with %d partition(s)", info.name, len(info.partitions))
        await self._propagate(keys, new=True)

    async def add_partitions(self, plans: list[tuple[TopicInfo, TopicInfo]]) -> None:
        await self.run_store(self.store.multi, self.lease.fenced(self.cluster.partition_ops(plans)))
        keys: list[Key] = []
        for old, new in plans:
            self.cluster.publish_partitions(new)
            keys.extend((new.name, p) for p in new.partitions if p not in old.partitions)
        await self._propagate(keys, new=True)

    async def delete_topics(self, infos: list[TopicInfo]) -> None:
        await self.run_store(self.store.multi, self.lease.fenced(self.cluster.deletion_mark_ops(infos)))
        names = [i.name for i in infos]
        self.cluster.unpublish(names)
        live = set(self.live)
        await self._update_metadata(live, [], deleted=infos)
        by_broker: dict[int, list[Key]] = {}
        for info in infos:
            for p, st in info.partitions.items():
                for r in st.replicas:
                    by_broker.setdefault(r, []).append((info.name, p))
        await asyncio.gather(*(self._send(b, STOP_REPLICA_KEY, self._stop_replica(keys, delete=True))
                               for b, keys in by_broker.items() if b in live))
        await self.run_store(self.cluster.complete_deletions, names)
        self.cluster.finish_deletions(names)
        for name in names:
            log.info("deleted topic %s", name)

    async def retry_pending_deletions(self) -> None:
        if self.cluster.pending_deletions:
            names = sorted(self.cluster.pending_deletions)
            try:
                await self.run_store(self.cluster.complete_deletions, names)
            except StoreError as e:
                log.warning("the deletion of %s is not finished: %s", names, e)
                return
            self.cluster.finish_deletions(names)

    # ------------------------------------------------------------------------------ requests
    async def _propagate(self, keys: list[Key], new: bool = False) -> None:
        """UpdateMetadata with `keys` to every live broker, then LeaderAndIsr to their replicas
        (Kafka's order for new partitions: the metadata first, so leaders can answer)."""
        live = set(self.live)
        await self._update_metadata(live, keys)
        by_broker: dict[int, list[Key]] = {}
        for k in keys:
            for r in self._state(k).replicas:
                if r in live:
                    by_broker.setdefault(r, []).append(k)
        await asyncio.gather(*(self._send(b, LEADER_AND_ISR_KEY, self._leader_and_isr(ks, new))
                               for b, ks in by_broker.items()))

    async def _send_everything(self, live: set[int], leader_and_isr_to: set[int] | None = None) -> None:
        """The whole metadata to `live` and, to each of `leader_and_isr_to` (default: `live`), the
        states of all its replicas, both marked FULL (KIP-516's request type): a broker drops the
        topics a full UpdateMetadata does not name and sets aside (`-stray`) its logs of partitions a
        full LeaderAndIsr does not name, what a StopReplica it missed (down, or cut off) would have
        removed. A broker with no replica gets an empty one."""
        keys = self._all_keys()
        await self._update_metadata(live, keys, full=True)
        targets = live if leader_and_isr_to is None else leader_and_isr_to & live
        sends = []
        for b in targets:
            mine = [k for k in keys if b in self._state(k).replicas]
            sends.append(self._send(b, LEADER_AND_ISR_KEY, self._leader_and_isr(mine, False, full=True)))
        await asyncio.gather(*sends)

    async def _update_metadata(self, brokers: set[int], keys: list[Key],
                               deleted: Iterable[TopicInfo] = (), full: bool = False) -> None:
        request = self._update_metadata_request(keys, deleted, full)
        await asyncio.gather(*(self._send(b, UPDATE_METADATA_KEY, request) for b in brokers))

    async def _send(self, broker: int, api_key: int, request: Any) -> Any:
        lock = self._send_locks.setdefault(broker, asyncio.Lock())
        async with lock:
            if not self.active:
                return None
            try:
                response = await self.channels.request("controller", broker, api_key, request,
                                                       timeout_ms=self.request_timeout_ms)
            except BrokerUnreachable as e:
                log.warning("controller request %d to broker %d failed: %s", api_key, broker, e)
                self._missed(broker)
                return None
            code = getattr(response, "error_code", 0)
            if code:
                log.warning("broker %d answered controller request %d with %s", broker, api_key,
                            for_code(code).name)
            return response

    def _missed(self, broker: int) -> None:
        if broker not in self.live or not self.active:
            return                       # gone: it gets everything when it registers again
        self._stale.add(broker)
        if not self._resyncing:
            self._resyncing = True
            self.spawn(self._resync())

    async def _resync(self) -> None:
        """Send the brokers in `_stale` everything again, with a growing backoff, until a round reaches
        each of them or it leaves (the module docstring)."""
        backoff = RESYNC_BACKOFF_S
        try:
            while self.active:
                await asyncio.sleep(backoff)
                targets = self._stale & set(self.live)
                self._stale.clear()
                if not targets:
                    return
                log.info("sending broker(s) %s the whole metadata and their replicas' states again: "
                         "a request did not reach them", sorted(targets))
                await self._send_everything(targets)
                backoff = min(backoff * 2, RESYNC_BACKOFF_MAX_S)
        finally:
            self._resyncing = False

    def _leader_and_isr(self, keys: list[Key], new: bool, full: bool = False) -> lm.LeaderAndIsrRequest:
        topics: dict[str, list[lm.LeaderAndIsrPartitionState]] = {}
        leaders: set[int] = set()
        for t, p in keys:
            st = self._state((t, p))
            leaders.add(st.leader)
            topics.setdefault(t, []).append(lm.LeaderAndIsrPartitionState(
                topic_name=t, partition_index=p, controller_epoch=self.epoch, leader=st.leader,
                leader_epoch=st.leader_epoch, isr=list(st.isr), partition_epoch=self.cluster.state_versions.get((t, p), 0),
                replicas=list(st.replicas), adding_replicas=[], removing_replicas=[], is_new=new))
        live_leaders = []
        for b in sorted(leaders):
            node = self.live.get(b)
            if node is not None:
                eps = parse_endpoints(node)
                if eps:
                    live_leaders.append(lm.LeaderAndIsrLiveLeader(broker_id=b, host_name=eps[0].host, port=eps[0].port))
        return lm.LeaderAndIsrRequest(
            controller_id=self.broker_id, controller_epoch=self.epoch, broker_epoch=-1,
            type=FULL_REQUEST if full else 0,
            topic_states=[lm.LeaderAndIsrTopicState(topic_name=t, topic_id=self.cluster.image.get(t).topic_id,  # type: ignore[union-attr]
                                                    partition_states=ps) for t, ps in topics.items()],
            ungrouped_partition_states=[s for ps in topics.values() for s in ps],
            live_leaders=live_leaders)

    def _update_metadata_request(self, keys: list[Key], deleted: Iterable[TopicInfo],
                                 full: bool = False) -> um.UpdateMetadataRequest:
        topics: dict[str, list[um.UpdateMetadataPartitionState]] = {}
        ids = {}
        offline_live = set(self.live)
        for t, p in keys:
            info = self.cluster.image.get(t)
            if info is None:
                continue
            st = info.partitions[p]
            ids[t] = info.topic_id
            topics.setdefault(t, []).append(um.UpdateMetadataPartitionState(
                topic_name=t, partition_index=p, controller_epoch=self.epoch, leader=st.leader,
                leader_epoch=st.leader_epoch, isr=list(st.isr), zk_version=self.cluster.state_versions.get((t, p), 0),
                replicas=list(st.replicas), offline_replicas=[r for r in st.replicas if r not in offline_live]))
        for info in deleted:
            ids[info.name] = info.topic_id
            topics[info.name] = [um.UpdateMetadataPartitionState(
                topic_name=info.name, partition_index=p, controller_epoch=self.epoch, leader=LEADER_DURING_DELETE,
                leader_epoch=st.leader_epoch, isr=list(st.isr), zk_version=0, replicas=list(st.replicas),
                offline_replicas=[]) for p, st in info.partitions.items()]
        brokers = []
        for b, node in sorted(self.live.items()):
            eps = parse_endpoints(node)
            brokers.append(um.UpdateMetadataBroker(
                id=b, v0_host=eps[0].host if eps else "", v0_port=eps[0].port if eps else 0,
                endpoints=[um.UpdateMetadataEndpoint(port=e.port, host=e.host, listener=e.listener,
                                                     security_protocol=SECURITY_PROTOCOLS.get(e.security_protocol, 0))
                           for e in eps],
                rack=node.get("rack")))
        return um.UpdateMetadataRequest(
            controller_id=self.broker_id, controller_epoch=self.epoch, broker_epoch=-1,
            type=FULL_REQUEST if full else 0,
            topic_states=[um.UpdateMetadataTopicState(topic_name=t, topic_id=ids[t], partition_states=ps)
                          for t, ps in topics.items()],
            ungrouped_partition_states=[s for ps in topics.values() for s in ps],
            live_brokers=brokers)

    def _stop_replica(self, keys: list[Key], delete: bool) -> sm.StopReplicaRequest:
        by_topic: dict[str, list[int]] = {}
        for t, p in keys:
            by_topic.setdefault(t, []).append(p)
        return sm.StopReplicaRequest(
            controller_id=self.broker_id, controller_epoch=self.epoch, broker_epoch=-1, delete_partitions=delete,
            ungrouped_partitions=[sm.StopReplicaPartitionV0(topic_name=t, partition_index=p) for t, p in keys],
            topics=[sm.StopReplicaTopicV1(name=t, partition_indexes=ps) for t, ps in by_topic.items()],
            topic_states=[sm.StopReplicaTopicState(topic_name=t, partition_states=[
                sm.StopReplicaPartitionState(partition_index=p, leader_epoch=-1, delete_partition=delete) for p in ps])
                for t, ps in by_topic.items()])

