"""Topic handlers (CreateTopics, CreatePartitions, DeleteTopics, Metadata auto-creation) and
InitProducerId on a typed context: the real cluster controller over the embedded store in memory, the
embedded controller channel, the replica manager and the image, over in-memory logs (`fakes.py`).
Each change is checked where it lands: the store, the logs, the replica manager and the image."""

import asyncio

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import create_partitions as cp
from odradek.protocol.messages import create_topics as ct
from odradek.protocol.messages import delete_topics as dt
from odradek.protocol.messages import init_producer_id as ip
from odradek.protocol.messages import metadata as m
from odradek.server.apis.admin_topics import handle_create_partitions, handle_create_topics, handle_delete_topics
from odradek.server.apis.metadata import handle_metadata
from odradek.server.apis.producer_ids import handle_init_producer_id
from tests.unit.server.fakes import broker_config, context, make_services, topic


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 5))


def _creatable(name: str, partitions: int = 2, **configs: str) -> ct.CreatableTopic:
    return ct.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1, assignments=[],
                             configs=[ct.CreatableTopicConfig(name=k.replace("_", "."), value=v)
                                      for k, v in configs.items()])


def test_created_topics_are_recorded_opened_and_published():
    services = make_services()
    request = ct.CreateTopicsRequest(timeout_ms=1000, validate_only=False, topics=[
        _creatable("a", 2, retention_ms="1000"), _creatable("b", 1), _creatable("b", 1)])
    r = _run(handle_create_topics(context(services, 19, 7), request))
    assert [(t.name, t.error_code) for t in r.topics] == [("a", ErrorCode.NONE), ("b", ErrorCode.INVALID_REQUEST)]
    store = services.controller.store
    assert store.exists("/brokers/topics/a/partitions/1/state") and not store.exists("/brokers/topics/b")
    info = services.metadata.topic("a")
    assert info is not None and info.configs == {"retention.ms": "1000"} and info.topic_id == r.topics[0].topic_id
    assert sorted(services.log_dirs.opened) == [("a", 0), ("a", 1)]
    assert services.replica_manager.leader_partition("a", 1).leader_epoch == 0
    again = _run(handle_create_topics(context(services, 19, 7), ct.CreateTopicsRequest(
        timeout_ms=1000, validate_only=False, topics=[_creatable("a")])))
    assert again.topics[0].error_code == ErrorCode.TOPIC_ALREADY_EXISTS


def test_validate_only_changes_nothing():
    services = make_services()
    request = ct.CreateTopicsRequest(timeout_ms=1000, validate_only=True, topics=[_creatable("v", 3)])
    r = _run(handle_create_topics(context(services, 19, 7), request))
    assert r.topics[0].error_code == ErrorCode.NONE and r.topics[0].num_partitions == 3
    assert services.metadata.topic("v") is None and not services.controller.store.exists("/brokers/topics/v")
    assert services.log_dirs.opened == {}


