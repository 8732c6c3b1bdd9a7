"""Round trips through a real broker with confluent-kafka, kafka-python, aiokafka and kcat: every codec,
keys, headers, tombstones, CreateTime and LogAppendTime, offsets by time, seek, the max.message.bytes
boundary, kafka-python forced to old protocol versions, and reads across clients."""

from __future__ import annotations

import time

import pytest

from .clients import (
    CODECS, CONSUMERS, PRODUCERS, Msg, assert_partition_valid, consume_aiokafka, consume_confluent,
    consume_kafka_python, consume_kcat, confluent_config, confluent_consumer, kcat_path,
    produce_confluent, produce_kafka_python, sample_messages,
)

MAX_MESSAGE_BYTES = 100_000
BROKER_OVERRIDES = {"message.max.bytes": MAX_MESSAGE_BYTES}
N = 40


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def kcat_messages(n: int, prefix: str) -> list[Msg]:
    """What kcat can send: text, an empty key or value meaning null, the same headers on every record."""
    headers = (("via", b"kcat"), ("n", b""))
    out = []
    for i in range(n):
        key = None if i % 5 == 3 else f"{prefix}key-{i}".encode()
        value = None if i % 7 == 5 else (f"{prefix}value-{i} " * (1 + i % 13)).strip().encode()
        out.append(Msg(key, value, headers))
    return out


def read_everywhere(bootstrap: str, topic: str, partitions=(0,)) -> dict[str, list]:
    return {name: consume(bootstrap, topic, partitions) for name, consume in CONSUMERS.items()}


def assert_same_everywhere(reads: dict[str, list]) -> list:
    """Every consumer read the same records: offsets, keys, values, headers, timestamps and their type."""
    names = list(reads)
    first = reads[names[0]]
    for name in names[1:]:
        assert reads[name] == first, f"{name} read differently from {names[0]}:\n" + "\n".join(
            f"  {a}\n  {b}" for a, b in zip(first, reads[name]) if a != b)
    return first


def assert_matches(records: list, msgs: list[Msg], *, ts_type: str = "create", first_offset: int = 0) -> None:
    assert [r.offset for r in records] == list(range(first_offset, first_offset + len(msgs)))
    assert [r.content() for r in records] == [(m.key, m.value, m.headers) for m in msgs]
    assert {r.ts_type for r in records} <= {ts_type}
    if ts_type == "create":
        for r, m in zip(records, msgs):
            if m.timestamp is not None:
                assert r.ts == m.timestamp, f"offset {r.offset}: timestamp {r.ts}, produced {m.timestamp}"


# ------------------------------------------------------------------------------------------ every codec
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("producer", list(PRODUCERS))
def test_round_trip(broker, producer, codec):
    topic = f"rt-{producer}-{codec}"
    if producer == "kcat":
        msgs = kcat_messages(N, prefix=codec)
    else:
        msgs = sample_messages(N, base_ts=now_ms() - 600_000, prefix=codec)
    acks = PRODUCERS[producer](broker.bootstrap, topic, msgs, compression=codec)
    if acks is not None:
        assert sorted(a.offset for a in acks) == list(range(N))
    reads = read_everywhere(broker.bootstrap, topic)
    records = assert_same_everywhere(reads)
    assert_matches(records, msgs)
    # The codec really reached the log: check the stored batches, with our own parser.
    batches = assert_partition_valid(broker.log_dir, topic, 0)
    codecs = [b.codec for b in batches]
    # librdkafka sends a batch uncompressed when compressing does not make it smaller (a lone record)
    assert codec in codecs and set(codecs) <= {codec, "none"}, codecs
    assert sum(b.records_count for b in batches) == N


