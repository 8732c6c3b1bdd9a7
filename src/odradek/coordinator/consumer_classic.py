"""Classic members in a consumer group (seed 002, KIP-848, "Upgrade & Downgrade": during a rolling
upgrade a group holds members of both protocols). JoinGroup, SyncGroup, Heartbeat and LeaveGroup
to a group that `consumer_migration` converted, as Kafka's group coordinator answers them:

- JoinGroup subscribes the member like a heartbeat would (`consumer_heartbeat.advance`): its topics
  and owned partitions come from its ConsumerProtocolSubscription (an eager client owns nothing when
  it rejoins, a cooperative one lists what it kept); the server assignor computes the target and the
  member is reconciled. The answer comes at once: generation = the member epoch, the member's first
  protocol, no leader (nobody computes an assignment), so every classic member is a follower. A new
  dynamic member first gets MEMBER_ID_REQUIRED (v4+).
- SyncGroup hands out the member's current assignment (ConsumerProtocolAssignment, what it may own
  now: never a partition another member has not released). ILLEGAL_GENERATION for another epoch;
  REBALANCE_IN_PROGRESS when the group epoch moved past the member's (it must rejoin first).
- Heartbeat answers REBALANCE_IN_PROGRESS when the member must rejoin: the group epoch is past its
  epoch, it has partitions to revoke, or partitions it waits for have been released.
- LeaveGroup removes the member and bumps the group epoch.

Requests to groups that are not consumer groups go to the classic coordinator (`membership`).
"""

from __future__ import annotations

import logging

from odradek.coordinator import consumer_heartbeat as ch
from odradek.coordinator import consumer_migration as mig
from odradek.coordinator import membership
from odradek.coordinator import rebalance as rb
from odradek.coordinator.consumer_group import (
    LEAVE_GROUP_STATIC_MEMBER_EPOCH, ConsumerGroup, ConsumerMember, MemberState, TopicsView, session_timer,
)
from odradek.coordinator.consumer_records import ClassicMeta, MemberSubscription
from odradek.coordinator.group import CONSUMER_PROTOCOL_TYPE
from odradek.coordinator.membership import Caller
from odradek.coordinator.shard import GroupShard, Outcome
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.exceptions import ProtocolError
from odradek.protocol.messages import consumer_group_heartbeat as cgh
from odradek.protocol.messages.heartbeat import HeartbeatRequest, HeartbeatResponse
from odradek.protocol.messages.join_group import JoinGroupRequest, JoinGroupResponse
from odradek.protocol.messages.leave_group import LeaveGroupRequest, LeaveGroupResponse, MemberResponse
from odradek.protocol.messages.sync_group import SyncGroupRequest, SyncGroupResponse

log = logging.getLogger("odradek.coordinator")


def _consumer_group(shard: GroupShard, group_id: str) -> ConsumerGroup | None:
    return shard.consumer_groups.get(group_id)


def _member(group: ConsumerGroup, member_id: str, instance_id: str | None) -> ConsumerMember:
    """The classic member the request names; ch.Refused with Kafka's error otherwise."""
    if instance_id is not None:
        known = group.static_members.get(instance_id)
        if known is None:
            raise ch.Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {instance_id} is unknown.")
        if known != member_id:
            raise ch.Refused(ErrorCode.FENCED_INSTANCE_ID, f"Static member {member_id} with instance id "
                             f"{instance_id} was fenced by member {known}.")
    member = group.members.get(member_id)
    if member is None or not member.uses_classic_protocol:
        raise ch.Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a classic member of group "
                         f"{group.group_id}.")
    return member


def _reschedule_session(shard: GroupShard, group: ConsumerGroup, member: ConsumerMember, now_ms: int,
                        session_timeout_ms: int | None = None) -> None:
    meta = member.subscription.classic
    timeout = session_timeout_ms if session_timeout_ms is not None else (
        meta.session_timeout_ms if meta is not None else shard.config.consumer_session_timeout_ms)
    shard.schedule(session_timer(group.group_id, member.member_id), now_ms + timeout)


# ------------------------------------------------------------------------------------------ JoinGroup
def join_group(shard: GroupShard, req: JoinGroupRequest, caller: Caller, topics: TopicsView, now_ms: int) -> Outcome:
    g = _consumer_group(shard, req.group_id)
    if g is None:
        return membership.join_group(shard, req, caller, now_ms)
    if not g.members:
        log.info("group %s: converting the empty consumer group to a classic group", req.group_id)
        out = membership.join_group(shard, req, caller, now_ms)
        out.records = mig.group_tombstones(g) + out.records
        return out
    cfg = shard.config
    if not cfg.min_session_timeout_ms <= req.session_timeout_ms <= cfg.max_session_timeout_ms:
        return Outcome(rb.join_error(ErrorCode.INVALID_SESSION_TIMEOUT, req.member_id))
    try:
        return _join(shard, g, req, caller, topics, now_ms)
    except ch.Refused as e:
        log.debug("group %s: JoinGroup of member %s refused: %s %s", req.group_id, req.member_id, e.code.name,
                  e.message)
        return Outcome(rb.join_error(e.code, req.member_id))


