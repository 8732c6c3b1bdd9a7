"""AlterReplicaLogDirs on a real cluster (seed 003, "AlterReplicaLogDirs API"; Kafka's future replica,
which a restart resumes): three `odradek serve` processes with two log.dirs each, a topic of replication
factor 3 under an acks=all idempotent confluent-kafka producer. kafka-python's alter_replica_log_dirs
moves a follower's replica and the leader's to the other dir of their brokers while writes go on,
throttled by the cluster-wide `replica.alter.log.dirs.io.max.bytes.per.second` (a dynamic config every
broker applies from its change notification); the leader's broker is killed with SIGKILL mid-move and
restarted: its future replica is back in DescribeLogDirs at once, resumed where its copy stood, still
throttled by the stored config, and the move completes once the throttle is removed. Then every acknowledged
record is read back once, by a consumer and from the files of every replica; every replica has the same
end offset (ListOffsets with Kafka's debugging replica id, asked of each broker) and size, and
DescribeLogDirs shows each replica in its new dir with no future replica left."""

from __future__ import annotations

import re
from pathlib import Path

import kafka.errors as kerr
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from kafka import TopicPartitionReplica
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import IncrementalAlterConfigsRequest
from kafka.protocol.consumer import ListOffsetsRequest

from odradek.records import RecordBatch, iter_headers

from .cluster_support import Cluster, CountingProducer, read_all, wait_for

TOPIC = "moving"
SEGMENT_BYTES = 1024 * 1024               # the smallest segment.bytes: a copy step is one segment
BULK_RECORDS, BULK_VALUE_BYTES = 800, 10_000
DEBUGGING_REPLICA_ID = -2
THROTTLE = "replica.alter.log.dirs.io.max.bytes.per.second"
# Half a segment a second over 2 windows of 1 s: a move copies a segment about every 2 s
RATE, QUOTA_WINDOWS = SEGMENT_BYTES // 2, 2


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("log-dirs-cluster"), zookeeper, 3)
    for b in c.brokers:
        b.overrides["log.dirs"] = f"{b.log_dir},{b.base_dir / 'data2'}"
        b.overrides["alter.log.dirs.replication.quota.window.num"] = str(QUOTA_WINDOWS)
    try:
        c.start()
        yield c
    finally:
        c.shutdown()


def placement(kadmin: KafkaAdminClient, broker: int) -> dict[bool, tuple[str, dict]]:
    """is_future -> (log dir, the partition's entry) for TOPIC-0 on one broker, as its DescribeLogDirs
    says."""
    (answer,) = kadmin.describe_log_dirs(brokers=[broker])
    out = {}
    for d in answer["log_dirs"]:
        assert d["error_code"] == 0, d
        for t in d["topics"]:
            for p in t["partitions"]:
                if t["name"] == TOPIC and p["partition_index"] == 0:
                    out[p["is_future_key"]] = (d["log_dir"], p)
    return out


def end_offset_on(kadmin: KafkaAdminClient, broker: int) -> int:
    """ListOffsets(latest) of TOPIC-0 asked of one broker with Kafka's debugging replica id, which any
    replica answers (a follower with the high watermark it knows)."""
    topic = ListOffsetsRequest.ListOffsetsTopic
    request = ListOffsetsRequest(replica_id=DEBUGGING_REPLICA_ID, isolation_level=0, topics=[
        topic(name=TOPIC, partitions=[topic.ListOffsetsPartition(partition_index=0, timestamp=-1)])])

    async def ask():
        return await kadmin._manager.send(request, node_id=broker)
    (t,) = kadmin._manager.run(ask).topics
    (p,) = t.partitions
    assert p.error_code == 0, p
    return p.offset


def set_cluster_default(kadmin: KafkaAdminClient, via: int, name: str, value: str | None) -> None:
    """IncrementalAlterConfigs (SET, or DELETE for None) on the cluster-default broker resource "",
    through one broker."""
    request = IncrementalAlterConfigsRequest(resources=[(4, "", [(name, 0 if value is not None else 1, value)])],
                                             validate_only=False)

    async def send():
        return await kadmin._manager.send(request, node_id=via)
    (r,) = kadmin._manager.run(send).responses
    assert r.error_code == 0, r


def throttle_of(admin: AdminClient, broker: int) -> str:
    """The move throttle broker `broker` applies, as its DescribeConfigs says."""
    (f,) = admin.describe_configs([ConfigResource(ResourceType.BROKER, str(broker))]).values()
    return f.result(timeout=10)[THROTTLE].value


def replica_on_disk(partition_dir: Path) -> list[tuple[int, int]]:
    """(offset, value) of every record in a replica's segment files, read straight from the disk."""
    out = []
    for segment in sorted(partition_dir.glob("*.log")):
        data = segment.read_bytes()
        for h in iter_headers(data):
            out.extend((r.offset, int(r.value)) for r in RecordBatch(data, h.pos).records())
    return out


def bulk_write(bootstrap: str) -> set[int]:
    """BULK_RECORDS large records (values -1, -2, ...: int() reads them through their padding); the
    acknowledged ones."""
    acked: set[int] = set()
    errors: list = []

    def delivered(err, msg) -> None:
        if err is None:
            acked.add(int(msg.value()))
        else:
            errors.append(err)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 20,
                  "message.timeout.ms": 60000})
    for i in range(BULK_RECORDS):
        value = str(-(i + 1)).encode().ljust(BULK_VALUE_BYTES)
        while True:
            try:
                p.produce(TOPIC, value, partition=0, on_delivery=delivered)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    assert p.flush(60) == 0 and not errors, errors[:5]
    return acked