def test_cross_client_mixed_topic(broker):
    """Four producers write one partition in turn; every consumer reads the same interleaved log."""
    topic = "rt-mixed"
    expected: list[Msg] = []
    base = now_ms() - 300_000
    for i, (name, produce) in enumerate(PRODUCERS.items()):
        codec = CODECS[1 + i % 4]
        msgs = kcat_messages(7, prefix=name) if name == "kcat" else \
            sample_messages(7, base_ts=base + 1000 * i, prefix=name, text=True)
        produce(broker.bootstrap, topic, msgs, compression=codec)
        expected += msgs
    records = assert_same_everywhere(read_everywhere(broker.bootstrap, topic))
    assert_matches(records, expected)


def test_binary_keys_values_and_headers(broker):
    """Arbitrary bytes (not text) survive, read back by the three library clients."""
    topic = "rt-binary"
    msgs = sample_messages(30, base_ts=now_ms() - 1000, text=False)
    msgs += [Msg(b"\x00\xff" * 50, b"", (("bin", bytes(range(256))),), now_ms()),
             Msg(b"", b"\x00", (), now_ms())]
    produce_confluent(broker.bootstrap, topic, msgs, compression="lz4")
    reads = {"confluent": consume_confluent(broker.bootstrap, topic),
             "kafka-python": consume_kafka_python(broker.bootstrap, topic),
             "aiokafka": consume_aiokafka(broker.bootstrap, topic)}
    assert_matches(assert_same_everywhere(reads), msgs)


# ------------------------------------------------------------------------------------------ LogAppendTime
def check_log_append_time(bootstrap: str, log_dir, topic_prefix: str, create_topic=None) -> None:
    old = now_ms() - 3_600_000
    for name in ("confluent", "kafka-python", "aiokafka", "kcat"):
        topic = f"{topic_prefix}-{name}"
        if create_topic is not None:
            create_topic(topic)
        before = now_ms()
        if name == "kcat":
            msgs = kcat_messages(10, prefix=name)
        else:
            msgs = [Msg(f"k{i}".encode(), f"v{i}".encode(), (("h", b"x"),), old + i) for i in range(10)]
        acks = PRODUCERS[name](bootstrap, topic, msgs, compression="gzip")
        after = now_ms()
        if acks is not None:
            for a in acks:   # the broker's append time comes back in the produce response
                assert a.timestamp is not None and before - 5 <= a.timestamp <= after + 5, (name, a)
        records = assert_same_everywhere(read_everywhere(bootstrap, topic))
        assert [r.content() for r in records] == [(m.key, m.value, m.headers) for m in msgs]
        for r in records:
            assert r.ts_type == "append", (name, r)
            assert before - 5 <= r.ts <= after + 5, (name, r, before, after)
        # Stamped batches carry the LogAppendTime attribute and a CRC recomputed over it.
        batches = assert_partition_valid(log_dir, topic, 0)
        assert all(b.attributes & 0x08 and before - 5 <= b.max_timestamp <= after + 5 for b in batches)


def test_log_append_time_broker_default(broker_factory):
    """log.message.timestamp.type=LogAppendTime: the broker's clock replaces the producer's timestamps."""
    b = broker_factory(**{"log.message.timestamp.type": "LogAppendTime"})
    check_log_append_time(b.bootstrap, b.log_dir, "lat-broker")


