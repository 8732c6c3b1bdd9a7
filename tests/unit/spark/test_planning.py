"""Offset planning and option rules of the Spark source, without Spark or a broker."""

import pytest

from odradek.spark import planning as P
from odradek.spark.options import (
    OffsetSpec, OptionError, Subscription, parse_duration_ms, parse_read_options, parse_write_options,
)
from odradek.spark.planning import OffsetRange as R

BS = {"kafka.bootstrap.servers": "h:9092"}


# ------------------------------------------------------------------------------------------ options
def test_exactly_one_subscription():
    with pytest.raises(OptionError, match="Exactly one"):
        parse_read_options(BS, streaming=False)
    with pytest.raises(OptionError, match="Exactly one"):
        parse_read_options({**BS, "subscribe": "a", "assign": '{"a":[0]}'}, streaming=False)


def test_options_are_case_insensitive_and_kafka_options_pass_through():
    o = parse_read_options({"KAFKA.BOOTSTRAP.SERVERS": "h:1", "subscribePattern": "ev.*",
                            "kafka.isolation.level": "read_committed", "kafka.fetch.max.wait.ms": "50",
                            "includeHeaders": "TRUE", "minPartitions": "4"}, streaming=True)
    assert o.client["bootstrap.servers"] == "h:1"
    assert o.client["isolation.level"] == "read_committed"
    assert o.client["fetch.max.wait.ms"] == "50"
    assert o.client["auto.offset.reset"] == "none"
    assert o.subscription == Subscription("subscribePattern", pattern="ev.*")
    assert o.include_headers and o.min_partitions == 4
    assert o.starting == OffsetSpec("latest")              # streaming default


def test_bootstrap_servers_required_and_refused_kafka_options():
    with pytest.raises(OptionError, match="kafka.bootstrap.servers"):
        parse_read_options({"subscribe": "a"}, streaming=False)
    for name in ("auto.offset.reset", "key.deserializer", "enable.auto.commit"):
        with pytest.raises(OptionError, match=name):
            parse_read_options({**BS, "subscribe": "a", f"kafka.{name}": "x"}, streaming=False)


