"""`odradek produce` and `odradek consume` as subprocesses against a real broker: what the producer
writes is read back by confluent-kafka, what confluent-kafka writes is printed by the consumer; keys,
headers, null markers, files, rates, codecs, offsets, timestamps, JSON, consumer groups; error paths."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from .cli_support import new_name, odradek, unreachable
from .clients import Msg, confluent_config, confluent_consumer, consume_confluent, produce_confluent, wait_until
from .conftest import odradek_command

BROKER_OVERRIDES = {"num.partitions": "1", "group.initial.rebalance.delay.ms": "0"}
# The completed-request log of Fetch shows when the command's consumer has its position.
BROKER_LOGGERS = {"odradek.requests.completed.Fetch": "DEBUG"}


def make_topic(admin, prefix: str, partitions: int = 1) -> str:
    t = new_name(prefix)
    admin.create_topics([NewTopic(t, partitions, 1)])[t].result(timeout=20)
    return t


# ------------------------------------------------------------------------------------------ produce
def test_produce_lines_from_stdin(broker, admin):
    t = make_topic(admin, "cli-prod")
    odradek("produce", "--topic", t, input="one\ntwo\r\n\nthree", bootstrap=broker.bootstrap).ok()
    recs = consume_confluent(broker.bootstrap, t)
    assert [(r.key, r.value) for r in recs] == [(None, b"one"), (None, b"two"), (None, b""), (None, b"three")]


def test_produce_keys_headers_and_null_marker(broker, admin):
    t = make_topic(admin, "cli-keys")
    lines = "trace:1,a:x:y\tuser-1=hello\nempty:\tuser-2=\n\t=value only\nh:NIL\tNIL=NIL\n"
    odradek("produce", "--topic", t, "--property", "parse.key=true", "--property", "key.separator==",
            "--property", "parse.headers=true", "--property", "null.marker=NIL", input=lines,
            bootstrap=broker.bootstrap).ok()
    got = [r.content() for r in consume_confluent(broker.bootstrap, t)]
    assert got == [(b"user-1", b"hello", (("trace", b"1"), ("a", b"x:y"))),
                   (b"user-2", b"", (("empty", b""),)),
                   (b"", b"value only", ()),
                   (None, None, (("h", None),))]


def test_keyed_records_land_where_java_clients_put_them(broker, admin):
    t = make_topic(admin, "cli-murmur", partitions=4)
    keys = [f"key-{i}" for i in range(40)]
    odradek("produce", "--topic", t, "--property", "parse.key=true", input="".join(f"{k}\tv\n" for k in keys),
            bootstrap=broker.bootstrap).ok()
    ours = {r.key: r.partition for r in consume_confluent(broker.bootstrap, t, range(4))}
    acks = produce_confluent(broker.bootstrap, t, [Msg(k.encode(), b"w") for k in keys], partitioner="murmur2_random")
    assert ours == {a.msg.key: a.partition for a in acks}


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_produce_from_a_file_with_compression_and_partition(broker, admin, tmp_path, codec):
    t = make_topic(admin, "cli-file", partitions=3)
    f = tmp_path / "lines.txt"
    f.write_text("".join(f"line {i}\n" for i in range(500)))
    odradek("produce", "--topic", t, "--file", f, "--compression-codec", codec, "--partition", "2",
            bootstrap=broker.bootstrap).ok()
    recs = consume_confluent(broker.bootstrap, t, [2])
    assert [r.value for r in recs] == [f"line {i}".encode() for i in range(500)]


def test_produce_rate_limit(broker, admin):
    t = make_topic(admin, "cli-rate")
    started = time.monotonic()
    out = odradek("produce", "--topic", t, "--rate", "20", "--json", input="x\n" * 30,
                  bootstrap=broker.bootstrap).ok().json()
    assert out["records"] == 30 and out["seconds"] >= 29 / 20 * 0.95
    assert time.monotonic() - started >= 1.4


def test_produce_errors(broker, admin, tmp_path):
    t = make_topic(admin, "cli-prod-err", partitions=2)
    missing = new_name("cli-nosuch")
    odradek("produce", "--topic", missing, "--producer-property", "allow.auto.create.topics=false", input="x\n",
            bootstrap=broker.bootstrap).fails("UNKNOWN_TOPIC_OR_PARTITION", missing)
    odradek("produce", "--topic", t, "--partition", "5", input="x\n", bootstrap=broker.bootstrap).fails(
        "has 2 partitions")
    odradek("produce", "--topic", t, "--property", "parse.key=true", input="ok\tyes\nno separator\n",
            bootstrap=broker.bootstrap).fails("no key separator", "line 2")
    odradek("produce", "--topic", t, "--file", tmp_path / "absent.txt", bootstrap=broker.bootstrap).fails(
        "cannot read")
    addr = unreachable()
    odradek("produce", "--topic", t, "--timeout", "1", input="x\n", bootstrap=addr).fails(
        f"cannot reach the cluster at {addr}")


# ------------------------------------------------------------------------------------------ consume
@pytest.fixture(scope="module")
def filled(broker, admin):
    """A 2-partition topic written by confluent-kafka: 10 records per partition, timestamps 1000 ms apart."""
    t = make_topic(admin, "cli-cons", partitions=2)
    msgs = [Msg(f"k{i}".encode(), f"v{i}".encode(), (("n", str(i).encode()),), 1_700_000_000_000 + i * 1000, i % 2)
            for i in range(20)]
    produce_confluent(broker.bootstrap, t, msgs)
    return t, msgs


def test_consume_from_beginning_raw(broker, filled):
    t, msgs = filled
    r = odradek("consume", "--topic", t, "--from-beginning", "--max-messages", "20", bootstrap=broker.bootstrap).ok()
    assert sorted(r.stdout.splitlines()) == sorted(m.value.decode() for m in msgs)
    assert "Processed a total of 20 messages" in r.stderr


def test_consume_with_print_properties(broker, filled):
    t, msgs = filled
    r = odradek("consume", "--topic", t, "--partition", "1", "--offset", "earliest", "--max-messages", "2",
                "--property", "print.key=true", "--property", "print.offset=true", "--property", "print.partition=true",
                "--property", "print.headers=true", "--property", "print.timestamp=true",
                "--property", "key.separator= | ", bootstrap=broker.bootstrap).ok()
    assert r.stdout.splitlines() == [
        "CreateTime:1700000001000 | Partition:1 | Offset:0 | n:1 | k1 | v1",
        "CreateTime:1700000003000 | Partition:1 | Offset:1 | n:3 | k3 | v3"]


def test_consume_json_from_an_offset(broker, filled):
    t, _ = filled
    r = odradek("consume", "--topic", t, "--partition", "0", "--offset", "8", "--max-messages", "2", "--json",
                bootstrap=broker.bootstrap).ok()
    got = [json.loads(line) for line in r.stdout.splitlines()]
    assert got == [{"topic": t, "partition": 0, "offset": o, "timestamp": 1_700_000_000_000 + 2 * o * 1000,
                    "timestamp_type": "CreateTime", "key": f"k{2 * o}", "value": f"v{2 * o}",
                    "headers": [["n", str(2 * o)]]} for o in (8, 9)]


@pytest.mark.parametrize("when", ["1700000013500", "2023-11-14T22:13:33.500+00:00"])
def test_consume_from_a_timestamp(broker, filled, when):
    t, _ = filled
    r = odradek("consume", "--topic", t, "--timestamp", when, "--timeout-ms", "1500", "--json",
                bootstrap=broker.bootstrap).ok()
    got = sorted(json.loads(line)["value"] for line in r.stdout.splitlines())
    assert got == sorted(f"v{i}" for i in range(14, 20))


def test_consume_latest_by_default_and_idle_timeout(broker, filled):
    t, _ = filled
    started = time.monotonic()
    r = odradek("consume", "--topic", t, "--timeout-ms", "1000", bootstrap=broker.bootstrap).ok()
    assert r.stdout == "" and "Processed a total of 0 messages" in r.stderr
    assert time.monotonic() - started < 30


def test_consume_follows_new_records(broker, admin):
    t = make_topic(admin, "cli-follow")
    mark = broker.log_size()
    client_id = new_name("cli-follower")     # a consumer killed by an earlier test may still log fetches
    proc = subprocess.Popen([*odradek_command(), "consume", "--topic", t, "--max-messages", "3",
                             "--consumer-property", f"client.id={client_id}",
                             "--bootstrap-server", broker.bootstrap], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        # Its first completed Fetch means the consumer has its position, the log end: what comes next is new.
        fetched = "Completed request Fetch v12 correlation"
        wait_until(lambda: any(fetched in line and f"from client '{client_id}'" in line
                               for line in broker.log_text(mark).splitlines()), 30, "the consumer's first fetch")
        produce_confluent(broker.bootstrap, t, [Msg(None, f"live-{i}".encode()) for i in range(3)])
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.splitlines() == ["live-0", "live-1", "live-2"]


def test_consume_stops_cleanly_on_sigterm(broker, filled):
    t, _ = filled
    proc = subprocess.Popen([*odradek_command(), "consume", "--topic", t, "--from-beginning",
                             "--bootstrap-server", broker.bootstrap], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout))
    reader.start()
    try:
        wait_until(lambda: len(lines) >= 20, 30, "all 20 records printed")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        reader.join()
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert len(lines) == 20 and "Processed a total of 20 messages" in err


def test_consume_errors(broker, filled):
    t, _ = filled
    missing = new_name("cli-nosuch")
    odradek("consume", "--topic", missing, "--timeout-ms", "500", bootstrap=broker.bootstrap).fails(
        "UNKNOWN_TOPIC_OR_PARTITION", missing)
    odradek("consume", "--topic", t, "--partition", "7", bootstrap=broker.bootstrap).fails("has 2 partitions")
    odradek("consume", "--topic", t, "--timestamp", "last tuesday", bootstrap=broker.bootstrap).fails(
        "ISO 8601", status=2)
    addr = unreachable()
    odradek("consume", "--topic", t, "--timeout", "1", bootstrap=addr).fails(f"cannot reach the cluster at {addr}")


# ------------------------------------------------------------------------------------------ groups
def committed(bootstrap: str, group: str, topic: str, partitions) -> dict:
    c = confluent_consumer(bootstrap, **{"group.id": group})
    try:
        return {tp.partition: tp.offset for tp in c.committed([TopicPartition(topic, p) for p in partitions],
                                                              timeout=20)}
    finally:
        c.close()


def test_consume_as_a_group_commits_and_resumes(broker, filled):
    t, msgs = filled
    g = new_name("cli-group")
    first = odradek("consume", "--topic", t, "--group", g, "--from-beginning", "--max-messages", "12",
                    bootstrap=broker.bootstrap).ok().stdout.splitlines()
    assert len(first) == 12
    offsets = committed(broker.bootstrap, g, t, [0, 1])
    assert sum(offsets.values()) == 12    # exactly what was printed, per partition
    rest = odradek("consume", "--topic", t, "--group", g, "--timeout-ms", "2000",
                   bootstrap=broker.bootstrap).ok().stdout.splitlines()
    assert sorted(first + rest) == sorted(m.value.decode() for m in msgs)
    assert committed(broker.bootstrap, g, t, [0, 1]) == {0: 10, 1: 10}


def test_two_group_members_read_each_record_once_between_them(broker, filled):
    t, msgs = filled
    g = new_name("cli-pair")
    argv = [*odradek_command(), "consume", "--topic", t, "--group", g, "--from-beginning", "--timeout-ms", "6000",
            "--property", "print.partition=true", "--bootstrap-server", broker.bootstrap]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    lines = [line for out, _ in outs for line in out.splitlines()]
    assert sorted(line.split("\t")[1] for line in lines) == sorted(m.value.decode() for m in msgs)
    assert committed(broker.bootstrap, g, t, [0, 1]) == {0: 10, 1: 10}
