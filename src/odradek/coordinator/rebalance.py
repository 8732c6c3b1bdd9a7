"""The rebalance of a classic group: preparing, completing the join phase, the timers that bound
each phase, and removing members (seed 004, "Join Group Request": "When new members join an
existing group, all previous members are required to rejoin"; seed 000, JoinGroup/SyncGroup;
Kafka's GroupCoordinator, whose behaviour and log lines these follow).

Timers (keys in `GroupShard.timers`):

    ("heartbeat", group, member)   session timeout (a new member's first join: 5 minutes; a pending
                                   member id from MEMBER_ID_REQUIRED: the session timeout)
    ("join", group)                the join phase's end: rebalance timeout, or the initial delay
                                   (group.initial.rebalance.delay.ms) of an empty group's first rebalance
    ("sync", group, generation)    members that do not send SyncGroup within the rebalance timeout
                                   after the join phase are removed
    ("offsets-retention",)         the periodic offset expiry (see `offsets.expire_offsets`)

Every function takes the shard, the group and `now_ms` and returns an `Outcome`.
"""

from __future__ import annotations

import logging

from odradek.coordinator.group import ClassicGroup, GroupState, Member
from odradek.coordinator.records import GroupRecord
from odradek.coordinator.shard import GroupShard, Outcome, join_key, sync_key
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages.join_group import JoinGroupResponse, JoinGroupResponseMember
from odradek.protocol.messages.sync_group import SyncGroupResponse

log = logging.getLogger("odradek.coordinator")

PREPARING = GroupState.PREPARING_REBALANCE
COMPLETING = GroupState.COMPLETING_REBALANCE
STABLE = GroupState.STABLE
EMPTY = GroupState.EMPTY


def heartbeat_timer(group_id: str, member_id: str) -> tuple:
    return ("heartbeat", group_id, member_id)


def join_timer(group_id: str) -> tuple:
    return ("join", group_id)


def sync_timer(group_id: str, generation: int) -> tuple:
    return ("sync", group_id, generation)


def join_response(group: ClassicGroup, member_id: str, *, with_members: bool = False,
                  skip_assignment: bool = False, leader: str | None = None) -> JoinGroupResponse:
    members = []
    if with_members:
        members = [JoinGroupResponseMember(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                           metadata=m.metadata(group.protocol_name))
                   for m in group.members.values()]
    return JoinGroupResponse(
        error_code=ErrorCode.NONE, generation_id=group.generation, protocol_type=group.protocol_type,
        protocol_name=group.protocol_name, leader=leader if leader is not None else (group.leader_id or ""),
        skip_assignment=skip_assignment, member_id=member_id, members=members)


def join_error(code: ErrorCode, member_id: str = "") -> JoinGroupResponse:
    return JoinGroupResponse(error_code=code, generation_id=-1, protocol_type=None, protocol_name=None,
                             leader="", member_id=member_id, members=[])


def reschedule_heartbeat(shard: GroupShard, group: ClassicGroup, member: Member, now_ms: int,
                         timeout_ms: int | None = None) -> None:
    timeout = member.session_timeout_ms if timeout_ms is None else timeout_ms
    shard.schedule(heartbeat_timer(group.group_id, member.member_id), now_ms + timeout)


# ------------------------------------------------------------------------------------ join phase
def maybe_prepare_rebalance_or_complete_join(shard: GroupShard, group: ClassicGroup, now_ms: int,
                                             reason: str) -> Outcome:
    if group.state in (STABLE, COMPLETING, EMPTY):
        return prepare_rebalance(shard, group, now_ms, reason)
    return maybe_complete_join_phase(shard, group, now_ms)


def prepare_rebalance(shard: GroupShard, group: ClassicGroup, now_ms: int, reason: str) -> Outcome:
    out = Outcome()
    if group.state == COMPLETING:
        out.add(reset_and_propagate_error(group, ErrorCode.REBALANCE_IN_PROGRESS))
    shard.cancel(sync_timer(group.group_id, group.generation))
    initial = group.state == EMPTY
    if initial:
        # A new group: give more members the chance to join before the first generation.
        delay = shard.config.initial_rebalance_delay_ms
        group.initial_delay = (delay, max(group.rebalance_timeout_ms() - delay, 0))
        group.new_member_added = False
        shard.schedule(join_timer(group.group_id), now_ms + delay)
    log.info("Preparing to rebalance group %s in state %s with old generation %d (reason: %s)",
             group.group_id, group.state.value, group.generation, reason)
    group.transition(PREPARING, now_ms)
    if not initial:
        out.add(maybe_complete_join_else_schedule(shard, group, now_ms))
    return out


def maybe_complete_join_else_schedule(shard: GroupShard, group: ClassicGroup, now_ms: int) -> Outcome:
    if group.has_all_members_joined():
        return complete_join(shard, group, now_ms)
    shard.schedule(join_timer(group.group_id), now_ms + group.rebalance_timeout_ms())
    return Outcome()


def maybe_complete_join_phase(shard: GroupShard, group: ClassicGroup, now_ms: int) -> Outcome:
    # The first rebalance of an empty group always waits for its initial delay.
    if group.state == PREPARING and group.has_all_members_joined() and group.previous_state != EMPTY:
        return complete_join(shard, group, now_ms)
    return Outcome()


