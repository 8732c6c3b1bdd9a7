"""Replica fetchers: followers copy their leaders' logs (seed 003, "Replication": "Followers consume
messages from the leader just as a normal Kafka consumer would and apply them to their own log";
Kafka's ReplicaFetcherManager and ReplicaFetcherThread, KIP-101 and KIP-279 for truncation).

One fetcher task per source broker (the leader), its partitions batched into one Fetch request with
this broker's id as the replica id and each partition's leader epoch, so the leader fences a follower
that is behind on leadership changes and counts the fetch offset as the follower's log end offset
(which moves the high watermark and grows the ISR). Each fetcher keeps an incremental fetch session
(KIP-227) with its leader (replica_fetch_session.py): a request names only the partitions whose fetch
position moved, and the answer carries only the partitions with something new.

A partition added to a fetcher first truncates (KIP-279): the follower asks the leader, with
OffsetForLeaderEpoch, where its latest leader epoch ends on the leader, finds the same epoch in its own
cache, and truncates its log to the smaller of the two ends; so a replica that was a leader and wrote
records the new leader never got (an unclean or a paused leader) never keeps a divergent tail. Without
an epoch in its cache it truncates to its high watermark (the pre-KIP-101 rule). Then it fetches from
its log end; the leader's batches are appended as they are and the leader's high watermark taken.

Errors per partition: OFFSET_OUT_OF_RANGE truncates again (a leader whose log starts later makes the
follower start over at the leader's log start); NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH and
UNKNOWN_TOPIC_OR_PARTITION hold the partition back (the controller's next LeaderAndIsr says what to do). An
unreachable leader backs the whole fetcher off for `replica.fetch.backoff.ms`.

A fetch parks on the leader for up to `replica.fetch.wait.max.ms` while it has nothing to send. A
partition added to the fetcher meanwhile (a new topic, a leader that moved here) does not wait for it:
the parked fetch is given up and its connection closed (an answer on it would come only after the
parked one's), and the next fetch asks for every partition on a new connection. Kafka's fetcher thread
waits for its fetch to come back: a new replicated topic's first acks=all writes waited about 470 ms
whenever the followers already fetched something idle from the same leader.

A partition's hold grows from `FIRST_HOLD_MS`, doubling with each error in a row, up to
`replica.fetch.backoff.ms` (the exponential backoff Kafka's clients have had since KIP-580), and a fetch
that succeeds ends the run. Kafka holds every such partition for the full `replica.fetch.backoff.ms`
(1 s by default). That costs a second in the common case: the controller sends LeaderAndIsr to the
leader and the followers at once, a follower that gets there first finds the leader not leading yet
(NOT_LEADER_OR_FOLLOWER), and every acks=all write to a topic just created waited the full second; here
it was 6 in 20 creations of a 3-partition RF 3 topic on three local brokers. The leader has its
LeaderAndIsr a few milliseconds later, which the first short hold covers.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Callable, Protocol

from odradek.protocol.error_codes import ErrorCode, KafkaApiError, for_code
from odradek.protocol.messages import fetch as fm
from odradek.protocol.messages import offset_for_leader_epoch as om
from odradek.server.inter_broker import BrokerUnreachable
from odradek.server.replica_fetch_session import FetchSessionHandler, Position
from odradek.storage.errors import StorageError

log = logging.getLogger("odradek.replica_fetcher")

FIRST_HOLD_MS = 10      # a partition's first hold after an error; doubled per error in a row

FETCH_KEY = 1
OFFSET_FOR_LEADER_EPOCH_KEY = 23
TopicPartition = tuple[str, int]


class Requester(Protocol):
    async def request(self, purpose: str, broker_id: int, api_key: int, body: object, *,
                      timeout_ms: int | None = None) -> object: ...

    def drop(self, purpose: str, broker_id: int) -> None: ...


class FollowerReplicas(Protocol):
    """What a fetcher needs of the replica manager."""

    def follower_log_end_offset(self, topic: str, index: int) -> int | None: ...

    def follower_truncation_point(self, topic: str, index: int, leader_epoch: int,
                                  leader_end_offset: int) -> int | None: ...

    def follower_latest_epoch(self, topic: str, index: int) -> int | None: ...

    def truncate_follower(self, topic: str, index: int, offset: int, *, fully: bool, now_ms: int) -> None: ...

    def append_to_follower(self, topic: str, index: int, records: bytes | memoryview, leader_high_watermark: int,
                           now_ms: int) -> object: ...

    def update_follower_from_leader(self, topic: str, index: int, leader_high_watermark: int) -> None: ...


@dataclass(frozen=True)
class FetcherConfig:
    replica_id: int
    max_wait_ms: int = 500
    min_bytes: int = 1
    partition_max_bytes: int = 1 << 20
    response_max_bytes: int = 10 << 20
    backoff_ms: int = 1000
    request_timeout_ms: int = 30_000


@dataclass
class FetchState:
    leader_epoch: int
    truncating: bool = True
    held_until: float = 0.0     # loop time before which the partition is not fetched
    errors: int = 0             # errors in a row: the next hold is FIRST_HOLD_MS doubled this many times

    def hold_ms(self, cap_ms: int) -> int:
        """The next hold, and count the error it is for."""
        hold = min(cap_ms, FIRST_HOLD_MS << min(self.errors, 30))
        self.errors += 1
        return hold


class ReplicaFetcher:
    """The fetcher of every partition this broker follows whose leader is `leader_id`."""

    def __init__(self, leader_id: int, replicas: FollowerReplicas, requester: Requester, config: FetcherConfig,
                 clock: Callable[[], int]) -> None:
        self.leader_id = leader_id
        self.replicas = replicas
        self.requester = requester
        self.config = config
        self.clock = clock
        self.partitions: dict[TopicPartition, FetchState] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.purpose = f"fetcher-{leader_id}"
        self.session = FetchSessionHandler()                        # KIP-227, with this leader
        self._inflight: asyncio.Task[None] | None = None            # the fetch out now
        self._inflight_epochs: dict[TopicPartition, int] = {}       # what it asks for
        self._interrupted = False
        self._closing = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"replica-fetcher-{self.leader_id}")

    async def aclose(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def add(self, key: TopicPartition, leader_epoch: int) -> None:
        st = self.partitions.get(key)
        if st is None or st.leader_epoch != leader_epoch:
            self.partitions[key] = FetchState(leader_epoch)
            self._changed.set()
            inflight = self._inflight
            if inflight is not None and not inflight.done() and self._inflight_epochs.get(key) != leader_epoch:
                self._interrupted = True
                inflight.cancel()

    def remove(self, key: TopicPartition) -> None:
        if self.partitions.pop(key, None) is not None:
            self._changed.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.partitions:
                self._changed.clear()
                await self._changed.wait()
                continue
            now = loop.time()
            ready = {k: s for k, s in self.partitions.items() if s.held_until <= now}
            if not ready:
                self._changed.clear()
                wake = min(s.held_until for s in self.partitions.values()) - now
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout=max(wake, 0.001))
                except asyncio.TimeoutError:
                    pass
                continue
            try:
                truncating = {k: s for k, s in ready.items() if s.truncating}
                if truncating:
                    await self._truncate(truncating)
                else:
                    await self._fetch_interruptibly(ready)
            except BrokerUnreachable as e:
                log.info("fetching from broker %d: %s; retrying in %d ms", self.leader_id, e, self.config.backoff_ms)
                await self._backoff()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("replica fetcher of broker %d failed; retrying", self.leader_id)
                await self._backoff()

    async def _fetch_interruptibly(self, ready: dict[TopicPartition, FetchState]) -> None:
        """`_fetch`, given up when `add` brings a partition it does not ask for (see the docstring)."""
        task = asyncio.get_running_loop().create_task(self._fetch(ready))
        self._inflight, self._inflight_epochs = task, {k: s.leader_epoch for k, s in ready.items()}
        try:
            await task
        except asyncio.CancelledError:
            if not self._interrupted or self._closing:
                raise
            self.requester.drop(self.purpose, self.leader_id)
        finally:
            self._inflight, self._inflight_epochs, self._interrupted = None, {}, False

    async def _backoff(self) -> None:
        """Wait `replica.fetch.backoff.ms`, or less if the fetcher's partitions change meanwhile."""
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout=self.config.backoff_ms / 1000)
        except asyncio.TimeoutError:
            pass

    def _hold(self, key: TopicPartition) -> None:
        st = self.partitions.get(key)
        if st is not None:
            st.held_until = asyncio.get_running_loop().time() + st.hold_ms(self.config.backoff_ms) / 1000

    def _succeeded(self, key: TopicPartition) -> None:
        st = self.partitions.get(key)
        if st is not None:
            st.errors = 0

    # ------------------------------------------------------------------------------ truncation
    async def _truncate(self, states: dict[TopicPartition, FetchState]) -> None:
        asked: dict[TopicPartition, tuple[int, int]] = {}
        topics: dict[str, list[om.OffsetForLeaderPartition]] = {}
        now = self.clock()
        for key, st in states.items():
            epoch = self.replicas.follower_latest_epoch(*key)
            if epoch is None:
                self._truncate_to_high_watermark(key, now)
                st.truncating = False
                continue
            asked[key] = (epoch, st.leader_epoch)
            topics.setdefault(key[0], []).append(om.OffsetForLeaderPartition(
                partition=key[1], current_leader_epoch=st.leader_epoch, leader_epoch=epoch))
        if not topics:
            return
        request = om.OffsetForLeaderEpochRequest(
            replica_id=self.config.replica_id,
            topics=[om.OffsetForLeaderTopic(topic=t, partitions=ps) for t, ps in topics.items()])
        response = await self.requester.request(self.purpose, self.leader_id, OFFSET_FOR_LEADER_EPOCH_KEY, request,
                                                timeout_ms=self.config.request_timeout_ms)
        now = self.clock()
        for t in response.topics:                      # type: ignore[attr-defined]
            for p in t.partitions:
                key = (t.topic, p.partition)
                held = self.partitions.get(key)
                if held is None or key not in asked or held.leader_epoch != asked[key][1]:
                    continue
                code = for_code(p.error_code)
                if code is not ErrorCode.NONE:
                    log.info("truncation of %s-%d: the leader answered %s", key[0], key[1], code.name)
                    self._hold(key)
                    continue
                if p.end_offset < 0:
                    self._truncate_to_high_watermark(key, now)
                else:
                    point = self.replicas.follower_truncation_point(key[0], key[1], p.leader_epoch, p.end_offset)
                    if point is not None:
                        self._truncate_to(key, point, now)
                held.truncating = False

    def _truncate_to_high_watermark(self, key: TopicPartition, now_ms: int) -> None:
        point = self.replicas.follower_truncation_point(key[0], key[1], -1, -1)
        if point is not None:
            self._truncate_to(key, point, now_ms)

    def _truncate_to(self, key: TopicPartition, offset: int, now_ms: int) -> None:
        leo = self.replicas.follower_log_end_offset(*key)
        if leo is not None and offset < leo:
            log.info("truncating %s-%d from %d to %d (leader %d)", key[0], key[1], leo, offset, self.leader_id)
            try:
                self.replicas.truncate_follower(key[0], key[1], offset, fully=False, now_ms=now_ms)
            except (KafkaApiError, StorageError) as e:
                log.warning("truncating %s-%d failed: %s", key[0], key[1], e)
                self._hold(key)

    # ------------------------------------------------------------------------------ fetch
    async def _fetch(self, states: dict[TopicPartition, FetchState]) -> None:
        wanted: dict[TopicPartition, Position] = {}
        for key, st in states.items():
            leo = self.replicas.follower_log_end_offset(*key)
            if leo is None:
                self.partitions.pop(key, None)
                continue
            wanted[key] = (leo, st.leader_epoch, self.config.partition_max_bytes)
        if not wanted:
            return
        c = self.config
        asked = self.session.build(wanted)
        request = fm.FetchRequest(
            replica_id=c.replica_id, replica_state=fm.ReplicaState(replica_id=c.replica_id),
            max_wait_ms=c.max_wait_ms, min_bytes=c.min_bytes, max_bytes=c.response_max_bytes, isolation_level=0,
            session_id=asked.session_id, session_epoch=asked.epoch, topics=asked.topics,
            forgotten_topics_data=asked.forgotten)
        try:
            response = await self.requester.request(self.purpose, self.leader_id, FETCH_KEY, request,
                                                    timeout_ms=c.request_timeout_ms + c.max_wait_ms)
        except BaseException:          # unanswered (unreachable, given up, closing): start the session over
            self.session.failed()
            raise
        if not self.session.succeeded(response):                 # type: ignore[arg-type]
            log.info("fetch session with broker %d refused (%s); starting a new one", self.leader_id,
                     for_code(response.error_code).name)          # type: ignore[attr-defined]
            return
        now = self.clock()
        for t in response.responses:                   # type: ignore[attr-defined]
            for p in t.partitions:
                key = (t.topic, p.partition_index)
                held = self.partitions.get(key)
                if held is None or key not in wanted or held.leader_epoch != states[key].leader_epoch:
                    continue
                if self.replicas.follower_log_end_offset(*key) != wanted[key][0]:
                    continue            # truncated or changed while the fetch was out
                code = for_code(p.error_code)
                if code is ErrorCode.NONE:
                    self._append(key, p, now)
                elif code is ErrorCode.OFFSET_OUT_OF_RANGE:
                    self._out_of_range(key, wanted[key][0], p, now)
                else:
                    log.info("fetch of %s-%d from broker %d: %s", key[0], key[1], self.leader_id, code.name)
                    self._hold(key)

    def _append(self, key: TopicPartition, p: fm.PartitionData, now_ms: int) -> None:
        records = p.records
        try:
            if records:
                self.replicas.append_to_follower(key[0], key[1], records, p.high_watermark, now_ms)
            else:
                self.replicas.update_follower_from_leader(key[0], key[1], p.high_watermark)
        except (KafkaApiError, StorageError, ValueError) as e:
            log.warning("appending to follower %s-%d failed: %s", key[0], key[1], e)
            self._hold(key)
        else:
            self._succeeded(key)

    def _out_of_range(self, key: TopicPartition, offset: int, p: fm.PartitionData, now_ms: int) -> None:
        if p.log_start_offset > offset:
            log.info("%s-%d: the leader's log starts at %d, past %d; starting over there", key[0], key[1],
                     p.log_start_offset, offset)
            self.replicas.truncate_follower(key[0], key[1], p.log_start_offset, fully=True, now_ms=now_ms)
        else:
            st = self.partitions.get(key)
            if st is not None:
                st.truncating = True


