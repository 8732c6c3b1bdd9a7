"""Every version of every group API, encoded and decoded by kafka-python's protocol classes (generated
from Apache Kafka's message specs, not ours): FindCoordinator 0-6, JoinGroup 0-9 with SyncGroup,
Heartbeat and LeaveGroup, OffsetCommit and OffsetFetch 0-10 (several groups at once from v8, topic ids
from v10), OffsetDelete, ListGroups 0-5, DescribeGroups 0-6, DeleteGroups 0-2 (seed 003, "Protocol")."""

from __future__ import annotations

import itertools
import socket
import struct

import pytest
from kafka.protocol.admin.groups import (
    DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse, ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.admin.topics import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.consumer.group import (
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse, OffsetFetchRequest,
    OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse,
)
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse

_Topic = OffsetCommitRequest.OffsetCommitRequestTopic
_Partition = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition
_FetchTopic = OffsetFetchRequest.OffsetFetchRequestTopic
_FetchGroup = OffsetFetchRequest.OffsetFetchRequestGroup
_FetchTopics = OffsetFetchRequest.OffsetFetchRequestGroup.OffsetFetchRequestTopics
_DeleteTopic = OffsetDeleteRequest.OffsetDeleteRequestTopic
_DeletePartition = OffsetDeleteRequest.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition

BROKER_OVERRIDES = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 1000}

NONE, UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUEST = 0, 3, 42
ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS = 22, 25, 27
NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND, MEMBER_ID_REQUIRED, GROUP_SUBSCRIBED_TO_TOPIC = 68, 69, 79, 86


class Raw:
    """One connection speaking the protocol through kafka-python's message classes."""

    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.ids = itertools.count(1)

    def call(self, request, response_cls, version: int):
        request.with_header(correlation_id=next(self.ids), client_id="sweep")
        self.sock.sendall(request.encode(version=version, header=True, framed=True))
        size = struct.unpack(">i", self._read(4))[0]
        return response_cls.decode(self._read(size), version=version, header=True)

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "connection closed by the broker"
            buf += chunk
        return buf

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def raw(broker):
    r = Raw(broker.bootstrap)
    r.call(FindCoordinatorRequest(key="warm-up", key_type=0), FindCoordinatorResponse, 1)   # creates the topic
    topic = CreateTopicsRequest.CreatableTopic(name="sweep", num_partitions=3, replication_factor=1,
                                               assignments=[], configs=[])
    created = r.call(CreateTopicsRequest(topics=[topic], timeout_ms=10000), CreateTopicsResponse, 5)
    assert created.topics[0].error_code == NONE
    yield r
    r.close()


def _subscription(*topics: str) -> bytes:
    return ConsumerProtocolSubscription(topics=list(topics)).encode(version=0, header=False)


def _assignment(partitions: list[int]) -> bytes:
    tp = ConsumerProtocolAssignment.TopicPartition(topic="sweep", partitions=partitions)
    return ConsumerProtocolAssignment(assigned_partitions=[tp]).encode(version=0)


def _plan(member_id: str, partitions: list[int]):
    return SyncGroupRequest.SyncGroupRequestAssignment(member_id=member_id, assignment=_assignment(partitions))


def test_find_coordinator_every_version(raw, broker):
    port = int(broker.bootstrap.split(":")[1])
    for v in range(FindCoordinatorRequest.max_version + 1):
        if v < 4:
            for key_type in ((0, 1) if v >= 1 else (0,)):
                r = raw.call(FindCoordinatorRequest(key="group-a", key_type=key_type), FindCoordinatorResponse, v)
                assert (r.error_code, r.node_id, r.port) == (NONE, 0, port), (v, r)
            if v >= 1:
                r = raw.call(FindCoordinatorRequest(key="x", key_type=7), FindCoordinatorResponse, v)
                assert r.error_code == INVALID_REQUEST
        else:
            r = raw.call(FindCoordinatorRequest(key_type=0, coordinator_keys=["a", "b", "c"]), FindCoordinatorResponse, v)
            assert [(c.key, c.error_code, c.port) for c in r.coordinators] == [(k, NONE, port) for k in "abc"]