def test_log_append_time_topic_config(broker):
    """A topic created with message.timestamp.type=LogAppendTime (AdminClient.create_topics) stamps its
    records with the broker's clock, while the broker's other topics keep CreateTime."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})

    def create(topic):
        futures = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1,
                                                config={"message.timestamp.type": "LogAppendTime"})],
                                      operation_timeout=10, request_timeout=15)
        futures[topic].result(timeout=20)

    check_log_append_time(broker.bootstrap, broker.log_dir, "lat-topic", create)
    ts = now_ms() - 60_000
    produce_confluent(broker.bootstrap, "lat-topic-neighbour", [Msg(b"k", b"v", (), ts)])
    [r] = consume_confluent(broker.bootstrap, "lat-topic-neighbour")
    assert (r.ts_type, r.ts) == ("create", ts)


# ------------------------------------------------------------------------------------------ offsets by time
@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_offsets_for_times(broker, codec):
    from confluent_kafka import TopicPartition as CTP
    from kafka import TopicPartition as KTP

    topic = f"oft-{codec}"
    base = now_ms() - 100_000
    # Timestamps: 20 increasing ones (in a few batches), then an out-of-order dip, then a later one.
    stamps = [base + 1000 * i for i in range(20)] + [base + 500, base + 30_000]
    msgs = [Msg(f"k{i}".encode(), f"v{i}".encode() * 10, (), ts) for i, ts in enumerate(stamps)]
    produce_confluent(broker.bootstrap, topic, msgs[:7], compression=codec)
    produce_confluent(broker.bootstrap, topic, msgs[7:15], compression=codec)
    produce_confluent(broker.bootstrap, topic, msgs[15:], compression=codec, flush_each=True)
    n = len(msgs)
    cases = {  # target timestamp -> first offset with timestamp >= target
        base - 10_000: 0, base: 0, base + 1: 1, base + 2500: 3, base + 5000: 5,
        base + 19_000: 19, base + 19_001: 21, base + 30_000: 21,
    }
    beyond = base + 30_001

    c = confluent_consumer(broker.bootstrap)
    try:
        assert c.get_watermark_offsets(CTP(topic, 0), timeout=10) == (0, n)
        for ts, want in cases.items():
            [r] = c.offsets_for_times([CTP(topic, 0, ts)], timeout=10)
            assert r.error is None and r.offset == want, (ts - base, r)
        [r] = c.offsets_for_times([CTP(topic, 0, beyond)], timeout=10)
        assert r.offset == -1, r   # OFFSET_END: no record that late
    finally:
        c.close()

    from kafka import KafkaConsumer
    kc = KafkaConsumer(bootstrap_servers=broker.bootstrap, request_timeout_ms=20000)
    try:
        tp = KTP(topic, 0)
        assert kc.beginning_offsets([tp]) == {tp: 0}
        assert kc.end_offsets([tp]) == {tp: n}
        for ts, want in cases.items():
            found = kc.offsets_for_times({tp: ts})[tp]
            assert found is not None and found.offset == want, (ts - base, found)
            assert found.timestamp == stamps[want]
        assert kc.offsets_for_times({tp: beyond})[tp] is None
    finally:
        kc.close()

    import asyncio
    from aiokafka import AIOKafkaConsumer, TopicPartition as ATP

    async def aio():
        ac = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, request_timeout_ms=20000)
        await ac.start()
        try:
            tp = ATP(topic, 0)
            for ts, want in cases.items():
                found = (await ac.offsets_for_times({tp: ts}))[tp]
                assert found is not None and found.offset == want, (ts - base, found)
            assert (await ac.offsets_for_times({tp: beyond}))[tp] is None
        finally:
            await ac.stop()

    asyncio.run(aio())

    import subprocess
    for ts, want in list(cases.items())[:4]:
        r = subprocess.run([kcat_path(), "-b", broker.bootstrap, "-Q", "-t", f"{topic}:0:{ts}"],
                           capture_output=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert f"offset {want}" in r.stdout.decode(), (ts - base, r.stdout)


# ------------------------------------------------------------------------------------------ seek
def test_seek(broker):
    from confluent_kafka import TopicPartition as CTP

    topic = "seek"
    msgs = [Msg(f"k{i}".encode(), f"v{i}".encode(), (), now_ms()) for i in range(30)]
    produce_confluent(broker.bootstrap, topic, msgs[:10])
    produce_confluent(broker.bootstrap, topic, msgs[10:], compression="snappy")

    c = confluent_consumer(broker.bootstrap)
    try:
        c.assign([CTP(topic, 0, 0)])

        def next_msg():
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is not None:
                    assert not m.error(), m.error()
                    return m
            raise AssertionError("no message within 15s")

        assert [next_msg().offset() for _ in range(5)] == [0, 1, 2, 3, 4]
        for target in (17, 3, 29, 12):   # forward into a compressed batch, back, to the last, middle
            c.seek(CTP(topic, 0, target))
            m = next_msg()
            assert (m.offset(), m.value()) == (target, f"v{target}".encode())
    finally:
        c.close()

    for consume in (consume_kafka_python, consume_aiokafka, consume_kcat):
        got = consume(broker.bootstrap, topic, start={0: 13})
        assert [r.offset for r in got] == list(range(13, 30)), consume.__name__
        assert [r.value for r in got] == [m.value for m in msgs[13:]], consume.__name__


# ------------------------------------------------------------------------------------------ size limit
def test_max_message_bytes_confluent(broker):
    """A batch of exactly message.max.bytes is accepted; one byte more is refused with
    MSG_SIZE_TOO_LARGE; the records around it are all there, with consecutive offsets."""
    from confluent_kafka import KafkaError

    topic = "size-confluent"
    overhead = 61 + 11   # v2 batch header + one record (null key, no headers, 3-byte value length)
    at_limit = Msg(None, b"a" * (MAX_MESSAGE_BYTES - overhead), ())
    over = Msg(None, b"b" * (MAX_MESSAGE_BYTES - overhead + 1), ())
    small = [Msg(b"s%d" % i, b"small-%d" % i, ()) for i in range(4)]
    acks = produce_confluent(broker.bootstrap, topic, [small[0], small[1], at_limit, over, small[2], small[3]],
                             flush_each=True, raise_errors=False, **{"linger.ms": 0, "retries": 0})
    by_value = {a.msg.value: a for a in acks}
    assert by_value[over.value].error is not None
    assert by_value[over.value].error.code() == KafkaError.MSG_SIZE_TOO_LARGE, by_value[over.value].error
    good = [small[0], small[1], at_limit, small[2], small[3]]
    assert [by_value[m.value].error for m in good] == [None] * 5
    assert [by_value[m.value].offset for m in good] == [0, 1, 2, 3, 4]
    batches = assert_partition_valid(broker.log_dir, topic, 0)
    assert max(b.size for b in batches) == MAX_MESSAGE_BYTES   # the boundary really was tested
    for consume in (consume_confluent, consume_kafka_python, consume_aiokafka):
        assert [r.value for r in consume(broker.bootstrap, topic)] == [m.value for m in good]


def test_max_message_bytes_kafka_python_and_aiokafka(broker):
    import asyncio

    import aiokafka.errors
    import kafka.errors
    from aiokafka import AIOKafkaProducer
    from kafka import KafkaProducer

    topic = "size-py"
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0, retries=0, request_timeout_ms=20000)
    try:
        assert p.send(topic, value=b"x" * (MAX_MESSAGE_BYTES - 200)).get(20).offset == 0
        with pytest.raises(kafka.errors.MessageSizeTooLargeError):
            p.send(topic, value=b"y" * (MAX_MESSAGE_BYTES + 100)).get(20)
        assert p.send(topic, value=b"after").get(20).offset == 1
    finally:
        p.close(10)

    async def aio():
        ap = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, request_timeout_ms=20000)
        await ap.start()
        try:
            assert (await (await ap.send(topic, value=b"z" * (MAX_MESSAGE_BYTES - 200)))).offset == 2
            with pytest.raises(aiokafka.errors.MessageSizeTooLargeError):
                await (await ap.send(topic, value=b"w" * (MAX_MESSAGE_BYTES + 100)))
            assert (await (await ap.send(topic, value=b"end"))).offset == 3
        finally:
            await ap.stop()

    asyncio.run(aio())
    values = [r.value for r in consume_confluent(broker.bootstrap, topic)]
    assert values == [b"x" * (MAX_MESSAGE_BYTES - 200), b"after", b"z" * (MAX_MESSAGE_BYTES - 200), b"end"]


# ------------------------------------------------------------------------------------------ old clients
@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4"])
@pytest.mark.parametrize("api_version", [(0, 10), (0, 9)], ids=["0.10", "0.9"])
def test_kafka_python_old_protocol(broker, api_version, codec):
    """kafka-python pinned to 0.10 (message format v1) or 0.9 (v0) produces and consumes; modern
    clients read what it wrote, and it reads what modern clients wrote (down-converted)."""
    topic = f"old-{api_version[0]}{api_version[1]}-{codec}"
    base = now_ms() - 5000
    with_ts = api_version >= (0, 10)
    msgs = [Msg(None if i % 4 == 1 else f"k{i}".encode(), None if i % 6 == 4 else f"value {i} ".encode() * 8,
                (), base + i if with_ts else None) for i in range(25)]
    acks = produce_kafka_python(broker.bootstrap, topic, msgs, compression=codec, api_version=api_version)
    assert [a.offset for a in acks] == list(range(25))
    old = consume_kafka_python(broker.bootstrap, topic, api_version=api_version)
    assert [(r.offset, r.key, r.value) for r in old] == [(i, m.key, m.value) for i, m in enumerate(msgs)]
    if with_ts:
        assert [r.ts for r in old] == [m.timestamp for m in msgs]
    modern = assert_same_everywhere({"confluent": consume_confluent(broker.bootstrap, topic),
                                     "aiokafka": consume_aiokafka(broker.bootstrap, topic),
                                     "kafka-python": consume_kafka_python(broker.bootstrap, topic)})
    assert [(r.key, r.value) for r in modern] == [(m.key, m.value) for m in msgs]
    if with_ts:
        assert [r.ts for r in modern] == [m.timestamp for m in msgs]

    # And the other way: records from a modern producer, read at the old version.
    topic2 = topic + "-down"
    new = [Msg(f"n{i}".encode(), f"new {i}".encode() * 5, (("h", b"dropped"),), base + i) for i in range(12)]
    produce_confluent(broker.bootstrap, topic2, new, compression=codec)
    old = consume_kafka_python(broker.bootstrap, topic2, api_version=api_version)
    assert [(r.offset, r.key, r.value) for r in old] == [(i, m.key, m.value) for i, m in enumerate(new)]
    if with_ts:
        assert [r.ts for r in old] == [m.timestamp for m in new]


# ------------------------------------------------------------------------------------------ more edges
def test_acks_0_1_all(broker):
    """acks=0 (no response), acks=1 and acks=all all store every record, in order."""
    for acks in (0, 1, -1):
        topic = f"acks-{acks}".replace("-1", "all")
        msgs = [Msg(f"k{i}".encode(), f"acks {acks} #{i}".encode(), (), now_ms()) for i in range(200)]
        produce_confluent(broker.bootstrap, topic, msgs, compression="gzip", acks=acks)
        got = consume_confluent(broker.bootstrap, topic)
        assert [r.value for r in got] == [m.value for m in msgs], acks


def test_records_larger_than_the_fetch_limits(broker):
    """A batch larger than the consumer's fetch.max.bytes / max.partition.fetch.bytes still comes back
    whole (at least one batch per fetch), so no consumer gets stuck behind it."""
    topic = "big-records"
    msgs = [Msg(f"k{i}".encode(), bytes([97 + i]) * (60_000 + i), (), now_ms()) for i in range(8)]
    produce_confluent(broker.bootstrap, topic, msgs, flush_each=True)
    got = consume_confluent(broker.bootstrap, topic, **{"fetch.max.bytes": 1024, "max.partition.fetch.bytes": 512,
                                                        "message.max.bytes": 1000,
                                                        "receive.message.max.bytes": 200_000})
    assert [r.value for r in got] == [m.value for m in msgs]
    got = consume_kafka_python(broker.bootstrap, topic, fetch_max_bytes=1024, max_partition_fetch_bytes=512)
    assert [r.value for r in got] == [m.value for m in msgs]
    got = consume_aiokafka(broker.bootstrap, topic, fetch_max_bytes=1024, max_partition_fetch_bytes=512)
    assert [r.value for r in got] == [m.value for m in msgs]


def test_long_poll_answers_when_data_arrives(broker):
    """A consumer waiting at the log end (fetch.wait.max.ms=10 s) gets a new record at once, not after
    its wait expires: the broker answers a waiting fetch as soon as an append brings data."""
    from confluent_kafka import Producer, TopicPartition

    topic = "long-poll"
    produce_confluent(broker.bootstrap, topic, [Msg(b"k", b"first", (), now_ms())])
    c = confluent_consumer(broker.bootstrap, **{"fetch.wait.max.ms": 10_000, "fetch.min.bytes": 1})
    p = Producer(confluent_config(broker.bootstrap, **{"linger.ms": 0}))
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        m = c.poll(10)
        assert m is not None and m.value() == b"first"
        assert c.poll(0.5) is None              # now parked in a long poll at the log end
        latencies = []
        for i in range(3):
            t0 = time.monotonic()
            p.produce(topic, value=b"v%d" % i, partition=0)
            p.flush(10)
            m = c.poll(9)
            latencies.append(time.monotonic() - t0)
            assert m is not None and m.value() == b"v%d" % i
        assert max(latencies) < 3.0, latencies  # a 10 s wait would show here
    finally:
        c.close()


def test_fetch_beyond_the_log_end_resets(broker):
    """A consumer positioned past the log end gets OFFSET_OUT_OF_RANGE and follows auto.offset.reset."""
    from confluent_kafka import TopicPartition

    topic = "beyond-end"
    produce_confluent(broker.bootstrap, topic, [Msg(b"k", b"v%d" % i, ()) for i in range(10)])
    for reset, want in (("earliest", 0), ("latest", None)):
        c = confluent_consumer(broker.bootstrap, **{"auto.offset.reset": reset})
        try:
            c.assign([TopicPartition(topic, 0, 1000)])
            if want is not None:
                m = c.poll(15)
                assert m is not None and not m.error() and m.offset() == want, m
            else:
                assert c.poll(1.5) is None
                produce_confluent(broker.bootstrap, topic, [Msg(b"k", b"late", ())])
                deadline = time.monotonic() + 15
                m = None
                while m is None and time.monotonic() < deadline:
                    m = c.poll(0.2)
                assert m is not None and not m.error() and m.offset() == 10 and m.value() == b"late", m
        finally:
            c.close()


def test_timestamp_bounds(broker):
    """CreateTime more than message.timestamp.after.max.ms (1 h) ahead is refused with INVALID_TIMESTAMP;
    very old timestamps are kept (before.max.ms is unlimited); the refused record leaves no trace."""
    from confluent_kafka import KafkaError

    topic = "ts-bounds"
    ok_old = Msg(b"old", b"1", (), 1)
    future = Msg(b"future", b"2", (), now_ms() + 2 * 3_600_000)
    ok_now = Msg(b"now", b"3", (), now_ms())
    acks = produce_confluent(broker.bootstrap, topic, [ok_old, future, ok_now], flush_each=True,
                             raise_errors=False, retries=0)
    errors = {a.msg.key: a.error for a in acks}
    assert errors[b"old"] is None and errors[b"now"] is None
    assert errors[b"future"] is not None and errors[b"future"].code() == KafkaError.INVALID_TIMESTAMP
    got = consume_confluent(broker.bootstrap, topic)
    assert [(r.offset, r.key, r.ts) for r in got] == [(0, b"old", 1), (1, b"now", ok_now.timestamp)]


def test_admin_list_offsets_and_empty_partitions(broker):
    """ListOffsets through the AdminClient: earliest, latest and max-timestamp (KIP-734), on a topic with
    out-of-order timestamps and on an empty one."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("lo-empty", 1, 1)], request_timeout=15)["lo-empty"].result(20)
    base = now_ms() - 50_000
    stamps = [base + 10, base + 40_000, base + 20, base + 30]
    produce_confluent(broker.bootstrap, "lo-data",
                      [Msg(b"k", f"v{i}".encode(), (), ts) for i, ts in enumerate(stamps)], compression="zstd")

    def lookup(topic, spec):
        tp = TopicPartition(topic, 0)
        return admin.list_offsets({tp: spec}, request_timeout=15)[tp].result(20)

    assert lookup("lo-data", OffsetSpec.earliest()).offset == 0
    assert lookup("lo-data", OffsetSpec.latest()).offset == 4
    r = lookup("lo-data", OffsetSpec.max_timestamp())
    assert (r.offset, r.timestamp) == (1, base + 40_000)
    assert lookup("lo-data", OffsetSpec.for_timestamp(base + 15)).offset == 1
    assert lookup("lo-data", OffsetSpec.for_timestamp(base + 40_001)).offset == -1
    assert lookup("lo-empty", OffsetSpec.earliest()).offset == 0
    assert lookup("lo-empty", OffsetSpec.latest()).offset == 0
    assert lookup("lo-empty", OffsetSpec.max_timestamp()).offset == -1
    assert lookup("lo-empty", OffsetSpec.for_timestamp(base)).offset == -1
    assert consume_kcat(broker.bootstrap, "lo-empty") == []


