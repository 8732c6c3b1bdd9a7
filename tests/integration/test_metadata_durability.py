"""The metadata store under crashes and a full disk, through real clients (confluent-kafka, raw frames).

- kill -9 at random points of CreateTopics and DeleteTopics of many partitions: after the restart
  every topic is absent or complete (every partition led, acks=all produce works), a deleted topic
  never comes back, and every name can be created again;
- a full log dir (a small tmpfs): every admin request is answered with an error, the connection and
  the broker live on, and once space returns every name can be created;
- 2,000 InitProducerId pipelined on one connection: unique, increasing ids, continued after a restart;
- a 249-character topic: created, produced to, deleted, and gone after a restart;
- Metadata auto-creation: the internal topics get their own partition counts and configs, and
  `__cluster_metadata` is never created;
- Kafka's per-request bound of 10,000 partitions (POLICY_VIOLATION).
"""

from __future__ import annotations

import errno
import os
import random
import struct
import subprocess
import time
from pathlib import Path

import pytest

from .clients import Msg, confluent_config, confluent_consumer, connect, produce_confluent, recv_frame, \
    request_frame, wait_until
from .conftest import _LIVE, Broker

KAFKA_STORAGE_ERROR = 56
COORDINATOR_LOAD_IN_PROGRESS = 14
UNKNOWN_TOPIC_OR_PARTITION = 3
POLICY_VIOLATION = 44


def admin_client(b: Broker):
    from confluent_kafka.admin import AdminClient
    return AdminClient(confluent_config(b.bootstrap))


def topics_now(b: Broker) -> dict:
    return admin_client(b).list_topics(timeout=20).topics


def partition_dirs(b: Broker, topic: str) -> list[str]:
    prefix = topic + "-"
    return sorted(n for n in os.listdir(b.log_dir)
                  if n.startswith(prefix) and n[len(prefix):].isdigit())


def assert_complete(b: Broker, topic: str, partitions: int, what: str) -> None:
    """Every partition has a leader and takes an acks=all write (confluent-kafka)."""
    t = topics_now(b)[topic]
    assert t.error is None, f"{what}: {t.error}"
    assert sorted(t.partitions) == list(range(partitions)), f"{what}: {len(t.partitions)} partitions"
    leaderless = [p for p, pm in t.partitions.items() if pm.leader != 0 or pm.error is not None]
    assert not leaderless, f"{what}: partitions without a leader: {leaderless[:10]}"
    acks = produce_confluent(b.bootstrap, topic, [Msg(b"k", b"check", partition=p) for p in range(partitions)],
                             acks="all")
    assert sorted(a.partition for a in acks) == list(range(partitions)), what


def end_offsets(b: Broker, topic: str, partitions) -> list[int]:
    from confluent_kafka import TopicPartition
    c = confluent_consumer(b.bootstrap)
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions]
    finally:
        c.close()


