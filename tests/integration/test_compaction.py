"""Log compaction on a real `odradek serve` (seed 003, "Log Compaction"): records produced with
confluent-kafka, read back with confluent-kafka and kafka-python.

- 1M keyed records over 10k keys with tombstones: after cleaning, every key's last record (tombstones
  included) is there at the offset the producer was given, in order, and little else is left;
- consumers reading over and over while a (throttled) cleaner runs see consistent data every time;
- tombstones stay for delete.retention.ms after the cleaning that first sees them, then go;
- kill -9 (the cleaner's fault points) at every step of a pass: the restarted broker lost nothing,
  has no leftover or overlapping segment, every batch's CRC holds, and cleaning goes on;
- `__consumer_offsets` stops growing under a steady stream of commits, and the broker's start time
  after 1M commits to 100 groups is within 2x of its start time after 1k commits.

Each record carries its sequence number in a header ("seq"); the producer's delivery reports give
the (partition, offset) of every sequence number, so a record read back is checked against exactly
what was written there. Whether the cleaner is done is read from `cleaner-offset-checkpoint` (it must
reach the active segment's base offset), the one thing these tests learn from the log dir.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import threading
import time
from array import array
from dataclasses import dataclass

import pytest

from .clients import assert_partition_valid, confluent_config, kafka_python_consumer, partition_dir, \
    segment_files, wait_until

MIB = 1024 * 1024
FAULT_ENV = "ODRADEK_CLEANER_FAULT"
FAULT_EXIT_CODE = 86
FAULT_STEPS = ("map-built", "cleaned-written", "cleaned-flushed", "swap-indexes-renamed",
               "swap-committed", "old-segment-deleted", "old-segments-deleted",
               "swap-indexes-final", "swapped", "checkpoint-written")
FAST_CLEANER = {"log.cleaner.backoff.ms": 100, "log.segment.delete.delay.ms": 1000}


# ------------------------------------------------------------------------------------------ writing
def key_of(seq: int, keys: int, key_base: int = 0) -> bytes:
    return b"key-%06d" % (key_base + seq % keys)


def value_of(seq: int, tombstone_every: int) -> bytes | None:
    if tombstone_every and seq % tombstone_every == tombstone_every - 1:
        return None
    return b"value-%09d" % seq


@dataclass
class Produced:
    """What one producer wrote: sequence numbers [first, first + n) with where each landed."""

    topic: str
    first: int
    n: int
    keys: int
    tombstone_every: int
    partition_of: array
    offset_of: array
    key_base: int = 0

    def key(self, seq: int) -> bytes:
        return key_of(seq, self.keys, self.key_base)

    def last_seq_by_key(self) -> dict[bytes, int]:
        return {self.key(s): s for s in range(max(self.first, self.first + self.n - self.keys),
                                                        self.first + self.n)}

    def where(self, seq: int) -> tuple[int, int]:
        return self.partition_of[seq - self.first], self.offset_of[seq - self.first]


def create_topic(bootstrap: str, topic: str, partitions: int, **configs) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(confluent_config(bootstrap))
    for f in admin.create_topics([NewTopic(topic, partitions, 1, config={
            k.replace("_", "."): str(v) for k, v in configs.items()})]).values():
        f.result(20)


def alter_topic(bootstrap: str, topic: str, **configs) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient(confluent_config(bootstrap))
    entries = [ConfigEntry(k.replace("_", "."), str(v), incremental_operation=AlterConfigOpType.SET)
               for k, v in configs.items()]
    for f in admin.incremental_alter_configs([ConfigResource("topic", topic,
                                                             incremental_configs=entries)]).values():
        f.result(20)


def produce_keyed(bootstrap: str, topic: str, n: int, *, keys: int, tombstone_every: int = 10,
                  first: int = 0, key_base: int = 0, compression: str = "none") -> Produced:
    """Produce sequence numbers [first, first + n) with confluent-kafka (idempotent, so each
    partition keeps the order of production)."""
    from confluent_kafka import Producer

    out = Produced(topic, first, n, keys, tombstone_every, array("b", bytes(n)),
                   array("q", bytes(8 * n)), key_base)
    errors = []

    def delivered(err, msg, seq):
        if err is not None:
            errors.append(err)
            return
        out.partition_of[seq - first] = msg.partition()
        out.offset_of[seq - first] = msg.offset()

    p = Producer(confluent_config(bootstrap, **{
        "enable.idempotence": True, "linger.ms": 20, "batch.size": 1_000_000,
        "compression.type": compression, "queue.buffering.max.messages": 200_000}))
    for seq in range(first, first + n):
        while True:
            try:
                p.produce(topic, key=out.key(seq), value=value_of(seq, tombstone_every),
                          headers=[("seq", b"%d" % seq)],
                          on_delivery=lambda err, msg, seq=seq: delivered(err, msg, seq))
                break
            except BufferError:
                p.poll(0.05)
        if seq % 5000 == 0:
            p.poll(0)
    assert p.flush(120) == 0, "the producer did not deliver everything"
    assert not errors, errors[:5]
    return out


# ------------------------------------------------------------------------------------------ reading
def read_confluent(bootstrap: str, topic: str, partitions: int) -> list[tuple]:
    """(partition, offset, key, value, seq) of every record from the start to the high watermark."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer(confluent_config(bootstrap, **{"group.id": "compaction-it", "enable.auto.commit": False,
                                                "fetch.queue.backoff.ms": 1}))
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        out = []
        last = {p: -1 for p in range(partitions)}
        deadline = time.monotonic() + 120
        while any(last[p] < ends[p] - 1 for p in ends):
            assert time.monotonic() < deadline, f"confluent consumer stuck at {last} of {ends}"
            for m in c.consume(10_000, 0.2):
                assert not m.error(), m.error()
                out.append((m.partition(), m.offset(), m.key(), m.value(), int(m.headers()[0][1])))
                last[m.partition()] = m.offset()
        return out
    finally:
        c.close()