def on_join_timer(shard: GroupShard, group: ClassicGroup, now_ms: int) -> Outcome:
    if group.state != PREPARING:
        return Outcome()
    if group.initial_delay is not None:
        delay, remaining = group.initial_delay
        if group.new_member_added and remaining != 0:
            # Members keep arriving: wait once more, but never past the rebalance timeout.
            group.new_member_added = False
            new_delay = min(shard.config.initial_rebalance_delay_ms, remaining)
            group.initial_delay = (new_delay, max(remaining - delay, 0))
            shard.schedule(join_timer(group.group_id), now_ms + new_delay)
            return Outcome()
    return complete_join(shard, group, now_ms)


def complete_join(shard: GroupShard, group: ClassicGroup, now_ms: int) -> Outcome:
    """End the join phase: drop dynamic members that did not rejoin, start the next generation and
    answer every parked JoinGroup (the leader gets all members' metadata)."""
    shard.cancel(join_timer(group.group_id))
    group.initial_delay = None
    out = Outcome()
    if group.state != PREPARING:
        return out
    gone = [m for m in group.members.values() if not m.awaiting_join and m.group_instance_id is None]
    for m in gone:
        group.remove(m.member_id)
        shard.cancel(heartbeat_timer(group.group_id, m.member_id))
    if gone:
        log.info("Group %s removed dynamic members who haven't joined: %s", group.group_id,
                 [m.member_id for m in gone])
    if group.members and not group.maybe_elect_new_joined_leader():
        # Only static members that have not rejoined: wait until their sessions expire.
        log.error("Group %s could not complete rebalance because no members rejoined", group.group_id)
        shard.schedule(join_timer(group.group_id), now_ms + group.rebalance_timeout_ms())
        return out
    group.init_next_generation(now_ms)
    if group.state == EMPTY:
        log.info("Group %s with generation %d is now empty", group.group_id, group.generation)
        out.records.append(GroupRecord(group.group_id, group.record_value({}, now_ms)))
        return out
    log.info("Stabilized group %s generation %d with %d members (protocol %s)", group.group_id,
             group.generation, len(group.members), group.protocol_name)
    for m in group.members.values():
        if m.awaiting_join:
            response = join_response(group, m.member_id, with_members=group.is_leader(m.member_id))
            out.completions.append((join_key(group.group_id, m.member_id), response))
            m.awaiting_join = False
        reschedule_heartbeat(shard, group, m, now_ms)
        m.is_new = False
        group.pending_sync.add(m.member_id)
    shard.schedule(sync_timer(group.group_id, group.generation), now_ms + group.rebalance_timeout_ms())
    return out


# ------------------------------------------------------------------------------------ sync phase
def reset_and_propagate_error(group: ClassicGroup, code: ErrorCode) -> Outcome:
    """A new rebalance cuts the sync phase short: waiting SyncGroups get `code`."""
    out = Outcome()
    for m in group.members.values():
        m.assignment = b""
        if m.awaiting_sync:
            m.awaiting_sync = False
            out.completions.append((sync_key(group.group_id, m.member_id), SyncGroupResponse(error_code=code)))
    return out


def expire_pending_sync(shard: GroupShard, group: ClassicGroup, generation: int, now_ms: int) -> Outcome:
    if generation != group.generation or group.state not in (COMPLETING, STABLE) or not group.pending_sync:
        return Outcome()
    missing = sorted(group.pending_sync)
    for member_id in missing:
        group.remove(member_id)
        shard.cancel(heartbeat_timer(group.group_id, member_id))
    log.info("Group %s removed members %s who haven't sent their sync requests", group.group_id, missing)
    return prepare_rebalance(shard, group, now_ms, f"removing {missing} on pending sync request expiration")


# ------------------------------------------------------------------------------------ members
def remove_member(shard: GroupShard, group: ClassicGroup, member: Member) -> Outcome:
    """Take a member out, answering its parked requests with UNKNOWN_MEMBER_ID (so a live client
    rejoins). The caller decides what the group does next."""
    out = Outcome()
    if member.awaiting_join:
        out.completions.append((join_key(group.group_id, member.member_id),
                                join_error(ErrorCode.UNKNOWN_MEMBER_ID)))
    if member.awaiting_sync:
        out.completions.append((sync_key(group.group_id, member.member_id),
                                SyncGroupResponse(error_code=ErrorCode.UNKNOWN_MEMBER_ID)))
    group.remove(member.member_id)
    shard.cancel(heartbeat_timer(group.group_id, member.member_id))
    return out


def remove_member_and_rebalance(shard: GroupShard, group: ClassicGroup, member: Member, now_ms: int,
                                reason: str) -> Outcome:
    out = remove_member(shard, group, member)
    if group.state in (STABLE, COMPLETING):
        return out.add(prepare_rebalance(shard, group, now_ms, reason))
    if group.state == PREPARING:
        return out.add(maybe_complete_join_phase(shard, group, now_ms))
    return out


def expire_heartbeat(shard: GroupShard, group: ClassicGroup, member_id: str, now_ms: int) -> Outcome:
    if member_id in group.pending_members:
        log.info("Pending member %s in group %s has been removed after session timeout expiration",
                 member_id, group.group_id)
        group.pending_members.discard(member_id)
        return maybe_complete_join_phase(shard, group, now_ms)
    member = group.members.get(member_id)
    if member is None:
        return Outcome()
    # Members in the middle of a rebalance owe no heartbeat, except new ones (their join may be stale).
    if not member.is_new and (member.awaiting_join or member.awaiting_sync):
        return Outcome()
    log.info("Member %s in group %s has failed, removing it from the group", member_id, group.group_id)
    return remove_member_and_rebalance(shard, group, member, now_ms,
                                       f"removing member {member_id} on heartbeat expiration")