@pytest.mark.parametrize("join_v", range(JoinGroupRequest.max_version + 1))
def test_membership_lifecycle_every_version(raw, join_v):
    sync_v, hb_v, leave_v = min(join_v, 5), min(join_v, 4), min(join_v, 5)
    group = f"life-{join_v}"
    protocols = [("range", _subscription("sweep")), ("roundrobin", _subscription("sweep"))]

    def join(member_id: str):
        return raw.call(JoinGroupRequest(group_id=group, session_timeout_ms=6000, rebalance_timeout_ms=6000,
                                         member_id=member_id, protocol_type="consumer", protocols=protocols),
                        JoinGroupResponse, join_v)

    r = join("")
    if join_v >= 4:
        assert r.error_code == MEMBER_ID_REQUIRED and r.member_id
        r = join(r.member_id)
    assert r.error_code == NONE, r
    me = r.member_id
    assert (r.generation_id, r.leader, r.protocol_name) == (1, me, "range")
    assert [m.member_id for m in r.members] == [me]
    if join_v >= 7:
        assert r.protocol_type == "consumer"
    s = raw.call(SyncGroupRequest(group_id=group, generation_id=1, member_id=me, protocol_type="consumer",
                                  protocol_name="range", assignments=[_plan(me, [0, 1, 2])]),
                 SyncGroupResponse, sync_v)
    assert s.error_code == NONE and s.assignment == _assignment([0, 1, 2])
    if sync_v >= 5:
        assert (s.protocol_type, s.protocol_name) == ("consumer", "range")
    h = raw.call(HeartbeatRequest(group_id=group, generation_id=1, member_id=me), HeartbeatResponse, hb_v)
    assert h.error_code == NONE
    h = raw.call(HeartbeatRequest(group_id=group, generation_id=0, member_id=me), HeartbeatResponse, hb_v)
    assert h.error_code == ILLEGAL_GENERATION
    if leave_v < 3:
        l = raw.call(LeaveGroupRequest(group_id=group, member_id=me), LeaveGroupResponse, leave_v)
        assert l.error_code == NONE
    else:
        identity = LeaveGroupRequest.MemberIdentity
        l = raw.call(LeaveGroupRequest(group_id=group, members=[identity(member_id=me, reason="done"),
                                                                identity(member_id="ghost")]),
                     LeaveGroupResponse, leave_v)
        assert l.error_code == NONE
        assert [(m.member_id, m.error_code) for m in l.members] == [(me, NONE), ("ghost", UNKNOWN_MEMBER_ID)]
    h = raw.call(HeartbeatRequest(group_id=group, generation_id=1, member_id=me), HeartbeatResponse, hb_v)
    assert h.error_code == UNKNOWN_MEMBER_ID


def _topic_id(raw):
    md = raw.call(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="sweep")],
                                  allow_auto_topic_creation=False), MetadataResponse, 12)
    return md.topics[0].topic_id


def _commit(raw, v: int, group: str, offsets: dict[int, int], topic_id=None, metadata: str = "m"):
    partitions = [_Partition(partition_index=p, committed_offset=o, committed_metadata=metadata)
                  for p, o in offsets.items()]
    topic = _Topic(topic_id=topic_id, partitions=partitions) if v >= 10 else _Topic(name="sweep", partitions=partitions)
    r = raw.call(OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="",
                                     topics=[topic]), OffsetCommitResponse, v)
    return {p.partition_index: p.error_code for t in r.topics for p in t.partitions}


