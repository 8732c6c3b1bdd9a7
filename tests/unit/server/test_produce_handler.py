"""The Produce handler on a typed context of in-memory collaborators (`fakes.py`): appends through the
replica manager, per-partition errors, internal topics, and acks=all answered when the high watermark
passes the append (at once alone in the ISR; after the follower's fetch with one; REQUEST_TIMED_OUT
when it never comes). Real producers are in tests/integration; these check the decisions."""

import asyncio

import pytest

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import fetch as fm
from odradek.protocol.messages import produce as m
from odradek.server.apis.fetch import handle_fetch
from odradek.server.apis.produce import handle_produce
from odradek.server.network import ConnectionClosing, Later
from tests.unit.server.fakes import FakeAlterPartition, batch, context, make_services, topic

PRODUCE = 0


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 5))


def _request(acks: int, *parts: tuple[str, int, bytes], timeout_ms: int = 30_000) -> m.ProduceRequest:
    by_topic: dict[str, list] = {}
    for name, index, records in parts:
        by_topic.setdefault(name, []).append(m.PartitionProduceData(index=index, records=records))
    return m.ProduceRequest(acks=acks, timeout_ms=timeout_ms, topic_data=[
        m.TopicProduceData(name=n, partition_data=ps) for n, ps in by_topic.items()])


async def _answered(handling) -> m.ProduceResponse:
    """The handler's response, awaiting it when it is answered later (acks=all waiting for followers)."""
    response = await handling
    return await response.answer if isinstance(response, Later) else response


def _answers(response: m.ProduceResponse) -> dict[tuple[str, int], tuple[ErrorCode, int]]:
    return {(t.name, p.index): (p.error_code, p.base_offset) for t in response.responses
            for p in t.partition_responses}


def test_appends_are_answered_per_partition_with_their_base_offsets():
    services = make_services(topic("p", partitions=2), topic("far", replicas=[1]), brokers=(0, 1))
    first = _run(handle_produce(context(services, PRODUCE, 9), _request(
        1, ("p", 0, batch(b"a", b"b")), ("p", 1, batch(b"c")), ("far", 0, batch(b"x")), ("nope", 0, batch(b"y")))))
    assert _answers(first) == {("p", 0): (ErrorCode.NONE, 0), ("p", 1): (ErrorCode.NONE, 0),
                               ("far", 0): (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1),
                               ("nope", 0): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)}
    second = _run(handle_produce(context(services, PRODUCE, 9), _request(1, ("p", 0, batch(b"d")))))
    assert _answers(second) == {("p", 0): (ErrorCode.NONE, 2)}
    part = services.replica_manager.get_partition("p", 0)
    assert part.log_end_offset == part.high_watermark == 3


def test_internal_topics_and_bad_acks_are_refused():
    services = make_services(topic("__consumer_offsets"), topic("t"))
    r = _run(handle_produce(context(services, PRODUCE, 9), _request(1, ("__consumer_offsets", 0, batch(b"a")))))
    assert _answers(r)[("__consumer_offsets", 0)][0] == ErrorCode.INVALID_TOPIC_EXCEPTION
    r = _run(handle_produce(context(services, PRODUCE, 9), _request(2, ("t", 0, batch(b"a")))))
    assert _answers(r)[("t", 0)][0] == ErrorCode.INVALID_REQUIRED_ACKS


def test_acks_zero_answers_nothing_and_closes_the_connection_on_an_error():
    services = make_services(topic("z"))
    assert _run(handle_produce(context(services, PRODUCE, 9), _request(0, ("z", 0, batch(b"a"))))) is None
    with pytest.raises(ConnectionClosing):
        _run(handle_produce(context(services, PRODUCE, 9), _request(0, ("gone", 0, batch(b"a")))))


def test_acks_all_waits_for_the_follower_or_times_out():
    services = make_services(topic("r", replicas=[0, 1]), brokers=(0, 1), alter_partition=FakeAlterPartition())

    def follower_fetch(offset: int) -> fm.FetchRequest:
        return fm.FetchRequest(replica_id=1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                               session_id=0, session_epoch=-1, forgotten_topics_data=[], topics=[fm.FetchTopic(
                                   topic="r", partitions=[fm.FetchPartition(partition=0, current_leader_epoch=-1,
                                                                            fetch_offset=offset,
                                                                            partition_max_bytes=1 << 20)])])

    async def main():
        first = await handle_produce(context(services, PRODUCE, 9), _request(-1, ("r", 0, batch(b"a", b"b"))))
        assert isinstance(first, Later)         # appended; the answer waits for the follower
        producing = asyncio.ensure_future(first.answer)
        for _ in range(5):
            await asyncio.sleep(0)
        assert not producing.done()            # appended, but the follower does not have it yet
        await handle_fetch(context(services, 1, 12), follower_fetch(2))
        assert _answers(await asyncio.wait_for(producing, 1)) == {("r", 0): (ErrorCode.NONE, 0)}
        r = await _answered(handle_produce(context(services, PRODUCE, 9),
                                           _request(-1, ("r", 0, batch(b"c")), timeout_ms=0)))
        assert _answers(r) == {("r", 0): (ErrorCode.REQUEST_TIMED_OUT, 2)}
        await services.replica_manager.aclose()

    _run(main())


def test_acks_all_alone_in_the_isr_is_answered_at_once_and_refused_below_min_insync():
    services = make_services(topic("solo"), topic("strict", configs={"min.insync.replicas": "2"}))
    r = _run(handle_produce(context(services, PRODUCE, 9), _request(-1, ("solo", 0, batch(b"a")),
                                                                        ("strict", 0, batch(b"b")))))
    assert _answers(r) == {("solo", 0): (ErrorCode.NONE, 0), ("strict", 0): (ErrorCode.NOT_ENOUGH_REPLICAS, -1)}
    assert services.replica_manager.get_partition("strict", 0).log_end_offset == 0
