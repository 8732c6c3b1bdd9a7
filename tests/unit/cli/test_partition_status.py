"""The replication flags of `odradek topics describe` and `odradek cluster describe`, with
kafka-topics.sh's rules for its partition filters."""

from __future__ import annotations

from dataclasses import dataclass, field

from odradek.cli.partition_status import selected, status


@dataclass
class P:
    leader: int
    replicas: list[int]
    isr: list[int] = field(default_factory=list)


def test_a_healthy_partition_has_no_flag_but_may_sit_at_min_isr():
    flags = status(P(0, [0, 1, 2], [0, 1, 2]), live_brokers={0, 1, 2}, min_isr=2)
    assert flags == {"under_replicated": False, "offline": False, "unavailable": False,
                     "under_min_isr": False, "at_min_isr": False}
    assert status(P(0, [0], [0]), {0}, min_isr=1)["at_min_isr"]


def test_an_isr_smaller_than_the_replicas_is_under_replicated():
    flags = status(P(0, [0, 1, 2], [0, 2]), {0, 2}, min_isr=2)
    assert flags["under_replicated"] and flags["at_min_isr"] and not flags["under_min_isr"]
    assert status(P(0, [0, 1, 2], [0]), {0}, min_isr=2)["under_min_isr"]


def test_leader_minus_one_is_offline_and_unavailable():
    flags = status(P(-1, [0, 1], [1]), {0}, min_isr=None)
    assert flags["offline"] and flags["unavailable"] and "at_min_isr" not in flags


def test_a_leader_that_is_not_a_live_broker_is_unavailable_but_not_offline():
    flags = status(P(1, [0, 1], [0, 1]), {0}, min_isr=1)
    assert flags["unavailable"] and not flags["offline"]


def test_filters_select_partitions_with_any_flag_asked_for():
    flags = {"under_replicated": True, "unavailable": False}
    assert selected(flags, []) and selected(flags, ["under_replicated"])
    assert selected(flags, ["unavailable", "under_replicated"]) and not selected(flags, ["unavailable"])
    assert not selected(flags, ["at_min_isr"])