def test_null_header_values(broker):
    topic = "null-headers"
    msgs = [Msg(b"k", b"v", (("nothing", None), ("empty", b""), ("x", b"1")), now_ms())]
    produce_confluent(broker.bootstrap, topic, msgs)
    reads = {"confluent": consume_confluent(broker.bootstrap, topic),
             "kafka-python": consume_kafka_python(broker.bootstrap, topic),
             "aiokafka": consume_aiokafka(broker.bootstrap, topic)}
    assert_matches(assert_same_everywhere(reads), msgs)


def test_many_partitions_with_incremental_fetch_sessions(broker):
    """Live consumers on 12 partitions (fetch sessions, KIP-227) get every record of every round, where
    each round writes only to some partitions: the incremental responses must name exactly those."""
    from confluent_kafka import TopicPartition as CTP
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka import KafkaConsumer, TopicPartition as KTP

    topic = "sessions"
    parts = 12
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, parts, 1)], request_timeout=15)[topic].result(20)
    c = confluent_consumer(broker.bootstrap, **{"fetch.wait.max.ms": 100})
    c.assign([CTP(topic, p, 0) for p in range(parts)])
    kc = KafkaConsumer(bootstrap_servers=broker.bootstrap, fetch_max_wait_ms=100, enable_auto_commit=False,
                       request_timeout_ms=20000)
    kc.assign([KTP(topic, p) for p in range(parts)])
    for p in range(parts):
        kc.seek(KTP(topic, p), 0)
    seen_c: set = set()
    seen_k: set = set()
    try:
        for rnd in range(6):
            targets = [p for p in range(parts) if (p * 7 + rnd) % 4 == 0]
            msgs = [Msg(b"r%d" % rnd, f"round {rnd} p{p} #{i}".encode(), (), partition=p)
                    for p in targets for i in range(3)]
            produce_confluent(broker.bootstrap, topic, msgs)
            want = {m.value for m in msgs}
            deadline = time.monotonic() + 15
            while not (want <= seen_c and want <= seen_k):
                assert time.monotonic() < deadline, (rnd, sorted(want - seen_c), sorted(want - seen_k))
                m = c.poll(0.05)
                if m is not None:
                    assert not m.error(), m.error()
                    seen_c.add(m.value())
                for _, batch in kc.poll(timeout_ms=50).items():
                    seen_k.update(r.value for r in batch)
        assert seen_c == seen_k
    finally:
        c.close()
        kc.close()
