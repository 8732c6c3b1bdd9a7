"""Resolved subscription regexes as records (Kafka 4.0's ConsumerGroupRegularExpression, record type 16):
written when a member's regex is first resolved and when the group's regexes are resolved again (a new
regex at once; a changed topic list at most every 10 s; every group.consumer.regex.refresh.interval.ms
anyway), tombstoned when no member uses it, in Kafka's bytes, and replayed on load so a restarted
coordinator has the same resolution and writes nothing new for an unchanged topic list. On a large
cluster the matching is done ahead, in bounded steps that give the event loop back between them."""

import asyncio
import struct
import uuid

from odradek.coordinator import consumer_regex, topic_regex
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
    a.beat(TWO)                                     # a new topic: not within 10 s of the last resolution
    assert len(regex_records(h)) == 1 and group(h).subscription_metadata.keys() == {"rx-a"}
    h.advance(consumer_regex.REGEX_BATCH_REFRESH_MIN_INTERVAL_MS)
    epoch = group(h).group_epoch
    a.beat(TWO)
    assert [r.value.topics for r in regex_records(h)] == [("rx-a",), ("rx-a", "rx-b")]
    assert group(h).group_epoch == epoch + 1 and group(h).subscription_metadata.keys() == {"rx-a", "rx-b"}
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


def test_a_new_regex_is_resolved_at_once_and_the_group_resolves_all_of_its_regexes_together():
    h = Harness()
    a = Member(h, "a", topics=(), regex="rx-.*")
    a.join(ONE)
    h.advance(1000)
    b = Member(h, "b", topics=(), regex="oth.*")
    b.join(TWO)                                     # within 10 s, but b's regex is new: resolved now
    latest = {r.regex: r.value for r in regex_records(h)}
    assert latest["oth.*"].topics == ("other",) and latest["rx-.*"].topics == ("rx-a", "rx-b")
    assert {v.timestamp_ms for v in latest.values()} == {h.now}
    assert group(h).subscription_metadata.keys() == {"rx-a", "rx-b", "other"}


def test_resolved_again_every_refresh_interval_even_without_new_topics():
    h = Harness(consumer_regex_refresh_interval_ms=60_000)
    a = Member(h, "a", topics=(), regex="rx-.*")
    a.join(ONE)
    for _ in range(5):                              # heartbeats within the interval: nothing new
        h.advance(10_000)
        a.beat(ONE)
    assert len(regex_records(h)) == 1
    h.advance(10_000)
    epoch = group(h).group_epoch
    a.beat(ONE)
    assert len(regex_records(h)) == 2 and regex_records(h)[-1].value.timestamp_ms == h.now
    assert regex_records(h)[-1].value.topics == regex_records(h)[0].value.topics   # the same topics:
    assert group(h).group_epoch == epoch                                           # no rebalance


def test_a_lower_refresh_interval_lowers_the_wait_for_new_topics():
    h = Harness(consumer_regex_refresh_interval_ms=1000)
    a = Member(h, "a", topics=(), regex="rx-.*")
    a.join(ONE)
    h.advance(500)
    a.beat(TWO)
    assert len(regex_records(h)) == 1
    h.advance(500)
    a.beat(TWO)
    assert regex_records(h)[-1].value.topics == ("rx-a", "rx-b")


def test_pending_names_what_the_next_heartbeat_would_match():
    h = Harness()
    a = Member(h, "a", topics=(), regex="rx-.*")
    view = TopicsView(dict(TWO.by_name))
    assert consumer_regex.pending(h.shard, G, "rx-.*", view, h.now) == ["rx-.*"]   # no group yet
    a.join(ONE)
    assert consumer_regex.pending(h.shard, G, None, view, h.now) == []           # not due: resolved just now
    assert consumer_regex.pending(h.shard, G, "ot.*", view, h.now) == ["ot.*", "rx-.*"]   # a new regex
    h.advance(consumer_regex.REGEX_BATCH_REFRESH_MIN_INTERVAL_MS)
    assert consumer_regex.pending(h.shard, G, None, view, h.now) == ["rx-.*"]    # the topic list changed
    view.regex_matches("rx-.*")
    assert consumer_regex.pending(h.shard, G, None, view, h.now) == []           # already matched in the view


def test_resolve_steps_yields_between_slices_and_fills_the_view():
    names = {f"t{i:05d}": TopicMeta(uuid.UUID(int=i + 1), 1) for i in range(10_000)}
    names["__internal"] = TopicMeta(uuid.UUID(int=99_999), 1)
    view = TopicsView(names, frozenset({"__internal"}))
    pattern = topic_regex.compile_regex("t0.*7")
    budget = 1000 * pattern.cost("t00000")          # about a thousand names a slice
    steps = 0
    for _ in consumer_regex.resolve_steps(view, ["t0.*7", "__.*", "(bad"], budget=budget):
        steps += 1
    assert 2 * 10 <= steps <= 2 * 11                # the compile, then about ten slices per regex
    assert view.resolved("t0.*7") and view.regex_matches("t0.*7") == {n for n in names if n.startswith("t0")
                                                                      and n.endswith("7")}
    assert view.regex_matches("__.*") == frozenset()   # internal topics never match
    assert not view.resolved("(bad")                    # left for the heartbeat to refuse


def test_a_small_view_is_resolved_in_two_steps():
    view = TopicsView(dict(TWO.by_name))
    assert len(list(consumer_regex.resolve_steps(view, ["rx-.*"]))) == 1   # compiled; matched
    assert view.resolved("rx-.*") and view.regex_matches("rx-.*") == {"rx-a", "rx-b"}


def test_the_handler_gives_the_loop_back_between_slices():
    """What the broker's handler does with the steps: one turn of the event loop each."""
    names = {f"t{i:05d}": TopicMeta(uuid.UUID(int=i + 1), 1) for i in range(5_000)}
    view = TopicsView(names)
    ticks = 0

    async def resolve():
        for _ in consumer_regex.resolve_steps(view, ["t.*9"], budget=200 * topic_regex.CALL_STEPS):
            await asyncio.sleep(0)

    async def main():
        nonlocal ticks
        task = asyncio.create_task(resolve())
        while not task.done():
            ticks += 1
            await asyncio.sleep(0)
        await task
    asyncio.run(main())
    assert ticks >= 5
    assert view.regex_matches("t.*9") == {n for n in names if n.endswith("9")}


def test_a_stored_regex_re2_refuses_matches_nothing():
    """A member's regex stored before RE2 checked it (Python's `re` accepted lookaround) resolves to no
    topics instead of failing the group's heartbeats."""
    view = TopicsView(dict(ONE.by_name))
    assert view.regex_matches("(?=rx)rx-a") == frozenset() and view.regex_matches("rx-a") == {"rx-a"}