def _join(shard: GroupShard, group: ConsumerGroup, req: JoinGroupRequest, caller: Caller, topics: TopicsView,
          now_ms: int) -> Outcome:
    protocols = [(p.name, bytes(p.metadata)) for p in req.protocols]
    if req.protocol_type != CONSUMER_PROTOCOL_TYPE or not protocols or not _shares_protocols(group, req.member_id,
                                                                                             protocols):
        raise ch.Refused(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, "The member's protocols do not match the group's.")
    try:
        _, sub = mig.read_subscription(protocols[0][1])
    except ProtocolError as e:
        raise ch.Refused(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, f"The subscription does not parse: {e}.")
    unknown = req.member_id == ""
    member_id = req.member_id or f"{caller.client_id}-{shard.new_uuid()}"
    ch.check_size(shard, group, member_id)
    if unknown and req.group_instance_id is None and caller.api_version >= 4:
        return Outcome(rb.join_error(ErrorCode.MEMBER_ID_REQUIRED, member_id))
    member, replaced = _resolve(group, req, member_id, unknown)
    rebalance_timeout = req.session_timeout_ms if caller.api_version == 0 else req.rebalance_timeout_ms
    subscription = MemberSubscription(
        instance_id=req.group_instance_id, rack_id=getattr(sub, "rack_id", None) or None,
        client_id=caller.client_id, client_host=caller.client_host, subscribed_topic_names=tuple(sub.topics),
        subscribed_topic_regex=None, rebalance_timeout_ms=rebalance_timeout, server_assignor=None,
        classic=ClassicMeta(req.session_timeout_ms, tuple(protocols)))
    owned_named = [(tp.topic, tp.partitions) for tp in getattr(sub, "owned_partitions", None) or []]
    owned = [cgh.TopicPartitions(topic_id=t, partitions=sorted(ps))
             for t, ps in mig.by_topic_id(owned_named, topics).items()]
    out = Outcome()
    current = ch.advance(shard, group, member, replaced, subscription, owned, topics, out, now_ms)
    shard.schedule(session_timer(group.group_id, member_id), now_ms + req.session_timeout_ms)
    log.debug("group %s: classic member %s joined at epoch %d (group epoch %s)", group.group_id, member_id,
              current.member_epoch, group.group_epoch)
    out.response = JoinGroupResponse(
        error_code=ErrorCode.NONE, generation_id=current.member_epoch, protocol_type=CONSUMER_PROTOCOL_TYPE,
        protocol_name=protocols[0][0], leader="", skip_assignment=False, member_id=member_id, members=[])
    return out


def _shares_protocols(group: ConsumerGroup, member_id: str, protocols: list[tuple[str, bytes]]) -> bool:
    """Every other classic member supports one of the member's protocols (the classic group's rule)."""
    names = {n for n, _ in protocols}
    for m in group.members.values():
        meta = m.subscription.classic
        if m.member_id != member_id and meta is not None and not names & {n for n, _ in meta.protocols}:
            return False
    return True


def _resolve(group: ConsumerGroup, req: JoinGroupRequest, member_id: str,
             unknown: bool) -> tuple[ConsumerMember, ConsumerMember | None]:
    """(the member, the static member it replaces or None)."""
    instance_id = req.group_instance_id
    existing = group.members.get(member_id)
    if existing is not None and not existing.uses_classic_protocol:
        raise ch.Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} uses the consumer protocol.")
    if instance_id is None:
        if existing is None and not unknown:
            # A member id handed out with MEMBER_ID_REQUIRED (or one from before a conversion).
            return ConsumerMember(member_id), None
        return existing or ConsumerMember(member_id), None
    static = group.static_member(instance_id)
    if static is None:
        return existing or ConsumerMember(member_id), None
    if static.member_id == member_id:
        return static, None
    if not unknown:
        raise ch.Refused(ErrorCode.FENCED_INSTANCE_ID, f"Static member {member_id} with instance id {instance_id} "
                         f"was fenced by member {static.member_id}.")
    if not static.uses_classic_protocol and static.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        raise ch.Refused(ErrorCode.UNRELEASED_INSTANCE_ID, f"Instance id {instance_id} is held by member "
                         f"{static.member_id}.")
    log.info("group %s: static member %s with instance id %s replaces %s", group.group_id, member_id, instance_id,
             static.member_id)
    return ConsumerMember(member_id, static.subscription), static