def create(b: Broker, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import NewTopic
    admin = admin_client(b)     # kept alive until the answer: a destroyed client fails its futures
    admin.create_topics([NewTopic(topic, partitions, 1)], request_timeout=60)[topic].result(60)


def delete(b: Broker, topic: str) -> None:
    admin = admin_client(b)
    admin.delete_topics([topic], request_timeout=60)[topic].result(60)


def timed(fn, *args) -> float:
    start = time.monotonic()
    fn(*args)
    return time.monotonic() - start


def kill_during(b: Broker, start_request, progress, partitions: int, after_s: float, fraction: float) -> None:
    """Send the request and kill -9 the broker part-way: for a fraction below 1, once `progress()`
    (partition logs created or removed) reaches that fraction of `partitions`; above 1, once all are
    done and then (fraction - 1) of `after_s`, the calibrated length of the whole operation, later
    (the store writes before and after the logs)."""
    start_request()
    target = min(fraction, 1.0) * partitions
    wait_until(lambda: progress() >= target, 60, f"{target:.0f} partition logs", interval=0.001)
    if fraction > 1:
        time.sleep((fraction - 1) * after_s)   # picks the crash point; nothing waits on the broker here
    b.kill()


# ------------------------------------------------------------------------------------------ kill -9
PARTITIONS = 300
ROUNDS = 4


def test_kill_during_create_and_delete_leaves_topics_absent_or_complete(broker_factory):
    from confluent_kafka.admin import NewTopic
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    b = broker_factory()
    create_s = timed(create, b, "calibrate", PARTITIONS)
    delete_s = timed(delete, b, "calibrate")
    wait_until(lambda: "calibrate" not in topics_now(b), 20, "the calibration topic to go")
    deleted: set[str] = {"calibrate"}
    for round_ in range(ROUNDS):
        big, small = f"big-{round_}", f"small-{round_}"
        fraction = rng.uniform(0.0, 1.3)
        what = f"seed {seed}, round {round_}, kill at {fraction:.2f} of create ({create_s:.2f}s)"
        admin = admin_client(b)
        kill_during(b, lambda: admin.create_topics([NewTopic(big, PARTITIONS, 1), NewTopic(small, 2, 1)],
                                                   request_timeout=60),
                    lambda: len(partition_dirs(b, big)), PARTITIONS, create_s, fraction)
        b.start()
        present = topics_now(b)
        for topic, n in ((big, PARTITIONS), (small, 2)):
            if topic in present:
                assert_complete(b, topic, n, f"{what}: {topic} after restart")
            else:
                assert partition_dirs(b, topic) == [], f"{what}: stray logs of {topic}"
                create(b, topic, n)
                assert_complete(b, topic, n, f"{what}: {topic} created again")
        # Records in a few partitions, then a deletion cut short.
        produce_confluent(b.bootstrap, big, [Msg(b"k", b"v", partition=p) for p in (0, 1, 2)], acks="all")
        before = end_offsets(b, big, (0, 1, 2))
        fraction = rng.uniform(0.0, 1.5)
        what = f"seed {seed}, round {round_}, kill at {fraction:.2f} of delete ({delete_s:.3f}s)"
        admin = admin_client(b)
        kill_during(b, lambda: admin.delete_topics([big], request_timeout=60),
                    lambda: PARTITIONS - len(partition_dirs(b, big)), PARTITIONS, delete_s, fraction)
        b.start()
        if big in topics_now(b):
            assert_complete(b, big, PARTITIONS, f"{what}: after restart")
            assert end_offsets(b, big, (0, 1, 2)) == [o + 1 for o in before], f"{what}: records lost"
            delete(b, big)
            wait_until(lambda: big not in topics_now(b), 20, f"{big} to be deleted")
        assert partition_dirs(b, big) == [], f"{what}: logs of the deleted topic remain"
        deleted.add(big)
        b.restart(kill=True)
        assert not deleted & set(topics_now(b)), f"{what}: deleted topics came back"
    # Every deleted name can be created again, empty.
    for topic in sorted(deleted):
        create(b, topic, 3)
        assert end_offsets(b, topic, range(3)) == [0, 0, 0], f"seed {seed}: {topic} came back with data"
    b.restart(kill=True)
    present = topics_now(b)
    for round_ in range(ROUNDS):
        assert_complete(b, f"small-{round_}", 2, f"seed {seed}: small-{round_} at the end")
    assert deleted <= set(present)


# ------------------------------------------------------------------------------------------ a full disk
def _mount_tmpfs(path: Path, size: str) -> list[str]:
    """The command prefix that can mount; fails the test loudly when none can."""
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    result = subprocess.run(prefix + ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(f"this test needs to mount a tmpfs (root, or sudo -n): {result.stderr.strip()}")
    return prefix


@pytest.fixture
def small_disk_broker(tmp_path):
    """A broker whose log dir is a 16 MiB tmpfs. The log-dir checkpoints are not due during the test
    (a failed periodic checkpoint is logged with its traceback, which teardown refuses)."""
    b = Broker(tmp_path, {"replica.high.watermark.checkpoint.interval.ms": 3_600_000,
                          "log.flush.offset.checkpoint.interval.ms": 3_600_000,
                          "log.flush.start.offset.checkpoint.interval.ms": 3_600_000}, name="small-disk")
    b.log_dir.mkdir(parents=True)
    prefix = _mount_tmpfs(b.log_dir, "16m")
    _LIVE.append(b)
    try:
        yield b
        b.shutdown_and_check()
    finally:
        b.kill()
        _LIVE.remove(b)
        subprocess.run(prefix + ["umount", "-l", str(b.log_dir)], check=False)


def fill(directory: Path) -> Path:
    filler = directory / "filler"
    chunk = b"\xab" * 65536
    with open(filler, "wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                break
    return filler


def admin_error(future) -> int:
    from confluent_kafka import KafkaException
    with pytest.raises(KafkaException) as e:
        future.result(30)
    return e.value.args[0].code()


def test_a_full_log_dir_is_answered_with_errors_and_every_name_works_once_space_returns(small_disk_broker):
    from confluent_kafka.admin import ConfigResource, NewPartitions, NewTopic
    b = small_disk_broker
    b.start()
    create(b, "existing", 3)
    produce_confluent(b.bootstrap, "existing", [Msg(b"k", b"v", partition=p) for p in range(3)], acks="all")
    filler = fill(b.log_dir)
    admin = admin_client(b)
    # The journal's last page may still hold a few small writes: change a config (a short line)
    # until one fails; every write below is longer, so none fits any more.
    for i in range(200):
        resource = ConfigResource("topic", "existing", set_config={"retention.ms": str(1 + i % 9)})
        future = admin.alter_configs([resource])[resource]
        if future.exception(30) is not None:
            assert future.exception().args[0].code() == KAFKA_STORAGE_ERROR
            break
    else:
        pytest.fail("200 config changes fitted in a full log dir")
    names = {"full-a": 1, "full-b": 300}
    futures = admin.create_topics([NewTopic(n, p, 1) for n, p in names.items()], request_timeout=30)
    assert {n: admin_error(f) for n, f in futures.items()} == {n: KAFKA_STORAGE_ERROR for n in names}
    assert admin_error(admin.create_partitions([NewPartitions("existing", 6)])["existing"]) == KAFKA_STORAGE_ERROR
    assert admin_error(admin.delete_topics(["existing"], request_timeout=30)["existing"]) == KAFKA_STORAGE_ERROR
    resource = ConfigResource("topic", "existing", set_config={"retention.ms": "12345"})
    assert admin_error(admin.alter_configs([resource])[resource]) == KAFKA_STORAGE_ERROR
    # Auto-creation and InitProducerId, on one raw connection that must stay open.
    sock = connect(b.host, b.port, timeout=30)
    sock.sendall(request_frame(3, 1, 1, metadata_v1_body(["full-auto"])))
    assert topic_errors(recv_frame(sock, 30)) == {"full-auto": KAFKA_STORAGE_ERROR}
    sock.sendall(request_frame(22, 0, 2, struct.pack(">hi", -1, 60000)))
    assert struct.unpack_from(">iih", recv_frame(sock, 30)) == (2, 0, COORDINATOR_LOAD_IN_PROGRESS)
    assert b.running
    assert "full-a" not in topics_now(b) and "existing" in topics_now(b)

    filler.unlink()
    for n, p in {**names, "full-auto": 2}.items():
        create(b, n, p)
    futures = admin.create_partitions([NewPartitions("existing", 6)])
    futures["existing"].result(30)
    sock.sendall(request_frame(22, 0, 3, struct.pack(">hi", -1, 60000)))
    assert struct.unpack_from(">iih", recv_frame(sock, 30)) == (3, 0, 0)
    sock.close()
    assert_complete(b, "existing", 6, "existing after space returned")
    delete(b, "existing")
    b.restart()
    present = topics_now(b)
    assert "existing" not in present and partition_dirs(b, "existing") == []
    for n, p in {**names, "full-auto": 2}.items():
        assert_complete(b, n, p, f"{n} after a restart")


# ------------------------------------------------------------------------------------------ raw frames
def metadata_v1_body(topics: list[str]) -> bytes:
    body = struct.pack(">i", len(topics))
    for t in topics:
        raw = t.encode()
        body += struct.pack(">h", len(raw)) + raw
    return body


def topic_errors(frame: bytes, internal: dict | None = None) -> dict[str, int]:
    """name -> error code from a Metadata v1 response (is_internal into `internal`)."""
    pos = 4                                            # correlation id

    def i32():
        nonlocal pos
        pos += 4
        return struct.unpack_from(">i", frame, pos - 4)[0]

    def i16():
        nonlocal pos
        pos += 2
        return struct.unpack_from(">h", frame, pos - 2)[0]

    def string():
        nonlocal pos
        n = i16()
        pos += max(n, 0)
        return frame[pos - n:pos].decode() if n >= 0 else None

    for _ in range(i32()):                             # brokers: node_id, host, port, rack
        i32(), string(), i32(), string()
    i32()                                              # controller_id
    out = {}
    for _ in range(i32()):
        error, name = i16(), string()
        pos += 1
        if internal is not None:
            internal[name] = frame[pos - 1] == 1
        for _ in range(i32()):                         # error, index, leader, replicas, isr
            i16(), i32(), i32()
            for _ in range(2):
                n = i32()
                pos += 4 * n
        out[name] = error
    return out


def create_topics_v2_body(topic: str, partitions: int) -> bytes:
    raw = topic.encode()
    return (struct.pack(">ih", 1, len(raw)) + raw + struct.pack(">ihii", partitions, 1, 0, 0)
            + struct.pack(">i?", 30000, False))


def test_a_change_whose_client_goes_away_is_finished(broker_factory):
    """A client that closes its connection cancels its request; the change it asked for still ends
    recorded and served, or not at all, never recorded and unserved."""
    b = broker_factory()
    for i in range(3):
        topic = f"orphan-{i}"
        sock = connect(b.host, b.port, timeout=30)
        sock.sendall(request_frame(19, 2, 1, create_topics_v2_body(topic, 100)))
        sock.close()
        wait_until(lambda: topic in topics_now(b), 30, f"{topic} to be served")
        assert_complete(b, topic, 100, topic)
        sock = connect(b.host, b.port, timeout=30)    # the name is taken, and says so
        sock.sendall(request_frame(19, 2, 2, create_topics_v2_body(topic, 1)))
        frame = recv_frame(sock, 30)
        sock.close()
        assert frame is not None and struct.unpack_from(">h", frame, 4 + 4 + 4 + 2 + len(topic))[0] == 36


def test_init_producer_id_pipelined_ids_are_unique_increasing_and_never_reused(broker_factory):
    b = broker_factory()
    sock = connect(b.host, b.port, timeout=60)
    deadline = time.monotonic() + 20      # one store write per 1,000 ids; a write per id took 38.7 s
    sock.sendall(b"".join(request_frame(22, 0, i, struct.pack(">hi", -1, 60000)) for i in range(2000)))
    ids = []
    for i in range(2000):
        frame = recv_frame(sock, max(deadline - time.monotonic(), 0.001))
        cid, _, error, pid, epoch = struct.unpack(">iihqh", frame)
        assert (cid, error, epoch) == (i, 0, 0)
        ids.append(pid)
    sock.close()
    assert ids == sorted(set(ids)) and len(ids) == 2000
    b.restart(kill=True)
    sock = connect(b.host, b.port, timeout=30)
    sock.sendall(request_frame(22, 0, 7, struct.pack(">hi", -1, 60000)))
    _, _, error, pid, _ = struct.unpack(">iihqh", recv_frame(sock, 30))
    sock.close()
    assert error == 0 and pid > ids[-1]
    # confluent-kafka's idempotent producer gets its id the same way and writes.
    create(b, "idem", 1)
    produce_confluent(b.bootstrap, "idem", [Msg(b"k", b"v")], enable_idempotence=True)


def test_a_249_character_topic_is_created_used_deleted_and_stays_gone(broker_factory):
    b = broker_factory()
    name = "t" * 240 + "-" + "x" * 8
    assert len(name) == 249
    create(b, name, 2)
    produce_confluent(b.bootstrap, name, [Msg(b"k", b"v", partition=p) for p in range(2)], acks="all")
    assert end_offsets(b, name, range(2)) == [1, 1]
    delete(b, name)
    wait_until(lambda: name not in topics_now(b), 20, "the topic to go")
    doomed = [n for n in os.listdir(b.log_dir) if n.endswith("-delete")]
    assert len(doomed) == 2 and all(len(n.encode()) <= 255 for n in doomed), doomed
    assert partition_dirs(b, name) == []
    b.restart()
    assert name not in topics_now(b) and partition_dirs(b, name) == []
    create(b, name, 1)
    assert end_offsets(b, name, [0]) == [0]


def test_metadata_auto_creation_makes_internal_topics_internal(broker_factory):
    from confluent_kafka.admin import ConfigResource
    b = broker_factory(**{"offsets.topic.num.partitions": 7, "transaction.state.log.num.partitions": 5,
                          "offsets.topic.segment.bytes": 2097152, "transaction.state.log.segment.bytes": 3145728})
    sock = connect(b.host, b.port, timeout=30)
    wanted = ["__consumer_offsets", "__transaction_state", "__cluster_metadata", "plain"]
    sock.sendall(request_frame(3, 1, 1, metadata_v1_body(wanted)))
    internal: dict = {}
    assert topic_errors(recv_frame(sock, 30), internal) == {
        "__consumer_offsets": 0, "__transaction_state": 0, "__cluster_metadata": UNKNOWN_TOPIC_OR_PARTITION,
        "plain": 0}
    assert internal == {"__consumer_offsets": True, "__transaction_state": True, "__cluster_metadata": False,
                        "plain": False}
    sock.close()
    topics = topics_now(b)
    assert "__cluster_metadata" not in topics
    assert {t: len(topics[t].partitions) for t in wanted[:2] + ["plain"]} == \
        {"__consumer_offsets": 7, "__transaction_state": 5, "plain": 1}
    resources = [ConfigResource("topic", t) for t in ("__consumer_offsets", "__transaction_state", "plain")]
    admin = admin_client(b)
    described = {r.name: {k: v.value for k, v in f.result(20).items()}
                 for r, f in admin.describe_configs(resources).items()}
    offsets, txn, plain = (described[t] for t in ("__consumer_offsets", "__transaction_state", "plain"))
    assert (offsets["cleanup.policy"], offsets["compression.type"], offsets["segment.bytes"]) == \
        ("compact", "producer", "2097152")
    assert (txn["cleanup.policy"], txn["compression.type"], txn["segment.bytes"], txn["min.insync.replicas"],
            txn["unclean.leader.election.enable"]) == ("compact", "uncompressed", "3145728", "1", "false")
    assert plain["cleanup.policy"] == "delete"
    # The group coordinator serves the auto-created offsets topic.
    from confluent_kafka import TopicPartition
    c = confluent_consumer(b.bootstrap, **{"group.id": "g"})
    try:
        c.commit(offsets=[TopicPartition("plain", 0, 5)], asynchronous=False)
        assert c.committed([TopicPartition("plain", 0)], timeout=20)[0].offset == 5
    finally:
        c.close()


def test_requests_past_10000_partitions_are_refused_whole(broker_factory):
    from confluent_kafka.admin import NewPartitions, NewTopic
    b = broker_factory()
    admin = admin_client(b)
    futures = admin.create_topics([NewTopic("huge-a", 6000, 1), NewTopic("huge-b", 4001, 1)], request_timeout=30)
    for f in futures.values():
        from confluent_kafka import KafkaException
        with pytest.raises(KafkaException) as e:
            f.result(30)
        assert (e.value.args[0].code(), e.value.args[0].str()) == \
            (POLICY_VIOLATION, "Excessively large number of partitions per request.")
    assert not {"huge-a", "huge-b"} & set(topics_now(b))
    create(b, "grow", 1)
    with pytest.raises(Exception) as e:
        admin.create_partitions([NewPartitions("grow", 10_002)])["grow"].result(30)
    assert e.value.args[0].code() == POLICY_VIOLATION
    assert len(topics_now(b)["grow"].partitions) == 1
