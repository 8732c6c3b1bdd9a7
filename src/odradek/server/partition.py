"""A partition replica on this broker: its log, leader epoch, ISR and high watermark.

Seed 003, "Replication": the leader appends, followers fetch, and the high watermark is the offset up
to which every in-sync replica has the log; consumers see only records below it. With one broker the
ISR is the leader alone and the high watermark follows the log end offset on every append, but the
bookkeeping is the same one the cluster uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from odradek.server.log_validator import Validated


@dataclass
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time: int      # -1 unless the topic uses LogAppendTime
    log_start_offset: int
    duplicate: bool = False   # an idempotent producer's retry, answered with the original offsets


class Partition:
    def __init__(self, topic: str, index: int, log, *, leader_epoch: int, replicas: list[int],
                 isr: list[int], broker_id: int,
                 producer_id_expiration_ms: int | None = None) -> None:
        self.topic = topic
        self.index = index
        self.log = log
        self.leader_epoch = leader_epoch
        self.replicas = replicas
        self.isr = isr
        self.broker_id = broker_id
        self.high_watermark = log.update_high_watermark(log.log_end_offset)
        if producer_id_expiration_ms is not None:  # producer.id.expiration.ms
            log.producer_state.producer_id_expiration_ms = producer_id_expiration_ms

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.index)

    @property
    def is_leader(self) -> bool:
        return bool(self.replicas) and self.replicas[0] == self.broker_id or self.broker_id in self.isr[:1]

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def last_stable_offset(self) -> int:
        # Transactions are not yet written by this broker; the LSO is the high watermark.
        return self.high_watermark

    def append(self, validated: Validated, now_ms: int, log_append_time: bool) -> AppendResult:
        info = self.log.append(validated.buffer, leader_epoch=self.leader_epoch, now_ms=now_ms)
        self.maybe_advance_high_watermark()
        return AppendResult(info.first_offset, info.last_offset, now_ms if log_append_time else -1,
                            self.log.log_start_offset, info.duplicate)

    def maybe_advance_high_watermark(self) -> bool:
        """With the leader as the only in-sync replica the high watermark is the log end offset."""
        if self.isr == [self.broker_id] or len(self.replicas) <= 1:
            leo = self.log.log_end_offset
            if leo != self.high_watermark:
                self.high_watermark = self.log.update_high_watermark(leo)
                return True
        return False
