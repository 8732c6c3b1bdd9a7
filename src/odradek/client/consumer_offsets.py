"""The consumer's offset lookups (ListOffsets, API key 2; seed 004 "Offset API"): earliest, latest and
by-time offsets for the application (`beginning_offsets`, `end_offsets`, `offsets_for_times`) and for the
fetcher, which resets positions by auto.offset.reset (earliest, latest, or none:
NoOffsetForPartitionError), on OFFSET_OUT_OF_RANGE and on seek_to_beginning / seek_to_end.

A mixin of `consumer.Consumer`: it uses the consumer's config, cluster, partition states and events.
Requests go to each partition's leader; stale-metadata and retriable errors refresh the metadata and
retry until request.timeout.ms.
"""

from __future__ import annotations

import asyncio
import logging

from odradek.client.cluster import STALE_METADATA_ERRORS, now_ms
from odradek.client.errors import BrokerResponseError, KafkaConnectionError, KafkaError, NoOffsetForPartitionError
from odradek.client.fetcher import OffsetAndTimestamp, PartitionState, TopicPartition
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import list_offsets as lo

log = logging.getLogger("odradek.client.consumer")

LIST_OFFSETS_KEY = 2
EARLIEST = -2
LATEST = -1


def _tp(x) -> TopicPartition:
    return x if isinstance(x, TopicPartition) else TopicPartition(*x)


class OffsetLookups:
    async def offsets_for_times(self, timestamps: dict) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """The earliest offset whose timestamp is >= the given one, per partition (None past the end)."""
        found = await self._list_offsets({_tp(tp): ts for tp, ts in timestamps.items()})
        return {tp: (OffsetAndTimestamp(o, t, e) if o >= 0 else None) for tp, (o, t, e) in found.items()}

    async def beginning_offsets(self, partitions) -> dict[TopicPartition, int]:
        found = await self._list_offsets({_tp(tp): EARLIEST for tp in partitions})
        return {tp: v[0] for tp, v in found.items()}

    async def end_offsets(self, partitions) -> dict[TopicPartition, int]:
        found = await self._list_offsets({_tp(tp): LATEST for tp in partitions})
        return {tp: v[0] for tp, v in found.items()}

    # ------------------------------------------------------------------------------------ ListOffsets
    async def _list_offsets(self, wanted: dict[TopicPartition, int]) -> dict[TopicPartition, tuple]:
        """tp -> (offset, timestamp, leader_epoch) for ListOffsets timestamps (-2 earliest, -1 latest)."""
        self._check_open()
        self.cluster.add_topics({tp.topic for tp in wanted})
        out: dict[TopicPartition, tuple] = {}
        deadline = now_ms() + self.config["request.timeout.ms"]
        todo = dict(wanted)
        while todo:
            for topic in {tp.topic for tp in todo}:
                await self.cluster.wait_for_topic(topic, max(deadline - now_ms(), 1))
            meta = self.cluster.metadata
            by_node: dict[int, dict[str, list]] = {}
            for tp, ts in todo.items():
                leader = meta.leader_for(tp.topic, tp.partition)
                if leader < 0:
                    continue
                by_node.setdefault(leader, {}).setdefault(tp.topic, []).append(lo.ListOffsetsPartition(
                    partition_index=tp.partition, timestamp=ts,
                    current_leader_epoch=meta.leader_epoch(tp.topic, tp.partition)))
            retry = False
            for node, topics in by_node.items():
                request = lo.ListOffsetsRequest(
                    replica_id=-1, isolation_level=self.isolation_level,
                    timeout_ms=self.config["request.timeout.ms"],
                    topics=[lo.ListOffsetsTopic(name=t, partitions=ps) for t, ps in topics.items()])
                try:
                    response = await self.cluster.request(node, LIST_OFFSETS_KEY, request)
                except KafkaConnectionError:
                    self.cluster.request_update()
                    retry = True
                    continue
                for t in response.topics:
                    for p in t.partitions:
                        tp = TopicPartition(t.name, p.partition_index)
                        if tp not in todo:
                            continue
                        if p.error_code == 0:
                            out[tp] = (p.offset, p.timestamp, p.leader_epoch)
                            del todo[tp]
                        elif p.error_code in STALE_METADATA_ERRORS or ErrorCode(p.error_code).retriable:
                            self.cluster.request_update()
                            retry = True
                        else:
                            raise BrokerResponseError(p.error_code, f"ListOffsets {tp}")
            if todo:
                if now_ms() >= deadline:
                    raise KafkaError(f"ListOffsets did not answer for {sorted(todo)} in time")
                if retry or not by_node:
                    await asyncio.sleep(self.config["retry.backoff.ms"] / 1000)
                    self.cluster.request_update()
        return out

    async def _reset_positions(self, states: list[PartitionState]) -> None:
        wanted = {}
        for st in states:
            if st.reset is None:
                continue
            if st.reset == "none":
                self._error = NoOffsetForPartitionError(f"no position for {st.tp} and auto.offset.reset=none")
                st.reset = None
                self._data.set()
                continue
            wanted[st.tp] = EARLIEST if st.reset == "earliest" else LATEST if st.reset == "latest" else st.reset
        if not wanted:
            return
        epochs = {tp: self._states[tp].epoch for tp in wanted if tp in self._states}
        found = await self._list_offsets(wanted)
        for tp, (offset, _, _) in found.items():
            st = self._states.get(tp)
            if st is not None and st.epoch == epochs.get(tp) and st.reset is not None:
                st.seek(offset)
        self._kick()

