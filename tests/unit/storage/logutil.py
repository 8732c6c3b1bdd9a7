"""Shared helpers for log tests."""

from __future__ import annotations

from pathlib import Path

from odradek.storage.config import LogConfig
from odradek.storage.log import Log, LogAppendInfo
from tests.unit.storage.batches import batch, split

SMALL = {"segment_bytes": 2_000, "index_interval_bytes": 200, "file_delete_delay_ms": 0}


def open_log(root: Path, now_ms: int = 0, name: str = "topic-0", **config) -> Log:
    return Log.open(root / name, LogConfig(**{**SMALL, **config}), now_ms=now_ms)


def produce(log: Log, count: int, *, records: int = 1, size: int = 100, now_ms: int = 0,
            leader_epoch: int = 0, ts0: int = 1_000, step: int = 10,
            log_append_time: bool = False) -> list[LogAppendInfo]:
    """Append `count` batches, each one produce request with a garbage base offset (the log
    assigns offsets), batch i with base timestamp ts0 + step * i."""
    infos = []
    for i in range(count):
        raw = bytearray(batch([b"v" * max(size - 80, 1)] * records, base_offset=987_654,
                              base_timestamp=ts0 + step * i,
                              timestamp_deltas=list(range(records))))
        infos.append(log.append(raw, leader_epoch, now_ms, log_append_time))
    return infos


def read_all(log: Log, start: int = 0, max_bytes: int = 10**9, max_offset: int | None = None):
    return split(log.read_bytes(start, max_bytes, max_offset))


def offsets(headers) -> list[int]:
    return [h["base_offset"] for h in headers]