def read_kafka_python(bootstrap: str, topic: str, partitions: int) -> list[tuple]:
    from kafka import TopicPartition

    c = kafka_python_consumer(bootstrap, max_partition_fetch_bytes=4 * MIB)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        ends = c.end_offsets(tps)
        c.seek_to_beginning(*tps)
        out = []
        deadline = time.monotonic() + 180
        while any(c.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "kafka-python consumer stuck"
            for tp, records in c.poll(timeout_ms=200, max_records=50_000).items():
                out.extend((m.partition, m.offset, m.key, m.value, int(m.headers[0][1]))
                           for m in records)
        return out
    finally:
        c.close()


def check_records(records: list[tuple], produced: Produced) -> dict[bytes, int]:
    """Each record is the one written at its offset, offsets increase in each partition, and every
    key's last record is its last written one: 0 mismatches. Returns key -> last seq read."""
    last_offset: dict[int, int] = {}
    last_seq: dict[bytes, int] = {}
    for partition, offset, key, value, seq in records:
        assert produced.where(seq) == (partition, offset), (seq, partition, offset)
        assert (key, value) == (produced.key(seq), value_of(seq, produced.tombstone_every))
        assert offset > last_offset.get(partition, -1), (partition, offset)
        last_offset[partition] = offset
        last_seq[key] = seq
    expected = produced.last_seq_by_key()
    mismatches = sum(1 for k, s in expected.items() if last_seq.get(k) != s)
    assert mismatches == 0, f"{mismatches} keys without their last record"
    return last_seq


# ------------------------------------------------------------------------------------------ the log dir
def cleaner_checkpoint(broker) -> dict[tuple[str, int], int]:
    path = broker.log_dir / "cleaner-offset-checkpoint"
    if not path.exists():
        return {}
    lines = path.read_text().split("\n")[2:]
    return {(t, int(p)): int(o) for t, p, o in (line.split() for line in lines if line.strip())}


def active_base(broker, topic: str, partition: int) -> int:
    return int(os.path.basename(segment_files(broker.log_dir, topic, partition)[-1]).split(".")[0])


def cleaned_through_active(broker, topic: str, partitions: int) -> bool:
    done = cleaner_checkpoint(broker)
    return all(done.get((topic, p), -1) >= active_base(broker, topic, p) for p in range(partitions))


def partition_bytes(broker, topic: str, partition: int) -> int:
    return sum(os.path.getsize(f) for f in segment_files(broker.log_dir, topic, partition))


def leftovers(broker, topic: str, partition: int) -> list[str]:
    return [n for n in os.listdir(partition_dir(broker.log_dir, topic, partition))
            if n.endswith((".cleaned", ".swap"))]


# ------------------------------------------------------------------------------------------ tests
def test_a_million_records_over_10k_keys_keep_every_keys_last_record(broker_factory):
    b = broker_factory(**FAST_CLEANER)
    topic, partitions = "compacted-1m", 2
    create_topic(b.bootstrap, topic, partitions, cleanup_policy="compact", segment_bytes=MIB,
                 min_cleanable_dirty_ratio=0.3)
    produced = produce_keyed(b.bootstrap, topic, 1_000_000, keys=10_000, compression="lz4")
    wait_until(lambda: cleaned_through_active(b, topic, partitions), 300, "the cleaner to catch up")

    by_confluent = read_confluent(b.bootstrap, topic, partitions)
    last = check_records(by_confluent, produced)
    assert sum(1 for s in last.values() if value_of(s, 10) is None) == 1_000   # tombstones stay
    assert len(by_confluent) < 100_000, len(by_confluent)                     # compacted
    by_kafka_python = read_kafka_python(b.bootstrap, topic, partitions)
    check_records(by_kafka_python, produced)
    assert sorted(by_kafka_python) == sorted(by_confluent)
    for p in range(partitions):
        assert_partition_valid(b.log_dir, topic, p)


def test_clients_read_across_gaps_and_a_producers_emptied_last_batch(broker_factory):
    """A producer's last batch whose records were all superseded stays as an empty batch (so its
    sequence numbers survive); consumers step over it and over the removed offsets, from the start
    or from an offset that is gone."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    b = broker_factory(**FAST_CLEANER)
    topic = "gaps"
    create_topic(b.bootstrap, topic, 1, cleanup_policy="compact", segment_bytes=MIB)
    first = Producer(confluent_config(b.bootstrap, **{"enable.idempotence": True}))
    for k in range(100):
        first.produce(topic, key=b"shared-%03d" % k, value=b"first", headers=[("seq", b"0")])
    assert first.flush(20) == 0
    # Another producer supersedes every one of them, then fills a segment so they can be cleaned.
    produced = produce_keyed(b.bootstrap, topic, 40_000, keys=1_000, first=1, tombstone_every=0)
    second = Producer(confluent_config(b.bootstrap, **{"enable.idempotence": True}))
    for k in range(100):
        second.produce(topic, key=b"shared-%03d" % k, value=b"second", headers=[("seq", b"0")])
    assert second.flush(20) == 0
    produce_keyed(b.bootstrap, topic, 30_000, keys=1_000, first=10**6, key_base=5_000, tombstone_every=0)
    wait_until(lambda: cleaned_through_active(b, topic, 1), 120, "the cleaning")
    empty = [d for d in assert_partition_valid(b.log_dir, topic, 0) if d.records_count == 0]
    assert empty and empty[0].base_offset == 0 and empty[0].last_offset == 99

    def shared(records):
        return {r[2]: r[3] for r in records if r[2].startswith(b"shared-")}

    for read in (read_confluent, read_kafka_python):
        records = read(b.bootstrap, topic, 1)
        assert shared(records) == {b"shared-%03d" % k: b"second" for k in range(100)}
        check_records([r for r in records if 1 <= r[4] < 10**6], produced)
    # A read from a removed offset starts at the next record that stayed.
    c = Consumer(confluent_config(b.bootstrap, **{"group.id": "gaps", "enable.auto.commit": False}))
    try:
        c.assign([TopicPartition(topic, 0, 50)])
        m = wait_until(lambda: c.poll(0.5), 30, "a record from offset 50")
        assert m.offset() > 99 and not m.error()
    finally:
        c.close()
    # The first producer's sequence state survived: it goes on where it was.
    first.produce(topic, key=b"shared-000", value=b"first-again", headers=[("seq", b"0")])
    assert first.flush(20) == 0


def test_the_broker_wide_cleanup_policy_changes_at_run_time(broker_factory):
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    b = broker_factory(**FAST_CLEANER)
    topic = "broker-policy"
    create_topic(b.bootstrap, topic, 1, segment_bytes=MIB)      # no cleanup.policy of its own
    produced = produce_keyed(b.bootstrap, topic, 40_000, keys=500)
    assert (topic, 0) not in cleaner_checkpoint(b)             # log.cleanup.policy=delete
    admin = AdminClient(confluent_config(b.bootstrap))
    entry = ConfigEntry("log.cleanup.policy", "compact,delete",
                        incremental_operation=AlterConfigOpType.SET)
    broker_0 = ConfigResource("broker", "0", incremental_configs=[entry])
    for f in admin.incremental_alter_configs([broker_0]).values():
        f.result(20)
    wait_until(lambda: cleaned_through_active(b, topic, 1), 120, "cleaning under the broker's policy")
    records = read_confluent(b.bootstrap, topic, 1)
    check_records(records, produced)
    assert len([r for r in records if r[1] < active_base(b, topic, 0)]) <= 500


def _scan_forever(read, bootstrap, topic, partitions, produced, stop, scans, failures) -> None:
    while not stop.is_set():
        started = time.monotonic()
        try:
            check_records(read(bootstrap, topic, partitions), produced)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            failures.append(e)
            return
        scans.append((started, time.monotonic()))


def test_consumers_reading_while_the_cleaner_runs_see_consistent_data(broker_factory):
    # Throttled so a pass takes several seconds and many reads overlap it.
    b = broker_factory(**FAST_CLEANER, **{"log.cleaner.io.max.bytes.per.second": 3_000_000})
    topic = "read-while-cleaning"
    create_topic(b.bootstrap, topic, 1, cleanup_policy="delete", segment_bytes=MIB,
                 retention_ms=-1)
    produced = produce_keyed(b.bootstrap, topic, 300_000, keys=2_000, compression="snappy")
    stop = threading.Event()
    scans: dict[str, list] = {"confluent": [], "kafka-python": []}
    failures: list[BaseException] = []
    readers = [threading.Thread(target=_scan_forever, args=(
        read, b.bootstrap, topic, 1, produced, stop, scans[name], failures), daemon=True)
        for name, read in (("confluent", read_confluent), ("kafka-python", read_kafka_python))]
    for t in readers:
        t.start()
    wait_until(lambda: all(scans.values()) or failures, 120, "a first read by each client")
    cleaning_from = time.monotonic()
    alter_topic(b.bootstrap, topic, cleanup_policy="compact")        # the cleaner starts now
    try:
        wait_until(lambda: cleaned_through_active(b, topic, 1) or failures, 300, "the cleaning")
        cleaning_to = time.monotonic()
        wait_until(lambda: failures or all(s and s[-1][0] > cleaning_to for s in scans.values()),
                   180, "a read by each client after the cleaning")
    finally:
        stop.set()
        for t in readers:
            t.join(180)
    assert not failures, failures[0]
    for name, done in scans.items():
        during = [s for s in done if s[1] > cleaning_from and s[0] < cleaning_to]
        assert during, f"no {name} read overlapped the cleaning ({cleaning_to - cleaning_from:.1f} s)"
    below_active = [r for r in read_confluent(b.bootstrap, topic, 1) if r[1] < active_base(b, topic, 0)]
    assert len(below_active) <= 2_000                         # one record per key


def test_tombstones_stay_for_delete_retention_ms_then_go(broker_factory):
    b = broker_factory(**FAST_CLEANER)
    topic, retention_ms = "tombstones", 8_000
    create_topic(b.bootstrap, topic, 1, cleanup_policy="compact", segment_bytes=MIB,
                 delete_retention_ms=retention_ms, min_cleanable_dirty_ratio=0.1)
    produced = produce_keyed(b.bootstrap, topic, 60_000, keys=1_000, tombstone_every=7)
    # Fill the active segment's place with other keys so every tombstone is in a cleaned segment.
    filler = produce_keyed(b.bootstrap, topic, 30_000, keys=100, first=10**7, key_base=500_000,
                           tombstone_every=0)
    deleted = {k for k, s in produced.last_seq_by_key().items() if value_of(s, 7) is None}
    assert 50 < len(deleted) < 500
    wait_until(lambda: cleaned_through_active(b, topic, 1), 120, "the first cleaning")
    first_cleaned = time.monotonic()

    def tombstones_read() -> set[bytes]:
        return {r[2] for r in read_kafka_python(b.bootstrap, topic, 1) if r[3] is None}

    seen = tombstones_read()
    assert time.monotonic() - first_cleaned < retention_ms / 1000, "too slow to see them in time"
    assert seen == deleted
    wait_until(lambda: not tombstones_read(), 60, "the tombstones to go after delete.retention.ms")
    assert time.monotonic() - first_cleaned >= retention_ms / 1000 - 1
    records = read_confluent(b.bootstrap, topic, 1)
    live = {r[2]: r[4] for r in records if r[4] < 10**7}
    assert live == {k: s for k, s in produced.last_seq_by_key().items() if k not in deleted}
    assert {r[2] for r in records if r[4] >= 10**7} == set(filler.last_seq_by_key())


@pytest.mark.parametrize("step", FAULT_STEPS)
def test_kill_at_each_step_of_a_cleaning_pass_loses_nothing(broker_factory, monkeypatch, step):
    monkeypatch.setenv(FAULT_ENV, step)
    b = broker_factory(**FAST_CLEANER)
    topic = "crash"
    create_topic(b.bootstrap, topic, 1, cleanup_policy="delete", segment_bytes=MIB, retention_ms=-1)
    produced = produce_keyed(b.bootstrap, topic, 60_000, keys=2_000)   # 3 segments
    alter_topic(b.bootstrap, topic, cleanup_policy="compact")
    assert b.proc.wait(60) == FAULT_EXIT_CODE                 # it died at `step`
    b.kill()                                                  # (closes its log file)
    assert f"cleaner fault point '{step}'" in b.log_text()
    monkeypatch.delenv(FAULT_ENV)
    mark = b.log_size()
    b.start()
    committed = FAULT_STEPS.index("swap-committed") <= FAULT_STEPS.index(step) \
        <= FAULT_STEPS.index("swap-indexes-final")
    assert ("completing the swap of cleaned segment" in b.log_text(mark)) == committed
    assert leftovers(b, topic, 0) == []
    assert_partition_valid(b.log_dir, topic, 0)               # no overlap, every CRC good
    check_records(read_confluent(b.bootstrap, topic, 1), produced)
    wait_until(lambda: cleaned_through_active(b, topic, 1), 120, "cleaning after the restart")
    records = read_kafka_python(b.bootstrap, topic, 1)
    check_records(records, produced)
    assert len(records) < 30_000
    assert_partition_valid(b.log_dir, topic, 0)


# ------------------------------------------------------------------------------------------ offsets
class Committer:
    """OffsetCommit requests written in bulk on one connection (kafka-python's protocol classes,
    not ours): `window` requests in flight, then their responses."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        from kafka.protocol.consumer.group import OffsetCommitRequest

        host, port = bootstrap.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.ids = itertools.count(1)
        self.topic, self.partitions = topic, partitions
        self.request = OffsetCommitRequest
        self.version = 8
        self._find_coordinator()

    def _find_coordinator(self) -> None:
        """FindCoordinator creates `__consumer_offsets` (as a consumer's first request would)."""
        from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, \
            FindCoordinatorResponse

        r = FindCoordinatorRequest(key="any-group", key_type=0)
        r.with_header(correlation_id=next(self.ids), client_id="bulk-commits")
        self.sock.sendall(r.encode(version=1, header=True, framed=True))
        size = struct.unpack(">i", self._read(4))[0]
        assert FindCoordinatorResponse.decode(self._read(size), version=1, header=True).error_code == 0

    def commit(self, commits: list[tuple[str, int]], window: int = 200) -> None:
        """commits: (group, offset) pairs; each commits `offset` for every partition."""
        from kafka.protocol.consumer.group import OffsetCommitResponse

        req = self.request
        topic_cls = req.OffsetCommitRequestTopic
        part_cls = topic_cls.OffsetCommitRequestPartition
        for start in range(0, len(commits), window):
            chunk = commits[start:start + window]
            frames = []
            for group, offset in chunk:
                r = req(group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=[
                    topic_cls(name=self.topic, partitions=[
                        part_cls(partition_index=p, committed_offset=offset, committed_metadata="")
                        for p in range(self.partitions)])])
                r.with_header(correlation_id=next(self.ids), client_id="bulk-commits")
                frames.append(r.encode(version=self.version, header=True, framed=True))
            self.sock.sendall(b"".join(frames))
            for _ in chunk:
                size = struct.unpack(">i", self._read(4))[0]
                response = OffsetCommitResponse.decode(self._read(size), version=self.version, header=True)
                codes = {p.error_code for t in response.topics for p in t.partitions}
                assert codes == {0}, codes

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "the broker closed the connection"
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()


def fetch_offsets(bootstrap: str, groups: list[str], topic: str, partitions: int) -> dict | None:
    """group -> {partition: offset} through OffsetFetch v8 (all groups in one request); None while
    the coordinator is loading."""
    from kafka.protocol.consumer.group import OffsetFetchRequest, OffsetFetchResponse

    group_cls = OffsetFetchRequest.OffsetFetchRequestGroup
    topics_cls = group_cls.OffsetFetchRequestTopics
    req = OffsetFetchRequest(groups=[group_cls(group_id=g, topics=[topics_cls(
        name=topic, partition_indexes=list(range(partitions)))]) for g in groups], require_stable=False)
    req.with_header(correlation_id=1, client_id="start-time")
    host, port = bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(req.encode(version=8, header=True, framed=True))
        size = struct.unpack(">i", _recv(s, 4))[0]
        r = OffsetFetchResponse.decode(_recv(s, size), version=8, header=True)
    if any(g.error_code == 14 for g in r.groups):     # COORDINATOR_LOAD_IN_PROGRESS
        return None
    assert all(g.error_code == 0 for g in r.groups), [g.error_code for g in r.groups]
    return {g.group_id: {p.partition_index: p.committed_offset for t in g.topics for p in t.partitions}
            for g in r.groups}


def _recv(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "closed"
        buf += chunk
    return bytes(buf)


OFFSETS_BROKER = {**FAST_CLEANER, "offsets.topic.num.partitions": 4,
                  "offsets.topic.segment.bytes": MIB}


def offsets_bytes(broker) -> int:
    partitions = len([d for d in os.listdir(broker.log_dir) if d.startswith("__consumer_offsets-")])
    return sum(partition_bytes(broker, "__consumer_offsets", p) for p in range(partitions))


def start_time_s(broker, groups: list[str], topic: str, partitions: int, expected: dict) -> float:
    """SIGTERM, start again, and the seconds until every group's offsets are served."""
    assert broker.stop() == 0
    started = time.monotonic()
    broker.start()
    got = wait_until(lambda: fetch_offsets(broker.bootstrap, groups, topic, partitions), 120,
                     "the coordinator to load", interval=0.01)
    elapsed = time.monotonic() - started
    assert got == expected
    return elapsed


def commit_rounds(committer: Committer, groups: list[str], rounds: int, first: int = 0) -> None:
    for r in range(first, first + rounds, 50):
        committer.commit([(g, r + i) for i in range(min(50, first + rounds - r)) for g in groups])


def test_consumer_offsets_stop_growing_under_a_steady_stream_of_commits(broker_factory):
    b = broker_factory(**OFFSETS_BROKER)
    create_topic(b.bootstrap, "events", 10)
    groups = [f"steady-{i}" for i in range(20)]
    committer = Committer(b.bootstrap, "events", 10)
    sizes = []
    try:
        for step in range(8):                      # 8 x 3000 commits of 10 offsets: ~18 MB written
            commit_rounds(committer, groups, 150, first=step * 150)
            sizes.append(offsets_bytes(b))
    finally:
        committer.close()
    written = 8 * 150 * len(groups) * 10 * 60    # at least 60 bytes per offset record
    assert max(sizes[4:]) <= max(sizes[:4]) + 2 * MIB, sizes   # it stopped growing
    assert max(sizes[4:]) < written / 3, (sizes, written)
    expected = {g: {p: 1199 for p in range(10)} for g in groups}
    assert fetch_offsets(b.bootstrap, groups, "events", 10) == expected
    start_time_s(b, groups, "events", 10, expected)   # they survive a restart (loaded from the log)


def test_start_time_after_a_million_commits_is_within_twice_that_after_a_thousand(broker_factory):
    """What a start replays is the live offsets plus the uncleaned head: the active segment of each
    offsets partition, never cleaned (as in Kafka). With one partition of 1 MiB segments that head
    is at most 1 MiB whatever the history; with Kafka's 50 partitions of 100 MiB it could be 5 GB."""
    broker_config = {**OFFSETS_BROKER, "offsets.topic.num.partitions": 1}
    groups = [f"group-{i:03d}" for i in range(100)]
    expected_small = {g: {p: 0 for p in range(10)} for g in groups}
    small = broker_factory(name="offsets-1k", **broker_config)
    create_topic(small.bootstrap, "events", 10)
    committer = Committer(small.bootstrap, "events", 10)
    commit_rounds(committer, groups, 1)                # 100 commits x 10 offsets: 1k
    committer.close()
    small_s = min(start_time_s(small, groups, "events", 10, expected_small) for _ in range(3))
    assert small.stop() == 0

    big = broker_factory(name="offsets-1m", **broker_config)
    create_topic(big.bootstrap, "events", 10)
    committer = Committer(big.bootstrap, "events", 10)
    commit_rounds(committer, groups, 1000)              # 100k commits x 10 offsets: 1M
    committer.close()
    wait_until(lambda: cleaned_through_active(big, "__consumer_offsets", 1), 300,
               "the cleaner to catch up with __consumer_offsets")
    expected_big = {g: {p: 999 for p in range(10)} for g in groups}
    big_s = min(start_time_s(big, groups, "events", 10, expected_big) for _ in range(3))
    print(f"start time after 1k commits {small_s:.2f} s, after 1M commits {big_s:.2f} s "
          f"(__consumer_offsets now {offsets_bytes(big)} bytes)")
    assert big_s <= 2 * small_s, (small_s, big_s)
