"""A consumer group of the next-generation protocol (seed 002, KIP-848, "Consumer Group" and
"Member"): its group epoch, its members with their subscriptions, member epochs and current
assignments, the target assignment and its epoch, and the metadata of the topics it subscribes to.

Epochs, as the seed defines them:

- the *group epoch* goes up whenever what the assignment depends on changes: a member joins or
  leaves or changes its subscription, a subscribed topic appears, disappears or grows, a subscribed
  regex resolves to other topics (`consumer_regex`), or, while some member has a rack id, the racks
  of a subscribed topic's partitions change (`TopicMeta.racks`, as Kafka 3.7+ compares the subscribed
  topics' metadata with its partition racks; rack-aware assignment depends on them);
- the *target assignment epoch* is the group epoch the target assignment was computed for; a
  heartbeat that finds the group epoch ahead computes a new target (`consumer_heartbeat`);
- a *member epoch* is the target epoch the member has reconciled to. A member moves to a newer
  epoch only after revoking what it must give up, and gets a partition only once no other member
  still owns it (`owners`), so no partition ever has two owners.

States: Empty (no members), Assigning (group epoch ahead of the target), Reconciling (some member
not at the target epoch or not Stable), Stable; member states Stable, UnrevokedPartitions,
UnreleasedPartitions as Kafka numbers them in its records.

State changes only by `replay` of the records in `consumer_records`, the same path that loads a
partition after a restart. Replay also keeps the timers that belong to the durable state: a member's
session timer is started when the member appears (on load: from the load time, as the classic
coordinator does) and a revocation timer runs while a member is in UnrevokedPartitions.

Offsets of a consumer group are kept where every group's offsets are kept, in the shard's offsets
holder for the group id (`GroupShard.groups`, an offsets-only classic entry), as Kafka keeps offsets
apart from group metadata.
"""

from __future__ import annotations

import enum
import hashlib
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from odradek.coordinator import topic_regex
from odradek.coordinator.consumer_records import (
    ConsumerRecord, CurrentAssignment, CurrentAssignmentRecord, GroupEpochRecord, MemberRecord, MemberSubscription,
    Partitions, RegexRecord, ResolvedRegex, SubscriptionMetadataRecord, TargetEpochRecord, TargetMemberRecord,
    TopicMeta,
)

if TYPE_CHECKING:
    from odradek.coordinator.shard import GroupShard

LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2
CONSUMER_GROUP_TYPE = "consumer"
SESSION_TIMER = "consumer-session"
REVOCATION_TIMER = "consumer-revocation"
TIMER_KINDS = frozenset({SESSION_TIMER, REVOCATION_TIMER})


class MemberState(enum.IntEnum):
    STABLE = 0
    UNREVOKED_PARTITIONS = 1
    UNRELEASED_PARTITIONS = 2
    UNKNOWN = 127


