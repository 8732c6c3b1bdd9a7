"""The replica manager over in-memory logs: lookup errors, leader-epoch fencing, the one high
watermark, follower fetch state and ISR changes, delayed produce (acks=all), LeaderAndIsr and
StopReplica. No sockets, no disk; a fake clock."""

import asyncio

import pytest

from odradek.protocol.error_codes import ErrorCode, KafkaApiError
from odradek.server.partition import LeaderAndIsrState
from tests.unit.server.fakes import Clock, FakeAlterPartition, batch, make_services, topic, until


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 5))


def _code(fn, *args, **kwargs) -> ErrorCode:
    with pytest.raises(KafkaApiError) as e:
        fn(*args, **kwargs)
    return e.value.code


def test_lookup_tells_unknown_from_elsewhere_and_fences_leader_epochs():
    here = topic("here", leader_epoch=5)
    elsewhere = topic("elsewhere", replicas=[1])
    rm = make_services(here, elsewhere, brokers=(0, 1)).replica_manager
    assert _code(rm.get_partition_or_error, "missing", 0) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert _code(rm.get_partition_or_error, "here", 1) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert _code(rm.get_partition_or_error, "elsewhere", 0) == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert _code(rm.leader_partition, "here", 0, 4) == ErrorCode.FENCED_LEADER_EPOCH
    assert _code(rm.leader_partition, "here", 0, 6) == ErrorCode.UNKNOWN_LEADER_EPOCH
    assert rm.leader_partition("here", 0, 5).leader_epoch == 5
    assert rm.leader_partition("here", 0).is_leader


def test_a_follower_refuses_leader_requests():
    rm = make_services(topic("f", replicas=[1, 0]), brokers=(0, 1)).replica_manager
    part = rm.get_partition_or_error("f", 0)
    assert not part.is_leader and part.leader == 1
    assert _code(rm.leader_partition, "f", 0) == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert rm.read("f", 0, fetch_offset=0, current_leader_epoch=-1, replica_id=-1, isolation=0, max_bytes=100,
                   min_one_batch=True, now_ms=0).error == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_alone_in_the_isr_the_leader_moves_the_high_watermark_at_each_append():
    services = make_services(topic("t"))
    rm = services.replica_manager
    part = rm.leader_partition("t", 0)
    heard = []
    rm.add_high_watermark_listener(part.key, heard.append)
    result = rm.append_to_leader(part, batch(b"a", b"b", b"c"), 5, log_append_time=False, required_acks=1)
    assert (result.base_offset, result.last_offset) == (0, 2)
    assert part.high_watermark == part.log.high_watermark == 3   # one high watermark: the log's
    assert heard == [3]
    read = rm.read("t", 0, fetch_offset=0, current_leader_epoch=0, replica_id=-1, isolation=0, max_bytes=1 << 20,
                   min_one_batch=True, now_ms=5)
    assert read.error == ErrorCode.NONE and read.high_watermark == 3 and read.size == sum(s.length for s in read.slices)


def test_the_high_watermark_waits_for_the_isr_and_a_caught_up_follower_joins_it():
    clock = Clock()
    alter = FakeAlterPartition()
    services = make_services(topic("r", replicas=[0, 1], isr=[0]), brokers=(0, 1), clock=clock,
                             alter_partition=alter)
    rm = services.replica_manager

    async def main():
        part = rm.leader_partition("r", 0)
        rm.append_to_leader(part, batch(b"x", b"y"), clock(), log_append_time=False, required_acks=1)
        assert part.high_watermark == 2 and part.isr == (0,)   # the follower is not in the ISR
        # The follower fetches from 0: it has nothing yet, so it is not caught up.
        rm.read("r", 0, fetch_offset=0, current_leader_epoch=0, replica_id=1, isolation=0, max_bytes=1 << 20,
                min_one_batch=True, now_ms=clock())
        assert alter.proposals == []
        rm.read("r", 0, fetch_offset=2, current_leader_epoch=0, replica_id=1, isolation=0, max_bytes=1 << 20,
                min_one_batch=True, now_ms=clock())
        while part.isr_change_in_flight:
            await asyncio.sleep(0)
        assert alter.proposals == [("r", 0, 0, (0, 1))] and part.isr == (0, 1) and part.partition_epoch == 1
        # In the ISR now, the follower holds the high watermark back until it fetches past the append.
        rm.append_to_leader(part, batch(b"z"), clock(), log_append_time=False, required_acks=1)
        assert part.high_watermark == 2
        rm.read("r", 0, fetch_offset=3, current_leader_epoch=0, replica_id=1, isolation=0, max_bytes=1 << 20,
                min_one_batch=True, now_ms=clock())
        assert part.high_watermark == 3
        await rm.aclose()

    _run(main())