@pytest.mark.parametrize("v", range(OffsetCommitRequest.max_version + 1))
def test_offset_commit_and_fetch_every_version(raw, v):
    group = f"offsets-{v}"
    topic_id = _topic_id(raw) if v >= 10 else None
    assert _commit(raw, v, group, {0: 10 + v, 1: 20 + v}, topic_id) == {0: NONE, 1: NONE}
    if v < 10:
        bad = raw.call(OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="",
                                           topics=[_Topic(name="no-such-topic", partitions=[
                                               _Partition(partition_index=0, committed_offset=1)])]),
                       OffsetCommitResponse, v)
        assert bad.topics[0].partitions[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
    if v < 8:
        r = raw.call(OffsetFetchRequest(group_id=group, topics=[_FetchTopic(name="sweep", partition_indexes=[0, 1, 2])]),
                     OffsetFetchResponse, v)
        got = {p.partition_index: (p.committed_offset, p.metadata) for t in r.topics for p in t.partitions}
        assert got == {0: (10 + v, "m"), 1: (20 + v, "m"), 2: (-1, "")}
        if v >= 2:
            r = raw.call(OffsetFetchRequest(group_id=group, topics=None), OffsetFetchResponse, v)
            assert r.error_code == NONE
            assert {p.partition_index for t in r.topics for p in t.partitions} == {0, 1}
        return
    topics = [_FetchTopics(topic_id=topic_id, partition_indexes=[0, 1, 2]) if v >= 10
              else _FetchTopics(name="sweep", partition_indexes=[0, 1, 2])]
    groups = [_FetchGroup(group_id=group, topics=topics), _FetchGroup(group_id="nobody-here", topics=None)]
    r = raw.call(OffsetFetchRequest(groups=groups, require_stable=True), OffsetFetchResponse, v)
    first, second = r.groups
    assert (first.group_id, first.error_code, second.group_id, second.error_code, second.topics) == \
        (group, NONE, "nobody-here", NONE, [])
    (t,) = first.topics
    assert (t.topic_id if v >= 10 else t.name) == (topic_id if v >= 10 else "sweep")
    assert [(p.partition_index, p.committed_offset) for p in t.partitions] == [(0, 10 + v), (1, 20 + v), (2, -1)]


def test_list_describe_delete_groups_every_version(raw):
    group = "admin-sweep"
    _commit(raw, 8, group, {0: 1})
    for v in range(ListGroupsRequest.max_version + 1):
        r = raw.call(ListGroupsRequest(states_filter=["Empty"], types_filter=["classic"]), ListGroupsResponse, v)
        listed = {g.group_id: g for g in r.groups}
        assert r.error_code == NONE and group in listed, (v, r)
        if v >= 4:
            assert listed[group].group_state == "Empty"
            r = raw.call(ListGroupsRequest(states_filter=["Stable"]), ListGroupsResponse, v)
            assert group not in {g.group_id for g in r.groups}
        if v >= 5:
            assert listed[group].group_type == "classic"
            r = raw.call(ListGroupsRequest(types_filter=["consumer"]), ListGroupsResponse, v)
            assert r.groups == []
    for v in range(DescribeGroupsRequest.max_version + 1):
        r = raw.call(DescribeGroupsRequest(groups=[group, "never-was"], include_authorized_operations=True),
                     DescribeGroupsResponse, v)
        known, unknown = r.groups
        assert (known.error_code, known.group_state, known.members) == (NONE, "Empty", [])
        if v >= 3:
            assert set(known.authorized_operations) == {3, 6, 8}       # READ, DELETE, DESCRIBE
        assert unknown.group_state == "Dead"
        assert unknown.error_code == (GROUP_ID_NOT_FOUND if v >= 6 else NONE)
    for v in range(DeleteGroupsRequest.max_version + 1):
        name = f"{group}-{v}"
        _commit(raw, 8, name, {0: 1})
        r = raw.call(DeleteGroupsRequest(groups_names=[name, "never-was"]), DeleteGroupsResponse, v)
        assert [(g.group_id, g.error_code) for g in r.results] == [(name, NONE), ("never-was", GROUP_ID_NOT_FOUND)]


def test_offset_delete_and_non_empty_groups(raw):
    group = "deleter"
    me = raw.call(JoinGroupRequest(group_id=group, session_timeout_ms=30000, rebalance_timeout_ms=6000,
                                   member_id="", protocol_type="consumer",
                                   protocols=[("range", _subscription("sweep"))]), JoinGroupResponse, 3)
    raw.call(SyncGroupRequest(group_id=group, generation_id=1, member_id=me.member_id,
                              assignments=[_plan(me.member_id, [0])]), SyncGroupResponse, 3)
    topics = [_Topic(name="sweep", partitions=[_Partition(partition_index=0, committed_offset=5)])]
    r = raw.call(OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=1, member_id=me.member_id,
                                     topics=topics), OffsetCommitResponse, 7)
    assert r.topics[0].partitions[0].error_code == NONE
    r = raw.call(OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=1, member_id="",
                                     topics=topics), OffsetCommitResponse, 7)
    assert r.topics[0].partitions[0].error_code == UNKNOWN_MEMBER_ID
    delete = [_DeleteTopic(name="sweep", partitions=[_DeletePartition(partition_index=0)])]
    r = raw.call(OffsetDeleteRequest(group_id=group, topics=delete), OffsetDeleteResponse, 0)
    assert r.error_code == NONE and r.topics[0].partitions[0].error_code == GROUP_SUBSCRIBED_TO_TOPIC
    r = raw.call(DeleteGroupsRequest(groups_names=[group]), DeleteGroupsResponse, 2)
    assert r.results[0].error_code == NON_EMPTY_GROUP
    raw.call(LeaveGroupRequest(group_id=group, member_id=me.member_id), LeaveGroupResponse, 1)
    r = raw.call(OffsetDeleteRequest(group_id=group, topics=delete), OffsetDeleteResponse, 0)
    assert r.error_code == NONE and r.topics[0].partitions[0].error_code == NONE
    r = raw.call(OffsetFetchRequest(group_id=group, topics=[_FetchTopic(name="sweep", partition_indexes=[0])]),
                 OffsetFetchResponse, 5)
    assert r.topics[0].partitions[0].committed_offset == -1
    r = raw.call(OffsetDeleteRequest(group_id="never-was", topics=[]), OffsetDeleteResponse, 0)
    assert r.error_code == GROUP_ID_NOT_FOUND
