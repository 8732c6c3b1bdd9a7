"""Helpers for the cleaner tests: keyed appends that remember what went where, and reading back."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from odradek.records import RecordBatch, RecordBatchBuilder, codecs, iter_headers
from odradek.storage.config import CleanerConfig, LogConfig, LogManagerConfig
from odradek.storage.log import Log
from odradek.storage.manager import LogManager

COMPACT = {"segment_bytes": 4_000, "index_interval_bytes": 300, "file_delete_delay_ms": 0,
           "cleanup_policy": ("compact",), "min_cleanable_dirty_ratio": 0.01}


def open_manager(root: Path, *, threads: int = 0, dedupe_buffer_size: int = 1 << 20,
                 backoff_ms: int = 0, **log_config) -> LogManager:
    config = LogManagerConfig(
        log_dirs=(str(root / "d0"),), log_defaults=LogConfig(**{**COMPACT, **log_config}),
        cleaner=CleanerConfig(threads=threads, dedupe_buffer_size=dedupe_buffer_size,
                              backoff_ms=backoff_ms))
    return LogManager.open(config, now_ms=0)


@dataclass
class Written:
    """What was appended: offset -> (key, value, timestamp), and each key's last offset."""

    records: dict[int, tuple] = field(default_factory=dict)
    last: dict[bytes, int] = field(default_factory=dict)

    def expected_last_values(self) -> dict[bytes, bytes | None]:
        return {k: self.records[o][1] for k, o in self.last.items()}


def append_keyed(log: Log, written: Written, pairs, *, now_ms: int = 0, codec: int = codecs.NONE,
                 ts: int = 1_000, producer: tuple[int, int, int] | None = None) -> int:
    """Append one batch of (key, value) pairs; return its base offset."""
    pid, epoch, seq = producer or (-1, -1, -1)
    builder = RecordBatchBuilder(compression=codec, producer_id=pid, producer_epoch=epoch,
                                 base_sequence=seq)
    for i, (key, value) in enumerate(pairs):
        builder.append(key, value, timestamp=ts + i)
    info = log.append(bytearray(builder.build()), 0, now_ms)
    for i, (key, value) in enumerate(pairs):
        written.records[info.first_offset + i] = (key, value, ts + i)
        written.last[key] = info.first_offset + i
    log.update_high_watermark(log.log_end_offset)
    return info.first_offset


def random_workload(log: Log, written: Written, *, batches: int, keys: int, seed: int = 1,
                    tombstone_share: float = 0.1, now_ms: int = 0, ts: int = 1_000) -> None:
    rng = random.Random(seed)
    for b in range(batches):
        pairs = []
        for _ in range(rng.randint(1, 8)):
            key = f"key-{rng.randrange(keys):04d}".encode()
            value = None if rng.random() < tombstone_share else f"v{b}-{rng.random()}".encode()
            pairs.append((key, value))
        append_keyed(log, written, pairs, now_ms=now_ms, codec=rng.choice(sorted(codecs.CODEC_NAMES)),
                     ts=ts + b)


def read_records(log: Log, start: int | None = None) -> list[tuple]:
    """(offset, key, value, timestamp) of every record from `start` (the log start) to the end."""
    data = log.read_bytes(log.log_start_offset if start is None else start, 1 << 30)
    out = []
    for h in iter_headers(data):
        batch = RecordBatch(data, h.pos)
        batch.ensure_valid()
        out.extend((r.offset, r.key, r.value, r.timestamp) for r in batch.records())
    return out


def check_compacted(log: Log, written: Written, *, tombstones_gone: bool = False) -> list[tuple]:
    """Every record read is the one appended at its offset, in offset order, and every key's last
    value is there (its tombstone too, unless `tombstones_gone`)."""
    records = read_records(log)
    offsets = [r[0] for r in records]
    assert offsets == sorted(set(offsets))
    for offset, key, value, timestamp in records:
        assert written.records[offset] == (key, value, timestamp), offset
    seen = {key: value for _, key, value, _ in records}
    expected = written.expected_last_values()
    if tombstones_gone:
        expected = {k: v for k, v in expected.items() if v is not None}
        assert all(seen.get(k) is not None or written.last[k] >= log.active_segment.base_offset
                   for k in seen)
        seen = {k: v for k, v in seen.items() if v is not None}
    assert seen == expected
    return records
