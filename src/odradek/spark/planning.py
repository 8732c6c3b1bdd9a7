"""Offset planning: which topic-partitions, which offset ranges, how to split them. Pure: the caller
looks offsets up (earliest, latest, by timestamp) and passes them in; nothing here does I/O, so it is
tested without Spark or a broker (tests/unit/spark).

The rules are those of Spark's Kafka source, which are facts to follow:
- A start or end spec resolves per partition: `earliest`, `latest`, an offset (-2 earliest, -1
  latest) or a timestamp (the earliest offset whose timestamp is >= it). Specific offsets or
  timestamps must name every subscribed partition.
- One Spark task per topic-partition range (seed 003, "Offline Data Load"): a failed task restarts
  from its range's start, so its output never holds a record twice. `minPartitions` splits large
  ranges so there are about that many; `maxRecordsPerPartition` caps a range's size
  (`KafkaOffsetRangeCalculator`).
- Streaming: `maxOffsetsPerTrigger` is shared across partitions in proportion to their backlog, never
  starving a small one (`rateLimit`); `minOffsetsPerTrigger` holds a trigger back until that many
  records wait or `maxTriggerDelay` has passed since the last one (`delayBatch`).
- Data loss: a partition that vanished, a new partition that does not start at 0, or an end offset
  below its start. Offset gaps inside a range (compaction, transaction markers) are not data loss;
  only the task can tell, from the log start offset (see `kafka`).

Offsets cross Spark as JSON `{"topic": {"partition": offset}}`, topics and partitions sorted, so equal
offsets are equal strings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from odradek.spark.options import EARLIEST, LATEST, OffsetSpec

TP = tuple[str, int]
LONG_MAX = (1 << 63) - 1

FAIL_ON_DATA_LOSS_TRUE = (
    "Some data may have been lost because they are not available in Kafka any more; either the data was aged "
    "out by Kafka or the topic may have been deleted before all the data in the topic was processed. If you "
    "don't want your streaming query to fail on such cases, set the source option \"failOnDataLoss\" to "
    "\"false\".")
FAIL_ON_DATA_LOSS_FALSE = (
    "Some data may have been lost because they are not available in Kafka any more; either the data was aged "
    "out by Kafka or the topic may have been deleted before all the data in the topic was processed. If you "
    "want your streaming query to fail on such cases, set the source option \"failOnDataLoss\" to \"true\".")


class DataLossError(RuntimeError):
    """Records the query should have read are gone, and failOnDataLoss is true."""


class PlanningError(ValueError):
    """The options ask for something the topics do not have."""


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    from_offset: int        # inclusive
    until_offset: int       # exclusive

    @property
    def size(self) -> int:
        return self.until_offset - self.from_offset

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)


# ---------------------------------------------------------------------------------------- offsets JSON
def offsets_to_json(offsets: Mapping[TP, int]) -> dict:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def offsets_from_json(obj: Mapping) -> dict[TP, int]:
    return {(str(t), int(p)): int(o) for t, ps in obj.items() for p, o in ps.items()}


# ---------------------------------------------------------------------------------------- resolving
def timestamps_to_look_up(spec: OffsetSpec, partitions: Iterable[TP]) -> dict[TP, int]:
    """The ListOffsets timestamps a spec needs, per partition (empty unless it is timestamp based)."""
    partitions = list(partitions)
    if spec.kind == "timestamp":
        return {tp: spec.timestamp for tp in partitions}
    if spec.kind == "timestamps":
        _require_all(spec, partitions, "OffsetsByTimestamp")
        return spec.as_dict()
    return {}


def _require_all(spec: OffsetSpec, partitions: list[TP], what: str) -> None:
    given = set(spec.as_dict())
    if given != set(partitions):
        missing = sorted(set(partitions) - given)
        extra = sorted(given - set(partitions))
        raise PlanningError(
            f"Specific offsets{' by timestamp' if 'Timestamp' in what else ''} must name every subscribed "
            f"topic-partition (use -1 for latest, -2 for earliest): missing {missing}, not subscribed {extra}")


def resolve(spec: OffsetSpec, partitions: Iterable[TP], earliest: Mapping[TP, int], latest: Mapping[TP, int],
            found_by_time: Mapping[TP, int | None] | None = None, *, starting: bool,
            strategy: str = "error") -> dict[TP, int]:
    """Concrete offsets for `partitions`. `found_by_time`: the ListOffsets answers for
    `timestamps_to_look_up(spec, ...)` (None: no record at or after that timestamp). Past the end, a
    start follows `strategy` (error, or latest) and an end is the latest offset, as in Spark."""
    partitions = sorted(partitions)
    if spec.kind == "earliest":
        return {tp: earliest[tp] for tp in partitions}
    if spec.kind == "latest":
        return {tp: latest[tp] for tp in partitions}
    if spec.kind == "offsets":
        _require_all(spec, partitions, "Offsets")
        out = {}
        for tp, o in spec.as_dict().items():
            out[tp] = earliest[tp] if o == EARLIEST else latest[tp] if o == LATEST else o
        return out
    found_by_time = found_by_time or {}
    out = {}
    for tp in partitions:
        found = found_by_time.get(tp)
        if found is not None and found >= 0:
            out[tp] = found
        elif not starting or strategy == "latest":
            out[tp] = latest[tp]
        else:
            raise PlanningError(
                f"No offset matched the starting timestamp for {tp[0]}-{tp[1]} (no record at or after it); "
                "set startingOffsetsByTimestampStrategy to 'latest' to start at the end instead")
    return out


# ---------------------------------------------------------------------------------------- batch
def batch_ranges(start: Mapping[TP, int], end: Mapping[TP, int]) -> list[OffsetRange]:
    if set(start) != set(end):
        raise PlanningError(f"different topic partitions for starting offsets {sorted(start)} and ending "
                            f"offsets {sorted(end)}")
    out = []
    for tp in sorted(end):
        if end[tp] < start[tp]:
            raise PlanningError(f"Beginning offset {start[tp]} is after the ending offset {end[tp]} for topic "
                                f"{tp[0]} partition {tp[1]}")
        out.append(OffsetRange(tp[0], tp[1], start[tp], end[tp]))
    return out


def _divide(r: OffsetRange, parts: int) -> list[OffsetRange]:
    if parts <= 1:
        return [r]
    part_size = r.size / parts
    out = []
    for i in range(parts):
        lo = r.from_offset + int(part_size * i)
        hi = r.until_offset if i == parts - 1 else r.from_offset + int(part_size * (i + 1))
        out.append(OffsetRange(r.topic, r.partition, lo, hi))
    return out


def split_ranges(ranges: Iterable[OffsetRange], min_partitions: int | None = None,
                 max_records_per_partition: int | None = None) -> list[OffsetRange]:
    """Spark's KafkaOffsetRangeCalculator: drop empty ranges; cut each into ceil(size / max) pieces;
    then, while fewer than minPartitions, cut large ones in proportion to their size."""
    out = [r for r in ranges if r.size > 0]
    if max_records_per_partition:
        out = [piece for r in out for piece in _divide(r, math.ceil(r.size / max_records_per_partition))]
    if min_partitions and min_partitions > len(out):
        total = sum(r.size for r in out)
        if total > 0:
            ideal = total / min_partitions
            out = [piece for r in out for piece in _divide(r, max(round_half_up(r.size / ideal), 1))]
    return [r for r in out if r.size > 0]


def round_half_up(x: float) -> int:
    """Scala's math.round (half up), not Python's banker's rounding."""
    return int(math.floor(x + 0.5))


