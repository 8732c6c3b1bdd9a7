"""Answers as Kafka gives them where odradek used to differ: SaslHandshake and SaslAuthenticate without
SASL, ApiVersions v3+ with an invalid client software name, OffsetCommit and OffsetDelete naming
partitions that do not exist, a group whose members declare ConsumerProtocolSubscription v1 but send
the v0 layout, and the SASL keys Kafka lets AlterConfigs change on a running broker.

Requests and answers go through kafka-python's protocol classes and confluent-kafka's clients."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, \
    NewTopic, ResourceType
from kafka.protocol.admin import IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse
from kafka.protocol.consumer.group import (
    JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse, OffsetFetchRequest, OffsetFetchResponse,
    SyncGroupRequest, SyncGroupResponse,
)
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
)

from .clients import RawClient, confluent_config, confluent_consumer

NONE, UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_MEMBER_ID, UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE = 0, 3, 25, 33, 34
INVALID_REQUEST, MEMBER_ID_REQUIRED, GROUP_SUBSCRIBED_TO_TOPIC = 42, 79, 86
SASL_KEYS = {"sasl.kerberos.min.time.before.relogin": "120000", "sasl.kerberos.kinit.cmd": "/opt/kinit",
             "sasl.kerberos.ticket.renew.window.factor": "0.75", "sasl.kerberos.ticket.renew.jitter": "0.1",
             "sasl.kerberos.principal.to.local.rules": "RULE:[1:$1]",
             "sasl.login.refresh.window.factor": "0.9", "sasl.login.refresh.window.jitter": "0.02",
             "sasl.login.refresh.min.period.seconds": "30", "sasl.login.refresh.buffer.seconds": "120"}


@pytest.fixture(scope="module")
def one_partition(broker):
    admin = AdminClient(confluent_config(broker.bootstrap))
    admin.create_topics([NewTopic("one", 1, 1)])["one"].result(20)
    with RawClient(broker.bootstrap) as raw:      # the offsets topic exists before any group call
        raw.call(FindCoordinatorRequest(key="warm-up", key_type=0), FindCoordinatorResponse, 1)
    return "one"


# ------------------------------------------------------------------------------------------ SASL
def test_sasl_without_sasl_on_the_listener_is_illegal_state_and_the_connection_stays(broker):
    with RawClient(broker.bootstrap) as raw:
        for v in (0, 1):
            r = raw.call(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, v)
            assert (r.error_code, list(r.mechanisms)) == (ILLEGAL_SASL_STATE, [])
        for v in (0, 1, 2):
            r = raw.call(SaslAuthenticateRequest(auth_bytes=b"\x00user\x00secret"), SaslAuthenticateResponse, v)
            assert (r.error_code, r.error_message) == (
                ILLEGAL_SASL_STATE, "SaslAuthenticate request received after successful authentication")
        r = raw.call(ApiVersionsRequest(), ApiVersionsResponse, 0)    # still open, still answering
        advertised = {k.api_key: (k.min_version, k.max_version) for k in r.api_keys}
    assert r.error_code == NONE and advertised[17] == (0, 1) and advertised[36] == (0, 2)


def test_sasl_handshake_on_a_sasl_listener_lists_the_enabled_mechanisms(broker_factory):
    b = broker_factory(listeners="SASL_PLAINTEXT://127.0.0.1:0", sasl_enabled_mechanisms="PLAIN,SCRAM-SHA-256",
                       **{"inter.broker.listener.name": "SASL_PLAINTEXT"})
    with RawClient(b.bootstrap) as raw:
        r = raw.call(SaslHandshakeRequest(mechanism="GSSAPI"), SaslHandshakeResponse, 1)
        assert (r.error_code, list(r.mechanisms)) == (UNSUPPORTED_SASL_MECHANISM, ["PLAIN", "SCRAM-SHA-256"])
        assert raw.call(ApiVersionsRequest(), ApiVersionsResponse, 0).error_code == NONE


# ------------------------------------------------------------------------------------------ ApiVersions
@pytest.mark.parametrize("name,version,code", [
    ("kafka-python", "3.0.12", NONE), ("confluent-kafka-python", "2.16.1-rdkafka-2.16.0", NONE), ("a", "1", NONE),
    ("bad name", "1.0", INVALID_REQUEST), ("client", "1.0+local", INVALID_REQUEST), ("", "1.0", INVALID_REQUEST),
    ("client", "", INVALID_REQUEST), ("-client", "1", INVALID_REQUEST), ("client.", "1", INVALID_REQUEST),
    ("client", "1.0_beta", INVALID_REQUEST),
])
def test_api_versions_v3_checks_the_client_software_name(broker, name, version, code):
    """Kafka answers INVALID_REQUEST at the request's version (only UNSUPPORTED_VERSION goes out as v0);
    kafka-python reads every error answer as v0, so the body is decoded at its real version here, with
    kafka-python's generated decoder all the same."""
    with RawClient(broker.bootstrap) as raw:
        for v in (3, 4):
            frame = raw.call_raw(ApiVersionsRequest(client_software_name=name, client_software_version=version), v)
            r = super(ApiVersionsResponse, ApiVersionsResponse).decode(frame[4:], version=v)   # header v0: 4 bytes
            assert r.error_code == code
            assert (len(r.api_keys) == 0) == (code == INVALID_REQUEST)
        # earlier versions carry no software name: nothing to check
        assert raw.call(ApiVersionsRequest(), ApiVersionsResponse, 2).error_code == NONE


