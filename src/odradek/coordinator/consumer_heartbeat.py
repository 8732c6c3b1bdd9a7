"""ConsumerGroupHeartbeat (key 68) and the consumer group's timers (seed 002, KIP-848: "the member
heartbeats; the coordinator bumps the group epoch, computes the target assignment with a server-side
assignor, and reconciles each member towards it").

One heartbeat, as Kafka's group coordinator does it:

1. validate the request (INVALID_REQUEST, INVALID_REGULAR_EXPRESSION, UNSUPPORTED_ASSIGNOR); epoch -1
   leaves (the member is removed, its partitions are free at once), -2 is a static member's temporary
   leave (it keeps its partitions until its session expires or its instance id rejoins);
2. find or create the member: epoch 0 joins (GROUP_MAX_SIZE_REACHED when full; a static member may
   replace one that left with -2, else UNRELEASED_INSTANCE_ID); otherwise the member must be known
   (UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID) and at its epoch, or at its previous epoch owning a subset
   of its partitions (a lost response), else FENCED_MEMBER_EPOCH;
3. update the member's subscription and, when due, resolve the group's regexes again (`consumer_regex`);
   a changed subscription, or changed metadata of the subscribed topics (topics created, deleted,
   grown, a regex resolving to other topics, partition racks while a member has a rack id), bumps the
   group epoch;
4. when the group epoch is ahead of the target assignment epoch, run the assignor the members prefer
   (the most named `server_assignor`, else the first of `group.consumer.assignors`) and write the
   target assignment's changes;
5. reconcile the member (`reconcile`): it first gives up what it must revoke (keeping its epoch),
   then moves to the target epoch with the partitions nobody else still owns.

The answer carries the member's assignment when it joined, sent a full request, or its assignment
changed. Everything durable is in the records returned; the session timer is rescheduled here.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from odradek.coordinator import (
    assignors_server, consumer_client_assign, consumer_migration, consumer_regex, topic_regex,
)
from odradek.coordinator.consumer_group import (
    LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH, REVOCATION_TIMER, SESSION_TIMER, ConsumerGroup,
    ConsumerMember, MemberState, TopicsView, session_timeout_ms, session_timer, subscription_metadata,
)
from odradek.coordinator.consumer_records import (
    CurrentAssignment, CurrentAssignmentRecord, GroupEpochRecord, MemberRecord, MemberSubscription, Partitions,
    ResolvedRegex, SubscriptionMetadataRecord, TargetEpochRecord, TargetMemberRecord, TopicMeta,
    partitions_of, remove_member_records,
)
from odradek.coordinator.group import GroupState
from odradek.coordinator.records import GroupRecord
from odradek.coordinator.shard import GroupShard, Outcome
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import consumer_group_heartbeat as cgh

if TYPE_CHECKING:
    from odradek.coordinator.membership import Caller

log = logging.getLogger("odradek.coordinator")

OwnedPartitions = list[cgh.TopicPartitions] | None
NO_TOPICS = TopicsView({})


class Refused(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def error_response(code: ErrorCode, message: str | None = None) -> cgh.ConsumerGroupHeartbeatResponse:
    return cgh.ConsumerGroupHeartbeatResponse(error_code=code, error_message=message)


# ------------------------------------------------------------------------------------------ validation
def validate(req: cgh.ConsumerGroupHeartbeatRequest, api_version: int, assignors: tuple[str, ...]) -> None:
    def invalid(message: str) -> Refused:
        return Refused(ErrorCode.INVALID_REQUEST, message)
    epoch = req.member_epoch
    if (api_version >= 1 or epoch > 0 or epoch == LEAVE_GROUP_MEMBER_EPOCH) and not req.member_id:
        raise invalid("MemberId can't be empty.")
    if not req.group_id:
        raise invalid("GroupId can't be empty.")
    if req.rack_id is not None and not req.rack_id:
        raise invalid("RackId can't be empty.")
    if epoch == 0:
        if req.rebalance_timeout_ms == -1:
            raise invalid("RebalanceTimeoutMs must be provided in first request.")
        if req.topic_partitions is None or req.topic_partitions:
            raise invalid("TopicPartitions must be empty when (re-)joining.")
        if not req.subscribed_topic_names and not req.subscribed_topic_regex:
            raise invalid("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
    elif epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        if req.instance_id is None:
            raise invalid("InstanceId can't be null.")
    elif epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        raise invalid("MemberEpoch is invalid.")
    if req.subscribed_topic_regex:
        try:
            topic_regex.compile_regex(req.subscribed_topic_regex)
        except topic_regex.RegexError as e:       # RE2 refuses it, or it is out of odradek's bounds
            raise Refused(ErrorCode.INVALID_REGULAR_EXPRESSION, str(e))
    if req.server_assignor is not None and req.server_assignor not in assignors:
        raise Refused(ErrorCode.UNSUPPORTED_ASSIGNOR, f"ServerAssignor {req.server_assignor} is not supported. "
                      f"Supported assignors: {', '.join(assignors)}.")
    why = consumer_client_assign.validate(req.client_assignors)
    if why is not None:
        raise invalid(why)


def _check_epoch(member: ConsumerMember, received: int, owned: OwnedPartitions) -> None:
    if received > member.member_epoch:
        raise Refused(ErrorCode.FENCED_MEMBER_EPOCH, f"The consumer group member has a greater member epoch "
                      f"({received}) than the one known by the group coordinator ({member.member_epoch}). "
                      "The member must abandon all its partitions and rejoin.")
    if received < member.member_epoch and (received != member.previous_member_epoch
                                           or not _is_subset(owned, member.assigned)):
        raise Refused(ErrorCode.FENCED_MEMBER_EPOCH, f"The consumer group member has a smaller member epoch "
                      f"({received}) than the one known by the group coordinator ({member.member_epoch}). "
                      "The member must abandon all its partitions and rejoin.")


def _is_subset(owned: OwnedPartitions, assigned: Partitions) -> bool:
    if owned is None:
        return False
    return all(set(tp.partitions) <= assigned.get(tp.topic_id, frozenset()) for tp in owned)


# ------------------------------------------------------------------------------------------ heartbeat
def heartbeat(shard: GroupShard, req: cgh.ConsumerGroupHeartbeatRequest, caller: Caller, topics: TopicsView,
              now_ms: int) -> Outcome:
    out = Outcome()
    try:
        validate(req, caller.api_version, shard.config.consumer_assignors)
        if req.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
            return _leave(shard, req, now_ms)
        return _heartbeat(shard, req, caller, topics, now_ms, out)
    except Refused as e:
        log.debug("group %s: heartbeat of member %s epoch %d refused: %s %s", req.group_id, req.member_id,
                  req.member_epoch, e.code.name, e.message)
        # A conversion the operation already applied stays (its records are in the shard).
        return Outcome(error_response(e.code, e.message), records=out.records[:out.replayed], replayed=out.replayed)


def _group_for(shard: GroupShard, group_id: str, joining: bool, topics: TopicsView, now_ms: int,
               out: Outcome) -> ConsumerGroup:
    group = shard.consumer_groups.get(group_id)
    if group is not None:
        return group
    if not joining:
        raise Refused(ErrorCode.GROUP_ID_NOT_FOUND, f"Consumer group {group_id} not found.")
    classic = shard.group(group_id)
    if classic is not None:
        if classic.members or classic.state != GroupState.EMPTY or classic.pending_members:
            reason = consumer_migration.refuse_upgrade(shard, classic)
            if reason is not None:
                log.info("group %s: cannot upgrade the classic group to a consumer group: %s", group_id, reason)
                raise Refused(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group.")
            return consumer_migration.upgrade(shard, classic, topics, now_ms, out)
        if classic.protocol_type is not None:
            # An empty classic group becomes a consumer group; its committed offsets stay.
            log.info("group %s: converting the empty classic group to a consumer group", group_id)
            out.records.append(GroupRecord(group_id, None))
    return ConsumerGroup(group_id)   # materialised when its records are replayed


def check_size(shard: GroupShard, group: ConsumerGroup, member_id: str) -> None:
    if len(group.members) >= shard.config.consumer_max_size and member_id not in group.members:
        raise Refused(ErrorCode.GROUP_MAX_SIZE_REACHED, "The consumer group has reached its maximum capacity of "
                      f"{shard.config.consumer_max_size} members.")


def _heartbeat(shard: GroupShard, req: cgh.ConsumerGroupHeartbeatRequest, caller: Caller, topics: TopicsView,
               now_ms: int, out: Outcome) -> Outcome:
    gid = req.group_id
    group = _group_for(shard, gid, req.member_epoch == 0, topics, now_ms, out)
    member_id = req.member_id or shard.new_uuid()
    check_size(shard, group, member_id)
    member, replaced = _resolve_member(group, req, member_id)
    subscription = _updated_subscription(member, req, caller, consumer_client_assign.enabled(shard))
    current = advance(shard, group, member, replaced, subscription, req.topic_partitions, topics, out, now_ms)
    shard.schedule(session_timer(gid, member_id), now_ms + shard.config.consumer_session_timeout_ms)
    out.response = _response(shard, req, member, member_id, current)
    if consumer_client_assign.elected(shard, gid, member_id):
        out.response.should_compute_assignment = True
    metadata = group.target_metadata.get(member_id)
    if out.response.assignment is not None and metadata is not None:
        out.response.assignment.assignor_metadata_version, out.response.assignment.assignor_metadata = metadata
    return out


def advance(shard: GroupShard, group: ConsumerGroup, member: ConsumerMember, replaced: ConsumerMember | None,
            subscription: MemberSubscription, owned: OwnedPartitions, topics: TopicsView,
            out: Outcome, now_ms: int) -> CurrentAssignment:
    """A member's subscription, the group epoch, the target assignment and the member's reconciliation,
    for a heartbeat and for a classic member's JoinGroup alike; the records go to `out`."""
    gid, member_id = group.group_id, member.member_id
    # 1. The member and its subscription.
    updated, bump = _update_member(group, member, replaced, subscription, out)
    members = {m_id: m for m_id, m in group.members.items() if replaced is None or m_id != replaced.member_id}
    members[member_id] = updated
    # 2. The group epoch: a changed subscription, or changed metadata of the subscribed topics.
    metadata = group.subscription_metadata
    regex_records: list = []
    regexes: Mapping[str, ResolvedRegex] = group.regexes
    if group.regexes or updated.subscription.subscribed_topic_regex:
        regex_records, regexes = consumer_regex.refresh(group, members.values(), topics, now_ms,
                                                        shard.config.consumer_regex_refresh_interval_ms)
    if bump or regex_records or group.metadata_view is not topics or group.group_epoch > group.assignment_epoch:
        out.records += regex_records
        metadata = subscription_metadata(members.values(), topics, regexes)
        group.metadata_view = topics
        if metadata != group.subscription_metadata:
            out.records.append(SubscriptionMetadataRecord(gid, metadata))
            bump = True
    group_epoch = group.group_epoch
    if bump:
        group_epoch += 1
        out.records.append(GroupEpochRecord(gid, group_epoch))
        log.info("group %s: bumped the group epoch to %d", gid, group_epoch)
    # 3. The target assignment.
    target_epoch, member_target = _update_target(shard, group, group_epoch, members, metadata, topics, regexes,
                                                 member_id, replaced, out, now_ms)
    # 4. Reconciliation: partitions another member still owns are not handed out yet.
    gone = replaced.member_id if replaced is not None else None
    subscribed_ids = {metadata[n].topic_id for n in updated.subscribed_names(topics, regexes) if n in metadata}
    current = reconcile(updated, target_epoch, member_target, owned, subscribed_ids,
                        lambda t, p: group.owners.get((t, p)) in (None, member_id, gone))
    if current != updated.current or replaced is not None or member_id not in group.members:
        out.records.append(CurrentAssignmentRecord(gid, member_id, current))
    return current