def test_batch_offsets_rules():
    o = parse_read_options({**BS, "subscribe": "a"}, streaming=False)
    assert o.starting.kind == "earliest" and o.ending.kind == "latest"
    with pytest.raises(OptionError, match="latest"):
        parse_read_options({**BS, "subscribe": "a", "startingOffsets": "latest"}, streaming=False)
    with pytest.raises(OptionError, match="latest"):
        parse_read_options({**BS, "subscribe": "a", "startingOffsets": '{"a":{"0":-1}}'}, streaming=False)
    with pytest.raises(OptionError, match="earliest"):
        parse_read_options({**BS, "subscribe": "a", "endingOffsets": '{"a":{"0":-2}}'}, streaming=False)
    with pytest.raises(OptionError, match="streaming"):
        parse_read_options({**BS, "subscribe": "a", "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(OptionError, match="startingOffsets"):
        parse_read_options({**BS, "subscribe": "a", "startingOffsets": "{not json"}, streaming=False)


def test_timestamp_precedence():
    o = parse_read_options({**BS, "subscribe": "a", "startingOffsets": '{"a":{"0":5}}',
                            "startingOffsetsByTimestamp": '{"a":{"0":1000}}', "startingTimestamp": "2000",
                            "endingOffsetsByTimestamp": '{"a":{"0":3000}}'}, streaming=False)
    assert o.starting == OffsetSpec("timestamp", timestamp=2000)
    assert o.ending == OffsetSpec("timestamps", offsets=((("a", 0), 3000),))


def test_assign_and_subscribe_lists():
    o = parse_read_options({**BS, "assign": '{"b":[1,0],"a":[2]}'}, streaming=False)
    assert o.subscription.assigned == (("a", 2), ("b", 0), ("b", 1))
    o = parse_read_options({**BS, "subscribe": " a, b ,"}, streaming=False)
    assert o.subscription.topics == ("a", "b")
    with pytest.raises(OptionError):
        parse_read_options({**BS, "assign": "[1]"}, streaming=False)


def test_positive_numbers_and_durations():
    with pytest.raises(OptionError, match="minPartitions"):
        parse_read_options({**BS, "subscribe": "a", "minPartitions": "0"}, streaming=False)
    o = parse_read_options({**BS, "subscribe": "a", "maxOffsetsPerTrigger": "10", "minOffsetsPerTrigger": "5",
                            "maxTriggerDelay": "2s"}, streaming=True)
    assert (o.max_offsets_per_trigger, o.min_offsets_per_trigger, o.max_trigger_delay_ms) == (10, 5, 2000)
    assert [parse_duration_ms(t) for t in ("15m", "100ms", "7", "1h")] == [900_000, 100, 7, 3_600_000]
    with pytest.raises(OptionError):
        parse_duration_ms("soon")


def test_write_options():
    o = parse_write_options({**BS, "topic": "out", "kafka.linger.ms": "1"})
    assert o.topic == "out" and o.client["linger.ms"] == "1"
    assert parse_write_options(BS).topic is None


def test_pattern_is_a_full_match_and_skips_internal_topics():
    sub = Subscription("subscribePattern", pattern="ev.*")
    assert sub.partitions({"events": 2, "prevents": 1, "ev": 1, "__consumer_offsets": 3}) == [
        ("ev", 0), ("events", 0), ("events", 1)]
    assert Subscription("subscribe", topics=("a",)).partitions({"a": 2, "b": 1}) == [("a", 0), ("a", 1)]


# ------------------------------------------------------------------------------------------ resolving
E = {("a", 0): 3, ("a", 1): 0}
L = {("a", 0): 10, ("a", 1): 7}
TPS = [("a", 0), ("a", 1)]


def test_resolve_earliest_latest_and_specific():
    assert P.resolve(OffsetSpec("earliest"), TPS, E, L, starting=True) == E
    assert P.resolve(OffsetSpec("latest"), TPS, E, L, starting=False) == L
    spec = OffsetSpec("offsets", offsets=((("a", 0), -2), (("a", 1), 5)))
    assert P.resolve(spec, TPS, E, L, starting=True) == {("a", 0): 3, ("a", 1): 5}
    spec = OffsetSpec("offsets", offsets=((("a", 0), -1), (("a", 1), 5)))
    assert P.resolve(spec, TPS, E, L, starting=False) == {("a", 0): 10, ("a", 1): 5}


def test_specific_offsets_must_name_every_partition():
    spec = OffsetSpec("offsets", offsets=((("a", 0), 4),))
    with pytest.raises(P.PlanningError, match="every subscribed"):
        P.resolve(spec, TPS, E, L, starting=True)


def test_resolve_timestamps():
    spec = OffsetSpec("timestamp", timestamp=1000)
    assert P.timestamps_to_look_up(spec, TPS) == {("a", 0): 1000, ("a", 1): 1000}
    found = {("a", 0): 6, ("a", 1): None}
    with pytest.raises(P.PlanningError, match="startingOffsetsByTimestampStrategy"):
        P.resolve(spec, TPS, E, L, found, starting=True)
    assert P.resolve(spec, TPS, E, L, found, starting=True, strategy="latest") == {("a", 0): 6, ("a", 1): 7}
    assert P.resolve(spec, TPS, E, L, found, starting=False) == {("a", 0): 6, ("a", 1): 7}
    by_tp = OffsetSpec("timestamps", offsets=((("a", 0), 5), (("a", 1), 9)))
    assert P.timestamps_to_look_up(by_tp, TPS) == {("a", 0): 5, ("a", 1): 9}


# ------------------------------------------------------------------------------------------ ranges
def test_batch_ranges():
    assert P.batch_ranges({("a", 0): 3}, {("a", 0): 10}) == [R("a", 0, 3, 10)]
    with pytest.raises(P.PlanningError, match="after the ending offset"):
        P.batch_ranges({("a", 0): 11}, {("a", 0): 10})
    with pytest.raises(P.PlanningError, match="different topic partitions"):
        P.batch_ranges({("a", 0): 0}, {("a", 1): 10})


def test_split_keeps_one_range_per_partition_by_default_and_drops_empty():
    ranges = [R("a", 0, 0, 100), R("a", 1, 5, 5)]
    assert P.split_ranges(ranges) == [R("a", 0, 0, 100)]


def test_min_partitions_splits_in_proportion():
    ranges = [R("a", 0, 0, 1000), R("a", 1, 0, 10)]
    out = P.split_ranges(ranges, min_partitions=4)
    assert [r for r in out if r.partition == 1] == [R("a", 1, 0, 10)]
    big = [r for r in out if r.partition == 0]
    assert len(big) == 4 and big[0].from_offset == 0 and big[-1].until_offset == 1000
    assert all(x.until_offset == y.from_offset for x, y in zip(big, big[1:]))


def test_min_partitions_ignored_when_enough_ranges():
    ranges = [R("a", p, 0, 10) for p in range(3)]
    assert P.split_ranges(ranges, min_partitions=2) == ranges


def test_max_records_per_partition_then_min_partitions():
    out = P.split_ranges([R("a", 0, 0, 10)], max_records_per_partition=3)
    assert [r.size for r in out] == [3, 3, 4] or [r.size for r in out] == [2, 3, 2, 3]
    assert sum(r.size for r in out) == 10 and max(r.size for r in out) <= 3
    out = P.split_ranges([R("a", 0, 0, 100)], min_partitions=8, max_records_per_partition=50)
    assert len(out) == 8 and sum(r.size for r in out) == 100


def test_split_covers_every_offset_once():
    for size in (1, 7, 100, 1001):
        for mp in (1, 2, 3, 10):
            out = P.split_ranges([R("t", 0, 17, 17 + size)], min_partitions=mp, max_records_per_partition=13)
            offsets = [o for r in out for o in range(r.from_offset, r.until_offset)]
            assert offsets == list(range(17, 17 + size))


def test_offsets_json_round_trip_sorted():
    d = {("b", 10): 1, ("b", 2): 3, ("a", 0): 7}
    j = P.offsets_to_json(d)
    assert list(j) == ["a", "b"] and list(j["b"]) == ["2", "10"]
    assert P.offsets_from_json(j) == d


# ------------------------------------------------------------------------------------------ streaming
def test_rate_limit_prorates_by_backlog_and_never_starves():
    start = {("a", 0): 0, ("a", 1): 0}
    latest = {("a", 0): 1000, ("a", 1): 10}
    out = P.rate_limit(100, start, latest, {})
    assert out == {("a", 0): 99, ("a", 1): 1}
    assert P.rate_limit(10_000, start, latest, {}) == latest


def test_rate_limit_new_partitions_start_at_their_earliest():
    out = P.rate_limit(10, {("a", 0): 0}, {("a", 0): 10, ("a", 1): 110}, {("a", 1): 100})
    assert out == {("a", 0): 5, ("a", 1): 105}


def test_trigger_gate():
    g = P.TriggerGate(min_rows=10, max_delay_ms=1000)
    start = {("a", 0): 0}
    assert not g.hold(start, {("a", 0): 1}, now_ms=5000)      # first trigger: the delay has passed
    assert g.hold(start, {("a", 0): 5}, now_ms=5100)          # too few, too soon
    assert not g.hold(start, {("a", 0): 10}, now_ms=5200)     # enough
    assert g.hold(start, {("a", 0): 5}, now_ms=5300)
    assert not g.hold(start, {("a", 0): 5}, now_ms=6300)      # waited maxTriggerDelay


def test_stream_ranges_and_data_loss():
    ranges, problems = P.stream_ranges({("a", 0): 5}, {("a", 0): 9, ("a", 1): 4}, {("a", 1): 0})
    assert ranges == [R("a", 0, 5, 9), R("a", 1, 0, 4)] and problems == []
    _, problems = P.stream_ranges({("a", 0): 5, ("b", 0): 1}, {("a", 0): 3}, {})
    assert any("are gone" in p for p in problems)
    assert any("changed from 5 to 3" in p for p in problems)
    _, problems = P.stream_ranges({}, {("a", 1): 9}, {("a", 1): 4})
    assert problems == ["Added partition a-1 starts from 4 instead of 0. Some data may have been missed"]
    ranges, problems = P.stream_ranges({}, {("a", 1): 9}, {})
    assert ranges == [] and "Cannot find earliest" in problems[0]
    assert "failOnDataLoss" in P.data_loss_message("x", True)
