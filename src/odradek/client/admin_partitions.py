"""The admin client's partition calls: ListOffsets and DeleteRecords, each sent to the partitions'
leaders (from fresh metadata); NOT_LEADER_OR_FOLLOWER and its kin refresh the metadata and retry."""

from __future__ import annotations

from odradek.client.admin_types import AdminError, Retry, raise_first
from odradek.client.fetcher import OffsetAndTimestamp, TopicPartition
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import delete_records as dr
from odradek.protocol.messages import list_offsets as lo

EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3

# Answers that mean "ask again, after a metadata refresh".
_ROUTING_ERRORS = frozenset({
    ErrorCode.NOT_CONTROLLER, ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT, ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH,
})


def _tp(x) -> TopicPartition:
    return x if isinstance(x, TopicPartition) else TopicPartition(*x)


class PartitionAdminMixin:
    """Mixed into `Admin`; uses its `_request`, `_retrying` and `_metadata`."""

    async def _leaders(self, tps) -> dict[int, list[TopicPartition]]:
        """Partitions by leader; an unknown topic or partition is an AdminError, no leader a Retry."""
        topics = sorted({tp.topic for tp in tps})
        response = await self._metadata(topics)
        known = {t.name: t for t in response.topics}
        by_node: dict[int, list[TopicPartition]] = {}
        for tp in tps:
            t = known.get(tp.topic)
            if t is None or t.error_code and not t.partitions:
                code = t.error_code if t is not None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                if code in _ROUTING_ERRORS:
                    raise Retry(f"{tp}: {ErrorCode(code).name}")
                raise AdminError(code, None, f"topic {tp.topic!r}")
            p = next((p for p in t.partitions if p.partition_index == tp.partition), None)
            if p is None:
                raise AdminError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None, f"partition {tp.topic}-{tp.partition}")
            if p.leader_id < 0:
                raise Retry(f"{tp} has no leader")
            by_node.setdefault(p.leader_id, []).append(tp)
        return by_node

    async def list_offsets(self, specs: dict, *, isolation_level: int = 0) -> dict[TopicPartition, OffsetAndTimestamp]:
        """`{tp: EARLIEST | LATEST | MAX_TIMESTAMP | a timestamp in ms}` -> the offset per partition
        (offset -1 when no record has a timestamp that late)."""
        wanted = {_tp(tp): int(ts) for tp, ts in specs.items()}

        async def attempt():
            results: dict = {}
            for node, tps in (await self._leaders(list(wanted))).items():
                by_topic: dict[str, list] = {}
                for tp in tps:
                    by_topic.setdefault(tp.topic, []).append(
                        lo.ListOffsetsPartition(partition_index=tp.partition, timestamp=wanted[tp]))
                response, _ = await self._request(node, 2, lambda v: lo.ListOffsetsRequest(
                    replica_id=-1, isolation_level=isolation_level, timeout_ms=self.config["request.timeout.ms"],
                    topics=[lo.ListOffsetsTopic(name=t, partitions=ps) for t, ps in by_topic.items()]))
                for t in response.topics:
                    for p in t.partitions:
                        tp = TopicPartition(t.name, p.partition_index)
                        if p.error_code in _ROUTING_ERRORS:
                            raise Retry(f"ListOffsets {tp}: {ErrorCode(p.error_code).name}")
                        if p.error_code:
                            results[tp] = AdminError(p.error_code, None, f"partition {t.name}-{p.partition_index}")
                        else:
                            results[tp] = OffsetAndTimestamp(p.offset, p.timestamp, p.leader_epoch)
            return {tp: results.get(tp) for tp in wanted}
        return raise_first(await self._retrying("ListOffsets", attempt))

    async def delete_records(self, before: dict) -> dict[TopicPartition, int]:
        """Delete records before `{tp: offset}` (-1: the high watermark); the new low watermarks."""
        wanted = {_tp(tp): int(o) for tp, o in before.items()}

        async def attempt():
            results: dict = {}
            for node, tps in (await self._leaders(list(wanted))).items():
                by_topic: dict[str, list] = {}
                for tp in tps:
                    by_topic.setdefault(tp.topic, []).append(
                        dr.DeleteRecordsPartition(partition_index=tp.partition, offset=wanted[tp]))
                response, _ = await self._request(node, 21, lambda v: dr.DeleteRecordsRequest(
                    topics=[dr.DeleteRecordsTopic(name=t, partitions=ps) for t, ps in by_topic.items()],
                    timeout_ms=self.config["request.timeout.ms"]))
                for t in response.topics:
                    for p in t.partitions:
                        tp = TopicPartition(t.name, p.partition_index)
                        if p.error_code in _ROUTING_ERRORS:
                            raise Retry(f"DeleteRecords {tp}: {ErrorCode(p.error_code).name}")
                        results[tp] = AdminError(p.error_code, None, f"partition {t.name}-{p.partition_index}") \
                            if p.error_code else p.low_watermark
            return {tp: results.get(tp) for tp in wanted}
        return raise_first(await self._retrying("DeleteRecords", attempt))