# ---------------------------------------------------------------------------------------- streaming
def rate_limit(limit: int, start: Mapping[TP, int], latest: Mapping[TP, int],
               new_partition_start: Mapping[TP, int]) -> dict[TP, int]:
    """End offsets reading at most about `limit` records, shared by backlog (Kafka's rateLimit)."""
    sizes = {}
    for tp, end in latest.items():
        begin = start.get(tp, new_partition_start.get(tp))
        if begin is not None and end - begin > 0:
            sizes[tp] = end - begin
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(latest)
    out = {}
    for tp, end in latest.items():
        if tp not in sizes:
            out[tp] = end
            continue
        begin = start.get(tp, new_partition_start.get(tp))
        prorate = limit * (sizes[tp] / total)
        step = math.ceil(prorate) if prorate < 1 else math.floor(prorate)   # never starve a small partition
        out[tp] = min(end, LONG_MAX if step > LONG_MAX - begin else begin + step)
    return out


class TriggerGate:
    """minOffsetsPerTrigger with maxTriggerDelay (Kafka's delayBatch): hold a trigger back while fewer
    than `min_rows` records wait, unless `max_delay_ms` has passed since the last trigger."""

    def __init__(self, min_rows: int, max_delay_ms: int) -> None:
        self.min_rows = min_rows
        self.max_delay_ms = max_delay_ms
        self.last_trigger_ms = 0.0

    def hold(self, start: Mapping[TP, int], latest: Mapping[TP, int], now_ms: float) -> bool:
        if now_ms - self.last_trigger_ms >= self.max_delay_ms:
            self.last_trigger_ms = now_ms
            return False
        waiting = sum(end - start.get(tp, 0) for tp, end in latest.items())
        if waiting < self.min_rows:
            return True
        self.last_trigger_ms = now_ms
        return False


def stream_ranges(start: Mapping[TP, int], end: Mapping[TP, int],
                  new_partition_start: Mapping[TP, int]) -> tuple[list[OffsetRange], list[str]]:
    """The ranges of one micro-batch, and the data-loss problems found (Kafka's planInputPartitions).

    `new_partition_start`: earliest offsets of partitions in `end` but not in `start` (a partition
    missing from it was deleted meanwhile)."""
    problems = []
    new = set(end) - set(start)
    missing = sorted(new - set(new_partition_start))
    if missing:
        problems.append(f"Cannot find earliest offsets of {_names(missing)}. Some data may have been missed")
    for tp in sorted(new & set(new_partition_start)):
        if new_partition_start[tp] != 0:
            problems.append(f"Added partition {_name(tp)} starts from {new_partition_start[tp]} instead of 0. "
                            "Some data may have been missed")
    gone = sorted(set(start) - set(end))
    if gone:
        problems.append(f"{_names(gone)} are gone. Some data may have been missed")
    ranges = []
    for tp in sorted(end):
        begin = start.get(tp, new_partition_start.get(tp))
        if begin is None:
            continue
        if end[tp] < begin:
            problems.append(f"Partition {_name(tp)}'s offset was changed from {begin} to {end[tp]}, some data "
                            "may have been missed")
            continue
        ranges.append(OffsetRange(tp[0], tp[1], begin, end[tp]))
    return ranges, problems


def _name(tp: TP) -> str:
    return f"{tp[0]}-{tp[1]}"


def _names(tps: Iterable[TP]) -> str:
    return "[" + ", ".join(_name(tp) for tp in tps) + "]"


def data_loss_message(problem: str, fail: bool) -> str:
    return f"{problem}. {FAIL_ON_DATA_LOSS_TRUE if fail else FAIL_ON_DATA_LOSS_FALSE}"