def _update_member(group: ConsumerGroup, member: ConsumerMember, replaced: ConsumerMember | None,
                   subscription: MemberSubscription, out: Outcome) -> tuple[ConsumerMember, bool]:
    """(the member with its new subscription, whether the group epoch must go up)."""
    gid, member_id = group.group_id, member.member_id
    old = member.subscription
    updated = member.with_subscription(subscription)
    if replaced is not None:
        out.records += remove_member_records(gid, replaced.member_id)
        updated = updated.with_current(CurrentAssignment(0, 0, MemberState.STABLE, replaced.assigned, {}))
    bump = group.group_epoch == 0
    if member_id not in group.members or subscription != old:
        out.records.append(MemberRecord(gid, member_id, subscription))
        if set(subscription.subscribed_topic_names) != set(old.subscribed_topic_names) \
                or subscription.subscribed_topic_regex != old.subscribed_topic_regex:
            log.info("group %s: member %s subscribes to %s%s", gid, member_id,
                     sorted(subscription.subscribed_topic_names),
                     f" and /{subscription.subscribed_topic_regex}/" if subscription.subscribed_topic_regex else "")
            bump = True
        elif subscription.client_assignors != old.client_assignors:
            log.info("group %s: member %s has new client-side assignors %s", gid, member_id,
                     [(a.name, a.version, a.reason) for a in subscription.client_assignors])
            bump = True
    return updated, bump


