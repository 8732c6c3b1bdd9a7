"""A torn or corrupted log tail after a crash: garbage appended, bits flipped in the last batch, the last
batch cut in half. Recovery (no clean-shutdown marker) truncates the log to its last valid batch; no
client is ever served an invalid batch, and ListOffsets (earliest, latest, by time) stays right."""

from __future__ import annotations

import os
import random
import subprocess
import time

import pytest

from .clients import (
    CONSUMERS, Msg, assert_partition_valid, confluent_consumer, kcat_path, produce_confluent, scan_segment,
    segment_files,
)

TOPIC = "torn"
RECORDS_PER_BATCH = 5
BATCHES = 30
VALUE_BYTES = 9000         # 30 batches of ~45 KB: about 1.3 MB, two segments at 1 MiB


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def corrupt(path: str, mode: str) -> int:
    """Damage the segment at `path`; return how many whole batches remain valid."""
    scan = scan_segment(path)
    assert scan.problem is None and scan.batches, scan
    last = scan.batches[-1]
    rng = random.Random(20240611)
    if mode == "garbage":
        with open(path, "ab") as f:
            f.write(bytes(rng.randrange(256) for _ in range(777)))
        return len(scan.batches)
    if mode == "bitflip":
        with open(path, "r+b") as f:
            for pos in (last.position + 70, last.position + last.size // 2, last.end - 3):
                f.seek(pos)
                b = f.read(1)[0]
                f.seek(pos)
                f.write(bytes([b ^ 0x5A]))
        return len(scan.batches) - 1
    if mode == "cut":
        os.truncate(path, last.position + last.size // 2)
        return len(scan.batches) - 1
    raise ValueError(mode)


@pytest.mark.parametrize("mode", ["garbage", "bitflip", "cut"])
def test_recovery_truncates_corrupt_tail(broker_factory, mode):
    b = broker_factory(**{"log.segment.bytes": 1048576})
    base = now_ms() - 3_600_000
    msgs = []
    for i in range(BATCHES * RECORDS_PER_BATCH):
        value = (f"{i:06d}" * (VALUE_BYTES // 6)).encode()
        msgs.append(Msg(f"k{i}".encode(), value, (("i", str(i).encode()),), base + 1000 * i))
    produce_confluent(b.bootstrap, TOPIC, msgs, flush_every=RECORDS_PER_BATCH,
                      **{"linger.ms": 50, "batch.num.messages": RECORDS_PER_BATCH})
    assert b.stop() == 0
    files = segment_files(b.log_dir, TOPIC, 0)
    assert len(files) >= 2, f"expected rolled segments, got {files}"
    batches_before = assert_partition_valid(b.log_dir, TOPIC, 0)
    total = sum(x.records_count for x in batches_before)
    assert total == BATCHES * RECORDS_PER_BATCH

    b.clean_shutdown_marker.unlink()          # as after a crash: recovery runs
    in_last = len(scan_segment(files[-1]).batches)
    remaining_in_last = corrupt(files[-1], mode)
    valid_batches = len(batches_before) - in_last + remaining_in_last
    end = sum(x.records_count for x in batches_before[:valid_batches])
    assert end == total - (0 if mode == "garbage" else batches_before[-1].records_count)
    assert end < total or mode == "garbage"
    b.start()

    # The log on disk is whole again, and ends where the valid batches end.
    assert_partition_valid(b.log_dir, TOPIC, 0)
    check_offsets(b.bootstrap, end, msgs, base)
    for name, consume in CONSUMERS.items():
        got = consume(b.bootstrap, TOPIC)
        assert [r.offset for r in got] == list(range(end)), name
        assert [r.content() for r in got] == [(m.key, m.value, m.headers) for m in msgs[:end]], name
        assert [r.ts for r in got] == [m.timestamp for m in msgs[:end]], name

    # Appends go on from the new end; the lost offsets are reused by new records, found by time too.
    later = [Msg(f"new{i}".encode(), f"new-{i}".encode(), (), base + 1_000_000 + i) for i in range(3)]
    acks = produce_confluent(b.bootstrap, TOPIC, later)
    assert sorted(a.offset for a in acks) == [end, end + 1, end + 2]
    got = CONSUMERS["kcat"](b.bootstrap, TOPIC, start={0: end - 1})
    assert [(r.offset, r.value) for r in got] == [(end - 1, msgs[end - 1].value)] + \
        [(end + i, m.value) for i, m in enumerate(later)]
    c = confluent_consumer(b.bootstrap)
    try:
        from confluent_kafka import TopicPartition
        [r] = c.offsets_for_times([TopicPartition(TOPIC, 0, base + 1000 * end)], timeout=10)
        assert r.offset == end, r   # the first of the new records: nothing of the cut batch is indexed
    finally:
        c.close()

    # A clean restart keeps exactly this.
    b.restart()
    assert_partition_valid(b.log_dir, TOPIC, 0)
    got = CONSUMERS["confluent"](b.bootstrap, TOPIC)
    assert [r.value for r in got] == [m.value for m in msgs[:end]] + [m.value for m in later]


def check_offsets(bootstrap: str, end: int, msgs: list[Msg], base: int) -> None:
    """Earliest, latest and by-time lookups, from three clients."""
    from confluent_kafka import TopicPartition as CTP
    from kafka import KafkaConsumer, TopicPartition as KTP

    lost_ts = base + 1000 * end          # the first timestamp that is gone, if any was cut
    c = confluent_consumer(bootstrap)
    try:
        assert c.get_watermark_offsets(CTP(TOPIC, 0), timeout=10) == (0, end)
        for i in (0, 7, end // 2, end - 1):
            [r] = c.offsets_for_times([CTP(TOPIC, 0, msgs[i].timestamp)], timeout=10)
            assert r.offset == i, (i, r)
        [r] = c.offsets_for_times([CTP(TOPIC, 0, lost_ts)], timeout=10)
        assert r.offset == -1, r
    finally:
        c.close()
    kc = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=20000)
    try:
        tp = KTP(TOPIC, 0)
        assert kc.beginning_offsets([tp]) == {tp: 0}
        assert kc.end_offsets([tp]) == {tp: end}
        found = kc.offsets_for_times({tp: msgs[end - 1].timestamp - 1})[tp]
        assert (found.offset, found.timestamp) == (end - 1, msgs[end - 1].timestamp)
        assert kc.offsets_for_times({tp: lost_ts})[tp] is None
    finally:
        kc.close()
    r = subprocess.run([kcat_path(), "-b", bootstrap, "-Q", "-t", f"{TOPIC}:0:-1"], capture_output=True, timeout=30)
    assert r.returncode == 0 and f"offset {end}" in r.stdout.decode(), (r.stdout, r.stderr)


@pytest.mark.parametrize("damage", ["deleted", "emptied", "garbage"])
def test_damaged_index_files_are_rebuilt(broker_factory, damage):
    """The .index and .timeindex files are derived data: deleted or emptied in every segment, or
    overwritten with garbage in the last one, while the broker is down after a crash, they are rebuilt,
    and seeks and lookups by time into every segment stay exact. (Garbage in the indexes of segments
    below the recovery point is not looked for at start, as in Kafka, which skips those checks.)"""
    b = broker_factory(**{"log.segment.bytes": 1048576, "log.index.interval.bytes": 4096})
    base = now_ms() - 3_600_000
    msgs = [Msg(f"k{i}".encode(), (f"{i:06d}" * 500).encode(), (), base + 1000 * i) for i in range(600)]
    produce_confluent(b.bootstrap, TOPIC, msgs, flush_every=20)
    assert b.stop() == 0
    files = segment_files(b.log_dir, TOPIC, 0)
    assert len(files) >= 2
    b.clean_shutdown_marker.unlink()
    rng = random.Random(7)
    for log_file in (files[-1:] if damage == "garbage" else files):
        for suffix in (".index", ".timeindex"):
            path = log_file[:-4] + suffix
            if damage == "deleted":
                os.unlink(path)
            elif damage == "emptied":
                os.truncate(path, 0)
            else:
                size = max(os.path.getsize(path), 4096)
                with open(path, "r+b") as f:
                    f.write(bytes(rng.randrange(256) for _ in range(size)))
    b.start()
    check_lookups(b.bootstrap, msgs, base)
    b.restart()                                # and once more after a clean shutdown
    check_lookups(b.bootstrap, msgs, base)


def check_lookups(bootstrap: str, msgs: list[Msg], base: int) -> None:
    from confluent_kafka import TopicPartition

    n = len(msgs)
    c = confluent_consumer(bootstrap)
    try:
        assert c.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10) == (0, n)
        probes = [0, 1, 6, 7, 100, 250, 251, 333, 480, 599]
        for delta in (0, -1):   # one partition per call: librdkafka keeps one lookup per partition
            found = [c.offsets_for_times([TopicPartition(TOPIC, 0, msgs[i].timestamp + delta)], timeout=10)[0]
                     for i in probes]
            assert [r.offset for r in found] == probes, delta
    finally:
        c.close()
    for start in (0, 123, 599):
        got = CONSUMERS["confluent"](bootstrap, TOPIC, start={0: start})
        assert [r.offset for r in got] == list(range(start, n))
        assert [r.value for r in got] == [m.value for m in msgs[start:]]
