"""When a consumer group's subscription regexes are resolved again (seed 002, KIP-848: "the coordinator
resolves SubscribedTopicRegex"; Kafka 4.x's regex refresh in its GroupMetadataManager).

A group keeps what each regex its members use resolved to, with the topic list's version and the
time (`ResolvedRegex`, Kafka's ConsumerGroupRegularExpression record), and the assignment works from
those resolutions, not from a fresh match at every heartbeat. A heartbeat resolves the group's
regexes again (all of them, so they stay aligned, one record each) when:

- a member brings a regex the group has not resolved (at once: the member subscribed to it);
- the topic list changed since the last resolution (`TopicsView.version`: topics created, deleted)
  and the last resolution is at least `REGEX_BATCH_REFRESH_MIN_INTERVAL_MS` old (Kafka's 10 s,
  lowered to the refresh interval when that is configured lower, as tests do);
- the last resolution is `group.consumer.regex.refresh.interval.ms` old (Kafka's default 10 min).

A resolution that finds other topics changes the subscription metadata, which bumps the group epoch
(`consumer_heartbeat.advance`). A regex no member uses any more is tombstoned.

Matching every topic name against a regex is the expensive part on a large cluster. Regexes are
compiled and matched with RE2's semantics, in time linear in the name (`topic_regex`). The view caches
each regex's matches; `resolve_steps` fills that cache ahead of the heartbeat, in slices of bounded work
(`topic_regex.match_in_slices`), as a generator: the broker's handler gives the event loop back at each
step, so this module stays a pure function of its arguments, and the heartbeat then only reads the cache.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping

from odradek.coordinator import topic_regex
from odradek.coordinator.consumer_group import ConsumerGroup, ConsumerMember, TopicsView
from odradek.coordinator.consumer_records import RegexRecord, ResolvedRegex
from odradek.coordinator.shard import GroupShard

log = logging.getLogger("odradek.coordinator")

REGEX_BATCH_REFRESH_MIN_INTERVAL_MS = 10_000


def used(members: Iterable[ConsumerMember]) -> set[str]:
    return {m.subscription.subscribed_topic_regex for m in members if m.subscription.subscribed_topic_regex}


def due(group: ConsumerGroup, regexes: set[str], topics: TopicsView, now_ms: int, interval_ms: int) -> bool:
    """Whether a heartbeat at `now_ms` resolves the group's regexes `regexes` again (see the module doc)."""
    if not regexes:
        return False
    known = [group.regexes.get(r) for r in regexes]
    if any(k is None for k in known):
        return True
    last = min(k.timestamp_ms for k in known if k is not None)
    if now_ms >= last + interval_ms:
        return True
    if all(k.version == topics.version for k in known if k is not None):
        return False
    return now_ms >= last + min(REGEX_BATCH_REFRESH_MIN_INTERVAL_MS, interval_ms)


def refresh(group: ConsumerGroup, members: Iterable[ConsumerMember], topics: TopicsView, now_ms: int,
            interval_ms: int) -> tuple[list[RegexRecord], Mapping[str, ResolvedRegex]]:
    """(the records, the resolutions the heartbeat goes on with): tombstones for regexes no member
    uses, and a new resolution of every used regex when one is due."""
    regexes = used(members)
    gid = group.group_id
    records = tombstones(group, regexes)
    if not due(group, regexes, topics, now_ms, interval_ms):
        return records, group.regexes if not records else {r: group.regexes[r] for r in regexes}
    resolved: dict[str, ResolvedRegex] = {}
    for regex in sorted(regexes):
        value = ResolvedRegex(tuple(sorted(topics.regex_matches(regex))), topics.version, now_ms)
        old = group.regexes.get(regex)
        if old is None or old.topics != value.topics:
            log.info("group %s: /%s/ resolves to %s", gid, regex, list(value.topics))
        resolved[regex] = value
        records.append(RegexRecord(gid, regex, value))
    return records, resolved


def tombstones(group: ConsumerGroup, regexes: set[str]) -> list[RegexRecord]:
    """A tombstone for each regex the group resolved that is not in `regexes` (no member uses it)."""
    return [RegexRecord(group.group_id, regex, None) for regex in sorted(group.regexes.keys() - regexes)]


def pending(shard: GroupShard, group_id: str, regex: str | None, topics: TopicsView, now_ms: int) -> list[str]:
    """The regexes a heartbeat of the group bringing `regex` would match against `topics` and the view
    has not matched yet (a read-only look, for `resolve_steps` ahead of the heartbeat). A group that
    has resolved no regex costs one look: its members' regexes are resolved by the heartbeats that bring
    them."""
    group = shard.consumer_groups.get(group_id)
    wanted = {regex} if regex else set()
    if group is not None and group.regexes:
        regexes = used(group.members.values()) | wanted
        if due(group, regexes, topics, now_ms, shard.config.consumer_regex_refresh_interval_ms):
            wanted = regexes
    return sorted(r for r in wanted if not topics.resolved(r))


def resolve_steps(topics: TopicsView, regexes: Iterable[str], budget: int = topic_regex.SLICE_STEPS
                  ) -> Iterator[None]:
    """Match each regex against the view's topic names and keep the matches in the view, yielding after
    compiling each and between slices of about `budget` units of work (`topic_regex.match_in_slices`),
    so a regex of a small view takes two steps. A regex RE2 refuses is left for the heartbeat to refuse
    with INVALID_REGULAR_EXPRESSION."""
    names: list[str] | None = None
    for regex in regexes:
        if topics.resolved(regex):
            continue
        try:
            pattern = topic_regex.compile_regex(regex)
        except topic_regex.RegexError:
            continue
        yield                                   # a compile is a step of its own
        if names is None:
            names = topics.matchable()
        found: list[str] = []
        yield from topic_regex.match_in_slices(pattern, names, found, budget)
        topics.keep_matches(regex, frozenset(found))
