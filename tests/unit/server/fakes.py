"""In-memory fakes of the broker's collaborators, for handler tests without sockets, disks or a broker.

- `MemoryLog`: a partition log in memory (whole v2 batches, offsets and leader epochs patched in place
  as `storage.Log` does); `MemoryLogs`: the log directories over such logs (the replica manager's
  `LogProvider`, the controller channel's `LogStore`, DescribeLogDirs' `LogDirs`).
- `FakeAlterPartition`: records ISR proposals and accepts or refuses them.
- `until(condition, what)`: wait on the running loop for a condition, with a deadline.
- `make_services(...)`: the real ReplicaManager, MetadataCache, Coordinators and embedded controller
  channel (the cluster controller over the embedded store, in memory) over these fakes, with the
  worker pool inline, and `context(services, api_key, api_version)` for one request.

Record batches are built by `odradek.records.builder` (the client's builder), so the bytes are those a
producer sends.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from odradek.cluster.controller import Controller
from odradek.cluster.store import EmbeddedStore
from odradek.cluster.topics import PartitionState, TopicInfo
from odradek.protocol.error_codes import ErrorCode, KafkaApiError
from odradek.protocol.headers import RequestHeader
from odradek.records.batch import RecordBatch
from odradek.records.builder import RecordBatchBuilder
from odradek.records.header import iter_headers, set_base_offset, set_partition_leader_epoch
from odradek.server.config import BrokerConfig
from odradek.server.context import RequestContext, Services
from odradek.server.coordinators import Coordinators
from odradek.server.embedded_controller import EmbeddedController
from odradek.server.fetch_session import FetchSessionCache
from odradek.server.metadata_cache import BrokerEndpoint, BrokerRegistration, MetadataCache, MetadataImage
from odradek.server.replica_manager import ReplicaManager
from odradek.server.workers import InlinePool
from odradek.storage.errors import OffsetOutOfRangeError

LISTENER = "PLAINTEXT"


async def until(condition: Callable[[], object], what: str = "the condition", timeout: float = 10.0) -> None:
    """Return once `condition()` holds, checking each millisecond; fail after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.001)


def batch(*values: bytes, timestamp: int = 1_000, timestamps: list[int] | None = None) -> bytearray:
    b = RecordBatchBuilder()
    for i, v in enumerate(values):
        b.append(None, v, timestamp=timestamps[i] if timestamps is not None else timestamp)
    return bytearray(b.build())


class Clock:
    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


# ------------------------------------------------------------------------------------------ logs
@dataclass(frozen=True)
class MemorySlice:
    data: bytes

    @property
    def length(self) -> int:
        return len(self.data)

    def read(self) -> bytes:
        return self.data


@dataclass(frozen=True)
class AppendInfo:
    first_offset: int
    last_offset: int
    duplicate: bool = False


@dataclass(frozen=True)
class TimestampAndOffset:
    timestamp: int
    offset: int
    leader_epoch: int | None


@dataclass(frozen=True)
class Search:
    """A timestamp search over the records given, run when asked (as storage's TimestampScan)."""
    records: list[tuple[int, int]]     # (timestamp, offset) in offset order
    target: int | None                 # None: the first record with the largest timestamp

    def run(self) -> tuple[int, int] | None:
        if self.target is None:
            best = max((t for t, _ in self.records), default=-1)
            return next(((t, o) for t, o in self.records if t == best), None) if best >= 0 else None
        return next(((t, o) for t, o in self.records if t >= self.target), None)


class EpochCache:
    def __init__(self) -> None:
        self.entries: list[tuple[int, int]] = []   # (epoch, start offset)

    def epoch_for_offset(self, offset: int) -> int | None:
        found = [e for e, start in self.entries if start <= offset]
        return found[-1] if found else None

    @property
    def latest_epoch(self) -> int | None:
        return self.entries[-1][0] if self.entries else None

    def assign(self, epoch: int, start_offset: int) -> None:
        if epoch >= 0 and (not self.entries or epoch > self.entries[-1][0]):
            self.entries.append((epoch, start_offset))