# ------------------------------------------------------------------------------------------ offsets
def commit(raw, version: int, group: str, parts: dict[str, list[tuple[int, int]]], *, member: str = "",
           generation: int = -1) -> dict:
    topics = [OffsetCommitRequest.OffsetCommitRequestTopic(name=t, partitions=[
        OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
            partition_index=p, committed_offset=o, committed_metadata="") for p, o in ps]) for t, ps in parts.items()]
    r = raw.call(OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=generation, member_id=member,
                                     retention_time_ms=-1, topics=topics), OffsetCommitResponse, version)
    return {(t.name, p.partition_index): p.error_code for t in r.topics for p in t.partitions}


def committed(raw, group: str) -> dict:
    r = raw.call(OffsetFetchRequest(group_id=group, topics=None), OffsetFetchResponse, 7)
    return {(t.name, p.partition_index): p.committed_offset for t in r.topics for p in t.partitions}


def test_offset_commit_to_a_partition_that_does_not_exist_stores_nothing(broker, one_partition):
    with RawClient(broker.bootstrap) as raw:
        for v in (2, 8):
            group = f"commit-missing-{v}"
            got = commit(raw, v, group, {"one": [(0, 5), (3, 7)], "no-such-topic": [(0, 1)]})
            assert got == {("one", 0): NONE, ("one", 3): UNKNOWN_TOPIC_OR_PARTITION,
                           ("no-such-topic", 0): UNKNOWN_TOPIC_OR_PARTITION}
            assert committed(raw, group) == {("one", 0): 5}
        # a refused member does not hide which partitions do not exist, as in Kafka
        got = commit(raw, 8, "commit-missing-8", {"one": [(0, 6), (9, 1)]}, member="ghost", generation=4)
        assert got == {("one", 0): UNKNOWN_MEMBER_ID, ("one", 9): UNKNOWN_TOPIC_OR_PARTITION}
        assert committed(raw, "commit-missing-8") == {("one", 0): 5}
    # and through confluent-kafka's consumer
    c = confluent_consumer(broker.bootstrap, **{"group.id": "commit-missing-confluent"})
    try:
        with pytest.raises(KafkaException) as e:
            c.commit(offsets=[TopicPartition("one", 2, 11)], asynchronous=False)
        assert "UNKNOWN_TOPIC_OR_PART" in str(e.value)
        c.commit(offsets=[TopicPartition("one", 0, 12)], asynchronous=False)
        assert [tp.offset for tp in c.committed([TopicPartition("one", 0)], timeout=20)] == [12]
    finally:
        c.close()
    with RawClient(broker.bootstrap) as raw:
        assert committed(raw, "commit-missing-confluent") == {("one", 0): 12}


