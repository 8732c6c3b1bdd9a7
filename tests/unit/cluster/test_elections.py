"""Leader election as Kafka does it: from the ISR in replica order, unclean only when allowed (and
flagged), offline otherwise with the ISR kept; preferred election; controlled shutdown; epochs bump."""

from __future__ import annotations

from odradek.cluster.elections import (
    NO_LEADER, elect_for_failed_brokers, elect_offline, elect_preferred, shut_down_broker,
)
from odradek.cluster.topics import PartitionState


def st(leader, epoch, isr, replicas=(1, 2, 3)) -> PartitionState:
    return PartitionState(leader, epoch, list(isr), list(replicas))


def test_a_live_isr_member_in_replica_order_takes_over_with_a_new_epoch():
    after, unclean = elect_offline(st(1, 4, [1, 3, 2]), live={2, 3}, unclean_allowed=False)
    assert after == st(2, 5, [3, 2]) and not unclean


def test_a_healthy_leader_is_left_alone():
    s = st(2, 4, [1, 2])
    assert elect_offline(s, live={1, 2, 3}, unclean_allowed=True) == (s, False)


def test_with_every_isr_member_dead_the_partition_goes_offline_and_keeps_its_isr():
    after, unclean = elect_offline(st(1, 4, [1]), live={2, 3}, unclean_allowed=False)
    assert after == st(NO_LEADER, 5, [1]) and not unclean
    # Offline stays offline (no new epoch) until an ISR member returns, then it leads again.
    assert elect_offline(after, live={2, 3}, unclean_allowed=False) == (after, False)
    back, _ = elect_offline(after, live={1, 2, 3}, unclean_allowed=False)
    assert back == st(1, 6, [1])


def test_unclean_election_picks_a_live_replica_outside_the_isr_and_says_so():
    after, unclean = elect_offline(st(1, 4, [1]), live={3}, unclean_allowed=True)
    assert after == st(3, 5, [3]) and unclean


def test_preferred_election_only_to_a_live_isr_preferred_replica():
    assert elect_preferred(st(2, 1, [1, 2]), {1, 2}) == st(1, 2, [1, 2])
    assert elect_preferred(st(2, 1, [2, 3]), {1, 2, 3}) == st(2, 1, [2, 3])     # 1 not in the ISR
    assert elect_preferred(st(2, 1, [1, 2]), {2}) == st(2, 1, [1, 2])           # 1 is dead


def test_controlled_shutdown_moves_leadership_and_leaves_the_isr():
    assert shut_down_broker(st(1, 3, [1, 2, 3]), 1, {1, 2, 3}) == st(2, 4, [2, 3])
    assert shut_down_broker(st(2, 3, [1, 2, 3]), 1, {1, 2, 3}) == st(2, 3, [2, 3])
    assert shut_down_broker(st(1, 3, [1]), 1, {1, 2, 3}) == st(1, 3, [1])       # nowhere to go


def test_one_batch_for_a_failed_broker():
    states = [("a", 0, st(1, 0, [1, 2, 3])), ("a", 1, st(2, 0, [2, 3, 1])), ("b", 0, st(1, 7, [1], (1,)))]
    out = elect_for_failed_brokers(states, live={2, 3}, unclean_allowed_for={"b": True})
    assert [(e.topic, e.partition, e.after.leader, e.after.leader_epoch, e.unclean) for e in out] == [
        ("a", 0, 2, 1, False), ("b", 0, NO_LEADER, 8, False)]


def test_rack_aware_placement_puts_each_partitions_replicas_on_distinct_racks():
    from collections import Counter
    from odradek.cluster.controller import place_replicas
    racks = {0: "a", 1: "b", 2: "c", 3: "a", 4: "b", 5: "c"}
    placed = place_replicas(racks, 12, 3)
    assert all(len({racks[b] for b in replicas}) == 3 for replicas in placed.values())
    assert Counter(r[0] for r in placed.values()) == {b: 2 for b in racks}         # leaders even
    assert Counter(b for r in placed.values() for b in r) == {b: 6 for b in racks}  # replicas even
    # fewer racks than replicas: every rack is used before one is used twice
    uneven = {0: "a", 1: "a", 2: "a", 3: "b"}
    assert all("b" in {uneven[b] for b in r} for r in place_replicas(uneven, 8, 2).values())
    # a broker without a rack: the rack-unaware placement
    assert place_replicas({0: "a", 1: None, 2: "b"}, 3, 2) == place_replicas({0, 1, 2}, 3, 2)