def test_a_lagging_follower_is_proposed_out_of_the_isr():
    clock = Clock()
    alter = FakeAlterPartition()
    services = make_services(topic("s", replicas=[0, 1]), brokers=(0, 1), clock=clock, alter_partition=alter)
    rm = services.replica_manager

    async def main():
        part = rm.leader_partition("s", 0)
        assert rm.maybe_shrink_isr(clock()) == 0
        clock.now_ms += rm.replica_lag_time_max_ms + 1
        assert rm.maybe_shrink_isr(clock()) == 1
        assert rm.maybe_shrink_isr(clock()) == 0          # one change in flight at a time
        while part.isr_change_in_flight:
            await asyncio.sleep(0)
        assert alter.proposals == [("s", 0, 0, (0,))] and part.isr == (0,)
        await rm.aclose()

    _run(main())


def test_a_refused_isr_change_leaves_the_isr_as_it_was():
    clock = Clock()
    alter = FakeAlterPartition(refuse=ErrorCode.FENCED_LEADER_EPOCH)
    rm = make_services(topic("s", replicas=[0, 1]), brokers=(0, 1), clock=clock, alter_partition=alter).replica_manager

    async def main():
        part = rm.leader_partition("s", 0)
        clock.now_ms += rm.replica_lag_time_max_ms + 1
        rm.maybe_shrink_isr(clock())
        while part.isr_change_in_flight:
            await asyncio.sleep(0)
        assert part.isr == (0, 1) and len(alter.proposals) == 1
        await rm.aclose()

    _run(main())


def _led_here_followed_by_1(name: str):
    """(clock, replica manager) with partition `name`-0 led here and followed by broker 1, both in the ISR."""
    clock = Clock()
    services = make_services(topic(name, replicas=[0, 1]), brokers=(0, 1), clock=clock,
                             alter_partition=FakeAlterPartition())
    return clock, services.replica_manager


def test_acks_all_waits_for_the_high_watermark_or_times_out():
    clock, rm = _led_here_followed_by_1("w")

    async def main():
        part = rm.leader_partition("w", 0)
        result = rm.append_to_leader(part, batch(b"v"), clock(), log_append_time=False, required_acks=-1)
        waiting = asyncio.ensure_future(rm.wait_for_acks([(part, result.last_offset + 1)], 60_000))
        await asyncio.sleep(0)
        assert not waiting.done()
        rm.read("w", 0, fetch_offset=1, current_leader_epoch=0, replica_id=1, isolation=0, max_bytes=1 << 20,
                min_one_batch=True, now_ms=clock())
        assert await waiting == [ErrorCode.NONE]
        result = rm.append_to_leader(part, batch(b"u"), clock(), log_append_time=False, required_acks=-1)
        assert await rm.wait_for_acks([(part, result.last_offset + 1)], 0) == [ErrorCode.REQUEST_TIMED_OUT]
        await rm.aclose()

    _run(main())


def test_acks_all_below_min_insync_replicas_is_refused_before_the_append():
    services = make_services(topic("m", replicas=[0, 1], isr=[0], configs={"min.insync.replicas": "2"}),
                             brokers=(0, 1))
    rm = services.replica_manager
    part = rm.leader_partition("m", 0)
    code = _code(rm.append_to_leader, part, batch(b"v"), 0, log_append_time=False, required_acks=-1)
    assert code == ErrorCode.NOT_ENOUGH_REPLICAS and part.log_end_offset == 0
    rm.append_to_leader(part, batch(b"v"), 0, log_append_time=False, required_acks=1)   # acks=1 is fine
    assert part.log_end_offset == 1