class ConsumerGroupState(str, enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


EMPTY_SUBSCRIPTION = MemberSubscription(None, None, "", "", (), None, -1, None)
NEW_ASSIGNMENT = CurrentAssignment(0, -1, MemberState.STABLE, {}, {})


def session_timer(group_id: str, member_id: str) -> tuple:
    return (SESSION_TIMER, group_id, member_id)


def revocation_timer(group_id: str, member_id: str) -> tuple:
    return (REVOCATION_TIMER, group_id, member_id)


# ------------------------------------------------------------------------------------------ topics
@dataclass(frozen=True)
class TopicsView:
    """The topics the coordinator may assign (the broker's metadata image, reduced): name -> id and
    partition count; internal topics are never matched by a regex; `racks`: the racks of each
    partition's replicas, by topic name (empty when no broker has a rack). Immutable; the broker builds a
    new one when its image changes, so `regex_matches` can be cached here."""
    by_name: Mapping[str, TopicMeta]
    internal: frozenset[str] = frozenset()
    racks: Mapping[str, tuple[frozenset[str], ...]] = field(default_factory=dict)   # replica racks per partition
    _regex_cache: dict = field(default_factory=dict, compare=False, repr=False)
    _rack_cache: dict = field(default_factory=dict, compare=False, repr=False)

    def meta(self, name: str, with_racks: bool) -> TopicMeta:
        """The topic's metadata, with its partitions' sorted replica racks when `with_racks`."""
        meta = self.by_name[name]
        if not with_racks or name not in self.racks:
            return meta
        found = self._rack_cache.get(name)
        if found is None:
            racks = tuple(tuple(sorted(r)) for r in self.racks[name])
            found = self._rack_cache[name] = TopicMeta(meta.topic_id, meta.num_partitions, racks)
        return found

    def name_of(self, topic_id: uuid.UUID) -> str | None:
        names = self._regex_cache.get(None)
        if names is None:
            names = self._regex_cache[None] = {m.topic_id: n for n, m in self.by_name.items()}
        return names.get(topic_id)

    @property
    def version(self) -> int:
        """A stable 63-bit fingerprint of the topic names a regex can match: equal views (before and
        after a restart) have equal versions, which resolved-regex records carry."""
        v = self._regex_cache.get(())
        if v is None:
            names = "\n".join(sorted(n for n in self.by_name if n not in self.internal)).encode()
            v = self._regex_cache[()] = int.from_bytes(hashlib.blake2b(names, digest_size=8).digest(), "big") >> 1
        return v

    def regex_matches(self, regex: str) -> frozenset[str]:
        """Topics whose whole name matches `regex` (RE2/J's `Matcher.matches()`, `topic_regex`); none for
        a regex RE2 refuses (one stored before it was checked so). Cached; the broker fills the cache
        ahead, in slices between which the event loop runs (`consumer_regex.resolve_steps`), so this
        matches only what changed since (a group's regexes, after a new image)."""
        found = self._regex_cache.get(regex)
        if found is None:
            try:
                pattern = topic_regex.compile_regex(regex)
            except topic_regex.RegexError:
                found = frozenset()
            else:
                found = frozenset(topic_regex.matching(pattern, self.matchable()))
            self._regex_cache[regex] = found
        return found

    def matchable(self) -> list[str]:
        """The names a regex may match: every topic but the internal ones (kept; do not change it)."""
        names = self._regex_cache.get(("matchable",))
        if names is None:
            names = self._regex_cache[("matchable",)] = [n for n in self.by_name if n not in self.internal]
        return names

    def resolved(self, regex: str) -> bool:
        return regex in self._regex_cache

    def keep_matches(self, regex: str, found: frozenset[str]) -> None:
        self._regex_cache[regex] = found


# ------------------------------------------------------------------------------------------ members
@dataclass(frozen=True, slots=True)
class ConsumerMember:
    member_id: str
    subscription: MemberSubscription = EMPTY_SUBSCRIPTION
    current: CurrentAssignment = NEW_ASSIGNMENT

    @property
    def instance_id(self) -> str | None:
        return self.subscription.instance_id

    @property
    def member_epoch(self) -> int:
        return self.current.member_epoch

    @property
    def uses_classic_protocol(self) -> bool:
        """A member that joined with JoinGroup (online migration, see `consumer_classic`)."""
        return self.subscription.classic is not None

    @property
    def previous_member_epoch(self) -> int:
        return self.current.previous_member_epoch

    @property
    def state(self) -> MemberState:
        try:
            return MemberState(self.current.state)
        except ValueError:
            return MemberState.UNKNOWN

    @property
    def assigned(self) -> Partitions:
        return self.current.assigned

    @property
    def pending_revocation(self) -> Partitions:
        return self.current.pending_revocation

    def with_subscription(self, s: MemberSubscription) -> ConsumerMember:
        return replace(self, subscription=s)

    def with_current(self, c: CurrentAssignment) -> ConsumerMember:
        return replace(self, current=c)

    def subscribed_names(self, topics: TopicsView, regexes: Mapping[str, ResolvedRegex] | None = None
                         ) -> frozenset[str]:
        """Its topic names and those its regex resolved to in `regexes` (the group's resolutions; a
        regex not resolved there is matched against `topics`)."""
        names = frozenset(self.subscription.subscribed_topic_names)
        regex = self.subscription.subscribed_topic_regex
        if not regex:
            return names
        resolved = regexes.get(regex) if regexes is not None else None
        return names | (frozenset(resolved.topics) if resolved is not None else topics.regex_matches(regex))


def subscription_metadata(members: Iterable[ConsumerMember], topics: TopicsView,
                          regexes: Mapping[str, ResolvedRegex] | None = None) -> dict[str, TopicMeta]:
    """The metadata of every existing topic some member subscribes to, with the partitions' racks
    when some member has a rack id."""
    names: set[str] = set()
    with_racks = False
    for m in members:
        names |= m.subscribed_names(topics, regexes)
        with_racks = with_racks or bool(m.subscription.rack_id)
    return {n: topics.meta(n, with_racks) for n in sorted(names) if n in topics.by_name}


# ------------------------------------------------------------------------------------------ group
@dataclass
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    target: dict[str, Partitions] = field(default_factory=dict)
    target_metadata: dict[str, tuple[int, bytes]] = field(default_factory=dict)   # from a client-side assignor
    target_assignor: str | None = None   # the client-side assignor that computed the target (None: server-side)
    subscription_metadata: dict[str, TopicMeta] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)        # instance id -> member id
    regexes: dict[str, ResolvedRegex] = field(default_factory=dict)     # resolved subscription regexes
    owners: dict[tuple[uuid.UUID, int], str] = field(default_factory=dict)
    metadata_view: TopicsView | None = None   # soft state: the view the metadata was last checked against

    def state(self) -> ConsumerGroupState:
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        for m in self.members.values():
            if m.member_epoch != self.assignment_epoch or m.state != MemberState.STABLE:
                return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def static_member(self, instance_id: str | None) -> ConsumerMember | None:
        member_id = self.static_members.get(instance_id) if instance_id is not None else None
        return self.members.get(member_id) if member_id is not None else None

    def owner(self, topic_id: uuid.UUID, partition: int) -> str | None:
        return self.owners.get((topic_id, partition))

    def subscribed_topic_names(self, topics: TopicsView | None = None) -> set[str]:
        """Every topic name some member subscribes to (regexes resolved when `topics` is given)."""
        out: set[str] = set()
        for m in self.members.values():
            out.update(m.subscribed_names(topics, self.regexes) if topics is not None
                       else m.subscription.subscribed_topic_names)
        if topics is None:
            out.update(self.subscription_metadata)
        return out

    # -------------------------------------------------------------------------- changes (replay only)
    def put_member(self, member: ConsumerMember) -> None:
        old = self.members.get(member.member_id)
        if old is not None:
            self._release(old)
            if old.instance_id is not None and self.static_members.get(old.instance_id) == old.member_id:
                del self.static_members[old.instance_id]
        self.members[member.member_id] = member
        if member.instance_id is not None:
            self.static_members[member.instance_id] = member.member_id
        for parts in (member.assigned, member.pending_revocation):
            for t, ps in parts.items():
                for p in ps:
                    self.owners[(t, p)] = member.member_id

    def drop_member(self, member_id: str) -> ConsumerMember | None:
        old = self.members.pop(member_id, None)
        if old is not None:
            self._release(old)
            if old.instance_id is not None and self.static_members.get(old.instance_id) == member_id:
                del self.static_members[old.instance_id]
        return old

    def _release(self, member: ConsumerMember) -> None:
        for parts in (member.assigned, member.pending_revocation):
            for t, ps in parts.items():
                for p in ps:
                    if self.owners.get((t, p)) == member.member_id:
                        del self.owners[(t, p)]

    def durable_view(self) -> tuple:
        """What the records say about this group, for replay-equivalence tests."""
        return (self.group_epoch, self.assignment_epoch, self.target_assignor,
                tuple(sorted((m.member_id, m.subscription, _frozen(m.current)) for m in self.members.values())),
                tuple(sorted((k, _frozen_parts(v)) for k, v in self.target.items())),
                tuple(sorted(self.target_metadata.items())),
                tuple(sorted(self.regexes.items())),
                tuple(sorted(self.subscription_metadata.items())))


