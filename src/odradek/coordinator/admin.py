"""Group administration: ListGroups, DescribeGroups and DeleteGroups (seed 000 and seed 004,
"Administrative API": ListGroups answers for the groups this coordinator manages; DescribeGroups gives
each member's metadata and assignment once the group is Stable).
"""

from __future__ import annotations

import logging

from odradek.coordinator.group import GroupState
from odradek.coordinator.records import GroupRecord, OffsetRecord, Record
from odradek.coordinator.shard import GroupShard, Outcome
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages.describe_groups import DescribedGroup, DescribedGroupMember
from odradek.protocol.messages.list_groups import ListedGroup

log = logging.getLogger("odradek.coordinator")

CLASSIC_GROUP_TYPE = "classic"
# AclOperation codes a group supports (READ 3, DELETE 6, DESCRIBE 8), as a bit field: without an
# authorizer every one is allowed.
GROUP_AUTHORIZED_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8)
AUTHORIZED_OPERATIONS_OMITTED = -(1 << 31)


def list_groups(shard: GroupShard, states: set[str], types: set[str]) -> list[ListedGroup]:
    """`states` and `types` are lower-cased filters; empty means all."""
    if types and CLASSIC_GROUP_TYPE not in types:
        return []
    out = []
    for gid, g in sorted(shard.groups.items()):
        if g.state == GroupState.DEAD or (states and g.state.value.lower() not in states):
            continue
        if gid in shard.consumer_groups:
            continue   # the offsets of a consumer group (listed by consumer_admin)
        out.append(ListedGroup(group_id=gid, protocol_type=g.protocol_type or "", group_state=g.state.value,
                               group_type=CLASSIC_GROUP_TYPE))
    return out


def describe_group(shard: GroupShard, group_id: str, include_authorized_operations: bool) -> DescribedGroup:
    g = shard.group(group_id)
    ops = GROUP_AUTHORIZED_OPERATIONS if include_authorized_operations else AUTHORIZED_OPERATIONS_OMITTED
    if g is None:
        return DescribedGroup(error_code=ErrorCode.NONE, group_id=group_id, group_state=GroupState.DEAD.value,
                              protocol_type="", protocol_data="", members=[], authorized_operations=ops)
    stable = g.state == GroupState.STABLE
    members = [DescribedGroupMember(
        member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
        client_host=m.client_host, member_metadata=m.metadata(g.protocol_name) if stable else b"",
        member_assignment=m.assignment if stable else b"") for m in g.members.values()]
    return DescribedGroup(error_code=ErrorCode.NONE, group_id=group_id, group_state=g.state.value,
                          protocol_type=g.protocol_type or "",
                          protocol_data=(g.protocol_name or "") if stable else "",
                          members=members, authorized_operations=ops)


def delete_group(shard: GroupShard, group_id: str, now_ms: int) -> Outcome:
    """Response: the group's error code. Tombstones for its offsets and its metadata."""
    g = shard.group(group_id)
    if g is None:
        return Outcome(ErrorCode.GROUP_ID_NOT_FOUND)
    if g.state != GroupState.EMPTY:
        return Outcome(ErrorCode.NON_EMPTY_GROUP)
    records: list[Record] = [OffsetRecord(group_id, topic, partition, None) for topic, partition in sorted(g.offsets)]
    records.append(GroupRecord(group_id, None))
    log.info("Deleting group %s with %d committed offsets", group_id, len(g.offsets))
    return Outcome(ErrorCode.NONE, records=records)
