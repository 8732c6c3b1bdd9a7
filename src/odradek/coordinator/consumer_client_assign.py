"""Client-side assignors of the consumer group protocol: the seed's design that Apache Kafka never
shipped, as an odradek extension behind `group.consumer.client.assignors.enable` (seed 002, KIP-848's
draft: "Client-side assignors", the heartbeat's ClientAssignors, ConsumerGroupPrepareAssignment and
ConsumerGroupInstallAssignment; docs/extensions.md has the wire format).

Selection (the seed's "Assignor Selection"): a client-side assignor is used when every member of the
group supports it with overlapping metadata versions; among several, the one the members rank best
(the lowest sum of its positions in their lists, then the name); the version is the highest every
member reads. Otherwise (a member without client assignors, such as librdkafka or a classic member,
or the setting off) the server-side assignor computes the target as usual (`consumer_heartbeat`).

Election: when the group epoch is ahead of the target assignment epoch and a client-side assignor is
selected, the coordinator does not compute a target itself. It elects the member whose heartbeat
found the group so (again when the elected one left, or did not install within its rebalance timeout)
and sets `should_compute_assignment` in that member's heartbeat answers. Meanwhile the members keep
reconciling towards the previous target; a member that joined gets no partitions until an assignment
is installed (and member epoch 0 when the group never had one).

The elected member asks ConsumerGroupPrepareAssignment for the group epoch, the assignor and version,
every member's subscribed topic ids, its metadata for that assignor and its current target, and the
subscribed topics; it runs the assignor and sends ConsumerGroupInstallAssignment with the group epoch
it prepared for. The coordinator checks the member and its epoch (UNKNOWN_MEMBER_ID,
FENCED_MEMBER_EPOCH), that it is the elected one and the group epoch is newer than the installed
target and not newer than the group's (ILLEGAL_GENERATION otherwise: the assignment is stale), and
the assignment itself: known members, existing partitions of topics each member subscribes to, no
partition twice (INVALID_REQUEST; the seed's INVALID_ASSIGNMENT is not a Kafka error code). A valid
assignment becomes the target at that epoch (even when the group epoch moved on meanwhile, so the
group always progresses, as the seed asks; the next heartbeat then elects again). An assignment whose
`error` is non-zero (the member's assignor failed) makes the coordinator compute the target with its
server-side assignor instead.

The election is soft state (`GroupShard.client_elections`): after a coordinator failover the next
heartbeat elects again. The targets are durable as any target is (TargetAssignmentMember records,
with the metadata the assignor gave each member, delivered with the member's assignment); the target
epoch record names the client-side assignor that computed it, which ConsumerGroupDescribe reports.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from odradek.coordinator.consumer_group import ConsumerGroup, ConsumerMember, TopicsView
from odradek.coordinator.consumer_records import (
    ClientAssignor, Partitions, TargetEpochRecord, TargetMemberRecord, partitions_of,
)
from odradek.coordinator.shard import GroupShard, Outcome
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import consumer_group_heartbeat as cgh
from odradek.protocol.messages import consumer_group_install_assignment as cgi
from odradek.protocol.messages import consumer_group_prepare_assignment as cgp

log = logging.getLogger("odradek.coordinator")

MAX_CLIENT_ASSIGNORS = 64           # per member; a longer list is INVALID_REQUEST


@dataclass
class Election:
    """The member elected to compute the group's next target with a client-side assignor."""
    member_id: str
    assignor: str
    version: int
    deadline_ms: int
    prepared_epoch: int | None = None   # the group epoch PrepareAssignment handed out