class MemoryLog:
    """A partition log in memory: `batches` are (base offset, next offset, bytes)."""

    def __init__(self, topic: str = "t", partition: int = 0) -> None:
        self.topic, self.partition = topic, partition
        self.batches: list[tuple[int, int, bytes]] = []
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.high_watermark = 0
        self.leader_epoch_cache = EpochCache()
        self.size_bytes = 0
        self.first_unstable_offset: int | None = None
        self.aborted: list = []
        self.cache_keep_bytes: int | None = None

    def collect_aborted_transactions(self, fetch_offset: int, upper_bound_offset: int) -> list:
        return [a for a in self.aborted if a.last_offset >= fetch_offset and a.first_offset < upper_bound_offset]

    def update_config(self, config: object) -> None:
        self.config = config

    def update_high_watermark(self, offset: int) -> int:
        self.high_watermark = min(max(offset, self.log_start_offset), self.log_end_offset)
        return self.high_watermark

    def append(self, records: Any, leader_epoch: int, now_ms: int, log_append_time: bool = False, *,
               coordinator: bool = False) -> AppendInfo:
        buf = bytearray(records)
        first = offset = self.log_end_offset
        for h in list(iter_headers(buf)):
            set_base_offset(buf, h.pos, offset)
            set_partition_leader_epoch(buf, h.pos, leader_epoch)
            self.batches.append((offset, offset + h.last_offset_delta + 1, bytes(buf[h.pos:h.pos + h.size])))
            offset += h.last_offset_delta + 1
        self.leader_epoch_cache.assign(leader_epoch, first)
        self.log_end_offset = offset
        self.size_bytes += len(buf)
        return AppendInfo(first, offset - 1)

    def append_as_follower(self, records: Any, now_ms: int) -> AppendInfo:
        buf = bytes(records)
        headers = list(iter_headers(buf))
        for h in headers:
            self.batches.append((h.base_offset, h.next_offset, buf[h.pos:h.pos + h.size]))
            self.leader_epoch_cache.assign(h.partition_leader_epoch, h.base_offset)
        self.log_end_offset = headers[-1].next_offset
        self.size_bytes += len(buf)
        return AppendInfo(headers[0].base_offset, headers[-1].last_offset)

    def read(self, start_offset: int, max_bytes: int, max_offset: int | None = None,
             min_one_batch: bool = True) -> list[MemorySlice]:
        if not self.log_start_offset <= start_offset <= self.log_end_offset:
            raise OffsetOutOfRangeError(start_offset, self.log_start_offset, self.log_end_offset, "fetch")
        end = self.log_end_offset if max_offset is None else min(max_offset, self.log_end_offset)
        out: list[MemorySlice] = []
        size = 0
        for base, nxt, data in self.batches:
            if nxt <= start_offset:
                continue
            if nxt > end or (size + len(data) > max_bytes and not (min_one_batch and not out)):
                break
            out.append(MemorySlice(data))
            size += len(data)
        return out

    def end_offset_for_epoch(self, leader_epoch: int) -> tuple[int, int] | None:
        """As `storage.Log`: the largest epoch <= leader_epoch and where the next one starts."""
        entries = self.leader_epoch_cache.entries
        if not entries or leader_epoch > entries[-1][0]:
            return None
        if leader_epoch == entries[-1][0]:
            return leader_epoch, self.log_end_offset
        higher = next(i for i, (e, _) in enumerate(entries) if e > leader_epoch)
        if higher == 0:
            return leader_epoch, entries[0][1]
        return entries[higher - 1][0], entries[higher][1]

    def _records(self) -> list[tuple[int, int]]:
        return [(r.timestamp, r.offset) for _, _, data in self.batches for r in RecordBatch(data).records()
                if r.offset >= self.log_start_offset]

    def timestamp_scans(self, timestamp: int) -> Iterator[Search]:
        yield Search(self._records(), timestamp)

    def max_timestamp_scan(self) -> Search | None:
        return Search(self._records(), None) if self.batches else None

    def timestamp_and_offset(self, timestamp: int, offset: int) -> TimestampAndOffset:
        return TimestampAndOffset(timestamp, offset, self.leader_epoch_cache.epoch_for_offset(offset))

    def delete_records_before(self, offset: int, now_ms: int) -> int:
        if not 0 <= offset <= self.high_watermark:
            raise OffsetOutOfRangeError(offset, self.log_start_offset, self.high_watermark, "DeleteRecords")
        self.log_start_offset = max(self.log_start_offset, offset)
        self.batches = [b for b in self.batches if b[1] > self.log_start_offset]
        return self.log_start_offset


