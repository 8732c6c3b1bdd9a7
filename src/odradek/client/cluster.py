"""Bootstrapping, the metadata cache and one connection per broker (seed 004, "Partitioning and
bootstrapping").

1. Cycle through `bootstrap.servers` until one answers; fetch metadata.
2. Send produce and fetch requests to the partition's leader, over that broker's one connection.
3. On an error that says the metadata is stale (a lost connection, NOT_LEADER_OR_FOLLOWER,
   UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE, ...) call `request_update()`; the next
   `maybe_refresh()` fetches metadata again. Metadata older than `metadata.max.age.ms` is refreshed too.

`ClusterMetadata` is plain data, updated from Metadata responses and read by the producer and consumer.
`Cluster` holds the connections and does the I/O. It runs no task: its owners (producer sender,
consumer fetcher) call `maybe_refresh()` from their own loops, and `connection()` connects on demand,
at most one attempt per broker at a time, with `reconnect.backoff.ms` (doubling up to
`reconnect.backoff.max.ms`) after failures.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import re
import time
from dataclasses import dataclass, field

from odradek.client.errors import BrokerResponseError, KafkaConnectionError, KafkaTimeoutError
from odradek.client.network import BrokerConnection
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import metadata as md

log = logging.getLogger("odradek.client")

METADATA_KEY = 3

# Partition or topic errors that mean "your metadata is out of date".
STALE_METADATA_ERRORS = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.REPLICA_NOT_AVAILABLE,
    ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.BROKER_NOT_AVAILABLE,
    ErrorCode.UNKNOWN_TOPIC_ID, ErrorCode.INCONSISTENT_TOPIC_ID, ErrorCode.OFFSET_NOT_AVAILABLE,
})


def now_ms() -> float:
    return time.monotonic() * 1000


@dataclass(slots=True)
class PartitionInfo:
    partition: int
    leader: int            # -1 without a leader
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    error: int


@dataclass(slots=True)
class TopicInfo:
    name: str
    error: int
    partitions: dict[int, PartitionInfo] = field(default_factory=dict)
    topic_id: object = None
    available: list[int] = field(default_factory=list)   # partitions with a leader, ascending

    @property
    def num_partitions(self) -> int:
        return len(self.partitions)


class ClusterMetadata:
    """The cached view of brokers and topics."""

    def __init__(self) -> None:
        self.brokers: dict[int, tuple[str, int, str | None]] = {}
        self.topics: dict[str, TopicInfo] = {}
        self.cluster_id: str | None = None
        self.controller_id = -1
        self.last_refresh_ms = 0.0
        self.version = 0  # bumped on every update

    def update(self, response: md.MetadataResponse, at_ms: float, requested: set[str] | None) -> None:
        """Apply a Metadata response. Topics asked for but missing from the answer are dropped."""
        self.brokers = {b.node_id: (b.host, b.port, b.rack) for b in response.brokers}
        self.cluster_id = response.cluster_id
        self.controller_id = response.controller_id
        seen = set()
        for t in response.topics:
            if t.name is None:
                continue
            seen.add(t.name)
            if t.error_code != 0 and t.error_code != ErrorCode.LEADER_NOT_AVAILABLE and not t.partitions:
                self.topics[t.name] = TopicInfo(t.name, t.error_code, {}, t.topic_id)
                continue
            parts = {p.partition_index: PartitionInfo(p.partition_index, p.leader_id, p.leader_epoch,
                                                      list(p.replica_nodes), list(p.isr_nodes), p.error_code)
                     for p in t.partitions}
            available = sorted(p for p, info in parts.items() if info.leader >= 0 and info.leader in self.brokers)
            self.topics[t.name] = TopicInfo(t.name, t.error_code, parts, t.topic_id, available)
        if requested is None:
            for name in list(self.topics):
                if name not in seen:
                    del self.topics[name]
        self.last_refresh_ms = at_ms
        self.version += 1

    def topic(self, name: str) -> TopicInfo | None:
        return self.topics.get(name)

    def leader_for(self, topic: str, partition: int) -> int:
        t = self.topics.get(topic)
        if t is None:
            return -1
        p = t.partitions.get(partition)
        if p is None or p.leader not in self.brokers:
            return -1
        return p.leader

    def leader_epoch(self, topic: str, partition: int) -> int:
        t = self.topics.get(topic)
        p = t.partitions.get(partition) if t is not None else None
        return p.leader_epoch if p is not None else -1


def _refused(error: BaseException | None) -> bool:
    """A connect refused at every address the host name resolved to (asyncio joins several failures
    into one OSError "Multiple exceptions: [Errno 111] ..., [Errno 111] ..."); an address family the
    host cannot use (no IPv6 route) counts as nothing listening there."""
    if isinstance(error, ConnectionRefusedError):
        return True
    text = str(error or "")
    if not text.startswith("Multiple exceptions: "):
        return False
    codes = {int(c) for c in re.findall(r"\[Errno (\d+)\]", text)}
    return errno.ECONNREFUSED in codes and codes <= {errno.ECONNREFUSED, errno.EADDRNOTAVAIL, errno.ENETUNREACH}


class Cluster:
    """Connections to the brokers of one cluster, and its metadata."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.metadata = ClusterMetadata()
        self.bootstrap = list(config["bootstrap.servers"])
        self.topics: set[str] = set()             # topics the owner cares about
        self.allow_auto_create = config.get("allow.auto.create.topics", True)
        self._conns: dict[int, BrokerConnection] = {}
        self._connecting: dict[int, asyncio.Future] = {}
        self._failures: dict[int, tuple[int, float]] = {}   # node -> (consecutive failures, retry at ms)
        self._refused: dict[int, bool] = {}   # bootstrap node -> its last connect was refused
        self._need_update = True
        self._refresh_lock = asyncio.Lock()
        self._last_attempt_ms = -1e18
        self._updated = asyncio.Event()
        self.closed = False

    # ------------------------------------------------------------------------------------ metadata
    def request_update(self) -> None:
        self._need_update = True

    def add_topics(self, topics) -> None:
        """Track more topics; a new one may be fetched at once, without retry.backoff.ms (as Java's
        Metadata.requestUpdateForNewTopics: the backoff is for failures, not for new topics)."""
        new = set(topics) - self.topics
        if new:
            self.topics |= new
            self._need_update = True
            self._last_attempt_ms = -1e18

    def stale(self) -> bool:
        age = now_ms() - self.metadata.last_refresh_ms
        return self._need_update or age >= self.config["metadata.max.age.ms"]

    async def maybe_refresh(self) -> None:
        """Refresh if asked to or too old, no more often than `retry.backoff.ms`; errors are logged."""
        if not self.stale() or now_ms() - self._last_attempt_ms < self.config["retry.backoff.ms"]:
            return
        try:
            await self.refresh()
        except KafkaConnectionError as e:
            log.info("metadata refresh failed: %s", e)

    async def refresh(self) -> ClusterMetadata:
        """Fetch metadata for the tracked topics now (one refresh at a time; callers share it)."""
        version = self.metadata.version
        async with self._refresh_lock:
            if self.metadata.version != version and not self._need_update:
                return self.metadata  # someone refreshed while we waited
            self._last_attempt_ms = now_ms()
            topics = sorted(self.topics)
            self._need_update = False
            request = md.MetadataRequest(
                topics=[md.MetadataRequestTopic(name=t) for t in topics],
                allow_auto_topic_creation=self.allow_auto_create)
            try:
                response = await self.request_any(METADATA_KEY, request)
            except BaseException:
                self._need_update = True
                raise
            if response.error_code:
                self._need_update = True
                raise BrokerResponseError(response.error_code, "metadata request failed")
            self.metadata.update(response, now_ms(), set(topics))
            for t in response.topics:
                if t.error_code in STALE_METADATA_ERRORS or any(p.error_code in STALE_METADATA_ERRORS
                                                                or p.leader_id < 0 for p in t.partitions):
                    self._need_update = True
            self._updated.set()
            self._updated = asyncio.Event()
            return self.metadata

    async def wait_for_topic(self, topic: str, timeout_ms: float) -> TopicInfo:
        """Metadata of a topic with partitions, refreshing as needed, or KafkaTimeoutError."""
        self.add_topics([topic])
        deadline = now_ms() + timeout_ms
        while True:
            info = self.metadata.topic(topic)
            if info is not None and info.partitions:
                return info
            if info is not None and info.error not in (0, *STALE_METADATA_ERRORS):
                raise BrokerResponseError(info.error, f"topic {topic}")
            left = deadline - now_ms()
            if left <= 0:
                raise KafkaTimeoutError(f"topic {topic} not in the metadata after {timeout_ms} ms")
            if self._refresh_lock.locked():
                # A refresh is in flight (another waiter's): its answer may hold the topic; wait for
                # it rather than for retry.backoff.ms after its start.
                try:
                    async with asyncio.timeout(left / 1000):
                        async with self._refresh_lock:
                            pass
                except TimeoutError:
                    pass
                continue
            self._need_update = True
            wait = max(0.0, self.config["retry.backoff.ms"] - (now_ms() - self._last_attempt_ms))
            if wait:
                await asyncio.sleep(min(wait, left) / 1000)
            try:
                async with asyncio.timeout(max(deadline - now_ms(), 1) / 1000):
                    await self.refresh()
            except TimeoutError:
                pass
            except KafkaConnectionError as e:
                log.info("metadata refresh failed: %s", e)

    # ------------------------------------------------------------------------------------ connections
    def connection_nowait(self, node_id: int) -> BrokerConnection | None:
        conn = self._conns.get(node_id)
        return conn if conn is not None and not conn.closed else None

    def connection_failed_recently(self, node_id: int) -> bool:
        f = self._failures.get(node_id)
        return f is not None and now_ms() < f[1]

    async def connection(self, node_id: int) -> BrokerConnection:
        """The connection to a broker (negative ids: bootstrap servers), connecting if needed."""
        conn = self._conns.get(node_id)
        if conn is not None and not conn.closed:
            return conn
        pending = self._connecting.get(node_id)
        if pending is None:
            pending = asyncio.get_running_loop().create_future()
            self._connecting[node_id] = pending
            try:
                conn = await self._connect(node_id)
                pending.set_result(conn)
            except BaseException as e:
                pending.set_exception(e)
                pending.exception()
                raise
            finally:
                del self._connecting[node_id]
            return conn
        return await asyncio.shield(pending)

    async def _connect(self, node_id: int) -> BrokerConnection:
        if self.closed:
            raise KafkaConnectionError("client closed")
        failures, retry_at = self._failures.get(node_id, (0, 0.0))
        wait = retry_at - now_ms()
        if wait > 0:
            await asyncio.sleep(wait / 1000)
        if node_id >= 0:
            if node_id not in self.metadata.brokers:
                raise KafkaConnectionError(f"broker {node_id} is not in the metadata")
            host, port, _ = self.metadata.brokers[node_id]
        else:
            host, port = self.bootstrap[(-node_id - 1) % len(self.bootstrap)]
        c = self.config
        try:
            conn = await BrokerConnection.connect(
                host, port, node_id=node_id, client_id=c["client.id"],
                request_timeout_ms=c["request.timeout.ms"],
                connect_timeout_ms=c["socket.connection.setup.timeout.ms"],
                max_in_flight_requests=c["max.in.flight.requests.per.connection"],
                max_frame_bytes=c["receive.message.max.bytes"],
                software_name=c["client.software.name"], software_version=c["client.software.version"])
        except KafkaConnectionError as e:
            if node_id < 0:
                self._refused[node_id] = _refused(e.__cause__)
            backoff = min(c["reconnect.backoff.ms"] * (2 ** failures), c["reconnect.backoff.max.ms"])
            self._failures[node_id] = (failures + 1, now_ms() + backoff)
            if node_id >= 0:
                self._need_update = True
            raise
        self._failures.pop(node_id, None)
        self._refused.pop(node_id, None)
        if self.closed:
            conn.close()
            raise KafkaConnectionError("client closed")
        self._conns[node_id] = conn
        return conn

    async def request_any(self, api_key: int, body, *, timeout_ms: int | None = None):
        """Send to any live broker: an open connection first, then known brokers, then bootstrap."""
        candidates = [n for n, conn in self._conns.items() if not conn.closed]
        candidates += [n for n in self.metadata.brokers if n not in candidates]
        candidates += [-(i + 1) for i in range(len(self.bootstrap))]
        last: Exception | None = None
        for node in candidates:
            if self.connection_nowait(node) is None and self.connection_failed_recently(node):
                continue
            try:
                conn = await self.connection(node)
                return await conn.request(api_key, body, timeout_ms=timeout_ms)
            except KafkaConnectionError as e:
                last = e
        raise KafkaConnectionError(f"no broker answered: {last}") from last

    async def request(self, node_id: int, api_key: int, body, *, timeout_ms: int | None = None):
        conn = await self.connection(node_id)
        return await conn.request(api_key, body, timeout_ms=timeout_ms)

    async def start(self, timeout_ms: float | None = None) -> None:
        """Bootstrap: the first metadata, from the first bootstrap server that answers."""
        timeout_ms = timeout_ms if timeout_ms is not None else self.config["request.timeout.ms"]
        deadline = now_ms() + timeout_ms
        while True:
            try:
                async with asyncio.timeout(max(deadline - now_ms(), 1) / 1000):
                    await self.refresh()
                return
            except (KafkaConnectionError, TimeoutError) as e:
                if now_ms() >= deadline:
                    raise KafkaTimeoutError(f"could not bootstrap from {self.bootstrap}: {e}") from e
                if self.config["bootstrap.refused.fail.fast"] and self._every_bootstrap_refused():
                    # Nothing listens at any address: no point waiting out the timeout (librdkafka
                    # reports "all brokers down" at once too). The same error as a timeout, sooner.
                    raise KafkaTimeoutError(f"could not bootstrap from {self.bootstrap}: every address "
                                            f"refused the connection (connection refused)") from e
                await asyncio.sleep(min(self.config["reconnect.backoff.ms"], deadline - now_ms()) / 1000)

    def _every_bootstrap_refused(self) -> bool:
        """No broker known yet and every bootstrap address refused its last connection attempt."""
        return (not self.metadata.brokers and not self._conns
                and all(self._refused.get(-(i + 1)) for i in range(len(self.bootstrap))))

    async def aclose(self) -> None:
        self.closed = True
        for conn in list(self._conns.values()):
            conn.close()
        self._conns.clear()