class Refused(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def enabled(shard: GroupShard) -> bool:
    return shard.config.consumer_client_assignors_enable


# ------------------------------------------------------------------------------------------ heartbeat hooks
def validate(assignors: list[cgh.ClientAssignor] | None) -> str | None:
    """Why the heartbeat's ClientAssignors are invalid, or None."""
    if assignors is None:
        return None
    if len(assignors) > MAX_CLIENT_ASSIGNORS:
        return f"ClientAssignors has more than {MAX_CLIENT_ASSIGNORS} entries."
    names = set()
    for a in assignors:
        if not a.name:
            return "ClientAssignors names can't be empty."
        if a.name in names:
            return f"ClientAssignors names {a.name} twice."
        names.add(a.name)
        if not 0 <= a.minimum_version <= a.maximum_version:
            return f"ClientAssignor {a.name} has an invalid version range {a.minimum_version}-{a.maximum_version}."
    return None


def from_request(assignors: list[cgh.ClientAssignor]) -> tuple[ClientAssignor, ...]:
    return tuple(ClientAssignor(a.name, a.minimum_version, a.maximum_version, a.reason, a.version,
                                bytes(a.metadata)) for a in assignors)


def select(members: Mapping[str, ConsumerMember]) -> tuple[str, int] | None:
    """(assignor name, metadata version) every member supports, or None: the server-side assignor."""
    if not members:
        return None
    ranks: dict[str, int] = {}
    low: dict[str, int] = {}
    high: dict[str, int] = {}
    common: set[str] | None = None
    for m in members.values():
        mine = m.subscription.client_assignors
        if not mine:
            return None
        common = {a.name for a in mine} if common is None else common & {a.name for a in mine}
        for i, a in enumerate(mine):
            ranks[a.name] = ranks.get(a.name, 0) + i
            low[a.name] = max(low.get(a.name, a.minimum_version), a.minimum_version)
            high[a.name] = min(high.get(a.name, a.maximum_version), a.maximum_version)
    usable = sorted((ranks[n], n) for n in (common or ()) if low[n] <= high[n])
    if not usable:
        return None
    name = usable[0][1]
    return name, high[name]


def defer_target(shard: GroupShard, group: ConsumerGroup, members: Mapping[str, ConsumerMember], member_id: str,
                 now_ms: int) -> bool:
    """Called when the group needs a new target: True when a client-side assignor computes it (a member
    is elected, or stays elected), False when the server-side assignor must compute it now."""
    gid = group.group_id
    chosen = select(members) if enabled(shard) else None
    if chosen is None:
        shard.client_elections.pop(gid, None)
        return False
    e = shard.client_elections.get(gid)
    if e is None or e.member_id not in members or now_ms >= e.deadline_ms or (e.assignor, e.version) != chosen:
        if e is not None and e.member_id in members and now_ms >= e.deadline_ms:
            log.info("group %s: member %s did not install an assignment in time; electing another", gid,
                     e.member_id)
        timeout = members[member_id].subscription.rebalance_timeout_ms
        deadline = now_ms + (timeout if timeout > 0 else shard.config.consumer_session_timeout_ms)
        shard.client_elections[gid] = Election(member_id, chosen[0], chosen[1], deadline)
        log.info("group %s: member %s is elected to compute the assignment with the client-side assignor %r "
                 "(version %d)", gid, member_id, chosen[0], chosen[1])
    return True


def elected(shard: GroupShard, group_id: str, member_id: str) -> bool:
    e = shard.client_elections.get(group_id)
    return e is not None and e.member_id == member_id


def forget(shard: GroupShard, group_id: str, member_id: str | None = None) -> None:
    """Drop the group's election (only when `member_id` is the elected one, if given)."""
    if member_id is None or elected(shard, group_id, member_id):
        shard.client_elections.pop(group_id, None)


# ------------------------------------------------------------------------------------------ prepare
def _member_for(shard: GroupShard, group_id: str, member_id: str, member_epoch: int
                ) -> tuple[ConsumerGroup, ConsumerMember, Election]:
    group = shard.consumer_groups.get(group_id)
    if group is None:
        raise Refused(ErrorCode.GROUP_ID_NOT_FOUND, f"Consumer group {group_id} not found.")
    member = group.members.get(member_id)
    if member is None:
        raise Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {group_id}.")
    if member_epoch != member.member_epoch:
        raise Refused(ErrorCode.FENCED_MEMBER_EPOCH, f"The member epoch {member_epoch} is not the member's "
                      f"epoch {member.member_epoch}.")
    e = shard.client_elections.get(group_id)
    if e is None or e.member_id != member_id:
        raise Refused(ErrorCode.INVALID_REQUEST, f"Member {member_id} is not elected to compute the assignment "
                      f"of group {group_id}.")
    return group, member, e


def _assignor_of(member: ConsumerMember, name: str) -> ClientAssignor | None:
    return next((a for a in member.subscription.client_assignors if a.name == name), None)


def _tps(cls: type, parts: Partitions) -> list:
    return [cls(topic_id=t, partitions=sorted(ps)) for t, ps in sorted(parts.items(), key=lambda kv: str(kv[0]))]


def prepare(shard: GroupShard, req: cgp.ConsumerGroupPrepareAssignmentRequest, topics: TopicsView,
            now_ms: int) -> Outcome:
    try:
        group, _, e = _member_for(shard, req.group_id, req.member_id, req.member_epoch)
    except Refused as r:
        return Outcome(cgp.ConsumerGroupPrepareAssignmentResponse(error_code=r.code, error_message=r.message))
    e.prepared_epoch = group.group_epoch
    metadata = group.subscription_metadata
    members = []
    for m in sorted(group.members.values(), key=lambda m: m.member_id):
        a = _assignor_of(m, e.assignor)
        ids = sorted((metadata[n].topic_id for n in m.subscribed_names(topics, group.regexes) if n in metadata),
                     key=str)
        members.append(cgp.Member(
            member_id=m.member_id, member_epoch=m.member_epoch, instance_id=m.instance_id,
            rack_id=m.subscription.rack_id, subscribed_topic_ids=ids,
            assignor_version=a.version if a is not None else -1, assignor_reason=a.reason if a is not None else 0,
            assignor_metadata=a.metadata if a is not None else b"",
            topic_partitions=_tps(cgp.TopicPartitions, group.target.get(m.member_id, {}))))
    log.info("group %s: member %s prepares the assignment of epoch %d", group.group_id, req.member_id,
             group.group_epoch)
    return Outcome(cgp.ConsumerGroupPrepareAssignmentResponse(
        error_code=ErrorCode.NONE, group_epoch=group.group_epoch, assignor_name=e.assignor,
        assignor_version=e.version, members=members,
        topics=[cgp.TopicMetadata(topic_id=meta.topic_id, topic_name=name, num_partitions=meta.num_partitions)
                for name, meta in sorted(metadata.items())]))


# ------------------------------------------------------------------------------------------ install
def _check_assignment(group: ConsumerGroup, members: list[cgi.Member], topics: TopicsView
                      ) -> dict[str, tuple[Partitions, tuple[int, bytes] | None]]:
    by_id = {meta.topic_id: (name, meta.num_partitions) for name, meta in group.subscription_metadata.items()}
    seen: dict[tuple[uuid.UUID, int], str] = {}
    out: dict[str, tuple[Partitions, tuple[int, bytes] | None]] = {}
    for m in members:
        member = group.members.get(m.member_id)
        if member is None:
            raise Refused(ErrorCode.INVALID_REQUEST, f"The assignment names {m.member_id}, not a member.")
        if m.member_id in out:
            raise Refused(ErrorCode.INVALID_REQUEST, f"The assignment names {m.member_id} twice.")
        subscribed = member.subscribed_names(topics, group.regexes)
        for tp in m.topic_partitions:
            topic = by_id.get(tp.topic_id)
            if topic is None:
                raise Refused(ErrorCode.INVALID_REQUEST, f"Topic id {tp.topic_id} is not subscribed by the group.")
            name, count = topic
            if name not in subscribed:
                raise Refused(ErrorCode.INVALID_REQUEST, f"Member {m.member_id} does not subscribe to {name}.")
            for p in tp.partitions:
                if not 0 <= p < count:
                    raise Refused(ErrorCode.INVALID_REQUEST, f"Partition {name}-{p} does not exist.")
                if (tp.topic_id, p) in seen:
                    raise Refused(ErrorCode.INVALID_REQUEST, f"Partition {name}-{p} is assigned to "
                                  f"{seen[(tp.topic_id, p)]} and {m.member_id}.")
                seen[(tp.topic_id, p)] = m.member_id
        metadata = None if m.metadata_version < 0 and not m.metadata_bytes else \
            (m.metadata_version, bytes(m.metadata_bytes))
        out[m.member_id] = (partitions_of((tp.topic_id, tp.partitions) for tp in m.topic_partitions), metadata)
    return out


def install(shard: GroupShard, req: cgi.ConsumerGroupInstallAssignmentRequest, topics: TopicsView,
            now_ms: int) -> Outcome:
    def answer(code: ErrorCode, message: str | None = None) -> cgi.ConsumerGroupInstallAssignmentResponse:
        return cgi.ConsumerGroupInstallAssignmentResponse(error_code=code, error_message=message)
    try:
        group, _, e = _member_for(shard, req.group_id, req.member_id, req.member_epoch)
        gid = group.group_id
        if not group.assignment_epoch < req.group_epoch <= group.group_epoch:
            raise Refused(ErrorCode.ILLEGAL_GENERATION, f"The assignment for group epoch {req.group_epoch} is stale: "
                          f"the group epoch is {group.group_epoch}, the target's {group.assignment_epoch}.")
        if req.error != 0:
            log.warning("group %s: the client-side assignor %r of member %s failed (error %d); the server-side "
                        "assignor computes the target", gid, e.assignor, req.member_id, req.error)
            from odradek.coordinator import consumer_heartbeat   # it imports this module
            target = consumer_heartbeat.compute_target(shard, gid, group.group_epoch, group.members,
                                                       group.subscription_metadata, topics, group.target,
                                                       group.regexes)
            installed: dict[str, tuple[Partitions, tuple[int, bytes] | None]] = \
                {m: (parts, None) for m, parts in target.items()}
            epoch, assignor = group.group_epoch, None
        else:
            installed = _check_assignment(group, req.members, topics)
            epoch, assignor = req.group_epoch, e.assignor
    except Refused as r:
        log.info("group %s: install of member %s refused: %s %s", req.group_id, req.member_id, r.code.name, r.message)
        return Outcome(answer(r.code, r.message))
    records: list = []
    for member_id in sorted(group.members):
        parts, metadata = installed.get(member_id, ({}, None))
        if group.target.get(member_id) != parts or group.target_metadata.get(member_id) != metadata \
                or member_id not in group.target:
            records.append(TargetMemberRecord(gid, member_id, parts, metadata))
    records.append(TargetEpochRecord(gid, epoch, assignor))
    forget(shard, gid)
    log.info("group %s: member %s installed the target assignment of epoch %d (%d members, %d partitions)", gid,
             req.member_id, epoch, len(installed), sum(len(ps) for parts, _ in installed.values()
                                                        for ps in parts.values()))
    return Outcome(answer(ErrorCode.NONE), records=records)
