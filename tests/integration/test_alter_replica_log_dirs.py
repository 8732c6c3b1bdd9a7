"""AlterReplicaLogDirs (34) and DescribeLogDirs (35) on a real broker with three `log.dirs`, through
kafka-python's KafkaAdminClient (`alter_replica_log_dirs`, `describe_log_dirs`): a replica moves to
another dir while it takes writes (the future replica shows in DescribeLogDirs with is_future_key),
every record is read back afterwards, and the errors Kafka gives (LOG_DIR_NOT_FOUND,
REPLICA_NOT_AVAILABLE, KAFKA_STORAGE_ERROR); a move throttled by
`replica.alter.log.dirs.io.max.bytes.per.second`, set with IncrementalAlterConfigs on the cluster
default and on the broker, shown by DescribeConfigs."""

from __future__ import annotations

import os
import time

import kafka.errors as kerr
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, \
    NewTopic, ResourceType
from kafka import TopicPartitionReplica
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import IncrementalAlterConfigsRequest

from .clients import confluent_config, consume_confluent, wait_until
from .conftest import Broker, live

HOUR_MS = 3_600_000
MIB = 1024 * 1024
THROTTLE = "replica.alter.log.dirs.io.max.bytes.per.second"
QUOTA_WINDOWS = 2      # alter.log.dirs.replication.quota.window.num: of 1 s each


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    base = tmp_path_factory.mktemp("log-dirs")
    b = Broker(base, name="log-dirs")
    dirs = [b.log_dir, base / "data1", base / "data2"]
    # No checkpoint is due while a test has taken a log dir away (KAFKA_STORAGE_ERROR below).
    b.overrides.update({"log.dirs": ",".join(str(d) for d in dirs),
                        "log.flush.offset.checkpoint.interval.ms": str(HOUR_MS),
                        "log.flush.start.offset.checkpoint.interval.ms": str(HOUR_MS),
                        "replica.high.watermark.checkpoint.interval.ms": str(HOUR_MS),
                        # the move throttle's rate over 2 windows of 1 s (Kafka: 11), so a move
                        # of a few MiB goes at the rate after its first 1 s worth
                        "alter.log.dirs.replication.quota.window.num": str(QUOTA_WINDOWS)})
    b.dirs = [os.path.abspath(d) for d in dirs]
    with live(b):
        b.start()
        yield b


@pytest.fixture(scope="module")
def kadmin(broker):
    k = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    yield k
    k.close()


def create(broker, topic: NewTopic) -> None:
    admin = AdminClient(confluent_config(broker.bootstrap))      # kept alive until the answer
    admin.create_topics([topic])[topic.topic].result(timeout=10)


def ready(call):
    """`call()`, asked again while kafka-python has no connection ready: the module's admin client
    reconnects with a backoff after a test restarted the broker."""
    deadline = time.monotonic() + 15
    while True:
        try:
            return call()
        except (kerr.NodeNotReadyError, kerr.KafkaConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def placement(kadmin) -> dict[tuple[str, int, bool], tuple[str, dict]]:
    """(topic, partition, is_future) -> (log dir, the partition's entry), as DescribeLogDirs says."""
    (answer,) = ready(kadmin.describe_log_dirs)
    out = {}
    for d in answer["log_dirs"]:
        assert d["error_code"] == 0, d
        for t in d["topics"]:
            for p in t["partitions"]:
                out[(t["name"], p["partition_index"], p["is_future_key"])] = (d["log_dir"], p)
    return out


def test_errors_as_kafka_gives_them(broker, kadmin):
    create(broker, NewTopic("errs", 1, 1))
    where = placement(kadmin)[("errs", 0, False)][0]
    other = next(d for d in broker.dirs if d != where)
    spare = next(d for d in broker.dirs if d not in (where, other))
    assert kadmin.alter_replica_log_dirs({
        TopicPartitionReplica("errs", 0, 0): "/no/such/dir",
        TopicPartitionReplica("errs", 5, 0): other,          # no such replica here
        TopicPartitionReplica("errs", 0, 0): where}) == {    # the last one named wins: already there
        TopicPartitionReplica("errs", 0, 0): kerr.NoError,
        TopicPartitionReplica("errs", 5, 0): kerr.ReplicaNotAvailableError}
    assert kadmin.alter_replica_log_dirs({TopicPartitionReplica("errs", 0, 0): "/no/such/dir"}) == {
        TopicPartitionReplica("errs", 0, 0): kerr.LogDirNotFoundError}
    # a log dir that went away (a failed disk): KAFKA_STORAGE_ERROR
    aside = spare + ".aside"
    os.rename(spare, aside)
    try:
        assert kadmin.alter_replica_log_dirs({TopicPartitionReplica("errs", 0, 0): spare}) == {
            TopicPartitionReplica("errs", 0, 0): kerr.KafkaStorageError}
    finally:
        os.rename(aside, spare)
    assert ("errs", 0, True) not in placement(kadmin)


def test_a_replica_moves_to_another_log_dir_while_it_takes_writes(broker, kadmin):
    create(broker, NewTopic("moving", 1, 1, config={"segment.bytes": str(1024 * 1024)}))
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5})
    sent = [f"{i:06d}".encode() * 1700 for i in range(2000)]       # about 20 MB, 1 MiB segments
    for v in sent[:1800]:
        p.produce("moving", v, partition=0)
    assert p.flush(60) == 0
    source = placement(kadmin)[("moving", 0, False)][0]
    dest = next(d for d in broker.dirs if d != source)
    tpr = TopicPartitionReplica("moving", 0, 0)
    assert kadmin.alter_replica_log_dirs({tpr: dest}) == {tpr: kerr.NoError}
    # The copy goes a segment (1 MiB) per step: the future replica is there for a while.
    now = placement(kadmin)
    assert now[("moving", 0, False)][0] == source
    future_dir, future = now[("moving", 0, True)]
    assert future_dir == dest and future["offset_lag"] > 0
    for v in sent[1800:]:                                           # writes go on meanwhile
        p.produce("moving", v, partition=0)
    assert p.flush(60) == 0
    wait_until(lambda: ("moving", 0, True) not in placement(kadmin), 60, "the move to finish")
    after = placement(kadmin)
    assert after[("moving", 0, False)][0] == dest
    on_disk = sum(os.path.getsize(os.path.join(dest, "moving-0", f))
                  for f in os.listdir(os.path.join(dest, "moving-0")) if f.endswith(".log"))
    assert after[("moving", 0, False)][1]["partition_size"] == on_disk > 20_000_000
    assert not os.path.exists(os.path.join(source, "moving-0"))
    got = consume_confluent(broker.bootstrap, "moving", [0], timeout=60)
    assert [r.value for r in got] == sent and [r.offset for r in got] == list(range(len(sent)))
    # and the broker restarts with the replica where it moved
    broker.restart()
    again = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    try:
        assert placement(again)[("moving", 0, False)][0] == dest
    finally:
        again.close()


