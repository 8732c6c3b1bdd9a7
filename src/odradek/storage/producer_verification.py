"""Verification state of transactional producers on one partition (seed 003, "Message Delivery
Semantics"; KIP-890 part 1; Kafka's VerificationStateEntry and VerificationGuard, whose rules these
follow).

A transactional batch may start a transaction on a partition only once the transaction coordinator
has confirmed (AddPartitionsToTxn with verify_only, or, for the transaction protocol v2, by adding
the partition itself) that the partition is part of the producer's open transaction. Without that
check a produce delayed past an abort would open a transaction the coordinator no longer knows of,
which nothing would ever end (a hanging transaction) and which holds the last stable offset back.

The leader asks before the first write of a transaction on the partition (`start`): it records a
`VerificationStateEntry` for the producer with a fresh `VerificationGuard` and asks the coordinator;
the append then passes only if the producer's transaction is already open here or the entry still
holds the same guard. Any transactional batch or marker of the producer written to the partition
removes the entry, so an answer that arrives after an abort marker (and a new guard for a newer
attempt) cannot be mistaken for the current one (the ABA case Kafka's guard exists for).

While verifying, the lowest sequence seen is kept: a batch above it is refused with
OUT_OF_ORDER_SEQUENCE_NUMBER until the lowest one is written, so a retried first batch cannot be
overtaken by a later one (Kafka's maybeUpdateLowestSequenceAndEpoch). Entries that are never used
expire after `producer.id.expiration.ms`, as producers do; there is at most one per producer id.

Nothing here is written to disk: a restart or a leader change starts the verification again.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class VerificationGuard:
    """An object that stands for one verification attempt; equal only to itself."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"VerificationGuard({id(self):#x})"


@dataclass(slots=True)
class VerificationStateEntry:
    timestamp_ms: int
    lowest_sequence: int
    epoch: int
    supports_epoch_bump: bool = False     # the transaction protocol v2 adds, it does not only verify
    guard: VerificationGuard = field(default_factory=VerificationGuard)

    def maybe_update_lowest_sequence_and_epoch(self, sequence: int, epoch: int) -> None:
        """A lower sequence at the same epoch, or any sequence at a newer epoch, becomes the lowest."""
        if epoch == self.epoch and sequence < self.lowest_sequence:
            self.lowest_sequence = sequence
        if epoch > self.epoch:
            self.epoch = epoch
            self.lowest_sequence = sequence


class VerificationStates:
    """The verification entries of one partition, by producer id. Not thread-safe."""

    def __init__(self) -> None:
        self._entries: dict[int, VerificationStateEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, producer_id: int) -> VerificationStateEntry | None:
        return self._entries.get(producer_id)

    def maybe_create(self, producer_id: int, sequence: int, epoch: int, now_ms: int,
                     supports_epoch_bump: bool = False) -> VerificationStateEntry:
        """The producer's entry, created if absent; its lowest sequence and epoch updated."""
        entry = self._entries.get(producer_id)
        if entry is None:
            entry = self._entries[producer_id] = VerificationStateEntry(now_ms, sequence, epoch,
                                                                        supports_epoch_bump)
        entry.maybe_update_lowest_sequence_and_epoch(sequence, epoch)
        entry.supports_epoch_bump = entry.supports_epoch_bump or supports_epoch_bump
        return entry

    def verify(self, producer_id: int, guard: VerificationGuard | None) -> bool:
        """Whether `guard` is the producer's current one (None never is)."""
        entry = self._entries.get(producer_id)
        return guard is not None and entry is not None and entry.guard is guard

    def clear(self, producer_id: int) -> None:
        self._entries.pop(producer_id, None)

    def clear_all(self) -> None:
        self._entries.clear()

    def remove_expired(self, now_ms: int, expiration_ms: int) -> int:
        expired = [pid for pid, e in self._entries.items() if now_ms - e.timestamp_ms >= expiration_ms]
        for pid in expired:
            del self._entries[pid]
        return len(expired)