class ReplicaFetcherManager:
    """The fetchers of this broker, one per leader it follows (Kafka's ReplicaFetcherManager)."""

    def __init__(self, replicas: FollowerReplicas, requester: Requester, config: FetcherConfig,
                 clock: Callable[[], int]) -> None:
        self.replicas = replicas
        self.requester = requester
        self.config = config
        self.clock = clock
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self._leader_of: dict[TopicPartition, int] = {}

    def follow(self, key: TopicPartition, leader_id: int, leader_epoch: int) -> None:
        """Fetch `key` from `leader_id` at `leader_epoch` (truncating first); moves it between fetchers."""
        old = self._leader_of.get(key)
        if old is not None and old != leader_id:
            self.fetchers[old].remove(key)
        if leader_id < 0:
            self._leader_of.pop(key, None)
            return
        fetcher = self.fetchers.get(leader_id)
        if fetcher is None:
            fetcher = self.fetchers[leader_id] = ReplicaFetcher(leader_id, self.replicas, self.requester,
                                                                self.config, self.clock)
            fetcher.start()
        fetcher.add(key, leader_epoch)
        self._leader_of[key] = leader_id

    def unfollow(self, keys: list[TopicPartition]) -> None:
        for key in keys:
            leader = self._leader_of.pop(key, None)
            if leader is not None:
                self.fetchers[leader].remove(key)

    def following(self) -> dict[TopicPartition, int]:
        return dict(self._leader_of)

    async def aclose(self) -> None:
        for f in self.fetchers.values():
            await f.aclose()
        self.fetchers.clear()
