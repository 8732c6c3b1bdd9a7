"""Group handlers over the real coordinator runtime, replica manager and metadata image, with
in-memory logs (`fakes.py`): a commit is written to `__consumer_offsets` through the replica manager
and answered only when the partition's high watermark passes it, so with a follower in the ISR the
answer waits for the follower's fetch."""

import asyncio

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import fetch as m
from odradek.protocol.messages import offset_commit as oc
from odradek.protocol.messages import offset_fetch as of
from odradek.server.apis.fetch import handle_fetch
from odradek.server.apis.offsets import handle_offset_commit, handle_offset_fetch
from tests.unit.server.fakes import FakeAlterPartition, context, make_services, topic

OFFSETS = "__consumer_offsets"


def _commit(group: str, offset: int) -> oc.OffsetCommitRequest:
    return oc.OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=[
        oc.OffsetCommitRequestTopic(name="t", partitions=[oc.OffsetCommitRequestPartition(
            partition_index=0, committed_offset=offset)])])


async def _loaded(services) -> None:
    await services.coordinators.start()
    while services.coordinators.group.loading:
        await asyncio.sleep(0)


async def _follower_fetch(services, offset: int) -> None:
    request = m.FetchRequest(replica_id=1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                             session_id=0, session_epoch=-1, forgotten_topics_data=[], topics=[m.FetchTopic(
                                 topic=OFFSETS, partitions=[m.FetchPartition(
                                     partition=0, current_leader_epoch=-1, fetch_offset=offset,
                                     partition_max_bytes=1 << 20)])])
    await handle_fetch(context(services, 1, 12), request)


def test_alone_in_the_isr_a_commit_is_answered_at_once_and_read_back():
    services = make_services(topic(OFFSETS), topic("t"))

    async def main():
        await _loaded(services)
        r = await handle_offset_commit(context(services, 8, 8), _commit("g", 42))
        assert r.topics[0].partitions[0].error_code == ErrorCode.NONE
        part = services.replica_manager.get_partition(OFFSETS, 0)
        assert part.log_end_offset == 1 and part.high_watermark == 1
        request = of.OffsetFetchRequest(group_id="g", topics=[of.OffsetFetchRequestTopic(
            name="t", partition_indexes=[0])])
        fetched = await handle_offset_fetch(context(services, 9, 7), request)
        assert fetched.topics[0].partitions[0].committed_offset == 42
        await services.coordinators.aclose()

    asyncio.run(asyncio.wait_for(main(), 5))


def test_with_a_follower_in_the_isr_a_commit_waits_for_its_fetch():
    services = make_services(topic(OFFSETS, replicas=[0, 1]), topic("t"), brokers=(0, 1),
                             alter_partition=FakeAlterPartition())

    async def main():
        await _loaded(services)
        committing = asyncio.ensure_future(handle_offset_commit(context(services, 8, 8), _commit("g", 7)))
        for _ in range(5):
            await asyncio.sleep(0)
        part = services.replica_manager.get_partition(OFFSETS, 0)
        assert part.log_end_offset == 1 and part.high_watermark == 0 and not committing.done()
        await _follower_fetch(services, 0)          # it has nothing yet
        await asyncio.sleep(0)
        assert not committing.done()
        await _follower_fetch(services, 1)          # it has the commit: the high watermark passes it
        r = await asyncio.wait_for(committing, 1)
        assert r.topics[0].partitions[0].error_code == ErrorCode.NONE and part.high_watermark == 1
        await services.coordinators.aclose()
        await services.replica_manager.aclose()

    asyncio.run(asyncio.wait_for(main(), 5))