# ------------------------------------------------------------------------------------------ SyncGroup
def sync_group(shard: GroupShard, req: SyncGroupRequest, caller: Caller, topics: TopicsView, now_ms: int) -> Outcome:
    g = _consumer_group(shard, req.group_id)
    if g is None or not req.group_id:
        return membership.sync_group(shard, req, caller, now_ms)
    try:
        member = _member(g, req.member_id, req.group_instance_id)
        if req.generation_id != member.member_epoch:
            raise ch.Refused(ErrorCode.ILLEGAL_GENERATION, f"generation {req.generation_id}, member epoch "
                             f"{member.member_epoch}")
        meta = member.subscription.classic
        assert meta is not None
        name = meta.protocols[0][0]
        if (req.protocol_type is not None and req.protocol_type != CONSUMER_PROTOCOL_TYPE) \
                or (req.protocol_name is not None and req.protocol_name != name):
            raise ch.Refused(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, "protocol mismatch")
        if g.group_epoch > member.member_epoch and member.state != MemberState.UNREVOKED_PARTITIONS:
            raise ch.Refused(ErrorCode.REBALANCE_IN_PROGRESS, "the group epoch moved on")
    except ch.Refused as e:
        return Outcome(SyncGroupResponse(error_code=e.code))
    _reschedule_session(shard, g, member, now_ms)
    assignment = mig.encode_assignment(member.assigned, topics, mig.subscription_version(meta, name))
    return Outcome(SyncGroupResponse(error_code=ErrorCode.NONE, protocol_type=CONSUMER_PROTOCOL_TYPE,
                                     protocol_name=name, assignment=assignment))


# ------------------------------------------------------------------------------------------ Heartbeat
def heartbeat(shard: GroupShard, req: HeartbeatRequest, caller: Caller, now_ms: int) -> Outcome:
    g = _consumer_group(shard, req.group_id)
    if g is None or not req.group_id:
        return membership.heartbeat(shard, req, caller, now_ms)
    try:
        member = _member(g, req.member_id, req.group_instance_id)
        if req.generation_id != member.member_epoch:
            raise ch.Refused(ErrorCode.ILLEGAL_GENERATION, "")
    except ch.Refused as e:
        return Outcome(HeartbeatResponse(error_code=e.code))
    _reschedule_session(shard, g, member, now_ms)
    if must_rejoin(g, member):
        return Outcome(HeartbeatResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS))
    return Outcome(HeartbeatResponse(error_code=ErrorCode.NONE))


def must_rejoin(group: ConsumerGroup, member: ConsumerMember) -> bool:
    """The group epoch moved past the member's, it has partitions to give up, or partitions it waits
    for are free now: a classic member learns each only by joining again."""
    if member.member_epoch < group.group_epoch or member.state == MemberState.UNREVOKED_PARTITIONS:
        return True
    if member.state != MemberState.UNRELEASED_PARTITIONS:
        return False
    target = group.target.get(member.member_id, {})
    waiting = any(group.owners.get((t, p)) not in (None, member.member_id)
                  for t, ps in target.items() for p in ps if p not in member.assigned.get(t, ()))
    return not waiting


# ------------------------------------------------------------------------------------------ LeaveGroup
def leave_group(shard: GroupShard, req: LeaveGroupRequest, caller: Caller, now_ms: int) -> Outcome:
    g = _consumer_group(shard, req.group_id)
    if g is None or not req.group_id:
        return membership.leave_group(shard, req, caller, now_ms)
    if caller.api_version < 3:
        identities = [(req.member_id, None)]
    else:
        identities = [(m.member_id, m.group_instance_id) for m in req.members]
    results: list[MemberResponse] = []
    leaving: list[str] = []
    for member_id, instance_id in identities:
        code = ErrorCode.NONE
        try:
            if member_id == "" and instance_id is not None:
                known = g.static_members.get(instance_id)
                if known is None:
                    raise ch.Refused(ErrorCode.UNKNOWN_MEMBER_ID, "")
                member_id = known
            leaving.append(_member(g, member_id, instance_id).member_id)
            log.info("group %s: classic member %s left the consumer group", g.group_id, member_id)
        except ch.Refused as e:
            code = e.code
        results.append(MemberResponse(member_id=member_id, group_instance_id=instance_id, error_code=code))
    out = ch.fence_members(g, leaving) if leaving else Outcome()
    if caller.api_version < 3:
        out.response = LeaveGroupResponse(error_code=results[0].error_code)
    else:
        out.response = LeaveGroupResponse(error_code=ErrorCode.NONE, members=results)
    return out
