"""The controller against the embedded store in memory: plans, the multi of each change, the image,
deletions across a restart, and producer-id blocks."""

from __future__ import annotations

import pytest

from odradek.cluster.controller import Controller, requested_partitions
from odradek.cluster.journal import FileJournal
from odradek.cluster.producer_ids import PRODUCER_ID_BLOCK_PATH
from odradek.cluster.store import BadVersionError, Create, EmbeddedStore, NodeExistsError, StoreError
from odradek.cluster.topics import decode_topic_id, encode_topic_id
from odradek.protocol.error_codes import ErrorCode, KafkaApiError

LIVE = {0, 1, 2}
DEFAULTS = (1, 1)


def started(store=None) -> Controller:
    c = Controller(store or EmbeddedStore(), broker_id=0)
    c.start()
    return c


def create(c: Controller, name: str, partitions: int = 3, factor: int = 2, configs=None):
    info = c.plan_topic(name, partitions, factor, None, configs or {}, LIVE, DEFAULTS)
    c.commit(c.creation_ops([info]))
    c.publish(info)
    return info


def error_of(fn, *args) -> tuple[ErrorCode, str]:
    with pytest.raises(KafkaApiError) as e:
        fn(*args)
    return e.value.code, e.value.detail


def test_a_topic_is_written_in_one_multi_and_read_back_whole():
    store = EmbeddedStore()
    c = started(store)
    info = create(c, "orders", 3, 2, {"cleanup.policy": "compact"})
    assert c.image.get("orders") == info and c.image.by_id(info.topic_id) == info
    assert [(p, st.leader, st.isr, st.replicas) for p, st in info.partitions.items()] == \
        [(0, 0, [0, 1], [0, 1]), (1, 1, [1, 2], [1, 2]), (2, 2, [2, 0], [2, 0])]
    node, version = store.get("/brokers/topics/orders")
    assert node == {"version": 3, "topic_id": encode_topic_id(info.topic_id),
                    "partitions": {"0": [0, 1], "1": [1, 2], "2": [2, 0]},
                    "adding_replicas": {}, "removing_replicas": {}}
    assert store.get("/brokers/topics/orders/partitions/1/state")[0] == \
        {"controller_epoch": 1, "leader": 1, "version": 1, "leader_epoch": 0, "isr": [1, 2]}
    assert store.get("/config/topics/orders")[0] == {"version": 1, "config": {"cleanup.policy": "compact"}}
    assert started(store).image.get("orders") == info          # a restart reads the same topic


def test_a_request_s_topics_are_created_together_or_not_at_all():
    store = EmbeddedStore()
    c = started(store)
    a = c.plan_topic("a", 2, 1, None, {}, LIVE, DEFAULTS)
    b = c.plan_topic("b", 2, 1, None, {}, LIVE, DEFAULTS)
    store.create("/config/topics/b", {"version": 1, "config": {}})   # a node in the way
    before = dict(store.nodes)
    with pytest.raises(NodeExistsError):
        c.commit(c.creation_ops([a, b]))
    assert store.nodes == before and c.image.get("a") is None


def test_name_checks():
    c = started()
    create(c, "orders.eu")
    assert error_of(c.check_new_name, "bad name")[0] == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert error_of(c.check_new_name, "orders.eu") == \
        (ErrorCode.TOPIC_ALREADY_EXISTS, "Topic 'orders.eu' already exists.")
    assert error_of(c.check_new_name, "orders_eu") == \
        (ErrorCode.INVALID_TOPIC_EXCEPTION, "Topic 'orders_eu' collides with existing topic: orders.eu")
    c.plan_topic("pending", 1, 1, None, {}, LIVE, DEFAULTS)    # planned, not yet published: reserved
    assert error_of(c.check_new_name, "pending")[0] == ErrorCode.TOPIC_ALREADY_EXISTS
    c.release(["pending"])
    c.check_new_name("pending")
    assert error_of(c.plan_topic, "x", 1, 4, None, {}, LIVE, DEFAULTS)[0] == ErrorCode.INVALID_REPLICATION_FACTOR
    assert error_of(c.plan_topic, "x", 0, 1, None, {}, LIVE, DEFAULTS)[0] == ErrorCode.INVALID_PARTITIONS
    assert error_of(c.plan_topic, "x", -1, -1, [(0, [0]), (2, [1])], {}, LIVE, DEFAULTS) == \
        (ErrorCode.INVALID_REPLICA_ASSIGNMENT, "partitions should be a consecutive 0-based integer sequence")
    assert error_of(c.plan_topic, "x", -1, -1, [(0, [0, 7])], {}, LIVE, DEFAULTS)[0] == \
        ErrorCode.INVALID_REPLICA_ASSIGNMENT
    manual = c.plan_topic("x", -1, -1, [(1, [2, 1]), (0, [1, 0])], {}, LIVE, DEFAULTS)
    assert {p: st.replicas for p, st in manual.partitions.items()} == {0: [1, 0], 1: [2, 1]}
    assert len(c.plan_topic("y", -1, -1, None, {}, LIVE, (4, 2)).partitions) == 4


