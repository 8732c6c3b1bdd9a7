"""The exactly-once sink's marker (odradek.spark.exactly_once): the offset metadata naming a decided
batch's transactions, compressed when large and refused when it cannot fit Kafka's 4096-byte
offset.metadata.max.bytes; the latest marker among a group's offsets; transactional ids per task."""

import pytest

from odradek.spark.exactly_once import (
    MAX_MARKER_METADATA_BYTES, TaskTxn, decode_marker, encode_marker, latest_marker, prefix_for,
    task_transactional_id,
)


def txns(prefix: str, n: int) -> list[TaskTxn]:
    return [TaskTxn(p, task_transactional_id(prefix, p), 1000 + 3 * p, p % 5) for p in range(n)]


@pytest.mark.parametrize("n", [0, 1, 40, 600])
def test_round_trip(n):
    t = txns("q", n)
    metadata = encode_marker(t)
    assert len(metadata) <= MAX_MARKER_METADATA_BYTES
    assert metadata.startswith("z:") == (n == 600)
    assert decode_marker("q", metadata) == t


def test_too_many_tasks_are_refused():
    many = [TaskTxn(p, f"q-{p}", 10**12 + p * 7919, p % 32000) for p in range(5000)]
    with pytest.raises(ValueError, match="coalesce"):
        encode_marker(many)


def test_latest_marker_wins_across_keys():
    old, new = txns("q", 2), txns("q", 3)
    committed = {("a", 0): (4, encode_marker(old)), ("b", 0): (7, encode_marker(new)), ("a", 1): (5, "[]")}
    m = latest_marker("q", committed)
    assert m.batch_id == 7 and m.txns == new
    assert latest_marker("q", {}) is None


def test_prefixes():
    assert prefix_for("mine", "query") == "mine"
    assert prefix_for(None, "query") == "odradek-spark-query"
    assert prefix_for(None, None) != prefix_for(None, None)
    assert task_transactional_id("mine", 3) == "mine-3"


def test_write_options():
    from odradek.spark.options import EXACTLY_ONCE_TRANSACTION_TIMEOUT_MS, OptionError, parse_write_options
    plain = parse_write_options({"kafka.bootstrap.servers": "b:9092", "topic": "t"})
    assert not plain.exactly_once and "transaction.timeout.ms" not in plain.client
    on = parse_write_options({"kafka.bootstrap.servers": "b:9092", "exactlyOnce": "true"})
    assert on.exactly_once and on.transactional_id is None
    assert on.client["transaction.timeout.ms"] == EXACTLY_ONCE_TRANSACTION_TIMEOUT_MS
    named = parse_write_options({"kafka.bootstrap.servers": "b:9092", "kafka.transactional.id": "etl",
                                 "kafka.transaction.timeout.ms": "60000"})
    assert named.exactly_once and named.transactional_id == "etl"
    assert "transactional.id" not in named.client          # each task gets <prefix>-<partition>
    assert named.client["transaction.timeout.ms"] == "60000"
    with pytest.raises(OptionError):
        parse_write_options({"kafka.bootstrap.servers": "b:9092", "kafka.transactional.id": "etl",
                             "exactlyOnce": "false"})
