"""Resolved subscription regexes as records (Kafka 4.0's ConsumerGroupRegularExpression, record type 16):
written when a member's regex is first resolved or resolves to other topics, tombstoned when no member
uses it, in Kafka's bytes, and replayed on load so a restarted coordinator has the same resolution and
writes nothing new for an unchanged topic list."""

import struct
import uuid

from odradek.coordinator.consumer_group import TopicsView
from odradek.coordinator.consumer_records import RegexRecord, ResolvedRegex, TopicMeta, decode, encode
from odradek.protocol.error_codes import ErrorCode
from tests.unit.coordinator.harness import Harness
from tests.unit.coordinator.test_consumer_group import G, Member, group

T, U, V = (uuid.UUID(int=i) for i in (1, 2, 3))
ONE = TopicsView({"rx-a": TopicMeta(T, 2), "other": TopicMeta(U, 1)})
TWO = TopicsView({"rx-a": TopicMeta(T, 2), "other": TopicMeta(U, 1), "rx-b": TopicMeta(V, 3)})


def regex_records(h):
    return [r for r in h.records() if isinstance(r, RegexRecord)]


def test_written_on_first_resolution_and_when_the_topics_change():
    h = Harness()
    a = Member(h, "a", topics=(), regex="rx-.*")
    assert a.join(ONE).error_code == ErrorCode.NONE
    (first,) = regex_records(h)
    assert first.regex == "rx-.*" and first.value.topics == ("rx-a",) and first.value.version == ONE.version
    assert first.value.timestamp_ms == h.now
    a.beat(ONE)
    a.beat(TopicsView(dict(ONE.by_name)))           # a new view of the same topics: nothing new
    assert len(regex_records(h)) == 1
    a.beat(TWO)
    assert [r.value.topics for r in regex_records(h)] == [("rx-a",), ("rx-a", "rx-b")]
    assert regex_records(h)[-1].value.version == TWO.version != ONE.version
    assert group(h).regexes["rx-.*"].topics == ("rx-a", "rx-b")


def test_tombstoned_when_no_member_uses_it_and_replayed_on_load():
    h = Harness()
    a = Member(h, "a", topics=(), regex="rx-.*")
    b = Member(h, "b", topics=(), regex="rx-.*")
    a.join(ONE)
    b.join(ONE)
    rebuilt = h.rebuilt()
    assert rebuilt.consumer_groups[G].regexes == group(h).regexes
    assert rebuilt.consumer_groups[G].durable_view() == group(h).durable_view()
    a.leave()
    assert "rx-.*" in group(h).regexes                # b still uses it
    b.leave()
    assert regex_records(h)[-1] == RegexRecord(G, "rx-.*", None)
    assert group(h).regexes == {}
    assert h.rebuilt().consumer_groups[G].regexes == {}


def test_a_restarted_coordinator_keeps_the_resolution():
    h = Harness()
    a = Member(h, "a", topics=(), regex="rx-.*")
    a.join(ONE)
    written = len(h.records())
    h.shard = h.rebuilt()                             # the partition loaded again, as after a failover
    assert a.beat(TopicsView(dict(ONE.by_name))).error_code == ErrorCode.NONE
    assert len(regex_records(h)) == 1 and all(not isinstance(r, RegexRecord) for r in h.records()[written:])


def test_the_record_bytes_are_kafkas():
    record = RegexRecord("g", "rx-.*", ResolvedRegex(("a", "b"), 42, 1700))
    key, value = encode(record)
    assert key == struct.pack(">hh", 16, 1) + b"g" + struct.pack(">h", 5) + b"rx-.*"
    # v0, flexible: compact array of compact strings, int64 version, int64 timestamp, no tagged fields.
    assert value == struct.pack(">h", 0) + bytes([3, 2]) + b"a" + bytes([2]) + b"b" \
        + struct.pack(">qq", 42, 1700) + bytes([0])
    assert decode(16, key, value) == record and decode(16, key, None) == RegexRecord("g", "rx-.*", None)