def _update_target(shard: GroupShard, group: ConsumerGroup, group_epoch: int, members: Mapping[str, ConsumerMember],
                   metadata: Mapping[str, TopicMeta], topics: TopicsView, regexes: Mapping[str, ResolvedRegex],
                   member_id: str, replaced: ConsumerMember | None, out: Outcome, now_ms: int) -> tuple[int, Partitions]:
    """(target assignment epoch, the member's target); a new target when the group epoch is ahead, its
    changes written. A static member that replaces another inherits that member's target."""
    gid = group.group_id
    current_target = dict(group.target)
    if replaced is not None:
        current_target[member_id] = current_target.pop(replaced.member_id, {})
        out.records.append(TargetMemberRecord(gid, member_id, current_target[member_id]))
    if group_epoch <= group.assignment_epoch \
            or consumer_client_assign.defer_target(shard, group, members, member_id, now_ms):
        return group.assignment_epoch, current_target.get(member_id, {})
    target = compute_target(shard, gid, group_epoch, members, metadata, topics, current_target, regexes)
    out.records += [TargetMemberRecord(gid, m, parts) for m, parts in target.items() if current_target.get(m) != parts]
    out.records.append(TargetEpochRecord(gid, group_epoch))
    return group_epoch, target.get(member_id, {})