def set_cluster_default(kadmin, name: str, value: str | None, op: int) -> None:
    """IncrementalAlterConfigs on the cluster-default broker resource "" (kafka-python's request; neither
    admin API names that resource)."""
    async def call():
        return await kadmin._manager.send(IncrementalAlterConfigsRequest(
            resources=[(4, "", [(name, op, value)])], validate_only=False), node_id=0)
    (r,) = ready(lambda: kadmin._manager.run(call)).responses
    assert r.error_code == 0, r


def broker_config(admin, *ops: tuple[str, str | None, AlterConfigOpType]) -> None:
    entries = [ConfigEntry(k, v, incremental_operation=op) for k, v, op in ops]
    (f,) = admin.incremental_alter_configs([ConfigResource(ResourceType.BROKER, "0",
                                                           incremental_configs=entries)]).values()
    f.result(timeout=10)


def described(admin) -> tuple[str, int]:
    (f,) = admin.describe_configs([ConfigResource(ResourceType.BROKER, "0")]).values()
    entry = f.result(timeout=10)[THROTTLE]
    return entry.value, entry.source


def test_a_move_goes_at_the_rate_the_dynamic_throttle_sets(broker, kadmin):
    admin = AdminClient(confluent_config(broker.bootstrap))
    rate = 2 * MIB                                      # bytes/s
    create(broker, NewTopic("throttled", 1, 1, config={"segment.bytes": str(MIB)}))
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5})
    sent = [f"{i:06d}".encode() * 1700 for i in range(1600)]         # about 16 MiB, a step per MiB segment
    for v in sent:
        p.produce("throttled", v, partition=0)
    assert p.flush(60) == 0
    total = placement(kadmin)[("throttled", 0, False)][1]["partition_size"]
    assert total > 16_000_000
    assert described(admin) == (str(2**63 - 1), ConfigSource.DEFAULT_CONFIG.value)
    with pytest.raises(KafkaException) as refused:      # Kafka's atLeast(0), refused as its ZooKeeper mode does
        broker_config(admin, (THROTTLE, "-1", AlterConfigOpType.SET))
    assert refused.value.args[0].code() == KafkaError.INVALID_REQUEST
    # the cluster-wide default applies to this broker (set as kafka-configs --entity-default does)
    set_cluster_default(kadmin, THROTTLE, str(rate), op=0)
    assert described(admin) == (str(rate), ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)

    source = placement(kadmin)[("throttled", 0, False)][0]
    dest = next(d for d in broker.dirs if d != source)
    tpr = TopicPartitionReplica("throttled", 0, 0)
    started = time.monotonic()
    assert ready(lambda: kadmin.alter_replica_log_dirs({tpr: dest})) == {tpr: kerr.NoError}
    # A step copies a segment (1 MiB, half a second's worth): the future replica holds at most the
    # rate over the time since the move began, plus what Kafka's windows let through at once (2 s
    # worth) and one step. Unthrottled, the whole of it is there within about 2 s (a step a round).
    sizes = []
    while (elapsed := time.monotonic() - started) < 4.0:
        now = placement(kadmin)
        assert ("throttled", 0, True) in now, f"the move finished after {elapsed:.1f} s: {sizes}"
        size = now[("throttled", 0, True)][1]["partition_size"]
        assert size <= rate * (time.monotonic() - started + QUOTA_WINDOWS) + MIB, (elapsed, size, sizes)
        sizes.append((elapsed, size))
    grown = [size for elapsed, size in sizes if elapsed >= 1.0]
    assert 0 < grown[0] < grown[-1] < total, sizes             # growing, not done
    # raised on this broker (over the default): the rest goes at once
    broker_config(admin, (THROTTLE, str(1024 * MIB), AlterConfigOpType.SET))
    assert described(admin) == (str(1024 * MIB), ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    wait_until(lambda: ("throttled", 0, True) not in placement(kadmin), 15, "the move to finish")
    after = placement(kadmin)
    assert after[("throttled", 0, False)][0] == dest and after[("throttled", 0, False)][1]["partition_size"] == total
    broker_config(admin, (THROTTLE, None, AlterConfigOpType.DELETE))
    set_cluster_default(kadmin, THROTTLE, None, op=1)
    assert described(admin) == (str(2**63 - 1), ConfigSource.DEFAULT_CONFIG.value)
    got = consume_confluent(broker.bootstrap, "throttled", [0], timeout=60)
    assert [r.value for r in got] == sent