def _frozen_parts(parts: Partitions) -> tuple:
    return tuple(sorted((str(t), tuple(sorted(ps))) for t, ps in parts.items()))


def _frozen(c: CurrentAssignment) -> tuple:
    return (c.member_epoch, c.previous_member_epoch, c.state, _frozen_parts(c.assigned),
            _frozen_parts(c.pending_revocation))


# ------------------------------------------------------------------------------------------ replay
def replay(shard: GroupShard, record: ConsumerRecord, now_ms: int) -> None:
    """Apply one consumer group record to the shard. Later records win and tombstones delete."""
    groups = shard.consumer_groups
    gid = record.group_id
    group = groups.get(gid)
    if isinstance(record, GroupEpochRecord):
        if record.epoch is None:
            if group is not None:
                for member_id in list(group.members):
                    _cancel_member_timers(shard, gid, member_id)
                del groups[gid]
            shard.client_elections.pop(gid, None)
            return
        group = groups.setdefault(gid, ConsumerGroup(gid))
        group.group_epoch = record.epoch
        return
    if group is None:
        if _is_tombstone(record):
            return
        group = groups[gid] = ConsumerGroup(gid)
    if isinstance(record, SubscriptionMetadataRecord):
        group.subscription_metadata = dict(record.topics or {})
    elif isinstance(record, RegexRecord):
        if record.value is None:
            group.regexes.pop(record.regex, None)
        else:
            group.regexes[record.regex] = record.value
    elif isinstance(record, TargetEpochRecord):
        group.assignment_epoch = record.assignment_epoch or 0
        group.target_assignor = record.assignor
    elif isinstance(record, TargetMemberRecord):
        if record.partitions is None:
            group.target.pop(record.member_id, None)
        else:
            group.target[record.member_id] = dict(record.partitions)
        if record.partitions is None or record.metadata is None:
            group.target_metadata.pop(record.member_id, None)
        else:
            group.target_metadata[record.member_id] = record.metadata
    elif isinstance(record, MemberRecord):
        if record.value is None:
            group.drop_member(record.member_id)
            _cancel_member_timers(shard, gid, record.member_id)
        else:
            new = record.member_id not in group.members
            subscribed = _member(shard, group, record.member_id, now_ms).with_subscription(record.value)
            group.put_member(subscribed)
            if new and subscribed.uses_classic_protocol:
                shard.schedule(session_timer(gid, subscribed.member_id), now_ms + session_timeout_ms(shard, subscribed))
    elif isinstance(record, CurrentAssignmentRecord):
        member = group.members.get(record.member_id)
        if record.value is None:
            if member is not None:
                group.put_member(member.with_current(CurrentAssignment(
                    LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_MEMBER_EPOCH, MemberState.STABLE, {}, {})))
            shard.cancel(revocation_timer(gid, record.member_id))
            return
        member = _member(shard, group, record.member_id, now_ms).with_current(record.value)
        group.put_member(member)
        key = revocation_timer(gid, member.member_id)
        if member.state == MemberState.UNREVOKED_PARTITIONS:
            if key not in shard.timers:
                timeout = member.subscription.rebalance_timeout_ms
                shard.schedule(key, now_ms + (timeout if timeout > 0 else shard.config.consumer_session_timeout_ms))
        else:
            shard.cancel(key)


def session_timeout_ms(shard: GroupShard, member: ConsumerMember) -> int:
    """A classic member keeps the session timeout it joined with; the others have the group's."""
    classic = member.subscription.classic
    return classic.session_timeout_ms if classic is not None else shard.config.consumer_session_timeout_ms


def _is_tombstone(record: ConsumerRecord) -> bool:
    return getattr(record, "value", 0) is None or getattr(record, "partitions", 0) is None \
        or getattr(record, "topics", 0) is None or getattr(record, "assignment_epoch", 0) is None


def _member(shard: GroupShard, group: ConsumerGroup, member_id: str, now_ms: int) -> ConsumerMember:
    member = group.members.get(member_id)
    if member is None:
        member = ConsumerMember(member_id)
        shard.schedule(session_timer(group.group_id, member_id), now_ms + shard.config.consumer_session_timeout_ms)
    return member


def _cancel_member_timers(shard: GroupShard, group_id: str, member_id: str) -> None:
    shard.cancel(session_timer(group_id, member_id))
    shard.cancel(revocation_timer(group_id, member_id))
