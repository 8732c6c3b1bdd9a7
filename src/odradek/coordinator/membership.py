"""The group membership operations: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, and timer expiry
(seed 000 and seed 004, "Group Membership API"; seed 003, "JoinGroup API" ... "LeaveGroup API").

Each is `op(shard, request, caller, now_ms) -> Outcome` over the generated request message; the
response is the generated response message, encoded by the broker at the request's version.

Static membership (KIP-345): a member with a group.instance.id that joins with no member id while
its instance is known takes over the old member id's place, protocols and assignment. In a Stable
group whose selected protocol does not change, that is only a new GroupMetadata record: no
rebalance. The process that held the old id is fenced: its next request gets FENCED_INSTANCE_ID.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from odradek.coordinator import consumer_heartbeat
from odradek.coordinator import rebalance as rb
from odradek.coordinator.consumer_group import TIMER_KINDS as CONSUMER_TIMER_KINDS
from odradek.coordinator.group import ClassicGroup, GroupState, Member
from odradek.coordinator.offsets import expire_offsets
from odradek.coordinator.records import GroupRecord
from odradek.coordinator.shard import GroupShard, Outcome, join_key, sync_key
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages.heartbeat import HeartbeatRequest, HeartbeatResponse
from odradek.protocol.messages.join_group import JoinGroupRequest
from odradek.protocol.messages.leave_group import LeaveGroupRequest, LeaveGroupResponse, MemberResponse
from odradek.protocol.messages.sync_group import SyncGroupRequest, SyncGroupResponse

Protocols = list[tuple[str, bytes]]   # (protocol name, member metadata), in the member's order

log = logging.getLogger("odradek.coordinator")

PREPARING, COMPLETING = GroupState.PREPARING_REBALANCE, GroupState.COMPLETING_REBALANCE
STABLE, EMPTY = GroupState.STABLE, GroupState.EMPTY


@dataclass(frozen=True)
class Caller:
    """Who sent the request: the member's client id and host, and the request's API version."""
    client_id: str
    client_host: str
    api_version: int


# ------------------------------------------------------------------------------------ JoinGroup
def join_group(shard: GroupShard, req: JoinGroupRequest, caller: Caller, now_ms: int) -> Outcome:
    cfg = shard.config
    if not req.group_id:
        return Outcome(rb.join_error(ErrorCode.INVALID_GROUP_ID, req.member_id))
    if not cfg.min_session_timeout_ms <= req.session_timeout_ms <= cfg.max_session_timeout_ms:
        return Outcome(rb.join_error(ErrorCode.INVALID_SESSION_TIMEOUT, req.member_id))
    unknown = req.member_id == ""
    group = shard.group(req.group_id)
    if group is None:
        if not unknown:
            return Outcome(rb.join_error(ErrorCode.UNKNOWN_MEMBER_ID, req.member_id))
        group = shard.get_or_create(req.group_id)
    if not _accept_joining_member(group, req.member_id, cfg.max_size):
        group.remove(req.member_id)
        shard.cancel(rb.heartbeat_timer(group.group_id, req.member_id))
        return Outcome(rb.join_error(ErrorCode.GROUP_MAX_SIZE_REACHED))
    protocols = [(p.name, bytes(p.metadata)) for p in req.protocols]
    if not group.supports_protocols(req.protocol_type, protocols):
        return Outcome(rb.join_error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, req.member_id))
    if unknown:
        return _join_new_member(shard, group, req, protocols, caller, now_ms)
    return _join_existing_member(shard, group, req, protocols, caller, now_ms)


def _accept_joining_member(group: ClassicGroup, member_id: str, max_size: int) -> bool:
    if group.state == EMPTY:
        return True
    known = group.members.get(member_id)
    if group.state == PREPARING:
        # Counting members that have rejoined lets the last ones to rejoin be turned away when the
        # group is over a (lowered) group.max.size.
        return (known is not None and known.awaiting_join) or group.num_awaiting_join < max_size
    return known is not None or len(group.members) < max_size


def _rebalance_timeout(req: JoinGroupRequest, caller: Caller) -> int:
    return req.session_timeout_ms if caller.api_version == 0 else req.rebalance_timeout_ms


def _join_new_member(shard: GroupShard, group: ClassicGroup, req: JoinGroupRequest, protocols: Protocols,
                     caller: Caller, now_ms: int) -> Outcome:
    instance_id = req.group_instance_id
    new_id = f"{instance_id if instance_id is not None else caller.client_id}-{shard.new_uuid()}"
    if instance_id is not None:
        old_id = group.static_members.get(instance_id)
        if old_id is not None:
            log.info("Static member with group.instance.id %s and unknown member id joins group %s in %s "
                     "state; replacing previously mapped member %s", instance_id, group.group_id,
                     group.state.value, old_id)
            return _replace_static_member(shard, group, req, protocols, caller, old_id, new_id, now_ms)
        return _add_member_and_rebalance(shard, group, req, protocols, caller, new_id, now_ms)
    if caller.api_version >= 4:
        # KIP-394: hand out the id first; the member rejoins with it, so a retried first join
        # cannot leave a ghost member behind.
        group.pending_members.add(new_id)
        shard.schedule(rb.heartbeat_timer(group.group_id, new_id), now_ms + req.session_timeout_ms)
        return Outcome(rb.join_error(ErrorCode.MEMBER_ID_REQUIRED, new_id))
    return _add_member_and_rebalance(shard, group, req, protocols, caller, new_id, now_ms)


def _join_existing_member(shard: GroupShard, group: ClassicGroup, req: JoinGroupRequest, protocols: Protocols,
                          caller: Caller, now_ms: int) -> Outcome:
    member_id = req.member_id
    if member_id in group.pending_members:
        if req.group_instance_id is not None:
            return Outcome(rb.join_error(ErrorCode.UNKNOWN_MEMBER_ID, member_id))
        return _add_member_and_rebalance(shard, group, req, protocols, caller, member_id, now_ms)
    error = group.validate_member(member_id, req.group_instance_id)
    if error:
        return Outcome(rb.join_error(error, member_id))
    member = group.members[member_id]
    if group.state == PREPARING:
        return _update_member_and_rebalance(shard, group, member, req, protocols, caller, now_ms,
                                            f"member {member_id} is joining group during PreparingRebalance")
    if group.state == COMPLETING:
        if member.matches(protocols):
            # A lost JoinGroup response: answer again for the current generation.
            return Outcome(rb.join_response(group, member_id, with_members=group.is_leader(member_id)))
        return _update_member_and_rebalance(shard, group, member, req, protocols, caller, now_ms,
                                            f"updating metadata for member {member_id} during CompletingRebalance")
    if group.state == STABLE:
        if group.is_leader(member_id) or not member.matches(protocols):
            # A leader's rejoin forces a rebalance: topic metadata may have changed the assignment.
            return _update_member_and_rebalance(shard, group, member, req, protocols, caller, now_ms,
                                                f"member {member_id} rejoined group during Stable")
        return Outcome(rb.join_response(group, member_id))
    return Outcome(rb.join_error(ErrorCode.UNKNOWN_MEMBER_ID, member_id))


def _add_member_and_rebalance(shard: GroupShard, group: ClassicGroup, req: JoinGroupRequest, protocols: Protocols,
                              caller: Caller, member_id: str, now_ms: int) -> Outcome:
    member = Member(member_id, req.group_instance_id, caller.client_id, caller.client_host,
                    _rebalance_timeout(req, caller), req.session_timeout_ms, req.protocol_type, protocols,
                    awaiting_join=True, is_new=True)
    if group.state == PREPARING and group.previous_state == EMPTY:
        group.new_member_added = True
    group.add(member)
    # A new member cannot heartbeat before its JoinGroup returns, and a client that gave up would
    # leave a ghost: its first join expires after the new-member join timeout.
    rb.reschedule_heartbeat(shard, group, member, now_ms, shard.config.new_member_join_timeout_ms)
    out = rb.maybe_prepare_rebalance_or_complete_join(
        shard, group, now_ms, f"adding new member {member_id} with group instance id {req.group_instance_id}")
    out.park = join_key(group.group_id, member_id)
    return out


def _update_member_and_rebalance(shard: GroupShard, group: ClassicGroup, member: Member, req: JoinGroupRequest,
                                 protocols: Protocols, caller: Caller, now_ms: int, reason: str) -> Outcome:
    group.update_protocols(member, protocols, _rebalance_timeout(req, caller), req.session_timeout_ms)
    member.awaiting_join = True
    out = rb.maybe_prepare_rebalance_or_complete_join(shard, group, now_ms, reason)
    out.park = join_key(group.group_id, member.member_id)
    return out


def _replace_static_member(shard: GroupShard, group: ClassicGroup, req: JoinGroupRequest, protocols: Protocols,
                           caller: Caller, old_id: str, new_id: str, now_ms: int) -> Outcome:
    out = Outcome()
    old = group.members[old_id]
    # Whoever still waits under the old id is a duplicate instance: fence it now.
    if old.awaiting_join:
        out.completions.append((join_key(group.group_id, old_id), rb.join_error(ErrorCode.FENCED_INSTANCE_ID, old_id)))
    if old.awaiting_sync:
        out.completions.append((sync_key(group.group_id, old_id),
                                SyncGroupResponse(error_code=ErrorCode.FENCED_INSTANCE_ID)))
    old.awaiting_join = old.awaiting_sync = False
    current_leader = group.leader_id
    member = group.replace_static_member(req.group_instance_id, old_id, new_id)
    shard.cancel(rb.heartbeat_timer(group.group_id, old_id))
    rb.reschedule_heartbeat(shard, group, member, now_ms)
    group.update_protocols(member, protocols, _rebalance_timeout(req, caller), req.session_timeout_ms)
    if group.state == STABLE and group.protocol_name == group.select_protocol():
        log.info("Static member which joins during Stable stage and doesn't affect the selected "
                 "protocol will not trigger a rebalance")
        assignments = {m.member_id: m.assignment for m in group.members.values()}
        out.records.append(GroupRecord(group.group_id, group.record_value(assignments, group.state_timestamp_ms
                                                                          if group.state_timestamp_ms is not None
                                                                          else now_ms)))
        if caller.api_version >= 9:
            leader = group.is_leader(new_id)
            out.response = rb.join_response(group, new_id, with_members=leader, skip_assignment=leader)
        else:
            # The old leader id keeps a restarted leader from computing an assignment nobody receives.
            out.response = rb.join_response(group, new_id, leader=current_leader or "")
        return out
    member.awaiting_join = True
    reason = f"static member {new_id} with instance id {req.group_instance_id} rejoined"
    if group.state == STABLE:
        out.add(rb.maybe_prepare_rebalance_or_complete_join(shard, group, now_ms, reason))
    elif group.state == COMPLETING:
        out.add(rb.prepare_rebalance(shard, group, now_ms, reason))
    else:
        out.add(rb.maybe_complete_join_phase(shard, group, now_ms))
    out.park = join_key(group.group_id, new_id)
    return out


# ------------------------------------------------------------------------------------ SyncGroup
def sync_group(shard: GroupShard, req: SyncGroupRequest, caller: Caller, now_ms: int) -> Outcome:
    if not req.group_id:
        return Outcome(SyncGroupResponse(error_code=ErrorCode.INVALID_GROUP_ID))
    group = shard.group(req.group_id)
    if group is None or group.state == EMPTY:
        return Outcome(SyncGroupResponse(error_code=ErrorCode.UNKNOWN_MEMBER_ID))
    error = group.validate_member(req.member_id, req.group_instance_id)
    if not error and req.generation_id != group.generation:
        error = ErrorCode.ILLEGAL_GENERATION
    if not error and (_inconsistent(req.protocol_type, group.protocol_type)
                      or _inconsistent(req.protocol_name, group.protocol_name)):
        error = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    if error:
        return Outcome(SyncGroupResponse(error_code=error))
    if group.state == PREPARING:
        return Outcome(SyncGroupResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS))
    member = group.members[req.member_id]
    if group.state == STABLE:
        _remove_pending_sync(shard, group, req.member_id)
        return Outcome(_sync_response(group, member.assignment))
    # CompletingRebalance: wait for the leader's assignment.
    member.awaiting_sync = True
    _remove_pending_sync(shard, group, req.member_id)
    out = Outcome(park=sync_key(group.group_id, req.member_id))
    if group.is_leader(req.member_id):
        out.add(_store_assignment(shard, group, req, now_ms))
    return out


def _inconsistent(requested: str | None, current: str | None) -> bool:
    return requested is not None and current is not None and requested != current


def _sync_response(group: ClassicGroup, assignment: bytes) -> SyncGroupResponse:
    return SyncGroupResponse(error_code=ErrorCode.NONE, protocol_type=group.protocol_type,
                             protocol_name=group.protocol_name, assignment=assignment)


def _remove_pending_sync(shard: GroupShard, group: ClassicGroup, member_id: str) -> None:
    group.pending_sync.discard(member_id)
    if not group.pending_sync:
        shard.cancel(rb.sync_timer(group.group_id, group.generation))


def _store_assignment(shard: GroupShard, group: ClassicGroup, req: SyncGroupRequest, now_ms: int) -> Outcome:
    """The leader's assignment: one GroupMetadata record; replaying it makes the group Stable. Every
    member waiting in SyncGroup gets its part (members the leader left out get an empty one)."""
    assignments = {a.member_id: bytes(a.assignment) for a in req.assignments if a.member_id in group.members}
    missing = [m for m in group.members if m not in assignments]
    if missing:
        log.warning("Setting empty assignments for members %s of %s for generation %d", missing,
                    group.group_id, group.generation)
    log.info("Assignment received from leader %s for group %s for generation %d; the group has %d members, "
             "%d of which are static", req.member_id, group.group_id, group.generation, len(group.members),
             len(group.static_members))
    out = Outcome(records=[GroupRecord(group.group_id, group.record_value(assignments, now_ms))])
    for m in group.members.values():
        if m.awaiting_sync:
            m.awaiting_sync = False
            out.completions.append((sync_key(group.group_id, m.member_id),
                                    _sync_response(group, assignments.get(m.member_id, b""))))
        # Sessions restart once the assignment is out: a member may have sat in the sync phase.
        rb.reschedule_heartbeat(shard, group, m, now_ms)
    return out


# ------------------------------------------------------------------------------------ Heartbeat
def heartbeat(shard: GroupShard, req: HeartbeatRequest, caller: Caller, now_ms: int) -> Outcome:
    if not req.group_id:
        return Outcome(HeartbeatResponse(error_code=ErrorCode.INVALID_GROUP_ID))
    group = shard.group(req.group_id)
    if group is None:
        return Outcome(HeartbeatResponse(error_code=ErrorCode.UNKNOWN_MEMBER_ID))
    error = group.validate_member(req.member_id, req.group_instance_id)
    if not error and req.generation_id != group.generation:
        error = ErrorCode.ILLEGAL_GENERATION
    if not error and group.state == EMPTY:
        error = ErrorCode.UNKNOWN_MEMBER_ID
    if error:
        return Outcome(HeartbeatResponse(error_code=error))
    rb.reschedule_heartbeat(shard, group, group.members[req.member_id], now_ms)
    if group.state == PREPARING:
        return Outcome(HeartbeatResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS))
    return Outcome(HeartbeatResponse(error_code=ErrorCode.NONE))


# ------------------------------------------------------------------------------------ LeaveGroup
def leave_group(shard: GroupShard, req: LeaveGroupRequest, caller: Caller, now_ms: int) -> Outcome:
    if caller.api_version < 3:
        identities = [(req.member_id, None, None)]
    else:
        identities = [(m.member_id, m.group_instance_id, m.reason) for m in req.members]
    if not req.group_id:
        return Outcome(LeaveGroupResponse(error_code=ErrorCode.INVALID_GROUP_ID))
    group = shard.group(req.group_id)
    if group is None:
        return Outcome(LeaveGroupResponse(error_code=ErrorCode.UNKNOWN_MEMBER_ID))
    out = Outcome()
    results: list[MemberResponse] = []
    for member_id, instance_id, reason in identities:
        code = _leave_one(shard, group, member_id, instance_id, reason, out)
        results.append(MemberResponse(member_id=member_id, group_instance_id=instance_id, error_code=code))
    left = [r.member_id or r.group_instance_id for r in results if r.error_code == ErrorCode.NONE]
    if left:
        reason = f"explicit LeaveGroup request for members {left}"
        if group.state in (STABLE, COMPLETING):
            out.add(rb.prepare_rebalance(shard, group, now_ms, reason))
        elif group.state == PREPARING:
            out.add(rb.maybe_complete_join_phase(shard, group, now_ms))
    if caller.api_version < 3:
        out.response = LeaveGroupResponse(error_code=results[0].error_code)
    else:
        out.response = LeaveGroupResponse(error_code=ErrorCode.NONE, members=results)
    return out


def _leave_one(shard: GroupShard, group: ClassicGroup, member_id: str, instance_id: str | None,
               reason: str | None, out: Outcome) -> ErrorCode:
    if member_id == "":
        # Administrative removal of a static member by its instance id (KIP-345).
        known = group.static_members.get(instance_id) if instance_id is not None else None
        if known is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        member_id = known
    elif member_id in group.pending_members:
        group.pending_members.discard(member_id)
        shard.cancel(rb.heartbeat_timer(group.group_id, member_id))
        log.info("Pending member %s has left group %s through explicit LeaveGroup request", member_id,
                 group.group_id)
        return ErrorCode.NONE
    else:
        error = group.validate_member(member_id, instance_id)
        if error:
            return error
    log.info("Member %s has left group %s through explicit LeaveGroup request; client reason: %s",
             member_id, group.group_id, reason or "not provided")
    out.add(rb.remove_member(shard, group, group.members[member_id]))
    return ErrorCode.NONE


# ------------------------------------------------------------------------------------ timers
def fire(shard: GroupShard, key: tuple, now_ms: int) -> Outcome:
    """A timer's deadline passed (the runtime calls this for each key `pop_due` returns)."""
    kind = key[0]
    if kind in CONSUMER_TIMER_KINDS:
        return consumer_heartbeat.fire(shard, key, now_ms)
    if kind == "offsets-retention":
        out, more = expire_offsets(shard, now_ms)
        shard.schedule(key, now_ms if more else now_ms + shard.config.offsets_retention_check_interval_ms)
        return out
    group = shard.group(key[1])
    if group is None:
        return Outcome()
    if kind == "heartbeat":
        return rb.expire_heartbeat(shard, group, key[2], now_ms)
    if kind == "join":
        return rb.on_join_timer(shard, group, now_ms)
    if kind == "sync":
        return rb.expire_pending_sync(shard, group, key[2], now_ms)
    raise AssertionError(f"unknown timer {key!r}")
