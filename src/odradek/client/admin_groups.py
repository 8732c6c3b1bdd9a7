"""The admin client's group calls: list, describe and delete groups; read, alter and delete their
committed offsets (ListGroups, DescribeGroups, DeleteGroups, OffsetFetch, OffsetCommit, OffsetDelete).

Every group call but ListGroups goes to the group's coordinator, found with FindCoordinator and cached
until the coordinator says NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE; COORDINATOR_LOAD_IN_PROGRESS
and those two are retried, as the Java AdminClient does. ListGroups asks every broker, since each
lists only the groups it coordinates.

Altering offsets commits them as an admin (generation -1, no member id): the coordinator accepts that
only while the group has no members (Kafka: UNKNOWN_MEMBER_ID otherwise, surfaced as an AdminError).
OffsetFetch and OffsetCommit v10 name topics by id; ids are looked up in the metadata and mapped back.
"""

from __future__ import annotations

from odradek.client.admin_types import (
    AdminError, ConsumerGroupDescription, ConsumerGroupMember, GroupDescription, GroupListing, MemberDescription,
    OffsetAndMetadata, Retry, raise_first,
)
from odradek.client.fetcher import TopicPartition
from odradek.protocol.api import decode_record
from odradek.protocol.codec import ZERO_UUID
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.exceptions import ProtocolError
from odradek.protocol.messages import consumer_group_describe as cgd
from odradek.protocol.messages import delete_groups as dg
from odradek.protocol.messages import describe_groups as dsg
from odradek.protocol.messages import find_coordinator as fc
from odradek.protocol.messages import list_groups as lg
from odradek.protocol.messages import offset_commit as oc
from odradek.protocol.messages import offset_delete as od
from odradek.protocol.messages import offset_fetch as of

GROUP_KEY_TYPE = 0
_MOVED = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
_RETRY = _MOVED | {ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.UNSTABLE_OFFSET_COMMIT,
                   ErrorCode.REBALANCE_IN_PROGRESS}


def decode_assignment(protocol_type: str, data) -> list[TopicPartition]:
    """A member's partitions, when the group speaks the "consumer" protocol (else none)."""
    if protocol_type != "consumer" or not data:
        return []
    try:
        _, a = decode_record("ConsumerProtocolAssignment", bytes(data))
    except ProtocolError:
        return []
    return sorted(TopicPartition(t.topic, p) for t in a.assigned_partitions for p in t.partitions)