class MemoryLogs:
    """The log directories, in memory."""

    def __init__(self, log_dirs: list[Path] | None = None) -> None:
        # A real directory: removing logs fsyncs their log dir.
        self.log_dirs = log_dirs or [Path(tempfile.gettempdir())]
        self.opened: dict[tuple[str, int], MemoryLog] = {}
        self.deleted: list[tuple[str, int]] = []

    def open_log(self, topic: str, partition: int, now_ms: int) -> MemoryLog:
        return self.opened.setdefault((topic, partition), MemoryLog(topic, partition))

    def get_log(self, topic: str, partition: int) -> MemoryLog | None:
        return self.opened.get((topic, partition))

    def get_or_create_log(self, topic: str, partition: int, now_ms: int, config: object = None) -> MemoryLog:
        return self.open_log(topic, partition, now_ms)

    def update_cleaner_config(self, config: object) -> None:
        self.cleaner_config = config

    def update_move_throttle(self, bytes_per_second: int) -> None:
        self.move_throttle = bytes_per_second

    def delete_log(self, topic: str, partition: int, now_ms: int, *, sync: bool = True) -> bool:
        if self.opened.pop((topic, partition), None) is None:
            return False
        self.deleted.append((topic, partition))
        return True

    def logs(self) -> Iterator[tuple[tuple[str, int], MemoryLog]]:
        return iter(list(self.opened.items()))

    def log_dir_of(self, topic: str, partition: int) -> Path | None:
        return self.log_dirs[0] if (topic, partition) in self.opened else None

    def future_logs(self) -> Iterator[tuple[tuple[str, int], MemoryLog, Path]]:
        """No replica moves between log dirs here (the real ones: tests/unit/storage/test_log_mover.py)."""
        return iter(())


# ------------------------------------------------------------------------------------------ ISR changes
@dataclass
class FakeAlterPartition:
    """The AlterPartition channel: each proposal recorded; accepted at the next partition epoch
    unless `refuse` names an error."""
    proposals: list[tuple[str, int, int, tuple[int, ...]]] = field(default_factory=list)
    refuse: ErrorCode | None = None

    async def alter_isr(self, topic: str, partition: int, leader_epoch: int, isr: tuple[int, ...],
                        partition_epoch: int) -> int:
        self.proposals.append((topic, partition, leader_epoch, isr))
        if self.refuse is not None:
            raise KafkaApiError(self.refuse)
        return partition_epoch + 1


# ------------------------------------------------------------------------------------------ wiring
def topic(name: str, partitions: int = 1, *, replicas: list[int] | None = None, leader: int | None = None,
          leader_epoch: int = 0, isr: list[int] | None = None, configs: dict[str, str] | None = None) -> TopicInfo:
    replicas = replicas if replicas is not None else [0]
    return TopicInfo(name, uuid.uuid4(), {
        p: PartitionState(replicas[0] if leader is None else leader, leader_epoch,
                          list(replicas if isr is None else isr), list(replicas))
        for p in range(partitions)}, dict(configs or {}))


def broker_config(**overrides: str) -> BrokerConfig:
    return BrokerConfig({"broker.id": "0", **{k.replace("_", "."): v for k, v in overrides.items()}})


def registration(broker_id: int, port: int = 9092) -> BrokerRegistration:
    return BrokerRegistration(broker_id, (BrokerEndpoint(LISTENER, "localhost", port),))


def make_services(*topics: TopicInfo, broker_id: int = 0, brokers: tuple[int, ...] = (0,),
                  config: BrokerConfig | None = None, clock: Clock | None = None,
                  alter_partition: FakeAlterPartition | None = None) -> Services:
    """The broker's collaborators over in-memory logs and store; `topics` are recorded as they are
    given (replicas, leaders, ISRs) and the partitions hosted here opened and published."""
    clock = clock or Clock()
    image = MetadataImage(config or broker_config(), cluster_id="fake-cluster", controller_id=brokers[0],
                          brokers={b: registration(b, 9092 + b) for b in brokers})
    metadata = MetadataCache(image)
    logs = MemoryLogs()
    rm = ReplicaManager(broker_id, logs, metadata, clock)
    cluster = Controller(EmbeddedStore(), broker_id)
    cluster.start()
    if topics:
        cluster.commit(cluster.creation_ops(list(topics)))
        for info in topics:
            cluster.publish(info)
    workers = InlinePool()
    controller = EmbeddedController(broker_id, cluster.store, cluster, logs, rm, metadata, workers, clock)
    controller.open_all(clock())
    rm.alter_partition = alter_partition if alter_partition is not None else controller
    coordinators = Coordinators(broker_id, rm, metadata, controller, clock)
    return Services(broker_id=broker_id, clock=clock, metadata=metadata, replica_manager=rm,
                    coordinators=coordinators, controller=controller, log_dirs=logs, workers=workers,
                    fetch_sessions=FetchSessionCache(10))


def context(services: Services, api_key: int, api_version: int, client_id: str = "test") -> RequestContext:
    header = RequestHeader(api_key=api_key, api_version=api_version, correlation_id=1, client_id=client_id)
    return RequestContext(services, header, None, LISTENER)