def test_partitions_are_added_and_topics_deleted_everywhere():
    services = make_services(topic("grow"), topic("gone", partitions=2))
    r = _run(handle_create_partitions(context(services, 37, 3), cp.CreatePartitionsRequest(
        timeout_ms=1000, validate_only=False, topics=[cp.CreatePartitionsTopic(name="grow", count=3, assignments=None),
                                                      cp.CreatePartitionsTopic(name="nope", count=3, assignments=None)])))
    assert [(t.name, t.error_code) for t in r.results] == [("grow", ErrorCode.NONE),
                                                          ("nope", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]
    assert len(services.metadata.topic("grow").partitions) == 3
    assert services.replica_manager.get_partition("grow", 2) is not None
    r = _run(handle_delete_topics(context(services, 20, 6), dt.DeleteTopicsRequest(
        timeout_ms=1000, topics=[dt.DeleteTopicState(name="gone")])))
    assert r.responses[0].error_code == ErrorCode.NONE
    assert services.metadata.topic("gone") is None and services.replica_manager.get_partition("gone", 0) is None
    assert sorted(services.log_dirs.deleted) == [("gone", 0), ("gone", 1)]
    assert not services.controller.store.exists("/brokers/topics/gone")


def test_metadata_lists_the_image_and_creates_what_is_asked_for():
    services = make_services(topic("known", partitions=2), config=broker_config(num_partitions="3"))
    request = m.MetadataRequest(topics=[m.MetadataRequestTopic(name="known"), m.MetadataRequestTopic(name="fresh"),
                                        m.MetadataRequestTopic(name="bad name")], allow_auto_topic_creation=True)
    r = _run(handle_metadata(context(services, 3, 9), request))
    got = {t.name: (t.error_code, len(t.partitions)) for t in r.topics}
    assert got == {"known": (ErrorCode.NONE, 2), "fresh": (ErrorCode.NONE, 3),
                   "bad name": (ErrorCode.INVALID_TOPIC_EXCEPTION, 0)}
    assert [(b.node_id, b.port) for b in r.brokers] == [(0, 9092)] and r.cluster_id == "fake-cluster"
    assert services.metadata.topic("fresh") is not None
    no_create = m.MetadataRequest(topics=[m.MetadataRequestTopic(name="later")], allow_auto_topic_creation=False)
    r = _run(handle_metadata(context(services, 3, 9), no_create))
    assert r.topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and services.metadata.topic("later") is None


def test_producer_ids_come_from_blocks_in_the_store():
    services = make_services()

    async def ids():
        out = []
        for _ in range(3):
            r = await handle_init_producer_id(context(services, 22, 4), ip.InitProducerIdRequest(
                transactional_id=None, transaction_timeout_ms=1000, producer_id=-1, producer_epoch=-1))
            assert r.error_code == ErrorCode.NONE and r.producer_epoch == 0
            out.append(r.producer_id)
        return out

    first = _run(ids())
    assert first == sorted(set(first))
    assert services.controller.store.exists("/latest_producer_id_block")


def test_metadata_naming_thousands_of_topics_answers_each_as_it_is_encoded():
    """Past LAZY_ANSWERS_MIN names the answer holds a slot per name (TopicAnswers) and builds each
    topic's answer when read; every name gets its own answer, in order, as Kafka gives it."""
    from odradek.protocol.api import decode_response, encode_response
    from odradek.protocol.codec import ZERO_UUID
    from odradek.server.apis.metadata import LAZY_ANSWERS_MIN, TopicAnswers

    services = make_services(topic("known", partitions=2))
    known_id = services.metadata.topic("known").topic_id
    n = 3 * LAZY_ANSWERS_MIN
    named = [m.MetadataRequestTopic(name=f"missing-{i}") for i in range(n)]
    named[7] = m.MetadataRequestTopic(name="known")
    named[8] = m.MetadataRequestTopic(name="bad name")
    named[9] = m.MetadataRequestTopic(name=None, topic_id=known_id)
    unknown_id = m.MetadataRequestTopic(name=None, topic_id=type(known_id)(int=12345))
    named[10] = unknown_id
    request = m.MetadataRequest(topics=named, allow_auto_topic_creation=False)
    r = _run(handle_metadata(context(services, 3, 12), request))
    assert isinstance(r.topics, TopicAnswers) and len(r.topics) == n
    _, back = decode_response(3, 12, bytes(encode_response(3, 12, 1, r)))
    got = [(t.name, t.error_code, len(t.partitions)) for t in back.topics]
    assert got[7] == ("known", ErrorCode.NONE, 2) and got[9] == ("known", ErrorCode.NONE, 2)
    assert got[8] == ("bad name", ErrorCode.INVALID_TOPIC_EXCEPTION, 0)
    assert got[10] == (None, ErrorCode.UNKNOWN_TOPIC_ID, 0) and back.topics[10].topic_id == unknown_id.topic_id
    rest = [g for i, g in enumerate(got) if i not in (7, 8, 9, 10)]
    assert rest == [(f"missing-{i}", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0) for i in range(n) if i not in (7, 8, 9, 10)]
    assert back.topics[0].topic_id == ZERO_UUID
    assert services.metadata.topic("missing-0") is None      # the request said not to create them