class GroupAdminMixin:
    """Mixed into `Admin`; uses its `_request`, `_retrying`, `_metadata` and `_any_node`."""

    # ------------------------------------------------------------------------------------ coordinator
    async def find_coordinator(self, group_id: str) -> int:
        """The node id of the group's coordinator."""
        cached = self._coordinators.get(group_id)
        if cached is not None and cached in self.cluster.metadata.brokers:
            return cached

        def build_request(v):
            if v >= 4:
                return fc.FindCoordinatorRequest(key_type=GROUP_KEY_TYPE, coordinator_keys=[group_id])
            return fc.FindCoordinatorRequest(key=group_id, key_type=GROUP_KEY_TYPE)
        response, v = await self._request(self._any_node(), 10, build_request)
        c = response.coordinators[0] if v >= 4 else response
        if c.error_code in _RETRY:
            raise Retry(f"FindCoordinator {group_id!r}: {ErrorCode(c.error_code).name}", refresh=False)
        if c.error_code:
            raise AdminError(c.error_code, c.error_message if v >= 1 else None, f"group {group_id!r}")
        brokers = self.cluster.metadata.brokers
        if c.node_id not in brokers or brokers[c.node_id][:2] != (c.host, c.port):
            brokers[c.node_id] = (c.host, c.port, None)
        self._coordinators[group_id] = c.node_id
        return c.node_id

    def _group_error(self, group_id: str, code: int, message: str | None = None):
        """None for success; raises Retry for coordinator moves; else the AdminError to report."""
        if not code:
            return None
        if code in _MOVED:
            self._coordinators.pop(group_id, None)
        if code in _RETRY:
            raise Retry(f"group {group_id!r}: {ErrorCode(code).name}", refresh=False)
        return AdminError(code, message, f"group {group_id!r}")

    async def _by_coordinator(self, group_ids) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for g in group_ids:
            out.setdefault(await self.find_coordinator(g), []).append(g)
        return out

    # ------------------------------------------------------------------------------------ groups
    async def list_groups(self, *, states=None, types=None) -> list[GroupListing]:
        """Every group of every broker (`states`, `types`: filters, where the broker supports them)."""
        async def attempt():
            await self._metadata([])
            found: dict[str, GroupListing] = {}
            for node in sorted(self.cluster.metadata.brokers):
                def build_request(v):
                    return lg.ListGroupsRequest(states_filter=list(states or []), types_filter=list(types or []))
                response, v = await self._request(node, 16, build_request)
                err = self._group_error("", response.error_code)
                if err is not None:
                    raise AdminError(response.error_code, None, f"broker {node}")
                for g in response.groups:
                    listing = GroupListing(g.group_id, g.protocol_type, g.group_state if v >= 4 else None,
                                           g.group_type if v >= 5 else None)
                    if states and v < 4 or types and v < 5:
                        continue  # the broker cannot filter; without a state we cannot either
                    found[g.group_id] = listing
            return [found[g] for g in sorted(found)]
        return await self._retrying("ListGroups", attempt)

    async def describe_groups(self, group_ids) -> dict[str, GroupDescription]:
        ids = list(group_ids)

        async def attempt():
            results: dict = {g: None for g in ids}
            for node, groups in (await self._by_coordinator(ids)).items():
                response, v = await self._request(node, 15, lambda v: dsg.DescribeGroupsRequest(groups=groups))
                for g in response.groups:
                    err = self._group_error(g.group_id, g.error_code, g.error_message if v >= 6 else None)
                    if err is not None:
                        results[g.group_id] = err
                        continue
                    members = [MemberDescription(m.member_id, m.group_instance_id if v >= 4 else None, m.client_id,
                                                 m.client_host, decode_assignment(g.protocol_type, m.member_assignment))
                               for m in g.members]
                    results[g.group_id] = GroupDescription(g.group_id, g.group_state, g.protocol_type,
                                                           g.protocol_data, members, node)
            return results
        return raise_first(await self._retrying("DescribeGroups", attempt))

    async def describe_consumer_protocol_groups(self, group_ids) -> dict[str, ConsumerGroupDescription]:
        """ConsumerGroupDescribe (KIP-848): groups of the consumer protocol, with member epochs and
        target assignments. A classic or unknown group is an AdminError GROUP_ID_NOT_FOUND."""
        ids = list(group_ids)

        def partitions(a: cgd.Assignment) -> list[TopicPartition]:
            return sorted(TopicPartition(t.topic_name, p) for t in a.topic_partitions for p in t.partitions)

        async def attempt():
            results: dict = {g: None for g in ids}
            for node, groups in (await self._by_coordinator(ids)).items():
                response, v = await self._request(node, 69, lambda v: cgd.ConsumerGroupDescribeRequest(group_ids=groups))
                for g in response.groups:
                    err = self._group_error(g.group_id, g.error_code, g.error_message)
                    if err is not None:
                        results[g.group_id] = err
                        continue
                    members = [ConsumerGroupMember(
                        m.member_id, m.instance_id, m.rack_id, m.member_epoch, m.client_id, m.client_host,
                        list(m.subscribed_topic_names), m.subscribed_topic_regex, partitions(m.assignment),
                        partitions(m.target_assignment)) for m in g.members]
                    results[g.group_id] = ConsumerGroupDescription(
                        g.group_id, g.group_state, g.group_epoch, g.assignment_epoch, g.assignor_name, members, node)
            return results
        return raise_first(await self._retrying("ConsumerGroupDescribe", attempt))

    async def delete_consumer_groups(self, group_ids) -> dict[str, None]:
        ids = list(group_ids)

        async def attempt():
            results: dict = {g: None for g in ids}
            for node, groups in (await self._by_coordinator(ids)).items():
                response, _ = await self._request(node, 42, lambda v: dg.DeleteGroupsRequest(groups_names=groups))
                for r in response.results:
                    results[r.group_id] = self._group_error(r.group_id, r.error_code)
            return results
        return raise_first(await self._retrying("DeleteGroups", attempt))

    # ------------------------------------------------------------------------------------ offsets
    async def _topic_ids(self, topics: list[str] | None) -> tuple[dict, dict]:
        """({name: topic id}, {topic id: name}) from fresh metadata (topics None: every topic)."""
        response = await self._metadata(topics)
        ids = {t.name: t.topic_id for t in response.topics if t.name is not None and not t.error_code}
        return ids, {v: k for k, v in ids.items()}

    async def list_consumer_group_offsets(self, group_id: str, partitions=None
                                          ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets: all of them, or those of `partitions` (None where none is
        committed)."""
        wanted = None if partitions is None else [TopicPartition(*tp) for tp in partitions]
        by_topic: dict[str, list[int]] = {}
        for tp in wanted or []:
            by_topic.setdefault(tp.topic, []).append(tp.partition)

        async def attempt():
            node = await self.find_coordinator(group_id)
            conn = await self.cluster.connection(node)
            v = conn.versions.get(9, 0)
            ids, names = await self._topic_ids(None if wanted is None else sorted(by_topic)) if v >= 10 else ({}, {})
            response, v = await self._request(node, 9, lambda v: _offset_fetch_request(group_id, by_topic, wanted, v, ids))
            if v >= 8:
                g = response.groups[0]
                code, topics = g.error_code, [(names.get(t.topic_id) if v >= 10 else t.name, t.partitions)
                                              for t in g.topics]
            else:
                code, topics = (response.error_code if v >= 2 else 0), [(t.name, t.partitions) for t in response.topics]
            err = self._group_error(group_id, code)
            if err is not None:
                raise err
            results: dict = {} if wanted is None else {tp: None for tp in wanted}
            for name, parts in topics:
                if name is None:    # a topic id this client cannot name: the topic was deleted
                    continue
                for p in parts:
                    tp = TopicPartition(name, p.partition_index)
                    if p.error_code in _RETRY:
                        raise self._group_error(group_id, p.error_code)
                    if p.error_code:
                        results[tp] = AdminError(p.error_code, None, f"partition {tp.topic}-{tp.partition}")
                    elif p.committed_offset >= 0:
                        epoch = p.committed_leader_epoch if v >= 5 else -1
                        results[tp] = OffsetAndMetadata(p.committed_offset, p.metadata or "", epoch)
            return dict(sorted(results.items()))
        return raise_first(await self._retrying("OffsetFetch", attempt))

    async def alter_consumer_group_offsets(self, group_id: str, offsets: dict) -> dict[TopicPartition, None]:
        """Commit `{tp: offset | OffsetAndMetadata}` for a group with no active members."""
        wanted = {TopicPartition(*tp): (o if isinstance(o, OffsetAndMetadata) else OffsetAndMetadata(int(o)))
                  for tp, o in offsets.items()}
        by_topic: dict[str, list] = {}
        for tp, o in wanted.items():
            by_topic.setdefault(tp.topic, []).append((tp.partition, o))

        async def attempt():
            node = await self.find_coordinator(group_id)
            conn = await self.cluster.connection(node)
            ids, names = await self._topic_ids(sorted(by_topic)) if conn.versions.get(8, 0) >= 10 else ({}, {})

            def build_request(v):
                return oc.OffsetCommitRequest(group_id=group_id, generation_id_or_member_epoch=-1, member_id="",
                                              topics=[oc.OffsetCommitRequestTopic(
                                                  name=t, topic_id=ids.get(t, ZERO_UUID), partitions=[
                                                      oc.OffsetCommitRequestPartition(
                                                          partition_index=p, committed_offset=o.offset,
                                                          committed_leader_epoch=o.leader_epoch,
                                                          committed_metadata=o.metadata)
                                                      for p, o in ps]) for t, ps in by_topic.items()])
            response, v = await self._request(node, 8, build_request)
            results: dict = {tp: None for tp in wanted}
            for t in response.topics:
                name = names.get(t.topic_id) if v >= 10 else t.name
                for p in t.partitions:
                    err = self._group_error(group_id, p.error_code)
                    if err is not None:
                        results[TopicPartition(name, p.partition_index)] = AdminError(
                            p.error_code, None, f"group {group_id!r}, partition {name}-{p.partition_index}")
            return results
        return raise_first(await self._retrying("OffsetCommit", attempt))

    async def delete_consumer_group_offsets(self, group_id: str, partitions) -> dict[TopicPartition, None]:
        """Forget the group's committed offsets of `partitions` (refused for topics it subscribes to)."""
        wanted = [TopicPartition(*tp) for tp in partitions]
        by_topic: dict[str, list[int]] = {}
        for tp in wanted:
            by_topic.setdefault(tp.topic, []).append(tp.partition)

        async def attempt():
            node = await self.find_coordinator(group_id)
            response, _ = await self._request(node, 47, lambda v: od.OffsetDeleteRequest(
                group_id=group_id, topics=[od.OffsetDeleteRequestTopic(
                    name=t, partitions=[od.OffsetDeleteRequestPartition(partition_index=p) for p in ps])
                    for t, ps in by_topic.items()]))
            err = self._group_error(group_id, response.error_code)
            if err is not None:
                raise err
            results: dict = {tp: None for tp in wanted}
            for t in response.topics:
                for p in t.partitions:
                    if p.error_code:
                        results[TopicPartition(t.name, p.partition_index)] = AdminError(
                            p.error_code, None, f"group {group_id!r}, partition {t.name}-{p.partition_index}")
            return results
        return raise_first(await self._retrying("OffsetDelete", attempt))


def _offset_fetch_request(group_id: str, by_topic: dict, wanted, v: int, ids: dict):
    if v >= 8:
        topics = None if wanted is None else [
            of.OffsetFetchRequestTopics(name=t, topic_id=ids.get(t, ZERO_UUID), partition_indexes=ps)
            for t, ps in by_topic.items()]
        return of.OffsetFetchRequest(groups=[of.OffsetFetchRequestGroup(group_id=group_id, topics=topics)])
    topics = None if wanted is None else [of.OffsetFetchRequestTopic(name=t, partition_indexes=ps)
                                          for t, ps in by_topic.items()]
    return of.OffsetFetchRequest(group_id=group_id, topics=topics)