def _response(shard: GroupShard, req: cgh.ConsumerGroupHeartbeatRequest, before: ConsumerMember, member_id: str,
              current: CurrentAssignment) -> cgh.ConsumerGroupHeartbeatResponse:
    """The assignment goes out when the member joined, sent a full request, or it changed."""
    response = cgh.ConsumerGroupHeartbeatResponse(
        error_code=ErrorCode.NONE, member_id=member_id, member_epoch=current.member_epoch,
        heartbeat_interval_ms=shard.config.consumer_heartbeat_interval_ms)
    full = req.member_epoch == 0 or (req.rebalance_timeout_ms != -1 and req.topic_partitions is not None and (
        req.subscribed_topic_names is not None or req.subscribed_topic_regex is not None))
    if full or current.assigned != before.assigned:
        response.assignment = cgh.Assignment(topic_partitions=[
            cgh.TopicPartitions(topic_id=t, partitions=sorted(ps))
            for t, ps in sorted(current.assigned.items(), key=lambda kv: str(kv[0]))])
    return response


def _resolve_member(group: ConsumerGroup, req: cgh.ConsumerGroupHeartbeatRequest,
                    member_id: str) -> tuple[ConsumerMember, ConsumerMember | None]:
    """(the member, the static member it replaces or None)."""
    joining = req.member_epoch == 0
    instance_id = req.instance_id
    if instance_id is None:
        member = group.members.get(member_id)
        if member is None:
            if not joining:
                raise Refused(ErrorCode.UNKNOWN_MEMBER_ID,
                              f"Member {member_id} is not a member of group {group.group_id}.")
            member = ConsumerMember(member_id)
        _check_epoch(member, req.member_epoch, req.topic_partitions)
        return member, None
    existing = group.static_member(instance_id)
    if joining:
        if existing is None:
            return group.members.get(member_id) or ConsumerMember(member_id), None
        if existing.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            raise Refused(ErrorCode.UNRELEASED_INSTANCE_ID, f"Static member {member_id} with instance id "
                          f"{instance_id} cannot join the group because the instance id is owned by "
                          f"{existing.member_id} member.")
        log.info("group %s: static member %s with instance id %s replaces %s", group.group_id, member_id,
                 instance_id, existing.member_id)
        return ConsumerMember(member_id, existing.subscription), existing
    if existing is None:
        raise Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {instance_id} is unknown.")
    if existing.member_id != member_id:
        raise Refused(ErrorCode.FENCED_INSTANCE_ID, f"Static member {member_id} with instance id {instance_id} "
                      f"was fenced by member {existing.member_id}.")
    _check_epoch(existing, req.member_epoch, req.topic_partitions)
    return existing, None