def test_partitions_are_added_with_a_conditional_write():
    store = EmbeddedStore()
    c = started(store)
    old = create(c, "t", 2, 1)
    new = c.plan_partitions("t", 5, None, LIVE)
    assert sorted(new.partitions) == [0, 1, 2, 3, 4] and new.partitions[0] == old.partitions[0]
    ops = c.partition_ops([(old, new)])
    store.set("/brokers/topics/t", store.get("/brokers/topics/t")[0])   # someone else changed the topic
    with pytest.raises(BadVersionError):
        c.commit(ops)
    assert not store.exists("/brokers/topics/t/partitions/2")
    c2 = started(store)
    old = c2.image.get("t")
    new = c2.plan_partitions("t", 5, [[1], [2], [0]], LIVE)
    c2.commit(c2.partition_ops([(old, new)]))
    published = c2.publish_partitions(new)
    assert published.version == old.version + 1
    assert started(store).image.get("t") == published
    assert error_of(c2.plan_partitions, "t", 5, None, LIVE) == \
        (ErrorCode.INVALID_PARTITIONS, "Topic already has 5 partition(s).")
    assert error_of(c2.plan_partitions, "t", 3, None, LIVE)[0] == ErrorCode.INVALID_PARTITIONS
    assert error_of(c2.plan_partitions, "nope", 3, None, LIVE)[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_config_changes_survive_a_partition_change_planned_before_them():
    c = started()
    old = create(c, "t", 1, 1)
    new = c.plan_partitions("t", 2, None, LIVE)
    c.set_topic_configs("t", {"retention.ms": "1000"})
    c.commit(c.partition_ops([(old, new)]))
    info = c.publish_partitions(new)
    assert info.configs == {"retention.ms": "1000"} and len(info.partitions) == 2


def test_a_marked_deletion_is_finished_after_a_restart_and_never_returns():
    store = EmbeddedStore()
    c = started(store)
    keep = create(c, "keep")
    doomed = create(c, "doomed", 4, 1)
    c.commit(c.deletion_mark_ops([doomed]))
    c.unpublish(["doomed"])
    assert c.image.get("doomed") is None and c.image.by_id(doomed.topic_id) is None
    # "Crash" here: a new controller on the same store.
    c2 = Controller(store, 0)
    assert c2.start() == ["doomed"]
    assert c2.image.get("doomed") is None and c2.image.get("keep") == keep
    assert error_of(c2.check_new_name, "doomed") == \
        (ErrorCode.TOPIC_ALREADY_EXISTS, "Topic 'doomed' is marked for deletion.")
    c2.complete_deletions(["doomed"])
    c2.finish_deletions(["doomed"])
    assert not any("doomed" in p for p in store.nodes)
    assert Controller(store, 0).start() == []
    create(c2, "doomed", 1, 1)


def test_a_deletion_mark_checks_the_topic_version():
    store = EmbeddedStore()
    c = started(store)
    info = create(c, "t")
    store.set("/brokers/topics/t", store.get("/brokers/topics/t")[0])
    with pytest.raises(BadVersionError):
        c.commit(c.deletion_mark_ops([info]))
    assert not store.exists("/admin/delete_topics/t")


class BrokenDisk(FileJournal):
    broken = False

    def append(self, ops):
        if self.broken:
            raise StoreError("metadata store write failed: No space left on device")
        super().append(ops)


def test_a_failed_write_leaves_store_and_image_unchanged(tmp_path):
    journal = BrokenDisk(str(tmp_path))
    store = EmbeddedStore(journal)
    c = started(store)
    create(c, "t", 2, 1)
    journal.broken = True
    nodes = dict(store.nodes)
    info = c.plan_topic("u", 2, 1, None, {}, LIVE, DEFAULTS)
    with pytest.raises(StoreError):
        c.commit(c.creation_ops([info]))
    c.release(["u"])
    with pytest.raises(StoreError):
        c.set_topic_configs("t", {"retention.ms": "1"})
    with pytest.raises(StoreError):
        c.producer_ids.claim_block()
    assert store.nodes == nodes and c.image.get("t").configs == {} and c.image.get("u") is None
    journal.broken = False
    create(c, "u", 2, 1)
    store.close()
    assert sorted(started(EmbeddedStore(FileJournal(str(tmp_path)))).image.names()) == ["t", "u"]


def test_producer_ids_come_in_blocks_of_a_thousand_with_one_write_each(tmp_path):
    store = EmbeddedStore(FileJournal(str(tmp_path)))
    c = started(store)
    ids = c.producer_ids
    seq = store.journal.seq
    got = []
    while len(got) < 2500:
        pid = ids.next_id()
        if pid is None:
            ids.install(ids.claim_block())
            continue
        got.append(pid)
    assert got == list(range(2500))
    assert store.journal.seq - seq == 3
    assert store.get(PRODUCER_ID_BLOCK_PATH)[0] == \
        {"version": 1, "broker": 0, "block_start": "2000", "block_end": "2999"}
    store.close()
    again = started(EmbeddedStore(FileJournal(str(tmp_path))))
    assert again.producer_ids.next_id() is None
    block = again.producer_ids.claim_block()
    assert (block.block_start, block.block_end) == (3000, 3999)


def test_producer_ids_continue_after_the_counter_of_earlier_versions():
    store = EmbeddedStore()
    c = started(store)
    store.create(PRODUCER_ID_BLOCK_PATH, {"next": 42})
    block = c.producer_ids.claim_block()
    assert (block.block_start, block.block_end) == (42, 1041)


def test_a_block_claimed_elsewhere_meanwhile_is_not_reused():
    store = EmbeddedStore()
    c = started(store)
    real_multi = store.multi
    raced = []

    def racing_multi(ops):
        if not raced:      # another broker claims [0, 999] between our read and our write
            raced.append(1)
            real_multi([Create(PRODUCER_ID_BLOCK_PATH, {"version": 1, "broker": 5, "block_start": "0",
                                                        "block_end": "999"})])
        return real_multi(ops)

    store.multi = racing_multi
    block = c.producer_ids.claim_block()
    assert (block.block_start, block.block_end) == (1000, 1999)


def test_requested_partitions_count_as_kafka_counts_them():
    assert requested_partitions(5, 0, 1) == 5
    assert requested_partitions(-1, 0, 7) == 7
    assert requested_partitions(-1, 3, 7) == 3
    assert requested_partitions(-5, 0, 7) == 0


def test_topic_ids_are_kept_as_kafka_writes_them():
    import uuid
    tid = uuid.uuid4()
    text = encode_topic_id(tid)
    assert len(text) == 22 and "=" not in text
    assert decode_topic_id(text) == tid == decode_topic_id(str(tid))


def test_persistent_paths_are_created_once(tmp_path):
    store = EmbeddedStore(FileJournal(str(tmp_path)))
    started(store)
    for path in ("/brokers/topics", "/admin/delete_topics", "/config/topics", "/config/brokers", "/cluster"):
        assert store.exists(path)
    seq = store.journal.seq
    started(store)
    assert store.journal.seq == seq, "a second start writes nothing"


def test_a_partition_state_change_is_written_then_imaged():
    from odradek.cluster.topics import PartitionState
    store = EmbeddedStore()
    c = started(store)
    create(c, "t", 2, 2)
    state = PartitionState(leader=1, leader_epoch=1, isr=[1], replicas=[0, 1])
    c.set_partition_state("t", 0, state)
    assert c.image.get("t").partitions[0] == state
    assert store.get("/brokers/topics/t/partitions/0/state") == \
        ({"controller_epoch": 1, "leader": 1, "version": 1, "leader_epoch": 1, "isr": [1]}, 1)
    assert started(store).image.get("t").partitions[0] == state