def test_offset_delete_of_a_partition_that_does_not_exist(broker, one_partition):
    with RawClient(broker.bootstrap) as raw:
        assert commit(raw, 8, "delete-missing", {"one": [(0, 5)]}) == {("one", 0): NONE}
        r = raw.call(OffsetDeleteRequest(group_id="delete-missing", topics=[
            OffsetDeleteRequest.OffsetDeleteRequestTopic(name="one", partitions=[
                OffsetDeleteRequest.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(partition_index=p)
                for p in (0, 4)])]), OffsetDeleteResponse, 0)
        assert r.error_code == NONE
        assert [(p.partition_index, p.error_code) for t in r.topics for p in t.partitions] == [
            (0, NONE), (4, UNKNOWN_TOPIC_OR_PARTITION)]
        assert committed(raw, "delete-missing") == {}


def test_a_v1_subscription_in_the_v0_layout_subscribes_to_nothing(broker, one_partition):
    """ConsumerProtocolSubscription declared v1 but written as v0 (topics [], user_data null): Kafka reads
    its v0 prefix and knows the group subscribes to nothing, so OffsetDelete may delete."""
    metadata = b"\x00\x01" + b"\x00\x00\x00\x00" + b"\xff\xff\xff\xff"
    group = "v1-says-v0"
    with RawClient(broker.bootstrap) as raw:
        def join(member_id: str):
            return raw.call(JoinGroupRequest(group_id=group, session_timeout_ms=10000, rebalance_timeout_ms=10000,
                                             member_id=member_id, protocol_type="consumer",
                                             protocols=[JoinGroupRequest.JoinGroupRequestProtocol(
                                                 name="range", metadata=metadata)]), JoinGroupResponse, 5)
        r = join("")
        assert r.error_code == MEMBER_ID_REQUIRED
        r = join(r.member_id)
        assert r.error_code == NONE
        me = r.member_id
        s = raw.call(SyncGroupRequest(group_id=group, generation_id=r.generation_id, member_id=me, assignments=[
            SyncGroupRequest.SyncGroupRequestAssignment(member_id=me, assignment=b"")]), SyncGroupResponse, 3)
        assert s.error_code == NONE
        assert commit(raw, 8, group, {"one": [(0, 3)]}, member=me, generation=r.generation_id) == {("one", 0): NONE}
        d = raw.call(OffsetDeleteRequest(group_id=group, topics=[OffsetDeleteRequest.OffsetDeleteRequestTopic(
            name="one", partitions=[OffsetDeleteRequest.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(
                partition_index=0)])]), OffsetDeleteResponse, 0)
        codes = [p.error_code for t in d.topics for p in t.partitions]
        assert d.error_code == NONE and codes == [NONE] and GROUP_SUBSCRIBED_TO_TOPIC not in codes
        assert committed(raw, group) == {}
        raw.call(LeaveGroupRequest(group_id=group, member_id=me), LeaveGroupResponse, 0)


# ------------------------------------------------------------------------------------------ configs
def test_sasl_login_and_kerberos_keys_are_dynamic_per_broker(broker):
    admin = AdminClient(confluent_config(broker.bootstrap))
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in SASL_KEYS.items()]
    (f,) = admin.incremental_alter_configs([ConfigResource(ResourceType.BROKER, "0", incremental_configs=entries)]
                                           ).values()
    f.result(20)
    (f,) = admin.describe_configs([ConfigResource(ResourceType.BROKER, "0")]).values()
    described = f.result(20)
    for key, value in SASL_KEYS.items():
        assert (described[key].value, described[key].source) == (value, ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        assert not described[key].is_read_only
    # the legacy AlterConfigs too, which replaces the broker's dynamic layer as a whole
    (f,) = admin.alter_configs([ConfigResource(ResourceType.BROKER, "0", set_config={
        "sasl.kerberos.min.time.before.relogin": "90000"})]).values()
    f.result(20)
    (f,) = admin.describe_configs([ConfigResource(ResourceType.BROKER, "0")]).values()
    assert f.result(20)["sasl.kerberos.min.time.before.relogin"].value == "90000"
    # like Kafka's listener configs they are per broker: the cluster-wide default refuses them
    with RawClient(broker.bootstrap) as raw:
        resources = [(4, "", [("sasl.login.refresh.buffer.seconds", 0, "60")])]     # 4: broker, "": default
        r = raw.call(IncrementalAlterConfigsRequest(resources=resources, validate_only=False),
                     IncrementalAlterConfigsResponse, 0)
    (res,) = r.responses
    assert res.error_code == INVALID_REQUEST and "broker id must be specified" in res.error_message