def _updated_subscription(member: ConsumerMember, req: cgh.ConsumerGroupHeartbeatRequest,
                          caller: Caller, client_assignors: bool = False) -> MemberSubscription:
    """Fields the request leaves null keep their value (the seed: null means unchanged)."""
    s = member.subscription
    regex = s.subscribed_topic_regex if req.subscribed_topic_regex is None else (req.subscribed_topic_regex or None)
    return MemberSubscription(
        instance_id=req.instance_id if req.instance_id is not None else s.instance_id,
        rack_id=req.rack_id if req.rack_id is not None else s.rack_id,
        client_id=caller.client_id, client_host=caller.client_host,
        subscribed_topic_names=tuple(req.subscribed_topic_names) if req.subscribed_topic_names is not None
        else s.subscribed_topic_names,
        subscribed_topic_regex=regex,
        rebalance_timeout_ms=req.rebalance_timeout_ms if req.rebalance_timeout_ms != -1 else s.rebalance_timeout_ms,
        server_assignor=req.server_assignor if req.server_assignor is not None else s.server_assignor,
        client_assignors=consumer_client_assign.from_request(req.client_assignors)
        if client_assignors and req.client_assignors is not None else s.client_assignors)


# ------------------------------------------------------------------------------------------ target
def preferred_assignor(members: Mapping[str, ConsumerMember], assignors: tuple[str, ...]) -> str:
    votes = Counter(m.subscription.server_assignor for m in members.values() if m.subscription.server_assignor)
    if not votes:
        return assignors[0]
    best = max(votes.values())
    return next(a for a in (*assignors, *sorted(votes)) if votes.get(a) == best)


def compute_target(shard: GroupShard, group_id: str, group_epoch: int, members: Mapping[str, ConsumerMember],
                   metadata: Mapping[str, TopicMeta], topics: TopicsView, current: Mapping[str, Partitions],
                   regexes: Mapping[str, ResolvedRegex]) -> dict[str, Partitions]:
    name = preferred_assignor(members, shard.config.consumer_assignors)
    specs = {}
    for m_id, m in members.items():
        ids = frozenset(metadata[n].topic_id for n in m.subscribed_names(topics, regexes) if n in metadata)
        specs[m_id] = assignors_server.MemberSpec(ids, m.subscription.rack_id, m.instance_id)
    counts = {meta.topic_id: meta.num_partitions for meta in metadata.values()}
    racks = {meta.topic_id: topics.racks[n] for n, meta in metadata.items() if n in topics.racks}
    raw = assignors_server.assign(name, specs, counts, current, racks)
    target: dict[str, Partitions] = {m: partitions_of(raw.get(m, {}).items()) for m in members}
    log.info("group %s: computed a new target assignment for epoch %d with the %r assignor (%d members, %d "
             "partitions)", group_id, group_epoch, name, len(members), sum(counts.values()))
    return target


# ------------------------------------------------------------------------------------------ reconciliation
def _owns_any(owned: OwnedPartitions, parts: Partitions) -> bool:
    if owned is None:
        return True
    return any(p in parts.get(tp.topic_id, ()) for tp in owned for p in tp.partitions)


def reconcile(member: ConsumerMember, target_epoch: int, target: Partitions, owned: OwnedPartitions,
              subscribed_ids: set[uuid.UUID], is_free: Callable[[uuid.UUID, int], bool]) -> CurrentAssignment:
    """The member's next current assignment towards the target (Kafka's CurrentAssignmentBuilder)."""
    c = member.current
    state = member.state
    if state == MemberState.STABLE and c.member_epoch == target_epoch:
        return c
    if state == MemberState.UNREVOKED_PARTITIONS and _owns_any(owned, c.pending_revocation):
        return c
    if state == MemberState.UNKNOWN and (owned is None or owned):
        raise Refused(ErrorCode.FENCED_MEMBER_EPOCH, "The consumer group member is in a unknown state. "
                      "The member must abandon all its partitions and rejoin.")
    epoch = target_epoch if state == MemberState.UNKNOWN else c.member_epoch
    assigned: dict[uuid.UUID, frozenset[int]] = {}
    revoke: dict[uuid.UUID, frozenset[int]] = {}
    to_assign: dict[uuid.UUID, frozenset[int]] = {}
    unreleased = False
    for t in set(target) | set(c.assigned):
        tgt = target.get(t, frozenset()) if t in subscribed_ids else frozenset()
        cur = c.assigned.get(t, frozenset())
        keep, gone = cur & tgt, cur - tgt
        wanted = tgt - keep
        free = frozenset(p for p in wanted if is_free(t, p) or p in c.pending_revocation.get(t, ()))
        unreleased = unreleased or len(free) < len(wanted)
        if keep:
            assigned[t] = keep
        if gone:
            revoke[t] = gone
        if free:
            to_assign[t] = free
    if revoke and _owns_any(owned, revoke):
        return CurrentAssignment(epoch, epoch, MemberState.UNREVOKED_PARTITIONS, assigned, revoke)
    for t, ps in to_assign.items():
        assigned[t] = assigned.get(t, frozenset()) | ps
    state_after = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return CurrentAssignment(target_epoch, epoch, state_after, assigned, {})


