"""Client-side assignors for the consumer group protocol (`group.protocol=consumer`): seed 002's
design that Apache Kafka never shipped, an odradek extension (docs/extensions.md). Pure: no I/O.

`group.local.assignors` (KIP-848 draft's name) lists them, in order of preference: names of the
built-in ones (`sticky`) or objects with this interface:

    name: str                              unique name
    minimum_version, maximum_version: int  the metadata versions it reads
    metadata() -> AssignorMetadata         what this member tells the assignor (reason, version, bytes)
    assign(group: GroupSpec) -> {member id: [TopicPartition] | MemberAssignment}
    on_assignment(partitions, metadata_version, metadata)   optional: this member's share arrived

The member declares them in every joining heartbeat (and when their metadata changes). A broker with
`group.consumer.client.assignors.enable=true` uses one when every member of the group supports it,
elects one member to run it (ConsumerGroupPrepareAssignment gives it the group, InstallAssignment
takes the result) and reconciles the members towards it as towards any target: revocations first,
so the assignor need not withhold partitions that change owners. Otherwise the broker's server-side
assignor assigns, so a group keeps working whoever joins it.

`sticky` keeps every partition with its current target owner where the balance allows, and balances
to floor or ceil of partitions/members with equal subscriptions (the same algorithm as the classic
protocol's cooperative-sticky, without its withholding).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from odradek.client.assignors import Subscription, assignors_named, sticky_assign
from odradek.client.errors import ConfigError
from odradek.client.fetcher import TopicPartition

__all__ = ["AssignorMetadata", "GroupMember", "GroupSpec", "MemberAssignment", "StickyGroupAssignor",
           "group_assignors_from_config"]

ASSIGNOR_FAILED = 1        # InstallAssignment's error when the assignor raised


@dataclass(frozen=True)
class AssignorMetadata:
    reason: int = 0
    version: int = 0
    metadata: bytes = b""


@dataclass(frozen=True)
class GroupMember:
    """A member as the elected assignor sees it."""
    member_id: str
    instance_id: str | None
    rack_id: str | None
    topics: frozenset[str]                    # subscribed topics that exist
    target: frozenset[TopicPartition]         # its current target assignment
    metadata: AssignorMetadata = field(default_factory=AssignorMetadata)


@dataclass(frozen=True)
class GroupSpec:
    group_epoch: int
    version: int                              # the metadata version every member reads
    members: dict[str, GroupMember]
    partitions_per_topic: dict[str, int]


@dataclass(frozen=True)
class MemberAssignment:
    partitions: list[TopicPartition]
    metadata_version: int = -1
    metadata: bytes = b""


class StickyGroupAssignor:
    name = "sticky"
    minimum_version = 0
    maximum_version = 0

    def metadata(self) -> AssignorMetadata:
        return AssignorMetadata()

    def assign(self, group: GroupSpec) -> dict[str, list[TopicPartition]]:
        subs = {m.member_id: Subscription(topics=tuple(sorted(m.topics)), owned_partitions=tuple(sorted(m.target)),
                                          generation_id=group.group_epoch, group_instance_id=m.instance_id,
                                          rack_id=m.rack_id)
                for m in group.members.values()}
        out = sticky_assign(group.partitions_per_topic, subs)
        return {m: out.get(m, []) for m in group.members}


_BY_NAME = {"sticky": StickyGroupAssignor}


def group_assignors_from_config(value) -> list:
    """group.local.assignors: None, a comma-separated string, or a list of names or assignor objects."""
    if value is None:
        return []
    out = assignors_named(value, "group.local.assignors", _BY_NAME,
                          ("name", "assign", "metadata", "minimum_version", "maximum_version"))
    for a in out:
        if not 0 <= a.minimum_version <= a.maximum_version <= 0x7FFF:
            raise ConfigError(f"group.local.assignors: {a.name} has an invalid version range")
    return out


def normalise(result: dict, members: Iterable[str]) -> dict[str, MemberAssignment]:
    """An assignor's answer as a MemberAssignment per member (members it left out get nothing)."""
    out = {}
    for m in members:
        share = result.get(m, [])
        out[m] = share if isinstance(share, MemberAssignment) else MemberAssignment(list(share))
    unknown = set(result) - set(out)
    if unknown:
        raise ValueError(f"the assignor assigned to members not in the group: {sorted(unknown)}")
    return out
