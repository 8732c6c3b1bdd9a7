"""Partition leader election, as pure functions of partition states and the live brokers (seed 003,
"Replication": "Unclean leader election: What if they all die?"; Kafka's PartitionStateMachine and
Election).

- Offline election (the leader died, or the partition has none): the first replica in replica order
  that is alive and in the ISR becomes leader. With none, and `unclean.leader.election.enable`, the
  first live replica outside the ISR is chosen (data may be lost: the result says so); otherwise the
  partition stays offline (leader -1) and keeps its ISR, so a returning ISR member can lead again.
- Preferred election: the first replica in the list leads if it is alive and in the ISR.
- Controlled shutdown: leadership moves to another live ISR member, and the stopping broker leaves
  the ISR.
Every change of leader bumps the leader epoch (KIP-101), which fences the old leader and lets
followers truncate. The ISR never loses its last member on a failure: Kafka keeps the last one so
that an unclean election is not needed when it returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from odradek.cluster.topics import PartitionState

NO_LEADER = -1


@dataclass(frozen=True)
class Election:
    topic: str
    partition: int
    before: PartitionState
    after: PartitionState
    unclean: bool = False             # the new leader was not in the ISR: records may be lost

    @property
    def changed(self) -> bool:
        return self.before != self.after


def elect_offline(st: PartitionState, live: set[int], unclean_allowed: bool) -> tuple[PartitionState, bool]:
    """The state after electing a leader for a partition whose leader is gone (or offline)."""
    if st.leader in live and st.leader in st.isr:
        return st, False
    live_isr = [r for r in st.replicas if r in live and r in st.isr]
    if live_isr:
        leader = live_isr[0]
        isr = [r for r in st.isr if r in live] or [leader]
        return PartitionState(leader, st.leader_epoch + 1, isr, list(st.replicas)), False
    if unclean_allowed:
        candidates = [r for r in st.replicas if r in live]
        if candidates:
            leader = candidates[0]
            return PartitionState(leader, st.leader_epoch + 1, [leader], list(st.replicas)), True
    if st.leader == NO_LEADER:
        return st, False
    # Offline: no leader; the ISR keeps its last members so one of them can lead when it returns.
    return PartitionState(NO_LEADER, st.leader_epoch + 1, list(st.isr), list(st.replicas)), False


def elect_preferred(st: PartitionState, live: set[int]) -> PartitionState:
    preferred = st.replicas[0] if st.replicas else NO_LEADER
    if st.leader == preferred or preferred not in live or preferred not in st.isr:
        return st
    return PartitionState(preferred, st.leader_epoch + 1, list(st.isr), list(st.replicas))


def shut_down_broker(st: PartitionState, broker: int, live: set[int]) -> PartitionState:
    """Controlled shutdown of `broker`: leadership moves off it and it leaves the ISR (unless it is the
    only member, which Kafka keeps so the partition is not left without one)."""
    others = [r for r in st.replicas if r != broker and r in live and r in st.isr]
    isr = [r for r in st.isr if r != broker] or list(st.isr)
    if st.leader == broker:
        if not others:
            return st if isr == st.isr else PartitionState(st.leader, st.leader_epoch, isr, list(st.replicas))
        return PartitionState(others[0], st.leader_epoch + 1, isr, list(st.replicas))
    if isr == st.isr:
        return st
    return PartitionState(st.leader, st.leader_epoch, isr, list(st.replicas))


def elect_for_failed_brokers(states: Iterable[tuple[str, int, PartitionState]], live: set[int],
                             unclean_allowed_for: dict[str, bool]) -> list[Election]:
    """One batch of elections: every partition whose leader is not live (Kafka batches the
    elections of one broker failure into one round of LeaderAndIsr and UpdateMetadata)."""
    out = []
    for topic, p, st in states:
        if st.leader in live and st.leader in st.isr:
            continue
        after, unclean = elect_offline(st, live, unclean_allowed_for.get(topic, False))
        if after != st:
            out.append(Election(topic, p, st, after, unclean))
    return out