def test_replicas_move_while_written_and_a_move_killed_with_its_broker_resumes(cluster):
    cluster.create_topic(TOPIC, 1, 3, {"min.insync.replicas": "2", "segment.bytes": str(SEGMENT_BYTES)})
    writer = CountingProducer(cluster.bootstrap, TOPIC, rate_per_s=300)
    writer.start()
    kadmin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=15000)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    try:
        bulk = bulk_write(cluster.bootstrap)           # about 8 MB: at the rate, a copy of 16 s
        leader = cluster.leader_of(TOPIC, 0)
        set_cluster_default(kadmin, leader, THROTTLE, str(RATE))
        wait_for("every broker throttling moves", lambda: {throttle_of(admin, b) for b in range(3)} == {str(RATE)},
                 timeout=30)
        follower, third = [b for b in range(3) if b != leader]
        source, dest = {}, {}
        for b in (leader, follower, third):
            source[b] = placement(kadmin, b)[False][0]
            dest[b] = next(d for d in (str(cluster.brokers[b].log_dir), str(cluster.brokers[b].base_dir / "data2"))
                           if d != source[b])
        dest[third] = source[third]                    # that one stays where it is
        moves = {TopicPartitionReplica(TOPIC, 0, leader): dest[leader],
                 TopicPartitionReplica(TOPIC, 0, follower): dest[follower]}
        assert kadmin.alter_replica_log_dirs(moves) == {tpr: kerr.NoError for tpr in moves}

        # The leader's future replica, part copied (a segment every 2 s): kill its broker there.
        def mid_move():
            future = placement(kadmin, leader).get(True)
            return future is not None and future[1]["partition_size"] >= 2 * SEGMENT_BYTES and future
        future_dir, future = wait_for("the leader's future replica two segments in", mid_move, timeout=30,
                                      interval=0.02)
        assert future_dir == dest[leader] and future["offset_lag"] > 0
        copied = future["partition_size"]
        broker = cluster.brokers[leader]
        broker.kill()
        assert len(list(Path(dest[leader]).glob(f"{TOPIC}-0.*-future"))) == 1     # left on disk by the crash

        mark = broker.log_size()
        broker.start()
        fresh = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
        try:
            right_after = wait_for("DescribeLogDirs of the restarted broker", lambda: placement(fresh, leader),
                                   timeout=20, interval=0.02)
        finally:
            fresh.close()
        assert True in right_after, right_after         # the future replica is back at once ...
        assert right_after[True][0] == dest[leader] and right_after[False][0] == source[leader]
        assert right_after[True][1]["partition_size"] >= copied       # ... where its copy stood
        resumed = re.search(rf"{TOPIC}-0: resuming its move from \S+ to \S+ at offset (\d+)", broker.log_text(mark))
        assert resumed is not None and int(resumed.group(1)) > 0
        assert throttle_of(admin, leader) == str(RATE)          # the stored throttle, applied at start
        assert True in placement(kadmin, leader)               # and the move still under way
        set_cluster_default(kadmin, leader, THROTTLE, None)

        def moved() -> bool:
            now = {b: placement(kadmin, b) for b in range(3)}
            return all(True not in now[b] and now[b][False][0] == dest[b] for b in range(3))
        wait_for("both moves finished, no future replica left", moved, timeout=60, interval=0.1)
        assert writer.acked_count() > 0
    finally:
        writer.stop()

    try:
        wait_for("every replica in the ISR", lambda: sorted(cluster.partition_states(TOPIC)[0].isrs) == [0, 1, 2],
                 timeout=60)
        read = read_all(cluster.bootstrap, TOPIC, 1)
        counted_lost, counted_twice = writer.checker.report([v for v in read if v >= 0])
        assert not counted_lost and not counted_twice, (len(counted_lost), len(counted_twice))
        bulk_read = [v for v in read if v < 0]
        assert sorted(bulk_read) == sorted(bulk) and len(bulk_read) == len(set(bulk_read)) == BULK_RECORDS
        # Every replica: the same end offset, the same bytes, the same records at the same offsets.
        wait_for("every replica's end offset at the records read",
                 lambda: {end_offset_on(kadmin, b) for b in range(3)} == {len(read)}, timeout=30)
        final = {b: placement(kadmin, b) for b in range(3)}
        sizes = set()
        for b in range(3):
            assert True not in final[b] and final[b][False][0] == dest[b], final[b]
            partition_dir = Path(dest[b]) / f"{TOPIC}-0"
            on_disk = replica_on_disk(partition_dir)
            assert [o for o, _ in on_disk] == list(range(len(read))), b
            assert [v for _, v in on_disk] == read, b
            size = sum(f.stat().st_size for f in partition_dir.glob("*.log"))
            assert final[b][False][1]["partition_size"] == size
            sizes.add(size)
        assert len(sizes) == 1
        for b in (leader, follower):
            assert not (Path(source[b]) / f"{TOPIC}-0").exists()
    finally:
        kadmin.close()