# ------------------------------------------------------------------------------------------ leaving
def fence_member(group: ConsumerGroup, member: ConsumerMember) -> Outcome:
    """Remove the member and bump the group epoch; the others get a new target at their next heartbeat."""
    return fence_members(group, [member.member_id])


def fence_members(group: ConsumerGroup, member_ids: Iterable[str]) -> Outcome:
    gid = group.group_id
    gone = set(member_ids)
    out = Outcome()
    for member_id in sorted(gone):
        out.records += remove_member_records(gid, member_id)
    rest = [m for m in group.members.values() if m.member_id not in gone]
    out.records += consumer_regex.tombstones(group, consumer_regex.used(rest))
    names: set[str] = set()
    for m in rest:
        names |= m.subscribed_names(NO_TOPICS, group.regexes)
    with_racks = any(m.subscription.rack_id for m in rest)
    kept = {n: meta if with_racks else TopicMeta(meta.topic_id, meta.num_partitions)
            for n, meta in group.subscription_metadata.items() if n in names}
    if kept != group.subscription_metadata:
        out.records.append(SubscriptionMetadataRecord(gid, kept))
    out.records.append(GroupEpochRecord(gid, group.group_epoch + 1))
    return out


def _leave(shard: GroupShard, req: cgh.ConsumerGroupHeartbeatRequest, now_ms: int) -> Outcome:
    gid = req.group_id
    group = shard.consumer_groups.get(gid)
    if group is None:
        raise Refused(ErrorCode.GROUP_ID_NOT_FOUND, f"Consumer group {gid} not found.")
    if req.instance_id is None:
        member = group.members.get(req.member_id)
        if member is None:
            raise Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"Member {req.member_id} is not a member of group {gid}.")
    else:
        member = group.static_member(req.instance_id)
        if member is None:
            raise Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {req.instance_id} is unknown.")
        if member.member_id != req.member_id:
            raise Refused(ErrorCode.FENCED_INSTANCE_ID, f"Static member {req.member_id} with instance id "
                          f"{req.instance_id} was fenced by member {member.member_id}.")
    response = cgh.ConsumerGroupHeartbeatResponse(error_code=ErrorCode.NONE, member_id=member.member_id,
                                                  member_epoch=req.member_epoch)
    if req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        log.info("group %s: static member %s with instance id %s left temporarily; it keeps its partitions "
                 "until its session expires", gid, member.member_id, req.instance_id)
        c = member.current
        record = CurrentAssignmentRecord(gid, member.member_id, CurrentAssignment(
            LEAVE_GROUP_STATIC_MEMBER_EPOCH, c.member_epoch, c.state, c.assigned, c.pending_revocation))
        return Outcome(response, records=[record])
    log.info("group %s: member %s left the consumer group", gid, member.member_id)
    out = consumer_migration.maybe_downgrade(shard, group, member.member_id, fence_member(group, member), now_ms)
    out.response = response
    return out


# ------------------------------------------------------------------------------------------ timers
def fire(shard: GroupShard, key: tuple, now_ms: int) -> Outcome:
    kind, gid, member_id = key
    group = shard.consumer_groups.get(gid)
    member = group.members.get(member_id) if group is not None else None
    if group is None or member is None:
        return Outcome()
    if kind == SESSION_TIMER:
        log.info("group %s: member %s has not heartbeated in %d ms; removing it", gid, member_id,
                 session_timeout_ms(shard, member))
    elif kind == REVOCATION_TIMER:
        if member.state != MemberState.UNREVOKED_PARTITIONS:
            return Outcome()
        log.info("group %s: member %s did not revoke its partitions within its rebalance timeout; removing it",
                 gid, member_id)
    else:
        raise AssertionError(f"unknown timer {key!r}")
    return consumer_migration.maybe_downgrade(shard, group, member_id, fence_member(group, member), now_ms)