def test_leader_and_isr_changes_roles_refuses_stale_epochs_and_tells_listeners():
    rm = make_services(topic("l", replicas=[0, 1], leader_epoch=3), brokers=(0, 1)).replica_manager
    seen = []
    rm.add_leadership_listener(lambda leaders, followers, stopped: seen.append(
        ([p.key for p in leaders], [p.key for p in followers], stopped)))
    stale = LeaderAndIsrState("l", 0, 1, 2, (0, 1), (0, 1))
    assert rm.apply_leader_and_isr([stale], 0) == {("l", 0): ErrorCode.STALE_CONTROLLER_EPOCH}
    moved = LeaderAndIsrState("l", 0, 1, 4, (0, 1), (0, 1))
    assert rm.apply_leader_and_isr([moved], 0) == {("l", 0): ErrorCode.NONE}
    part = rm.get_partition_or_error("l", 0)
    assert not part.is_leader and part.leader_epoch == 4
    elsewhere = LeaderAndIsrState("x", 0, 1, 0, (1,), (1,))
    assert rm.apply_leader_and_isr([elsewhere], 0) == {("x", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    assert rm.stop_replicas([("l", 0), ("nope", 0)], delete=True, now_ms=0) == [("l", 0)]
    assert seen == [([], [("l", 0)], []), ([], [], [("l", 0)])]
    assert rm.get_partition("l", 0) is None and rm.logs.deleted == [("l", 0)]


def test_stopping_a_partition_wakes_its_waiters():
    services = make_services(topic("g", replicas=[0, 1]), brokers=(0, 1), alter_partition=FakeAlterPartition())
    rm = services.replica_manager

    async def main():
        part = rm.leader_partition("g", 0)
        result = rm.append_to_leader(part, batch(b"v"), 0, log_append_time=False, required_acks=-1)
        waiting = asyncio.ensure_future(rm.wait_for_acks([(part, result.last_offset + 1)], 60_000))
        fetching = asyncio.ensure_future(rm.wait_for_data([part.key], 60_000))
        await asyncio.sleep(0)
        rm.stop_replicas([part.key], delete=False, now_ms=0)
        assert await waiting == [ErrorCode.NOT_LEADER_OR_FOLLOWER]
        assert await fetching is True
        await rm.aclose()

    _run(main())


def test_delete_records_and_offset_for_leader_epoch_on_the_leader():
    services = make_services(topic("d", leader_epoch=2), topic("c", configs={"cleanup.policy": "compact"}),
                             topic("__consumer_offsets"))
    rm = services.replica_manager
    part = rm.leader_partition("d", 0)
    for _ in range(3):
        rm.append_to_leader(part, batch(b"a", b"b"), 0, log_append_time=False, required_acks=1)
    assert rm.delete_records("d", 0, 4, 0) == 4
    assert _code(rm.delete_records, "d", 0, 7, 0) == ErrorCode.OFFSET_OUT_OF_RANGE
    assert rm.delete_records("d", 0, -1, 0) == 6                 # -1: up to the high watermark
    assert _code(rm.delete_records, "c", 0, 0, 0) == ErrorCode.POLICY_VIOLATION
    assert _code(rm.delete_records, "__consumer_offsets", 0, 0, 0) == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert _code(rm.delete_records, "nope", 0, 0, 0) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert rm.last_offset_for_leader_epoch("d", 0, 2, 2) == (2, 6)
    assert rm.last_offset_for_leader_epoch("d", 0, -1, 3) is None
    assert _code(rm.last_offset_for_leader_epoch, "d", 0, 1, 2) == ErrorCode.FENCED_LEADER_EPOCH


def test_a_follower_s_log_keeps_replica_drop_behind_bytes_cached_and_a_leader_s_the_broker_default():
    rm = make_services(topic("c", replicas=[0, 1], leader_epoch=3), brokers=(0, 1)).replica_manager
    rm.follower_cache_keep_bytes = 64 << 20
    log = rm.get_partition_or_error("c", 0).log
    follow = LeaderAndIsrState("c", 0, 1, 4, (0, 1), (0, 1))
    assert rm.apply_leader_and_isr([follow], 0) == {("c", 0): ErrorCode.NONE}
    assert log.cache_keep_bytes == 64 << 20
    lead = LeaderAndIsrState("c", 0, 0, 5, (0, 1), (0, 1))
    assert rm.apply_leader_and_isr([lead], 0) == {("c", 0): ErrorCode.NONE}
    assert log.cache_keep_bytes is None                        # log.drop.behind.bytes, as any leader
    rm.follower_cache_keep_bytes = 0                            # off: followers too take the default
    assert rm.apply_leader_and_isr([LeaderAndIsrState("c", 0, 1, 6, (0, 1), (0, 1))], 0) == {("c", 0): ErrorCode.NONE}
    assert log.cache_keep_bytes is None


def test_a_follower_brokers_parked_fetch_wakes_for_an_append_to_any_partition_it_replicates_and_no_other():
    clock = Clock()
    services = make_services(topic("a", 2, replicas=[0, 1]), topic("b", 1, replicas=[0, 2]), brokers=(0, 1, 2),
                             clock=clock, alter_partition=FakeAlterPartition())
    rm = services.replica_manager

    async def main():
        of_1 = asyncio.ensure_future(rm.wait_for_data([("a", 0), ("a", 1)], 5_000, replica_id=1))
        of_2 = asyncio.ensure_future(rm.wait_for_data([("b", 0)], 5_000, replica_id=2))
        await until(lambda: rm.purgatory.waiting() == 2, "both followers' fetches parked")
        rm.append_to_leader(rm.leader_partition("a", 1), batch(b"x"), clock(), log_append_time=False,
                            required_acks=1)
        assert await of_1 is True
        assert not of_2.done() and rm.purgatory.waiting() == 1      # broker 2 replicates none of "a"
        rm.append_to_leader(rm.leader_partition("b", 0), batch(b"y"), clock(), log_append_time=False,
                            required_acks=1)
        assert await of_2 is True
        await rm.aclose()

    _run(main())


def test_an_append_wakes_followers_fetches_and_the_high_watermark_wakes_consumers_fetches():
    clock, rm = _led_here_followed_by_1("w")

    async def main():
        part = rm.leader_partition("w", 0)
        follower = asyncio.ensure_future(rm.wait_for_data([("w", 0)], 5_000, replica_id=1))
        consumer = asyncio.ensure_future(rm.wait_for_data([("w", 0)], 5_000))
        await until(lambda: rm.purgatory.waiting() == 2, "both fetches parked")
        rm.append_to_leader(part, batch(b"x"), clock(), log_append_time=False, required_acks=1)
        assert part.high_watermark == 0                 # the follower in the ISR has not fetched it yet
        assert rm.purgatory.waiting() == 1              # the consumer's: nothing it may read yet, not woken
        assert await follower is True and not consumer.done()
        rm.read("w", 0, fetch_offset=1, current_leader_epoch=0, replica_id=1, isolation=0, max_bytes=1 << 20,
                min_one_batch=True, now_ms=clock())
        assert part.high_watermark == 1 and await consumer is True
        again = asyncio.ensure_future(rm.wait_for_data([("w", 0)], 5_000, replica_id=1))
        await until(lambda: rm.purgatory.waiting() == 1, "the follower's fetch parked")
        rm.stop_replicas([("w", 0)], delete=False, now_ms=clock())     # any other change wakes both
        assert await again is True
        await rm.aclose()

    _run(main())


def _read(rm, name, *, replica_id, fetch_offset=0, epoch=-1):
    return rm.read(name, 0, fetch_offset=fetch_offset, current_leader_epoch=epoch, replica_id=replica_id,
                   isolation=0, max_bytes=1 << 20, min_one_batch=True, now_ms=0)


def test_a_follower_fetch_is_served_only_to_a_replica_other_than_this_broker():
    """Kafka's followerReplicaOrThrow: a replica id that is not a replica of the partition, or this
    broker's own, is refused (NOT_LEADER_OR_FOLLOWER; UNKNOWN_LEADER_EPOCH when the request names the
    current epoch) and moves neither the follower state nor the high watermark, nor reads past it."""
    alter = FakeAlterPartition()
    rm = make_services(topic("r", replicas=[0, 1], isr=[0, 1]), brokers=(0, 1, 2),
                       alter_partition=alter).replica_manager
    part = rm.leader_partition("r", 0)
    rm.append_to_leader(part, batch(b"x", b"y"), 0, log_append_time=False, required_acks=1)
    assert part.high_watermark == 0                      # waits for follower 1
    for forged in (2, 0, 7):                             # not a replica; this broker; unknown
        refused = _read(rm, "r", replica_id=forged, fetch_offset=2)
        assert refused.error == ErrorCode.NOT_LEADER_OR_FOLLOWER and refused.slices == []
        assert _read(rm, "r", replica_id=forged, fetch_offset=2, epoch=0).error == ErrorCode.UNKNOWN_LEADER_EPOCH
    assert part.high_watermark == 0 and alter.proposals == [] and set(part.followers) == {1}
    assert _read(rm, "r", replica_id=-1).size == 0       # a consumer still sees only below the watermark
    assert _read(rm, "r", replica_id=1, fetch_offset=2).error == ErrorCode.NONE
    assert part.high_watermark == 2                      # the real follower moves it


def test_a_replica_added_in_the_same_leader_epoch_may_fetch_and_a_removed_one_may_not():
    rm = make_services(topic("g", replicas=[0, 1], isr=[0, 1]), brokers=(0, 1, 2)).replica_manager
    part = rm.leader_partition("g", 0)
    assert _read(rm, "g", replica_id=2).error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    grown = LeaderAndIsrState("g", 0, 0, part.leader_epoch, (0, 1, 2), (0, 1, 2), partition_epoch=1)
    assert rm.apply_leader_and_isr([grown], 0) == {("g", 0): ErrorCode.NONE}
    assert _read(rm, "g", replica_id=2).error == ErrorCode.NONE
    shrunk = LeaderAndIsrState("g", 0, 0, part.leader_epoch, (0, 2), (0, 2), partition_epoch=2)
    assert rm.apply_leader_and_isr([shrunk], 0) == {("g", 0): ErrorCode.NONE}
    assert _read(rm, "g", replica_id=1).error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert _read(rm, "g", replica_id=2).error == ErrorCode.NONE
